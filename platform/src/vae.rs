//! The VAE decoder on the GPU: the decoder's weights uploaded once, one
//! activation arena sized for one tile, core's decode program per tile
//! shape recorded once, and diffusers' tiled decode (overlapping tiles,
//! linear blending with the tile above and to the left, crop) on the host.
//!
//! The arena depends only on the tile, never on the image, so an image of
//! any size decodes in the same device memory. The mid-block attention and
//! the GroupNorms see one tile at a time, so a tiled image differs slightly
//! from an untiled one, as it does in diffusers.

use crate::error::{GpuError, LoadError, RunError};
use crate::gpu::Gpu;
use crate::ops::{self, Dispatch};
use crate::runner::{DeviceWeight, DeviceWeights, Runner};
use crate::safetensors_store::WeightStore;
use flux_lite_core::config::VaeConfig;
use flux_lite_core::program::Op;
use flux_lite_core::tensors::{self, TensorSpec};
use flux_lite_core::vae::{self as program, Tile, TileGrid, VaeLayout, VaePlanError};
use flux_lite_core::BumpArena;
use std::collections::HashMap;

/// Tiles decoded so far in one [`VaeDecoder::decode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileProgress {
    pub done: usize,
    pub total: usize,
}

/// A decoded image.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedImage {
    pub width: usize,
    pub height: usize,
    /// The decoder's raw output `[3, height, width]`, before the clamp (blended when tiled).
    pub decoded: Vec<f32>,
    /// 8-bit RGB, row-major, 3 bytes per pixel (what goes into the PNG).
    pub rgb: Vec<u8>,
}

/// The decode of one tile shape, laid out and recorded once.
#[derive(Debug)]
struct TileProgram {
    layout: VaeLayout,
    dispatches: Vec<Dispatch>,
}

#[derive(Debug)]
pub struct VaeDecoder {
    pub config: VaeConfig,
    grid: TileGrid,
    runner: Runner,
    weights: DeviceWeights,
    arena_bytes: u64,
    /// The largest tile's layout; the conversion to 8-bit levels streams through its spans.
    largest: VaeLayout,
    /// Recorded programs by tile shape (latent cells): at most four per image size.
    programs: HashMap<(u64, u64), TileProgram>,
    /// The shape of the tile decoded last, whose latent is still in the arena.
    last: Option<(u64, u64)>,
}

impl VaeDecoder {
    /// Uploads the decoder's weights (from the VAE's `store`) and lays out
    /// the arena to decode `width × height` pixel images in tiles of
    /// `tile_px` pixels, or whole when `tile_px` is `None` or covers the image.
    /// The tile must be a multiple of 8 × the VAE scale factor (64 pixels for
    /// the real VAE); diffusers' default is 1024.
    pub fn new(
        gpu: &Gpu,
        config: &VaeConfig,
        store: &WeightStore,
        width: usize,
        height: usize,
        tile_px: Option<usize>,
    ) -> Result<Self, RunError> {
        if config.out_channels != 3 {
            return Err(RunError::Input(format!("the VAE has {} output channels; images need 3", config.out_channels)));
        }
        let scale = config.scale_factor();
        if width == 0 || height == 0 || !width.is_multiple_of(2 * scale) || !height.is_multiple_of(2 * scale) {
            return Err(RunError::Input(format!(
                "the image size {width}×{height} is not a multiple of {} (twice the VAE scale factor)",
                2 * scale
            )));
        }
        let (lat_h, lat_w, scale) = ((height / scale) as u64, (width / scale) as u64, scale as u64);
        let grid = match tile_px {
            Some(t) => TileGrid::new(lat_h, lat_w, scale, t as u64),
            None => TileGrid::whole(lat_h, lat_w, scale),
        }
        .map_err(plan_error)?;
        let (tile_h, tile_w) = grid.max_tile();
        let mut arena = BumpArena::new(u64::MAX);
        let largest = VaeLayout::new(config, tile_h, tile_w, &mut arena).map_err(plan_error)?;
        let arena_bytes = arena.high_water();
        if arena_bytes > gpu.limits.max_buffer_size {
            return Err(RunError::Gpu(GpuError::UnsupportedShape(format!(
                "a {}×{} pixel VAE tile needs a {arena_bytes}-byte activation buffer, above the adapter's {} bytes; use a smaller tile",
                tile_w * scale,
                tile_h * scale,
                gpu.limits.max_buffer_size
            ))));
        }
        let weights = upload_decoder(gpu, config, store)?;
        let runner = Runner {
            arena: gpu.storage("vae activations", arena_bytes),
            // The VAE reads no RoPE tables.
            rope_cos: gpu.storage("unused", 4),
            rope_sin: gpu.storage("unused", 4),
            key_keep: None,
        };
        Ok(Self { config: config.clone(), grid, runner, weights, arena_bytes, largest, programs: HashMap::new(), last: None })
    }

    /// The tile size to use when none is forced: `None` (untiled) while the
    /// whole image's activations fit in one device buffer and its largest
    /// tensor in one storage binding (a convolution binds its whole input),
    /// else the largest square tile, in steps of 8 × the scale factor, that does.
    pub fn automatic_tile(gpu: &Gpu, config: &VaeConfig, width: usize, height: usize) -> Option<usize> {
        let scale = config.scale_factor();
        let fits = |lat_h: usize, lat_w: usize| {
            let mut arena = BumpArena::new(u64::MAX);
            let arena_ok = VaeLayout::new(config, lat_h as u64, lat_w as u64, &mut arena).is_ok()
                && arena.high_water() <= gpu.limits.max_buffer_size;
            arena_ok && 4 * program::largest_activation(config, (lat_h * lat_w) as u64) <= gpu.max_binding()
        };
        if fits(height / scale, width / scale) {
            return None;
        }
        let unit = 8 * scale;
        let start = width.max(height) / unit * unit;
        (1..=start / unit).rev().map(|n| n * unit).find(|&t| fits(t / scale, t / scale)).or(Some(unit))
    }

    /// Bytes of the activation arena (fixed by the tile, whatever the image size).
    pub fn arena_bytes(&self) -> u64 {
        self.arena_bytes
    }

    /// How the latent is cut (one tile when untiled).
    pub fn grid(&self) -> TileGrid {
        self.grid
    }

    /// Decodes packed latents `[tokens, 4·latent_channels]` (token = y·(W/2s) + x,
    /// as the transformer leaves them) into the image, reporting each tile.
    pub fn decode(&mut self, gpu: &Gpu, packed: &[f32], progress: &mut dyn FnMut(TileProgress)) -> Result<DecodedImage, RunError> {
        let g = self.grid;
        let features = 4 * self.config.latent_channels;
        let want = (g.latent_h * g.latent_w / 4) as usize * features;
        if packed.len() != want {
            return Err(RunError::Input(format!(
                "the latents hold {} values; a {}×{} image needs {} tokens × {features} = {want}",
                packed.len(),
                g.latent_w * g.scale,
                g.latent_h * g.scale,
                g.latent_h * g.latent_w / 4
            )));
        }
        let decoded = if g.is_tiled() {
            self.decode_tiled(gpu, packed, progress)?
        } else {
            let d = self.decode_tile(gpu, packed, g.latent_h, g.latent_w)?;
            progress(TileProgress { done: 1, total: 1 });
            d
        };
        let (height, width) = ((g.latent_h * g.scale) as usize, (g.latent_w * g.scale) as usize);
        let levels = self.pixel_levels(gpu, &decoded)?;
        Ok(DecodedImage { width, height, rgb: interleave_rgb(&levels, height * width), decoded })
    }

    /// The 8-bit levels of decoded values (`round(clamp(x/2 + 1/2, 0, 1)·255)`),
    /// computed on the device in chunks that fit the arena.
    pub fn pixel_levels(&self, gpu: &Gpu, decoded: &[f32]) -> Result<Vec<u8>, RunError> {
        let l = &self.largest;
        let chunk = l.decoded_len().max(1) as usize;
        let mut out = Vec::with_capacity(decoded.len());
        for part in decoded.chunks(chunk) {
            self.runner.write(gpu, l.decoded, part);
            let op = program::pixel_levels(l, part.len() as u64);
            gpu.submit(|enc| self.runner.record(gpu, enc, &self.weights, &op))?;
            let levels = self.runner.read(gpu, l.levels, 1, part.len() as u64)?;
            // The values are whole numbers in [0, 255]; the cast only changes the type.
            out.extend(levels.iter().map(|&v| v as u8));
        }
        Ok(out)
    }

    /// The de-normalised, unpatchified latent `[latent_channels, h, w]` of the
    /// tile decoded last (the whole latent when untiled): the decoder's input.
    pub fn last_latent(&self, gpu: &Gpu) -> Result<Vec<f32>, RunError> {
        let (h, w) = self.last.ok_or_else(|| RunError::Input("nothing has been decoded yet".into()))?;
        let program = self.programs.get(&(h, w)).ok_or_else(|| RunError::Input("no program for the last tile".into()))?;
        let l = &program.layout;
        Ok(self.runner.read(gpu, l.latent, 1, l.latent_channels * h * w)?)
    }

    /// Decodes one tile of `h × w` latent cells from its packed tokens; returns `[3, h·s, w·s]`.
    fn decode_tile(&mut self, gpu: &Gpu, packed: &[f32], h: u64, w: u64) -> Result<Vec<f32>, RunError> {
        self.record_tile_program(gpu, h, w)?;
        let program = self.programs.get(&(h, w)).ok_or_else(|| RunError::Input("no program for this tile".into()))?;
        let l = &program.layout;
        self.runner.write(gpu, l.packed, packed);
        gpu.submit(|enc| {
            ops::encode(enc, &program.dispatches);
            Ok(())
        })?;
        self.last = Some((h, w));
        Ok(self.runner.read(gpu, l.decoded, 1, l.decoded_len())?)
    }

    /// Lays out and records the decode of an `h × w` tile, once per shape.
    fn record_tile_program(&mut self, gpu: &Gpu, h: u64, w: u64) -> Result<(), RunError> {
        if self.programs.contains_key(&(h, w)) {
            return Ok(());
        }
        // A smaller tile's layout fits in the largest one's arena.
        let layout = VaeLayout::new(&self.config, h, w, &mut BumpArena::new(self.arena_bytes)).map_err(plan_error)?;
        let mut ops: Vec<Op> = Vec::new();
        program::decode(&layout, |op| ops.push(op));
        let mut dispatches = Vec::new();
        for op in &ops {
            self.runner.record(gpu, &mut dispatches, &self.weights, op)?;
        }
        self.programs.insert((h, w), TileProgram { layout, dispatches });
        Ok(())
    }

    /// diffusers' `tiled_decode`: each tile decoded alone, blended in place
    /// with the (already blended) tile above and tile to the left, then
    /// cropped to `keep_px` and placed at its start.
    fn decode_tiled(&mut self, gpu: &Gpu, packed: &[f32], progress: &mut dyn FnMut(TileProgress)) -> Result<Vec<f32>, RunError> {
        let g = self.grid;
        let s = g.scale as usize;
        let (out_h, out_w) = (g.latent_h as usize * s, g.latent_w as usize * s);
        let (blend, keep) = (g.blend_px() as usize, g.keep_px() as usize);
        let features = 4 * self.config.latent_channels;
        let mut image = vec![0f32; 3 * out_h * out_w];
        let mut above: Vec<PixelTile> = Vec::new();
        let total = g.count() as usize;
        for row in 0..g.rows() {
            let mut current: Vec<PixelTile> = Vec::with_capacity(g.cols() as usize);
            for col in 0..g.cols() {
                let t = g.tile(row, col);
                let tokens = tile_tokens(packed, g.latent_w as usize / 2, features, t);
                let data = self.decode_tile(gpu, &tokens, t.h, t.w)?;
                let mut tile = PixelTile { h: t.h as usize * s, w: t.w as usize * s, data };
                if let Some(a) = above.get(col as usize) {
                    blend_rows(a, &mut tile, blend);
                }
                if let Some(a) = current.last() {
                    blend_cols(a, &mut tile, blend);
                }
                tile.paste(&mut image, out_h, out_w, t.y0 as usize * s, t.x0 as usize * s, keep);
                current.push(tile);
                progress(TileProgress { done: (row * g.cols() + col + 1) as usize, total });
            }
            above = current;
        }
        Ok(image)
    }
}

/// Uploads what decoding reads: `decoder.*`, `post_quant_conv.*` and the
/// latent BatchNorm statistics, each checked against the config's shape.
fn upload_decoder(gpu: &Gpu, config: &VaeConfig, store: &WeightStore) -> Result<DeviceWeights, LoadError> {
    let mut specs: Vec<TensorSpec> = Vec::new();
    tensors::vae(config, |s| {
        let n = s.name.as_str();
        if n.starts_with("decoder.") || n.starts_with("post_quant_conv.") || n == "bn.running_mean" || n == "bn.running_var" {
            specs.push(s.clone());
        }
    });
    let mut weights = DeviceWeights::default();
    for spec in &specs {
        let t = store.tensor(&spec.name)?;
        if t.shape != spec.shape.as_slice() {
            return Err(LoadError::WrongTensor {
                component: store.component.clone(),
                name: spec.name.to_string(),
                expected: format!("shape {:?}", spec.shape.as_slice()),
                found: format!("shape {:?}", t.shape),
            });
        }
        weights.insert(&spec.name, DeviceWeight::upload(gpu, &store.component, &spec.name, t)?);
    }
    Ok(weights)
}

/// The packed tokens of one tile, from the whole latent's `[rows, row_tokens]` grid.
fn tile_tokens(packed: &[f32], row_tokens: usize, features: usize, t: Tile) -> Vec<f32> {
    let (y0, x0, h, w) = (t.y0 as usize / 2, t.x0 as usize / 2, t.h as usize / 2, t.w as usize / 2);
    let mut out = Vec::with_capacity(h * w * features);
    for y in y0..y0 + h {
        out.extend_from_slice(&packed[(y * row_tokens + x0) * features..(y * row_tokens + x0 + w) * features]);
    }
    out
}

/// A decoded tile `[3, h, w]` in pixels.
#[derive(Debug)]
struct PixelTile {
    h: usize,
    w: usize,
    data: Vec<f32>,
}

impl PixelTile {
    fn row(&self, c: usize, y: usize) -> &[f32] {
        &self.data[(c * self.h + y) * self.w..][..self.w]
    }

    /// Copies the top-left `keep × keep` pixels (or fewer at the border) into the image at `(y0, x0)`.
    fn paste(&self, image: &mut [f32], out_h: usize, out_w: usize, y0: usize, x0: usize, keep: usize) {
        let (h, w) = (self.h.min(keep).min(out_h - y0), self.w.min(keep).min(out_w - x0));
        for c in 0..3 {
            for y in 0..h {
                let dst = (c * out_h + y0 + y) * out_w + x0;
                image[dst..dst + w].copy_from_slice(&self.row(c, y)[..w]);
            }
        }
    }
}

/// The ramp weights of diffusers' blends at step `i` of `extent`: `(1 − i/e, i/e)`
/// computed in f64 (Python floats) and applied in f32, as torch does.
fn ramp(i: usize, extent: usize) -> (f32, f32) {
    let t = i as f64 / extent as f64;
    ((1.0 - t) as f32, t as f32)
}

/// diffusers' `blend_v`: the first rows of `b` fade in from the last rows of `a`, the tile above.
fn blend_rows(a: &PixelTile, b: &mut PixelTile, extent: usize) {
    let e = extent.min(a.h).min(b.h);
    let w = a.w.min(b.w);
    for c in 0..3 {
        for y in 0..e {
            let (wa, wb) = ramp(y, e);
            let top = a.row(c, a.h - e + y);
            let start = (c * b.h + y) * b.w;
            for (v, &u) in b.data[start..start + w].iter_mut().zip(top) {
                *v = u * wa + *v * wb;
            }
        }
    }
}

/// diffusers' `blend_h`: the first columns of `b` fade in from the last columns of `a`, the tile to the left.
fn blend_cols(a: &PixelTile, b: &mut PixelTile, extent: usize) {
    let e = extent.min(a.w).min(b.w);
    for c in 0..3 {
        for y in 0..a.h.min(b.h) {
            let left = a.row(c, y);
            let start = (c * b.h + y) * b.w;
            for x in 0..e {
                let (wa, wb) = ramp(x, e);
                let v = &mut b.data[start + x];
                *v = left[a.w - e + x] * wa + *v * wb;
            }
        }
    }
}

/// Planar `[3, pixels]` levels to interleaved RGB.
fn interleave_rgb(planar: &[u8], pixels: usize) -> Vec<u8> {
    (0..pixels).flat_map(|i| [planar[i], planar[pixels + i], planar[2 * pixels + i]]).collect()
}

fn plan_error(e: VaePlanError) -> RunError {
    RunError::Input(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tile(h: usize, w: usize, f: impl Fn(usize, usize, usize) -> f32) -> PixelTile {
        let data = (0..3).flat_map(|c| (0..h).flat_map(move |y| (0..w).map(move |x| (c, y, x)))).map(|(c, y, x)| f(c, y, x)).collect();
        PixelTile { h, w, data }
    }

    #[test]
    fn blends_ramp_from_the_neighbour_to_the_tile() {
        // Tile above all 1, tile below all 0: row y of the overlap is 1 − y/e.
        let a = tile(6, 4, |_, _, _| 1.0);
        let mut b = tile(5, 4, |_, _, _| 0.0);
        blend_rows(&a, &mut b, 4);
        assert_eq!(b.row(2, 0), &[1.0; 4]);
        assert_eq!(b.row(1, 1), &[0.75; 4]);
        assert_eq!(b.row(0, 3), &[0.25; 4]);
        assert_eq!(b.row(0, 4), &[0.0; 4]);
        // Left tile reads its own last columns: value = column index.
        let a = tile(2, 6, |_, _, x| x as f32);
        let mut b = tile(2, 3, |_, _, _| 0.0);
        blend_cols(&a, &mut b, 4);
        // Extent clipped to b's width (3): columns 3, 4, 5 of a with weights 1, 2/3, 1/3.
        assert_eq!(b.row(0, 1)[0], 3.0);
        assert!((b.row(0, 1)[1] - 4.0 * (1.0 - 1.0 / 3.0) as f32).abs() < 1e-6);
        assert!((b.row(0, 1)[2] - 5.0 * (1.0 - 2.0 / 3.0) as f32).abs() < 1e-6);
    }

    #[test]
    fn tile_tokens_cut_the_packed_grid() {
        // 4×6 latent cells = 2×3 tokens of 1 feature, numbered in order.
        let packed: Vec<f32> = (0..6).map(|i| i as f32).collect();
        let t = Tile { row: 0, col: 1, y0: 0, x0: 2, h: 4, w: 4 };
        assert_eq!(tile_tokens(&packed, 3, 1, t), vec![1.0, 2.0, 4.0, 5.0]);
    }
}
