//! The GPU layer's one error type: every failure names the tensor, binding
//! or setting at fault, so a caller can print it as one line.

use std::fmt;

/// A multi-line report (wgpu's `Validation Error; Caused by: …`, a decoder's
/// error) as one line: its non-empty lines, trimmed, joined by `; `.
pub fn one_line(report: &str) -> String {
    report.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

#[derive(Debug, Clone)]
pub enum GpuError {
    /// No adapter for the chosen backend (no driver, or no GPU at all).
    NoAdapter { backend: &'static str, detail: String },
    /// `FLUX_LITE_BACKEND` names no backend we know.
    UnknownBackend(String),
    /// The adapter refused the device we asked for.
    RequestDevice(String),
    /// A tensor window exceeds what one storage binding may hold and the op cannot split it.
    BindingTooLarge { what: &'static str, bytes: u64, limit: u64 },
    /// A shape the kernel cannot take (e.g. head dim above its maximum).
    UnsupportedShape(String),
    /// wgpu reported an error while running work.
    Device(String),
    /// Reading a buffer back failed.
    Readback(String),
    /// The device was lost mid-run (driver reset, GPU removed, or destroyed).
    DeviceLost(String),
    /// The device could not allocate memory.
    OutOfMemory(String),
    /// The run was interrupted (Ctrl-C) and stopped at a block's end.
    Interrupted,
    /// The GPU's result cannot be right (not finite, or one value throughout):
    /// a failed submission the backend counted as done, or a broken kernel.
    WrongResult(String),
    /// The precision tier asked for cannot run on this adapter.
    TierUnavailable { tier: &'static str, adapter: String, why: String },
    /// A kernel folder's replacement source (`FLUX_LITE_KERNEL_DIR`) that
    /// cannot be built and bound as the module it replaces.
    KernelSource { path: String, why: String },
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::NoAdapter { backend, detail } => write!(
                f,
                "no GPU adapter found for the {backend} backend ({detail}); install a driver \
                 (e.g. Debian's mesa-vulkan-drivers for a software Vulkan device) or choose another \
                 with FLUX_LITE_BACKEND=vulkan|metal|dx12|gl"
            ),
            GpuError::UnknownBackend(b) => {
                write!(f, "FLUX_LITE_BACKEND={b:?} is not one of vulkan, metal, dx12, gl")
            }
            GpuError::WrongResult(what) => write!(f, "the GPU returned a result that cannot be right ({what}); nothing was written"),
            GpuError::RequestDevice(e) => write!(f, "the GPU adapter refused to create a device: {e}"),
            GpuError::BindingTooLarge { what, bytes, limit } => write!(
                f,
                "{what} needs a {bytes}-byte storage binding, above the adapter's limit of {limit} bytes"
            ),
            GpuError::UnsupportedShape(s) => write!(f, "unsupported shape: {s}"),
            GpuError::Device(e) => write!(f, "GPU error: {e}"),
            GpuError::Readback(e) => write!(f, "reading GPU memory back failed: {e}"),
            GpuError::DeviceLost(e) => write!(f, "the GPU device was lost ({e}); nothing was written"),
            GpuError::OutOfMemory(e) => {
                write!(f, "the GPU ran out of memory ({e}); give a memory budget below what the device has free")
            }
            GpuError::Interrupted => f.write_str("interrupted; stopped at the end of a block, nothing was written"),
            GpuError::TierUnavailable { tier, adapter, why } => write!(f, "the {tier} precision tier cannot run on {adapter}: {why}"),
            GpuError::KernelSource { path, why } => {
                write!(f, "{path}: {why} (a kernel folder's replacement must keep each entry point and the storage bindings its launchers bind)")
            }
        }
    }
}

impl std::error::Error for GpuError {}

