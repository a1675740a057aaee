//! Attention with an online softmax: 16 queries per workgroup, keys and
//! values streamed through workgroup memory; grouped-query heads, causal and
//! padding masks, and (the tiled kernel) an online softmax carried across calls over chunks of the keys.
//! Shader: `attention.wgsl` beside this file.

use crate::kernel::{kernel, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::device::{AttentionChoice, Gpu};
use crate::dispatch::{dispatch, placeholder_window, row_chunks, to_u32, window, Launch, Rows, Sink};
use crate::error::GpuError;
use crate::precision::{MatrixConfig, MatrixOperands};
use crate::view::{HalfMat, Mat};
use bytemuck::{Pod, Zeroable};

mod matrix_blocks;
pub(crate) use matrix_blocks::flash_workgroup_bytes;
use matrix_blocks::{flash_output_dims, flash_subgroups, flash_takes};
pub use matrix_blocks::{matrix_attention_output_dims, matrix_attention_workgroup_bytes};

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
    /// The tiled kernel's online softmax carried between calls
    /// ([`attention_carried`]): where its state lies, and `CARRY_*` bits.
    pub state_offset: u32,
    pub carry: u32,
    /// Where the keys' and values' range scales start (half-K/V kernels).
    pub k_scale_offset: u32,
    pub v_scale_offset: u32,
    /// Where the f16 output's piece scales start, and from one query to the next.
    pub o_scale_offset: u32,
    pub o_scale_stride: u32,
    /// Where the f16 queries' piece scales start, and the queries', keys'
    /// and values' from one row to the next; the values a scale covers.
    pub q_scale_offset: u32,
    pub q_scale_stride: u32,
    pub k_scale_stride: u32,
    pub v_scale_stride: u32,
    pub qkv_piece: u32,
    pub _pad: [u32; 3],
}

pub const ATTENTION: Kernel = kernel(
    Module::Attention,
    "attention",
    [64, 1, 1],
    &[(1, RW), (2, RW), (3, RW), (4, R), (5, RW), (6, RW)],
    size_of::<AttentionParams>(),
    false,
);
/// The matrix tier's attention (`attention_matrix.wgsl`), one module per
/// tile size; its workgroup is one subgroup, set by the `WG` override.
/// Bindings 12 and 13 take its f16 output in pieces and their scales
/// ([`attention_into_half`]), 14–19 its f16 queries, keys and values in
/// pieces and their scales ([`attention_half_into_half`]).
pub const ATTENTION_MATRIX_8: Kernel = Kernel {
    module: Module::AttentionMatrix8,
    entry: "attention_matrix",
    workgroup_size: [0, 1, 1],
    storage: &[(1, RW), (2, RW), (3, RW), (4, R), (5, RW), (6, RW), (12, RW), (13, RW), (14, RW), (15, RW), (16, RW), (17, RW), (18, RW), (19, RW)],
    ..ATTENTION
};
pub const ATTENTION_MATRIX_16: Kernel = Kernel { module: Module::AttentionMatrix16, ..ATTENTION_MATRIX_8 };
pub const ATTENTION_MATRIX_8_F32: Kernel = Kernel { module: Module::AttentionMatrix8F32, ..ATTENTION_MATRIX_8 };
/// The matrix tier's attention for heads up to [`ATTENTION_MATRIX_WIDE_MAX_HEAD_DIM`]
/// (f16 tiles): the VAE mid-block's, carried over chunks of keys by bands.
pub const ATTENTION_MATRIX_WIDE_8: Kernel = Kernel { module: Module::AttentionMatrixWide8, ..ATTENTION_MATRIX_8 };
pub const ATTENTION_MATRIX_WIDE_16: Kernel = Kernel { module: Module::AttentionMatrixWide16, ..ATTENTION_MATRIX_8 };
/// The widest head the matrix tier's attention takes; wider ones run `attention.wgsl`.
pub const ATTENTION_MATRIX_MAX_HEAD_DIM: u64 = 128;
/// The widest head its wide modules take (`attention_head_512.wgsl`).
pub const ATTENTION_MATRIX_WIDE_MAX_HEAD_DIM: u64 = 512;
/// The matrix tier's flash attention (`attention_flash.wgsl`, f16 tiles):
/// its attention wherever the start-up check passed ([`Gpu::flash_attention`])
/// and the call fits it ([`flash_takes`]); its workgroup is
/// [`flash_subgroups`] subgroups (the `WG` override). Bindings as
/// [`ATTENTION_MATRIX_8`]'s but the carried state's, and the f16 queries',
/// keys' and values' words again at 20–22 as vec4s of f16
/// (`attention_qkv_quads.wgsl`).
pub const ATTENTION_FLASH_8: Kernel = Kernel {
    module: Module::AttentionFlash8,
    entry: "attention_flash",
    storage: &[(1, RW), (2, RW), (3, RW), (4, R), (5, RW), (12, RW), (13, RW), (14, RW), (15, RW), (16, RW), (17, RW), (18, RW), (19, RW), (20, RW), (21, RW), (22, RW)],
    ..ATTENTION_MATRIX_8
};
pub const ATTENTION_FLASH_16: Kernel = Kernel { module: Module::AttentionFlash16, ..ATTENTION_FLASH_8 };

/// The matrix tier's kernel for a call on `c`: flash where the device's
/// check of this call's path (f16 pieces in, `half_inputs`, or f32 rows)
/// passed and it takes the call, `attention_matrix.wgsl` otherwise.
fn matrix_kernel(gpu: &Gpu, c: MatrixConfig, head_dim: u64, piece: Option<u64>, half_inputs: bool) -> AttentionKernel {
    match gpu.flash_attention().takes(half_inputs) && gpu.attention_choice() != AttentionChoice::Matrix && flash_takes(c, head_dim, piece) {
        true => AttentionKernel::Flash(c),
        false => AttentionKernel::Matrix(c),
    }
}

/// Whether an attention over heads of `head_dim` with f16 pieces of 64 in
/// and out (`half_inputs`), or f32 rows, runs the flash kernel on `gpu`.
pub(crate) fn takes_flash(gpu: &Gpu, head_dim: u64, half_inputs: bool) -> bool {
    let piece = half_inputs.then_some(64);
    gpu.matrix().is_some_and(|c| matches!(matrix_kernel(gpu, c, head_dim, piece, half_inputs), AttentionKernel::Flash(_)))
}

/// CPU adapters' attention (`attention_cpu.wgsl`): four queries an invocation,
/// q, k and v read as vec4s (bindings 7–9), no workgroup memory, no barriers.
pub const ATTENTION_CPU: Kernel = Kernel { entry: "attention_cpu", storage: &[(4, R), (5, RW), (7, RW), (8, RW), (9, RW)], ..ATTENTION };
/// Heads wider than [`ATTENTION_CPU_MAX_HEAD_DIM`] on CPU adapters: one query an invocation.
pub const ATTENTION_CPU_WIDE: Kernel = Kernel { entry: "attention_cpu_wide", ..ATTENTION_CPU };
/// Attention over keys and values in the half-K/V layout
/// (`attention_kv_half.wgsl`): the tiled kernel, the CPU-adapter ones;
/// bindings 10 and 11 hold the keys' and values' range scales.
pub const ATTENTION_HALF_KV: Kernel = Kernel {
    module: Module::AttentionHalfKv,
    storage: &[(1, RW), (2, RW), (3, RW), (4, R), (5, RW), (6, RW), (10, RW), (11, RW)],
    ..ATTENTION
};
pub const ATTENTION_CPU_HALF_KV: Kernel = Kernel {
    module: Module::AttentionHalfKv,
    storage: &[(4, R), (5, RW), (7, RW), (8, RW), (9, RW), (10, RW), (11, RW)],
    ..ATTENTION_CPU
};
pub const ATTENTION_CPU_WIDE_HALF_KV: Kernel = Kernel { entry: "attention_cpu_wide", ..ATTENTION_CPU_HALF_KV };
/// The CPU kernels with each key and value row read once a subgroup
/// ([`Gpu::cpu_lanes`]), for 8 lanes and heads of 128 (the module is
/// written for each subgroup size and head width: [`lanes_kernel`]).
pub const ATTENTION_LANES: Kernel = Kernel {
    module: Module::AttentionLanes { lanes: 8, half_kv: false, head_vec4: 32 },
    entry: "attention_lanes",
    ..ATTENTION_CPU
};
pub const ATTENTION_LANES_HALF_KV: Kernel = Kernel {
    module: Module::AttentionLanes { lanes: 8, half_kv: true, head_vec4: 32 },
    entry: "attention_lanes",
    ..ATTENTION_CPU_HALF_KV
};

/// [`ATTENTION_LANES`] (or its half-K/V form) for subgroups of `lanes` and heads of `head_dim`.
fn lanes_kernel(lanes: u32, half_kv: bool, head_dim: u64) -> Kernel {
    let module = Module::AttentionLanes { lanes: lanes as u8, half_kv, head_vec4: (head_dim / 4) as u8 };
    Kernel { module, ..if half_kv { ATTENTION_LANES_HALF_KV } else { ATTENTION_LANES } }
}

/// Queries per CPU-adapter workgroup and the widest head it takes (4·`CPU_MAX_VEC4`).
const ATTENTION_CPU_QUERIES_PER_GROUP: u64 = 256;
pub const ATTENTION_CPU_MAX_HEAD_DIM: u64 = 128;
/// The wide kernel's (4·`CPU_WIDE_VEC4`, `CPU_WIDE_QUERIES`).
const ATTENTION_CPU_WIDE_QUERIES_PER_GROUP: u64 = 64;
pub const ATTENTION_CPU_WIDE_MAX_HEAD_DIM: u64 = 512;

/// Whether the CPU kernel takes these operands: a head of at most
/// [`ATTENTION_CPU_MAX_HEAD_DIM`] dims, a multiple of 4, and q, k and v rows
/// that start on multiples of 4 elements (read as vec4s; f16 keys and
/// values, two a word, on multiples of 2 words).
fn lanes_fit(s: &Attention, qkv: &Qkv<'_>, half: bool) -> bool {
    let aligned = |m: &Mat<'_>, n: u64| m.offset.is_multiple_of(n) && m.stride.is_multiple_of(n);
    let kv = if half { 2 } else { 4 };
    s.head_dim <= ATTENTION_CPU_WIDE_MAX_HEAD_DIM && s.head_dim.is_multiple_of(4) && aligned(&qkv.q, 4) && aligned(&qkv.k, kv) && aligned(&qkv.v, kv)
}

/// Queries per attention workgroup and the largest head dim the kernel takes.
pub const ATTENTION_QUERIES_PER_GROUP: u32 = 16;
pub const ATTENTION_MAX_HEAD_DIM: u32 = 512;

/// Shape and masking of one attention call over `[len, heads, head_dim]` views.
#[derive(Debug, Clone, Copy)]
pub struct Attention {
    pub q_len: u64,
    pub kv_len: u64,
    pub q_heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub scale: f32,
    pub causal: bool,
}

/// The oracle's shape ([`flux_lite_core::oracle::AttentionShape`]) as a
/// call, its scale the f32 the kernels take; and back, for the oracle to
/// check a call against.
impl From<flux_lite_core::oracle::AttentionShape> for Attention {
    fn from(s: flux_lite_core::oracle::AttentionShape) -> Self {
        let long = |n: usize| n as u64;
        Attention { q_len: long(s.q_len), kv_len: long(s.kv_len), q_heads: long(s.q_heads), kv_heads: long(s.kv_heads), head_dim: long(s.head_dim), scale: s.scale as f32, causal: s.causal }
    }
}

impl From<Attention> for flux_lite_core::oracle::AttentionShape {
    fn from(s: Attention) -> Self {
        let size = |n: u64| n as usize;
        Self { q_len: size(s.q_len), kv_len: size(s.kv_len), q_heads: size(s.q_heads), kv_heads: size(s.kv_heads), head_dim: size(s.head_dim), scale: f64::from(s.scale), causal: s.causal }
    }
}

/// The query, key and value rows of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct Qkv<'a> {
    pub q: Mat<'a>,
    pub k: Mat<'a>,
    pub v: Mat<'a>,
}

/// The range scales of keys and values in the half-K/V layout (`Qkv`'s `k`
/// and `v` then hold f16 pairs, `[kv_len, kv_heads·head_dim / 2]` words, as
/// [`half_pack`] writes them): one f32 a (token, kv head) row, `[kv_len, kv_heads]`.
#[derive(Debug, Clone, Copy)]
pub struct HalfKvScales<'a> {
    pub k: Mat<'a>,
    pub v: Mat<'a>,
}

/// Which attention kernel runs a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttentionKernel {
    /// `attention.wgsl`: query and key tiles in workgroup memory (GPUs; any head dim).
    Tiled,
    /// CPU adapters' kernels, no barriers: with `shared_rows` (the
    /// subgroup's size, [`Gpu::cpu_lanes`]) `attention_lanes`, the subgroup
    /// reading each row together (four queries an invocation at every head
    /// width); without, `attention_cpu.wgsl` (four queries an invocation, vec4
    /// loads; `wide`: its wide-head entry, one query an invocation).
    Lanes { wide: bool, shared_rows: Option<u32> },
    /// `attention_matrix.wgsl` on the matrix tier, in its configuration.
    Matrix(MatrixConfig),
    /// `attention_flash.wgsl` on the matrix tier's f16 tiles.
    Flash(MatrixConfig),
}

impl AttentionKernel {
    /// The kernel for this call on `gpu`: the matrix tier's where it is the
    /// tier and the head fits; the CPU kernel where the device takes
    /// CPU-shaped kernels and the operands fit it ([`lanes_fit`]); the tiled
    /// kernel otherwise. [`FORCE_KERNEL`] overrides the first two. Keys and
    /// values in half precision (`half`) take only the tiled and CPU kernels
    /// (the matrix tier's read f32 keys).
    fn pick(gpu: &Gpu, s: &Attention, qkv: &Qkv<'_>, half: bool) -> AttentionKernel {
        let lanes = lanes_fit(s, qkv, half);
        let cpu = AttentionKernel::Lanes { wide: s.head_dim > ATTENTION_CPU_MAX_HEAD_DIM, shared_rows: gpu.cpu_lanes() };
        let matrix = gpu.matrix().filter(|_| !half);
        match gpu.attention_choice() {
            AttentionChoice::Tiled => return AttentionKernel::Tiled,
            AttentionChoice::Lanes if lanes => return cpu,
            AttentionChoice::Lanes => return AttentionKernel::Tiled,
            AttentionChoice::Launcher | AttentionChoice::Matrix | AttentionChoice::Products => {}
        }
        match matrix {
            Some(c) if s.head_dim <= ATTENTION_MATRIX_MAX_HEAD_DIM => matrix_kernel(gpu, c, s.head_dim, None, false),
            _ if lanes && gpu.cpu_shaped_kernels() => cpu,
            _ => AttentionKernel::Tiled,
        }
    }

    /// Queries one workgroup takes.
    fn queries_per_group(self) -> u64 {
        match self {
            AttentionKernel::Tiled => ATTENTION_QUERIES_PER_GROUP as u64,
            AttentionKernel::Lanes { wide: true, shared_rows: None } => ATTENTION_CPU_WIDE_QUERIES_PER_GROUP,
            AttentionKernel::Lanes { .. } => ATTENTION_CPU_QUERIES_PER_GROUP,
            AttentionKernel::Matrix(c) => c.size as u64,
            AttentionKernel::Flash(c) => flash_subgroups(c) * c.size as u64,
        }
    }
}

/// `o = softmax(q·kᵀ·scale + mask)·v`; `key_keep[j] == 0` masks key `j`.
/// The kernel is [`AttentionKernel::pick`]'s.
pub fn attention(gpu: &Gpu, sink: &mut dyn Sink, qkv: Qkv<'_>, key_keep: Option<&wgpu::Buffer>, o: Mat<'_>, s: Attention) -> Result<(), GpuError> {
    let kernel = AttentionKernel::pick(gpu, &s, &qkv, false);
    attention_with(gpu, sink, kernel, qkv, Inputs::F32, None, key_keep, Out::F32(o), None, s)
}

/// Keys a chunk of a carried attention is a multiple of (but the last): the
/// tiled kernel's key tile, a multiple of the matrix kernel's (8 or 16).
pub const ATTENTION_KEY_TILE: u64 = 16;

/// An attention call's part of one over more keys ([`attention_carried`]):
/// whether it continues an earlier call's online softmax and whether it
/// leaves its own for a later one, each (query, head) row's running max and
/// sum in `state` (`[q_len, q_heads, 2]`), the unnormalised output in `o`.
#[derive(Debug, Clone, Copy)]
pub struct Carry<'a> {
    pub state: Mat<'a>,
    pub from_state: bool,
    pub keep_state: bool,
}

impl Carry<'_> {
    fn bits(&self) -> u32 {
        self.from_state as u32 | (self.keep_state as u32) << 1
    }
}

/// Non-causal, unmasked attention on the tiled kernel whatever the device,
/// carrying its online softmax across calls where `carry` says: calls over
/// consecutive chunks of the keys (each a multiple of
/// [`ATTENTION_KEY_TILE`] but the last; the first not from the state, the
/// last not keeping it) give the bits of one call over all of them, and
/// each query's row the bits it has whatever other queries share the call.
/// The banded VAE's mid-block attention, and the whole decode's, so that
/// the two agree.
pub fn attention_carried(gpu: &Gpu, sink: &mut dyn Sink, qkv: Qkv<'_>, o: Mat<'_>, carry: Option<Carry<'_>>, s: Attention) -> Result<(), GpuError> {
    if s.causal {
        return Err(GpuError::UnsupportedShape("a carried attention is non-causal".into()));
    }
    attention_with(gpu, sink, carried_kernel(gpu, s.head_dim), qkv, Inputs::F32, None, None, Out::F32(o), carry, s)
}

/// The kernel a carried attention runs on: the matrix tier's (its wide
/// modules past 128 dims) where the tier has f16 tiles and the head fits,
/// else the tiled one. Either one's key tiles divide
/// [`ATTENTION_KEY_TILE`], so chunks of whole tiles give one call's bits.
fn carried_kernel(gpu: &Gpu, head_dim: u64) -> AttentionKernel {
    let matrix = gpu.matrix().filter(|c| c.operands == MatrixOperands::F16 && head_dim <= ATTENTION_MATRIX_WIDE_MAX_HEAD_DIM);
    match (gpu.attention_choice(), matrix) {
        (AttentionChoice::Launcher | AttentionChoice::Matrix | AttentionChoice::Products, Some(c)) => AttentionKernel::Matrix(c),
        _ => AttentionKernel::Tiled,
    }
}

/// The one-subgroup matrix attention's kernel for heads of `head_dim` on `c`:
/// its wide module past 128 dims.
fn matrix_attention_kernel(c: MatrixConfig, head_dim: u64) -> &'static Kernel {
    match head_dim > ATTENTION_MATRIX_MAX_HEAD_DIM {
        true if c.size == 16 => &ATTENTION_MATRIX_WIDE_16,
        true => &ATTENTION_MATRIX_WIDE_8,
        false => c.pick([&ATTENTION_MATRIX_8, &ATTENTION_MATRIX_16, &ATTENTION_MATRIX_8_F32]),
    }
}

/// The module a carried attention (the VAE's mid-block, a chunk of its
/// keys at a time where it runs by bands) over heads of `head_dim` runs on
/// `gpu`: for reports, which name what an attention row timed.
pub fn carried_attention_module(gpu: &Gpu, head_dim: u64) -> Module {
    match carried_kernel(gpu, head_dim) {
        AttentionKernel::Matrix(c) => matrix_attention_kernel(c, head_dim).module,
        _ => ATTENTION.module,
    }
}

/// [`attention`] writing `o` as the next product's
/// operand: f16 rows in pieces ([`HalfMat::pieces`]), each piece of a
/// query's row divided by its range scale (the range rule's rounding of
/// [`attention`]'s f32 output, not written). On the matrix tier's attention
/// with f16 operands, its pieces within a head.
pub fn attention_into_half(gpu: &Gpu, sink: &mut dyn Sink, qkv: Qkv<'_>, key_keep: Option<&wgpu::Buffer>, o: HalfMat<'_>, s: Attention) -> Result<(), GpuError> {
    let (c, o) = half_output(gpu, o, &s)?;
    attention_with(gpu, sink, matrix_kernel(gpu, c, s.head_dim, o.piece, false), qkv, Inputs::F32, None, key_keep, Out::Half(o), None, s)
}

/// [`attention`] on the flash kernel whatever the device's check found:
/// the check itself ([`crate::probe_flash`]). Fails where the tier has no f16 tiles.
pub(crate) fn flash_attention(gpu: &Gpu, sink: &mut dyn Sink, qkv: Qkv<'_>, o: Mat<'_>, s: Attention) -> Result<(), GpuError> {
    match gpu.matrix().filter(|c| flash_takes(*c, s.head_dim, None)) {
        Some(c) => attention_with(gpu, sink, AttentionKernel::Flash(c), qkv, Inputs::F32, None, None, Out::F32(o), None, s),
        None => Err(GpuError::UnsupportedShape(format!("flash attention needs the matrix tier's f16 tiles and heads of at most {ATTENTION_MATRIX_MAX_HEAD_DIM} (head dim {})", s.head_dim))),
    }
}

/// [`attention_half_into_half`] on the flash kernel whatever the device's
/// check found: the check of the transformer's path ([`crate::probe_flash`]).
pub(crate) fn flash_attention_half(gpu: &Gpu, sink: &mut dyn Sink, qkv: HalfQkv<'_>, o: HalfMat<'_>, s: Attention) -> Result<(), GpuError> {
    let (c, o) = half_output(gpu, o, &s)?;
    if !flash_takes(c, s.head_dim, o.piece) || [qkv.q.piece, qkv.k.piece, qkv.v.piece] != [o.piece; 3] {
        return Err(GpuError::UnsupportedShape(format!("flash attention over f16 pieces {:?} into pieces {:?}, head dim {}", qkv.q.piece, o.piece, s.head_dim)));
    }
    let inputs = Qkv { q: qkv.q.data, k: qkv.k.data, v: qkv.v.data };
    attention_with(gpu, sink, AttentionKernel::Flash(c), inputs, Inputs::Half(qkv), None, None, Out::Half(o), None, s)
}

/// The matrix configuration an attention into f16 pieces runs on, where it can.
fn half_output<'a>(gpu: &Gpu, o: HalfMat<'a>, s: &Attention) -> Result<(MatrixConfig, HalfMat<'a>), GpuError> {
    let matrix = gpu.matrix().filter(|c| c.operands == MatrixOperands::F16 && s.head_dim <= ATTENTION_MATRIX_MAX_HEAD_DIM);
    let piece = o.piece.unwrap_or(0);
    match (matrix, piece > 0 && piece.is_multiple_of(2) && s.head_dim.is_multiple_of(piece)) {
        (Some(c), true) => Ok((c, o)),
        _ => Err(GpuError::UnsupportedShape(format!("attention into f16 pieces of {piece} needs the matrix tier's f16 operands and heads of whole pieces (head dim {})", s.head_dim))),
    }
}

/// What attention reads: f32 queries, keys and values (or the half-K/V
/// layout's, with its [`HalfKvScales`]), or f16 ones in pieces.
#[derive(Clone, Copy)]
enum Inputs<'a> {
    F32,
    Half(HalfQkv<'a>),
}

/// f16 queries, keys and values in pieces ([`HalfMat::pieces`], one piece
/// width), as their projections and the RMSNorm + RoPE write them.
#[derive(Debug, Clone, Copy)]
pub struct HalfQkv<'a> {
    pub q: HalfMat<'a>,
    pub k: HalfMat<'a>,
    pub v: HalfMat<'a>,
}

/// [`attention_into_half`] over f16 queries, keys and values in pieces:
/// each value widened and scaled back where the kernel reads it, the same
/// sums as over the f32 values they stand for.
pub fn attention_half_into_half(gpu: &Gpu, sink: &mut dyn Sink, qkv: HalfQkv<'_>, key_keep: Option<&wgpu::Buffer>, o: HalfMat<'_>, s: Attention) -> Result<(), GpuError> {
    let pieces = [qkv.q.piece, qkv.k.piece, qkv.v.piece];
    let piece = qkv.q.piece.unwrap_or(0);
    if pieces.iter().any(|p| *p != Some(piece)) || piece == 0 || !s.head_dim.is_multiple_of(piece) {
        return Err(GpuError::UnsupportedShape(format!("attention over f16 queries, keys and values in pieces {pieces:?} (one width, whole pieces in a head of {})", s.head_dim)));
    }
    let (c, o) = half_output(gpu, o, &s)?;
    let inputs = Qkv { q: qkv.q.data, k: qkv.k.data, v: qkv.v.data };
    attention_with(gpu, sink, matrix_kernel(gpu, c, s.head_dim, o.piece, true), inputs, Inputs::Half(qkv), None, key_keep, Out::Half(o), None, s)
}

/// Where attention writes: f32 rows, or f16 rows in pieces.
#[derive(Clone, Copy)]
enum Out<'a> {
    F32(Mat<'a>),
    Half(HalfMat<'a>),
}

/// [`attention`] over keys and values in the half-K/V layout (`qkv.k` and
/// `qkv.v` f16 pairs, `scales` their range scales), without masks.
pub fn attention_half_kv(gpu: &Gpu, sink: &mut dyn Sink, qkv: Qkv<'_>, scales: HalfKvScales<'_>, o: Mat<'_>, s: Attention) -> Result<(), GpuError> {
    if !s.head_dim.is_multiple_of(2) || s.causal {
        return Err(GpuError::UnsupportedShape(format!("half-precision keys and values with head dim {} (even, non-causal)", s.head_dim)));
    }
    let kernel = AttentionKernel::pick(gpu, &s, &qkv, true);
    attention_with(gpu, sink, kernel, qkv, Inputs::F32, Some(scales), None, Out::F32(o), None, s)
}

/// [`attention`] on the given kernel.
#[allow(clippy::too_many_arguments)] // attention's operands, and the kernel
fn attention_with(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    kernel: AttentionKernel,
    qkv: Qkv<'_>,
    inputs: Inputs<'_>,
    half: Option<HalfKvScales<'_>>,
    key_keep: Option<&wgpu::Buffer>,
    out: Out<'_>,
    carry: Option<Carry<'_>>,
    s: Attention,
) -> Result<(), GpuError> {
    let Qkv { q, k: kmat, v } = qkv;
    // f16 output: words of two values, the kernel's offset and stride counting values.
    let (o, o_half) = match out {
        Out::F32(o) => (o, None),
        Out::Half(h) => (h.data, Some(h)),
    };
    let o_per_word = if o_half.is_some() { 2 } else { 1 };
    if s.head_dim > ATTENTION_MAX_HEAD_DIM as u64 || s.kv_heads == 0 || !s.q_heads.is_multiple_of(s.kv_heads) {
        return Err(GpuError::UnsupportedShape(format!(
            "attention with {} query heads, {} kv heads, head dim {} (max {})",
            s.q_heads,
            s.kv_heads,
            s.head_dim,
            ATTENTION_MAX_HEAD_DIM
        )));
    }
    if s.q_len == 0 || s.kv_len == 0 {
        return Ok(());
    }
    // f16 keys and values are two a word: their windows count words, the
    // kernel's offsets and strides elements; f16 queries too.
    let half_inputs = match inputs {
        Inputs::Half(h) => Some(h),
        Inputs::F32 => None,
    };
    let per_word = if half.is_some() || half_inputs.is_some() { 2 } else { 1 };
    let q_per_word = if half_inputs.is_some() { 2 } else { 1 };
    // The f16 keys' and values' scales, whole; the queries', by the rows of each piece.
    let kv_scale_windows = match half_inputs {
        Some(h) => {
            let per_row = s.kv_heads * s.head_dim / h.k.piece.unwrap_or(1);
            let ks = Rows::mat(h.k.scales, per_row, "attention key scales").window(gpu, &(0..s.kv_len))?;
            let vs = Rows::mat(h.v.scales, per_row, "attention value scales").window(gpu, &(0..s.kv_len))?;
            Some((ks, vs))
        }
        None => None,
    };
    let q_scale_rows = half_inputs.map(|h| Rows::mat(h.q.scales, s.q_heads * s.head_dim / h.q.piece.unwrap_or(1), "attention query scales"));
    let kw = Rows::mat(kmat, s.kv_heads * s.head_dim / per_word, "attention keys").window(gpu, &(0..s.kv_len))?;
    let vw = Rows::mat(v, s.kv_heads * s.head_dim / per_word, "attention values").window(gpu, &(0..s.kv_len))?;
    let scale_windows = match half {
        Some(h) => {
            if h.k.stride != s.kv_heads || h.v.stride != s.kv_heads {
                return Err(GpuError::UnsupportedShape(format!("key and value scales {}/{} a row for {} kv heads", h.k.stride, h.v.stride, s.kv_heads)));
            }
            let ks = Rows::mat(h.k, s.kv_heads, "attention key scales").window(gpu, &(0..s.kv_len))?;
            let vs = Rows::mat(h.v, s.kv_heads, "attention value scales").window(gpu, &(0..s.kv_len))?;
            Some((ks, vs))
        }
        None => None,
    };
    let scale_offsets = scale_windows.as_ref().or(kv_scale_windows.as_ref()).map_or((0, 0), |(k, v)| (k.local, v.local));
    let mw = match key_keep {
        Some(m) => window(gpu, m, 4, 0..s.kv_len, "attention mask")?,
        None => placeholder_window(gpu)?,
    };
    let q_rows = Rows::mat(q, s.q_heads * s.head_dim / q_per_word, "attention queries");
    let o_rows = Rows::mat(o, s.q_heads * s.head_dim / o_per_word, "attention output");
    let o_scale_rows = o_half.map(|h| Rows::mat(h.scales, s.q_heads * s.head_dim / h.piece.unwrap_or(1), "attention output scales"));
    let state_rows = carry.map(|c| Rows { buf: c.state.buf, elem_bytes: 4, offset: c.state.offset, stride: 2 * s.q_heads, width: 2 * s.q_heads, what: "attention state" });
    let per_group = kernel.queries_per_group();
    let operands: Vec<Rows<'_>> = [q_rows, o_rows].into_iter().chain(state_rows).chain(o_scale_rows).chain(q_scale_rows).collect();
    for rows in row_chunks(gpu, s.q_len, &operands, per_group)? {
        let qw = q_rows.window(gpu, &rows)?;
        let ow = o_rows.window(gpu, &rows)?;
        let osw = match &o_scale_rows {
            Some(r) => Some(r.window(gpu, &rows)?),
            None => None,
        };
        let qsw = match &q_scale_rows {
            Some(r) => Some(r.window(gpu, &rows)?),
            None => None,
        };
        // Without a carried state the binding takes the output's window, unused.
        let state_w = match &state_rows {
            Some(l) => l.window(gpu, &rows)?,
            None => o_rows.window(gpu, &rows)?,
        };
        let params = AttentionParams {
            q_len: to_u32(rows.end - rows.start, "attention queries")?,
            kv_len: to_u32(s.kv_len, "attention keys")?,
            q_heads: to_u32(s.q_heads, "attention heads")?,
            kv_heads: to_u32(s.kv_heads, "attention kv heads")?,
            head_dim: s.head_dim as u32,
            q_offset: qw.local * q_per_word as u32,
            q_stride: to_u32(q.stride * q_per_word, "attention q stride")?,
            k_offset: kw.local * per_word as u32,
            k_stride: to_u32(kmat.stride * per_word, "attention k stride")?,
            v_offset: vw.local * per_word as u32,
            v_stride: to_u32(v.stride * per_word, "attention v stride")?,
            o_offset: ow.local * o_per_word as u32,
            o_stride: to_u32(o.stride * o_per_word, "attention o stride")?,
            scale: s.scale,
            causal: s.causal as u32,
            use_mask: key_keep.is_some() as u32,
            mask_offset: mw.local,
            q_position: to_u32(rows.start, "attention query position")?,
            state_offset: state_w.local,
            carry: carry.map_or(0, |c| c.bits()),
            k_scale_offset: scale_offsets.0,
            v_scale_offset: scale_offsets.1,
            o_scale_offset: osw.as_ref().map_or(0, |w| w.local),
            o_scale_stride: to_u32(o_half.map_or(0, |h| h.scales.stride), "attention output scales' stride")?,
            q_scale_offset: qsw.as_ref().map_or(0, |w| w.local),
            q_scale_stride: to_u32(half_inputs.map_or(0, |h| h.q.scales.stride), "attention query scales' stride")?,
            k_scale_stride: to_u32(half_inputs.map_or(0, |h| h.k.scales.stride), "attention key scales' stride")?,
            v_scale_stride: to_u32(half_inputs.map_or(0, |h| h.v.scales.stride), "attention value scales' stride")?,
            qkv_piece: to_u32(half_inputs.and_then(|h| h.q.piece).unwrap_or(0), "attention input piece")?,
            _pad: [0; 3],
        };
        let grid = [to_u32((rows.end - rows.start).div_ceil(per_group), "attention query blocks")?, s.q_heads as u32, 1];
        let bindings = [(1, &qw), (2, &kw), (3, &vw), (4, &mw), (5, &ow)];
        // Half-precision keys and values: their scales at bindings 10 and 11.
        let scale_bindings: Vec<(u32, &_)> = scale_windows.iter().flat_map(|(ks, vs)| [(10, ks), (11, vs)]).collect();
        // The matrix tier's kernels share their bindings: without f16 output,
        // 12 and 13 take the output's window, unwritten; without f16 inputs
        // 14–19 the inputs' own, unread.
        let out_piece = match o_half {
            Some(h) => Some(to_u32(h.piece.unwrap_or(64), "attention output piece")?),
            None => None,
        };
        let matrix_dispatch = |sink: &mut dyn Sink, kernel: &Kernel, wg: u32, grid: [u32; 3], state: &[(u32, &_)], more: &[(&'static str, u32)]| -> Result<(), GpuError> {
            let constants = [&[("WG", wg), ("O_HALF", o_half.is_some() as u32), ("O_PIECE", out_piece.unwrap_or(64)), ("QKV_HALF", half_inputs.is_some() as u32)][..], more].concat();
            let launch = Launch { kernel, constants: &constants, params, grid };
            let (ksw, vsw) = match &kv_scale_windows {
                Some((k, v)) => (k, v),
                None => (&kw, &vw),
            };
            let half_bindings = [(14, &qw), (15, &kw), (16, &vw), (17, qsw.as_ref().unwrap_or(&qw)), (18, ksw), (19, vsw)];
            dispatch(gpu, sink, launch, &[&bindings[..], state, &[(12, &ow), (13, osw.as_ref().unwrap_or(&ow))], &half_bindings].concat());
            Ok(())
        };
        match kernel {
            AttentionKernel::Tiled => {
                let kernel = if half.is_some() { &ATTENTION_HALF_KV } else { &ATTENTION };
                let launch = Launch { kernel, constants: &[("SLOTS", s.head_dim.div_ceil(64).max(1) as u32)], params, grid };
                dispatch(gpu, sink, launch, &[&bindings[..], &[(6, &state_w)], &scale_bindings].concat());
            }
            AttentionKernel::Lanes { wide, shared_rows } => {
                // q, k and v bound again at 7–9, as the vec4 views the kernel reads.
                // Where the subgroup's lanes can share each row, the kernel
                // that reads them once a subgroup.
                let kernel = &match (shared_rows, wide, half.is_some()) {
                    (Some(lanes), _, half) => lanes_kernel(lanes, half, s.head_dim),
                    (None, false, false) => ATTENTION_CPU,
                    (None, true, false) => ATTENTION_CPU_WIDE,
                    (None, false, true) => ATTENTION_CPU_HALF_KV,
                    (None, true, true) => ATTENTION_CPU_WIDE_HALF_KV,
                };
                let launch = Launch { kernel, constants: &[("HEAD_VEC4", (s.head_dim / 4) as u32)], params, grid };
                dispatch(gpu, sink, launch, &[&[(4, &mw), (5, &ow), (7, &qw), (8, &kw), (9, &vw)][..], &scale_bindings].concat());
            }
            AttentionKernel::Matrix(c) => {
                let wide = s.head_dim > ATTENTION_MATRIX_MAX_HEAD_DIM;
                let kernel = matrix_attention_kernel(c, s.head_dim);
                let max_dim = if wide { ATTENTION_MATRIX_WIDE_MAX_HEAD_DIM } else { ATTENTION_MATRIX_MAX_HEAD_DIM } as u32;
                // A call that both reads and keeps the carried state runs
                // whole: split, one workgroup would write the state that
                // another of the same queries reads.
                let carried_through = carry.is_some_and(|c| c.from_state && c.keep_state);
                let o_dims = match carried_through {
                    true => max_dim,
                    false => matrix_attention_output_dims(c, max_dim, gpu.limits.max_compute_workgroup_storage_size, out_piece),
                };
                let z = to_u32(s.head_dim.div_ceil(o_dims as u64), "attention output dims")?;
                matrix_dispatch(sink, kernel, c.subgroup, [grid[0], grid[1], z], &[(6, &state_w)], &[("O_DIMS", o_dims)])?;
            }
            AttentionKernel::Flash(c) => {
                let kernel = if c.size == 16 { &ATTENTION_FLASH_16 } else { &ATTENTION_FLASH_8 };
                let z = to_u32(s.head_dim.div_ceil(flash_output_dims(c)), "attention output dims")?;
                matrix_dispatch(sink, kernel, c.subgroup * flash_subgroups(c) as u32, [grid[0], grid[1], z], &[(20, &qw), (21, &kw), (22, &vw)], &[])?;
            }
        }
    }
    Ok(())
}


#[cfg(test)]
mod tests;
