//! The latent-to-RGB map of a model's VAE, for previews while denoising:
//! FLUX.2's published one for its 32-channel VAE, or the model folder's own
//! `vae/latent_rgb.json` (`{"factors": [[r, g, b], …], "bias": [r, g, b]}`,
//! one row per latent channel; the tiny test models carry one fitted by
//! least squares against their decoder).

use crate::components::transformer::Transformer;
use crate::error::{LoadError, RunError};
use crate::model::ModelFolder;
use flux_lite_core::config::VaeConfig;
use flux_lite_core::ir::level_words;
use flux_lite_core::preview::{self, LatentRgb};
use std::path::Path;

/// A latent-to-RGB map, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct LatentRgbMap {
    pub factors: Vec<[f32; 3]>,
    pub bias: [f32; 3],
}

/// FLUX.2's VAE: 32 latent channels.
const FLUX2_LATENT_CHANNELS: usize = 32;

/// The map for `model`'s VAE: the folder's `vae/latent_rgb.json` where
/// there is one, else FLUX.2's for a 32-channel VAE; an error otherwise.
pub fn latent_rgb(model: &ModelFolder) -> Result<LatentRgbMap, RunError> {
    let channels = model.vae.latent_channels;
    let file = model.root.join("vae/latent_rgb.json");
    if file.is_file() {
        return Ok(read_map(&file, channels)?);
    }
    if channels == FLUX2_LATENT_CHANNELS {
        return Ok(LatentRgbMap { factors: preview::FLUX2.factors.to_vec(), bias: preview::FLUX2.bias });
    }
    Err(RunError::Load(LoadError::Missing {
        path: file,
        what: format!("no latent-to-RGB map for this VAE ({channels} latent channels; FLUX.2's has 32), which previews need: add the file, or draw previews with a tiny preview decoder"),
    }))
}

fn read_map(file: &Path, channels: usize) -> Result<LatentRgbMap, LoadError> {
    let field = |field: &str, problem: String| LoadError::Field { path: file.into(), field: field.into(), problem };
    let text = std::fs::read_to_string(file).map_err(|source| LoadError::Io { path: file.into(), source })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| LoadError::Json { path: file.into(), detail: e.to_string() })?;
    let triple = |v: &serde_json::Value| -> Option<[f32; 3]> {
        let a = v.as_array().filter(|a| a.len() == 3)?;
        let f = |i: usize| a[i].as_f64().map(|x| x as f32).filter(|x| x.is_finite());
        Some([f(0)?, f(1)?, f(2)?])
    };
    let factors: Option<Vec<[f32; 3]>> = json["factors"].as_array().map(|rows| rows.iter().map(triple).collect::<Option<Vec<_>>>()).unwrap_or(None);
    let factors = factors.ok_or_else(|| field("factors", "should be a list of [r, g, b] numbers".into()))?;
    if factors.len() != channels {
        return Err(field("factors", format!("has {} rows; the VAE has {channels} latent channels", factors.len())));
    }
    let bias = triple(&json["bias"]).ok_or_else(|| field("bias", "should be [r, g, b] numbers".into()))?;
    Ok(LatentRgbMap { factors, bias })
}

/// A preview drawn on the GPU from a transformer's latents in place: the
/// map and the levels buffer are made once and the dispatch prepared once,
/// before the first step; each draw runs it and reads back the levels at the
/// latent's resolution (three bytes' worth a latent pixel, not the latents),
/// which the host enlarges to the image's size.
#[derive(Debug)]
pub struct GpuPreview {
    dispatch: flux_lite_kernels::Dispatch,
    levels: flux_lite_kernels::DeviceBuffer,
    /// The latent's resolution `(height, width)` and the enlargement to the image's.
    small: (usize, usize),
    enlarge: usize,
    _map: flux_lite_kernels::DeviceBuffer,
}

impl GpuPreview {
    /// The preview of the packed latents at `latents` (a transformer's, in
    /// place) on a `grid` of tokens.
    pub fn new(gpu: &flux_lite_kernels::Gpu, latents: flux_lite_kernels::Mat<'_>, map: &LatentRgbMap, (grid_h, grid_w): (usize, usize), vae: &VaeConfig) -> Result<Self, RunError> {
        let words: Vec<f32> = map.factors.iter().flatten().copied().chain(map.bias).collect();
        let map_buf = gpu.upload_f32("latent-to-RGB map", &words);
        let small = (2 * grid_h, 2 * grid_w);
        let levels = gpu.storage("preview levels", 4 * level_words((small.0 * small.1 * 3) as u64));
        let weight = flux_lite_kernels::Weight::f32(&map_buf);
        let out = flux_lite_kernels::Mat { buf: &levels, offset: 0, stride: 0 };
        let mut dispatches = Vec::new();
        let shape = [map.factors.len() as u64, grid_h as u64, grid_w as u64];
        flux_lite_kernels::kernels::latent_preview(gpu, &mut dispatches, latents, weight, out, shape)?;
        let dispatch = dispatches.pop().ok_or_else(|| RunError::Internal("the latent preview made no dispatch".into()))?;
        Ok(Self { dispatch, levels, small, enlarge: vae.scale_factor(), _map: map_buf })
    }

    /// The preview of the transformer's latents now: `(width, height, rgb)`.
    pub fn draw(&self, gpu: &flux_lite_kernels::Gpu) -> Result<(usize, usize, Vec<u8>), RunError> {
        gpu.submit(|enc| {
            flux_lite_kernels::encode(enc, std::slice::from_ref(&self.dispatch));
            Ok(())
        })?;
        let (h, w) = self.small;
        let small = gpu.read_bytes(&self.levels, 0, (h * w * 3) as u64)?;
        let (height, width) = (h * self.enlarge, w * self.enlarge);
        let mut rgb = vec![0u8; width * height * 3];
        preview::enlarge_into(&small, (h, w), self.enlarge, &mut rgb).map_err(drawing_failed)?;
        Ok((width, height, rgb))
    }
}

/// What draws a run's previews: the VAE's latent-to-RGB map on the
/// latents in place, or the model's tiny decoder (`--preview-decoder`) on
/// a copy of them.
#[derive(Debug)]
pub enum Drawer {
    Map(GpuPreview),
    Decoder(Box<crate::components::tiny_decoder::TinyDecoder>),
}

impl Drawer {
    /// The drawer for `model`'s previews of `transformer`'s latents on a
    /// `grid` of tokens (a `width × height` image); a preview decoder in
    /// the plan's `layout` (by bands on the host, its activations in a
    /// scratch file in `scratch`).
    pub fn new(
        gpu: &flux_lite_kernels::Gpu,
        model: &ModelFolder,
        transformer: &Transformer,
        grid: (usize, usize),
        (width, height): (usize, usize),
        layout: Option<flux_lite_core::plan::PreviewLayout>,
        scratch: &std::path::Path,
    ) -> Result<Self, RunError> {
        match &model.preview_decoder {
            Some(file) => {
                let vae_store = model.weights(crate::model::Component::Vae)?;
                use crate::components::tiny_decoder::TinyDecoder;
                use crate::exec::activations::Bands;
                let bands = layout.map_or(Bands::Whole, Bands::from);
                Ok(Drawer::Decoder(Box::new(TinyDecoder::new(gpu, file, &model.vae, &vae_store, width, height, bands)?.in_scratch(scratch))))
            }
            None => Ok(Drawer::Map(GpuPreview::new(gpu, transformer.latents_on_device(), &latent_rgb(model)?, grid, &model.vae)?)),
        }
    }

    /// The preview of the transformer's latents now: `(width, height, rgb)`.
    pub fn draw(&self, gpu: &flux_lite_kernels::Gpu, transformer: &Transformer) -> Result<(usize, usize, Vec<u8>), RunError> {
        match self {
            Drawer::Map(map) => map.draw(gpu),
            Drawer::Decoder(decoder) => {
                let (_, rgb) = decoder.decode(gpu, &transformer.latents(gpu)?, false)?;
                let (width, height) = decoder.size();
                Ok((width, height, rgb))
            }
        }
    }
}

impl LatentRgbMap {
    /// The preview of packed latents on a `grid` of tokens, at the image's
    /// size: `(width, height, rgb)`.
    pub fn draw(&self, packed: &[f32], (grid_h, grid_w): (usize, usize), vae: &VaeConfig) -> Result<(usize, usize, Vec<u8>), RunError> {
        let enlarge = vae.scale_factor();
        let (height, width) = (2 * grid_h * enlarge, 2 * grid_w * enlarge);
        let mut rgb = vec![0u8; width * height * 3];
        let map = LatentRgb { factors: &self.factors, bias: self.bias };
        preview::draw(packed, (grid_h, grid_w), &map, enlarge, &mut rgb).map_err(drawing_failed)?;
        Ok((width, height, rgb))
    }
}

/// A preview drawn into buffers sized here that do not fit: a bug.
fn drawing_failed(e: preview::PreviewError) -> RunError {
    RunError::Internal(format!("preview: {e:?}"))
}
