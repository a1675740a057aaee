//! The precision tier a device runs: which one `auto` or a named tier
//! resolves to on an adapter, and `auto`'s known-answer proof with its
//! step-downs.

use super::{Gpu, GpuOptions};
use crate::error::GpuError;
use crate::precision::{pick_matrix_config, MatrixConfig, MatrixOperands, Precision};

/// The tier a device is made for, with the features it needs.
pub(super) struct TierChoice {
    pub(super) tier: Precision,
    pub(super) matrix: Option<MatrixConfig>,
    pub(super) features: wgpu::Features,
    /// Under `auto`, why it took this tier over one the adapter offers.
    pub(super) reason: Option<String>,
}

/// Why `auto` takes f32 on a CPU adapter (a software driver such as
/// lavapipe), where the half tiers only add work: staging f16 and the range
/// rule cost more than the narrower operands save, and their results are
/// less exact. Measured on lavapipe at klein's shapes: 128², 2 steps in
/// 6.4 s on f16 against 5.6 s on f32; prompt embeddings within 1.8e-4 of
/// transformers' on f16, 1e-6 on f32. Named, the half tiers still run.
fn cpu_reason(info: &wgpu::AdapterInfo) -> String {
    format!("{} is a CPU adapter, where the f16 and matrix tiers run slower than f32 and less exactly", info.name)
}

/// The tier `asked` resolves to on this adapter (`auto`: f32 on a CPU
/// adapter, else the best offered, to be proven by the probe), or why a
/// named tier cannot run here.
pub(super) fn choose_tier(
    adapter: &wgpu::Adapter,
    info: &wgpu::AdapterInfo,
    offered: &[wgpu::CooperativeMatrixProperties],
    asked: Precision,
    as_on_a_gpu: bool,
) -> Result<TierChoice, GpuError> {
    let has = |f: wgpu::Features| adapter.features().contains(f);
    let unavailable = |tier: Precision, why: String| GpuError::TierUnavailable { tier: tier.name(), adapter: info.name.clone(), why };
    let half = || {
        if has(wgpu::Features::SHADER_F16) {
            Ok(TierChoice { tier: Precision::F16, matrix: None, features: wgpu::Features::SHADER_F16, reason: None })
        } else {
            Err(unavailable(Precision::F16, "the adapter lacks f16 in shaders".into()))
        }
    };
    let matrix = || {
        if !has(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            return Err(unavailable(Precision::Matrix, "the adapter lacks cooperative matrices".into()));
        }
        // The linear's workgroups hold several subgroups, each finding its
        // share by its subgroup id.
        if !has(wgpu::Features::SUBGROUP) {
            return Err(unavailable(Precision::Matrix, "the adapter lacks subgroup operations".into()));
        }
        let config = pick_matrix_config(offered, subgroup_sizes(info.backend, info.subgroup_min_size, info.subgroup_max_size)).map_err(|why| unavailable(Precision::Matrix, why))?;
        let mut features = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SUBGROUP;
        // f16 operands need f16 in shaders; f32 ones (8×8, as on Apple GPUs) do not.
        if config.operands == MatrixOperands::F16 {
            if !has(wgpu::Features::SHADER_F16) {
                return Err(unavailable(Precision::Matrix, "the adapter lacks f16 in shaders for its f16 cooperative matrices".into()));
            }
            features |= wgpu::Features::SHADER_F16;
        }
        let (need, have) = (config.linear_workgroup_bytes(), adapter.limits().max_compute_workgroup_storage_size);
        if need > have {
            return Err(unavailable(Precision::Matrix, format!("its linear needs {need} bytes of workgroup memory and the adapter has {have}")));
        }
        Ok(TierChoice { tier: Precision::Matrix, matrix: Some(config), features, reason: None })
    };
    let reference = TierChoice { tier: Precision::F32, matrix: None, features: wgpu::Features::empty(), reason: None };
    match asked {
        Precision::F32 => Ok(reference),
        Precision::F16 => half(),
        Precision::Matrix => matrix(),
        Precision::Auto if info.device_type == wgpu::DeviceType::Cpu && !as_on_a_gpu => Ok(TierChoice { reason: Some(cpu_reason(info)), ..reference }),
        Precision::Auto => Ok(matrix().or_else(|_| half()).unwrap_or(reference)),
    }
}

/// The adapter's subgroup sizes as the matrix tier may rely on them. Metal
/// reports a range (wgpu: 4 to 64), but Apple GPUs run compute in
/// simdgroups of 32, which their simdgroup matrices are defined over: on
/// Metal a range holding 32 is taken as 32.
fn subgroup_sizes(backend: wgpu::Backend, min: u32, max: u32) -> (u32, u32) {
    if backend == wgpu::Backend::Metal && (min..=max).contains(&32) {
        return (32, 32);
    }
    (min, max)
}

impl Gpu {
    /// [`Self::new`] with `probe` as `auto`'s known-answer check. A tier
    /// whose probe cannot run at all (a shader that fails to compile or
    /// validate, a device fault) leaves its device faulted, so the next tier
    /// down gets a fresh device, proven the same way.
    pub(super) fn proven(options: &GpuOptions, probe: impl Fn(&Gpu) -> Result<(), crate::probe::ProbeError> + Copy) -> Result<Self, GpuError> {
        let mut gpu = Self::unproven(options)?;
        if options.precision != Precision::Auto {
            return Ok(gpu);
        }
        let mut failed = Vec::new();
        loop {
            let failure = match gpu.prove_tier(probe) {
                Ok(()) => break,
                Err(GpuError::Interrupted) => return Err(GpuError::Interrupted),
                Err(e) => e,
            };
            let tier = gpu.precision();
            if tier == Precision::F32 {
                return Err(failure);
            }
            let below = if tier == Precision::Matrix && gpu.device.features().contains(wgpu::Features::SHADER_F16) { Precision::F16 } else { Precision::F32 };
            failed.push(format!("the {} tier could not run its known-answer check on {} ({failure})", tier.name(), gpu.info.name));
            drop(gpu);
            gpu = Self::unproven(&GpuOptions { precision: below, ..options.clone() })?;
        }
        if !failed.is_empty() {
            let note = format!("{}; running the {} tier on a fresh device", failed.join("; "), gpu.precision().name());
            gpu.notice = Some(match gpu.notice.take() {
                Some(more) => format!("{note}; then {more}"),
                None => note,
            });
        }
        Ok(gpu)
    }

    /// Under `auto`: runs the tier's known-answer product (`probe`) and steps
    /// down (matrix → f16 → f32) while it fails, keeping a notice of why.
    fn prove_tier(&mut self, probe: impl Fn(&Gpu) -> Result<(), crate::probe::ProbeError>) -> Result<(), GpuError> {
        while self.precision != Precision::F32 {
            let failure = match probe(self) {
                Ok(()) => return Ok(()),
                Err(crate::probe::ProbeError::Gpu(e)) => return Err(e),
                Err(crate::probe::ProbeError::Wrong(why)) => why,
            };
            let fallback = if self.precision == Precision::Matrix && self.device.features().contains(wgpu::Features::SHADER_F16) {
                Precision::F16
            } else {
                Precision::F32
            };
            self.notice = Some(format!(
                "the {} tier failed its known-answer check on {} ({failure}); running the {} tier",
                self.precision.name(),
                self.info.name,
                fallback.name()
            ));
            self.precision = fallback;
            self.matrix = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::ProbeError;

    #[test]
    fn metal_runs_the_matrix_tier_in_simdgroups_of_32() {
        use wgpu::Backend::{Metal, Vulkan};
        // wgpu reports 4 to 64 on Apple GPUs; other backends' ranges are taken as reported.
        assert_eq!(subgroup_sizes(Metal, 4, 64), (32, 32));
        assert_eq!(subgroup_sizes(Metal, 32, 32), (32, 32));
        assert_eq!(subgroup_sizes(Vulkan, 32, 64), (32, 64));
        assert_eq!(subgroup_sizes(Vulkan, 8, 8), (8, 8));
        let offered = [wgpu::CooperativeMatrixProperties {
            m_size: 8,
            n_size: 8,
            k_size: 8,
            ab_type: wgpu::CooperativeScalarType::F32,
            cr_type: wgpu::CooperativeScalarType::F32,
            saturating_accumulation: false,
        }];
        let config = crate::precision::pick_matrix_config(&offered, subgroup_sizes(Metal, 4, 64)).unwrap();
        assert_eq!((config.size, config.subgroup), (8, 32));
        assert!(crate::precision::pick_matrix_config(&offered, subgroup_sizes(Vulkan, 4, 64)).is_err());
    }

    #[test]
    fn auto_takes_f32_on_a_cpu_adapter_and_says_why() {
        let auto = Gpu::new(&GpuOptions { precision: Precision::Auto, ..crate::testing::options() }).unwrap_or_else(|e| panic!("{e}"));
        if !auto.is_software() {
            assert!(auto.auto_reason().is_none(), "{:?}", auto.auto_reason());
            crate::skip::skipped(format_args!("{} is not a CPU adapter; auto takes {}", auto.describe(), auto.precision().name()));
            return;
        }
        assert_eq!((auto.precision(), auto.matrix(), auto.notice()), (Precision::F32, None, None));
        let reason = auto.auto_reason().unwrap_or_else(|| panic!("auto took f32 on {} without a reason", auto.describe()));
        assert!(reason.starts_with(&format!("{} is a CPU adapter", auto.info.name)), "{reason}");
        println!("auto on {}: f32, as {reason}", auto.describe());
        // Named, the half tiers the adapter offers still run as asked.
        for asked in [Precision::F16, Precision::Matrix] {
            match Gpu::new(&GpuOptions { precision: asked, ..crate::testing::options() }) {
                Ok(gpu) => {
                    assert_eq!((gpu.precision(), gpu.auto_reason()), (asked, None));
                    println!("{} tier: runs when named", asked.name());
                }
                Err(e) => println!("{} tier: not offered here ({e})", asked.name()),
            }
        }
    }

    #[test]
    fn a_tier_whose_check_cannot_run_steps_down_on_a_fresh_device() {
        // `auto` in its GPU order, with a check that fails to run on every half tier.
        let options = GpuOptions { precision: Precision::Auto, gpu_shaped_kernels: true, ..crate::testing::options() };
        let cannot_run = |gpu: &Gpu| match gpu.precision() {
            Precision::F32 => Ok(()),
            _ => Err(ProbeError::Gpu(GpuError::Device("made to fail".into()))),
        };
        let first = Gpu::unproven(&options).unwrap_or_else(|e| panic!("{e}"));
        if first.precision() == Precision::F32 {
            crate::skip::skipped(format_args!("{} offers no half tier to step down from", first.describe()));
            return;
        }
        let tier = first.precision();
        drop(first);
        let gpu = Gpu::proven(&options, cannot_run).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(gpu.precision(), Precision::F32);
        let notice = gpu.notice().unwrap_or("");
        let want = format!("the {} tier could not run its known-answer check on ", tier.name());
        assert!(notice.starts_with(&want) && notice.contains("made to fail") && notice.contains("running the"), "{notice}");
        // A device that was never faulted runs work.
        let buf = gpu.upload_f32("probe", &[1.0, 2.0]);
        assert_eq!(gpu.read_f32(&buf, 0, 2).unwrap(), [1.0, 2.0]);
    }

    #[test]
    fn a_tier_failing_its_known_answer_check_steps_down_with_a_notice() {
        let wrong_on = |tier: Precision| {
            move |gpu: &Gpu| if gpu.precision() == tier { Err(ProbeError::Wrong("made wrong".into())) } else { Ok(()) }
        };
        if let Some(mut gpu) = crate::testing::matrix_gpu() {
            gpu.prove_tier(wrong_on(Precision::Matrix)).unwrap_or_else(|e| panic!("{e}"));
            let below = if gpu.device.features().contains(wgpu::Features::SHADER_F16) { Precision::F16 } else { Precision::F32 };
            assert_eq!((gpu.precision(), gpu.matrix()), (below, None));
            let notice = gpu.notice().unwrap_or("");
            assert!(notice.starts_with("the matrix tier failed its known-answer check on ") && notice.contains("(made wrong)"), "{notice}");
        }
        if let Some(mut gpu) = crate::testing::half_gpu() {
            gpu.prove_tier(wrong_on(Precision::F16)).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(gpu.precision(), Precision::F32);
            let notice = gpu.notice().unwrap_or("");
            assert!(notice.starts_with("the f16 tier failed its known-answer check on ") && notice.ends_with("running the f32 tier"), "{notice}");
        }
    }
}
