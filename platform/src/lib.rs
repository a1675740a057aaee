//! flux-lite-platform: the engine. It reads the official diffusers model
//! folder through memory maps, runs core's Op programs on the GPU layer
//! (`flux-lite-kernels`), and drives a whole generation.
//!
//! A library caller needs what this page re-exports: open a [`Pipeline`],
//! describe a [`Job`], [`Job::resolve`] it (every default and rule, the
//! same as `flux-lite gen` and `serve` apply), then [`Pipeline::run`] it.
//! The modules below are public for the workspace's own commands and tests;
//! their items may change without notice (`components` and `run`, the
//! engine's insides, are left out of the documentation).

pub mod bench;
#[doc(hidden)]
pub mod components;
pub mod error;
pub mod host_memory;
pub mod model;
pub mod output;
pub mod pipeline;
pub mod request;
pub mod pipeline_files;
#[doc(hidden)]
pub mod exec;
pub mod selftest;
/// Every tolerance, in core (`flux_lite_core::tolerance`).
pub use flux_lite_core::tolerance;

pub use error::{CompressError, GpuError, LoadError, RunError, TokenizeError};
// The device types the engine's API takes, from the GPU layer.
pub use flux_lite_kernels::{check_kernel_dir, AdapterMemory, Backend, CacheState, CompileReport, DeviceBuffer, DeviceMemory, Gpu, GpuOptions, MemorySource, Module, PipelineStore, Precision, DEFAULT_MARGIN_PERCENT};
#[cfg(not(any(target_arch = "wasm32", target_vendor = "apple")))]
pub use flux_lite_kernels::{pipeline_name, PipelineStatistics, StatisticsError};
/// Which kernel runs the VAE's attention (`bench kernels` names it).
pub use flux_lite_kernels::kernels::{carried_attention_module, runs_chunked_attention};
/// The flash attention's known-answer cases (`flux-lite gpu --flash-report`).
pub use flux_lite_kernels::probe_flash::cases as flash_cases;
// The front door.
pub use model::lora::{LoraSet, LoraSpec};
pub use pipeline::reference_image::ReferenceImage;
pub use pipeline::{
    Finished, Image, Job, Limits, Made, Observer, Options, OutputType, Phase, Pipeline, Preview, Progress, Prompt, RequestError, Resolved, Setting, Silent,
};
