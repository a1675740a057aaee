//! Shared helpers for the GPU tests: one device per test binary, seeded
//! random inputs, and the comparison every kernel test uses.

use crate::{Gpu, GpuError, GpuOptions};
pub use crate::test_devices::{gpu, options, small_binding_gpu, tier_gpu, tier_gpu_with, with_f16_tiles};

/// `check` on `gpu`, and where that device runs the kernels shaped for CPU
/// adapters, again on a device made with `options` (those `gpu` was made
/// with) and [`GpuOptions::gpu_shaped_kernels`]: so lavapipe checks both
/// shapes of every kernel that has two. Where the CPU-shaped kernels share
/// rows across subgroups, also on a device whose kernels read them in every
/// lane ([`GpuOptions::per_lane_reads`], as on adapters without fixed subgroups).
pub fn each_kernel_shape(gpu: &Gpu, options: GpuOptions, check: impl Fn(&Gpu)) {
    check(gpu);
    if gpu.cpu_lanes().is_some() {
        let per_lane = Gpu::new(&GpuOptions { per_lane_reads: true, ..options.clone() }).unwrap_or_else(|e| panic!("{e}"));
        assert!(per_lane.cpu_shaped_kernels() && per_lane.cpu_lanes().is_none());
        check(&per_lane);
    }
    if gpu.cpu_shaped_kernels() {
        let gpu_shaped = Gpu::new(&GpuOptions { gpu_shaped_kernels: true, ..options }).unwrap_or_else(|e| panic!("{e}"));
        assert!(!gpu_shaped.cpu_shaped_kernels());
        check(&gpu_shaped);
    }
}

/// The shared device, where its CPU-shaped kernels share rows across
/// subgroups, and beside it a device whose kernels read them in every lane
/// ([`GpuOptions::per_lane_reads`]: the tiled kernels), for the tests that
/// compare the two bit for bit; `None` after a `skipped:` line naming
/// `what` where the adapter has no fixed subgroup size to share `across`.
pub fn lanes_and_per_lane(what: &str, across: &str) -> Option<(&'static Gpu, Gpu)> {
    let lanes = gpu();
    if lanes.cpu_lanes().is_none() {
        crate::skip::skipped(format_args!("{what}: this adapter has no fixed subgroup size to share {across} across"));
        return None;
    }
    let per_lane = Gpu::new(&GpuOptions { per_lane_reads: true, ..options() }).unwrap_or_else(|e| panic!("{e}"));
    Some((lanes, per_lane))
}

/// `run` with a test's switch (a thread-local flag a launcher reads) set, cleared after it.
pub fn with_switch<T>(switch: &'static std::thread::LocalKey<std::cell::Cell<bool>>, run: impl FnOnce() -> T) -> T {
    switch.set(true);
    let out = run();
    switch.set(false);
    out
}

/// A device on the matrix tier, or `None` after printing why there is none
/// (`skipped: …`, through [`crate::skip::skipped`]). Where
/// `FLUX_LITE_REQUIRE_MATRIX` is set (CI's run on Mesa 26, which offers
/// cooperative matrices and f16) a missing tier fails instead.
pub fn matrix_gpu() -> Option<Gpu> {
    tier_gpu(crate::Precision::Matrix)
}

/// A device on the matrix tier with f16 tiles, for what only they run (the
/// half-precision data path, the channels-last convolutions, weights
/// packed into f16), or `None` after printing why: as [`matrix_gpu`], and
/// on an adapter whose tiles are f32 (Apple's, emulated on lavapipe), a
/// `skipped:` line, since that tier takes none of it.
pub fn f16_matrix_gpu() -> Option<Gpu> {
    matrix_gpu().and_then(with_f16_tiles)
}

/// A device on the f16 tier, or `None` after printing why (as [`matrix_gpu`]).
pub fn half_gpu() -> Option<Gpu> {
    tier_gpu(crate::Precision::F16)
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
