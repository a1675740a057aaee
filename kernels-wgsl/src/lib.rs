//! flux-lite-kernels: the whole GPU layer of flux-lite.
//!
//! - [`device`]: backend and adapter choice, the device with its limits,
//!   counted buffers, the pipeline cache, upload and readback.
//! - [`view`]: the two views a launcher takes of device memory ([`Mat`] for
//!   f32 activation rows, [`Weight`] for bf16/f32 weights).
//! - [`dispatch`]: storage windows, the split of an op into row chunks under
//!   the binding limit (written once), and [`Dispatch`]/[`Sink`].
//! - [`kernels`]: one file per kernel family, each holding its catalogue
//!   entries, parameter block, launchers and kernel-vs-oracle tests, with its
//!   WGSL beside it (`kernels/<family>.wgsl`).
//! - [`catalogue`]: every module and entry point, validated by naga.
//! - [`selftest`]: the product kernels checked against core's reference on
//!   the adapter in use, for `flux-lite selftest`.
//! - [`skip`]: the one line every test of the workspace prints when this
//!   machine lacks what it needs (`skipped: <test>: <why>`).
//!
//! Conventions shared by all kernels: binding 0 is the uniform `Params`,
//! storage bindings follow; activations are f32; weights are bf16 packed two
//! per u32 (or f32 when the `WEIGHT_BF16` override is false); offsets and
//! strides are in elements.

pub mod catalogue;
pub mod kernel;
pub mod device;
pub mod dispatch;
#[cfg(any(test, feature = "test-support"))]
pub mod emulated_matrix;
pub mod error;
mod interface;
pub use interface::check_kernel_dir;
pub mod kernels;
pub mod precision;
pub mod probe;
pub mod probe_flash;
pub mod range_rule;
pub mod selftest;
pub mod skip;
#[cfg(any(test, feature = "test-support"))]
pub mod test_devices;
pub mod view;

#[cfg(test)]
mod testing;

pub use catalogue::ALL_KERNELS;
pub use kernel::{wrapped_grid, Access, Kernel, Module, MAX_GRID_DIM};
#[cfg(any(test, feature = "test-support"))]
pub use device::FaultInjection;
pub use device::{AdapterMemory, AttentionChoice, FlashPaths, Backend, CacheState, CompileReport, DeviceBuffer, DeviceMemory, Gpu, GpuOptions, MemorySource, PipelineKey, PipelineStore, DEFAULT_MARGIN_PERCENT};
#[cfg(not(any(target_arch = "wasm32", target_vendor = "apple")))]
pub use device::{pipeline_name, Executable, PipelineStatistics, StatisticsError};
pub use dispatch::{encode, encode_timed, Dispatch, Sink};
pub use error::GpuError;
pub use precision::{GemmStaging, MatrixConfig, MatrixOperands, Precision};
pub use view::{HalfMat, Mat, RowScales, Weight, WeightDtype};
