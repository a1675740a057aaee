//! `auto`'s proof: a device made for the tier `auto` chose runs the
//! known-answer product ([`crate::probe`]) and steps down (matrix → f16 →
//! f32) while it fails. Above the device: making one runs no kernel; a
//! proven one is what [`Gpu::new`] returns.

use super::{Gpu, GpuOptions};
use crate::error::GpuError;
use crate::precision::Precision;
use crate::precision::MatrixOperands;
use crate::probe::{known_answer, ProbeError};
use crate::kernels::attention::flash_workgroup_bytes;
use crate::probe_flash::{cases::Case, flash_known_answer, CHECKS};
use super::FlashPaths;

/// What the flash attention's start-up check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FlashCheck {
    /// The tier has no f16 tiles: no flash attention to check.
    NotTried,
    Passed,
    /// It ran and was wrong, or the adapter cannot hold it.
    Failed,
    /// It could not run: the device keeps the fault.
    Faulted,
}

impl Gpu {
    /// A device for `options`, its tier proven where `auto` chose it.
    /// On the matrix tier's f16 tiles, the flash attention is checked too.
    pub fn new(options: &GpuOptions) -> Result<Self, GpuError> {
        Self::flash_checked(Self::proven(options, known_answer)?, options, flash_known_answer)
    }

    /// `gpu` (made for `options`) with the flash attention's paths checked
    /// by `probe` (each of [`CHECKS`]); where a check could not run, a
    /// fresh device on the same tier without it.
    fn flash_checked(mut gpu: Gpu, options: &GpuOptions, probe: impl Fn(&Gpu, &Case) -> Result<(), ProbeError>) -> Result<Self, GpuError> {
        if gpu.prove_flash(probe) == FlashCheck::Faulted {
            // The device keeps the fault: a fresh one on the proven tier, without flash.
            let (tier, notice, reason) = (gpu.precision, gpu.notice.take(), gpu.auto_reason.take());
            drop(gpu);
            gpu = Self::unproven(&GpuOptions { precision: tier, ..options.clone() })?;
            (gpu.notice, gpu.auto_reason) = (notice, reason);
        }
        Ok(gpu)
    }

    /// Takes each of the flash attention's paths where the tier has f16
    /// tiles, the adapter holds its workgroup memory and `probe` passes that
    /// path's check on this device; otherwise a notice says which path runs
    /// the fallback and why.
    fn prove_flash(&mut self, probe: impl Fn(&Gpu, &Case) -> Result<(), ProbeError>) -> FlashCheck {
        let Some(config) = self.matrix.filter(|c| c.operands == MatrixOperands::F16) else { return FlashCheck::NotTried };
        let (need, have) = (flash_workgroup_bytes(config), self.limits.max_compute_workgroup_storage_size);
        let (mut failed, mut outcome) = (Vec::new(), FlashCheck::Passed);
        let checks: &[Case] = if need > have {
            failed.push(format!("it needs {need} bytes of workgroup memory, the adapter offers {have}"));
            outcome = FlashCheck::Failed;
            &[]
        } else {
            &CHECKS
        };
        for case in checks {
            match probe(self, case) {
                Ok(()) if case.pieces => self.flash.pieces = true,
                Ok(()) => self.flash.rows = true,
                Err(ProbeError::Gpu(e)) => {
                    self.flash = FlashPaths::default();
                    failed = vec![e.to_string()];
                    outcome = FlashCheck::Faulted;
                    break;
                }
                Err(ProbeError::Wrong(why)) => {
                    failed.push(why);
                    outcome = FlashCheck::Failed;
                }
            }
        }
        if failed.is_empty() {
            return outcome;
        }
        // What runs a path the flash kernel does not take: the transformer's and the text encoder's attention as products on the GEMM core, where the device runs those.
        let path = |half_inputs: bool| match (self.flash.takes(half_inputs), self.attention_on_products(half_inputs)) {
            (true, _) => "on the flash kernel",
            (false, true) => "as products on the GEMM core (the transformer's and the text encoder's) or on the matrix tier's one-subgroup kernel",
            (false, false) => "on the matrix tier's one-subgroup kernel",
        };
        let runs = match self.flash {
            FlashPaths { rows: false, pieces: false } if !self.attention_on_products(true) => "attention runs on the matrix tier's one-subgroup kernel".to_string(),
            FlashPaths { rows: false, pieces: true } => format!("attention over f32 rows runs {}, over f16 pieces {}", path(false), path(true)),
            _ => format!("attention over f16 pieces runs {}, over f32 rows {}", path(true), path(false)),
        };
        let note = format!("the flash attention failed its known-answer check on {} ({}); {runs}", self.info.name, failed.join("; "));
        self.notice = Some(match self.notice.take() {
            Some(before) => format!("{before}; {note}"),
            None => note,
        });
        outcome
    }

    /// [`Self::new`] with `probe` as `auto`'s known-answer check. A tier
    /// whose probe cannot run at all (a shader that fails to compile or
    /// validate, a device fault) leaves its device faulted, so the next tier
    /// down gets a fresh device, proven the same way.
    fn proven(options: &GpuOptions, probe: impl Fn(&Gpu) -> Result<(), ProbeError> + Copy) -> Result<Self, GpuError> {
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
    fn prove_tier(&mut self, probe: impl Fn(&Gpu) -> Result<(), ProbeError>) -> Result<(), GpuError> {
        while self.precision != Precision::F32 {
            let failure = match probe(self) {
                Ok(()) => return Ok(()),
                Err(ProbeError::Gpu(e)) => return Err(e),
                Err(ProbeError::Wrong(why)) => why,
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

    #[test]
    fn the_flash_attention_is_taken_where_its_check_passes_and_left_with_a_notice_where_it_fails() {
        let Some(gpu) = crate::testing::matrix_gpu() else { return };
        let none = FlashPaths::default();
        if gpu.matrix().is_none_or(|c| c.operands != MatrixOperands::F16) {
            assert_eq!(gpu.flash_attention(), none);
            crate::skip::skipped(format_args!("{} offers no f16 tiles: no flash attention to check", gpu.describe()));
            return;
        }
        // A device made by `Gpu::new` ran the real checks, on this adapter.
        assert_eq!(gpu.flash_attention(), FlashPaths { rows: true, pieces: true }, "the flash attention failed a check on {}: {:?}", gpu.describe(), gpu.notice());
        use crate::kernels::attention::takes_flash;
        let fresh = || Gpu::unproven(&GpuOptions { precision: Precision::Matrix, ..crate::testing::options() }).unwrap_or_else(|e| panic!("{e}"));
        let mut failing = fresh();
        assert_eq!(failing.prove_flash(|_, _| Err(ProbeError::Wrong("flash attention output 3 is NaN".into()))), FlashCheck::Failed);
        assert_eq!(failing.flash_attention(), none);
        let notice = failing.notice().unwrap_or("");
        assert!(notice.starts_with("the flash attention failed its known-answer check on ") && notice.contains("output 3 is NaN") && notice.ends_with("attention over f16 pieces runs as products on the GEMM core (the transformer's and the text encoder's) or on the matrix tier's one-subgroup kernel, over f32 rows as products on the GEMM core (the transformer's and the text encoder's) or on the matrix tier's one-subgroup kernel"), "{notice}");
        assert!(failing.attention_on_products(true) && failing.attention_on_products(false) && failing.plan_limits().attention_products == flux_lite_core::ir::AttentionProducts { over_pieces: true, over_rows: true });
        // Each path stands on its own check: one wrong over f32 rows leaves the pieces' path on the flash kernel.
        let mut rows_wrong = fresh();
        let rows_only = |_: &Gpu, case: &Case| if case.pieces { Ok(()) } else { Err(ProbeError::Wrong("flash attention over f32 rows: output 6015 is -inf".into())) };
        assert_eq!(rows_wrong.prove_flash(rows_only), FlashCheck::Failed);
        assert_eq!(rows_wrong.flash_attention(), FlashPaths { rows: false, pieces: true });
        assert!(takes_flash(&rows_wrong, 128, true) && !takes_flash(&rows_wrong, 128, false));
        let notice = rows_wrong.notice().unwrap_or("");
        assert!(notice.contains("output 6015 is -inf") && notice.ends_with("attention over f32 rows runs as products on the GEMM core (the transformer's and the text encoder's) or on the matrix tier's one-subgroup kernel, over f16 pieces on the flash kernel"), "{notice}");
        let mut pieces_wrong = fresh();
        assert_eq!(pieces_wrong.prove_flash(|_, case| if case.pieces { Err(ProbeError::Wrong("over f16 pieces: far".into())) } else { Ok(()) }), FlashCheck::Failed);
        assert_eq!(pieces_wrong.flash_attention(), FlashPaths { rows: true, pieces: false });
        assert!(!takes_flash(&pieces_wrong, 128, true) && takes_flash(&pieces_wrong, 128, false));
        // The transformer's attention over f16 pieces then runs as products on the GEMM core, and the planner counts them.
        let notice = pieces_wrong.notice().unwrap_or("");
        assert!(notice.ends_with("attention over f16 pieces runs as products on the GEMM core (the transformer's and the text encoder's) or on the matrix tier's one-subgroup kernel, over f32 rows on the flash kernel"), "{notice}");
        assert!(pieces_wrong.attention_on_products(true) && !pieces_wrong.attention_on_products(false) && pieces_wrong.plan_limits().attention_products == flux_lite_core::ir::AttentionProducts { over_pieces: true, over_rows: false });
        assert!(!rows_wrong.attention_on_products(true) && rows_wrong.attention_on_products(false) && rows_wrong.plan_limits().attention_products == flux_lite_core::ir::AttentionProducts { over_pieces: false, over_rows: true });
    }

    #[test]
    fn a_flash_check_that_cannot_run_leaves_a_fresh_device_without_it() {
        let Some(gpu) = crate::testing::matrix_gpu() else { return };
        if gpu.matrix().is_none_or(|c| c.operands != MatrixOperands::F16) {
            crate::skip::skipped(format_args!("{} offers no f16 tiles: no flash attention to check", gpu.describe()));
            return;
        }
        let options = GpuOptions { precision: Precision::Matrix, ..crate::testing::options() };
        let device = Gpu::unproven(&options).unwrap_or_else(|e| panic!("{e}"));
        let gpu = Gpu::flash_checked(device, &options, |_, _| Err(ProbeError::Gpu(GpuError::Device("made to fail".into())))).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((gpu.precision(), gpu.flash_attention()), (Precision::Matrix, FlashPaths::default()));
        let notice = gpu.notice().unwrap_or("");
        assert!(notice.contains("the flash attention failed its known-answer check") && notice.contains("made to fail"), "{notice}");
        // A device that was never faulted runs work.
        let buf = gpu.upload_f32("after", &[1.0, 2.0]);
        assert_eq!(gpu.read_f32(&buf, 0, 2).unwrap(), [1.0, 2.0]);
    }
}
