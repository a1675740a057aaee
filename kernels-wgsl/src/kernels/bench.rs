//! The adapter's ceilings for `bench`: chains of vec4 FMAs (arithmetic)
//! and a vec4 copy (memory).
//! Shader: `bench.wgsl` beside this file.

use crate::kernel::{kernel, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::device::Gpu;
use crate::dispatch::{dispatch, to_u32, window, Launch, Sink};
use crate::error::GpuError;
use bytemuck::{Pod, Zeroable};
use crate::kernel::wrapped_grid;

/// `bench.wgsl` — the ceilings: `iterations` of the FMA loop, `count`
/// invocations that write (FMA) or vec4s copied (copy).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct PeakParams {
    pub iterations: u32,
    pub count: u32,
    pub _pad: [u32; 2],
}

/// The adapter's arithmetic ceiling: chains of vec4 FMAs (see `bench.wgsl`).
pub const FMA_PEAK: Kernel = kernel(Module::Bench, "fma_peak", [256, 1, 1], &[(1, RW)], size_of::<PeakParams>(), false);
/// The adapter's memory ceiling for a kernel: a vec4 copy.
pub const COPY_PEAK: Kernel = kernel(Module::Bench, "copy_peak", [256, 1, 1], &[(2, R), (3, RW)], size_of::<PeakParams>(), false);
/// FMAs per invocation and iteration of `fma_peak`: 8 chains × 4 lanes × 4 unrolled.
pub const FMA_PEAK_FMAS_PER_ITERATION: u64 = 8 * 4 * 4;
/// The matrix units' ceiling (`bench_matrix.wgsl`), one module per tile size;
/// its workgroup is one subgroup (the `WG` override).
pub const MATRIX_PEAK_8: Kernel = kernel(Module::BenchMatrix8, "matrix_peak", [0, 1, 1], &[(1, RW)], size_of::<PeakParams>(), false);
pub const MATRIX_PEAK_16: Kernel = Kernel { module: Module::BenchMatrix16, ..MATRIX_PEAK_8 };
pub const MATRIX_PEAK_8_F32: Kernel = Kernel { module: Module::BenchMatrix8F32, ..MATRIX_PEAK_8 };
/// Independent accumulator chains per workgroup of `matrix_peak`.
pub const MATRIX_PEAK_CHAINS: u64 = 4;

/// The arithmetic ceiling: `workgroups` of 256 invocations, each running
/// `iterations` of [`FMA_PEAK_FMAS_PER_ITERATION`] FMAs; one f32 per
/// invocation lands in `sink` (at least `256·workgroups` values).
pub fn fma_peak(gpu: &Gpu, out: &mut dyn Sink, sink: &wgpu::Buffer, workgroups: u64, iterations: u32) -> Result<(), GpuError> {
    let count = to_u32(workgroups * 256, "fma_peak invocations")?;
    let sw = window(gpu, sink, 4, 0..count as u64, "fma_peak output")?;
    let params = PeakParams { iterations, count, _pad: [0; 2] };
    dispatch(gpu, out, Launch { kernel: &FMA_PEAK, constants: &[], params, grid: wrapped_grid(workgroups) }, &[(1, &sw)]);
    Ok(())
}

/// The memory ceiling: `vec4s` four-float values copied from `src` to `dst`
/// (both at least that long, within one binding).
pub fn copy_peak(gpu: &Gpu, out: &mut dyn Sink, src: &wgpu::Buffer, dst: &wgpu::Buffer, vec4s: u64) -> Result<(), GpuError> {
    let count = to_u32(vec4s, "copy_peak values")?;
    let sw = window(gpu, src, 16, 0..vec4s, "copy_peak source")?;
    let dw = window(gpu, dst, 16, 0..vec4s, "copy_peak destination")?;
    let params = PeakParams { iterations: 0, count, _pad: [0; 2] };
    dispatch(gpu, out, Launch { kernel: &COPY_PEAK, constants: &[], params, grid: wrapped_grid(vec4s.div_ceil(256)) }, &[(2, &sw), (3, &dw)]);
    Ok(())
}


/// The matrix units' ceiling on the matrix tier: `workgroups` of one
/// subgroup each, running [`MATRIX_PEAK_CHAINS`] chains of `iterations`
/// T×T×T multiply-adds; each invocation's sum lands in `sink` (at least
/// `subgroup·workgroups` values). FLOPs = workgroups · iterations · chains · 2·T³.
pub fn matrix_peak(gpu: &Gpu, out: &mut dyn Sink, sink: &wgpu::Buffer, workgroups: u64, iterations: u32) -> Result<(), GpuError> {
    let Some(c) = gpu.matrix() else {
        return Err(GpuError::UnsupportedShape("matrix_peak runs on the matrix tier only".into()));
    };
    let count = to_u32(workgroups * c.subgroup as u64, "matrix_peak invocations")?;
    let sw = window(gpu, sink, 4, 0..count as u64, "matrix_peak output")?;
    let params = PeakParams { iterations, count, _pad: [0; 2] };
    let kernel = c.pick([&MATRIX_PEAK_8, &MATRIX_PEAK_16, &MATRIX_PEAK_8_F32]);
    let launch = Launch { kernel, constants: &[("WG", c.subgroup)], params, grid: wrapped_grid(workgroups) };
    dispatch(gpu, out, launch, &[(1, &sw)]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    /// `fma_peak`'s sum for invocation `i` after `steps` FMAs per chain, in f64
    /// from the kernel's f32 starting values.
    fn fma_peak_reference(i: u32, steps: u32) -> f64 {
        let s = (i & 1023) as f32 * 1e-3;
        let base = [s, s + 0.01, s + 0.02, s + 0.03];
        let m = [0.999f32, 0.998, 0.997, 0.996];
        let mut total = 0.0;
        for chain in 0..8 {
            for lane in 0..4 {
                let mut a = (base[lane] + [0.0f32, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7][chain]) as f64;
                for _ in 0..steps {
                    a = a * m[lane] as f64 + 1e-3f32 as f64;
                }
                total += a;
            }
        }
        total
    }

    #[test]
    fn fma_peak_computes_its_chains() {
        // The ceiling kernel's work must be real: every invocation's chains, 4 unrolled FMAs an iteration.
        let gpu = gpu();
        let (workgroups, iterations) = (5u64, 7u32);
        let count = (256 * workgroups) as usize;
        let sink = poisoned(gpu, count);
        let got = run_and_read(gpu, &sink, count, |enc| fma_peak(gpu, enc, &sink, workgroups, iterations));
        let want: Vec<f64> = (0..count as u32).map(|i| fma_peak_reference(i, 4 * iterations)).collect();
        assert_close("fma_peak", &got, &want, F32_TOL);
    }

    #[test]
    fn copy_peak_copies_every_vec4() {
        let gpu = gpu();
        let vec4s = 1000u64;
        let src: Vec<f32> = Rng::new(44).normals(4 * vec4s as usize, 1.0);
        let (sb, db) = (gpu.upload_f32("src", &src), poisoned(gpu, 4 * vec4s as usize + 4));
        let got = run_and_read(gpu, &db, 4 * vec4s as usize + 4, |enc| copy_peak(gpu, enc, &sb, &db, vec4s));
        assert!(got[..src.len()].iter().zip(&src).all(|(g, s)| g.to_bits() == s.to_bits()), "copy_peak changed a value");
        assert!(got[src.len()..].iter().all(|v| v.is_nan()), "copy_peak wrote past its count");
    }

    #[test]
    fn matrix_peak_computes_its_products() {
        let Some(gpu) = matrix_gpu() else { return };
        let c = gpu.matrix().unwrap();
        let (t, wg) = (c.size as usize, c.subgroup as usize);
        let (workgroups, iterations) = (3u64, 5u32);
        let count = wg * workgroups as usize;
        let sink = poisoned(&gpu, count);
        let got = run_and_read(&gpu, &sink, count, |enc| matrix_peak(&gpu, enc, &sink, workgroups, iterations));
        // A = B = (i mod 7)/8 row-major: each chain holds iterations · A·A, exact in f32.
        let a = |r: usize, k: usize| ((r * t + k) % 7) as f64 * 0.125;
        let product = |i: usize| (0..t).map(|k| a(i / t, k) * a(k, i % t)).sum::<f64>();
        let want: Vec<f64> = (0..count).map(|s| MATRIX_PEAK_CHAINS as f64 * iterations as f64 * product((s % wg) % (t * t))).collect();
        assert_close("matrix_peak sums", &got, &want, 0.0);
    }
}
