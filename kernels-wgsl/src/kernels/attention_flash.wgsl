// softmax(q·kᵀ·scale + mask)·v on cooperative-matrix units: the matrix
// tier's flash attention, with attention.wgsl's masks, grouped heads and
// log-sum-exp (interface in attention_io.wgsl). Taken only where asked for
// (FLUX_LITE_ATTENTION_KERNEL=flash) until it is proven on a GPU: on an H200
// an earlier form returned NaN (docs/performance.md); attention_matrix.wgsl
// is the matrix tier's default.
//
// A workgroup of SG subgroups takes QB = SG·T queries of one head and
// ODIMS = 8T of its output dims (16×16 tiles: 64 queries, all of a 128-wide
// head; 8×8 tiles: 16 queries, 64 dims, so a 128-wide head takes two
// workgroups). Each subgroup owns T queries: their output is 8 accumulator
// tiles held in registers over all keys. Keys stream through in tiles of
// KB = 2T: the workgroup stages the tile's keys and values in workgroup
// memory, each subgroup computes its T × KB scores on the matrix units
// (Q·Kᵀ over the head's dims, Q staged once), its invocations run the
// online softmax on their rows, and P·V is added into the accumulators.
//
// The softmax subtracts a running maximum that is raised only when a row's
// scores pass it by more than LAZY (e^8): the probabilities then stay below
// e^8, and the accumulators are rescaled (through workgroup memory) only on
// the tiles where some row's maximum moved. Exact either way: softmax does
// not depend on the constant subtracted.
//
// f16 operands are rounded under range_rule.wgsl's rule: each query and key
// by its own scale over the head's dims (measured as it is staged, across
// the subgroup's lanes), each value column by its scale over all keys (the
// `v_scales` binding, measured once per call by range_scales.wgsl), and the
// probabilities by P_SHIFT (their largest is below e^8, so P·P_SHIFT stays
// below f16's 65504 and the smallest that matter stay normal). f32 operands
// skip the scales. Loads read clamped indices and select zero past the
// tensors (no branches around them); heads up to MAX_DIM (FLUX's 128).

override WG: u32 = 8u;
const SG: u32 = select(2u, 4u, T == 16u);
const MAX_DIM: u32 = 128u;
const QB: u32 = SG * T;
const KB: u32 = 2u * T;
const OD: u32 = 8u;
const ODIMS: u32 = OD * T;
const LDQ: u32 = MAX_DIM;
const LDK: u32 = MAX_DIM + 8u;
const LDV: u32 = ODIMS + 8u;
const LAZY: f32 = 8.0;
const P_SHIFT: f32 = 16.0;
// The most head dims one lane stages (MAX_DIM over the smallest subgroup, 8).
const LANE_DIMS: u32 = MAX_DIM / 8u;

@group(0) @binding(7) var<storage, read> v_scales: array<f32>;

var<workgroup> q_sh: array<Operand, QB * LDQ>;
var<workgroup> k_sh: array<Operand, KB * LDK>;
var<workgroup> v_sh: array<Operand, KB * LDV>;
// Each subgroup's scores (f32, T × KB), also its staging for one T × T output tile.
var<workgroup> s_sh: array<f32, SG * T * KB>;
var<workgroup> p_sh: array<Operand, SG * T * KB>;
var<workgroup> zero_sh: array<f32, T * T>;
var<workgroup> q_scale: array<f32, QB>;
var<workgroup> k_scale: array<f32, KB>;
var<workgroup> row_max: array<f32, QB>;
var<workgroup> row_sum: array<f32, QB>;
var<workgroup> row_rescale: array<f32, QB>;
var<workgroup> moved: u32;

// Query qi, key or value kj of head h (kv head kvh) at dim d; zero past the tensors.
fn q_load(h: u32, qi: u32, d: u32) -> f32 {
    let inside = qi < p.q_len && d < p.head_dim;
    return select(0.0, q[select(p.q_offset, p.q_offset + qi * p.q_stride + h * p.head_dim + d, inside)], inside);
}

fn k_load(kvh: u32, kj: u32, d: u32) -> f32 {
    let inside = kj < p.kv_len && d < p.head_dim;
    return select(0.0, k[select(p.k_offset, p.k_offset + kj * p.k_stride + kvh * p.head_dim + d, inside)], inside);
}

fn v_load(kvh: u32, kj: u32, d: u32) -> f32 {
    let inside = kj < p.kv_len && d < p.head_dim;
    return select(0.0, v[select(p.v_offset, p.v_offset + kj * p.v_stride + kvh * p.head_dim + d, inside)], inside);
}

// The range scale of value column d of kv head kvh (1 past the head, or for f32 operands).
fn v_scale(kvh: u32, d: u32) -> f32 {
    if (!OPERAND_HALF || d >= p.head_dim) {
        return 1.0;
    }
    return v_scales[kvh * p.head_dim + d];
}

// A query's or a key's values over the head's dims as the subgroup's lanes
// hold them (`spans` each, lane + i·lanes), and the row's range scale taken
// across the lanes (1 for f32 operands).
struct LaneRow {
    vals: array<f32, LANE_DIMS>,
    scale: f32,
}

fn lane_row(of_keys: bool, head: u32, index: u32, lane: u32, lanes: u32, spans: u32) -> LaneRow {
    var row: LaneRow;
    var largest = 0.0;
    for (var i = 0u; i < spans; i++) {
        let d = lane + i * lanes;
        if (of_keys) {
            row.vals[i] = k_load(head, index, d);
        } else {
            row.vals[i] = q_load(head, index, d);
        }
        largest = max(largest, abs(row.vals[i]));
    }
    row.scale = 1.0;
    if (OPERAND_HALF) {
        row.scale = range_scale(subgroupMax(largest));
    }
    return row;
}

@compute @workgroup_size(WG)
fn attention_flash(
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) lanes: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let h = wid.y;
    let kvh = h / (p.q_heads / p.kv_heads);
    let q0 = wid.x * QB;
    let d0 = wid.z * ODIMS;
    // head_dim rounded up to whole tiles (the dims past it are zeros), and
    // how many of them each lane stages of a query or key.
    let dims = (p.head_dim + T - 1u) / T * T;
    let spans = (dims + lanes - 1u) / lanes;
    for (var i = li; i < T * T; i += WG) {
        zero_sh[i] = 0.0;
    }
    for (var r = li; r < QB; r += WG) {
        row_max[r] = MASKED;
        row_sum[r] = 0.0;
    }
    if (li == 0u) {
        moved = 0u;
    }
    // Q, once: each subgroup stages rows sg, sg + SG, …, lanes across the dims.
    for (var r = sg; r < QB; r += SG) {
        let row = lane_row(false, h, q0 + r, lane, lanes, spans);
        for (var i = 0u; i < spans; i++) {
            let d = lane + i * lanes;
            if (d < MAX_DIM) {
                q_sh[r * LDQ + d] = Operand(row.vals[i] / row.scale);
            }
        }
        if (lane == 0u) {
            q_scale[r] = row.scale;
        }
    }
    var k_end = p.kv_len;
    if (p.causal != 0u) {
        k_end = min(p.kv_len, q0 + QB + p.q_position);
    }
    let mine = sg * T * KB;
    // Every invocation's zeros are in place before any subgroup loads them.
    workgroupBarrier();
    // Each accumulator loaded from the zeros: no cooperative matrix is ever
    // copied from another (a copy is what the earlier form did that the
    // working kernels do not).
    var o0 = coopLoadT<MatC>(&zero_sh[0], T);
    var o1 = coopLoadT<MatC>(&zero_sh[0], T);
    var o2 = coopLoadT<MatC>(&zero_sh[0], T);
    var o3 = coopLoadT<MatC>(&zero_sh[0], T);
    var o4 = coopLoadT<MatC>(&zero_sh[0], T);
    var o5 = coopLoadT<MatC>(&zero_sh[0], T);
    var o6 = coopLoadT<MatC>(&zero_sh[0], T);
    var o7 = coopLoadT<MatC>(&zero_sh[0], T);
    var s0 = coopLoadT<MatC>(&zero_sh[0], T);
    var s1 = coopLoadT<MatC>(&zero_sh[0], T);
    for (var k0 = 0u; k0 < k_end; k0 += KB) {
        // The tile's keys (each its own scale) and this workgroup's value dims.
        for (var j = sg; j < KB; j += SG) {
            let row = lane_row(true, kvh, k0 + j, lane, lanes, spans);
            for (var i = 0u; i < spans; i++) {
                let d = lane + i * lanes;
                if (d < MAX_DIM) {
                    k_sh[j * LDK + d] = Operand(row.vals[i] / row.scale);
                }
            }
            if (lane == 0u) {
                k_scale[j] = row.scale;
            }
            for (var d = lane; d < ODIMS; d += lanes) {
                v_sh[j * LDV + d] = Operand(v_load(kvh, k0 + j, d0 + d) / v_scale(kvh, d0 + d));
            }
        }
        workgroupBarrier();
        // S = Q·Kᵀ for this subgroup's T queries and the tile's 2T keys.
        s0 = coopLoadT<MatC>(&zero_sh[0], T);
        s1 = coopLoadT<MatC>(&zero_sh[0], T);
        for (var dt = 0u; dt < dims; dt += T) {
            let qa = coopLoadT<MatA>(&q_sh[(sg * T) * LDQ + dt], LDQ);
            s0 = coopMultiplyAdd(qa, coopLoad<MatB>(&k_sh[dt], LDK), s0);
            s1 = coopMultiplyAdd(qa, coopLoad<MatB>(&k_sh[T * LDK + dt], LDK), s1);
        }
        coopStoreT(s0, &s_sh[mine], KB);
        coopStoreT(s1, &s_sh[mine + T], KB);
        workgroupBarrier();
        // The online softmax, one query row per invocation of the subgroup.
        if (lane < T) {
            let row = sg * T + lane;
            let qi = q0 + row;
            let m_old = row_max[row];
            var tile_max = MASKED;
            for (var j = 0u; j < KB; j++) {
                var s = MASKED;
                if (visible(qi, k0 + j)) {
                    s = s_sh[mine + lane * KB + j] * q_scale[row] * k_scale[j] * p.scale;
                }
                s_sh[mine + lane * KB + j] = s;
                tile_max = max(tile_max, s);
            }
            var m_new = m_old;
            if (tile_max > m_old + LAZY || (m_old == MASKED && tile_max > MASKED)) {
                m_new = tile_max;
                moved = 1u;
            }
            var tile_sum = 0.0;
            for (var j = 0u; j < KB; j++) {
                let s = s_sh[mine + lane * KB + j];
                var pr = 0.0;
                if (s > MASKED) {
                    pr = exp(s - m_new);
                }
                tile_sum += pr;
                p_sh[mine + lane * KB + j] = Operand(pr * P_SHIFT);
            }
            let rescale = select(1.0, exp(m_old - m_new), m_new != m_old);
            row_rescale[row] = rescale;
            row_sum[row] = row_sum[row] * rescale + tile_sum;
            row_max[row] = m_new;
        }
        // Rescales the accumulators where some row's maximum moved.
        if (workgroupUniformLoad(&moved) != 0u) {
            coopStoreT(o0, &s_sh[mine], T); workgroupBarrier(); rescale_tile(mine, sg, lane, lanes); workgroupBarrier(); o0 = coopLoadT<MatC>(&s_sh[mine], T); workgroupBarrier();
            coopStoreT(o1, &s_sh[mine], T); workgroupBarrier(); rescale_tile(mine, sg, lane, lanes); workgroupBarrier(); o1 = coopLoadT<MatC>(&s_sh[mine], T); workgroupBarrier();
            coopStoreT(o2, &s_sh[mine], T); workgroupBarrier(); rescale_tile(mine, sg, lane, lanes); workgroupBarrier(); o2 = coopLoadT<MatC>(&s_sh[mine], T); workgroupBarrier();
            coopStoreT(o3, &s_sh[mine], T); workgroupBarrier(); rescale_tile(mine, sg, lane, lanes); workgroupBarrier(); o3 = coopLoadT<MatC>(&s_sh[mine], T); workgroupBarrier();
            coopStoreT(o4, &s_sh[mine], T); workgroupBarrier(); rescale_tile(mine, sg, lane, lanes); workgroupBarrier(); o4 = coopLoadT<MatC>(&s_sh[mine], T); workgroupBarrier();
            coopStoreT(o5, &s_sh[mine], T); workgroupBarrier(); rescale_tile(mine, sg, lane, lanes); workgroupBarrier(); o5 = coopLoadT<MatC>(&s_sh[mine], T); workgroupBarrier();
            coopStoreT(o6, &s_sh[mine], T); workgroupBarrier(); rescale_tile(mine, sg, lane, lanes); workgroupBarrier(); o6 = coopLoadT<MatC>(&s_sh[mine], T); workgroupBarrier();
            coopStoreT(o7, &s_sh[mine], T); workgroupBarrier(); rescale_tile(mine, sg, lane, lanes); workgroupBarrier(); o7 = coopLoadT<MatC>(&s_sh[mine], T); workgroupBarrier();
        }
        // O += P·V: A = P (T × KB), B = V (KB × ODIMS), two keys' tiles at a time.
        let pa0 = coopLoadT<MatA>(&p_sh[mine], KB);
        let pa1 = coopLoadT<MatA>(&p_sh[mine + T], KB);
        o0 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&v_sh[T * LDV + 0u * T], LDV), coopMultiplyAdd(pa0, coopLoadT<MatB>(&v_sh[0u * T], LDV), o0));
        o1 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&v_sh[T * LDV + 1u * T], LDV), coopMultiplyAdd(pa0, coopLoadT<MatB>(&v_sh[1u * T], LDV), o1));
        o2 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&v_sh[T * LDV + 2u * T], LDV), coopMultiplyAdd(pa0, coopLoadT<MatB>(&v_sh[2u * T], LDV), o2));
        o3 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&v_sh[T * LDV + 3u * T], LDV), coopMultiplyAdd(pa0, coopLoadT<MatB>(&v_sh[3u * T], LDV), o3));
        o4 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&v_sh[T * LDV + 4u * T], LDV), coopMultiplyAdd(pa0, coopLoadT<MatB>(&v_sh[4u * T], LDV), o4));
        o5 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&v_sh[T * LDV + 5u * T], LDV), coopMultiplyAdd(pa0, coopLoadT<MatB>(&v_sh[5u * T], LDV), o5));
        o6 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&v_sh[T * LDV + 6u * T], LDV), coopMultiplyAdd(pa0, coopLoadT<MatB>(&v_sh[6u * T], LDV), o6));
        o7 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&v_sh[T * LDV + 7u * T], LDV), coopMultiplyAdd(pa0, coopLoadT<MatB>(&v_sh[7u * T], LDV), o7));
        workgroupBarrier();
        if (li == 0u) {
            moved = 0u;
        }
    }
    workgroupBarrier();
    coopStoreT(o0, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, kvh, q0, d0 + 0u * T); workgroupBarrier();
    coopStoreT(o1, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, kvh, q0, d0 + 1u * T); workgroupBarrier();
    coopStoreT(o2, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, kvh, q0, d0 + 2u * T); workgroupBarrier();
    coopStoreT(o3, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, kvh, q0, d0 + 3u * T); workgroupBarrier();
    coopStoreT(o4, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, kvh, q0, d0 + 4u * T); workgroupBarrier();
    coopStoreT(o5, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, kvh, q0, d0 + 5u * T); workgroupBarrier();
    coopStoreT(o6, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, kvh, q0, d0 + 6u * T); workgroupBarrier();
    coopStoreT(o7, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, kvh, q0, d0 + 7u * T); workgroupBarrier();
    if (p.write_lse != 0u && wid.z == 0u) {
        for (var r = li; r < QB; r += WG) {
            if (q0 + r < p.q_len) {
                lse[p.lse_offset + (q0 + r) * p.q_heads + h] = row_max[r] + log(row_sum[r]);
            }
        }
    }
}

// The subgroup's staged T × T accumulator tile, each row times its rescale.
fn rescale_tile(mine: u32, sg: u32, lane: u32, lanes: u32) {
    for (var i = lane; i < T * T; i += lanes) {
        s_sh[mine + i] *= row_rescale[sg * T + i / T];
    }
}

// The subgroup's staged output tile (its T queries, dims dt … dt + T) written
// out: divided by the row's sum and P_SHIFT, times the value column's scale.
fn write_tile(mine: u32, sg: u32, lane: u32, lanes: u32, h: u32, kvh: u32, q0: u32, dt: u32) {
    for (var i = lane; i < T * T; i += lanes) {
        let row = sg * T + i / T;
        let qi = q0 + row;
        let d = dt + i % T;
        if (qi < p.q_len && d < p.head_dim) {
            let l = row_sum[row];
            let value = s_sh[mine + i] * v_scale(kvh, d) * select(0.0, 1.0 / (l * P_SHIFT), l > 0.0);
            o[p.o_offset + qi * p.o_stride + h * p.head_dim + d] = value;
        }
    }
}
