//! flux-lite-platform: everything that touches the outside world. The GPU
//! device and its pipelines, core's ops as WGSL dispatches, and the official
//! diffusers model folder read through memory maps.

pub mod compress;
pub mod config_json;
pub mod bench;
pub mod denoise;
pub mod device_weights;
pub mod df11;
pub mod embeddings_file;
pub mod error;
pub mod gpu;
pub mod model;
pub mod ops;
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
pub use gpu::{Backend, DeviceBuffer, DeviceMemory, Gpu, GpuOptions};
