//! How a device is made and run: the backend, the adapter, the tier and
//! the test and benchmark switches, as a library caller sets them or as
//! [`GpuOptions::from_settings`] reads them from named settings the CLI
//! and the tests pass (the library reads no environment itself).

use super::ADAPTER_VARIABLE;
use crate::error::GpuError;
use crate::precision::Precision;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The native APIs flux-lite can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Vulkan,
    Metal,
    Dx12,
    Gl,
}

impl Backend {
    /// Metal on macOS, Vulkan elsewhere.
    pub fn platform_default() -> Self {
        if cfg!(target_os = "macos") {
            Backend::Metal
        } else {
            Backend::Vulkan
        }
    }

    pub fn parse(s: &str) -> Result<Self, GpuError> {
        match s.to_ascii_lowercase().as_str() {
            "vulkan" => Ok(Backend::Vulkan),
            "metal" => Ok(Backend::Metal),
            "dx12" => Ok(Backend::Dx12),
            "gl" => Ok(Backend::Gl),
            _ => Err(GpuError::UnknownBackend(s.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Vulkan => "vulkan",
            Backend::Metal => "metal",
            Backend::Dx12 => "dx12",
            Backend::Gl => "gl",
        }
    }

    pub(super) fn wgpu(self) -> wgpu::Backends {
        match self {
            Backend::Vulkan => wgpu::Backends::VULKAN,
            Backend::Metal => wgpu::Backends::METAL,
            Backend::Dx12 => wgpu::Backends::DX12,
            Backend::Gl => wgpu::Backends::GL,
        }
    }
}

/// How the device is made and run. Nothing here is read from the
/// environment by the library: programs that take settings from there (the
/// CLI, the tests) build these with [`GpuOptions::from_settings`].
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// `None`: the platform default (Metal on macOS, Vulkan elsewhere).
    pub backend: Option<Backend>,
    /// One adapter of several, by its index among the backend's adapters or
    /// a part of its name; `None`: the one the backend calls high-performance.
    pub adapter: Option<String>,
    /// A benchmarking aid: which attention kernel runs where it can.
    pub attention: AttentionChoice,
    /// Faults to inject, for the tests of the error paths: only in builds
    /// with the `test-support` feature, which only the tests enable.
    #[cfg(any(test, feature = "test-support"))]
    pub faults: FaultInjection,
    /// The matrix tier on cooperative matrices emulated in plain WGSL
    /// (`FLUX_LITE_EMULATE_MATRIX=nvidia`: an NVIDIA card's 16×16 f16 tiles
    /// in subgroups of 32; `apple`: an Apple GPU's 8×8 f32 tiles in
    /// simdgroups of 32), so the tests run those kernels on lavapipe: only
    /// in builds with the `test-support` feature.
    #[cfg(any(test, feature = "test-support"))]
    pub emulated_matrix: Option<crate::emulated_matrix::EmulatedMatrix>,
    /// Ask for a device whose largest storage binding is at most this many
    /// bytes (tests use it to force the split paths).
    pub max_storage_binding: Option<u64>,
    /// Ask for a device whose workgroups declare at most this many bytes:
    /// the kernels then choose what they would on an adapter that offers
    /// that much (the GEMM core's staging, the wide attention's dims a
    /// workgroup); the tests take lavapipe's kernels down those paths.
    pub max_workgroup_memory: Option<u32>,
    /// A benchmarking aid (`FLUX_LITE_GEMM_STAGING=deep|single|lean`): the
    /// matrix tier's GEMM core staged so, where one workgroup of it fits,
    /// instead of the deepest of which two fit (the adapter's choice,
    /// `MatrixConfig::staging`), so a GPU can time one against another.
    pub gemm_staging: Option<crate::GemmStaging>,
    /// Set (e.g. by a SIGINT handler) to stop the work: every submission
    /// after it is set fails with [`GpuError::Interrupted`], so a run stops
    /// at its next block.
    pub interrupt: Option<Arc<AtomicBool>>,
    /// The precision tier; a tier the adapter lacks is an error naming why.
    pub precision: Precision,
    /// Treat a CPU adapter as a GPU: the kernels shaped for GPUs (where
    /// kernels shaped for SIMD lanes run by default) and `auto`'s GPU order
    /// of tiers: the tests use it to check both on lavapipe.
    pub gpu_shaped_kernels: bool,
    /// CPU-shaped kernels read every shared row in every lane, as on an
    /// adapter without fixed-size subgroups, instead of once a subgroup
    /// ([`crate::Gpu::cpu_lanes`]): the tests check both.
    pub per_lane_reads: bool,
    /// Where compiled pipelines persist between runs, where the backend
    /// offers a pipeline cache; `None`: every run compiles its kernels.
    pub pipeline_store: Option<Arc<dyn super::compiled::PipelineStore>>,
    /// A kernel-development aid (`FLUX_LITE_KERNEL_DIR`): a module whose
    /// `<dir>/<Module:?>.wgsl` exists (e.g. `AttentionFlash16.wgsl`, the
    /// whole source as [`crate::Module::source`] assembles it) is built from
    /// that file, so a variant can be timed on a machine without the Rust
    /// toolchain; `None` in normal use.
    pub kernel_dir: Option<std::path::PathBuf>,
}

/// Which attention kernel runs (`FLUX_LITE_ATTENTION_KERNEL`): the launcher's
/// choice, or one forced wherever it can take the call (`bench kernels` then
/// times it; a call it cannot take runs the launcher's choice, the tiled
/// kernel for `Lanes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AttentionChoice {
    #[default]
    Launcher,
    /// `attention.wgsl`, the f32 tiled kernel.
    Tiled,
    /// `attention_cpu.wgsl`, the CPU-shaped kernel.
    Lanes,
    /// `attention_matrix.wgsl` on the matrix tier, where flash would run:
    /// the fallback, to measure flash against.
    Matrix,
    /// On the matrix tier with f16 operands, the transformer's attention
    /// as products on the GEMM core (`attention_on_products`), where flash
    /// would run: to measure it, and to test it where flash passes.
    Products,
}

/// Faults the tests of the error paths inject; all off by default. Built
/// only with the `test-support` feature: the shipped binary has none.
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultInjection {
    /// Destroy the device after its N-th submission, as a driver reset would
    /// lose it mid-run (`FLUX_LITE_LOSE_DEVICE_AFTER=N`).
    pub lose_device_after: Option<u64>,
    /// Every linear sums one term short: a wrong kernel, which `selftest`
    /// must catch (`FLUX_LITE_BREAK_KERNEL=linear`).
    pub short_linear: bool,
    /// This tier's known-answer probe reports a wrong answer, as a faulty
    /// driver would (`FLUX_LITE_FAIL_TIER_PROBE=matrix` or `f16`).
    pub failing_probe: Option<Precision>,
    /// The device runs out of memory once more than this many bytes would
    /// be live, as a card whose memory is smaller than the budget would
    /// (`FLUX_LITE_DEVICE_MEMORY=BYTES`).
    pub memory_limit: Option<u64>,
    /// The queries' and keys' per-head norms run as passes even where a
    /// projection's epilogue could take them, so that a path which cannot
    /// (weights kept in GGML blocks) compares bit for bit with one that can.
    pub head_norm_passes: bool,
}

impl GpuOptions {
    /// The defaults with what the named settings `get` gives (the CLI passes
    /// its environment's): `FLUX_LITE_BACKEND`, `FLUX_LITE_ADAPTER`,
    /// `FLUX_LITE_ATTENTION_KERNEL=tiled|lanes|matrix|products`, `FLUX_LITE_KERNEL_DIR`
    /// ([`GpuOptions::kernel_dir`]), `FLUX_LITE_GEMM_STAGING`
    /// ([`GpuOptions::gemm_staging`]), and in builds with the `test-support`
    /// feature the tests' switches ([`Self::with_test_switches`]). A
    /// library caller sets the fields instead.
    pub fn from_settings(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, GpuError> {
        let var = |name: &str| get(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let backend = var("FLUX_LITE_BACKEND").map(|v| Backend::parse(&v)).transpose()?;
        let attention = match var("FLUX_LITE_ATTENTION_KERNEL").as_deref() {
            Some("tiled") => AttentionChoice::Tiled,
            Some("lanes") => AttentionChoice::Lanes,
            Some("matrix") => AttentionChoice::Matrix,
            Some("products") => AttentionChoice::Products,
            _ => AttentionChoice::Launcher,
        };
        let kernel_dir = var("FLUX_LITE_KERNEL_DIR").map(std::path::PathBuf::from);
        let gemm_staging = match var("FLUX_LITE_GEMM_STAGING") {
            Some(v) => Some(crate::GemmStaging::from_name(&v).ok_or_else(|| GpuError::Device(format!("FLUX_LITE_GEMM_STAGING={v:?}: give deep, single or lean")))?),
            None => None,
        };
        let options = Self { backend, adapter: var(ADAPTER_VARIABLE), attention, kernel_dir, gemm_staging, ..Self::default() };
        #[cfg(any(test, feature = "test-support"))]
        let options = options.with_test_switches(get)?;
        Ok(options)
    }

    /// The tests' switches from the environment: the fault injections
    /// (`FLUX_LITE_LOSE_DEVICE_AFTER`, `FLUX_LITE_BREAK_KERNEL`,
    /// `FLUX_LITE_FAIL_TIER_PROBE`, `FLUX_LITE_DEVICE_MEMORY`),
    /// `FLUX_LITE_PER_LANE_READS=1` ([`GpuOptions::per_lane_reads`]) and
    /// `FLUX_LITE_EMULATE_MATRIX` ([`GpuOptions::emulated_matrix`]). Only
    /// in builds with the `test-support` feature, which only the tests enable.
    #[cfg(any(test, feature = "test-support"))]
    fn with_test_switches(self, get: &dyn Fn(&str) -> Option<String>) -> Result<Self, GpuError> {
        let var = |name: &str| get(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let lose_device_after = match var("FLUX_LITE_LOSE_DEVICE_AFTER") {
            Some(v) => Some(v.parse().map_err(|_| GpuError::Device(format!("FLUX_LITE_LOSE_DEVICE_AFTER={v:?} is not a count")))?),
            None => None,
        };
        let faults = FaultInjection {
            lose_device_after,
            short_linear: var("FLUX_LITE_BREAK_KERNEL").as_deref() == Some("linear"),
            failing_probe: var("FLUX_LITE_FAIL_TIER_PROBE").and_then(|t| Precision::from_name(&t)),
            memory_limit: var("FLUX_LITE_DEVICE_MEMORY").and_then(|v| v.parse().ok()),
            head_norm_passes: false,
        };
        let per_lane_reads = var("FLUX_LITE_PER_LANE_READS").is_some_and(|v| v != "0");
        let emulated_matrix = var("FLUX_LITE_EMULATE_MATRIX").map(|v| crate::emulated_matrix::EmulatedMatrix::from_setting(&v)).transpose().map_err(GpuError::Device)?;
        Ok(Self { faults, per_lane_reads, emulated_matrix, ..self })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `FLUX_LITE_GEMM_STAGING` names a staging, or is refused naming the three.
    #[test]
    fn the_gemm_staging_setting_names_one_of_three() {
        let with = |value: &'static str| GpuOptions::from_settings(&move |name| (name == "FLUX_LITE_GEMM_STAGING").then(|| value.to_string()));
        assert_eq!(with("lean").unwrap().gemm_staging, Some(crate::GemmStaging::LEAN));
        assert_eq!(with("deep").unwrap().gemm_staging, Some(crate::GemmStaging::DEEP));
        assert_eq!(with("").unwrap().gemm_staging, None);
        let refused = with("shallow").unwrap_err().to_string();
        assert!(refused.contains("FLUX_LITE_GEMM_STAGING=\"shallow\": give deep, single or lean"), "{refused}");
    }
}
