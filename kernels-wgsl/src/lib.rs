//! flux-lite's WGSL compute kernels and what a launcher needs to run them:
//! the source of each module, every entry point with its workgroup size and
//! storage bindings, and the uniform parameter block laid out byte for byte
//! as the shader declares it (checked against naga's layout in tests).
//!
//! Conventions shared by all kernels: binding 0 is the uniform `Params`,
//! storage bindings follow; activations are f32; weights are bf16 packed two
//! per u32 (or f32 when the `WEIGHT_BF16` override is false); offsets and
//! strides are in elements.

pub mod params;

pub use params::*;

/// A WGSL source file (with the shared helpers prepended).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Module {
    Linear,
    Norm,
    Rope,
    Attention,
    Elementwise,
    Conv,
    Vae,
    Df11,
    Bench,
}

impl Module {
    pub const ALL: [Module; 9] = [
        Module::Linear,
        Module::Norm,
        Module::Rope,
        Module::Attention,
        Module::Elementwise,
        Module::Conv,
        Module::Vae,
        Module::Df11,
        Module::Bench,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Module::Linear => "linear",
            Module::Norm => "norm",
            Module::Rope => "rope",
            Module::Attention => "attention",
            Module::Elementwise => "elementwise",
            Module::Conv => "conv",
            Module::Vae => "vae",
            Module::Df11 => "df11",
            Module::Bench => "bench",
        }
    }

    pub fn source(self) -> &'static str {
        macro_rules! with_common {
            ($file:literal) => {
                concat!(include_str!("shaders/common.wgsl"), "\n", include_str!(concat!("shaders/", $file)))
            };
        }
        macro_rules! with_gemm {
            ($file:literal) => {
                concat!(
                    include_str!("shaders/common.wgsl"),
                    "\n",
                    include_str!("shaders/gemm_tiles.wgsl"),
                    "\n",
                    include_str!(concat!("shaders/", $file))
                )
            };
        }
        match self {
            Module::Linear => with_gemm!("linear.wgsl"),
            Module::Norm => with_common!("norm.wgsl"),
            Module::Rope => with_common!("rope.wgsl"),
            Module::Attention => with_common!("attention.wgsl"),
            Module::Elementwise => with_common!("elementwise.wgsl"),
            Module::Conv => with_gemm!("conv.wgsl"),
            Module::Vae => with_common!("vae.wgsl"),
            Module::Df11 => with_common!("df11.wgsl"),
            Module::Bench => with_common!("bench.wgsl"),
        }
    }
}

/// How a kernel uses a storage binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
}

/// One entry point and its interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernel {
    pub module: Module,
    pub entry: &'static str,
    pub workgroup_size: [u32; 3],
    /// Storage bindings the entry point uses, in binding order (binding 0, the params, excluded).
    pub storage: &'static [(u32, Access)],
    /// Size in bytes of the uniform `Params` block.
    pub params_size: usize,
    /// Name of the bool override that selects bf16 (true) or f32 weights, if the kernel has one.
    pub weight_dtype_override: Option<&'static str>,
}

use Access::{Read as R, ReadWrite as RW};

const fn kernel(
    module: Module,
    entry: &'static str,
    workgroup_size: [u32; 3],
    storage: &'static [(u32, Access)],
    params_size: usize,
    weights: bool,
) -> Kernel {
    Kernel {
        module,
        entry,
        workgroup_size,
        storage,
        params_size,
        weight_dtype_override: if weights { Some("WEIGHT_BF16") } else { None },
    }
}

pub const LINEAR: Kernel =
    kernel(Module::Linear, "linear", [16, 16, 1], &[(1, RW), (2, R), (3, R), (4, RW)], size_of::<LinearParams>(), true);

pub const RMS_NORM: Kernel =
    kernel(Module::Norm, "rms_norm", [128, 1, 1], &[(1, RW), (2, RW), (3, R)], size_of::<NormParams>(), true);
pub const RMS_NORM_INPLACE: Kernel =
    kernel(Module::Norm, "rms_norm_inplace", [128, 1, 1], &[(2, RW), (3, R)], size_of::<NormParams>(), true);
pub const LAYER_NORM_MODULATE: Kernel =
    kernel(Module::Norm, "layer_norm_modulate", [128, 1, 1], &[(1, RW), (2, RW), (5, RW)], size_of::<NormParams>(), false);
pub const GROUP_NORM: Kernel =
    kernel(Module::Norm, "group_norm", [128, 1, 1], &[(1, RW), (2, RW), (3, R), (4, R)], size_of::<NormParams>(), true);
pub const GROUP_STATS: Kernel =
    kernel(Module::Norm, "group_stats", [128, 1, 1], &[(1, RW), (5, RW)], size_of::<NormParams>(), false);
pub const GROUP_NORM_APPLY: Kernel = kernel(
    Module::Norm,
    "group_norm_apply",
    [128, 1, 1],
    &[(1, RW), (2, RW), (3, R), (4, R), (5, RW)],
    size_of::<NormParams>(),
    true,
);

pub const ROPE_INTERLEAVED: Kernel =
    kernel(Module::Rope, "rope_interleaved", [64, 1, 1], &[(1, RW), (2, R), (3, R)], size_of::<RopeParams>(), false);
pub const ROPE_HALF: Kernel =
    kernel(Module::Rope, "rope_half", [64, 1, 1], &[(1, RW), (2, R), (3, R)], size_of::<RopeParams>(), false);

pub const ATTENTION: Kernel = kernel(
    Module::Attention,
    "attention",
    [64, 1, 1],
    &[(1, RW), (2, RW), (3, RW), (4, R), (5, RW), (6, RW)],
    size_of::<AttentionParams>(),
    false,
);
/// Queries per attention workgroup and the largest head dim the kernel takes.
pub const ATTENTION_QUERIES_PER_GROUP: u32 = 16;
pub const ATTENTION_MAX_HEAD_DIM: u32 = 512;

const fn unary(entry: &'static str) -> Kernel {
    kernel(Module::Elementwise, entry, [64, 1, 1], &[(1, RW), (3, RW)], size_of::<ElementwiseParams>(), false)
}
const fn binary(entry: &'static str) -> Kernel {
    kernel(Module::Elementwise, entry, [64, 1, 1], &[(1, RW), (2, RW), (3, RW)], size_of::<ElementwiseParams>(), false)
}
pub const SILU: Kernel = unary("silu_op");
pub const SWIGLU: Kernel = binary("swiglu");
pub const GATED_RESIDUAL: Kernel = binary("gated_residual");
pub const ADD: Kernel = binary("add");
pub const ADD_INPLACE: Kernel = unary("add_inplace");
pub const SCALE: Kernel = unary("scale");
pub const AXPY: Kernel = unary("axpy");
pub const COPY: Kernel = unary("copy");
pub const TRANSPOSE: Kernel = unary("transpose");

pub const CONV2D: Kernel =
    kernel(Module::Conv, "conv2d", [16, 16, 1], &[(1, RW), (2, R), (3, R), (4, RW)], size_of::<ConvParams>(), true);
pub const UPSAMPLE_NEAREST2X: Kernel =
    kernel(Module::Conv, "upsample_nearest2x", [64, 1, 1], &[(1, RW), (4, RW)], size_of::<ConvParams>(), false);

pub const DENORM_UNPATCHIFY: Kernel =
    kernel(Module::Vae, "denorm_unpatchify", [64, 1, 1], &[(1, RW), (2, R), (3, R), (4, RW)], size_of::<VaeParams>(), true);
pub const PIXEL_LEVELS: Kernel =
    kernel(Module::Vae, "pixel_levels", [64, 1, 1], &[(1, RW), (4, RW)], size_of::<VaeParams>(), false);

pub const DF11_DECODE: Kernel = kernel(
    Module::Df11,
    "df11_decode",
    [256, 1, 1],
    &[(1, R), (2, R), (3, R), (4, R), (5, R), (6, RW)],
    size_of::<Df11Params>(),
    false,
);
pub const DF11_CLEAR: Kernel = kernel(Module::Df11, "df11_clear", [256, 1, 1], &[(6, RW)], size_of::<Df11Params>(), false);
/// Bytes of the exponent stream one DF11 workgroup decodes (the official block).
pub const DF11_BLOCK_BYTES: u64 = 4096;

/// The adapter's arithmetic ceiling: chains of vec4 FMAs (see `bench.wgsl`).
pub const FMA_PEAK: Kernel = kernel(Module::Bench, "fma_peak", [256, 1, 1], &[(1, RW)], size_of::<PeakParams>(), false);
/// The adapter's memory ceiling for a kernel: a vec4 copy.
pub const COPY_PEAK: Kernel = kernel(Module::Bench, "copy_peak", [256, 1, 1], &[(2, R), (3, RW)], size_of::<PeakParams>(), false);
/// FMAs per invocation and iteration of `fma_peak`: 8 chains × 4 lanes × 4 unrolled.
pub const FMA_PEAK_FMAS_PER_ITERATION: u64 = 8 * 4 * 4;

/// Every kernel, for validation and pipeline warm-up.
pub const ALL_KERNELS: &[Kernel] = &[
    LINEAR,
    RMS_NORM,
    RMS_NORM_INPLACE,
    LAYER_NORM_MODULATE,
    GROUP_NORM,
    GROUP_STATS,
    GROUP_NORM_APPLY,
    ROPE_INTERLEAVED,
    ROPE_HALF,
    ATTENTION,
    SILU,
    SWIGLU,
    GATED_RESIDUAL,
    ADD,
    ADD_INPLACE,
    SCALE,
    AXPY,
    COPY,
    TRANSPOSE,
    CONV2D,
    UPSAMPLE_NEAREST2X,
    DENORM_UNPATCHIFY,
    PIXEL_LEVELS,
    DF11_DECODE,
    DF11_CLEAR,
    FMA_PEAK,
    COPY_PEAK,
];

/// Most workgroups one grid dimension may have on every adapter.
pub const MAX_GRID_DIM: u32 = 65535;

/// A grid of at least `workgroups` workgroups, wrapped into y past
/// `MAX_GRID_DIM` (the kernels flatten it back and skip the excess).
pub fn wrapped_grid(workgroups: u64) -> [u32; 3] {
    let x = workgroups.clamp(1, MAX_GRID_DIM as u64);
    let y = workgroups.div_ceil(x).max(1);
    [x as u32, y as u32, 1]
}

#[cfg(test)]
mod tests;
