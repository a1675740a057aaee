//! Where the attentions on products keep their working values: the VAE's
//! chunked attention ([`Op::ChunkedAttention`](super::Op::ChunkedAttention)) and the transformer's
//! attention on products ([`HeadsOnProducts`]), in f32 elements.

use super::F32;

/// Keys a [`Op::ChunkedAttention`](super::Op::ChunkedAttention) takes at a time: the scores' and the
/// probabilities' row in its scratch, and the depth of its `P·V` product.
/// Bands of a banded decode take whole chunks, so they meet the whole
/// decode's chunks where it does. Each chunk after the first reads and
/// writes the output again, so the longer the fewer bytes; 4032 (63 × 64)
/// is the longest whose scratch row (its scores, a 512-wide query as f16,
/// six words) fits the buffer the VAE encoder's attention leaves free at
/// the 4B's widths (128 channels, f16, at 64 pixels a latent cell: 4352
/// words), so that neither coder's attention takes memory of its own.
pub const ATTENTION_KEY_CHUNK: u64 = 4032;

/// f32 elements of a [`Op::ChunkedAttention`](super::Op::ChunkedAttention)'s scratch for `rows` queries
/// of `head_dim` ([`ChunkedScratch`]'s parts laid end to end).
pub const fn chunked_attention_scratch(rows: u64, head_dim: u64) -> u64 {
    ChunkedScratch::new(rows, head_dim).end
}

/// `at + elements` on the next 64-element boundary (256 bytes: a storage
/// binding's offset alignment), where the next part starts.
const fn after(at: u64, elements: u64) -> u64 {
    (at + elements).next_multiple_of(64)
}

/// Where a [`Op::ChunkedAttention`](super::Op::ChunkedAttention)'s working values lie in its scratch,
/// in f32 elements from its start, each part on a 64-element boundary:
/// the queries as f16 rows and their scales, the scores (`[rows,
/// ATTENTION_KEY_CHUNK]` f32, each row's probabilities written over its
/// first half as f16 pairs) and the probabilities' scales, each row's
/// running maximum and sum where no carry holds them, and each row's factor
/// for the output so far (where the softmax's maximum rose).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkedScratch {
    pub queries: u64,
    pub query_scales: u64,
    pub scores: u64,
    pub score_scales: u64,
    pub state: u64,
    pub factors: u64,
    pub end: u64,
}

impl ChunkedScratch {
    pub const fn new(rows: u64, head_dim: u64) -> Self {
        let query_scales = after(0, rows * head_dim / 2);
        let scores = after(query_scales, rows);
        let score_scales = after(scores, rows * ATTENTION_KEY_CHUNK);
        let state = after(score_scales, rows);
        let factors = after(state, 2 * rows);
        let end = after(factors, rows);
        Self { queries: 0, query_scales, scores, score_scales, state, factors, end }
    }
}

/// Where a [`Op::ChunkedAttention`](super::Op::ChunkedAttention)'s right operands lie, in f32 elements
/// of a buffer of their own (a product reads its right operand through a
/// read-only binding, which no writable binding of the same buffer may
/// share in a dispatch): a chunk's keys as f16 rows and their scales, its
/// values transposed (`[head_dim, keys]` f16) and their scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkedOperands {
    pub keys: u64,
    pub key_scales: u64,
    pub values: u64,
    pub value_scales: u64,
    pub end: u64,
}

impl ChunkedOperands {
    pub const fn new(head_dim: u64) -> Self {
        let chunk = ATTENTION_KEY_CHUNK;
        let key_scales = after(0, chunk * head_dim / 2);
        let values = after(key_scales, chunk);
        let value_scales = after(values, head_dim * chunk / 2);
        let end = after(value_scales, head_dim);
        Self { keys: 0, key_scales, values, value_scales, end }
    }

    /// Bytes of the buffer.
    pub const fn bytes(head_dim: u64) -> u64 {
        F32 * Self::new(head_dim).end
    }
}

/// Queries an attention of many heads on products takes at a time
/// ([`HeadsOnProducts`]): what bounds its scores' scratch (a band's rows of
/// [`ATTENTION_KEY_CHUNK`] f32, 132 MB), whatever the image's size; 1024²'s
/// 4608 tokens take one band.
pub const ATTENTION_QUERY_BAND: u64 = 8192;

/// Where an [`Op::Attention`](super::Op::Attention) over f16 pieces that runs as products on the
/// GEMM core (the matrix tier's attention where its flash kernel is not
/// proven) keeps its working values, in f32 elements of a buffer of the
/// runner's: one head at a time, its keys and values (widened from f16
/// pieces) and its output as f32 rows of `head_dim`, then a
/// [`ChunkedScratch`] for a band of at most [`ATTENTION_QUERY_BAND`]
/// queries (its queries are read where they lie). Its right operands lie
/// in another ([`ChunkedOperands`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadsOnProducts {
    pub keys: u64,
    pub values: u64,
    pub output: u64,
    pub chunked: u64,
    pub end: u64,
}

impl HeadsOnProducts {
    pub const fn new(q_len: u64, kv_len: u64, head_dim: u64) -> Self {
        let keys = 0;
        let values = after(keys, kv_len * head_dim);
        let output = after(values, kv_len * head_dim);
        let chunked = after(output, q_len * head_dim);
        let band = if q_len < ATTENTION_QUERY_BAND { q_len } else { ATTENTION_QUERY_BAND };
        let end = chunked + ChunkedScratch::new(band, head_dim).end;
        Self { keys, values, output, chunked, end }
    }

    /// Device bytes such an attention takes beside the arena: this scratch
    /// and the right operands' buffer.
    pub const fn bytes(q_len: u64, kv_len: u64, head_dim: u64) -> u64 {
        F32 * Self::new(q_len, kv_len, head_dim).end + ChunkedOperands::bytes(head_dim)
    }
}
