//! Uniform parameter blocks, field for field as the shaders declare them.

use bytemuck::{Pod, Zeroable};

/// `linear.wgsl` — y[m, n] = x[m, k]·W[n, k]ᵀ (+ b).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct LinearParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub x_offset: u32,
    pub x_stride: u32,
    pub w_offset: u32,
    pub b_offset: u32,
    pub y_offset: u32,
    pub y_stride: u32,
    pub _pad: [u32; 3],
}

/// Output tile (rows × cols) of one `linear` or `conv2d` workgroup (gemm_tiles.wgsl).
pub const GEMM_TILE: [u32; 2] = [128, 128];

/// `norm.wgsl` — every normalisation. Rows are (token, head) pairs for
/// RMSNorm and LayerNorm; for GroupNorm `rows` = channels and `d` = pixels.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct NormParams {
    pub rows: u32,
    pub d: u32,
    pub heads: u32,
    pub src_offset: u32,
    pub src_stride: u32,
    pub dst_offset: u32,
    pub dst_stride: u32,
    pub w_offset: u32,
    pub eps: f32,
    pub shift_offset: u32,
    pub scale_offset: u32,
    pub groups: u32,
    pub silu: u32,
    pub _pad: [u32; 3],
}

/// `rope.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct RopeParams {
    pub tokens: u32,
    pub heads: u32,
    pub head_dim: u32,
    pub offset: u32,
    pub token_stride: u32,
    pub table_row: u32,
    pub _pad: [u32; 2],
}

/// `attention.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct AttentionParams {
    pub q_len: u32,
    pub kv_len: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub q_offset: u32,
    pub q_stride: u32,
    pub k_offset: u32,
    pub k_stride: u32,
    pub v_offset: u32,
    pub v_stride: u32,
    pub o_offset: u32,
    pub o_stride: u32,
    pub scale: f32,
    pub causal: u32,
    pub use_mask: u32,
    pub mask_offset: u32,
    /// Position of local query 0 (causal masking of a window of queries).
    pub q_position: u32,
    /// Where each row's log-sum-exp goes when `write_lse` is 1.
    pub lse_offset: u32,
    pub write_lse: u32,
}

/// `elementwise.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct ElementwiseParams {
    pub rows: u32,
    pub cols: u32,
    pub a_offset: u32,
    pub a_stride: u32,
    pub b_offset: u32,
    pub b_stride: u32,
    pub dst_offset: u32,
    pub dst_stride: u32,
    pub scalar: f32,
    pub gate_offset: u32,
    pub _pad: [u32; 2],
}

/// `conv.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct ConvParams {
    pub in_channels: u32,
    pub height: u32,
    pub width: u32,
    pub out_channels: u32,
    pub out_height: u32,
    pub out_width: u32,
    pub kernel: u32,
    pub stride: u32,
    pub pad_top: u32,
    pub pad_left: u32,
    pub x_offset: u32,
    pub w_offset: u32,
    pub b_offset: u32,
    pub y_offset: u32,
    pub _pad: [u32; 2],
}

/// `vae.wgsl` — the decoder's input (de-normalise, unpatchify) and output (8-bit levels).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct VaeParams {
    /// Latent channels, and the packed token grid (rows, columns).
    pub channels: u32,
    pub height: u32,
    pub width: u32,
    pub src_offset: u32,
    pub dst_offset: u32,
    /// Offset of the BatchNorm mean and variance (equally aligned windows).
    pub stats_offset: u32,
    /// Values to convert to levels.
    pub count: u32,
    pub eps: f32,
}

/// `df11.wgsl`: one dispatch expands blocks `block0..` of a DF11 group. Each
/// `*_shift` is the index (bytes for byte arrays, elements otherwise) of the
/// first element of the bound window in its buffer.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct Df11Params {
    pub n_luts: u32,
    pub n_bytes: u32,
    pub n_elements: u32,
    pub block0: u32,
    pub stream_shift: u32,
    pub sign_shift: u32,
    pub gaps_shift: u32,
    pub positions_shift: u32,
    /// Element of the slot buffer where the group's element 0 lands (even).
    pub out_base: u32,
    pub out_shift: u32,
    /// Elements whose words `df11_clear` zeroes.
    pub clear_first: u32,
    pub clear_end: u32,
}

/// `bench.wgsl` — the ceilings: `iterations` of the FMA loop, `count`
/// invocations that write (FMA) or vec4s copied (copy).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct PeakParams {
    pub iterations: u32,
    pub count: u32,
    pub _pad: [u32; 2],
}
