//! The matrix tier's attention of one wide head as products on the matrix
//! core (the VAE's mid-block on the channels-last path: one head of 512
//! dims over every latent pixel). For each chunk of
//! [`ATTENTION_KEY_CHUNK`] keys: the GEMM core's `Q·Kᵀ` over f16 rows under
//! their range scales, its scores going out as f16 probabilities in pieces
//! ([`linear_softmax`]), the pieces brought under each row's one maximum
//! with the online softmax carried (`attention_chunks.wgsl`), and the GEMM
//! core's `P·V` onto the output; the output divided by each row's sum
//! after the last chunk.
//! The one-subgroup matrix attention computes a 512-wide head's scores a
//! subgroup at a time; here both products run on the GEMM core's blocks.
//!
//! Every value of a query's row is computed from that row, the keys of its
//! chunk and the carried state alone, in one fixed order: calls over whole
//! chunks of the keys carrying the softmax ([`Carry`]), for any bands of
//! queries, give the bits of one call over all of them.

use crate::device::Gpu;
use crate::dispatch::{chunks, dispatch, grid64, row_chunks, to_u32, window, Launch, Rows, Sink, Window};
use crate::error::GpuError;
use crate::kernel::{kernel, wrapped_grid, Access::ReadWrite as RW, Kernel, Module};
use crate::kernels::attention::{Attention, Carry, HalfQkv, Qkv};
use crate::kernels::half_pack::half_pack;
use crate::kernels::linear::{linear_from, linear_rescaling, linear_softmax, linear_stacked, Gemm, Input, Probabilities, Scores, Stack, PROBABILITY_PIECE};
use crate::view::{HalfMat, HeadRows, Mat, RowScales, Weight, WeightDtype};
use bytemuck::{Pod, Zeroable};
use flux_lite_core::ir::{ChunkedOperands, ChunkedScratch, HeadsOnProducts, ProbabilityRow, ATTENTION_KEY_CHUNK, ATTENTION_QUERY_BAND};

/// `attention_chunks.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct ChunkParams {
    pub rows: u32,
    pub keys: u32,
    pub width: u32,
    pub scores_stride: u32,
    pub exponents: u32,
    pub sums: u32,
    pub pieces: u32,
    pub state: u32,
    pub o: u32,
    pub o_stride: u32,
    pub src: u32,
    pub src_stride: u32,
    pub dst: u32,
    pub dst_scales: u32,
    pub from_state: u32,
    pub factors: u32,
    pub pitch: u32,
    pub band: u32,
    pub dst_stride: u32,
    pub dst_scales_stride: u32,
    pub piece: u32,
    pub src_piece: u32,
    pub src_scales: u32,
    pub src_scales_stride: u32,
}

/// A chunk's pieces of probabilities under each row's one maximum, the softmax carried; an invocation a row.
pub const CHUNK_COMBINE: Kernel = kernel(Module::AttentionChunks, "chunk_combine", [64, 1, 1], &[(2, RW), (3, RW), (6, RW)], size_of::<ChunkParams>(), false);
/// A chunk's values transposed into f16 rows under their range scales; a workgroup a column.
pub const PACK_COLUMNS: Kernel = kernel(Module::AttentionChunks, "pack_columns", [128, 1, 1], &[(1, RW), (2, RW), (5, RW), (7, RW), (8, RW)], size_of::<ChunkParams>(), false);
/// A chunk's keys into f16 rows under their range scales; an invocation a key.
pub const PACK_KEY_ROWS: Kernel = kernel(Module::AttentionChunks, "pack_key_rows", [64, 1, 1], &[(1, RW), (2, RW), (5, RW), (7, RW), (8, RW)], size_of::<ChunkParams>(), false);
/// The output rows divided by their softmax's sums.
pub const NORMALISE_ROWS: Kernel = kernel(Module::AttentionChunks, "normalise_rows", [64, 1, 1], &[(3, RW), (4, RW)], size_of::<ChunkParams>(), false);
/// A stack's output rows divided by their sums into the attention's f16 pieces; an invocation a piece.
pub const NORMALISE_INTO_PIECES: Kernel = kernel(Module::AttentionChunks, "normalise_into_pieces", [64, 1, 1], &[(1, RW), (2, RW), (3, RW), (4, RW)], size_of::<ChunkParams>(), false);

/// Whether `gpu` runs [`attention_chunked`]: the matrix tier with f16 operands.
pub fn runs_chunked_attention(gpu: &Gpu) -> bool {
    gpu.f16_operands()
}

/// Non-causal attention of one head on the matrix core over chunks of
/// [`ATTENTION_KEY_CHUNK`] keys, carrying its online softmax across calls
/// where `carry` says (each row's running maximum and sum in `carry.state`,
/// the unnormalised output in `o` meanwhile; calls over whole chunks of
/// keys but the last): `scratch` is [`ChunkedScratch`]'s working space for
/// `s.q_len` queries (f32 elements from `scratch.offset`), `operands`
/// [`ChunkedOperands`]' (a buffer no other operand lies in, of
/// [`ChunkedOperands::bytes`]), f32 `q`, `k`, `v` and `o` rows of `s.head_dim`.
#[allow(clippy::too_many_arguments)] // the attention's operands, its carry and its two scratches
pub fn attention_chunked(gpu: &Gpu, sink: &mut dyn Sink, qkv: Qkv<'_>, o: Mat<'_>, carry: Option<Carry<'_>>, scratch: Mat<'_>, operands: &wgpu::Buffer, s: Attention) -> Result<(), GpuError> {
    let Qkv { q, k, v } = qkv;
    let (rows, d) = (s.q_len, s.head_dim);
    if !runs_chunked_attention(gpu) || s.causal || s.q_heads != 1 || s.kv_heads != 1 || !d.is_multiple_of(2) {
        return Err(GpuError::UnsupportedShape(format!(
            "chunked attention is the matrix tier's with f16 operands, of one non-causal head of an even width ({} heads of {d} over {} keys)",
            s.q_heads, s.kv_len
        )));
    }
    let right = ChunkedOperands::new(d, 1, ATTENTION_KEY_CHUNK);
    if operands.size() < 4 * right.end {
        return Err(GpuError::UnsupportedShape(format!("a chunked attention over heads of {d} needs {} bytes for its right operands ({} given)", 4 * right.end, operands.size())));
    }
    if rows == 0 || s.kv_len == 0 {
        return Ok(());
    }
    let part = ChunkedScratch::new(rows, d);
    let at = |offset: u64, stride: u64| Mat { buf: scratch.buf, offset: scratch.offset + offset, stride };
    let beside = |offset: u64, stride: u64| Mat { buf: operands, offset, stride };
    let (words, scales) = (at(part.queries, d / 2), at(part.query_scales, 1));
    half_pack(gpu, sink, q, words, scales, HeadRows { tokens: rows, heads: 1, head_dim: d })?;
    let queries = HalfMat::rows(words, scales);
    let (probabilities, row) = probabilities_in(at(part.scores, 1), ATTENTION_KEY_CHUNK);
    // Each row's maximum and sum side by side, whatever the carry's stride says (as the carried kernel reads them).
    let state = carry.map_or(at(part.state, 2), |c| Mat { stride: 2, ..c.state });
    for (i, keys) in chunks(s.kv_len, ATTENTION_KEY_CHUNK).enumerate() {
        let n = keys.end - keys.start;
        let continues = i > 0 || carry.is_some_and(|c| c.from_state);
        let (key_rows, key_scales) = (beside(right.keys, d / 2), beside(right.key_scales, 1));
        pack_key_rows(gpu, sink, Source::Rows(k.rows_from(keys.start)), [key_rows, key_scales], [n, d])?;
        let counted = Scores { scale: s.scale, k_first: keys.start, ..Scores::default() };
        linear_softmax(gpu, sink, Input::Half(queries), packed(key_rows, key_scales, d), probabilities, counted, Gemm { m: rows, n, k: d })?;
        let factors = at(part.factors, 1);
        chunk_combine(gpu, sink, probabilities, [state, factors], [rows, n.div_ceil(PROBABILITY_PIECE)], row, continues)?;
        // The weighted sum over whole f16 pairs: an odd chunk's probabilities and values padded with a zero.
        let paired = n.next_multiple_of(2);
        let (value_rows, value_scales) = (beside(right.values, paired / 2), beside(right.value_scales, 1));
        pack_columns(gpu, sink, Source::Rows(v.rows_from(keys.start)), [value_rows, value_scales], [n, d])?;
        let weighted = Gemm { m: rows, n: d, k: paired };
        let probabilities = Input::Half(probabilities.pieces());
        match continues {
            true => linear_rescaling(gpu, sink, probabilities, packed(value_rows, value_scales, paired), o, factors, weighted)?,
            false => linear_from(gpu, sink, probabilities, packed(value_rows, value_scales, paired), None, o, weighted)?,
        }
    }
    match carry.is_some_and(|c| c.keep_state) {
        true => Ok(()),
        false => normalise_rows(gpu, sink, o, state, [rows, d]),
    }
}

/// The queries, keys and values of an [`attention_on_products`]: f32 rows,
/// or f16 rows in pieces.
#[derive(Debug, Clone, Copy)]
pub enum HeadInputs<'a> {
    Rows(Qkv<'a>),
    Pieces(HalfQkv<'a>),
}

/// Attention over f32 or f16-pieces queries, keys and values into f16
/// pieces, as products on the GEMM core: the matrix tier's attention for
/// the transformer and the text encoder (causal, its padding keys hidden by
/// `key_keep`'s zeros, grouped heads) where [`Gpu::attention_on_products`]
/// (its flash kernel not proven on that path). Heads go in stacks of
/// [`HeadsOnProducts`]' `heads` (as many as one wave of `P·V` holds), each
/// head's band of queries `pitch` rows of the stack; keys and values are
/// read where they lie (f32 rows, or f16 pieces as the values they stand
/// for). For each stack and each band of at most [`ATTENTION_QUERY_BAND`] queries (their f16 pieces
/// read by the scores' product as stored; f32 rows packed into f16 rows)
/// and each chunk of [`ATTENTION_KEY_CHUNK`] keys, every head's keys packed
/// and its `Q·Kᵀ` into its rows of the stack's probabilities
/// ([`linear_softmax`], the masks applied there), then for the whole stack
/// one combining pass, one pack of the values and one
/// `P·V` ([`linear_stacked`]: each head's rows on its own values, grouped
/// heads on their shared ones); the stack's rows divided by their sums
/// into each head's band of `o`'s pieces in one pass.
/// `scratch` holds [`HeadsOnProducts`] (f32 elements from
/// `scratch.offset`), `operands` [`ChunkedOperands`] for its heads.
#[allow(clippy::too_many_arguments)] // the attention's operands, its mask and its two scratches
pub fn attention_on_products(gpu: &Gpu, sink: &mut dyn Sink, qkv: HeadInputs<'_>, key_keep: Option<&wgpu::Buffer>, o: HalfMat<'_>, scratch: Mat<'_>, operands: &wgpu::Buffer, s: Attention) -> Result<(), GpuError> {
    // As many heads as the buffers it is given hold (as the runner sized them, for the device's largest buffer).
    let room = (scratch.buf.size() / 4).saturating_sub(scratch.offset) * 4;
    let part = HeadsOnProducts::new(s.q_len, s.kv_len, s.head_dim, s.q_heads, room);
    let mut heads = part.heads;
    while heads > 1 && 4 * ChunkedOperands::new(s.head_dim, heads, part.chunk).end > operands.size() {
        heads -= 1;
    }
    on_products_in_bands(gpu, sink, qkv, key_keep, o, [scratch, Mat::new(operands, 0)], s, [ATTENTION_QUERY_BAND, heads])
}

/// [`attention_on_products`] over bands of `band` queries, `heads` heads
/// stacked at a time: any band and any stack give the same bits.
#[allow(clippy::too_many_arguments)] // as attention_on_products, and the band and stack
pub(crate) fn on_products_in_bands(gpu: &Gpu, sink: &mut dyn Sink, qkv: HeadInputs<'_>, key_keep: Option<&wgpu::Buffer>, o: HalfMat<'_>, [scratch, operands]: [Mat<'_>; 2], s: Attention, [band, heads]: [u64; 2]) -> Result<(), GpuError> {
    let d = s.head_dim;
    let piece = o.piece.unwrap_or(0);
    let grouped = s.kv_heads > 0 && s.q_heads.is_multiple_of(s.kv_heads);
    let input_pieces = match qkv {
        HeadInputs::Pieces(h) => [h.q.piece, h.k.piece, h.v.piece],
        HeadInputs::Rows(_) => [o.piece; 3],
    };
    if input_pieces != [o.piece; 3] || piece == 0 || !d.is_multiple_of(piece) || !d.is_multiple_of(4) || !grouped || (s.causal && s.q_len != s.kv_len) {
        return Err(GpuError::UnsupportedShape(format!(
            "attention on products over f16 pieces {input_pieces:?} (or f32 rows) into f16 pieces {:?}, {} heads over {} of {d}, {} queries over {} keys{}",
            o.piece,
            s.q_heads,
            s.kv_heads,
            s.q_len,
            s.kv_len,
            if s.causal { ", causal" } else { "" }
        )));
    }
    let group = s.q_heads / s.kv_heads;
    let part = HeadsOnProducts::laid_out(s.kv_len, d, band.min(s.q_len), heads);
    let right = ChunkedOperands::new(d, heads, part.chunk);
    if band == 0 || heads == 0 || scratch.buf.size() < 4 * (scratch.offset + part.end) || operands.buf.size() < 4 * right.end {
        return Err(GpuError::UnsupportedShape(format!(
            "an attention on products over {} queries and {} keys of {d}, {heads} of {} heads at a time, needs {} bytes of scratch and {} of right operands",
            s.q_len,
            s.kv_len,
            s.q_heads,
            4 * part.end,
            4 * right.end
        )));
    }
    if s.q_len == 0 || s.kv_len == 0 {
        return Ok(());
    }
    let at = |offset: u64, stride: u64| Mat { buf: scratch.buf, offset: scratch.offset + offset, stride };
    let beside = |offset: u64, stride: u64| Mat { buf: operands.buf, offset, stride };
    let (width, pitch) = (heads * d, part.pitch);
    let stack = part.chunked;
    let (state, factors, output) = (at(stack.state, 2), at(stack.factors, 1), at(part.output, d));
    let (probabilities, row) = probabilities_in(at(stack.scores, 1), part.chunk);
    let (key_rows, key_scales) = (beside(right.keys, d / 2), beside(right.key_scales, 1));
    for first in (0..s.q_heads).step_by(heads as usize) {
        let stacked = heads.min(s.q_heads - first);
        // The stack's heads' keys and values as f32 rows (grouped heads share theirs).
        let kv_first = first / group;
        let kv_heads = (first + stacked - 1) / group + 1 - kv_first;
        // Read where they lie: f32 rows, or f16 pieces as the values they stand for.
        let [keys, values] = match qkv {
            HeadInputs::Rows(r) => [Source::Rows(r.k), Source::Rows(r.v)],
            HeadInputs::Pieces(p) => [Source::Pieces(p.k), Source::Pieces(p.v)],
        }
        .map(|x| x.cols_from(kv_first * d));
        let [keys, values] = [keys?, values?];
        for rows in chunks(s.q_len, band) {
            let queries = stack_queries(gpu, sink, qkv, [first, stacked], rows.clone(), [at(stack.queries, width / 2), at(stack.query_scales, heads)], d)?;
            let (band_rows, stack_rows) = (rows.end - rows.start, stacked * pitch);
            for (i, keys_in) in chunks(s.kv_len, ATTENTION_KEY_CHUNK).enumerate() {
                let n = keys_in.end - keys_in.start;
                for (j, q) in (0..).zip(&queries) {
                    // Each kv head's keys packed once, for its group's query heads in turn.
                    let kv = (first + j) / group - kv_first;
                    if j == 0 || (first + j) % group == 0 {
                        pack_key_rows(gpu, sink, keys.cols_from(kv * d)?.rows_from(keys_in.start), [key_rows, key_scales], [n, d])?;
                    }
                    let counted = Scores { scale: s.scale, causal: s.causal, keep: key_keep, q_first: rows.start, k_first: keys_in.start };
                    linear_softmax(gpu, sink, Input::Half(*q), packed(key_rows, key_scales, d), probabilities.rows_from(j * pitch), counted, Gemm { m: band_rows, n, k: d })?;
                }
                // Every head's rows of the stack at once (the rows past a head's band are never read out).
                chunk_combine(gpu, sink, probabilities, [state, factors], [stack_rows, n.div_ceil(PROBABILITY_PIECE)], row, i > 0)?;
                // The weighted sum over whole f16 pairs: an odd chunk's probabilities and values padded with a zero.
                let paired = n.next_multiple_of(2);
                let (value_rows, value_scales) = (beside(right.values, paired / 2), beside(right.value_scales, 1));
                pack_columns(gpu, sink, values.rows_from(keys_in.start), [value_rows, value_scales], [n, kv_heads * d])?;
                let weighted = Gemm { m: stack_rows, n: d, k: paired };
                let heads_on = Stack { rows: pitch, count: stacked, group, skew: first % group };
                linear_stacked(gpu, sink, Input::Half(probabilities.pieces()), packed(value_rows, value_scales, paired), output, (i > 0).then_some(factors), weighted, heads_on)?;
            }
            let out = head_of(o, first, d)?.rows_from(rows.start);
            normalise_into_pieces(gpu, sink, [output, state], out, [stacked, pitch, band_rows, d])?;
        }
    }
    Ok(())
}

/// Each of the stack's heads' queries `rows` (heads `first ..` of
/// `stacked`) as the scores' product reads them: f16 pieces as stored, or
/// f32 rows packed into `[words, scales]` (a scale a head's row) first.
fn stack_queries<'a>(gpu: &Gpu, sink: &mut dyn Sink, qkv: HeadInputs<'a>, [first, stacked]: [u64; 2], rows: std::ops::Range<u64>, [words, scales]: [Mat<'a>; 2], d: u64) -> Result<Vec<HalfMat<'a>>, GpuError> {
    match qkv {
        HeadInputs::Pieces(p) => (first..first + stacked)
            .map(|h| head_of(p.q, h, d).map(|q| q.rows_from(rows.start)))
            .collect(),
        HeadInputs::Rows(r) => {
            let shape = HeadRows { tokens: rows.end - rows.start, heads: stacked, head_dim: d };
            half_pack(gpu, sink, r.q.cols_from(first * d).rows_from(rows.start), words, scales, shape)?;
            Ok((0..stacked).map(|j| HalfMat::pieces(words.cols_from(j * d / 2), scales.cols_from(j), d)).collect())
        }
    }
}


/// Head `h` of `d` values of `m`'s f16 rows in pieces.
fn head_of(m: HalfMat<'_>, h: u64, d: u64) -> Result<HalfMat<'_>, GpuError> {
    m.cols_from(h * d).ok_or_else(|| GpuError::UnsupportedShape(format!("head {h} of {d} in f16 pieces of {:?}", m.piece)))
}

/// f16 rows of `k` values (`words`, contiguous) under their range scales
/// (`scales`, one a row) as a product's right operand.
fn packed<'a>(words: Mat<'a>, scales: Mat<'a>, k: u64) -> Weight<'a> {
    let scales = Some(RowScales { buf: scales.buf, offset: scales.offset, k, packed: true });
    Weight { buf: words.buf, offset: 2 * words.offset, dtype: WeightDtype::Bf16, scales }
}


/// The probabilities a [`linear_softmax`] writes for chunks of `chunk`
/// keys into the scores' rows from `scores`' first element (rows laid out
/// as [`ProbabilityRow`] says), and that layout.
fn probabilities_in(scores: Mat<'_>, chunk: u64) -> (Probabilities<'_>, ProbabilityRow) {
    let row = ProbabilityRow::of(chunk);
    let at = |offset: u64| Mat { offset: scores.offset + offset, stride: row.words, ..scores };
    (Probabilities { words: at(0), exponents: at(row.exponents), sums: at(row.sums) }, row)
}

/// [`CHUNK_COMBINE`] over `rows` rows of `pieces` pieces of `probabilities`
/// (rows laid out as `row`), continuing the softmax in `state` where
/// `continues`, each row's factor for the output so far into `factors`;
/// split over rows where one binding cannot hold them.
fn chunk_combine(gpu: &Gpu, sink: &mut dyn Sink, probabilities: Probabilities<'_>, [state, factors]: [Mat<'_>; 2], [rows, pieces]: [u64; 2], row: ProbabilityRow, continues: bool) -> Result<(), GpuError> {
    let stride = probabilities.words.stride;
    let piece_rows = Rows::mat(probabilities.words, stride, "attention probabilities");
    let state_rows = Rows::mat(state, 2, "attention state");
    let factor_rows = Rows::mat(factors, 1, "attention factors");
    for chunk in row_chunks(gpu, rows, &[piece_rows, state_rows, factor_rows], 1)? {
        let [pw, tw, fw] = [piece_rows, state_rows, factor_rows].map(|r| r.window(gpu, &chunk));
        let (pw, tw, fw) = (pw?, tw?, fw?);
        let n = chunk.end - chunk.start;
        let params = ChunkParams {
            rows: to_u32(n, "attention rows")?,
            scores_stride: to_u32(stride, "attention scores' stride")?,
            exponents: to_u32(pw.local as u64 + row.exponents, "attention probabilities' exponents")?,
            sums: to_u32(pw.local as u64 + row.sums, "attention probabilities' sums")?,
            pieces: to_u32(pieces, "attention probabilities' pieces")?,
            state: tw.local,
            from_state: continues as u32,
            factors: fw.local,
            ..Default::default()
        };
        dispatch(gpu, sink, Launch { kernel: &CHUNK_COMBINE, constants: &[], params, grid: grid64(n) }, &[(2, &pw), (3, &tw), (6, &fw)]);
    }
    Ok(())
}

/// Keys or values as a pack reads them: f32 rows, or f16 pairs in pieces
/// (each read as the value it stands for, exactly).
#[derive(Debug, Clone, Copy)]
enum Source<'a> {
    Rows(Mat<'a>),
    Pieces(HalfMat<'a>),
}

impl<'a> Source<'a> {
    fn rows_from(self, row: u64) -> Self {
        match self {
            Source::Rows(m) => Source::Rows(m.rows_from(row)),
            Source::Pieces(h) => Source::Pieces(h.rows_from(row)),
        }
    }

    /// The same from column `col` on (whole pieces).
    fn cols_from(self, col: u64) -> Result<Self, GpuError> {
        match self {
            Source::Rows(m) => Ok(Source::Rows(m.cols_from(col))),
            Source::Pieces(h) => h.cols_from(col).map(Source::Pieces).ok_or_else(|| GpuError::UnsupportedShape(format!("keys or values from column {col} of f16 pieces of {:?}", h.piece))),
        }
    }

    /// `rows` rows of `width` as a pack reads them: its windows at bindings
    /// 5 (f32 rows), 7 (f16 pairs) and 8 (their pieces' scales), the ones
    /// it does not read on the same buffer, and `params` saying where.
    fn bind(self, gpu: &'a Gpu, [rows, width]: [u64; 2], params: &mut ChunkParams) -> Result<[Window<'a>; 3], GpuError> {
        match self {
            Source::Rows(m) => {
                let w = window(gpu, m.buf, 4, m.offset..m.offset + (rows - 1) * m.stride + width, "attention keys or values")?;
                (params.src, params.src_stride) = (w.local, to_u32(m.stride, "attention keys' or values' stride")?);
                Ok([w.clone(), w.clone(), w])
            }
            Source::Pieces(h) => {
                let piece = h.piece.filter(|&p| p > 0 && p.is_multiple_of(2)).ok_or_else(|| GpuError::UnsupportedShape(format!("keys or values in f16 pieces of {:?}", h.piece)))?;
                let d = h.data;
                let ww = window(gpu, d.buf, 4, d.offset..d.offset + (rows - 1) * d.stride + width.div_ceil(2), "attention keys' or values' pieces")?;
                let c = h.scales;
                let cw = window(gpu, c.buf, 4, c.offset..c.offset + (rows - 1) * c.stride + width.div_ceil(piece), "attention keys' or values' scales")?;
                params.src = to_u32(2 * ww.local as u64, "attention keys' or values' first value")?;
                params.src_stride = to_u32(2 * d.stride, "attention keys' or values' stride")?;
                (params.src_piece, params.src_scales) = (to_u32(piece, "attention keys' or values' piece")?, cw.local);
                params.src_scales_stride = to_u32(c.stride, "attention keys' or values' scales' stride")?;
                Ok([ww.clone(), ww, cw])
            }
        }
    }
}

/// [`PACK_KEY_ROWS`]: `keys` keys of `width` from `source` into f16 rows
/// (`packed`, `width / 2` words a key) under each key's range scale
/// (`scales`): [`half_pack`]'s arithmetic over the values the source
/// stands for.
fn pack_key_rows(gpu: &Gpu, sink: &mut dyn Sink, source: Source<'_>, [packed, scales]: [Mat<'_>; 2], [keys, width]: [u64; 2]) -> Result<(), GpuError> {
    let dw = window(gpu, packed.buf, 4, packed.offset..packed.offset + keys * width / 2, "attention keys packed")?;
    let cw = window(gpu, scales.buf, 4, scales.offset..scales.offset + keys, "attention keys' scales")?;
    let mut params = ChunkParams { keys: to_u32(keys, "attention keys")?, width: to_u32(width, "attention width")?, dst: dw.local, dst_scales: cw.local, ..Default::default() };
    let [sw, ww, scw] = source.bind(gpu, [keys, width], &mut params)?;
    dispatch(gpu, sink, Launch { kernel: &PACK_KEY_ROWS, constants: &[], params, grid: grid64(keys) }, &[(1, &dw), (2, &cw), (5, &sw), (7, &ww), (8, &scw)]);
    Ok(())
}

/// [`PACK_COLUMNS`]: `keys` rows of `width` values from `source` into
/// `width` f16 rows of `keys` values (`packed`, contiguous words; an odd
/// `keys` padded with a zero to whole pairs) under each row's range scale
/// (`scales`).
fn pack_columns(gpu: &Gpu, sink: &mut dyn Sink, source: Source<'_>, [packed, scales]: [Mat<'_>; 2], [keys, width]: [u64; 2]) -> Result<(), GpuError> {
    let dw = window(gpu, packed.buf, 4, packed.offset..packed.offset + width * keys.div_ceil(2), "attention values packed")?;
    let cw = window(gpu, scales.buf, 4, scales.offset..scales.offset + width, "attention values' scales")?;
    let mut params = ChunkParams { keys: to_u32(keys, "attention keys")?, width: to_u32(width, "attention width")?, dst: dw.local, dst_scales: cw.local, ..Default::default() };
    let [sw, ww, scw] = source.bind(gpu, [keys, width], &mut params)?;
    dispatch(gpu, sink, Launch { kernel: &PACK_COLUMNS, constants: &[], params, grid: wrapped_grid(width) }, &[(1, &dw), (2, &cw), (5, &sw), (7, &ww), (8, &scw)]);
    Ok(())
}

/// [`NORMALISE_ROWS`]: `o`'s `rows` rows of `width` divided by their sums in `state`.
fn normalise_rows(gpu: &Gpu, sink: &mut dyn Sink, o: Mat<'_>, state: Mat<'_>, [rows, width]: [u64; 2]) -> Result<(), GpuError> {
    let o_rows = Rows::mat(o, width, "attention output");
    let state_rows = Rows::mat(state, 2, "attention state");
    for chunk in row_chunks(gpu, rows, &[o_rows, state_rows], 1)? {
        let (ow, tw) = (o_rows.window(gpu, &chunk)?, state_rows.window(gpu, &chunk)?);
        let n = chunk.end - chunk.start;
        let params = ChunkParams {
            rows: to_u32(n, "attention rows")?,
            width: to_u32(width, "attention width")?,
            state: tw.local,
            o: ow.local,
            o_stride: to_u32(o.stride, "attention output stride")?,
            ..Default::default()
        };
        dispatch(gpu, sink, Launch { kernel: &NORMALISE_ROWS, constants: &[], params, grid: grid64(n * width) }, &[(3, &tw), (4, &ow)]);
    }
    Ok(())
}

/// [`NORMALISE_INTO_PIECES`]: the stack's `output` rows (`heads` heads of
/// `pitch` rows of `width`, the first `band` of each a query's) divided by
/// their sums in `state` into `o`'s f16 pieces (`o` from the stack's first
/// head and the band's first query): the bits of [`normalise_rows`] and a
/// [`half_pack`] a head.
fn normalise_into_pieces(gpu: &Gpu, sink: &mut dyn Sink, [output, state]: [Mat<'_>; 2], o: HalfMat<'_>, [heads, pitch, band, width]: [u64; 4]) -> Result<(), GpuError> {
    let piece = o.piece.filter(|&p| p > 0 && width.is_multiple_of(p) && p.is_multiple_of(2));
    let Some(piece) = piece else {
        return Err(GpuError::UnsupportedShape(format!("an attention's output of {width} into f16 pieces of {:?}", o.piece)));
    };
    let rows = heads * pitch;
    let ow = window(gpu, output.buf, 4, output.offset..output.offset + (rows - 1) * output.stride + width, "attention output")?;
    let tw = window(gpu, state.buf, 4, state.offset..state.offset + 2 * rows, "attention state")?;
    let dw = window(gpu, o.data.buf, 4, o.data.offset..o.data.offset + (band - 1) * o.data.stride + heads * width / 2, "attention output pieces")?;
    let cw = window(gpu, o.scales.buf, 4, o.scales.offset..o.scales.offset + (band - 1) * o.scales.stride + heads * width / piece, "attention output pieces' scales")?;
    let params = ChunkParams {
        rows: to_u32(rows, "attention rows")?,
        width: to_u32(width, "attention width")?,
        state: tw.local,
        o: ow.local,
        o_stride: to_u32(output.stride, "attention output stride")?,
        dst: dw.local,
        dst_scales: cw.local,
        pitch: to_u32(pitch, "attention rows a head")?,
        band: to_u32(band, "attention band")?,
        dst_stride: to_u32(o.data.stride, "attention output pieces' stride")?,
        dst_scales_stride: to_u32(o.scales.stride, "attention output scales' stride")?,
        piece: to_u32(piece, "attention output piece")?,
        ..Default::default()
    };
    dispatch(gpu, sink, Launch { kernel: &NORMALISE_INTO_PIECES, constants: &[], params, grid: grid64(rows * (width / piece)) }, &[(1, &dw), (2, &cw), (3, &tw), (4, &ow)]);
    Ok(())
}

#[cfg(test)]
#[path = "attention_chunks_tests.rs"]
mod tests;
