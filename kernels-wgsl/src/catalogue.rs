//! The kernel catalogue: every entry point of every family, checked against
//! the shaders by naga in the tests below (workgroup size, storage bindings
//! and their access, the parameter block's size). The entries themselves
//! live in their family files (`kernels/<family>.rs`); what an entry is, in
//! [`crate::kernel`].

use crate::kernel::Kernel;
#[cfg(test)]
use crate::kernel::{wrapped_grid, Access, Module, MAX_GRID_DIM};
use crate::kernels::{attention, bench, conv, df11, elementwise, ggml, linear, norm, rope, vae};

/// Every kernel, for validation and pipeline warm-up.
pub const ALL_KERNELS: &[Kernel] = &[
    linear::LINEAR,
    linear::RANGE_SCALES,
    linear::LINEAR_LANES,
    norm::RMS_NORM,
    norm::RMS_NORM_INPLACE,
    norm::LAYER_NORM_MODULATE,
    norm::RMS_NORM_LANES,
    norm::RMS_NORM_INPLACE_LANES,
    norm::LAYER_NORM_MODULATE_LANES,
    norm::LAYER_NORM_MODULATE_HALF,
    norm::LAYER_NORM_MODULATE_HALF_LANES,
    norm::GROUP_NORM,
    norm::GROUP_STATS,
    norm::GROUP_NORM_APPLY,
    rope::ROPE_INTERLEAVED,
    rope::ROPE_HALF,
    attention::ATTENTION,
    attention::ATTENTION_CPU,
    attention::ATTENTION_CPU_WIDE,
    attention::ATTENTION_HALF_KV,
    attention::ATTENTION_CPU_HALF_KV,
    attention::ATTENTION_CPU_WIDE_HALF_KV,
    attention::ATTENTION_LANES,
    attention::ATTENTION_LANES_HALF_KV,
    attention::HALF_PACK,
    elementwise::SILU,
    elementwise::SWIGLU,
    elementwise::GATED_RESIDUAL,
    elementwise::ADD,
    elementwise::ADD_RELU,
    elementwise::ADD_INPLACE,
    elementwise::SCALE,
    elementwise::AXPY,
    elementwise::COPY,
    elementwise::TRANSPOSE,
    elementwise::RELU,
    elementwise::TANH_CLAMP,
    elementwise::SCALE_SHIFT,
    conv::CONV2D,
    conv::CONV2D_WIDE,
    conv::CONV2D_THIN,
    conv::CONV2D_LANES,
    conv::UPSAMPLE_NEAREST2X,
    vae::DENORM_UNPATCHIFY,
    vae::PIXEL_LEVELS,
    vae::LATENT_PREVIEW,
    df11::DF11_DECODE,
    df11::DF11_CLEAR,
    ggml::GGML_EXPAND,
    bench::FMA_PEAK,
    bench::COPY_PEAK,
    linear::LINEAR_HALF,
    conv::CONV2D_HALF,
    conv::CONV2D_HALF_WIDE,
    linear::LINEAR_MATRIX_8,
    linear::LINEAR_MATRIX_16,
    conv::CONV2D_MATRIX_8,
    conv::CONV2D_MATRIX_16,
    attention::ATTENTION_MATRIX_8,
    attention::ATTENTION_MATRIX_16,
    attention::ATTENTION_FLASH_8,
    attention::ATTENTION_FLASH_16,
    bench::MATRIX_PEAK_8,
    bench::MATRIX_PEAK_16,
    linear::LINEAR_MATRIX_8_F32,
    conv::CONV2D_MATRIX_8_F32,
    conv::CONV2D_MATRIX_8_NARROW,
    conv::CONV2D_MATRIX_16_NARROW,
    conv::CONV2D_MATRIX_8_F32_NARROW,
    conv::CONV_RUN_SCALES_8,
    conv::CONV_RUN_SCALES_16,
    linear::LINEAR_MATRIX_8_VEC4,
    linear::LINEAR_MATRIX_16_VEC4,
    linear::LINEAR_MATRIX_8_F32_VEC4,
    attention::ATTENTION_MATRIX_8_F32,
    bench::MATRIX_PEAK_8_F32,
];

#[cfg(test)]
#[path = "catalogue_tests.rs"]
mod tests;
