//! The VAE decoder's ends: BatchNorm de-normalisation with unpatchify of
//! the packed latents, and the 8-bit pixel levels; and the latent preview
//! (a latent-to-RGB map over the packed latents, at their resolution).
//! Shader: `vae.wgsl` beside this file.

use crate::kernel::{kernel, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::device::Gpu;
use crate::dispatch::{dispatch, grid64, to_u32, window, Launch, Sink};
use crate::error::GpuError;
use crate::view::{Mat, Weight};
use bytemuck::{Pod, Zeroable};
use flux_lite_core::ir::level_words;

/// `vae.wgsl` — the decoder's input (de-normalise, unpatchify) and output (8-bit levels).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct VaeParams {
    /// Latent channels, and the packed token grid (rows, columns).
    pub channels: u32,
    pub height: u32,
    pub width: u32,
    pub src_offset: u32,
    pub dst_offset: u32,
    /// Offset of the BatchNorm mean and variance (equally aligned windows).
    pub stats_offset: u32,
    /// Values to convert to levels.
    pub count: u32,
    pub eps: f32,
}

pub const DENORM_UNPATCHIFY: Kernel =
    kernel(Module::Vae, "denorm_unpatchify", [64, 1, 1], &[(1, RW), (2, R), (3, R), (4, RW)], size_of::<VaeParams>(), true);
pub const PIXEL_LEVELS: Kernel =
    kernel(Module::Vae, "pixel_levels", [64, 1, 1], &[(1, RW), (5, RW)], size_of::<VaeParams>(), false);

pub const LATENT_PREVIEW: Kernel =
    kernel(Module::Vae, "latent_preview", [64, 1, 1], &[(1, RW), (2, R), (5, RW)], size_of::<VaeParams>(), true);

/// The BatchNorm statistics of the patchified latent (`bn.running_mean`, `bn.running_var`).
#[derive(Debug, Clone, Copy)]
pub struct LatentStats<'a> {
    pub mean: Weight<'a>,
    pub var: Weight<'a>,
    pub eps: f32,
}

/// Packed latents `[height·width tokens, 4·channels]` to the VAE latent
/// `[channels, 2·height, 2·width]`: `x·√(var + eps) + mean` per patchified
/// channel, then unpatchify. `grid` is `[channels, height, width]` of the token grid.
pub fn denorm_unpatchify(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    packed: Mat<'_>,
    stats: LatentStats<'_>,
    latent: Mat<'_>,
    [channels, height, width]: [u64; 3],
) -> Result<(), GpuError> {
    if stats.mean.dtype != stats.var.dtype {
        return Err(GpuError::UnsupportedShape("the latent BatchNorm mean and variance must share a dtype".into()));
    }
    let n = 4 * channels * height * width;
    if n == 0 {
        return Ok(());
    }
    let sw = window(gpu, packed.buf, 4, packed.offset..packed.offset + n, "packed latents")?;
    let dw = window(gpu, latent.buf, 4, latent.offset..latent.offset + n, "unpatchified latent")?;
    let eb = stats.mean.dtype.bytes();
    let (m, v) = (stats.mean, stats.var);
    let mw = window(gpu, m.buf, eb, m.offset..m.offset + 4 * channels, "latent BatchNorm mean")?;
    let vw = window(gpu, v.buf, eb, v.offset..v.offset + 4 * channels, "latent BatchNorm variance")?;
    if mw.local != vw.local {
        // The kernel indexes both statistics with one offset.
        return Err(GpuError::UnsupportedShape("the latent BatchNorm mean and variance must be equally aligned".into()));
    }
    let params = VaeParams {
        channels: to_u32(channels, "latent channels")?,
        height: to_u32(height, "latent token rows")?,
        width: to_u32(width, "latent token columns")?,
        src_offset: sw.local,
        dst_offset: dw.local,
        stats_offset: mw.local,
        count: 0,
        eps: stats.eps,
    };
    let constants = [("WEIGHT_BF16", m.dtype.constant())];
    let launch = Launch { kernel: &DENORM_UNPATCHIFY, constants: &constants, params, grid: grid64(n) };
    dispatch(gpu, sink, launch, &[(1, &sw), (2, &mw), (3, &vw), (4, &dw)]);
    Ok(())
}

/// The 8-bit levels `round(clamp(src/2 + 1/2, 0, 1)·255)` of `count`
/// contiguous values, as bytes four to a word into `dst` (`level_words(count)`
/// words; [`flux_lite_core::ir::Op::PixelLevels`]).
pub fn pixel_levels(gpu: &Gpu, sink: &mut dyn Sink, src: Mat<'_>, dst: Mat<'_>, count: u64) -> Result<(), GpuError> {
    if count == 0 {
        return Ok(());
    }
    let words = level_words(count);
    let sw = window(gpu, src.buf, 4, src.offset..src.offset + count, "decoded image")?;
    let dw = window(gpu, dst.buf, 4, dst.offset..dst.offset + words, "pixel levels")?;
    let params = VaeParams {
        src_offset: sw.local,
        dst_offset: dw.local,
        count: to_u32(count, "pixel values")?,
        ..Default::default()
    };
    dispatch(gpu, sink, Launch { kernel: &PIXEL_LEVELS, constants: &[], params, grid: grid64(words) }, &[(1, &sw), (5, &dw)]);
    Ok(())
}

/// The preview of packed latents `[grid_h·grid_w, 4·channels]` as RGB
/// levels at the latent's resolution into `dst` (`2·grid_h × 2·grid_w × 3`
/// bytes, interleaved, four to a word as [`pixel_levels`] leaves them): `map` holds `channels` rows of
/// `[r, g, b]` factors then the bias, f32 (`flux_lite_core::preview::levels_into`
/// on the host computes the same).
pub fn latent_preview(gpu: &Gpu, sink: &mut dyn Sink, packed: Mat<'_>, map: Weight<'_>, dst: Mat<'_>, [channels, grid_h, grid_w]: [u64; 3]) -> Result<(), GpuError> {
    let pixels = 4 * grid_h * grid_w;
    if pixels == 0 {
        return Ok(());
    }
    if map.dtype.bytes() != 4 {
        return Err(GpuError::UnsupportedShape("the latent preview's map must be f32".into()));
    }
    let sw = window(gpu, packed.buf, 4, packed.offset..packed.offset + pixels * channels, "packed latents")?;
    let mw = window(gpu, map.buf, 4, map.offset..map.offset + 3 * channels + 3, "latent-to-RGB map")?;
    let words = level_words(3 * pixels);
    let dw = window(gpu, dst.buf, 4, dst.offset..dst.offset + words, "preview levels")?;
    let params = VaeParams {
        channels: to_u32(channels, "latent channels")?,
        height: to_u32(grid_h, "latent token rows")?,
        width: to_u32(grid_w, "latent token columns")?,
        src_offset: sw.local,
        dst_offset: dw.local,
        stats_offset: mw.local,
        ..Default::default()
    };
    let constants = [("WEIGHT_BF16", 0)];
    dispatch(gpu, sink, Launch { kernel: &LATENT_PREVIEW, constants: &constants, params, grid: grid64(words) }, &[(1, &sw), (2, &mw), (5, &dw)]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use flux_lite_core::oracle as r;

    /// The selftest's check, held to the f32 bound.
    fn check_denorm_unpatchify(channels: usize, height: usize, width: usize, bf16: bool, seed: u64) {
        let worst = crate::selftest::check_denorm_unpatchify(gpu(), [channels, height, width], bf16, seed).unwrap_or_else(|e| panic!("{e}"));
        assert!(worst <= F32_TOL, "denorm_unpatchify {channels}×{height}×{width} bf16={bf16}: relative L2 {worst:.3e}");
    }

    #[test]
    fn denorm_unpatchify_with_bf16_statistics() {
        check_denorm_unpatchify(3, 5, 7, true, 60);
    }

    #[test]
    fn denorm_unpatchify_with_f32_statistics() {
        check_denorm_unpatchify(5, 3, 9, false, 61);
    }

    /// The GPU's preview against the host's (`flux_lite_core::preview::levels_into`):
    /// the same sums in the same order, so at most a level apart where a
    /// fused multiply-add lands a sum on the other side of a rounding edge.
    #[test]
    fn latent_preview_matches_the_hosts() {
        use crate::view::{Mat, Weight};
        let gpu = gpu();
        for (channels, grid_h, grid_w, seed) in [(4usize, 3usize, 5usize, 70u64), (32, 4, 4, 71)] {
            let mut rng = Rng::new(seed);
            let packed = rng.normals(grid_h * grid_w * 4 * channels, 1.0);
            let factors: Vec<[f32; 3]> = rng.normals(3 * channels, 0.3).chunks(3).map(|c| [c[0], c[1], c[2]]).collect();
            let bias = [0.05f32, -0.1, 0.2];
            let map = flux_lite_core::preview::LatentRgb { factors: &factors, bias };
            let mut want = vec![0u8; 12 * grid_h * grid_w];
            flux_lite_core::preview::levels_into(&packed, (grid_h, grid_w), &map, &mut want).unwrap();
            let words: Vec<f32> = factors.iter().flatten().copied().chain(bias).collect();
            let (src, map_buf) = (gpu.upload_f32("packed", &packed), gpu.upload_f32("map", &words));
            // A word more than the levels take, poisoned: the kernel writes none of it.
            let words = flux_lite_core::ir::level_words(want.len() as u64) as usize;
            let dst = gpu.upload_f32("levels", &vec![f32::NAN; words + 1]);
            let mut ds = Vec::new();
            let weight = Weight::f32(&map_buf);
            super::latent_preview(gpu, &mut ds, Mat { buf: &src, offset: 0, stride: 0 }, weight, Mat { buf: &dst, offset: 0, stride: 0 }, [channels as u64, grid_h as u64, grid_w as u64]).unwrap();
            gpu.submit(|enc| {
                crate::encode(enc, &ds);
                Ok(())
            })
            .unwrap();
            let bytes = gpu.read_bytes(&dst, 0, 4 * (words as u64 + 1)).unwrap();
            let (got, rest) = bytes.split_at(want.len());
            let worst = got.iter().zip(&want).map(|(&g, &w)| g.abs_diff(w)).max().unwrap_or(0);
            let off = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            assert!(worst <= 1 && off * 50 <= want.len(), "{channels} channels: {off} of {} levels differ, by up to {worst}", want.len());
            let (tail, after) = rest.split_at(rest.len() - 4);
            assert!(tail.iter().all(|&b| b == 0) && after == f32::NAN.to_le_bytes(), "{channels} channels: bytes past the levels {tail:?}, the word after {after:?}");
        }
    }

    #[test]
    fn pixel_levels_match_the_oracle_exactly() {
        let worst = crate::selftest::check_pixel_levels(gpu()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(worst, 0.0, "pixel levels differ from the oracle");
        let edges = [-3.0f32, 3.0, -1.0, 1.0, 0.0, -0.494_117_65, -0.486_274_5];
        assert!(edges.iter().map(|&v| r::pixel_level(v)).all(|v| (0.0..=255.0).contains(&v) && v.fract() == 0.0));
    }
}
