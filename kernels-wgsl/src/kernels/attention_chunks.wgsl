// What lies between the products of the matrix tier's attention on the
// GEMM core (attention_chunks.rs): the scores' product writes each chunk's
// probabilities in f16 pieces, each under its own exponent with its sum
// (matrix_gemm.wgsl's `tile_softmax_out`); these kernels bring each row's
// pieces under one maximum with the online softmax carried from chunk to
// chunk, lay a chunk's values out as the next product's right operand, and
// divide the output by each row's sum at the end. No subgroup arithmetic:
// pack_columns' reductions run through workgroup memory in one fixed order,
// so a row's bits do not depend on which other rows share the dispatch.

struct Params {
    // Query rows, keys in this chunk, and the head's width.
    rows: u32, keys: u32, width: u32,
    // chunk_combine: the words from one row's scores to the next, where
    // row 0's pieces' exponents and sums start, and its pieces.
    scores_stride: u32, exponents: u32, sums: u32, pieces: u32,
    // Each row's running maximum and sum, two f32 a row.
    state: u32,
    // The output rows (f32) normalise_rows divides.
    o: u32, o_stride: u32,
    // pack_columns and pack_key_rows: the chunk's values or keys (f32 rows,
    // or f16 pairs in pieces: `source_at`), the packed rows and their scales.
    src: u32, src_stride: u32, dst: u32, dst_scales: u32,
    // Whether the softmax continues one carried in `state`.
    from_state: u32,
    // chunk_combine: each row's factor for the output so far.
    factors: u32,
    // normalise_into_pieces: the rows a head's band takes in the stack and
    // the band's queries, the f16 rows' words and scales from one row to
    // the next (`dst`, `dst_scales` their first head's first), and the
    // pieces' values.
    pitch: u32, band: u32, dst_stride: u32, dst_scales_stride: u32,
    piece: u32,
    // The source's pieces (0: f32 rows), where its pieces' scales start and
    // from one row to the next.
    src_piece: u32, src_scales: u32, src_scales_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> words: array<u32>;
@group(0) @binding(2) var<storage, read_write> row_scales: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;
@group(0) @binding(5) var<storage, read_write> src: array<f32>;
@group(0) @binding(6) var<storage, read_write> factors: array<f32>;
@group(0) @binding(7) var<storage, read_write> src_words: array<u32>;
@group(0) @binding(8) var<storage, read_write> src_scales: array<f32>;

const LANES: u32 = 128u;
// Key pairs a lane holds: chunks of up to 2·LANES·PAIRS = 4096 keys
// (ATTENTION_KEY_CHUNK's 4032 and fewer).
const PAIRS: u32 = 16u;

var<workgroup> reduced: array<f32, LANES>;

fn negative_infinity() -> f32 {
    return bitcast<f32>(0xff800000u);
}

// The largest of every lane's `v`, by halves in a fixed order.
fn workgroup_max(lane: u32, v: f32) -> f32 {
    reduced[lane] = v;
    workgroupBarrier();
    for (var half = LANES / 2u; half > 0u; half = half / 2u) {
        if (lane < half) {
            reduced[lane] = max(reduced[lane], reduced[lane + half]);
        }
        workgroupBarrier();
    }
    let all = reduced[0];
    workgroupBarrier();
    return all;
}

// 2^(e − top): the factor that brings a piece of exponent e (or the
// output so far, under the old maximum e) under a row's largest exponent
// `top`; never below 2⁻¹²⁶ (what it stands for is then below 2⁻¹²⁶ of the
// row's largest probability), and 2⁻¹²⁶ where either is −∞ (no score
// counted: the values are zeros).
fn piece_scale(e: f32, top: f32) -> f32 {
    if (e == negative_infinity() || top == negative_infinity()) {
        return ldexp(1.0, -126);
    }
    return ldexp(1.0, i32(max(e - top, -126.0)));
}

// One chunk's pieces of a row brought under the row's one maximum, an
// invocation a row: the largest of its pieces' exponents and the carried
// one; each piece's exponent replaced by its scale under that maximum
// (which `P·V` reads as the pieces' scales); the row's sum (the carried
// one times its factor, plus each piece's sum times its scale, in piece
// order) and maximum kept in `state`, and the carried factor in `factors`,
// by which the product that adds this chunk's P·V rescales the output so
// far.
@compute @workgroup_size(64)
fn chunk_combine(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_workgroup(wid, nwg) * 64u + lid.x;
    if (row >= p.rows) {
        return;
    }
    let exponents = p.exponents + row * p.scores_stride;
    let sums = p.sums + row * p.scores_stride;
    let from_state = p.from_state != 0u;
    var old_top = negative_infinity();
    var old_sum = 0.0;
    if (from_state) {
        old_top = state[p.state + 2u * row];
        old_sum = state[p.state + 2u * row + 1u];
    }
    var top = old_top;
    for (var i = 0u; i < p.pieces; i++) {
        top = max(top, row_scales[exponents + i]);
    }
    var sum = 0.0;
    for (var i = 0u; i < p.pieces; i++) {
        let scale = piece_scale(row_scales[exponents + i], top);
        row_scales[exponents + i] = scale;
        sum += row_scales[sums + i] * scale;
    }
    let carried = piece_scale(old_top, top);
    state[p.state + 2u * row] = top;
    state[p.state + 2u * row + 1u] = select(sum, old_sum * carried + sum, from_state);
    factors[p.factors + row] = carried;
}

// Value (row, column) of the keys or values a pack reads: f32 rows at
// binding 5, or (`p.src_piece` > 0) f16 pairs in pieces at binding 7 (src
// and src_stride counting f16 values) under their scales at 8, as the
// value they stand for, exactly (an f16 times a power of two).
fn source_at(row: u32, column: u32) -> f32 {
    if (p.src_piece == 0u) {
        return src[p.src + row * p.src_stride + column];
    }
    let e = p.src + row * p.src_stride + column;
    let pair = unpack2x16float(src_words[e >> 1u]);
    return select(pair.x, pair.y, (e & 1u) == 1u) * src_scales[p.src_scales + row * p.src_scales_stride + column / p.src_piece];
}

// A chunk's keys `[keys, width]` as the scores' product's right operand:
// each key's row of f16 pairs (width / 2 words, rows apart by them) under
// its range scale, the scales beside; half_pack.wgsl's arithmetic, over
// pieces read as the values they stand for. An invocation a key.
@compute @workgroup_size(64)
fn pack_key_rows(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let key = flat_workgroup(wid, nwg) * 64u + lid.x;
    if (key >= p.keys) {
        return;
    }
    var largest = 0.0;
    for (var c = 0u; c < p.width; c++) {
        largest = max(largest, abs(source_at(key, c)));
    }
    let e = max(range_exponent(largest), -126);
    let out = p.dst + key * (p.width / 2u);
    for (var c = 0u; c < p.width / 2u; c++) {
        words[out + c] = pack2x16float(vec2<f32>(ldexp(source_at(key, 2u * c), -e), ldexp(source_at(key, 2u * c + 1u), -e)));
    }
    row_scales[p.dst_scales + key] = ldexp(1.0, e);
}

// A chunk's values `[keys, width]` (f32 rows or pieces) as the weighted sum's right
// operand: `[width, keys]` f16 pairs, each column of the values (a row
// here) divided by its range scale over the chunk's keys, the scales
// beside; an odd number of keys padded with a zero to whole pairs (the
// probability the scores' product writes beside the last key is zero too). A
// workgroup a column.
@compute @workgroup_size(128)
fn pack_columns(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let column = flat_workgroup(wid, nwg);
    if (column >= p.width) {
        return;
    }
    let lane = lid.x;
    var pairs: array<vec2<f32>, PAIRS>;
    var largest = 0.0;
    for (var t = 0u; t < PAIRS; t++) {
        let key = 2u * (lane + t * LANES);
        var v = vec2<f32>(0.0);
        if (key < p.keys) {
            v.x = source_at(key, column);
        }
        if (key + 1u < p.keys) {
            v.y = source_at(key + 1u, column);
        }
        pairs[t] = v;
        largest = max(largest, max(abs(v.x), abs(v.y)));
    }
    // As half_pack.wgsl: ldexp by the exponent, which stays ≥ −126.
    let e = max(range_exponent(workgroup_max(lane, largest)), -126);
    let out = p.dst + column * ((p.keys + 1u) / 2u);
    for (var t = 0u; t < PAIRS; t++) {
        let pair = lane + t * LANES;
        if (2u * pair < p.keys) {
            words[out + pair] = pack2x16float(ldexp(pairs[t], vec2<i32>(-e)));
        }
    }
    if (lane == 0u) {
        row_scales[p.dst_scales + column] = ldexp(1.0, e);
    }
}

// Each output row divided by its softmax's sum (the second of its two
// state values), once the last chunk has added onto it; zero where the row
// saw no key. An invocation a value.
@compute @workgroup_size(64)
fn normalise_rows(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_workgroup(wid, nwg) * 64u + lid.x;
    if (i >= p.rows * p.width) {
        return;
    }
    let row = i / p.width;
    let at = p.o + row * p.o_stride + i % p.width;
    let sum = state[p.state + 2u * row + 1u];
    o[at] = select(0.0, o[at] / sum, sum > 0.0);
}

// The stack's output rows divided by their sums (as normalise_rows divides
// them) and packed into the attention's output, f16 rows in pieces under
// their range scales (as half_pack.wgsl packs them), an invocation a piece:
// stack row r is the band's query r % pitch of the stack's head r / pitch,
// and rows past the band are left alone. The bits of normalise_rows and a
// half_pack a head, in one pass that writes no f32 row back.
@compute @workgroup_size(64)
fn normalise_into_pieces(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_workgroup(wid, nwg) * 64u + lid.x;
    let pieces = p.width / p.piece;
    let row = i / pieces;
    let piece = i % pieces;
    if (row >= p.rows || row % p.pitch >= p.band) {
        return;
    }
    let head = row / p.pitch;
    let query = row % p.pitch;
    let sum = state[p.state + 2u * row + 1u];
    let first = p.o + row * p.o_stride + piece * p.piece;
    var largest = 0.0;
    for (var k = 0u; k < p.piece; k++) {
        largest = max(largest, abs(select(0.0, o[first + k] / sum, sum > 0.0)));
    }
    let e = max(range_exponent(largest), -126);
    let to = p.dst + query * p.dst_stride + (head * pieces + piece) * (p.piece / 2u);
    for (var k = 0u; k < p.piece / 2u; k++) {
        let pair = select(vec2<f32>(0.0), vec2<f32>(o[first + 2u * k] / sum, o[first + 2u * k + 1u] / sum), sum > 0.0);
        words[to + k] = pack2x16float(ldexp(pair, vec2<i32>(-e)));
    }
    row_scales[p.dst_scales + query * p.dst_scales_stride + head * pieces + piece] = ldexp(1.0, e);
}
