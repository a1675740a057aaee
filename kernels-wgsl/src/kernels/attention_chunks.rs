//! The matrix tier's attention of one wide head as products on the matrix
//! core (the VAE's mid-block on the channels-last path: one head of 512
//! dims over every latent pixel). For each chunk of
//! [`ATTENTION_KEY_CHUNK`] keys: the GEMM core's `Q·Kᵀ` over f16 rows under
//! their range scales into f32 scores, the online softmax into f16
//! probabilities (`attention_chunks.wgsl`), and the GEMM core's `P·V` onto
//! the output; the output divided by each row's sum after the last chunk.
//! The one-subgroup matrix attention computes a 512-wide head's scores a
//! subgroup at a time; here both products run on the GEMM core's blocks.
//!
//! Every value of a query's row is computed from that row, the keys of its
//! chunk and the carried state alone, in one fixed order: calls over whole
//! chunks of the keys carrying the softmax ([`Carry`]), for any bands of
//! queries, give the bits of one call over all of them.

use crate::device::Gpu;
use crate::dispatch::{chunks, dispatch, grid64, row_chunks, to_u32, window, Launch, Rows, Sink};
use crate::error::GpuError;
use crate::kernel::{kernel, wrapped_grid, Access::ReadWrite as RW, Kernel, Module};
use crate::kernels::attention::{Attention, Carry, HalfQkv, Qkv};
use crate::kernels::half_pack::{half_pack, half_widen};
use crate::kernels::linear::{linear_from, linear_rescaling, Gemm, Input};
use crate::view::{HalfMat, HeadRows, Mat, RowScales, Weight, WeightDtype};
use bytemuck::{Pod, Zeroable};
use flux_lite_core::ir::{ChunkedOperands, ChunkedScratch, HeadsOnProducts, ATTENTION_KEY_CHUNK, ATTENTION_QUERY_BAND};

/// `attention_chunks.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct ChunkParams {
    pub rows: u32,
    pub keys: u32,
    pub width: u32,
    pub scores: u32,
    pub scores_stride: u32,
    pub score_scales: u32,
    pub state: u32,
    pub o: u32,
    pub o_stride: u32,
    pub src: u32,
    pub src_stride: u32,
    pub dst: u32,
    pub dst_scales: u32,
    pub from_state: u32,
    pub scale: f32,
    pub factors: u32,
}

/// A row's chunk of scores into f16 probabilities, the softmax carried; a workgroup a row.
pub const CHUNK_SOFTMAX: Kernel = kernel(Module::AttentionChunks, "chunk_softmax", [128, 1, 1], &[(1, RW), (2, RW), (3, RW), (6, RW)], size_of::<ChunkParams>(), false);
/// A chunk's values transposed into f16 rows under their range scales; a workgroup a column.
pub const PACK_COLUMNS: Kernel = kernel(Module::AttentionChunks, "pack_columns", [128, 1, 1], &[(1, RW), (2, RW), (5, RW)], size_of::<ChunkParams>(), false);
/// The output rows divided by their softmax's sums.
pub const NORMALISE_ROWS: Kernel = kernel(Module::AttentionChunks, "normalise_rows", [64, 1, 1], &[(3, RW), (4, RW)], size_of::<ChunkParams>(), false);

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
    chunked_over(gpu, sink, Queries::Rows(qkv.q), [qkv.k, qkv.v], o, carry, scratch, operands, s)
}

/// Where a chunked attention's queries come from: f32 rows, packed into
/// f16 rows under their range scales first; or f16 rows already (in
/// pieces: the transformer's), which the scores' product reads as stored.
#[derive(Debug, Clone, Copy)]
enum Queries<'a> {
    Rows(Mat<'a>),
    Half(HalfMat<'a>),
}

/// [`attention_chunked`] over `queries` of either kind, the keys and
/// values f32 rows; `scratch` and `operands` as there.
#[allow(clippy::too_many_arguments)] // as attention_chunked
fn chunked_over(gpu: &Gpu, sink: &mut dyn Sink, queries: Queries<'_>, [k, v]: [Mat<'_>; 2], o: Mat<'_>, carry: Option<Carry<'_>>, scratch: Mat<'_>, operands: &wgpu::Buffer, s: Attention) -> Result<(), GpuError> {
    let (rows, d) = (s.q_len, s.head_dim);
    if !runs_chunked_attention(gpu) || s.causal || s.q_heads != 1 || s.kv_heads != 1 || !d.is_multiple_of(2) {
        return Err(GpuError::UnsupportedShape(format!(
            "chunked attention is the matrix tier's with f16 operands, of one non-causal head of an even width ({} heads of {d} over {} keys)",
            s.q_heads, s.kv_len
        )));
    }
    if operands.size() < ChunkedOperands::bytes(d) {
        return Err(GpuError::UnsupportedShape(format!("a chunked attention over heads of {d} needs {} bytes for its right operands ({} given)", ChunkedOperands::bytes(d), operands.size())));
    }
    if rows == 0 || s.kv_len == 0 {
        return Ok(());
    }
    let (part, right) = (ChunkedScratch::new(rows, d), ChunkedOperands::new(d));
    let at = |offset: u64, stride: u64| Mat { buf: scratch.buf, offset: scratch.offset + offset, stride };
    let beside = |offset: u64, stride: u64| Mat { buf: operands, offset, stride };
    let queries = match queries {
        Queries::Rows(q) => {
            let (words, scales) = (at(part.queries, d / 2), at(part.query_scales, 1));
            half_pack(gpu, sink, q, words, scales, HeadRows { tokens: rows, heads: 1, head_dim: d })?;
            HalfMat::rows(words, scales)
        }
        Queries::Half(q) => q,
    };
    let scores = at(part.scores, ATTENTION_KEY_CHUNK);
    let probabilities = Input::Half(HalfMat::rows(scores, at(part.score_scales, 1)));
    // Each row's maximum and sum side by side, whatever the carry's stride says (as the carried kernel reads them).
    let state = carry.map_or(at(part.state, 2), |c| Mat { stride: 2, ..c.state });
    for (i, keys) in chunks(s.kv_len, ATTENTION_KEY_CHUNK).enumerate() {
        let n = keys.end - keys.start;
        let continues = i > 0 || carry.is_some_and(|c| c.from_state);
        let (key_rows, key_scales) = (beside(right.keys, d / 2), beside(right.key_scales, 1));
        half_pack(gpu, sink, rows_from(k, keys.start), key_rows, key_scales, HeadRows { tokens: n, heads: 1, head_dim: d })?;
        linear_from(gpu, sink, Input::Half(queries), packed(key_rows, key_scales, d), None, scores, Gemm { m: rows, n, k: d })?;
        let factors = at(part.factors, 1);
        chunk_softmax(gpu, sink, [scores, state, factors], [rows, n], continues, s.scale, part.score_scales + scratch.offset)?;
        // The weighted sum over whole f16 pairs: an odd chunk's probabilities and values padded with a zero.
        let paired = n.next_multiple_of(2);
        let (value_rows, value_scales) = (beside(right.values, paired / 2), beside(right.value_scales, 1));
        pack_columns(gpu, sink, rows_from(v, keys.start), [value_rows, value_scales], [n, d])?;
        let weighted = Gemm { m: rows, n: d, k: paired };
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

/// Non-causal attention over f32 or f16-pieces queries, keys and values
/// into f16 pieces, as products on the GEMM core: the matrix tier's
/// attention for the transformer where [`Gpu::attention_on_products`] (its
/// flash kernel not proven on that path). For each head: its keys and
/// values in pieces widened to f32 rows in `scratch` (exactly the values
/// they stand for; f32 rows are read in place, and so are the queries, f16
/// pieces read by the scores' product as stored), [`attention_chunked`]'s
/// passes over bands of at most [`ATTENTION_QUERY_BAND`] queries, and the
/// output packed into `o`'s pieces under their range scales. `scratch`
/// holds [`HeadsOnProducts`] (f32 elements from `scratch.offset`),
/// `operands` [`ChunkedOperands`].
#[allow(clippy::too_many_arguments)] // the attention's operands and its two scratches
pub fn attention_on_products(gpu: &Gpu, sink: &mut dyn Sink, qkv: HeadInputs<'_>, o: HalfMat<'_>, scratch: Mat<'_>, operands: &wgpu::Buffer, s: Attention) -> Result<(), GpuError> {
    on_products_in_bands(gpu, sink, qkv, o, scratch, operands, s, ATTENTION_QUERY_BAND)
}

/// [`attention_on_products`] over bands of `band` queries, any band giving
/// the same bits.
#[allow(clippy::too_many_arguments)] // as attention_on_products, and the band
pub(crate) fn on_products_in_bands(gpu: &Gpu, sink: &mut dyn Sink, qkv: HeadInputs<'_>, o: HalfMat<'_>, scratch: Mat<'_>, operands: &wgpu::Buffer, s: Attention, band: u64) -> Result<(), GpuError> {
    let d = s.head_dim;
    let piece = o.piece.unwrap_or(0);
    let grouped = s.kv_heads > 0 && s.q_heads.is_multiple_of(s.kv_heads);
    let input_pieces = match qkv {
        HeadInputs::Pieces(h) => [h.q.piece, h.k.piece, h.v.piece],
        HeadInputs::Rows(_) => [o.piece; 3],
    };
    if input_pieces != [o.piece; 3] || piece == 0 || !d.is_multiple_of(piece) || !grouped {
        return Err(GpuError::UnsupportedShape(format!(
            "attention on products over f16 pieces {input_pieces:?} (or f32 rows) into f16 pieces {:?}, {} heads over {} of {d}",
            o.piece, s.q_heads, s.kv_heads
        )));
    }
    let part = HeadsOnProducts::new(s.q_len, s.kv_len, d);
    let band_scratch = ChunkedScratch::new(band.min(s.q_len), d).end;
    if band == 0 || scratch.buf.size() < 4 * (scratch.offset + part.chunked + band_scratch) {
        return Err(GpuError::UnsupportedShape(format!("an attention on products over {} queries and {} keys of {d} needs {} bytes of scratch", s.q_len, s.kv_len, 4 * part.end)));
    }
    let at = |offset: u64| Mat { buf: scratch.buf, offset: scratch.offset + offset, stride: d };
    let [keys, values, output] = [part.keys, part.values, part.output].map(at);
    let pieces = |rows: u64| HeadRows { tokens: rows, heads: d / piece, head_dim: piece };
    let one_head = Attention { q_heads: 1, kv_heads: 1, causal: false, ..s };
    let group = s.q_heads / s.kv_heads;
    for h in 0..s.q_heads {
        let kvh = h / group;
        // The queries as they are (f16 pieces: the scores' product reads them so); keys and values as f32 rows.
        let (head_queries, kv) = match qkv {
            HeadInputs::Rows(r) => (Queries::Rows(head_rows(r.q, h, d)), [head_rows(r.k, kvh, d), head_rows(r.v, kvh, d)]),
            HeadInputs::Pieces(p) => {
                // Grouped heads share their keys and values: widened once a group.
                if h % group == 0 {
                    half_widen(gpu, sink, head_of(p.k, kvh, d)?, keys, pieces(s.kv_len))?;
                    half_widen(gpu, sink, head_of(p.v, kvh, d)?, values, pieces(s.kv_len))?;
                }
                (Queries::Half(head_of(p.q, h, d)?), [keys, values])
            }
        };
        for rows in chunks(s.q_len, band) {
            let band_queries = match head_queries {
                Queries::Rows(q) => Queries::Rows(rows_from(q, rows.start)),
                Queries::Half(q) => Queries::Half(HalfMat { data: rows_from(q.data, rows.start), scales: rows_from(q.scales, rows.start), ..q }),
            };
            let band_shape = Attention { q_len: rows.end - rows.start, ..one_head };
            chunked_over(gpu, sink, band_queries, kv, rows_from(output, rows.start), None, at(part.chunked), operands, band_shape)?;
        }
        let out = head_of(o, h, d)?;
        half_pack(gpu, sink, output, out.data, out.scales, pieces(s.q_len))?;
    }
    Ok(())
}

/// Head `h` of `d` values of `m`'s f32 rows.
fn head_rows(m: Mat<'_>, h: u64, d: u64) -> Mat<'_> {
    Mat { offset: m.offset + h * d, ..m }
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

/// `m` from its row `row` on.
fn rows_from(m: Mat<'_>, row: u64) -> Mat<'_> {
    Mat { offset: m.offset + row * m.stride, ..m }
}

/// [`CHUNK_SOFTMAX`] over `rows` rows of `keys` scores (`scores`, their
/// probabilities' scales from element `score_scales` of its buffer),
/// continuing the softmax in `state` where `continues`, each row's factor
/// for the output so far into `factors`; split over rows where one binding
/// cannot hold them.
fn chunk_softmax(gpu: &Gpu, sink: &mut dyn Sink, [scores, state, factors]: [Mat<'_>; 3], [rows, keys]: [u64; 2], continues: bool, scale: f32, score_scales: u64) -> Result<(), GpuError> {
    let score_rows = Rows::mat(scores, keys, "attention scores");
    let scale_rows = Rows::packed(scores.buf, 4, score_scales, 1, "attention probabilities' scales");
    let state_rows = Rows::mat(state, 2, "attention state");
    let factor_rows = Rows::mat(factors, 1, "attention factors");
    for chunk in row_chunks(gpu, rows, &[score_rows, scale_rows, state_rows, factor_rows], 1)? {
        let [sw, cw, tw, fw] = [score_rows, scale_rows, state_rows, factor_rows].map(|r| r.window(gpu, &chunk));
        let (sw, cw, tw, fw) = (sw?, cw?, tw?, fw?);
        let n = chunk.end - chunk.start;
        let params = ChunkParams {
            rows: to_u32(n, "attention rows")?,
            keys: to_u32(keys, "attention keys")?,
            scores: sw.local,
            scores_stride: to_u32(scores.stride, "attention scores' stride")?,
            score_scales: cw.local,
            state: tw.local,
            from_state: continues as u32,
            scale,
            factors: fw.local,
            ..Default::default()
        };
        dispatch(gpu, sink, Launch { kernel: &CHUNK_SOFTMAX, constants: &[], params, grid: wrapped_grid(n) }, &[(1, &sw), (2, &cw), (3, &tw), (6, &fw)]);
    }
    Ok(())
}

/// [`PACK_COLUMNS`]: `keys` f32 rows of `width` values (`values`) into
/// `width` f16 rows of `keys` values (`packed`, contiguous words; an odd
/// `keys` padded with a zero to whole pairs) under each row's range scale
/// (`scales`).
fn pack_columns(gpu: &Gpu, sink: &mut dyn Sink, values: Mat<'_>, [packed, scales]: [Mat<'_>; 2], [keys, width]: [u64; 2]) -> Result<(), GpuError> {
    let vw = window(gpu, values.buf, 4, values.offset..values.offset + (keys - 1) * values.stride + width, "attention values")?;
    let dw = window(gpu, packed.buf, 4, packed.offset..packed.offset + width * keys.div_ceil(2), "attention values packed")?;
    let cw = window(gpu, scales.buf, 4, scales.offset..scales.offset + width, "attention values' scales")?;
    let params = ChunkParams {
        keys: to_u32(keys, "attention keys")?,
        width: to_u32(width, "attention width")?,
        src: vw.local,
        src_stride: to_u32(values.stride, "attention values' stride")?,
        dst: dw.local,
        dst_scales: cw.local,
        ..Default::default()
    };
    dispatch(gpu, sink, Launch { kernel: &PACK_COLUMNS, constants: &[], params, grid: wrapped_grid(width) }, &[(1, &dw), (2, &cw), (5, &vw)]);
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

#[cfg(test)]
#[path = "attention_chunks_tests.rs"]
mod tests;
