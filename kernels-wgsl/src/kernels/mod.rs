//! One module per kernel family: launchers, catalogue entries, parameter
//! blocks and kernel-vs-oracle tests in `<family>.rs`, the shader in
//! `<family>.wgsl` (with `common.wgsl`, and `gemm_tiles.wgsl` for the matrix
//! products, prepended).

pub mod attention;
pub mod attention_chunks;
pub mod attention_lanes;
pub mod bench;
pub mod conv;
pub mod conv_nhwc;
pub mod conv_lanes;
pub mod df11;
pub mod elementwise;
pub mod ggml;
pub mod group_norm;
pub mod group_norm_nhwc;
pub mod half_pack;
pub mod linear;
pub mod lanes;
pub mod linear_lanes;
pub mod norm;
pub mod rope;
pub mod vae;

#[cfg(test)]
mod epilogue_tests;
#[cfg(test)]
mod half_path_tests;

// Each family's launchers and shapes, callable as `kernels::linear(..)`.
pub use attention::{attention, attention_carried, carried_attention_module, attention_half_into_half, attention_half_kv, attention_into_half, HalfQkv, Attention, Carry, HalfKvScales, Qkv, ATTENTION_KEY_TILE, ATTENTION_MATRIX_MAX_HEAD_DIM, ATTENTION_MATRIX_WIDE_MAX_HEAD_DIM, ATTENTION_MAX_HEAD_DIM, ATTENTION_QUERIES_PER_GROUP};
pub use attention_chunks::{attention_chunked, attention_on_products, runs_chunked_attention, HeadInputs};
pub use bench::{copy_peak, fma_peak, matrix_peak, FMA_PEAK_FMAS_PER_ITERATION, MATRIX_PEAK_CHAINS};
pub use conv::{conv2d, conv2d_then, upsample_nearest2x, ConvEpilogue};
pub use conv_nhwc::{conv2d_matrix_nhwc, NhwcInput, NhwcNorm, NhwcOutput, NhwcSource, NhwcWeights, NormActivation, TapOrder};
pub use df11::{df11_clear, df11_decode, df11_decode_blocks, Df11Arrays, DF11_BLOCK_BYTES};
pub use elementwise::{elementwise, transpose, Elementwise};
pub use ggml::{expands_half, ggml_expand, ggml_expand_half, GgmlBlocks};
pub use group_norm_nhwc::group_norm_nhwc_half;
pub use linear::{linear, linear_add, linear_from, linear_gated, linear_swiglu, linear_swiglu_half, linear_into_half, linear_into_half_normed, product_norms_heads, HeadNorm, swiglu_fits, swiglu_writes_pieces, product_writes_pieces, measure_weight_rows, Gemm, Input, GEMM_TILE};
pub use half_pack::{half_pack, pack_weight_half, pack_weight_half_f32, swiglu_half_pack};
pub use group_norm::{group_merge, group_moments, group_norm, group_norm_apply, GroupAffine, GroupShape, GroupStats, RowMoments};
pub use norm::{layer_norm_modulate, layer_norm_modulate_half, rms_norm_rope, rms_norm_rope_half, rms_norm, rms_norm_half, rms_norm_inplace, LaterModulation, Modulation, RowNorm};
pub use rope::{rope, RopeStyle, RopeTables};
pub use crate::view::HeadRows;
pub use vae::{denorm_unpatchify, latent_preview, pixel_levels, LatentStats};
