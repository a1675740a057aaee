//! Shared helpers for the GPU tests: one device per test binary, seeded
//! random inputs, and the comparison every kernel test uses.

use crate::{Gpu, GpuError, GpuOptions};
use std::sync::OnceLock;

/// The test device (lavapipe in CI). Fails loudly when there is none: the
/// kernel tests are the point of running on a machine without a GPU.
pub fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new(&crate::testing::options()).unwrap_or_else(|e| panic!("{e}")))
}

/// `check` on `gpu`, and where that device runs the kernels shaped for CPU
/// adapters, again on a device made with `options` (those `gpu` was made
/// with) and [`GpuOptions::gpu_shaped_kernels`]: so lavapipe checks both
/// shapes of every kernel that has two.
pub fn each_kernel_shape(gpu: &Gpu, options: GpuOptions, check: impl Fn(&Gpu)) {
    check(gpu);
    if gpu.cpu_shaped_kernels() {
        let gpu_shaped = Gpu::new(&GpuOptions { gpu_shaped_kernels: true, ..options }).unwrap_or_else(|e| panic!("{e}"));
        assert!(!gpu_shaped.cpu_shaped_kernels());
        check(&gpu_shaped);
    }
}

/// The tests' device options: what the environment sets (CI reruns the
/// kernel tests with `FLUX_LITE_BACKEND=gl`), the rest the defaults.
pub fn options() -> GpuOptions {
    GpuOptions::from_env().unwrap_or_else(|e| panic!("{e}"))
}

/// A device whose storage bindings are capped at `bytes`, to force the split paths.
pub fn small_binding_gpu(bytes: u64) -> Gpu {
    Gpu::new(&GpuOptions { max_storage_binding: Some(bytes), ..crate::testing::options() }).unwrap_or_else(|e| panic!("{e}"))
}

/// A device on the matrix tier, or `None` after printing why there is none
/// (`skipped: …`, through [`crate::skip::skipped`]). Where
/// `FLUX_LITE_REQUIRE_MATRIX` is set (CI's run on Mesa 26, which offers
/// cooperative matrices and f16) a missing tier fails instead.
pub fn matrix_gpu() -> Option<Gpu> {
    tier_gpu(crate::Precision::Matrix)
}

/// A device on the f16 tier, or `None` after printing why (as [`matrix_gpu`]).
pub fn half_gpu() -> Option<Gpu> {
    tier_gpu(crate::Precision::F16)
}

fn tier_gpu(tier: crate::Precision) -> Option<Gpu> {
    tier_gpu_with(GpuOptions { precision: tier, ..crate::testing::options() })
}

/// A device made with `options` (a half tier among them), or `None` after
/// printing why (as [`matrix_gpu`]).
pub fn tier_gpu_with(options: GpuOptions) -> Option<Gpu> {
    let tier = options.precision;
    match Gpu::new(&options) {
        Ok(gpu) => Some(gpu),
        Err(e) if std::env::var_os("FLUX_LITE_REQUIRE_MATRIX").is_some() => panic!("FLUX_LITE_REQUIRE_MATRIX is set: {e}"),
        Err(e) => {
            crate::skip::skipped(format_args!("no {} tier on this adapter: {e}", tier.name()));
            None
        }
    }
}

/// `v` as the matrix tier's f16 operands see it.
pub fn as_f16(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// How `gpu`'s tier rounds a product's operands: to f16 on the f16 tier
/// and on matrix units with f16 tiles, not at all on f32 tiles.
pub fn operand_rounding(gpu: &Gpu) -> fn(f32) -> f32 {
    match gpu.matrix() {
        Some(c) if c.operands == crate::MatrixOperands::F32 => |v| v,
        _ => as_f16,
    }
}

/// Relative L2 error of `got` against the f64 reference, with the worst element named on failure.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, -1.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = g as f64 - w;
        let size = if d.is_nan() { f64::INFINITY } else { d.abs() };
        if size > worst.1 {
            worst = (i, size);
        }
    }
    let rel = rel_l2(got, want);
    assert!(
        rel <= tol,
        "{what}: relative L2 error {rel:.3e} > {tol:.0e}; worst element {} got {} want {}",
        worst.0,
        got[worst.0],
        want[worst.0]
    );
}

/// Records and submits work, then reads `count` floats of `buf` back.
pub fn run_and_read(
    gpu: &Gpu,
    buf: &wgpu::Buffer,
    count: usize,
    record: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<(), GpuError>,
) -> Vec<f32> {
    gpu.submit(record).unwrap_or_else(|e| panic!("{e}"));
    gpu.read_f32(buf, 0, count).unwrap_or_else(|e| panic!("{e}"))
}

/// A selftest check, held to the f32 bound.
#[track_caller]
pub fn held(what: &str, got: Result<f64, GpuError>) {
    held_within(what, got, F32_TOL);
}

/// A selftest check, held to `tolerance` (relative L2).
#[track_caller]
pub fn held_within(what: &str, got: Result<f64, GpuError>, tolerance: f64) {
    let worst = got.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(worst <= tolerance, "{what}: relative L2 {worst:.3e} > {tolerance:.0e}");
}

/// The f32 kernels' tolerance against the f64 oracle (the project's rule for every f32 kernel).
pub const F32_TOL: f64 = crate::selftest::F32_KERNEL;

pub use crate::selftest::{poisoned, rel_l2, Rng};
