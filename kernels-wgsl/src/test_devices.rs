//! The devices the workspace's tests run on, in one place: options from the
//! environment (CI reruns tests with `FLUX_LITE_BACKEND=gl`), one shared
//! device per test binary, devices on a named tier, and the one rule for a
//! tier this machine lacks: a `skipped:` line, or a failure where
//! `FLUX_LITE_REQUIRE_MATRIX` is set (CI's run on Mesa 26, which offers
//! both half tiers). Behind the `test-support` feature: no shipping code
//! reads the environment through it.

use crate::{Gpu, GpuOptions, Precision};
use std::sync::OnceLock;

/// The tests' device options: what the environment sets, the rest the defaults.
pub fn options() -> GpuOptions {
    GpuOptions::from_settings(&|name| std::env::var(name).ok()).unwrap_or_else(|e| panic!("{e}"))
}

/// The test device (lavapipe in CI). Fails loudly when there is none: the
/// tests are the point of running on a machine without a GPU.
pub fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new(&options()).unwrap_or_else(|e| panic!("{e}")))
}

/// A device whose storage bindings are capped at `bytes`, to force the split paths.
pub fn small_binding_gpu(bytes: u64) -> Gpu {
    Gpu::new(&GpuOptions { max_storage_binding: Some(bytes), ..options() }).unwrap_or_else(|e| panic!("{e}"))
}

/// A device on `tier`, or `None` after [`missing_tier`].
pub fn tier_gpu(tier: Precision) -> Option<Gpu> {
    tier_gpu_with(GpuOptions { precision: tier, ..options() })
}

/// A device made with `options` (a half tier among them), or `None` after
/// [`missing_tier`].
pub fn tier_gpu_with(options: GpuOptions) -> Option<Gpu> {
    let tier = options.precision;
    match Gpu::new(&options) {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            missing_tier(format_args!("no {} tier on this adapter: {e}", tier.name()));
            None
        }
    }
}

/// `gpu` (a matrix-tier device) where its tiles are f16, else `None` after
/// a `skipped:` line: what only f16 tiles run (the half-precision data
/// path, the channels-last VAE, weights packed into f16) an adapter with
/// f32 tiles (Apple's, emulated on lavapipe) never takes.
pub fn with_f16_tiles(gpu: Gpu) -> Option<Gpu> {
    if !has_f16_tiles(&gpu) {
        let config = gpu.matrix().expect("a matrix-tier device");
        crate::skip::skipped(format_args!("the matrix tier here runs f32 tiles ({}), and this checks what only f16 tiles run", config.describe()));
        return None;
    }
    Some(gpu)
}

/// Whether `gpu` runs the matrix tier on f16 tiles.
pub fn has_f16_tiles(gpu: &Gpu) -> bool {
    gpu.f16_operands()
}

/// A test cannot run a tier here: it says why on a `skipped:` line, unless
/// `FLUX_LITE_REQUIRE_MATRIX` is set, where every tier must be present and
/// this fails the test.
pub fn missing_tier(why: impl std::fmt::Display) {
    assert!(!tiers_required(), "FLUX_LITE_REQUIRE_MATRIX is set: {why}");
    crate::skip::skipped(why);
}

/// Whether every tier must be present (`FLUX_LITE_REQUIRE_MATRIX`, CI's Mesa 26 run).
pub fn tiers_required() -> bool {
    std::env::var_os("FLUX_LITE_REQUIRE_MATRIX").is_some()
}
