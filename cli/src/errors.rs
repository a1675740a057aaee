//! Library errors as the CLI's one `error:` line, naming the flag at fault
//! where the library's typed error says which setting it was.

use flux_lite_core::config::SizeError;
use flux_lite_core::plan::{Bytes, PlanError, Sides};
use flux_lite_platform::RunError;

/// A planner refusal, with the flag that set what it refuses.
pub fn plan_line(e: &PlanError) -> String {
    match *e {
        PlanError::TooSmall { budget, phase, minimum, device, host } => format!(
            "--memory-budget {}: too small ({phase} needs more); the smallest budget that works for this size is {} ({minimum} B): {}",
            Bytes(budget),
            Bytes(minimum),
            Sides(device, host)
        ),
        PlanError::VaeTileSize { .. } | PlanError::VaeTileTooSmall { .. } => format!("--vae-tile: {e}"),
        _ => e.to_string(),
    }
}

/// Any run error, planner refusals mapped by [`plan_line`].
pub fn run_line(e: &RunError) -> String {
    match e {
        RunError::Plan(p) => plan_line(p),
        _ => e.to_string(),
    }
}

/// An image side off the size rule, named by its flag.
pub fn size_line(e: &SizeError) -> String {
    format!("--{} {} is not a positive multiple of {} (2 × the VAE scale factor)", e.side, e.pixels, e.cell)
}
