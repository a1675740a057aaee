//! Library errors as the CLI's one `error:` line: the one place that names
//! flags, each typed error's setting mapped to the flag that sets it.

use flux_lite_core::plan::{Bytes, PlanError, Sides};
use flux_lite_platform::{CompressError, GpuError, RequestError, RunError, Setting};

/// The flag that sets each of a job's settings.
pub fn flag(setting: Setting) -> &'static str {
    match setting {
        Setting::Prompt => "--prompt",
        Setting::NegativePrompt => "--negative-prompt",
        Setting::Embeddings => "--embeddings",
        Setting::Images => "--count",
        Setting::References | Setting::Reference => "--image",
        Setting::Width => "--width",
        Setting::Height => "--height",
        Setting::Steps => "--steps",
        Setting::Guidance => "--guidance",
        Setting::VaeTile => "--vae-tile",
        Setting::InitImage => "--init-image",
        Setting::Mask => "--mask",
        Setting::Strength => "--strength",
    }
}

/// A refused job, named by its flag.
pub fn request_line(e: &RequestError) -> String {
    e.line(flag(e.setting()))
}

/// A planner refusal, with the flag that set what it refuses.
pub fn plan_line(e: &PlanError) -> String {
    match *e {
        PlanError::TooSmall { budget, phase, minimum, device, host } => {
            format!("--memory-budget {}: too small ({phase} needs more); {}", Bytes(budget), smallest_budget(minimum, device, host))
        }
        PlanError::VaeTileSize { .. } | PlanError::VaeTileTooSmall { .. } => format!("--vae-tile: {e}"),
        _ => e.to_string(),
    }
}

/// The planner's smallest budget for the size, with its two sides.
fn smallest_budget(minimum: u64, device: u64, host: u64) -> String {
    format!("the smallest budget that works for this size is {} ({minimum} B): {}", Bytes(minimum), Sides(device, host))
}

/// Any run error, settings and planner refusals named by their flags.
pub fn run_line(e: &RunError) -> String {
    match e {
        RunError::Plan(p) => plan_line(p),
        RunError::Request(r) => request_line(r),
        RunError::Scratch { dir, detail } => {
            format!("the VAE's scratch file in {}: {detail} (set {} to another folder)", dir.display(), crate::SCRATCH_VARIABLE)
        }
        RunError::Gpu(GpuError::OutOfMemory(detail)) => {
            format!("the GPU ran out of memory ({detail}); give a --memory-budget below what the device has free")
        }
        _ => e.to_string(),
    }
}

/// [`run_line`] for a run under the adapter's default budget (`offered`,
/// when no `--memory-budget` was given): a budget refusal names the default.
pub fn run_line_under(e: &RunError, offered: Option<&flux_lite_platform::AdapterMemory>) -> String {
    match (e, offered) {
        (RunError::Plan(PlanError::TooSmall { budget, phase, minimum, device, host }), Some(m)) => format!(
            "the default budget {} ({} less {}%) is too small ({phase} needs more); {}; a smaller size or a --memory-budget above it on a larger device",
            Bytes(*budget),
            m.source.describe(),
            flux_lite_platform::DEFAULT_MARGIN_PERCENT,
            smallest_budget(*minimum, *device, *host)
        ),
        _ => run_line(e),
    }
}

/// A refused `compress`, named by its flags.
pub fn compress_line(e: &CompressError) -> String {
    match e {
        CompressError::OutputExists(p) => format!("--output {}: already exists; give a new folder", p.display()),
        CompressError::OutputFolder { path, problem } => format!("--output {}: {problem}", path.display()),
        CompressError::OutputInsideModel { output, model } => {
            format!("--output {}: inside the model folder {}; give a folder outside it", output.display(), model.display())
        }
        CompressError::NotCompressible(c) => format!("--components: {c} has no DF11 layout (compress transformer, text_encoder)"),
        _ => e.to_string(),
    }
}
