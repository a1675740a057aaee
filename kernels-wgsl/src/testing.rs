//! Shared helpers for the GPU tests: one device per test binary, seeded
//! random inputs, and the comparison every kernel test uses.

use crate::{DeviceBuffer, Gpu, GpuError, GpuOptions};
use std::sync::OnceLock;

/// The test device (lavapipe in CI). Fails loudly when there is none: the
/// kernel tests are the point of running on a machine without a GPU.
pub fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new(&GpuOptions::default()).unwrap_or_else(|e| panic!("{e}")))
}

/// A device whose storage bindings are capped at `bytes`, to force the split paths.
pub fn small_binding_gpu(bytes: u64) -> Gpu {
    Gpu::new(&GpuOptions { max_storage_binding: Some(bytes), ..Default::default() }).unwrap_or_else(|e| panic!("{e}"))
}

/// A device on the matrix tier, or `None` after printing why there is none
/// (`skipped: …`). Where `FLUX_LITE_REQUIRE_MATRIX` is set (CI's run on
/// Mesa 26, which offers cooperative matrices and f16) a missing tier fails instead.
pub fn matrix_gpu() -> Option<Gpu> {
    tier_gpu(crate::Precision::Matrix)
}

/// A device on the f16 tier, or `None` after printing why (as [`matrix_gpu`]).
pub fn half_gpu() -> Option<Gpu> {
    tier_gpu(crate::Precision::F16)
}

fn tier_gpu(tier: crate::Precision) -> Option<Gpu> {
    tier_gpu_with(GpuOptions { precision: tier, ..Default::default() })
}

/// A device made with `options` (a half tier among them), or `None` after
/// printing why (as [`matrix_gpu`]).
pub fn tier_gpu_with(options: GpuOptions) -> Option<Gpu> {
    let tier = options.precision;
    match Gpu::new(&options) {
        Ok(gpu) => Some(gpu),
        Err(e) if std::env::var_os("FLUX_LITE_REQUIRE_MATRIX").is_some() => panic!("FLUX_LITE_REQUIRE_MATRIX is set: {e}"),
        Err(e) => {
            println!("skipped: no {} tier on this adapter: {e}", tier.name());
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

/// SplitMix64: small, seedable, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }

    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }

    pub fn bf16s(&mut self, n: usize, scale: f32) -> Vec<u16> {
        (0..n).map(|_| flux_lite_core::numerics::bf16::from_f32(self.normal() * scale)).collect()
    }
}

/// Fresh output buffers hold NaN, so an element a kernel forgot to write fails the comparison.
pub fn poisoned(gpu: &Gpu, n: usize) -> DeviceBuffer {
    gpu.upload_f32("poisoned", &vec![f32::NAN; n])
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

/// Relative L2 error of `got` against `want`.
pub fn rel_l2(got: &[f32], want: &[f64]) -> f64 {
    let diff2: f64 = got.iter().zip(want).map(|(&g, &w)| (g as f64 - w) * (g as f64 - w)).sum();
    let ref2: f64 = want.iter().map(|w| w * w).sum();
    (diff2 / ref2.max(f64::MIN_POSITIVE)).sqrt()
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

/// The f32 kernels' tolerance against the f64 oracle: relative L2 ≤ 1e-5 (the project's rule for every f32 kernel).
pub const F32_TOL: f64 = 1e-5;
