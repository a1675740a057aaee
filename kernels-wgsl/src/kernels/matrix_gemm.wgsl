// The throughput core of the matrix tier's linear: C[row, col] =
// Σ_t A[row, t]·B[t, col] on cooperative-matrix units, one workgroup of
// SG_ROWS × SG_COLS subgroups per BM × BN block of C, each subgroup owning
// R × RC tiles of T × T (a R·T × RC·T block; RC is R but in a thin block)
// in accumulators held for the whole of k. A T×T fragment of A read from workgroup memory serves R products, and
// each element staged from global memory serves 2·R·T·SG FLOPs: with 16×16
// tiles, 2×2 subgroups of 4×4 tiles make 128 × 128 blocks, 2×1 make 128 × 64,
// and 2×1 of 4×1 tiles 128 × 16 (a thin block, for an RGB output).
//
// k advances KT (2T or T) at a time through STAGES buffers in workgroup
// memory: each invocation issues its loads of the next KT into registers
// (values of A, bf16 pairs of B), the subgroups multiply the current KT,
// then the fetched values are rounded into workgroup memory, so global
// latency overlaps the products. With two buffers the values go into the
// other one, one barrier a step; with one, after a barrier that the
// products are done, a second barrier a step. Both come from the adapter
// (`MatrixConfig::staging`: the deepest staging of which two workgroups
// fit in its workgroup memory, so that one workgroup's products cover the
// other's loads). Consecutive invocations
// read consecutive t of one row of A (x) and one column of B (a row of W), so
// the global reads are coalesced. Rows in workgroup memory are padded by PAD
// operands so the subgroups' fragment loads spread over the memory banks
// (rows of 2T + 8 or T + 8 operands: a multiple of 16 bytes, as
// cooperative loads want, and consecutive rows on different banks).
// Where B's columns do not come as whole bf16 pairs (`B_PAIRED` false: f32
// weights, odd k or offsets), the next KT is staged element by element
// (before the products into the other buffer, or after them into the one).

// f16 operands are rounded under range_rule.wgsl's rule: the module's
// `a_scale(row)` / `b_scale(col)` give the scales of A's rows and B's
// columns (measured before the product, once per call), which the sum is
// multiplied by on its way out; their inverses (`row_inverse`, `b_inverse`,
// below) scale the operands on their way in.
// f32 operands (8×8, Apple GPUs) need no rule.
//
// A k step reaches workgroup memory through the fetching file the module
// includes after this one: `matrix_fetch.wgsl` (element by element, from the
// module's `a_at(r, t, row0, t0)` = A[row0 + r, t0 + t], `b_at(t, c, col0,
// t0)` = B[t0 + t, col0 + c] (zero past the matrix) and `b_pair(c, t, col0,
// t0)`, the u32 holding B[t0 + t, col0 + c] and B[t0 + t + 1, col0 + c] as
// bf16) or `linear_matrix_vec4.wgsl` (the linear's x and W as vec4s). Each
// gives `prefetching()`, `fetch`, `put` and `stage`. The module gives the
// scales above and `block_quad_out(r, c, values)`, which writes outputs
// C[r, c … c + 3] (r, c absolute, c a multiple of 4) where inside the
// matrix, as one vector store where its rows allow; `pairs_columns()` says
// whether a block's two subgroup columns are instead the two sums of the
// same BN / 2 outputs (the linear's SwiGLU), whose value `paired_value(gate,
// up)` is, written through the same `block_quad_out` from column col0 / 2.
// Where `pieces_out()` the outputs (pairs or not) go out as f16 instead,
// under a range scale for every `out_piece()` outputs of a row (whole pairs,
// and whole pieces in the block's outputs, at most MAX_BLOCK_PIECES),
// through `block_half_quad_out(r, c, words)` (the f16 pairs of outputs c …
// c + 3) and `block_piece_scale_out(r, c, scale)` (c a piece's first
// output), in two passes over the tiles: magnitudes, then values; each
// value first through the module's `piece_value(r, c, value)` (r, c
// absolute: the convolution's bias and residual; zero outside the matrix,
// so that a block's columns past it leave its pieces' magnitudes as they
// are). Where `softmax_pieces()` (the linear's attention scores) the
// f16 pieces are probabilities instead (`tile_softmax_out`), each piece's
// exponent and sum going out through `block_piece_scale_out` and
// `block_piece_sum_out(r, c, sum)`. Accumulators are declared once, outside
// every loop: a cooperative-matrix `var` declared inside a loop is zeroed only
// once.

const R: u32 = 4u;
// SG_ROWS, SG_COLS and RC (a subgroup's tile columns) come with the module
// (kernel.rs): 2 × 2 subgroups of R × R tiles for the linear and most
// convolutions, 2 × 1 (BN = 4T) for a convolution of few output channels,
// whose columns would leave half of a square block idle, and 2 × 1 of
// R × 1 tiles (BN = T) for one of at most T (an RGB output, which would
// leave all but 3 of 4T columns idle).
const SUBGROUPS: u32 = SG_ROWS * SG_COLS;
const PAD: u32 = 8u;
const BM: u32 = SG_ROWS * R * T;
const BN: u32 = SG_COLS * RC * T;
// A subgroup's tiles.
const TILES: u32 = R * RC;
// The staging (MatrixConfig::staging): terms a k step (2T or T) and
// buffers (2 or 1).
override KT: u32 = 2u * T;
override STAGES: u32 = 2u;
override LD: u32 = KT + PAD;

// STAGES k steps of A's block rows and B's block columns, each a run of KT,
// as operands in `a_tiles` and `b_tiles`: the tiles' file the module
// includes beside this one declares them, with `put_a`, `put_b`, `put_a4`,
// `put_b4`, `put_a_quad` and `put_b_quad`, and how many operands an element holds
// (`TILE_VEC`: vec4s of f16, matrix_tiles_vec4.wgsl; f32 one an element,
// matrix_tiles_scalar.wgsl). Element indices below count operands.
override A_STAGED: u32 = STAGES * BM * LD;
override B_STAGED: u32 = STAGES * BN * LD;
// OUT_SLOTS (2, or 1 where workgroup memory is short: the staging's
// `out_slots`) T×T tiles per subgroup on their way out, taken in turn: with
// two, a subgroup stores its next tile into one slot while the other may
// still be read, so one barrier a tile keeps stores and reads apart; with
// one, a second barrier a tile waits until it is read.
override OUT_SLOTS: u32 = 2u;
override C_STAGED: u32 = OUT_SLOTS * SUBGROUPS * T * T;
var<workgroup> c_tiles: array<f32, C_STAGED>;
// Where the outputs go out as f16 in pieces (`pieces_out()`): the largest
// output magnitude of each block row's pieces (at most MAX_BLOCK_PIECES of
// the module's `out_piece()` outputs in a block's outputs), as the bits of
// a non-negative f32 (which order as their u32s do).
const MAX_BLOCK_PIECES: u32 = 4u;
var<workgroup> piece_largest: array<atomic<u32>, BM * MAX_BLOCK_PIECES>;
// The block's row scales (the module's may be a search over pieces: asked
// once a row), and the inverses of its row and column scales (powers of
// two: `row_inverse`, `col_inverse`), which only the k steps read; after
// them, where the module norms heads (`head_norm()`), the same memory holds
// each block row's two halves' sums of squares, then the inverse RMS of
// their heads (`head_sums`, 2·BM values: BN = BM wherever heads are normed).
var<workgroup> row_scale: array<f32, BM>;
var<workgroup> inverses: array<f32, BM + BN>;

fn row_inverse(r: u32) -> f32 {
    return inverses[r];
}

fn col_inverse(c: u32) -> f32 {
    return inverses[BM + c];
}

// B's words hold f16 pairs already divided by their column's range scale
// (a weight packed where it reached the device, half_pack.wgsl's
// pack_weight_half), staged as they are; else bf16 pairs, each value
// divided by the scale and rounded here, every tile.
override W_HALF: bool = false;

// The two operands a word of B's column c holds.
fn b_word_operands(word: u32, c: u32) -> vec2<f32> {
    if (W_HALF) {
        return unpack2x16float(word);
    }
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u)) * col_inverse(c);
}

// The inverse of the module's column scale, exact (a power of two).
fn b_inverse(col: u32) -> f32 {
    return 1.0 / b_scale(col);
}

// Where subgroup sg's tile in out-slot `slot` (0 or 1: the same with one
// slot) starts in c_tiles.
fn slot_base(sg: u32, slot: u32) -> u32 {
    return (OUT_SLOTS * sg + min(slot, OUT_SLOTS - 1u)) * T * T;
}

// With one out-slot, every subgroup is done reading it before the next
// tile goes in.
fn slot_read() {
    if (OUT_SLOTS == 1u) {
        workgroupBarrier();
    }
}

// Output i of the left subgroup's tile at block row r and column c (of
// the gate's columns) from the gate's and the up's sums, scaled back.
fn pair_value(sg: u32, slot: u32, i: u32, r: u32, c: u32, col0: u32) -> f32 {
    let gate_sum = c_tiles[slot_base(sg, slot) + i] * row_scale[r] * b_scale(col0 + c);
    let up_sum = c_tiles[slot_base(sg + 1u, slot) + i] * row_scale[r] * b_scale(col0 + c + RC * T);
    return paired_value(gate_sum, up_sum);
}

// Element i of the subgroup's tile at block row r and block column c, scaled back.
fn single_value(sg: u32, slot: u32, i: u32, r: u32, c: u32, col0: u32) -> f32 {
    return c_tiles[slot_base(sg, slot) + i] * row_scale[r] * b_scale(col0 + c);
}

// The block's outputs a row and the first one's column: with pairs, the
// left subgroup column's R·T (each the gate's and the up's sums) from
// col0 / 2; else BN from col0.
fn block_outputs() -> u32 {
    return select(BN, RC * T, pairs_columns());
}

fn first_output(col0: u32) -> u32 {
    return select(col0, col0 / 2u, pairs_columns());
}

// Whether subgroup sg writes outputs (with pairs, the left column only),
// and the block output column of its tile tj's first.
fn writes_outputs(sg: u32) -> bool {
    return !pairs_columns() || sg % SG_COLS == 0u;
}

fn tile_first_output(sg: u32, tj: u32) -> u32 {
    return select((sg % SG_COLS) * RC * T, 0u, pairs_columns()) + tj * T;
}

// Element i of the subgroup's tile at block row r and output column c.
fn output_value(sg: u32, slot: u32, i: u32, r: u32, c: u32, col0: u32) -> f32 {
    if (pairs_columns()) {
        return pair_value(sg, slot, i, r, c, col0);
    }
    return single_value(sg, slot, i, r, c, col0);
}

// Elements i … i + 3 of the tile (four neighbouring outputs of block row
// r, from output column c).
fn output_quad(sg: u32, slot: u32, i: u32, r: u32, c: u32, col0: u32) -> vec4<f32> {
    return vec4<f32>(output_value(sg, slot, i, r, c, col0), output_value(sg, slot, i + 1u, r, c + 1u, col0), output_value(sg, slot, i + 2u, r, c + 2u, col0), output_value(sg, slot, i + 3u, r, c + 3u, col0));
}

// The quad as it goes out in f16: the module's `piece_value` of each.
// Where the module norms heads, each value normed and rotated by the
// module's `head_norm_quad` under its head's inverse RMS.
fn half_quad(sg: u32, slot: u32, i: u32, r: u32, c: u32, row0: u32, col0: u32) -> vec4<f32> {
    let values = output_quad(sg, slot, i, r, c, col0);
    let at = first_output(col0) + c;
    let out = vec4<f32>(piece_value(row0 + r, at, values.x), piece_value(row0 + r, at + 1u, values.y), piece_value(row0 + r, at + 2u, values.z), piece_value(row0 + r, at + 3u, values.w));
    if (head_norm() > 0u) {
        return head_norm_quad(row0 + r, at, out, head_sums_at(r, c));
    }
    return out;
}

// The per-head RMSNorm's sums (`head_norm()` outputs a head: BN, a block
// row's whole outputs, or BN / 2, a subgroup column's), before the values
// go out: each block row's sum of squares over each subgroup column's R·T
// outputs, summed by one invocation a tile row in column order and tile
// after tile, so the same outputs always sum alike.
fn head_sums_at(r: u32, c: u32) -> f32 {
    return inverses[2u * r + c / (RC * T)];
}

fn tile_square_sums(lane: u32, lanes: u32, sg: u32, slot: u32, ti: u32, tj: u32, col0: u32) {
    for (var tr = lane; tr < T; tr += lanes) {
        let r = (sg / SG_COLS) * R * T + ti * T + tr;
        let c = tile_first_output(sg, tj);
        var sum = inverses[2u * r + sg % SG_COLS];
        for (var tc = 0u; tc < T; tc++) {
            let v = single_value(sg, slot, tr * T + tc, r, c + tc, col0);
            sum = fma(v, v, sum);
        }
        inverses[2u * r + sg % SG_COLS] = sum;
    }
}

// Each block row's heads' sums into their inverse RMS (inverseSqrt(mean
// square + ε), as norm.wgsl's rms_norm_rope computes it): a head of BN
// outputs takes both halves' sums, one of BN / 2 its own.
fn head_inverse_rms(li: u32) {
    for (var r = li; r < BM; r += WG) {
        let halves = vec2<f32>(inverses[2u * r], inverses[2u * r + 1u]);
        let sums = select(halves, vec2<f32>(halves.x + halves.y), head_norm() == BN);
        let inv = inverseSqrt(sums / f32(head_norm()) + head_norm_eps());
        inverses[2u * r] = inv.x;
        inverses[2u * r + 1u] = inv.y;
    }
}

// The tile's quads a lane takes: T·T / 4, row by row (element i = 4q).
// Each lane's outputs go out as a vector, four neighbouring outputs (or
// their f16 pairs) in one store where the module's rows allow it.
fn quad_row(sg: u32, ti: u32, q: u32) -> u32 {
    return (sg / SG_COLS) * R * T + ti * T + q / (T / 4u);
}

fn quad_column(sg: u32, tj: u32, q: u32) -> u32 {
    return tile_first_output(sg, tj) + 4u * (q % (T / 4u));
}

// The slot of piece_largest holding block row r's piece of output column c.
// A block wider than its call's outputs (a convolution of fewer channels
// than BN, in pieces narrower than a quarter of BN) has columns past the
// last piece: their values are zero (piece_value), and they take the row's
// last slot rather than the next row's, or past the array's end.
fn piece_slot(r: u32, c: u32) -> u32 {
    return r * MAX_BLOCK_PIECES + min(c / out_piece(), MAX_BLOCK_PIECES - 1u);
}

// The first of the two passes over the tiles where the outputs go out in
// f16 pieces: each output's magnitude into its row's piece's largest, a
// pair at a time (pieces are whole pairs).
fn tile_measure(lane: u32, lanes: u32, sg: u32, slot: u32, ti: u32, tj: u32, row0: u32, col0: u32) {
    if (!writes_outputs(sg)) {
        return;
    }
    for (var q = lane; q < T * T / 4u; q += lanes) {
        let r = quad_row(sg, ti, q);
        let c = quad_column(sg, tj, q);
        if (softmax_pieces()) {
            let t = half_quad(sg, slot, 4u * q, r, c, row0, col0);
            atomicMax(&piece_largest[piece_slot(r, c)], ordered_bits(max(max(t.x, t.y), max(t.z, t.w))));
            continue;
        }
        let m = abs(half_quad(sg, slot, 4u * q, r, c, row0, col0));
        atomicMax(&piece_largest[piece_slot(r, c)], bitcast<u32>(max(m.x, m.y)));
        atomicMax(&piece_largest[piece_slot(r, c + 2u)], bitcast<u32>(max(m.z, m.w)));
    }
}

// The range rule's exponent for the piece of block row r holding output
// column c (range_rule.wgsl; kept ≥ −126 so that its scale is a normal f32,
// as half_pack.wgsl keeps it).
fn piece_exponent(r: u32, c: u32) -> i32 {
    return max(range_exponent(bitcast<f32>(atomicLoad(&piece_largest[piece_slot(r, c)]))), -126);
}

// The second pass: the subgroup's tile as f16 pairs under their rows' piece
// exponents, four neighbouring outputs (two words) a store.
fn tile_half_out(lane: u32, lanes: u32, sg: u32, slot: u32, ti: u32, tj: u32, row0: u32, col0: u32) {
    if (!writes_outputs(sg)) {
        return;
    }
    for (var q = lane; q < T * T / 4u; q += lanes) {
        let r = quad_row(sg, ti, q);
        let c = quad_column(sg, tj, q);
        let v = half_quad(sg, slot, 4u * q, r, c, row0, col0);
        let low = -piece_exponent(r, c);
        let high = -piece_exponent(r, c + 2u);
        let words = vec2<u32>(operand_pair(vec2<f32>(ldexp(v.x, low), ldexp(v.y, low))), operand_pair(vec2<f32>(ldexp(v.z, high), ldexp(v.w, high))));
        block_half_quad_out(row0 + r, first_output(col0) + c, words);
    }
}

// The scales of the block's rows' pieces, once the first pass has measured them.
fn pieces_scales_out(li: u32, row0: u32, col0: u32) {
    let pieces = block_outputs() / out_piece();
    for (var i = li; i < BM * pieces; i += WG) {
        let c = (i % pieces) * out_piece();
        block_piece_scale_out(row0 + i / pieces, first_output(col0) + c, ldexp(1.0, piece_exponent(i / pieces, c)));
    }
}

// Where the outputs are a chunk of an attention's scores
// (`softmax_pieces()`), each value the module's `piece_value` made the
// score's base-2 exponent t (−∞ where the key is hidden): each piece's
// largest t into piece_largest in the first pass (as u32s that order as
// the f32s do); then its exponent e = ⌈largest⌉ − 14, kept in `inverses`
// (BM·pieces ≤ BM + BN: the k steps are done with them) and written out;
// then each probability 2^(t − e), in (2¹³, 2¹⁴] for the piece's largest
// as the range rule brings values, rounded to f16 once, with each piece's
// sum of those f16 values in exact integers: values from ½ on in units of
// 2⁻¹¹ and those below in units of 2⁻²⁴ (every f16 of each range is a
// whole number of its unit, and a piece of 64 sums below 2³¹), so the
// sums do not depend on the order the lanes add in. The combining pass
// (attention_chunks.wgsl) brings the pieces of a row under one maximum.

// An f32's bits as a u32 that orders as the f32s do (−∞ above 0u, which
// stands for no value yet).
fn ordered_bits(v: f32) -> u32 {
    let bits = bitcast<u32>(v);
    return select(bits | 0x80000000u, ~bits, (bits & 0x80000000u) != 0u);
}

fn from_ordered_bits(u: u32) -> f32 {
    if (u == 0u) {
        return bitcast<f32>(0xff800000u);
    }
    return bitcast<f32>(select(~u, u & 0x7fffffffu, (u & 0x80000000u) != 0u));
}

// The probabilities' exponent of the piece of block row r holding output column c.
fn softmax_exponent(r: u32, c: u32) -> f32 {
    return inverses[r * MAX_SOFTMAX_PIECES + min(c / out_piece(), MAX_SOFTMAX_PIECES - 1u)];
}

// A block row's pieces of probabilities: at most two (BN ≤ 128 outputs in
// pieces of 64), so that the sums' two words a piece fit its slots.
const MAX_SOFTMAX_PIECES: u32 = 2u;

fn softmax_exponents_out(li: u32, row0: u32, col0: u32) {
    let pieces = block_outputs() / out_piece();
    for (var i = li; i < BM * MAX_SOFTMAX_PIECES; i += WG) {
        let r = i / MAX_SOFTMAX_PIECES;
        let c = (i % MAX_SOFTMAX_PIECES) * out_piece();
        let e = ceil(from_ordered_bits(atomicLoad(&piece_largest[piece_slot(r, c)]))) - 14.0;
        inverses[i] = e;
        if (i % MAX_SOFTMAX_PIECES < pieces) {
            block_piece_scale_out(row0 + r, first_output(col0) + c, e);
        }
    }
    workgroupBarrier();
    for (var i = li; i < BM * MAX_BLOCK_PIECES; i += WG) {
        atomicStore(&piece_largest[i], 0u);
    }
}

// A piece's sum as two exact integers, in piece_largest's slots of the row
// (its pieces' maxima done with): from ½ on in units of 2⁻¹¹, below in
// units of 2⁻²⁴.
fn softmax_sum_slot(r: u32, c: u32) -> u32 {
    return r * MAX_BLOCK_PIECES + 2u * min(c / out_piece(), MAX_SOFTMAX_PIECES - 1u);
}

fn add_to_softmax_sum(r: u32, c: u32, values: vec4<f32>) {
    var large = 0u;
    var small = 0u;
    for (var i = 0u; i < 4u; i++) {
        if (values[i] >= 0.5) {
            large += u32(values[i] * 2048.0);
        } else {
            small += u32(values[i] * 16777216.0);
        }
    }
    atomicAdd(&piece_largest[softmax_sum_slot(r, c)], large);
    atomicAdd(&piece_largest[softmax_sum_slot(r, c) + 1u], small);
}

// 2^(t − e) rounded to f16 (0 where t is −∞: hidden, or past the matrix).
fn probability_pair(t: vec2<f32>, e: f32) -> u32 {
    let p = select(vec2<f32>(0.0), exp2(t - e - 14.0) * 16384.0, t > vec2<f32>(bitcast<f32>(0xff800000u)));
    return pack2x16float(p);
}

fn tile_softmax_out(lane: u32, lanes: u32, sg: u32, slot: u32, ti: u32, tj: u32, row0: u32, col0: u32) {
    for (var q = lane; q < T * T / 4u; q += lanes) {
        let r = quad_row(sg, ti, q);
        let c = quad_column(sg, tj, q);
        let t = half_quad(sg, slot, 4u * q, r, c, row0, col0);
        let e = softmax_exponent(r, c);
        let words = vec2<u32>(probability_pair(t.xy, e), probability_pair(t.zw, e));
        add_to_softmax_sum(r, c, vec4<f32>(unpack2x16float(words.x), unpack2x16float(words.y)));
        block_half_quad_out(row0 + r, first_output(col0) + c, words);
    }
}

fn softmax_sums_out(li: u32, row0: u32, col0: u32) {
    let pieces = block_outputs() / out_piece();
    for (var i = li; i < BM * pieces; i += WG) {
        let r = i / pieces;
        let c = (i % pieces) * out_piece();
        let slot = softmax_sum_slot(r, c);
        let sum = f32(atomicLoad(&piece_largest[slot])) / 2048.0 + f32(atomicLoad(&piece_largest[slot + 1u])) / 16777216.0;
        block_piece_sum_out(row0 + r, first_output(col0) + c, sum);
    }
}

// The subgroup's tile (ti, tj), as its out-slot of c_tiles holds it, scaled
// back and written out by the subgroup's own invocations, four neighbouring
// outputs a store (with pairs, the left subgroup column's tile is the
// gate's and its right neighbour's, the same tile of the up's rows, the
// up's: the left one writes the outputs, from column col0 / 2).
fn tile_out(lane: u32, lanes: u32, sg: u32, slot: u32, ti: u32, tj: u32, row0: u32, col0: u32) {
    if (softmax_pieces()) {
        tile_softmax_out(lane, lanes, sg, slot, ti, tj, row0, col0);
        return;
    }
    if (pieces_out()) {
        tile_half_out(lane, lanes, sg, slot, ti, tj, row0, col0);
        return;
    }
    if (!writes_outputs(sg)) {
        return;
    }
    for (var q = lane; q < T * T / 4u; q += lanes) {
        let r = quad_row(sg, ti, q);
        let c = quad_column(sg, tj, q);
        block_quad_out(row0 + r, first_output(col0) + c, output_quad(sg, slot, 4u * q, r, c, col0));
    }
}

// Block `block` of C over `n` columns and k terms, its column blocks
// fastest (consecutive workgroups share their rows of A), as the launchers'
// grids count them.
fn matrix_gemm_block(li: u32, sg: u32, lane: u32, lanes: u32, block: u32, n: u32, k: u32) {
    let blocks_n = (n + BN - 1u) / BN;
    matrix_gemm(li, sg, lane, lanes, (block / blocks_n) * BM, (block % blocks_n) * BN, k);
}

// The block at (row0, col0) over k terms, written out through
// `block_quad_out`. Blocks past the matrix run on zeros: cooperative
// operations need uniform control flow, which an early return would break.
fn matrix_gemm(li: u32, sg: u32, lane: u32, lanes: u32, row0: u32, col0: u32, k: u32) {
    for (var i = li; i < C_STAGED; i += WG) {
        c_tiles[i] = 0.0;
    }
    for (var i = li; i < BM; i += WG) {
        let scale = a_scale(row0 + i);
        row_scale[i] = scale;
        inverses[i] = 1.0 / scale;
    }
    for (var i = li; i < BM * MAX_BLOCK_PIECES; i += WG) {
        atomicStore(&piece_largest[i], 0u);
    }
    for (var i = li; i < BN; i += WG) {
        inverses[BM + i] = b_inverse(col0 + i);
    }
    workgroupBarrier();
    stage(li, 0u, row0, col0, 0u);
    // This subgroup's R·T rows of A and columns of B within the block.
    let a_rows = (sg / SG_COLS) * R * T * LD;
    let b_cols = (sg % SG_COLS) * RC * T * LD;
    let zero = &c_tiles[slot_base(sg, 0u)];
    var acc00 = coopLoadT<MatC>(zero, T);
    var acc01 = coopLoadT<MatC>(zero, T);
    var acc02 = coopLoadT<MatC>(zero, T);
    var acc03 = coopLoadT<MatC>(zero, T);
    var acc10 = coopLoadT<MatC>(zero, T);
    var acc11 = coopLoadT<MatC>(zero, T);
    var acc12 = coopLoadT<MatC>(zero, T);
    var acc13 = coopLoadT<MatC>(zero, T);
    var acc20 = coopLoadT<MatC>(zero, T);
    var acc21 = coopLoadT<MatC>(zero, T);
    var acc22 = coopLoadT<MatC>(zero, T);
    var acc23 = coopLoadT<MatC>(zero, T);
    var acc30 = coopLoadT<MatC>(zero, T);
    var acc31 = coopLoadT<MatC>(zero, T);
    var acc32 = coopLoadT<MatC>(zero, T);
    var acc33 = coopLoadT<MatC>(zero, T);
    workgroupBarrier();
    var half = 0u;
    var fetched: Fetched;
    for (var t0 = 0u; t0 < k; t0 += KT) {
        let more = t0 + KT < k;
        if (more && prefetching()) {
            fetched = fetch(li, row0, col0, t0 + KT);
        } else if (more && STAGES == 2u) {
            stage(li, 1u - half, row0, col0, t0 + KT);
        }
        let a_base = half * BM * LD + a_rows;
        let b_base = half * BN * LD + b_cols;
        for (var kk = 0u; kk < KT; kk += T) {
            let a0 = coopLoadT<MatA>(&a_tiles[(a_base + 0u * T * LD + kk) / TILE_VEC], LD / TILE_VEC);
            let a1 = coopLoadT<MatA>(&a_tiles[(a_base + 1u * T * LD + kk) / TILE_VEC], LD / TILE_VEC);
            let a2 = coopLoadT<MatA>(&a_tiles[(a_base + 2u * T * LD + kk) / TILE_VEC], LD / TILE_VEC);
            let a3 = coopLoadT<MatA>(&a_tiles[(a_base + 3u * T * LD + kk) / TILE_VEC], LD / TILE_VEC);
            let b0 = coopLoad<MatB>(&b_tiles[(b_base + kk) / TILE_VEC], LD / TILE_VEC);
            acc00 = coopMultiplyAdd(a0, b0, acc00);
            acc10 = coopMultiplyAdd(a1, b0, acc10);
            acc20 = coopMultiplyAdd(a2, b0, acc20);
            acc30 = coopMultiplyAdd(a3, b0, acc30);
            // A thin block's subgroups own one column of tiles (RC a constant: uniform).
            if (RC == R) {
                let b1 = coopLoad<MatB>(&b_tiles[(b_base + 1u * T * LD + kk) / TILE_VEC], LD / TILE_VEC);
                let b2 = coopLoad<MatB>(&b_tiles[(b_base + 2u * T * LD + kk) / TILE_VEC], LD / TILE_VEC);
                let b3 = coopLoad<MatB>(&b_tiles[(b_base + 3u * T * LD + kk) / TILE_VEC], LD / TILE_VEC);
                acc01 = coopMultiplyAdd(a0, b1, acc01);
                acc02 = coopMultiplyAdd(a0, b2, acc02);
                acc03 = coopMultiplyAdd(a0, b3, acc03);
                acc11 = coopMultiplyAdd(a1, b1, acc11);
                acc12 = coopMultiplyAdd(a1, b2, acc12);
                acc13 = coopMultiplyAdd(a1, b3, acc13);
                acc21 = coopMultiplyAdd(a2, b1, acc21);
                acc22 = coopMultiplyAdd(a2, b2, acc22);
                acc23 = coopMultiplyAdd(a2, b3, acc23);
                acc31 = coopMultiplyAdd(a3, b1, acc31);
                acc32 = coopMultiplyAdd(a3, b2, acc32);
                acc33 = coopMultiplyAdd(a3, b3, acc33);
            }
        }
        if (STAGES == 2u) {
            if (more && prefetching()) {
                put(li, 1u - half, &fetched);
            }
            half = 1u - half;
        } else {
            // One buffer: every subgroup's products read it before it is refilled.
            workgroupBarrier();
            if (more && prefetching()) {
                put(li, 0u, &fetched);
            } else if (more) {
                stage(li, 0u, row0, col0, t0 + KT);
            }
        }
        workgroupBarrier();
    }
    // Each subgroup stores its tiles one at a time, into its out-slots in
    // turn: with two, tile j's store follows the barrier after which every
    // lane is done with tile j − 2, which used the same slot. Up to three
    // passes over the tiles: where heads are normed, every row's sums of
    // squares; where the outputs go out as f16 pieces, every output's
    // magnitude, for its row's piece scale; then the values. One loop, not
    // a copy of the epilogue a tile: a driver compiles its body once (the
    // accumulators, distinct variables, are picked by a switch on the
    // uniform tile index).
    let first_pass = select(select(2u, 1u, pieces_out()), 0u, head_norm() > 0u);
    if (head_norm() > 0u) {
        // The k steps are done with the inverses: the sums start at zero.
        for (var i = li; i < 2u * BM; i += WG) {
            inverses[i] = 0.0;
        }
        workgroupBarrier();
    }
    for (var j = first_pass * TILES; j < 3u * TILES; j++) {
        let tile = j % TILES;
        let c = &c_tiles[slot_base(sg, tile % 2u)];
        // Tile (ti, tj) is accumulator acc{ti}{tj}. A thin block's switch
        // names only its own four, so that the others (never multiplied
        // there) are dead and take no registers.
        if (RC == R) {
            switch tile {
                case 0u: { coopStoreT(acc00, c, T); }
                case 1u: { coopStoreT(acc01, c, T); }
                case 2u: { coopStoreT(acc02, c, T); }
                case 3u: { coopStoreT(acc03, c, T); }
                case 4u: { coopStoreT(acc10, c, T); }
                case 5u: { coopStoreT(acc11, c, T); }
                case 6u: { coopStoreT(acc12, c, T); }
                case 7u: { coopStoreT(acc13, c, T); }
                case 8u: { coopStoreT(acc20, c, T); }
                case 9u: { coopStoreT(acc21, c, T); }
                case 10u: { coopStoreT(acc22, c, T); }
                case 11u: { coopStoreT(acc23, c, T); }
                case 12u: { coopStoreT(acc30, c, T); }
                case 13u: { coopStoreT(acc31, c, T); }
                case 14u: { coopStoreT(acc32, c, T); }
                default: { coopStoreT(acc33, c, T); }
            }
        } else {
            switch tile {
                case 0u: { coopStoreT(acc00, c, T); }
                case 1u: { coopStoreT(acc10, c, T); }
                case 2u: { coopStoreT(acc20, c, T); }
                default: { coopStoreT(acc30, c, T); }
            }
        }
        workgroupBarrier();
        let sweep = j / TILES;
        if (sweep == 0u) {
            tile_square_sums(lane, lanes, sg, tile % 2u, tile / RC, tile % RC, col0);
        } else if (sweep == 1u) {
            tile_measure(lane, lanes, sg, tile % 2u, tile / RC, tile % RC, row0, col0);
        } else {
            tile_out(lane, lanes, sg, tile % 2u, tile / RC, tile % RC, row0, col0);
        }
        slot_read();
        if (j + 1u == TILES) {
            // Every sum of squares taken: the heads' inverse RMS.
            workgroupBarrier();
            head_inverse_rms(li);
            workgroupBarrier();
        }
        if (j + 1u == 2u * TILES && softmax_pieces()) {
            // Every maximum taken: the pieces' exponents, and the slots
            // cleared for the sums (the next tile's barrier orders both).
            workgroupBarrier();
            softmax_exponents_out(li, row0, col0);
        } else if (j + 1u == 2u * TILES) {
            // Every magnitude measured: the pieces' scales.
            workgroupBarrier();
            pieces_scales_out(li, row0, col0);
        }
    }
    if (softmax_pieces()) {
        workgroupBarrier();
        softmax_sums_out(li, row0, col0);
    }
}
