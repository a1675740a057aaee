//! Block programs: what a model block does, as a list of kernel steps over
//! slices of one f32 activation arena. Core decides the steps and the
//! layout; platform turns each step into a dispatch.

use crate::oracle::ConvShape;
use crate::models::tensors::TensorName;
use core::fmt::Write;

/// Bytes per activation element (f32).
pub(crate) const F32: u64 = 4;
/// Slices start on 256-byte boundaries (the usual storage-binding offset alignment).
pub(crate) const ALIGN: u64 = 256;

/// A tensor name built from format arguments.
pub(crate) fn name(args: core::fmt::Arguments<'_>) -> TensorName {
    let mut n = TensorName::new();
    n.write_fmt(args).expect("tensor names fit in 128 bytes");
    n
}

/// A linear step without bias over all of W's rows.
pub(crate) fn linear(x: impl Into<Operand>, w: TensorName, y: Span, rows: u64, cols: u64, inner: u64) -> Op {
    Op::Linear { x: x.into(), w, w_row: 0, bias: None, y, rows, cols, inner, gate: None }
}

/// A row-major f32 view into the activation arena: row `r` starts at
/// element `offset + r·stride`. A stride of 0 broadcasts one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub offset: u64,
    pub stride: u64,
}

impl Span {
    pub fn new(offset: u64, stride: u64) -> Self {
        Self { offset, stride }
    }

    /// The view starting `rows` rows further down.
    pub fn rows_from(self, rows: u64) -> Self {
        Self { offset: self.offset + rows * self.stride, ..self }
    }

    /// The view starting `cols` columns further right.
    pub fn cols_from(self, cols: u64) -> Self {
        Self { offset: self.offset + cols, ..self }
    }
}

/// Words holding `values` 8-bit levels, four to a word ([`Op::PixelLevels`]).
pub const fn level_words(values: u64) -> u64 {
    values.div_ceil(4)
}

/// Rows a product reads, as the op before it writes them: f32 values at
/// `data`; or, with `scales`, f16 values two a 4-byte word (`data`'s stride
/// and offsets count words: a row of `w` values is `w/2` of them), each row
/// divided by its range scale (the power of two bringing its largest
/// magnitude into [2¹³, 2¹⁴)), the scales f32 `[rows, 1]` at `scales`: the
/// matrix tier's half-precision data path, the operands its products would
/// round the f32 values to. With `piece`, each run of `piece` values of a
/// row has its own scale (`scales` `[rows, w/piece]`), as producers that
/// each hold part of a row write them (attention a head, a product's
/// epilogue a block of columns); the product takes the largest of a row's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    pub data: Span,
    pub scales: Option<Span>,
    pub piece: Option<u64>,
}

mod attention_layouts;
pub use attention_layouts::*;

/// The widest piece of a row with its own range scale ([`Operand::piece`]):
/// the outputs of one block of the matrix tier's product with 16×16 tiles.
pub const MAX_OPERAND_PIECE: u64 = 64;
/// The narrowest: a block's outputs in at most four pieces.
pub const MIN_OPERAND_PIECE: u64 = 16;
/// The narrowest piece a product's own outputs (not SwiGLU's pairs, twice
/// as many a block) come in: a block of 8 tiles (128 outputs with 16×16
/// tiles) in at most four pieces.
pub const MIN_PROJECTION_PIECE: u64 = 32;

impl Operand {
    /// f32 rows.
    pub fn f32(data: Span) -> Self {
        Self { data, scales: None, piece: None }
    }

    /// f16 rows (words at `data`) under one range scale a row.
    pub fn half_rows(data: Span, scales: Span) -> Self {
        Self { data, scales: Some(scales), piece: None }
    }

    /// f16 rows (words at `data`) under a range scale every `piece` values.
    pub fn half_pieces(data: Span, scales: Span, piece: u64) -> Self {
        Self { data, scales: Some(scales), piece: Some(piece) }
    }

    /// The rows starting `rows` rows further down.
    pub fn rows_from(self, rows: u64) -> Self {
        Self { data: self.data.rows_from(rows), scales: self.scales.map(|s| s.rows_from(rows)), ..self }
    }

    /// The columns from value `cols` on: of f32 rows, or of f16 rows in
    /// pieces from a piece's first value.
    pub fn cols_from(self, cols: u64) -> Self {
        match (self.scales, self.piece) {
            (None, _) => Self::f32(self.data.cols_from(cols)),
            (Some(scales), Some(piece)) if cols.is_multiple_of(piece) => Self::half_pieces(self.data.cols_from(cols / 2), scales.cols_from(cols / piece), piece),
            _ => panic!("columns from {cols} of f16 rows in pieces of {:?}: the layout puts column slices on whole pieces", self.piece),
        }
    }

    /// Whether the rows are f16 under range scales.
    pub fn is_half(&self) -> bool {
        self.scales.is_some()
    }

    /// The f32 rows, where the layout keeps this operand f32 (a chunked or
    /// KV-cached pass, whose attention writes f32 rows).
    pub fn f32_rows(&self) -> Span {
        assert!(!self.is_half(), "an op that writes f32 rows given f16 ones: the layout keeps this pass's attention output f32");
        self.data
    }

    /// f32 elements (or words) a row of `width` values takes: f32 values, or
    /// f16 words and their scales.
    pub fn elements(&self, width: u64) -> u64 {
        match (self.scales, self.piece) {
            (None, _) => width,
            (Some(_), None) => width.div_ceil(2) + 1,
            (Some(_), Some(piece)) => width.div_ceil(2) + width.div_ceil(piece),
        }
    }

    /// Bytes of `rows` rows of `width` values: f32, or f16 with their scales.
    pub fn bytes(&self, rows: u64, width: u64) -> u64 {
        match (self.scales, self.piece) {
            (None, _) => rows * width * F32,
            (Some(_), None) => rows * (width * 2 + F32),
            (Some(_), Some(piece)) => rows * (width * 2 + width.div_ceil(piece) * F32),
        }
    }
}

/// The width of the pieces a transformer of `head_dim`-wide heads and
/// `widths` (its products' outputs) keeps its f16 operands in: the largest
/// divisor of the head dimension up to [`MAX_OPERAND_PIECE`] that divides
/// every width and is whole vec4s (a product reads a vec4 from one piece),
/// at least [`MIN_OPERAND_PIECE`]; `None` where there is none (those
/// operands then stay f32).
pub fn operand_piece(head_dim: u64, widths: &[u64]) -> Option<u64> {
    (MIN_OPERAND_PIECE..=MAX_OPERAND_PIECE).rev().step_by(4).find(|p| head_dim.is_multiple_of(*p) && widths.iter().all(|w| w.is_multiple_of(*p)))
}

#[cfg(test)]
mod piece_tests {
    use super::operand_piece;

    #[test]
    fn a_piece_is_the_widest_whole_vec4_divisor_of_the_head_that_every_width_takes() {
        // klein (heads of 128, D 3072, F 9216), tiny-q, tiny-a and tiny-b.
        assert_eq!(operand_piece(128, &[3072, 9216]), Some(64));
        assert_eq!(operand_piece(64, &[256, 768]), Some(64));
        assert_eq!(operand_piece(16, &[64, 192]), Some(16));
        assert_eq!(operand_piece(24, &[48, 144]), Some(24));
        // Heads of 36 take 36, not 18 (not whole vec4s); of 26, none.
        assert_eq!(operand_piece(36, &[72, 216]), Some(36));
        assert_eq!(operand_piece(26, &[52, 156]), None);
        // A width the head's pieces do not divide.
        assert_eq!(operand_piece(128, &[3072, 9000]), None);
    }
}

impl From<Span> for Operand {
    fn from(data: Span) -> Self {
        Self::f32(data)
    }
}

/// The feed-forward's gate and up products of `x` over W's rows `w_row ..`
/// (`cols` gate rows, then `cols` up rows) and its SwiGLU into `y`
/// ([`Op::LinearSwiGlu`]).
#[allow(clippy::too_many_arguments)] // the product's operands and its scratch
pub(crate) fn linear_swiglu(x: impl Into<Operand>, w: TensorName, w_row: u64, y: impl Into<Operand>, rows: u64, cols: u64, inner: u64, scratch: Span) -> Op {
    Op::LinearSwiGlu { x: x.into(), w, w_row, y: y.into(), rows, cols, inner, scratch }
}

/// Which values a RoPE rotates together: FLUX.2's neighbours `(2i, 2i + 1)`,
/// or Qwen3's halves `(i, i + d/2)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    Interleaved,
    RotateHalf,
}

/// The shift and scale rows (broadcast) that a [`Op::LayerNormModulate`]'s
/// rows from `row` on (counted from its first) take instead of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaterModulation {
    pub row: u64,
    pub shift: Span,
    pub scale: Span,
}

/// A [`Op::CarriedAttention`]'s part of one over more keys: whether it
/// continues an earlier part's online softmax and whether it leaves its own
/// for a later one, each (query, head) row's running max and sum in `state`
/// (`[q_len, heads, 2]`), the output unnormalised in `o` meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionCarry {
    pub state: Span,
    pub from_state: bool,
    pub keep_state: bool,
}

/// A GroupNorm (+ SiLU or ReLU) a channels-last convolution applies to its
/// input as it reads it, in place of the pass that would write the
/// normalised rows: the statistics (`[groups, 2]`, from
/// [`Op::GroupMerge`]), the affine weight and bias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputNorm {
    pub stats: Span,
    pub gamma: TensorName,
    pub beta: TensorName,
    pub groups: u64,
    pub activation: NormActivation,
}

/// What follows a GroupNorm read as a convolution's input: nothing, SiLU
/// (the VAE's resnets) or ReLU (a tiny decoder's global-norm blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NormActivation {
    #[default]
    None,
    Silu,
    Relu,
}

/// The tensor a GroupNorm normalises: `channels × pixels` values,
/// channel-major (`[channels, pixels]`) or channels-last (`[pixels,
/// channels]`), its pixels image rows of `width`. The statistics are taken a
/// row at a time and merged in one fixed order, so a band of whole rows
/// computes the very moments the whole image's run does for those rows, and
/// every row is one workgroup's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupShape {
    pub channels: u64,
    pub pixels: u64,
    pub width: u64,
    pub groups: u64,
    pub channels_last: bool,
}

impl GroupShape {
    /// Rows of pixels.
    pub fn rows(&self) -> u64 {
        self.pixels / self.width.max(1)
    }

    /// Values of one group in one row.
    pub fn per_row(&self) -> u64 {
        self.channels / self.groups.max(1) * self.width
    }

    /// This shape over `rows` of its rows (a band).
    pub fn band(self, rows: u64) -> Self {
        Self { pixels: rows * self.width, ..self }
    }

    /// What its rows' moments are.
    pub fn moments(&self) -> RowMoments {
        RowMoments { rows: self.rows(), groups: self.groups, per_row: self.per_row() }
    }
}

/// A GroupNorm's rows' moments, `[rows, groups, 2]`, each over `per_row` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowMoments {
    pub rows: u64,
    pub groups: u64,
    pub per_row: u64,
}

/// A product's output added into the residual stream under a gate, in the
/// product's epilogue: `y += vector ⊙ (x·Wᵀ)`, `vector` one broadcast row
/// (the gated residual after a projection). `scratch` `[rows, cols]` is
/// where the product goes first when the epilogue cannot take it (an
/// adapter adding to the product, or a GGML scratch too small for one
/// run of its weight's rows): the product there, then an [`Op::GatedResidual`] of it into `y`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    pub vector: Span,
    pub scratch: Span,
}

/// The queries' and keys' per-head RMSNorm + interleaved RoPE a projection
/// into f16 pieces applies to its outputs before rounding them
/// ([`Op::LinearHalf`]): outputs `[0, first_cols)` normed by `first`'s
/// weight, `[first_cols, cols)` by `second`'s (the same name where the
/// projection is of one kind), the rest (values) as they are; heads of
/// `head_dim` with `eps`, output row `t` rotated by table row `table_row + t`.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadNorm {
    pub first: TensorName,
    pub second: TensorName,
    pub first_cols: u64,
    pub cols: u64,
    pub head_dim: u64,
    pub eps: f32,
    pub table_row: u64,
}

impl HeadNorm {
    /// The same as the [`Op::RmsNormRope`] passes over the projection's
    /// output `y` (`rows` rows) after it, where its epilogue cannot norm.
    pub fn passes(&self, y: Operand, rows: u64) -> impl Iterator<Item = Op> + '_ {
        let parts = [(&self.first, 0, self.first_cols), (&self.second, self.first_cols, self.cols)];
        parts.into_iter().filter(|(_, from, to)| to > from).map(move |(w, from, to)| Op::RmsNormRope {
            data: y.cols_from(from),
            w: w.clone(),
            table_row: self.table_row,
            tokens: rows,
            heads: (to - from) / self.head_dim,
            head_dim: self.head_dim,
            eps: self.eps,
            pairs: RopeStyle::Interleaved,
        })
    }
}

/// One kernel step of a block program. Weights are named as in the model's
/// files; the runner resolves names to device buffers.
// A program is a few hundred ops, made once a layout: a convolution that
// names its GroupNorm's weights beside its own costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `y[rows, cols] = x[rows, inner]·W[w_row .. w_row + cols]ᵀ (+ b[w_row ..])`:
    /// rows `w_row ..` of W `[.., inner]` (all of them from 0 when `cols` is W's height).
    /// With `gate`, `y += gate ⊙ (…)` instead ([`Gate`]).
    Linear { x: Operand, w: TensorName, w_row: u64, bias: Option<TensorName>, y: Span, rows: u64, cols: u64, inner: u64, gate: Option<Gate> },
    /// `y[rows, cols] = silu(x·W[w_row .. w_row + cols]ᵀ) ⊙ (x·W[w_row + cols .. w_row + 2·cols]ᵀ)`:
    /// a feed-forward's gate and up projections (W's gate rows, then its up
    /// rows) and its SwiGLU in one product, the SwiGLU in the epilogue.
    /// `scratch` `[rows, 2·cols]` is where the two products go first when
    /// the epilogue cannot take them (an adapter adding to them, W's gate
    /// and up rows beyond one binding or the GGML scratch): the product there, then an [`Op::SwiGlu`] into `y`
    /// (into the scratch and an [`Op::HalfPack`] into `y` where `y` is f16
    /// rows in pieces).
    LinearSwiGlu { x: Operand, w: TensorName, w_row: u64, y: Operand, rows: u64, cols: u64, inner: u64, scratch: Span },
    /// [`Op::Linear`] without bias into f16 rows in pieces (`y`,
    /// [`Operand::half_pieces`]): the queries', keys' and values'
    /// projections, each piece of a row rounded under its range scale in
    /// the epilogue. `scratch` `[rows, cols]` f32 is where the product goes
    /// first when the epilogue cannot take it (an adapter, a block of
    /// outputs not whole pieces, a GGML scratch too small for one run of
    /// whole pieces): the product there, then an [`Op::HalfPack`] into `y`.
    /// With `head_norm`, the queries' and keys' per-head RMSNorm + RoPE
    /// too, in the epilogue where it can take them, else as passes after it.
    LinearHalf { x: Operand, w: TensorName, w_row: u64, y: Operand, rows: u64, cols: u64, inner: u64, scratch: Span, head_norm: Option<HeadNorm> },
    /// Per-head RMSNorm with weight, in place.
    RmsNormHeads { data: Span, w: TensorName, tokens: u64, heads: u64, head_dim: u64, eps: f32 },
    /// `dst = LN(src)·(1 + scale) + shift` (no affine), shift/scale broadcast
    /// rows; `dst` f32 rows, or f16 rows under range scales for a product.
    /// With `later`, the rows from its row on take its shift and scale (two
    /// streams' rows, each under its own modulation, in one pass).
    LayerNormModulate { src: Span, dst: Operand, shift: Span, scale: Span, later: Option<LaterModulation>, tokens: u64, d: u64, eps: f32 },
    /// [`Op::RmsNormHeads`] then [`Op::RopeInterleaved`] (or, with
    /// [`RopeStyle::RotateHalf`], [`Op::RopeRotateHalf`]) on the same rows,
    /// in one pass (the same values): the queries' and keys' norm and
    /// rotation. `data` f32 rows, or f16 rows in pieces, rounded again piece
    /// by piece (rotate-half pairs: f16 rows in pieces only).
    RmsNormRope { data: Operand, w: TensorName, table_row: u64, tokens: u64, heads: u64, head_dim: u64, eps: f32, pairs: RopeStyle },
    /// Interleaved-pair RoPE in place; token `t` uses table row `table_row + t`.
    RopeInterleaved { data: Span, table_row: u64, tokens: u64, heads: u64, head_dim: u64 },
    /// Non-causal attention, `scale = 1/√head_dim`; `o` f32 rows, or the
    /// output projection's f16 rows in pieces within a head; `q`, `k` and
    /// `v` f32 rows, or (with such an `o`) f16 rows in pieces too.
    Attention { q: Operand, k: Operand, v: Operand, o: Operand, len: u64, heads: u64, head_dim: u64 },
    /// Non-causal attention of `q_len` query rows over `kv_len` key rows, `scale = 1/√head_dim`.
    CrossAttention { q: Span, k: Span, v: Span, o: Span, q_len: u64, kv_len: u64, heads: u64, head_dim: u64 },
    /// `CrossAttention` over keys and values in the half-K/V layout: `k`
    /// and `v` hold f16 pairs (`[kv_len, D/2]` words, as [`Op::HalfPack`]
    /// writes them), `k_scales` and `v_scales` each (token, head) row's range
    /// scale `[kv_len, heads]`.
    HalfKvAttention { q: Span, k: Span, v: Span, k_scales: Span, v_scales: Span, o: Span, q_len: u64, kv_len: u64, heads: u64, head_dim: u64 },
    /// f32 rows `src` `[tokens, heads·head_dim]` into the half-K/V layout:
    /// each (token, head) row divided by its range scale (the power of two
    /// that brings its largest magnitude into [2¹³, 2¹⁴)) and rounded to
    /// f16, two a word, into `dst` `[tokens, heads·head_dim/2]`; the scales
    /// into `scales` `[tokens, heads]` (`scales.stride` apart from token to
    /// token: also a product's operand in pieces of `head_dim`).
    HalfPack { src: Span, dst: Span, scales: Span, tokens: u64, heads: u64, head_dim: u64 },
    /// Non-causal attention of `q_len` queries over `kv_len` keys on one
    /// kernel whatever the device (the VAE's mid-block), so that a run split
    /// into bands of queries and chunks of keys carrying its online softmax
    /// (`carry`) gives the bits of the whole call.
    CarriedAttention { q: Span, k: Span, v: Span, o: Span, q_len: u64, kv_len: u64, heads: u64, head_dim: u64, carry: Option<AttentionCarry> },
    /// The matrix tier's [`Op::CarriedAttention`] of one head as products
    /// on the matrix core (the VAE's mid-block on the channels-last path):
    /// for each chunk of [`ATTENTION_KEY_CHUNK`] keys counted from the first
    /// of all (a call's `kv_len` whole chunks, but the last call's), the
    /// scores `Q·Kᵀ` over f16 rows under their range scales, the online
    /// softmax into f16 probabilities, and `P·V` onto `o`; the same bits
    /// for any bands of queries and calls over whole chunks of keys carrying
    /// the softmax (`carry`). `scratch` holds [`chunked_attention_scratch`]
    /// elements; the right operands lie in a buffer of the runner's ([`ChunkedOperands`]).
    ChunkedAttention { q: Span, k: Span, v: Span, o: Span, scratch: Span, q_len: u64, kv_len: u64, head_dim: u64, carry: Option<AttentionCarry> },
    /// `dst = silu(gate)·up`; `dst` f32 rows, or the next product's f16 rows
    /// in pieces ([`Operand::half_pieces`]), each piece rounded under its range scale.
    SwiGlu { gate: Span, up: Span, dst: Operand, rows: u64, cols: u64 },
    /// `dst += gate ⊙ y`, gate one broadcast row.
    GatedResidual { dst: Span, gate: Span, y: Span, rows: u64, cols: u64 },
    /// `dst = silu(src)`
    Silu { src: Span, dst: Span, rows: u64, cols: u64 },
    /// Whole-row RMSNorm with weight: `dst = w · src / rms(src)`; `dst` f32
    /// rows, or f16 rows under one range scale a row for a product.
    RmsNorm { src: Span, dst: Operand, w: TensorName, tokens: u64, d: u64, eps: f32 },
    /// Rotate-half RoPE in place (table halves share an angle); token `t` uses table row `table_row + t`.
    RopeRotateHalf { data: Span, table_row: u64, tokens: u64, heads: u64, head_dim: u64 },
    /// Causal self-attention with grouped-query heads and the runner's key
    /// padding mask, `scale = 1/√head_dim`; `o` f32 rows or the output
    /// projection's f16 rows in pieces within a head, `q`, `k` and `v` f32
    /// rows or (with such an `o`) f16 rows in pieces too, as in [`Op::Attention`].
    CausalAttention { q: Operand, k: Operand, v: Operand, o: Operand, len: u64, q_heads: u64, kv_heads: u64, head_dim: u64 },
    /// `dst += y`
    Residual { dst: Span, y: Span, rows: u64, cols: u64 },
    /// `dst = src`
    Copy { src: Span, dst: Span, rows: u64, cols: u64 },
    /// 2-D convolution with bias over contiguous `[channels, height, width]`
    /// tensors; where `residual`, y's own values added to each sum after the
    /// bias (a residual block's sum: the bits of an `Add` after it, one pass
    /// fewer); ReLU last when `relu` (the same values as a `Relu` step after).
    Conv2d { x: Span, w: TensorName, bias: TensorName, y: Span, shape: ConvShape, residual: bool, relu: bool },
    /// A stride-1 "same" convolution over channels-last f16 rows `x`
    /// (`[pixels, in_channels]`, one range scale a pixel, or one a piece:
    /// the stream as a convolution wrote it) into channels-last rows `y`
    /// (`[pixels, out_channels]`): f32, `residual` then `y` itself (its
    /// values added), or f16 in pieces (the VAE's stream on the matrix tier),
    /// `residual` then another tensor's f16 rows in the same pieces. With
    /// `upsample` the input (of `shape`'s height and width) is read through
    /// a nearest-neighbour ×2 upsampling, and normalised as read where
    /// `norm` says so; each output ReLU'd (after the bias and the residual)
    /// where `relu`. W as the model's files hold it.
    ConvNhwc { x: Operand, w: TensorName, bias: TensorName, y: Operand, shape: ConvShape, upsample: bool, residual: Option<Operand>, norm: Option<InputNorm>, relu: bool },
    /// A GroupNorm's first step: each group's `(mean, Σ(x − mean)²)` over
    /// each row of pixels of `src` (f32, or channels-last f16 rows in
    /// pieces), into `moments` `[rows, groups, 2]`.
    GroupMoments { src: Operand, moments: Span, shape: GroupShape },
    /// Its second: the rows' moments merged in one fixed order into each
    /// group's `(mean, 1/√(var + eps))`, `stats` `[groups, 2]`.
    GroupMerge { moments: Span, stats: Span, of: RowMoments, eps: f32 },
    /// Its last: `src` (as the first step reads it) normalised with
    /// `stats`, times gamma plus beta, SiLU after when `silu`, into `dst`:
    /// f32 channel-major, or channels-last f16 rows under one range scale a
    /// pixel (the next convolution's input).
    GroupNormApply { src: Operand, stats: Span, dst: Operand, gamma: TensorName, beta: TensorName, shape: GroupShape, silu: bool },
    /// Nearest-neighbour ×2 upsampling of contiguous `[channels, height, width]`.
    UpsampleNearest2x { x: Span, y: Span, channels: u64, height: u64, width: u64 },
    /// `dst[c, r] = src[r, c]` for a `[rows, cols]` source.
    Transpose { src: Span, dst: Span, rows: u64, cols: u64 },
    /// `dst = a + b` (`dst` may be `a` or `b`), ReLU after when `relu`.
    Add { a: Span, b: Span, dst: Span, rows: u64, cols: u64, relu: bool },
    /// Packed latents `[height·width tokens, 4·channels]` to the VAE latent
    /// `[channels, 2·height, 2·width]`: BatchNorm de-normalisation
    /// `x·√(var + eps) + mean` per patchified channel, then unpatchify
    /// (channel `c·4 + py·2 + px` of token `(y, x)` lands at `(2y + py, 2x + px)`).
    DenormUnpatchify { packed: Span, latent: Span, mean: TensorName, var: TensorName, channels: u64, height: u64, width: u64, eps: f32 },
    /// The 8-bit levels `round(clamp(src/2 + 1/2, 0, 1)·255)` of `count`
    /// contiguous values, as bytes four to a word at `dst` ([`level_words`]
    /// words: value `i` in bits `8·(i mod 4)` of word `i/4`, a little-endian
    /// u32, so that the image's bytes lie in memory in order; the last word's
    /// unused bytes zero).
    PixelLevels { src: Span, dst: Span, count: u64 },
    /// `dst = max(src, 0)` over `count` contiguous values.
    Relu { src: Span, dst: Span, count: u64 },
    /// `dst = tanh(src/limit)·limit` over `count` contiguous values: a soft clamp to (−limit, limit).
    TanhClamp { src: Span, dst: Span, count: u64, limit: f32 },
    /// `dst = src·scale + shift` over `count` contiguous values.
    ScaleShift { src: Span, dst: Span, count: u64, scale: f32, shift: f32 },
}

impl Op {
    /// Floating-point operations of this step, a multiply-add counting two:
    /// the matrix products of linears, attention (scores and the weighted
    /// sum; causal attention counted whole) and convolutions. Elementwise
    /// steps and norms, a few operations per value moved, count 0: bandwidth
    /// bounds them.
    pub fn flops(&self) -> u64 {
        match self {
            Op::Linear { rows, cols, inner, .. } | Op::LinearHalf { rows, cols, inner, .. } => 2 * rows * cols * inner,
            Op::LinearSwiGlu { rows, cols, inner, .. } => 4 * rows * cols * inner,
            Op::Attention { len, heads, head_dim, .. } => 4 * len * len * heads * head_dim,
            Op::ChunkedAttention { q_len, kv_len, head_dim, .. } => 4 * q_len * kv_len * head_dim,
            Op::CarriedAttention { q_len, kv_len, heads, head_dim, .. }
            | Op::CrossAttention { q_len, kv_len, heads, head_dim, .. }
            | Op::HalfKvAttention { q_len, kv_len, heads, head_dim, .. } => {
                4 * q_len * kv_len * heads * head_dim
            }
            Op::CausalAttention { len, q_heads, head_dim, .. } => 4 * len * len * q_heads * head_dim,
            Op::Conv2d { shape: c, .. } | Op::ConvNhwc { shape: c, .. } => {
                let taps = (c.in_channels * c.kernel * c.kernel) as u64;
                2 * taps * (c.out_channels * c.out_height * c.out_width) as u64
            }
            _ => 0,
        }
    }

    /// The weight tensors this step reads, by name.
    /// The weight this op's product reads as f16 pairs packed under its
    /// rows' scales where the data path is half precision and the weight
    /// keeps its row scales: a linear's W, and a channels-last
    /// convolution's W (taps last) whose rows (`in_channels · kernel²` taps)
    /// are whole words, every one but over an odd channel count (the VAE
    /// encoder's first, over the image).
    pub fn packed_weight(&self) -> Option<&TensorName> {
        match self {
            Op::Linear { w, .. } | Op::LinearSwiGlu { w, .. } | Op::LinearHalf { w, .. } => Some(w),
            Op::ConvNhwc { w, shape, .. } if (shape.in_channels * shape.kernel * shape.kernel).is_multiple_of(2) => Some(w),
            _ => None,
        }
    }

    pub fn weights(&self) -> impl Iterator<Item = &TensorName> {
        // A convolution normalising its input reads the GroupNorm's weights
        // too, a projection norming its heads their norms' (one where both
        // are the same).
        let norm = match self {
            Op::ConvNhwc { norm: Some(n), .. } => [Some(&n.gamma), Some(&n.beta)],
            Op::LinearHalf { head_norm: Some(n), .. } => [Some(&n.first), Some(&n.second).filter(|s| **s != n.first)],
            _ => [None, None],
        };
        let (first, second) = match self {
            Op::Linear { w, bias, .. } => (Some(w), bias.as_ref()),
            Op::LinearSwiGlu { w, .. } | Op::LinearHalf { w, .. } => (Some(w), None),
            Op::RmsNormHeads { w, .. } | Op::RmsNorm { w, .. } | Op::RmsNormRope { w, .. } => (Some(w), None),
            Op::Conv2d { w, bias, .. } | Op::ConvNhwc { w, bias, .. } => (Some(w), Some(bias)),
            Op::GroupNormApply { gamma, beta, .. } => (Some(gamma), Some(beta)),
            Op::DenormUnpatchify { mean, var, .. } => (Some(mean), Some(var)),
            _ => (None, None),
        };
        first.into_iter().chain(second).chain(norm.into_iter().flatten())
    }
}
