//! Where the attentions on products keep their working values: the VAE's
//! chunked attention ([`Op::ChunkedAttention`](super::Op::ChunkedAttention)) and the transformer's
//! attention on products ([`HeadsOnProducts`]), in f32 elements.

use super::{Op, Operand, F32};

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
/// the queries as f16 rows and their scales, the scores' rows (`rows`
/// rows laid out as [`ProbabilityRow`] says for `chunk` keys), each
/// row's running maximum and sum where no carry holds them, and each row's
/// factor for the output so far (where the softmax's maximum rose).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkedScratch {
    pub queries: u64,
    pub query_scales: u64,
    pub scores: u64,
    pub state: u64,
    pub factors: u64,
    pub end: u64,
}

impl ChunkedScratch {
    pub const fn new(rows: u64, head_dim: u64) -> Self {
        Self::with_chunk(rows, head_dim, ATTENTION_KEY_CHUNK)
    }

    /// The same with scores' rows of `chunk` keys.
    pub const fn with_chunk(rows: u64, head_dim: u64, chunk: u64) -> Self {
        let query_scales = after(0, rows * head_dim / 2);
        let scores = after(query_scales, rows);
        let state = after(scores, rows * ProbabilityRow::of(chunk).words);
        let factors = after(state, 2 * rows);
        let end = after(factors, rows);
        Self { queries: 0, query_scales, scores, state, factors, end }
    }
}

/// Keys in a piece of an attention's probabilities: the scores' product
/// writes each piece under an exponent of its own, with its sum.
pub const ATTENTION_PROBABILITY_PIECE: u64 = 64;

/// How a row of an attention's scores' region holds what the scores'
/// product writes for a chunk of `chunk` keys (in words from the row's
/// start): the probabilities as f16 pairs (an odd chunk's last pair padded
/// with a zero), then each piece's exponent (the scale the combining pass
/// makes of it), then each piece's sum; `words` from one row to the next
/// (whole vec4s, as the products' vector loads and stores take rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbabilityRow {
    pub pieces: u64,
    pub exponents: u64,
    pub sums: u64,
    pub words: u64,
}

impl ProbabilityRow {
    pub const fn of(chunk: u64) -> Self {
        let pairs = chunk.div_ceil(2);
        let pieces = (2 * pairs).div_ceil(ATTENTION_PROBABILITY_PIECE);
        Self { pieces, exponents: pairs, sums: pairs + pieces, words: (pairs + 2 * pieces).next_multiple_of(4) }
    }
}

/// Where a [`Op::ChunkedAttention`](super::Op::ChunkedAttention)'s right operands lie, in f32 elements
/// of a buffer of their own (a product reads its right operand through a
/// read-only binding, which no writable binding of the same buffer may
/// share in a dispatch): a chunk of `keys` keys of one head as f16 rows and
/// their scales, its values of `heads` heads transposed (`[heads·head_dim,
/// keys]` f16: an attention on products stacks heads, [`HeadsOnProducts`])
/// and their scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkedOperands {
    pub keys: u64,
    pub key_scales: u64,
    pub values: u64,
    pub value_scales: u64,
    pub end: u64,
}

impl ChunkedOperands {
    pub const fn new(head_dim: u64, heads: u64, keys: u64) -> Self {
        let chunk = keys.next_multiple_of(2);
        let key_scales = after(0, chunk * head_dim / 2);
        let values = after(key_scales, chunk);
        let value_scales = after(values, heads * head_dim * chunk / 2);
        let end = after(value_scales, heads * head_dim);
        Self { keys: 0, key_scales, values, value_scales, end }
    }

    /// Bytes of the buffer.
    pub const fn bytes(head_dim: u64, heads: u64, keys: u64) -> u64 {
        F32 * Self::new(head_dim, heads, keys).end
    }
}

/// Queries an attention of many heads on products takes at a time
/// ([`HeadsOnProducts`]): what bounds its scores' scratch (a band's rows of
/// [`ATTENTION_KEY_CHUNK`] keys, 70 MB a head), whatever the image's size; 1024²'s
/// 4608 tokens take one band.
pub const ATTENTION_QUERY_BAND: u64 = 8192;

/// Rows of one head's band in an attention on products' stack of heads: a
/// whole number of the GEMM core's blocks (128 rows on 16×16 tiles, 64 on
/// 8×8), so that no block holds two heads' rows.
pub const ATTENTION_STACK_PITCH: u64 = 128;

/// Blocks of `P·V` an attention on products aims to give a dispatch: two
/// workgroups on each of an H100's or H200's 132 multiprocessors. One head's
/// `P·V` at 1024² (4608 queries, 128 dims) is 36 blocks of 128 × 128, a
/// quarter of such a card; heads stacked fill it.
pub const ATTENTION_FILL_BLOCKS: u64 = 264;

/// The most bytes the stacked heads' scores take (a band's rows of a
/// chunk's keys, [`ATTENTION_KEY_CHUNK`] or fewer, as [`ProbabilityRow`]s a
/// head): at 1024² and 2048² the heads that fill the card take less (7
/// heads, 277 MB; 4 in bands of 8192 queries, 281 MB).
pub const ATTENTION_STACKED_SCORES: u64 = 512 << 20;

/// Blocks of the GEMM core (128 × 128 on 16×16 tiles) one head's `P·V`
/// takes over `band` queries of `head_dim`, its rows `pitch` of a stack.
pub const fn head_blocks(band: u64, head_dim: u64) -> u64 {
    band.div_ceil(ATTENTION_STACK_PITCH) * head_dim.div_ceil(ATTENTION_STACK_PITCH)
}

/// Keys of a chunk of an attention on products over `kv_len` keys.
pub const fn products_chunk(kv_len: u64) -> u64 {
    if kv_len < ATTENTION_KEY_CHUNK {
        kv_len
    } else {
        ATTENTION_KEY_CHUNK
    }
}

/// Heads an attention on products stacks for `band` queries of
/// `head_dim` over `kv_len` keys and `q_heads` query heads: as many as fill
/// [`ATTENTION_FILL_BLOCKS`] of `P·V` and whose scores fit
/// [`ATTENTION_STACKED_SCORES`], at least one (grouped heads, sharing
/// their keys and values, stack alike).
pub const fn heads_at_once(band: u64, kv_len: u64, head_dim: u64, q_heads: u64) -> u64 {
    if q_heads == 0 {
        return 1;
    }
    let pitch = band.next_multiple_of(ATTENTION_STACK_PITCH);
    let blocks = head_blocks(band, head_dim);
    // Whole heads in one wave of blocks: one more would start a second wave for its few blocks.
    let filling = ATTENTION_FILL_BLOCKS / if blocks == 0 { 1 } else { blocks };
    let fitting = ATTENTION_STACKED_SCORES / (F32 * pitch * ProbabilityRow::of(products_chunk(kv_len)).words);
    let heads = if filling < fitting { filling } else { fitting };
    let heads = if heads < q_heads { heads } else { q_heads };
    if heads == 0 {
        1
    } else {
        heads
    }
}

/// Where an [`Op::Attention`](super::Op::Attention) that runs as products
/// on the GEMM core (the matrix tier's attention where its flash kernel is
/// not proven) keeps its working values, in f32 elements of a buffer of
/// the runner's. It takes `heads` heads at a time, over bands of at most
/// [`ATTENTION_QUERY_BAND`] queries, each head's band `pitch` rows of the
/// stack: first a [`ChunkedScratch`] for the stack's rows with scores'
/// rows of `chunk` keys (its queries' part holds a band's queries packed
/// where they come as f32 rows, `[pitch, heads·head_dim]`, a scale a
/// head's row), then the stack's output (`[heads·pitch, head_dim]` f32);
/// its keys and values are read where they lie, f32 rows or f16 pieces.
/// Its right operands lie in another ([`ChunkedOperands`] of `heads` heads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadsOnProducts {
    pub heads: u64,
    pub pitch: u64,
    pub chunk: u64,
    pub chunked: ChunkedScratch,
    pub output: u64,
    pub end: u64,
}

impl HeadsOnProducts {
    /// The layout an attention of `q_len` queries over `kv_len` keys of
    /// `head_dim` and `q_heads` query heads takes in a buffer of at most
    /// `max_buffer` bytes: bands of at most [`ATTENTION_QUERY_BAND`],
    /// [`heads_at_once`] heads, fewer where the buffer would not hold them
    /// (at least one).
    pub const fn new(q_len: u64, kv_len: u64, head_dim: u64, q_heads: u64, max_buffer: u64) -> Self {
        let band = if q_len < ATTENTION_QUERY_BAND { q_len } else { ATTENTION_QUERY_BAND };
        let mut stacked = heads_at_once(band, kv_len, head_dim, q_heads);
        while stacked > 1 && F32 * Self::laid_out(kv_len, head_dim, band, stacked).end > max_buffer {
            stacked -= 1;
        }
        Self::laid_out(kv_len, head_dim, band, stacked)
    }

    /// The layout for bands of `band` queries, `heads` heads at a time.
    pub const fn laid_out(kv_len: u64, head_dim: u64, band: u64, heads: u64) -> Self {
        let (pitch, chunk) = (band.next_multiple_of(ATTENTION_STACK_PITCH), products_chunk(kv_len));
        let stack = heads * pitch;
        let chunked = ChunkedScratch::with_chunk(stack, head_dim, chunk);
        let output = chunked.end;
        let end = after(output, stack * head_dim);
        Self { heads, pitch, chunk, chunked, output, end }
    }

    /// Device bytes such an attention takes beside the arena: this scratch
    /// and the right operands' buffer.
    pub const fn bytes(q_len: u64, kv_len: u64, head_dim: u64, q_heads: u64, max_buffer: u64) -> u64 {
        let part = Self::new(q_len, kv_len, head_dim, q_heads, max_buffer);
        F32 * part.end + ChunkedOperands::bytes(head_dim, part.heads, part.chunk)
    }
}

/// Which of the matrix tier's attentions run as products on the GEMM core
/// ([`HeadsOnProducts`]): those over f16 pieces, those over f32 rows (each
/// where the flash kernel's check of that path failed, or where asked).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttentionProducts {
    pub over_pieces: bool,
    pub over_rows: bool,
}

impl AttentionProducts {
    /// None: the flash kernel (or the tiers without matrix units) runs them all.
    pub const NONE: Self = AttentionProducts { over_pieces: false, over_rows: false };

    /// Whether either path runs as products.
    pub const fn any(self) -> bool {
        self.over_pieces || self.over_rows
    }

    /// `[len, q_heads, kv_heads, head_dim]` of `op` where it runs as
    /// products on the GEMM core: the transformer's attention over every
    /// row (`Op::Attention`) or the text encoder's causal one, into f16
    /// pieces, over f16 pieces or f32 rows where that path does.
    pub fn shape_of(self, op: &Op) -> Option<[u64; 4]> {
        let (q, k, v, o, shape) = match op {
            Op::Attention { q, k, v, o, len, heads, head_dim } => (q, k, v, o, [*len, *heads, *heads, *head_dim]),
            Op::CausalAttention { q, k, v, o, len, q_heads, kv_heads, head_dim } => (q, k, v, o, [*len, *q_heads, *kv_heads, *head_dim]),
            _ => return None,
        };
        let pieces = |x: &Operand| x.scales.is_some() && x.piece.is_some();
        let path = match [q, k, v].map(pieces) {
            [true, true, true] => self.over_pieces,
            _ if [q, k, v].iter().all(|x| x.scales.is_none()) => self.over_rows,
            _ => false,
        };
        (pieces(o) && path).then_some(shape)
    }
}

/// The buffers a program's attentions on products take beside the arena,
/// gathered op by op ([`ProductBuffers::add`]): the right operands' bytes
/// (the largest: an attention on products' stack of heads, or a chunked
/// attention's head) and the scratch's f32 elements (the largest attention
/// on products'); `None` where no op takes one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProductBuffers {
    pub operands: Option<u64>,
    pub scratch: Option<u64>,
}

impl ProductBuffers {
    /// `op`'s share where `products` says which attentions run as products,
    /// each buffer at most `max_buffer` bytes.
    pub fn add(&mut self, op: &Op, products: AttentionProducts, max_buffer: u64) {
        let bytes = match (op, products.shape_of(op)) {
            (Op::ChunkedAttention { head_dim, .. }, _) => ChunkedOperands::bytes(*head_dim, 1, ATTENTION_KEY_CHUNK),
            (_, Some([len, heads, _, head_dim])) => {
                let part = HeadsOnProducts::new(len, len, head_dim, heads, max_buffer);
                self.scratch = self.scratch.max(Some(part.end));
                ChunkedOperands::bytes(head_dim, part.heads, part.chunk)
            }
            _ => return,
        };
        self.operands = self.operands.max(Some(bytes));
    }

    /// Both in bytes, together.
    pub fn bytes(&self) -> u64 {
        self.operands.unwrap_or(0) + F32 * self.scratch.unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scores' row an attention takes (the chunked attention's, and
    /// an attention on products' over any number of keys) holds the
    /// probabilities of its keys, each piece's exponent and sum, apart and
    /// in whole vec4s.
    #[test]
    fn every_scores_row_holds_its_probabilities() {
        for kv_len in (1..=2 * ATTENTION_KEY_CHUNK).chain([ATTENTION_KEY_CHUNK * 7 + 5]) {
            let chunk = products_chunk(kv_len);
            let row = ProbabilityRow::of(chunk);
            let keys = kv_len.min(chunk).next_multiple_of(2);
            assert!(2 * row.exponents >= keys && row.pieces * ATTENTION_PROBABILITY_PIECE >= keys, "{kv_len} keys: {row:?}");
            assert!(row.sums == row.exponents + row.pieces && row.sums + row.pieces <= row.words && row.words.is_multiple_of(4), "{kv_len} keys: {row:?}");
        }
        // 4032 keys: 2016 words of probabilities, 63 pieces, 2142 words in 2144.
        assert_eq!(ProbabilityRow::of(ATTENTION_KEY_CHUNK), ProbabilityRow { pieces: 63, exponents: 2016, sums: 2079, words: 2144 });
    }
}
