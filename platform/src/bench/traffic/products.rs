//! The product families' traffic (linear, attention, convolution), each
//! lowered as its launcher lowers it: pieces where a binding cannot hold an
//! operand, the matrix tier's measuring passes and f16 pieces.

use super::machine::{operand_rows, pieces, rows_per_piece, DataPath, Machine, Rows, Traffic, RANGE_SCALES_ROWS};
use flux_lite_core::ir::{HeadsOnProducts, Operand, ATTENTION_KEY_CHUNK, ATTENTION_PROBABILITY_PIECE as PROBABILITY_PIECE};
use flux_lite_kernels::kernels::{ATTENTION_MATRIX_MAX_HEAD_DIM, ATTENTION_MATRIX_WIDE_MAX_HEAD_DIM};

/// What a linear does with its products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Out {
    /// Writes them.
    Set,
    /// Adds them into the stream under a gate row (read beside the stream).
    Gated,
    /// Pairs each output's gate and up rows of W (two products an output) into one value.
    SwiGlu,
    /// Writes them with the queries' and keys' heads of this width normed
    /// and rotated (their norm weights and a cos and a sin row a row read).
    HeadNormed(u64),
    /// Writes an attention's scores as f16 probabilities, each piece's
    /// exponent and sum beside them.
    Probabilities,
}

/// Whether a matrix product's epilogue writes f16 rows in pieces of `piece`
/// on machine `m`: its block's outputs (a block's columns, half of them
/// with SwiGLU's pairs) 1, 2 or 4 whole pieces (the kernels'
/// `product_writes_pieces`).
pub(super) fn writes_pieces(m: &Machine, piece: Option<u64>, swiglu: bool) -> bool {
    let block = m.product_block / if swiglu { 2 } else { 1 };
    piece.is_some_and(|p| p > 0 && block.is_multiple_of(p) && block / p <= 4)
}

/// Whether such a product also norms heads of `head_dim` in its epilogue
/// on machine `m` (`product_norms_heads`: a block's outputs a row or half).
pub(super) fn norms_heads(m: &Machine, piece: Option<u64>, head_dim: u64) -> bool {
    writes_pieces(m, piece, false) && (head_dim == m.product_block || 2 * head_dim == m.product_block)
}

/// Whether a SwiGLU product runs in one piece of W on machine `m` (else the
/// runner takes the two products and the SwiGLU apart).
pub(super) fn swiglu_fits(m: &Machine, p: DataPath, cols: u64, inner: u64) -> bool {
    rows_per_piece(m, 2 * cols, &[Rows::packed(inner, p.weight)], 1) >= 2 * cols && (!p.matrix || 2 * cols <= RANGE_SCALES_ROWS)
}

/// `y[rows, cols] = x[rows, inner]·Wᵀ (+ b)` in pieces of rows and of
/// columns (the launcher's loops); on the matrix tier each piece's f32 input
/// measured first (f16 rows come with their scales); W's scales are kept
/// where the weights reached the device. A gated product (`Out::Gated`) reads
/// and writes the stream it adds into, and reads its gate, in its epilogue;
/// a SwiGLU product reads two rows of W an output, in one piece of W.
pub(super) fn linear(m: &Machine, p: DataPath, (x, y): (Operand, Operand), [rows, cols, inner]: [u64; 3], bias: bool, out: Out) -> Traffic {
    let cap = if p.matrix { RANGE_SCALES_ROWS } else { u64::MAX };
    // W's rows an output reads.
    let spans = if out == Out::SwiGlu { 2 } else { 1 };
    let col_piece = match out {
        Out::SwiGlu => cols,
        _ => rows_per_piece(m, cols, &[Rows::packed(inner, p.weight)], m.product_block).min(cap),
    };
    let row_piece = rows_per_piece(m, rows, &[operand_rows(&x, inner, p), operand_rows(&y, col_piece.min(cols), p)], m.product_block).min(cap);
    let mut total = Traffic::default();
    for r in pieces(rows, row_piece) {
        for c in pieces(cols, col_piece) {
            // W's scales, and x's where measured first (f16 rows bring theirs).
            let scales = if p.matrix { (!x.is_half() as u64 * r + spans * c) * p.scale } else { 0 };
            if p.matrix && !x.is_half() {
                total += pass_on(m, r * inner * p.activation + r * p.scale, 0, false);
            }
            // x's rows (with their scales where half), W, bias, scales, y.
            let x_bytes = r * p.row_bytes(&x, inner);
            let written = match out {
                Out::Gated => 2 * r * c * p.activation + c * p.activation,
                Out::Set | Out::SwiGlu => r * p.row_bytes(&y, c),
                Out::HeadNormed(head_dim) => r * p.row_bytes(&y, c) + 2 * head_dim * p.weight + 2 * r * head_dim * 4,
                Out::Probabilities => r * (c.div_ceil(2) * 4 + 2 * c.div_ceil(PROBABILITY_PIECE) * 4),
            };
            let bytes = x_bytes + spans * c * inner * p.weight + bias as u64 * c * p.weight + scales + written;
            total += product_on(m, bytes, 2 * spans * r * c * inner, p.matrix, blocks(m, r, spans * c));
        }
    }
    total
}

/// One dispatch on machine `m` moving `bytes` and computing `flops` on the
/// matrix units (`matrix`) or in FMAs.
pub(super) fn pass_on(m: &Machine, bytes: u64, flops: u64, matrix: bool) -> Traffic {
    let peak = if matrix { m.matrix_flops } else { m.fma_flops };
    let seconds = (flops as f64 / peak).max(bytes as f64 / m.bytes_per_second);
    Traffic { dispatches: 1, bytes, flops, seconds, filled: seconds }
}

/// [`pass_on`] for a product on the matrix units in `workgroups`
/// workgroups (where `matrix`; else in FMAs, as it is): its compute in
/// whole waves of the machine's slots ([`Traffic::filled`]).
pub(super) fn product_on(m: &Machine, bytes: u64, flops: u64, matrix: bool, workgroups: u64) -> Traffic {
    let t = pass_on(m, bytes, flops, matrix);
    if !matrix || workgroups == 0 {
        return t;
    }
    let waves = workgroups.div_ceil(m.workgroup_slots) * m.workgroup_slots;
    let compute = flops as f64 / m.matrix_flops * waves as f64 / workgroups as f64;
    Traffic { filled: compute.max(bytes as f64 / m.bytes_per_second), ..t }
}

/// Blocks of `rows × cols` outputs on machine `m`'s product blocks.
fn blocks(m: &Machine, rows: u64, cols: u64) -> u64 {
    rows.div_ceil(m.product_block) * cols.div_ceil(m.product_block)
}

/// What an attention reads and writes beyond q, k, v and o.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct AttentionIo {
    /// On the matrix units for heads up to the wide modules' 512 dims (the
    /// carried attention), else up to 128.
    pub wide: bool,
    /// Its online softmax's state read and written, and its output read.
    pub carried: bool,
    /// Keys and values as f16 pairs with a range scale per (key, head).
    pub half_kv: bool,
    /// The key mask read.
    pub mask: bool,
    /// The output written as f16 rows in pieces of this many values.
    pub o_pieces: Option<u64>,
    /// The queries, keys and values read as f16 rows in pieces of this many values.
    pub qkv_pieces: Option<u64>,
}

/// Attention of `q_len` queries over `kv_len` keys, in pieces of queries as
/// the bindings allow; on the matrix units on the matrix tier (not over
/// half-precision keys, which take the tiled kernel).
pub(super) fn attention(m: &Machine, p: DataPath, [q_len, kv_len, q_heads, kv_heads, head_dim]: [u64; 5], io: AttentionIo) -> Traffic {
    let a = p.activation;
    let (q_width, kv_width) = (q_heads * head_dim, kv_heads * head_dim);
    // A row of `width` values as stored: f32, or f16 with a scale a piece.
    let row = |width: u64| match io.qkv_pieces {
        Some(piece) => width * 2 + width / piece * 4,
        None => width * a,
    };
    let kv_bytes = match io.half_kv {
        true => 2 * (kv_len * kv_width * 2 + kv_len * kv_heads * 4),
        false => 2 * kv_len * row(kv_width),
    } + io.mask as u64 * kv_len * 4;
    let widest = if io.wide { ATTENTION_MATRIX_WIDE_MAX_HEAD_DIM } else { ATTENTION_MATRIX_MAX_HEAD_DIM };
    let matrix = p.matrix && !io.half_kv && head_dim <= widest;
    let q_rows = Rows::packed(q_width, a);
    let piece = rows_per_piece(m, q_len, &[q_rows, q_rows], 1);
    pieces(q_len, piece)
        .map(|r| {
            let written = match io.o_pieces {
                Some(piece) => r * (q_width * 2 + q_width / piece * 4),
                None => r * q_width * a,
            };
            let bytes = r * row(q_width) + written + io.carried as u64 * (written + 4 * r * q_heads * 4) + kv_bytes;
            // The flash kernel's workgroups: half a block of queries of one head, all its dims.
            product_on(m, bytes, 4 * r * kv_len * q_heads * head_dim, matrix, r.div_ceil(m.product_block / 2) * q_heads * head_dim.div_ceil(m.product_block))
        })
        .sum()
}

/// A convolution in pieces of output channels (one binding of outputs and
/// weights), each over its pieces of pixels; on the matrix tier each piece
/// of pixels' run scales measured first (W's kept since load).
pub(super) fn conv(m: &Machine, p: DataPath, s: flux_lite_core::oracle::ConvShape, residual: bool) -> Traffic {
    let a = p.activation;
    let (plane, taps) = ((s.out_height * s.out_width) as u64, (s.in_channels * s.kernel * s.kernel) as u64);
    let input = (s.in_channels * s.height * s.width) as u64 * a;
    let cap = if p.matrix { RANGE_SCALES_ROWS } else { u64::MAX };
    let channel_piece = rows_per_piece(m, s.out_channels as u64, &[Rows::packed(plane, a), Rows::packed(taps, p.weight)], 1).min(cap);
    let mut total = Traffic::default();
    for c in pieces(s.out_channels as u64, channel_piece) {
        let out = c * plane * a * (1 + residual as u64);
        let weights = c * taps * p.weight + c * p.weight;
        if !p.matrix {
            total += pass_on(m, input + weights + out, 2 * taps * c * plane, false);
            continue;
        }
        for px in pieces(plane, RANGE_SCALES_ROWS * m.product_block) {
            let runs = px.div_ceil(m.product_block);
            let share = input * px / plane;
            total += pass_on(m, share + runs * p.scale, 0, false);
            let out = c * px * a * (1 + residual as u64);
            total += product_on(m, share + weights + (c + runs) * p.scale + out, 2 * taps * c * px, true, blocks(m, px, c));
        }
    }
    total
}

/// A channels-last convolution over f16 rows (a scale a pixel) into f32
/// rows, in pieces of output pixels as their rows fit one binding, each
/// reading its window of input rows (the stored rows: an upsampled read
/// moves no more); W's scales kept since load.
pub(super) fn conv_nhwc(m: &Machine, p: DataPath, s: flux_lite_core::oracle::ConvShape, [x, y]: [Operand; 2], residual: Option<Operand>, norm_bytes: u64) -> Traffic {
    let (pixels, plane) = ((s.height * s.width) as u64, (s.out_height * s.out_width) as u64);
    let (cin, cout, taps) = (s.in_channels as u64, s.out_channels as u64, (s.in_channels * s.kernel * s.kernel) as u64);
    let weights = cout * taps * p.weight + cout * p.weight + cout * 4 + norm_bytes;
    // Each output pixel's row written, and the residual's read (y's own, or another tensor's).
    let output_row = p.row_bytes(&y, cout) + residual.map_or(0, |r| p.row_bytes(&r, cout));
    let piece = rows_per_piece(m, plane, &[Rows::packed(cout, 4)], m.product_block);
    pieces(plane, piece)
        .map(|px| {
            let input = pixels * px / plane * p.row_bytes(&x, cin);
            product_on(m, input + weights + px * output_row, 2 * taps * cout * px, true, blocks(m, px, cout))
        })
        .sum()
}

/// The matrix tier's chunked attention of one head as its launcher lowers
/// it: the queries packed as f16 rows; for each chunk of
/// [`ATTENTION_KEY_CHUNK`] keys the keys packed, `Q·Kᵀ` on the GEMM core
/// into f16 probabilities in pieces with their exponents and sums, the
/// pieces combined under each row's maximum, the
/// values packed transposed, `P·V` onto the output (after the softmax's
/// first chunk the output so far read back, rescaled and added onto in the
/// product's epilogue); the output divided by its sums after the last
/// chunk, where no later call carries the softmax on.
pub(super) fn chunked_attention(m: &Machine, p: DataPath, [q_len, kv_len, d]: [u64; 3], [from_state, keep_state]: [bool; 2]) -> Traffic {
    let mut total = pack_rows(m, q_len, 1, d);
    for (i, keys) in pieces(kv_len, ATTENTION_KEY_CHUNK).enumerate() {
        let continues = i > 0 || from_state;
        total += pack_rows(m, keys, 1, d) + scores(m, p, [q_len, keys, d]);
        total += combine(m, q_len, keys) + pack_columns(m, keys, d);
        // Over whole f16 pairs: an odd chunk padded with a zero.
        total += linear(m, p, (probabilities(keys), rows(d)), [q_len, d, keys.next_multiple_of(2)], false, Out::Set);
        if continues {
            let read = q_len * d * 4 + q_len * 4;
            let seconds = read as f64 / m.bytes_per_second;
            total += Traffic { dispatches: 0, bytes: read, flops: 0, seconds, filled: seconds };
        }
    }
    if !keep_state {
        total += normalise(m, q_len, d);
    }
    total
}

/// f32 rows of `width` values as a product reads them (a span of its rows).
fn rows(width: u64) -> Operand {
    Operand::from(flux_lite_core::ir::Span::new(0, width))
}

/// f16 rows of `width` values under a scale a row.
fn half(width: u64) -> Operand {
    Operand::half_rows(flux_lite_core::ir::Span::new(0, width / 2), flux_lite_core::ir::Span::new(0, 1))
}

/// `rows` f32 rows of `heads` heads of `d` packed as f16 rows under a scale a head's row (`half_pack`).
fn pack_rows(m: &Machine, rows: u64, heads: u64, d: u64) -> Traffic {
    pass_on(m, rows * heads * d * 4 + rows * heads * (d * 2 + 4), 0, false)
}

/// A row of a chunk of `keys` probabilities: f16 pairs (an odd chunk
/// padded), and a scale a piece ([`PROBABILITY_PIECE`]) as `P·V` reads them.
fn probabilities(keys: u64) -> Operand {
    let pieces = keys.div_ceil(PROBABILITY_PIECE);
    Operand::half_pieces(flux_lite_core::ir::Span::new(0, keys.div_ceil(2)), flux_lite_core::ir::Span::new(0, pieces), PROBABILITY_PIECE)
}

/// A head's `Q·Kᵀ` over `q_len` f16 queries and a chunk of `keys` packed
/// keys into f16 probabilities, each piece's exponent and sum beside them.
fn scores(m: &Machine, p: DataPath, [q_len, keys, d]: [u64; 3]) -> Traffic {
    linear(m, p, (half(d), probabilities(keys)), [q_len, keys, d], false, Out::Probabilities)
}

/// The pieces of `rows` rows of a chunk of `keys` probabilities combined:
/// each piece's exponent and sum in, its scale out, the state read and
/// written, a factor a row.
fn combine(m: &Machine, rows: u64, keys: u64) -> Traffic {
    pass_on(m, rows * keys.div_ceil(PROBABILITY_PIECE) * 12 + 5 * rows * 4, 0, false)
}

/// A chunk's values of `width` columns packed transposed into f16 rows, a scale a row.
fn pack_columns(m: &Machine, keys: u64, width: u64) -> Traffic {
    pass_on(m, keys * width * 4 + width * (keys * 2 + 4), 0, false)
}

/// `rows` output rows of `d` divided by their sums.
fn normalise(m: &Machine, rows: u64, d: u64) -> Traffic {
    pass_on(m, 2 * rows * d * 4 + rows * 8, 0, false)
}

/// The transformer's attention as products on the GEMM core (where the
/// flash kernel is not proven) as its launcher lowers it: heads in stacks
/// of [`HeadsOnProducts`]' `heads`, each head's band `pitch` rows of the
/// stack. Its keys and values are read where they lie (f32 rows, or f16
/// pieces as the values they stand for); for each band of
/// [`flux_lite_core::ir::ATTENTION_QUERY_BAND`] queries (f32 ones packed,
/// f16 pieces read as stored) and each chunk of keys, each head's keys
/// packed and its `Q·Kᵀ` into probabilities, then the stack's pieces combined, its values' pack and
/// its `P·V` in one product over every head's values; the stack's output
/// divided by its sums into each head's f16 pieces in one pass.
pub(super) fn attention_on_products(m: &Machine, p: DataPath, [len, heads, kv_heads, d]: [u64; 4], [qkv_piece, o_piece]: [u64; 2]) -> Traffic {
    let part = HeadsOnProducts::new(len, len, d, heads, m.max_buffer);
    let group = heads / kv_heads.max(1);
    // A row of `width` keys or values as the packs read it: f16 pairs and a scale a piece, or f32.
    let source_row = |width: u64| width.checked_div(qkv_piece).map_or(width * 4, |pieces| width * 2 + pieces * 4);
    let pack_keys = |keys: u64| pass_on(m, keys * source_row(d) + keys * (d * 2 + 4), 0, false);
    let pack_values = |keys: u64, width: u64| pass_on(m, keys * source_row(width) + width * (keys * 2 + 4), 0, false);
    let mut total = Traffic::default();
    for (stack, stacked) in pieces(heads, part.heads).enumerate() {
        // The stack's heads' keys and values (grouped heads share theirs).
        let first = stack as u64 * part.heads;
        let kv_stacked = (first + stacked - 1) / group + 1 - first / group;
        for band in pieces(len, flux_lite_core::ir::ATTENTION_QUERY_BAND) {
            let stack_rows = stacked * part.pitch;
            if qkv_piece == 0 {
                total += pack_rows(m, band, stacked, d);
            }
            for (i, keys) in pieces(len, ATTENTION_KEY_CHUNK).enumerate() {
                // Each kv head's keys packed once, each query head's scores.
                total += (0..kv_stacked).map(|_| pack_keys(keys)).sum::<Traffic>() + (0..stacked).map(|_| scores(m, p, [band, keys, d])).sum();
                total += combine(m, stack_rows, keys) + pack_values(keys, kv_stacked * d);
                // The stack's P·V over whole f16 pairs: its probabilities, every head's
                // values, the output (read again and rescaled after the first chunk).
                let paired = keys.next_multiple_of(2);
                let output = stack_rows * d * 4 * (1 + (i > 0) as u64) + (i > 0) as u64 * stack_rows * 4;
                let bytes = stack_rows * (paired * 2 + 4 * keys.div_ceil(PROBABILITY_PIECE)) + kv_stacked * d * (paired * 2 + 4) + output;
                total += product_on(m, bytes, 2 * stack_rows * d * paired, p.matrix, blocks(m, stack_rows, d));
            }
            // The stack's band rows divided by their sums into the output's f16 pieces, in one pass.
            total += pass_on(m, stacked * band * (d * 4 + 8 + d * 2 + (d / o_piece.max(1)) * 4), 0, false);
        }
    }
    total
}
