//! flux-lite-platform: the engine. It reads the official diffusers model
//! folder through memory maps, runs core's Op programs on the GPU layer
//! (`flux-lite-kernels`), and drives a whole generation.

pub mod bench;
pub mod components;
pub mod error;
pub mod host_memory;
pub mod model;
pub mod pipeline;
pub mod run;
pub mod selftest;
/// Every tolerance, in core (`flux_lite_core::tolerance`).
pub use flux_lite_core::tolerance;

pub use error::{CompressError, GpuError, LoadError, RunError, TokenizeError};
// The device types the engine's API takes, from the GPU layer.
pub use flux_lite_kernels::{Backend, DeviceBuffer, DeviceMemory, Gpu, GpuOptions, Precision};
