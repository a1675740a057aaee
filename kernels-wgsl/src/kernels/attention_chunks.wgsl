// What lies between the products of the matrix tier's attention of one wide
// head (attention_chunks.rs): the scores of a chunk of keys come from the
// GEMM core as f32 rows, these kernels turn them into the next product's
// f16 operand with the online softmax carried from chunk to chunk, lay a
// chunk's values out as that product's right operand, and divide the output
// by each row's sum at the end. No subgroup arithmetic: each workgroup's
// reductions run through workgroup memory in one fixed order, so a row's
// bits do not depend on which other rows share the dispatch.

struct Params {
    // Query rows, keys in this chunk, and the head's width.
    rows: u32, keys: u32, width: u32,
    // chunk_softmax: each row's scores (f32, the probabilities written over
    // the row's first half as f16 pairs), the probabilities' scales.
    scores: u32, scores_stride: u32, score_scales: u32,
    // Each row's running maximum and sum, two f32 a row.
    state: u32,
    // The output rows (f32) normalise_rows divides.
    o: u32, o_stride: u32,
    // pack_columns: the chunk's values (f32 rows), the packed rows (keys/2
    // words a row) and their scales.
    src: u32, src_stride: u32, dst: u32, dst_scales: u32,
    // Whether the softmax continues one carried in `state`.
    from_state: u32,
    // 1/√width, applied to the scores.
    scale: f32,
    // chunk_softmax: each row's factor for the output so far.
    factors: u32,
    // chunk_softmax's masks: whether query q sees only keys up to q
    // (`causal`); the query of row 0 and the rows a head's queries take
    // (rows r and r + pitch are the same query of two heads; 0: one head);
    // the chunk's first key; whether `keep` (from keep_offset, a u32 a key,
    // 0 for padding) hides keys.
    causal: u32, q_first: u32, pitch: u32, k_first: u32,
    masked: u32, keep_offset: u32,
    // The first of this dispatch's rows in the rows `pitch` counts.
    row_first: u32, _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> words: array<u32>;
@group(0) @binding(2) var<storage, read_write> row_scales: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;
@group(0) @binding(5) var<storage, read_write> src: array<f32>;
@group(0) @binding(6) var<storage, read_write> factors: array<f32>;
@group(0) @binding(7) var<storage, read_write> keep: array<u32>;

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

// The sum of every lane's `v`, by halves in a fixed order.
fn workgroup_sum(lane: u32, v: f32) -> f32 {
    reduced[lane] = v;
    workgroupBarrier();
    for (var half = LANES / 2u; half > 0u; half = half / 2u) {
        if (lane < half) {
            reduced[lane] = reduced[lane] + reduced[lane + half];
        }
        workgroupBarrier();
    }
    let all = reduced[0];
    workgroupBarrier();
    return all;
}

// Whether row `row`'s query sees the chunk's key `key`: past the causal
// mask's diagonal, or a padding key, it does not.
fn visible(row: u32, key: u32) -> bool {
    let r = p.row_first + row;
    let query = p.q_first + select(r, r % p.pitch, p.pitch > 0u);
    let k = p.k_first + key;
    return (p.causal == 0u || k <= query) && (p.masked == 0u || keep[p.keep_offset + k] != 0u);
}

// One query row's chunk of scores into probabilities, a workgroup a row:
// the row's maximum so far (the carried one and this chunk's), each
// exp(score·scale − maximum) rounded to f16 under the row's range scale
// (the largest probability into [2¹³, 2¹⁴)) and written over the row's
// first (keys + 1)/2 words (an odd number of keys padded with a zero), the running sum (the carried one times
// exp(old maximum − new), plus the f16 values as the product will read
// them) and maximum kept in `state`, and that factor in `factors`, by
// which the product that adds this chunk's P·V rescales the output so far.
@compute @workgroup_size(128)
fn chunk_softmax(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_workgroup(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    let lane = lid.x;
    let at = p.scores + row * p.scores_stride;
    var x: array<vec2<f32>, PAIRS>;
    var most = negative_infinity();
    for (var t = 0u; t < PAIRS; t++) {
        let key = 2u * (lane + t * LANES);
        var v = vec2<f32>(negative_infinity());
        if (key < p.keys && visible(row, key)) {
            v.x = bitcast<f32>(words[at + key]) * p.scale;
        }
        if (key + 1u < p.keys && visible(row, key + 1u)) {
            v.y = bitcast<f32>(words[at + key + 1u]) * p.scale;
        }
        x[t] = v;
        most = max(most, max(v.x, v.y));
    }
    let chunk_most = workgroup_max(lane, most);
    let from_state = p.from_state != 0u;
    var old_most = chunk_most;
    var old_sum = 0.0;
    if (from_state) {
        old_most = state[p.state + 2u * row];
        old_sum = state[p.state + 2u * row + 1u];
    }
    let top = max(old_most, chunk_most);
    // A row that has seen no key yet (every one masked) has no probabilities.
    let seen = top > negative_infinity();
    var largest = 0.0;
    for (var t = 0u; t < PAIRS; t++) {
        x[t] = select(vec2<f32>(0.0), exp(x[t] - top), seen);
        largest = max(largest, max(x[t].x, x[t].y));
    }
    let e = max(range_exponent(workgroup_max(lane, largest)), -126);
    // Every lane has read its scores (their maximum went through the
    // barriers above): the row's words now take the probabilities.
    storageBarrier();
    var sum = 0.0;
    for (var t = 0u; t < PAIRS; t++) {
        let pair = lane + t * LANES;
        if (2u * pair < p.keys) {
            let packed = pack2x16float(ldexp(x[t], vec2<i32>(-e)));
            words[at + pair] = packed;
            let rounded = unpack2x16float(packed);
            sum += rounded.x + rounded.y;
        }
    }
    let total = ldexp(workgroup_sum(lane, sum), e);
    let carried = select(0.0, exp(old_most - top), from_state && seen);
    if (lane == 0u) {
        row_scales[p.score_scales + row] = ldexp(1.0, e);
        state[p.state + 2u * row] = top;
        state[p.state + 2u * row + 1u] = old_sum * carried + total;
        factors[p.factors + row] = carried;
    }
}

// A chunk's values `[keys, width]` (f32 rows) as the weighted sum's right
// operand: `[width, keys]` f16 pairs, each column of the values (a row
// here) divided by its range scale over the chunk's keys, the scales
// beside; an odd number of keys padded with a zero to whole pairs (the
// probability chunk_softmax writes beside the last key is zero too). A
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
            v.x = src[p.src + key * p.src_stride + column];
        }
        if (key + 1u < p.keys) {
            v.y = src[p.src + (key + 1u) * p.src_stride + column];
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
