//! flux-lite-platform: the engine. It reads the official diffusers model
//! folder through memory maps, runs core's Op programs on the GPU layer
//! (`flux-lite-kernels`), and drives a whole generation.

pub mod compress;
pub mod config_json;
pub mod bench;
pub mod denoise;
pub mod device_weights;
pub mod df11;
pub mod embeddings_file;
pub mod error;
pub mod model;
pub mod output;
pub mod pipeline;
pub mod reference_image;
pub mod resample;
pub mod planning;
pub mod runner;
pub mod safetensors_store;
pub mod text_encoder;
pub mod tokenizer;
pub mod transformer;
pub mod vae;
pub mod vae_bands;
pub mod vae_encoder;

pub use error::{CompressError, GpuError, LoadError, RunError, TokenizeError};
// The device types the engine's API takes, from the GPU layer.
pub use flux_lite_kernels::{Backend, DeviceBuffer, DeviceMemory, Gpu, GpuOptions};
