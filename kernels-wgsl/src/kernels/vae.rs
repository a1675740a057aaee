//! The VAE decoder's ends: BatchNorm de-normalisation with unpatchify of
//! the packed latents, and the 8-bit pixel levels.
//! Shader: `vae.wgsl` beside this file.

use crate::kernel::{kernel, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::device::Gpu;
use crate::dispatch::{dispatch, grid64, to_u32, window, Launch, Sink};
use crate::error::GpuError;
use crate::view::{Mat, Weight};
use bytemuck::{Pod, Zeroable};

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
    kernel(Module::Vae, "pixel_levels", [64, 1, 1], &[(1, RW), (4, RW)], size_of::<VaeParams>(), false);

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

/// `dst = round(clamp(src/2 + 1/2, 0, 1)·255)` over `count` contiguous values.
pub fn pixel_levels(gpu: &Gpu, sink: &mut dyn Sink, src: Mat<'_>, dst: Mat<'_>, count: u64) -> Result<(), GpuError> {
    if count == 0 {
        return Ok(());
    }
    let sw = window(gpu, src.buf, 4, src.offset..src.offset + count, "decoded image")?;
    let dw = window(gpu, dst.buf, 4, dst.offset..dst.offset + count, "pixel levels")?;
    let params = VaeParams {
        src_offset: sw.local,
        dst_offset: dw.local,
        count: to_u32(count, "pixel values")?,
        ..Default::default()
    };
    dispatch(gpu, sink, Launch { kernel: &PIXEL_LEVELS, constants: &[], params, grid: grid64(count) }, &[(1, &sw), (4, &dw)]);
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

    #[test]
    fn pixel_levels_match_the_oracle_exactly() {
        let worst = crate::selftest::check_pixel_levels(gpu()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(worst, 0.0, "pixel levels differ from the oracle");
        let edges = [-3.0f32, 3.0, -1.0, 1.0, 0.0, -0.494_117_65, -0.486_274_5];
        assert!(edges.iter().map(|&v| r::pixel_level(v)).all(|v| (0.0..=255.0).contains(&v) && v.fract() == 0.0));
    }
}
