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
    use super::*;
    use crate::testing::*;
    use flux_lite_core::oracle::{self as r, Weights};

    fn check_denorm_unpatchify(channels: usize, height: usize, width: usize, bf16: bool, seed: u64) {
        let gpu = gpu();
        let mut rng = Rng::new(seed);
        let n = 4 * channels * height * width;
        let packed = rng.normals(n, 1.0);
        let (mean_bits, var_bits) = (rng.bf16s(4 * channels, 0.5), rng.bf16s(4 * channels, 1.0));
        // Variances must be positive.
        let var_bits: Vec<u16> = var_bits.iter().map(|&b| b & 0x7fff).collect();
        let mean_f: Vec<f32> = rng.normals(4 * channels, 0.5);
        let var_f: Vec<f32> = rng.normals(4 * channels, 1.0).iter().map(|v| v.abs() + 0.5).collect();
        let (mean_ref, var_ref) =
            if bf16 { (Weights::Bf16(&mean_bits), Weights::Bf16(&var_bits)) } else { (Weights::F32(&mean_f), Weights::F32(&var_f)) };
        let eps = 1e-4f32;
        let mut want = vec![0.0; n];
        r::denorm_unpatchify(&packed, mean_ref, var_ref, [channels, height, width], eps as f64, &mut want);

        let pb = gpu.upload_f32("packed", &packed);
        let (mb, vb) = if bf16 {
            (gpu.upload_bf16("mean", &mean_bits), gpu.upload_bf16("var", &var_bits))
        } else {
            (gpu.upload_f32("mean", &mean_f), gpu.upload_f32("var", &var_f))
        };
        let weight = |buf| if bf16 { Weight::bf16(buf) } else { Weight::f32(buf) };
        let out = poisoned(gpu, n);
        let got = run_and_read(gpu, &out, n, |enc| {
            let stats = LatentStats { mean: weight(&mb), var: weight(&vb), eps };
            let (c, h, w) = (channels as u64, height as u64, width as u64);
            denorm_unpatchify(gpu, enc, Mat::new(&pb, 4 * c), stats, Mat::new(&out, 4 * h * w), [c, h, w])
        });
        assert_close(&format!("denorm_unpatchify {channels}×{height}×{width} bf16={bf16}"), &got, &want, F32_TOL);
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
        let gpu = gpu();
        let mut x = Rng::new(62).normals(1001, 0.8);
        // Clamped at both ends, and values whose level lands exactly on a half (ties go to even).
        x.extend([-3.0, 3.0, -1.0, 1.0, 0.0, -0.494_117_65, -0.486_274_5]);
        let want: Vec<f64> = x.iter().map(|&v| r::pixel_level(v)).collect();
        let n = x.len();
        let (xb, out) = (gpu.upload_f32("decoded", &x), poisoned(gpu, n));
        let got = run_and_read(gpu, &out, n, |enc| pixel_levels(gpu, enc, Mat::new(&xb, 0), Mat::new(&out, 0), n as u64));
        assert_close("pixel levels", &got, &want, 0.0);
        assert!(want.iter().all(|&v| (0.0..=255.0).contains(&v) && v.fract() == 0.0));
    }
}
