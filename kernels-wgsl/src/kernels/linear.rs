//! Linear layers: `y = x·Wᵀ (+ b)` on the shared 128×128 GEMM tiling
//! (`gemm_tiles.wgsl`, also used by `conv`).
//! Shader: `linear.wgsl` beside this file.

use crate::kernel::{kernel, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::device::Gpu;
use crate::dispatch::{chunks, dispatch, placeholder_window, rows_per_chunk, to_u32, window, Launch, Rows, Sink, Window};
use crate::error::GpuError;
use crate::view::{HalfMat, Mat, Weight, WeightDtype};
use bytemuck::{Pod, Zeroable};
use crate::kernel::{wrapped_grid, MAX_GRID_DIM};
use crate::precision::{MatrixConfig, MatrixOperands, Precision};
use crate::kernels::linear_lanes::{COLS_PER_GROUP, ROWS as LANES_ROWS};

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
    /// The matrix tier's: where x's and W's row scales start in its scales buffer.
    pub x_scales: u32,
    pub w_scales: u32,
    /// A gated product's: where its gate's first column is.
    pub gate_offset: u32,
    /// A SwiGLU product's: W's rows from an output's gate row to its up row.
    pub up_row: u32,
    /// x's in pieces ([`HalfMat::piece`]): its scales from one row to the next.
    pub x_scales_stride: u32,
    /// A SwiGLU product into f16 pieces ([`linear_swiglu_half`]): where y's
    /// scales start, and from one row to the next.
    pub y_scales: u32,
    pub y_scales_stride: u32,
    /// A product norming heads in its epilogue ([`HeadNorm`]): this call's
    /// first output column of the product, the columns each norm weight
    /// norms, where the weights and the RoPE tables' rows start, and ε.
    pub head_col0: u32,
    pub head_first: u32,
    pub head_cols: u32,
    pub norm_first: u32,
    pub norm_second: u32,
    pub table_offset: u32,
    pub head_eps: f32,
    /// A stacked product's ([`linear_stacked`]): x's rows in stacks of
    /// this many, this call's first row of the whole, the stacks sharing
    /// one W and the first stack's place among them.
    pub stack_rows: u32,
    pub row_base: u32,
    pub stack_group: u32,
    pub stack_skew: u32,
    /// A product whose outputs go out as an attention's probabilities
    /// ([`linear_softmax`]): a score's factor to its base-2 exponent, the
    /// query of this call's row 0, the key of its column 0, and where the
    /// key mask starts.
    pub softmax_scale: f32,
    pub q_first: u32,
    pub k_first: u32,
    pub keep_offset: u32,
    pub _pad: u32,
}

/// Output tile (rows × cols) of one `linear` or `conv2d` workgroup (gemm_tiles.wgsl).
pub const GEMM_TILE: [u32; 2] = [128, 128];

pub const LINEAR: Kernel =
    kernel(Module::Linear, "linear", [16, 16, 1], &[(1, RW), (2, R), (3, R), (4, RW), (11, RW)], size_of::<LinearParams>(), true);
/// The f16 tier's linear: `linear.wgsl` on f16-staged tiles.
pub const LINEAR_HALF: Kernel = Kernel { module: Module::LinearHalf, ..LINEAR };
/// The matrix tier's linear (`linear_matrix.wgsl`), one module per tile size;
/// its workgroup is four subgroups, set by the `WG` override (hence size 0
/// here). y at 4 and 12 (f32 or f16) and again as vec4s at 14 and 15; a
/// [`HeadNorm`]'s weights at 16 and 17 and RoPE tables at 18 and 19.
pub const LINEAR_MATRIX_8: Kernel = kernel(
    Module::LinearMatrix8,
    "linear_matrix",
    [0, 1, 1],
    &[(1, RW), (2, R), (3, R), (4, RW), (5, R), (8, R), (9, RW), (10, RW), (11, RW), (12, RW), (13, RW), (14, RW), (15, RW), (16, R), (17, R), (18, R), (19, R)],
    size_of::<LinearParams>(),
    true,
);
pub const LINEAR_MATRIX_16: Kernel = Kernel { module: Module::LinearMatrix16, ..LINEAR_MATRIX_8 };
pub const LINEAR_MATRIX_8_F32: Kernel = Kernel { module: Module::LinearMatrix8F32, ..LINEAR_MATRIX_8 };
/// The same reading x and bf16 W as vec4s at bindings 6 and 7
/// (`linear_matrix_vec4.wgsl`), where their windows are whole vec4s, and
/// x's f16 rows and W's packed words as vec4s of f16 at 20 and 21
/// (`linear_half_quads.wgsl`; W's words also at 7).
pub const LINEAR_MATRIX_8_VEC4: Kernel = kernel(
    Module::LinearMatrix8Vec4,
    "linear_matrix",
    [0, 1, 1],
    &[(3, R), (4, RW), (5, R), (6, RW), (7, R), (8, R), (10, RW), (11, RW), (12, RW), (13, RW), (14, RW), (15, RW), (16, R), (17, R), (18, R), (19, R), (20, RW), (21, R)],
    size_of::<LinearParams>(),
    true,
);
pub const LINEAR_MATRIX_16_VEC4: Kernel = Kernel { module: Module::LinearMatrix16Vec4, ..LINEAR_MATRIX_8_VEC4 };
pub const LINEAR_MATRIX_8_F32_VEC4: Kernel = Kernel { module: Module::LinearMatrix8F32Vec4, ..LINEAR_MATRIX_8_VEC4 };

/// CPU adapters' linear on the f32 tier (`linear_lanes.rs`), written for
/// subgroups of 8 here and of [`Gpu::cpu_lanes`] where launched: x and W
/// read as vec4s at bindings 6 and 7.
pub const LINEAR_LANES: Kernel =
    kernel(Module::LinearLanes { lanes: 8 }, "linear_lanes", [64, 1, 1], &[(3, R), (4, RW), (6, RW), (7, R), (11, RW)], size_of::<LinearParams>(), true);

/// Tiles per side of the matrix linear's block (matrix_gemm.wgsl: 2 × 2
/// subgroups of 4 × 4 tiles): a workgroup computes 8T × 8T outputs.
pub const MATRIX_BLOCK_TILES: u64 = 8;
/// Subgroups in one workgroup of the matrix linear (`SUBGROUPS` in matrix_gemm.wgsl).
pub const MATRIX_SUBGROUPS: u32 = 4;

/// The sizes of one matrix product `[m, k]·[k, n]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    pub m: u64,
    pub n: u64,
    pub k: u64,
}

/// Terms of each output's sum: `k`, or one fewer where the device's options
/// inject a short linear ([`crate::FaultInjection::short_linear`]).
fn terms(gpu: &Gpu, k: u64) -> u64 {
    #[cfg(any(test, feature = "test-support"))]
    if gpu.faults().short_linear {
        return k.saturating_sub(1);
    }
    let _ = gpu;
    k
}

/// `y[m, n] = x[m, k]·W[n, k]ᵀ (+ b[n])`, W contiguous `[n, k]`; split over
/// rows of x and rows of W where one binding cannot hold them. On the matrix
/// tier it runs on cooperative-matrix tiles ([`LINEAR_MATRIX_8`], [`LINEAR_MATRIX_16`]).
pub fn linear(gpu: &Gpu, sink: &mut dyn Sink, x: Mat<'_>, w: Weight<'_>, bias: Option<Weight<'_>>, y: Mat<'_>, s: Gemm) -> Result<(), GpuError> {
    product(gpu, sink, Input::F32(x), w, bias, y, s, None, Out::Set)
}

/// What a product does with each output.
#[derive(Debug, Clone, Copy)]
enum Out<'a> {
    /// `y = value`.
    Set,
    /// `y += value`.
    Accumulate,
    /// `y += gate[c]·value`, the gate one row.
    Gated(Mat<'a>),
    /// `y = factor[r]·y + value`, a factor a row.
    RowScaled(Mat<'a>),
    /// `y[c] = silu(value of W's row c)·(value of W's row n + c)`.
    SwiGlu,
    /// The same into f16 rows in pieces: `y` their words, these their scales.
    SwiGluHalf { scales: Mat<'a>, piece: u64 },
    /// `y = value` as f16 rows in pieces: `y` their words, these their
    /// scales; with a [`HeadNorm`], its columns normed and rotated first.
    SetHalf { scales: Mat<'a>, piece: u64, norm: Option<HeadNorm<'a>> },
    /// An attention's scores as probabilities in f16 pieces ([`linear_softmax`]):
    /// `y` their words, these each piece's exponent and sum.
    Softmax { exponents: Mat<'a>, sums: Mat<'a>, scores: Scores<'a> },
}

/// `stream[m, n] += gate[n] ⊙ (x[m, k]·W[n, k]ᵀ (+ b[n]))`: a linear whose
/// gated residual runs in its epilogue, the same bits as [`linear_from`]
/// into a scratch and the element-wise gated residual after it, without
/// the scratch's write and read.
#[allow(clippy::too_many_arguments)] // the linear's operands, the stream and its gate
pub fn linear_gated(gpu: &Gpu, sink: &mut dyn Sink, x: Input<'_>, w: Weight<'_>, bias: Option<Weight<'_>>, stream: Mat<'_>, gate: Mat<'_>, s: Gemm) -> Result<(), GpuError> {
    product(gpu, sink, x, w, bias, stream, s, None, Out::Gated(gate))
}

/// `y[m, n] = silu(x·W[0 .. n]ᵀ) ⊙ (x·W[n .. 2n]ᵀ)`, W `[2n, k]`: the
/// feed-forward's gate and up projections and its SwiGLU in one product,
/// each output's two sums held by one invocation (or one workgroup) and
/// combined in the epilogue with the element-wise SwiGLU's arithmetic, so
/// the same bits as [`linear_from`] into a `[m, 2n]` scratch and
/// `Elementwise::SwiGlu` after it, without the scratch. Needs W's `2n` rows
/// in one binding ([`swiglu_fits`]).
pub fn linear_swiglu(gpu: &Gpu, sink: &mut dyn Sink, x: Input<'_>, w: Weight<'_>, y: Mat<'_>, s: Gemm) -> Result<(), GpuError> {
    product(gpu, sink, x, w, None, y, s, None, Out::SwiGlu)
}

/// [`linear_swiglu`] into f16 rows in pieces ([`HalfMat::pieces`]): each
/// row's outputs in pieces of `piece` values, each piece divided by its
/// range scale as the next product's operand (the range rule's rounding of
/// [`linear_swiglu`]'s f32 values), without the f32 values' write and read.
/// On the matrix tier with f16 operands only, where a workgroup's block of
/// outputs (4 tiles wide) holds whole pieces, at most 4 ([`swiglu_writes_pieces`]),
/// the outputs even.
pub fn linear_swiglu_half(gpu: &Gpu, sink: &mut dyn Sink, x: Input<'_>, w: Weight<'_>, y: HalfMat<'_>, s: Gemm) -> Result<(), GpuError> {
    let piece = half_out_piece(gpu, y, s, true)?;
    product(gpu, sink, x, w, None, y.data, s, None, Out::SwiGluHalf { scales: y.scales, piece })
}

/// [`linear_from`] without bias into f16 rows in pieces
/// ([`HalfMat::pieces`]): each piece of a row divided by its range scale
/// (the range rule's rounding of [`linear_from`]'s f32 outputs, not
/// written), as the queries', keys' and values' projections write them for
/// the ops after. Where [`product_writes_pieces`].
pub fn linear_into_half(gpu: &Gpu, sink: &mut dyn Sink, x: Input<'_>, w: Weight<'_>, y: HalfMat<'_>, s: Gemm) -> Result<(), GpuError> {
    let piece = half_out_piece(gpu, y, s, false)?;
    product(gpu, sink, x, w, None, y.data, s, None, Out::SetHalf { scales: y.scales, piece, norm: None })
}

/// [`linear_into_half`] with the queries' and keys' per-head RMSNorm and
/// interleaved RoPE in its epilogue ([`HeadNorm`]): each head's outputs
/// normed and rotated before they are rounded to f16 in pieces, without the
/// norm's pass over them. Where [`product_norms_heads`].
pub fn linear_into_half_normed(gpu: &Gpu, sink: &mut dyn Sink, x: Input<'_>, w: Weight<'_>, y: HalfMat<'_>, norm: HeadNorm<'_>, s: Gemm) -> Result<(), GpuError> {
    let piece = half_out_piece(gpu, y, s, false)?;
    norm.check(gpu, piece, s)?;
    product(gpu, sink, x, w, None, y.data, s, None, Out::SetHalf { scales: y.scales, piece, norm: Some(norm) })
}

/// The piece of a product's f16 output in pieces, where `gpu` writes it.
fn half_out_piece(gpu: &Gpu, y: HalfMat<'_>, s: Gemm, swiglu: bool) -> Result<u64, GpuError> {
    match y.piece {
        Some(piece) if product_writes_pieces(gpu, piece, swiglu) && s.n.is_multiple_of(2) => Ok(piece),
        piece => Err(GpuError::UnsupportedShape(format!(
            "a product into f16 pieces of {piece:?} needs the matrix tier's f16 operands with a block of whole pieces (at most 4), and even outputs ({})",
            s.n
        ))),
    }
}

/// Whether [`linear_swiglu_half`] writes pieces of `piece` values on `gpu`
/// ([`product_writes_pieces`] of a SwiGLU product).
pub fn swiglu_writes_pieces(gpu: &Gpu, piece: u64) -> bool {
    product_writes_pieces(gpu, piece, true)
}

/// Whether a matrix product writes its outputs as f16 rows in pieces of
/// `piece` values on `gpu`: f16 matrix operands whose block's outputs (8
/// tiles wide, 4 with SwiGLU's pairs) are 1, 2 or 4 whole pieces
/// (matrix_gemm.wgsl's MAX_BLOCK_PIECES) of an even width.
pub fn product_writes_pieces(gpu: &Gpu, piece: u64, swiglu: bool) -> bool {
    let fits = |block: u64| piece > 0 && piece.is_multiple_of(2) && block.is_multiple_of(piece) && block / piece <= 4;
    let outputs = |size: u64| size * MATRIX_BLOCK_TILES / if swiglu { 2 } else { 1 };
    gpu.matrix().is_some_and(|c| c.operands == MatrixOperands::F16 && fits(outputs(c.size as u64)))
}

/// Whether [`linear_swiglu`] can run over `w` on `gpu`: its `2n` rows in one
/// binding, and on the matrix tier their scales within the range scales'
/// share for a product's weight rows.
pub fn swiglu_fits(gpu: &Gpu, w: Weight<'_>, s: Gemm) -> bool {
    let w_rows = Rows::packed(w.buf, w.dtype.bytes(), w.offset, s.k, "linear weight");
    let fits = rows_per_chunk(gpu, 2 * s.n, &[w_rows], 1).is_ok_and(|rows| rows >= 2 * s.n);
    fits && (gpu.matrix().is_none() || 2 * s.n <= RANGE_SCALES_ROWS)
}

/// A product's input rows: f32, or f16 under their range scales as the op
/// before wrote them (the matrix tier's half-precision data path, with f16
/// operands only).
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    F32(Mat<'a>),
    Half(HalfMat<'a>),
}

/// [`linear`] over an [`Input`]: on [`Input::Half`] the product reads the
/// rows and their scales as they are (no pass measures x); the same sums as
/// [`linear`] over the f32 values they stand for, where those would take
/// those scales.
pub fn linear_from(gpu: &Gpu, sink: &mut dyn Sink, x: Input<'_>, w: Weight<'_>, bias: Option<Weight<'_>>, y: Mat<'_>, s: Gemm) -> Result<(), GpuError> {
    product(gpu, sink, x, w, bias, y, s, None, Out::Set)
}

/// `y[m, n] += x[m, k]·W[n, k]ᵀ`: [`linear`] adding onto what `y` holds (a
/// LoRA adapter's up product onto the base linear's output, as PEFT adds it).
pub fn linear_add(gpu: &Gpu, sink: &mut dyn Sink, x: Mat<'_>, w: Weight<'_>, y: Mat<'_>, s: Gemm) -> Result<(), GpuError> {
    product(gpu, sink, Input::F32(x), w, None, y, s, None, Out::Accumulate)
}

/// `y[m, n] = factor[m]·y + x·Wᵀ` over an [`Input`]: the old output
/// rescaled by a factor a row (`factors`, one f32 a row) as the product
/// joins it, one fma an output (the chunked attention's `P·V` of a later
/// chunk of keys onto the output so far, rescaled by each row's softmax).
pub fn linear_rescaling(gpu: &Gpu, sink: &mut dyn Sink, x: Input<'_>, w: Weight<'_>, y: Mat<'_>, factors: Mat<'_>, s: Gemm) -> Result<(), GpuError> {
    product(gpu, sink, x, w, None, y, s, None, Out::RowScaled(factors))
}

/// x's `m` rows as `count` stacks of `rows` rows, `group` stacks at a time
/// multiplied by one W of `n` rows (stack `i` by W's rows `w·n … w·n + n −
/// 1`, `w = (i + skew) / group`: grouped attention heads sharing their
/// values, the first stack `skew` heads into its group): [`linear_stacked`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stack {
    pub rows: u64,
    pub count: u64,
    pub group: u64,
    pub skew: u64,
}

impl Stack {
    /// Each stack on its own W.
    pub fn apart(rows: u64, count: u64) -> Self {
        Stack { rows, count, group: 1, skew: 0 }
    }

    /// W's rows the stacks read: `n` for each W.
    fn w_rows(&self, n: u64) -> u64 {
        ((self.count - 1 + self.skew) / self.group + 1) * n
    }
}

/// `y[r] = x[r]·W_iᵀ` for each row `r` of stack `i` ([`Stack`]), onto `y`
/// rescaled by a factor a row where `factors` gives them (as
/// [`linear_rescaling`]), in one dispatch on the matrix tier: each stack's
/// rows the bits [`linear_from`] gives them over that stack's W alone. A
/// stack is whole blocks of the GEMM core (its rows a multiple of 128).
/// The attention on products' `P·V` over a stack of heads.
#[allow(clippy::too_many_arguments)] // the linear's operands, the factors and the stacks
pub fn linear_stacked(gpu: &Gpu, sink: &mut dyn Sink, x: Input<'_>, w: Weight<'_>, y: Mat<'_>, factors: Option<Mat<'_>>, s: Gemm, stack: Stack) -> Result<(), GpuError> {
    let out = factors.map_or(Out::Set, Out::RowScaled);
    product(gpu, sink, x, w, None, y, s, Some(stack), out)
}

#[allow(clippy::too_many_arguments)] // linear's operands, its stacks, and what each output does to y
fn product(gpu: &Gpu, sink: &mut dyn Sink, input: Input<'_>, w: Weight<'_>, bias: Option<Weight<'_>>, y: Mat<'_>, s: Gemm, stack: Option<Stack>, out: Out<'_>) -> Result<(), GpuError> {
    let accumulate = matches!(out, Out::Accumulate);
    let swiglu = matches!(out, Out::SwiGlu | Out::SwiGluHalf { .. });
    // y's f16 words and their scales' rows (a scale a piece).
    let (half_out, out_piece) = match out {
        Out::SwiGluHalf { scales, piece } | Out::SetHalf { scales, piece, .. } => (Some(Rows::mat(scales, s.n.div_ceil(piece), "linear output scales")), Some(piece)),
        Out::Softmax { exponents, .. } => (Some(Rows::mat(exponents, s.n.div_ceil(PROBABILITY_PIECE), "attention probabilities' exponents")), Some(PROBABILITY_PIECE)),
        _ => (None, None),
    };
    let scores = match out {
        Out::Softmax { scores, .. } => Some(scores),
        _ => None,
    };
    let out_per_word = if half_out.is_some() { 2 } else { 1 };
    let gate = match out {
        Out::Gated(g) => Some(g),
        _ => None,
    };
    // Rows of one value, or of a value a piece, at binding 11.
    let row_factors = match out {
        Out::RowScaled(f) => Some(Rows::mat(f, 1, "linear row factors")),
        Out::Softmax { sums, .. } => Some(Rows::mat(sums, s.n.div_ceil(PROBABILITY_PIECE), "attention probabilities' sums")),
        _ => None,
    };
    let norm = match out {
        Out::SetHalf { norm, .. } => norm,
        _ => None,
    };
    let Gemm { m, n, k: kdim } = s;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let matrix = gpu.matrix();
    // f16 rows: words of two values, x's offset and stride counted in values
    // by the kernel; their scales one a row, or one a piece.
    let (x, half, piece) = match input {
        Input::F32(x) => (x, None, None),
        Input::Half(h) => {
            if !matrix.is_some_and(|c| c.operands == MatrixOperands::F16) || !kdim.is_multiple_of(2) {
                return Err(GpuError::UnsupportedShape(format!("a product over f16 rows of {kdim} values needs the matrix tier's f16 operands and an even k")));
            }
            // Pieces of whole vec4s, so a vec4 of x lies in one piece.
            if h.piece.is_some_and(|p| p == 0 || !p.is_multiple_of(4)) {
                return Err(GpuError::UnsupportedShape(format!("f16 rows in pieces of {:?} values (whole vec4s)", h.piece)));
            }
            let per_row = h.piece.map_or(1, |p| kdim.div_ceil(p));
            (h.data, Some(Rows::mat(h.scales, per_row, "linear input scales")), h.piece)
        }
    };
    let per_word = if half.is_some() { 2 } else { 1 };
    let [tile_m, tile_n] = match matrix {
        Some(c) => [c.size as u64 * MATRIX_BLOCK_TILES; 2],
        None => GEMM_TILE.map(u64::from),
    };
    let eb = w.dtype.bytes();
    let w_rows = Rows::packed(w.buf, eb, w.offset, kdim, "linear weight");
    // The matrix tier measures each piece's rows into the range scales,
    // whose size the planner allows for (RANGE_SCALES_ROWS per operand).
    let cap = if matrix.is_some() { RANGE_SCALES_ROWS } else { u64::MAX };
    let n_chunk = match swiglu {
        // One piece: each output needs W's rows n apart.
        true if swiglu_fits(gpu, w, s) => n,
        true => return Err(GpuError::UnsupportedShape(format!("a SwiGLU product over {} rows of {kdim} needs them in one binding", 2 * n))),
        false => rows_per_chunk(gpu, n, &[w_rows], tile_n)?.min(cap),
    };
    // Stacks: on the matrix tier, each whole blocks, every W's rows in one binding.
    if let Some(st) = stack {
        let whole = matrix.is_some() && !swiglu && st.rows > 0 && st.rows.is_multiple_of(tile_m) && st.count > 0 && m <= st.rows * st.count && st.group > 0 && st.skew < st.group;
        if !whole || rows_per_chunk(gpu, st.w_rows(n), &[w_rows], 1)? < st.w_rows(n) || st.w_rows(n) > cap {
            return Err(GpuError::UnsupportedShape(format!("a product over {m} rows in {} stacks of {} on {} rows of W each", st.count, st.rows, n)));
        }
    }
    // The kernel's columns: with SwiGLU each output's gate and up sums.
    let spans = if swiglu { 2 } else { 1 };
    let x_rows = Rows::mat(x, kdim / per_word, "linear input");
    let operands: Vec<Rows<'_>> = [x_rows].into_iter().chain(half).collect();
    let y_rows = Rows::mat(y, n_chunk.min(n).div_ceil(out_per_word), "linear output");
    let tables = norm.map(|n| n.table_rows());
    let row_operands: Vec<Rows<'_>> = operands.iter().copied().chain([y_rows]).chain(half_out).chain(row_factors).chain(tables.into_iter().flatten()).collect();
    for rows in chunks(m, rows_per_chunk(gpu, m, &row_operands, tile_m)?.min(cap)) {
        let xw = x_rows.window(gpu, &rows)?;
        let x_scales = match half {
            Some(h) => Some(h.window(gpu, &rows)?),
            None => None,
        };
        // x's offset and row stride in values, as the kernel counts them.
        let (x_at, x_stride) = (xw.local as u64 * per_word, x.stride * per_word);
        for cols in chunks(n, n_chunk) {
            // W's rows the kernel's columns read: with SwiGLU, from the
            // piece's first gate row to its last up row.
            let w_rows_read = match stack {
                Some(st) => 0..st.w_rows(n),
                None => cols.start..cols.end + if swiglu { n } else { 0 },
            };
            let ww = w_rows.window(gpu, &w_rows_read)?;
            // bf16 rows starting on even elements load as whole u32 pairs.
            let paired = ww.local.is_multiple_of(2) && kdim.is_multiple_of(2);
            let (rows_n, cols_n) = (rows.end - rows.start, cols.end - cols.start);
            let w_read = w_rows_read.end - w_rows_read.start;
            let yw = Rows { offset: y.offset + cols.start / out_per_word, width: (cols.end - cols.start).div_ceil(out_per_word), ..y_rows }.window(gpu, &rows)?;
            // y's rows as vec4s of outputs (the matrix kernel's bindings 14
            // and 15): its window and row stride whole vec4s, a row at least
            // one; else an unused buffer there.
            let y_vec4 = stores_vec4s(yw.local as u64 * out_per_word, y.stride * out_per_word, cols_n);
            let yw_vec4 = if y_vec4 { yw.clone() } else { window(gpu, gpu.unused_writable(), 4, 0..4, "unused output")? };
            // On a CPU adapter whose subgroups can share x's rows, where the
            // operands' rows start on whole vec4s: the lanes kernel.
            let vec4s = |elems: u64| (xw.local as u64).is_multiple_of(4) && x.stride.is_multiple_of(4) && (ww.local as u64).is_multiple_of(elems) && kdim.is_multiple_of(8);
            let row_groups = rows_n.div_ceil(LANES_ROWS as u64);
            let lanes = gpu
                .cpu_lanes()
                .filter(|_| matrix.is_none() && gpu.precision() == Precision::F32 && vec4s(if eb == 2 { 8 } else { 4 }) && row_groups <= MAX_GRID_DIM as u64);
            let (kernel, constants, grid) = match (matrix, lanes) {
                (None, Some(l)) => {
                    let constants = vec![("WEIGHT_BF16", w.dtype.constant()), ("HAS_BIAS", bias.is_some() as u32), ("ACCUMULATE", accumulate as u32), ("GATED", gate.is_some() as u32), ("ROW_SCALED", row_factors.is_some() as u32), ("SWIGLU", swiglu as u32)];
                    let lanes_kernel = Kernel { module: Module::LinearLanes { lanes: l as u8 }, ..LINEAR_LANES };
                    (lanes_kernel, constants, [row_groups as u32, (spans * cols_n).div_ceil(COLS_PER_GROUP as u64) as u32, 1])
                }
                (None, None) => {
                    let constants = vec![("WEIGHT_BF16", w.dtype.constant()), ("HAS_BIAS", bias.is_some() as u32), ("ACCUMULATE", accumulate as u32), ("GATED", gate.is_some() as u32), ("ROW_SCALED", row_factors.is_some() as u32), ("SWIGLU", swiglu as u32), ("W_PAIRED", paired as u32)];
                    let kernel = if gpu.precision() == Precision::F16 { LINEAR_HALF } else { LINEAR };
                    (kernel, constants, [(spans * cols_n).div_ceil(tile_n) as u32, rows_n.div_ceil(tile_m) as u32, 1])
                }
                (Some(c), _) => {
                    let mut constants = vec![
                        ("WEIGHT_BF16", w.dtype.constant()),
                        ("HAS_BIAS", bias.is_some() as u32),
                        ("ACCUMULATE", accumulate as u32),
                        ("GATED", gate.is_some() as u32), ("ROW_SCALED", row_factors.is_some() as u32),
                        ("SWIGLU", swiglu as u32),
                        ("WG", c.subgroup * MATRIX_SUBGROUPS),
                        ("B_PAIRED", matrix_b_paired(c, w.dtype, ww.local, kdim) as u32),
                        ("W_HALF", w.scales.is_some_and(|s| s.packed) as u32),
                        ("X_HALF", half.is_some() as u32),
                        ("X_PIECE", to_u32(piece.unwrap_or(0), "linear input piece")?),
                        ("Y_HALF", half_out.is_some() as u32),
                        ("Y_PIECE", to_u32(out_piece.unwrap_or(64), "linear output piece")?),
                        ("Y_VEC4", y_vec4 as u32),
                        ("HEAD_NORM", to_u32(norm.map_or(0, |n| n.head_dim), "normed head")?),
                        ("NORM_W_BF16", norm.map_or(1, |n| n.first.dtype.constant())),
                        ("W_STACKED", stack.is_some() as u32),
                        ("SOFTMAX", scores.is_some() as u32),
                        ("CAUSAL", scores.is_some_and(|v| v.causal) as u32),
                        ("KEY_MASK", scores.is_some_and(|v| v.keep.is_some()) as u32),
                    ];
                    constants.extend(c.staging.constants(c.size));
                    let kernel = match matrix_vec4s(c, [x_at, x_stride], &ww, w.dtype, terms(gpu, kdim)) {
                        true => *c.pick([&LINEAR_MATRIX_8_VEC4, &LINEAR_MATRIX_16_VEC4, &LINEAR_MATRIX_8_F32_VEC4]),
                        false => *c.pick([&LINEAR_MATRIX_8, &LINEAR_MATRIX_16, &LINEAR_MATRIX_8_F32]),
                    };
                    (kernel, constants, wrapped_grid(rows_n.div_ceil(tile_m) * (spans * cols_n).div_ceil(tile_n)))
                }
            };
            let bw = match bias {
                Some(b) => window(gpu, b.buf, eb, b.offset + cols.start..b.offset + cols.end, "linear bias")?,
                None => placeholder_window(gpu)?,
            };
            // y's scales (binding 13) for this piece's columns (whole pieces:
            // W splits in whole blocks), or y's window where y is f32.
            let y_scales = match (half_out, out_piece) {
                (Some(h), Some(piece)) => Rows { offset: h.offset + cols.start / piece, width: (cols.end - cols.start).div_ceil(piece), ..h }.window(gpu, &rows)?,
                _ => yw.clone(),
            };
            // f16 operands: x's rows' range scales measured first, and W's
            // where they were not measured when W reached the device.
            let stored = w.scales.filter(|s| s.k == kdim);
            if w.scales.is_some_and(|s| s.packed) && stored.is_none() {
                return Err(GpuError::UnsupportedShape(format!("a product of k {kdim} over a W packed as f16 under scales of rows of {:?}", w.scales.map(|s| s.k))));
            }
            let scales = match matrix {
                Some(c) if c.operands == MatrixOperands::F16 => {
                    let scales = gpu.range_scales(rows_n + w_read)?;
                    // f16 rows come with their scales.
                    if half.is_none() {
                        measure_rows(gpu, sink, &xw, &scales, RangeScalesParams { rows: to_u32(rows_n, "linear rows")?, k: to_u32(terms(gpu, kdim), "linear k")?, src_offset: xw.local, src_stride: to_u32(x.stride, "linear input stride")?, dst_offset: 0, t_stride: 1, _pad: [0; 2] }, false)?;
                    }
                    if stored.is_none() {
                        measure_rows(gpu, sink, &ww, &scales, RangeScalesParams { rows: to_u32(w_read, "linear cols")?, k: to_u32(terms(gpu, kdim), "linear k")?, src_offset: ww.local, src_stride: to_u32(kdim, "linear k")?, dst_offset: to_u32(rows_n, "linear rows")?, t_stride: 1, _pad: [0; 2] }, w.dtype.constant() == 1)?;
                    }
                    Some(scales)
                }
                _ => None,
            };
            let sw = match &scales {
                Some(b) => window(gpu, b, 4, 0..rows_n + w_read, "range scales")?,
                None => placeholder_window(gpu)?,
            };
            // W's scales (binding 8): as kept, or after x's in the product's own.
            let (w_scales, w_scales_at) = match stored.filter(|_| scales.is_some()) {
                Some(s) => {
                    let kept = kept_scales_window(gpu, s, &w_rows_read)?;
                    let at = kept.local;
                    (kept, at)
                }
                None => (sw.clone(), sw.local + to_u32(rows_n, "linear rows")?),
            };
            // The gate's columns of this piece (binding 11), or the rows' factors, or y's window where neither.
            let gw = match (gate, row_factors, out_piece) {
                (Some(g), _, _) => window(gpu, g.buf, 4, g.offset + cols.start..g.offset + cols.end, "linear gate")?,
                (None, Some(f), Some(piece)) => Rows { offset: f.offset + cols.start / piece, width: (cols.end - cols.start).div_ceil(piece), ..f }.window(gpu, &rows)?,
                (None, Some(f), None) => f.window(gpu, &rows)?,
                (None, None, _) => yw.clone(),
            };
            // The scores' key mask in place of x's range scales (binding 5), which f16 rows bring with them.
            let sw = match scores.and_then(|v| v.keep) {
                Some(keep) => window(gpu, keep, 4, 0..scores.map_or(0, |v| v.k_first) + cols.end, "attention key mask")?,
                None => sw,
            };
            let params = LinearParams {
                m: to_u32(rows.end - rows.start, "linear rows")?,
                n: to_u32(cols.end - cols.start, "linear cols")?,
                k: to_u32(terms(gpu, kdim), "linear k")?,
                x_offset: to_u32(x_at, "linear input offset")?,
                x_stride: to_u32(x_stride, "linear input stride")?,
                w_offset: ww.local,
                b_offset: bw.local,
                y_offset: yw.local * out_per_word as u32,
                y_stride: to_u32(y.stride * out_per_word, "linear output stride")?,
                x_scales: x_scales.as_ref().map_or(sw.local, |w| w.local),
                w_scales: w_scales_at,
                gate_offset: gw.local,
                up_row: if swiglu { to_u32(n, "linear cols")? } else { 0 },
                x_scales_stride: to_u32(half.map_or(0, |h| h.stride), "linear input scales' stride")?,
                y_scales: y_scales.local,
                y_scales_stride: to_u32(half_out.map_or(0, |h| h.stride), "linear output scales' stride")?,
                stack_rows: to_u32(stack.map_or(0, |st| st.rows), "linear stack rows")?,
                row_base: to_u32(rows.start, "linear first row")?,
                stack_group: to_u32(stack.map_or(1, |st| st.group), "linear stacks a W")?,
                stack_skew: to_u32(stack.map_or(0, |st| st.skew), "linear first stack's place")?,
                softmax_scale: scores.map_or(0.0, |v| v.scale * std::f32::consts::LOG2_E),
                q_first: to_u32(scores.map_or(0, |v| v.q_first + rows.start), "attention first query")?,
                k_first: to_u32(scores.map_or(0, |v| v.k_first + cols.start), "attention first key")?,
                keep_offset: sw.local,
                ..Default::default()
            };
            // A head norm's weights and the RoPE tables' rows of these rows
            // (bindings 16–19), else unused read-only windows there.
            let (params, norm_windows) = match norm {
                Some(n) => n.bind(gpu, params, &rows, &cols)?,
                None => (params, (0..4).map(|_| placeholder_window(gpu)).collect::<Result<Vec<_>, _>>()?),
            };
            let launch = Launch { kernel: &kernel, constants: &constants, params, grid };
            // x at 1 or 6, or f16 rows at 9 (20 for the vec4 modules, as f16s) and their scales at 10; the
            // bindings the kernel does not read take x's window too, whose
            // writable use a second buffer there could conflict with.
            let x_half_scales = x_scales.as_ref().unwrap_or(&xw);
            let (x_f32, x_half) = (&xw, &xw);
            if kernel.module.reads_vec4s() {
                let [nw1, nw2, cos, sin] = [&norm_windows[0], &norm_windows[1], &norm_windows[2], &norm_windows[3]];
                dispatch(gpu, sink, launch, &[(3, &bw), (4, &yw), (5, &sw), (6, x_f32), (7, &ww), (8, &w_scales), (10, x_half_scales), (11, &gw), (12, &yw), (13, &y_scales), (14, &yw_vec4), (15, &yw_vec4), (16, nw1), (17, nw2), (18, cos), (19, sin), (20, x_half), (21, &ww)]);
            } else if matrix.is_some() {
                let [nw1, nw2, cos, sin] = [&norm_windows[0], &norm_windows[1], &norm_windows[2], &norm_windows[3]];
                dispatch(gpu, sink, launch, &[(1, x_f32), (2, &ww), (3, &bw), (4, &yw), (5, &sw), (8, &w_scales), (9, x_half), (10, x_half_scales), (11, &gw), (12, &yw), (13, &y_scales), (14, &yw_vec4), (15, &yw_vec4), (16, nw1), (17, nw2), (18, cos), (19, sin)]);
            } else if lanes.is_some() {
                dispatch(gpu, sink, launch, &[(3, &bw), (4, &yw), (6, &xw), (7, &ww), (11, &gw)]);
            } else {
                dispatch(gpu, sink, launch, &[(1, &xw), (2, &ww), (3, &bw), (4, &yw), (11, &gw)]);
            }
        }
    }
    Ok(())
}

/// Whether the matrix linear writes its outputs four at a time
/// (`linear_matrix.wgsl`'s `Y_VEC4`): y's window from output `first` of its
/// binding, rows `stride` outputs apart (f32 or f16 values), both whole
/// vec4s, and rows of at least one vec4 of `cols` outputs.
pub(crate) fn stores_vec4s(first: u64, stride: u64, cols: u64) -> bool {
    first.is_multiple_of(4) && stride.is_multiple_of(4) && cols >= 4
}

/// `matrix_fetch.wgsl`'s `B_PAIRED` for a matrix product (linear or conv)
/// whose W window starts at element `w_local`, rows of `k`: each
/// invocation fetches a k step of W's rows as whole bf16 pairs into
/// registers during the products (else it stages them element by element).
pub(crate) fn matrix_b_paired(c: MatrixConfig, dtype: WeightDtype, w_local: u32, k: u64) -> bool {
    dtype == WeightDtype::Bf16 && w_local.is_multiple_of(2) && k.is_multiple_of(2) && c.fetches_whole_steps()
}

/// Whether the matrix linear reads x and W as vec4s
/// (`linear_matrix_vec4.wgsl`): bf16 W, x's window, its row stride, the
/// terms and W's window on whole vec4s, and each invocation's share of a
/// step whole vec4s.
fn matrix_vec4s(c: MatrixConfig, [x_at, x_stride]: [u64; 2], ww: &Window<'_>, dtype: WeightDtype, k: u64) -> bool {
    #[cfg(test)]
    if tests::ELEMENT_FETCH.get() {
        return false;
    }
    dtype == WeightDtype::Bf16 && c.fetches_vec4_steps() && x_at.is_multiple_of(4) && x_stride.is_multiple_of(4) && k.is_multiple_of(8) && ww.local.is_multiple_of(8)
}

mod range_scales;
pub use range_scales::{measure_weight_rows, RangeScalesParams, RANGE_SCALES, RANGE_SCALES_ROWS};
pub(crate) use range_scales::{kept_scales_window, measure_rows};
mod head_norm;
pub use head_norm::{product_norms_heads, HeadNorm};
mod softmax;
pub use softmax::{linear_softmax, Probabilities, Scores, PROBABILITY_PIECE};

#[cfg(test)]
pub(crate) mod tests;
