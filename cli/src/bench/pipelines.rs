//! `bench kernels --pipeline-statistics`: what the driver made of each
//! matrix pipeline the run built (registers, spills, workgroup memory), the
//! first thing to read when a matrix kernel runs far below its ceiling.

use crate::stdout::say;
use flux_lite_platform::Gpu;

/// Prints each matrix pipeline `gpu` built, with its executables'
/// statistics, or one line saying why there are none.
#[cfg(not(any(target_arch = "wasm32", target_vendor = "apple")))]
pub(super) fn print_statistics(gpu: &Gpu) {
    match gpu.matrix_pipeline_statistics() {
        Ok(pipelines) if pipelines.is_empty() => say!("pipeline statistics: the run built no matrix pipeline"),
        Ok(pipelines) => {
            say!("pipeline statistics (VK_KHR_pipeline_executable_properties) of the {} matrix pipelines this run built:", pipelines.len());
            for p in &pipelines {
                for e in &p.executables {
                    let figures: Vec<String> = e.statistics.iter().map(|(name, value)| format!("{name} {value}")).collect();
                    say!("- {}: {} (subgroup {}): {}", flux_lite_platform::pipeline_name(&p.pipeline), e.name, e.subgroup_size, figures.join(", "));
                }
            }
        }
        Err(e) => say!("pipeline statistics: unavailable: {e}"),
    }
}

#[cfg(any(target_arch = "wasm32", target_vendor = "apple"))]
pub(super) fn print_statistics(_gpu: &Gpu) {
    say!("pipeline statistics: unavailable: only Vulkan drivers report them");
}
