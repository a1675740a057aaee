// softmax(q·kᵀ·scale + mask)·v on cooperative-matrix units: the matrix
// tier's flash attention, with attention.wgsl's masks and grouped heads
// (interface in attention_io.wgsl), over f32 queries, keys and
// values or f16 ones in pieces (attention_qkv.wgsl), writing f32 rows or the
// next product's f16 operand in pieces (`O_HALF`).
//
// No subgroup arithmetic: every reduction goes through workgroup memory.
// (Modules that combine cooperative matrices with subgroup operations meet
// a driver fault on some NVIDIA drivers, kvark/blade#333; an earlier form
// of this kernel that took subgroupMax returned NaN on an H200.)
//
// A workgroup of SG subgroups takes QB = SG·T queries of one head and
// ODIMS = 8T of its output dims (16×16 tiles: 64 queries, all of a 128-wide
// head; 8×8 tiles: 16 queries, 64 dims, so a 128-wide head takes two
// workgroups). Each subgroup owns T queries: their output is 8 accumulator
// tiles held in registers over all keys, and so are their queries, as
// MAX_DIM / T fragments of T dims (staged once through workgroup memory, a
// chunk of dims at a time). Keys stream through in tiles of KB = 2T: the
// workgroup stages the tile's keys in workgroup memory, each subgroup
// computes its T × KB scores on the matrix units (Q·Kᵀ over the head's
// dims), the whole workgroup runs the online softmax (each row's KB scores
// split in segments over the invocations) and stages the tile's values
// where the keys were, and each subgroup adds P·V into its accumulators.
// So a workgroup holds one tile of keys or values, its scores and
// probabilities: 24,324 bytes with 16×16 tiles, room for two workgroups in
// the 48 KiB a workgroup NVIDIA's Vulkan driver offers.
//
// The softmax subtracts a running maximum that is raised only when a row's
// scores pass it by more than LAZY (e^8): the probabilities then stay below
// e^8, and the accumulators are rescaled (through workgroup memory) only on
// the tiles where something moved. Exact either way: softmax does not
// depend on the constant subtracted.
//
// The scales are folded, never measured in a pass of their own. Each query
// and key is staged divided by its row's power of two (attention_qkv.wgsl's
// row scales), folded back into its scores. Values are staged divided by
// one power of two for the workgroup, the largest row scale among the keys
// seen so far: when a tile raises it, the accumulators are rescaled with the
// softmax's rescale (a power of two, exact), and it is folded into the
// output. The probabilities go in as P·P_SHIFT (below e^8·16 < 65504, the
// smallest that matter still normal). Loads read clamped indices and select
// zero past the tensors; heads up to MAX_DIM (FLUX's 128).

override WG: u32 = 8u;
const SG: u32 = select(2u, 4u, T == 16u);
const MAX_DIM: u32 = 128u;
const QB: u32 = SG * T;
const KB: u32 = 2u * T;
const OD: u32 = 8u;
const ODIMS: u32 = OD * T;
const LDK: u32 = MAX_DIM + 8u;
const LDV: u32 = ODIMS;
const LAZY: f32 = 8.0;
const P_SHIFT: f32 = 16.0;
// Segments a row's scores are split in over the invocations, at most.
const MAX_SEGS: u32 = 2u;
// Output pieces one workgroup's dims hold, at most (`O_HALF`).
const OUT_PIECES: u32 = 8u;

// A tile's keys (rows of LDK), then its values (rows of LDV); first the
// queries, Q_CHUNK dims at a time: vec4s of four neighbouring dims, staged
// four at a store and read by the cooperative loads as they are (pointers
// and strides in vec4s; every row length and fragment start is whole vec4s).
var<workgroup> kv_sh: array<vec4<Operand>, KB * LDK / 4u>;
// Dims of the queries staged at a time (whole tiles), and the fragments of
// a subgroup's queries.
const Q_CHUNK: u32 = min(MAX_DIM, (KB * LDK / QB) / T * T);
const Q_FRAGS: u32 = MAX_DIM / T;
// The scores, row r's at r·KB (a subgroup's T rows together); after the
// keys, a subgroup's staging for one T × T output tile and its rows' pieces'
// largest magnitudes.
var<workgroup> s_sh: array<f32, QB * KB>;
var<workgroup> p_sh: array<Operand, QB * KB>;
var<workgroup> zero_sh: array<f32, T * T>;
var<workgroup> q_scale: array<f32, QB>;
var<workgroup> k_scale: array<f32, KB>;
var<workgroup> v_row: array<f32, KB>;
var<workgroup> row_max: array<f32, QB>;
var<workgroup> row_sum: array<f32, QB>;
var<workgroup> row_rescale: array<f32, QB>;
var<workgroup> seg_max: array<f32, QB * MAX_SEGS>;
var<workgroup> seg_sum: array<f32, QB * MAX_SEGS>;
var<workgroup> moved: u32;

// The row's running maximum after a tile whose segments' largest scores are
// in seg_max: raised to the tile's largest only past LAZY (or from none).
fn next_max(r: u32, segs: u32) -> f32 {
    let m_old = row_max[r];
    var tile_max = MASKED;
    for (var s = 0u; s < segs; s++) {
        tile_max = max(tile_max, seg_max[r * segs + s]);
    }
    if (tile_max > m_old + LAZY || (m_old == MASKED && tile_max > MASKED)) {
        return tile_max;
    }
    return m_old;
}

// Dims c0 … c0 + Q_CHUNK of the workgroup's queries into kv_sh, rows of
// Q_CHUNK, each divided by its row's scale.
fn stage_queries(li: u32, h: u32, q0: u32, c0: u32) {
    for (var i = li; i < QB * Q_CHUNK / 4u; i += WG) {
        let r = i / (Q_CHUNK / 4u);
        let d = 4u * (i % (Q_CHUNK / 4u));
        if (quads_at(p.q_offset, p.q_stride)) {
            kv_sh[(r * Q_CHUNK + d) / 4u] = tensor_quad(QUERIES, h, q0 + r, c0 + d, q_scale[r]);
        } else {
            kv_sh[(r * Q_CHUNK + d) / 4u] = vec4<Operand>(divided_by_power(tensor_run(QUERIES, h, q0 + r, c0 + d), q_scale[r]));
        }
    }
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
    // head_dim rounded up to whole tiles (the dims past it are zeros).
    let dims = (p.head_dim + T - 1u) / T * T;
    let segs = clamp(WG / QB, 1u, MAX_SEGS);
    let seg_len = KB / segs;
    for (var i = li; i < T * T; i += WG) {
        zero_sh[i] = 0.0;
    }
    for (var r = li; r < QB; r += WG) {
        row_max[r] = MASKED;
        row_sum[r] = 0.0;
        q_scale[r] = qk_row_scale(false, h, q0 + r);
    }
    if (li == 0u) {
        moved = 0u;
    }
    workgroupBarrier();
    // Q, once: the subgroup's fragments of its queries' dims, loaded from
    // kv_sh a chunk of dims at a time (fragments past Q_FRAGS are never
    // used; past `dims`, never loaded). Up to 16 (128 dims in 8×8 tiles).
    var qf0 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf1 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf2 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf3 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf4 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf5 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf6 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf7 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf8 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf9 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf10 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf11 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf12 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf13 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf14 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    var qf15 = coopLoadT<MatA>(&kv_sh[(0) / 4u], T / 4u);
    // At most two chunks (Q_CHUNK is at least half of MAX_DIM), unrolled:
    // which fragment a chunk holds is then known to the compiler.
    stage_queries(li, h, q0, 0u);
    workgroupBarrier();
    if ((0u < Q_FRAGS) & (0u * T >= 0u * Q_CHUNK) & (0u * T < 1u * Q_CHUNK)) { qf0 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 0u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((1u < Q_FRAGS) & (1u * T >= 0u * Q_CHUNK) & (1u * T < 1u * Q_CHUNK)) { qf1 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 1u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((2u < Q_FRAGS) & (2u * T >= 0u * Q_CHUNK) & (2u * T < 1u * Q_CHUNK)) { qf2 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 2u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((3u < Q_FRAGS) & (3u * T >= 0u * Q_CHUNK) & (3u * T < 1u * Q_CHUNK)) { qf3 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 3u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((4u < Q_FRAGS) & (4u * T >= 0u * Q_CHUNK) & (4u * T < 1u * Q_CHUNK)) { qf4 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 4u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((5u < Q_FRAGS) & (5u * T >= 0u * Q_CHUNK) & (5u * T < 1u * Q_CHUNK)) { qf5 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 5u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((6u < Q_FRAGS) & (6u * T >= 0u * Q_CHUNK) & (6u * T < 1u * Q_CHUNK)) { qf6 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 6u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((7u < Q_FRAGS) & (7u * T >= 0u * Q_CHUNK) & (7u * T < 1u * Q_CHUNK)) { qf7 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 7u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((8u < Q_FRAGS) & (8u * T >= 0u * Q_CHUNK) & (8u * T < 1u * Q_CHUNK)) { qf8 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 8u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((9u < Q_FRAGS) & (9u * T >= 0u * Q_CHUNK) & (9u * T < 1u * Q_CHUNK)) { qf9 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 9u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((10u < Q_FRAGS) & (10u * T >= 0u * Q_CHUNK) & (10u * T < 1u * Q_CHUNK)) { qf10 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 10u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((11u < Q_FRAGS) & (11u * T >= 0u * Q_CHUNK) & (11u * T < 1u * Q_CHUNK)) { qf11 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 11u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((12u < Q_FRAGS) & (12u * T >= 0u * Q_CHUNK) & (12u * T < 1u * Q_CHUNK)) { qf12 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 12u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((13u < Q_FRAGS) & (13u * T >= 0u * Q_CHUNK) & (13u * T < 1u * Q_CHUNK)) { qf13 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 13u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((14u < Q_FRAGS) & (14u * T >= 0u * Q_CHUNK) & (14u * T < 1u * Q_CHUNK)) { qf14 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 14u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    if ((15u < Q_FRAGS) & (15u * T >= 0u * Q_CHUNK) & (15u * T < 1u * Q_CHUNK)) { qf15 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 15u * T - 0u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
    workgroupBarrier();
    if (Q_CHUNK < dims) {
        stage_queries(li, h, q0, Q_CHUNK);
        workgroupBarrier();
        if ((0u < Q_FRAGS) & (0u * T >= 1u * Q_CHUNK) & (0u * T < 2u * Q_CHUNK)) { qf0 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 0u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((1u < Q_FRAGS) & (1u * T >= 1u * Q_CHUNK) & (1u * T < 2u * Q_CHUNK)) { qf1 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 1u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((2u < Q_FRAGS) & (2u * T >= 1u * Q_CHUNK) & (2u * T < 2u * Q_CHUNK)) { qf2 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 2u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((3u < Q_FRAGS) & (3u * T >= 1u * Q_CHUNK) & (3u * T < 2u * Q_CHUNK)) { qf3 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 3u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((4u < Q_FRAGS) & (4u * T >= 1u * Q_CHUNK) & (4u * T < 2u * Q_CHUNK)) { qf4 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 4u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((5u < Q_FRAGS) & (5u * T >= 1u * Q_CHUNK) & (5u * T < 2u * Q_CHUNK)) { qf5 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 5u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((6u < Q_FRAGS) & (6u * T >= 1u * Q_CHUNK) & (6u * T < 2u * Q_CHUNK)) { qf6 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 6u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((7u < Q_FRAGS) & (7u * T >= 1u * Q_CHUNK) & (7u * T < 2u * Q_CHUNK)) { qf7 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 7u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((8u < Q_FRAGS) & (8u * T >= 1u * Q_CHUNK) & (8u * T < 2u * Q_CHUNK)) { qf8 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 8u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((9u < Q_FRAGS) & (9u * T >= 1u * Q_CHUNK) & (9u * T < 2u * Q_CHUNK)) { qf9 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 9u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((10u < Q_FRAGS) & (10u * T >= 1u * Q_CHUNK) & (10u * T < 2u * Q_CHUNK)) { qf10 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 10u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((11u < Q_FRAGS) & (11u * T >= 1u * Q_CHUNK) & (11u * T < 2u * Q_CHUNK)) { qf11 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 11u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((12u < Q_FRAGS) & (12u * T >= 1u * Q_CHUNK) & (12u * T < 2u * Q_CHUNK)) { qf12 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 12u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((13u < Q_FRAGS) & (13u * T >= 1u * Q_CHUNK) & (13u * T < 2u * Q_CHUNK)) { qf13 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 13u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((14u < Q_FRAGS) & (14u * T >= 1u * Q_CHUNK) & (14u * T < 2u * Q_CHUNK)) { qf14 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 14u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        if ((15u < Q_FRAGS) & (15u * T >= 1u * Q_CHUNK) & (15u * T < 2u * Q_CHUNK)) { qf15 = coopLoadT<MatA>(&kv_sh[((sg * T) * Q_CHUNK + 15u * T - 1u * Q_CHUNK) / 4u], Q_CHUNK / 4u); }
        workgroupBarrier();
    }
    var k_end = p.kv_len;
    if (p.causal != 0u) {
        k_end = min(p.kv_len, q0 + QB + p.q_position);
    }
    let mine = sg * T * KB;
    // Every invocation's zeros are in place before any subgroup loads them.
    workgroupBarrier();
    // Each accumulator loaded from the zeros: no cooperative matrix is ever
    // copied from another.
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
    // What every staged value is divided by: the same in every invocation
    // (each computes it from the same workgroup memory).
    var v_ref = 0.0;
    for (var k0 = 0u; k0 < k_end; k0 += KB) {
        for (var j = li; j < KB; j += WG) {
            k_scale[j] = qk_row_scale(true, kvh, k0 + j);
            v_row[j] = v_row_scale(kvh, k0 + j, d0, d0 + ODIMS);
        }
        workgroupBarrier();
        var tile_v = 0.0;
        for (var j = 0u; j < KB; j++) {
            tile_v = max(tile_v, v_row[j]);
        }
        let v_new = max(v_ref, tile_v);
        let v_factor = select(1.0, v_ref / v_new, v_ref > 0.0 && v_new > v_ref);
        if (li == 0u && v_factor != 1.0) {
            moved = 1u;
        }
        v_ref = v_new;
        let v_div = select(v_new, 1.0, v_new == 0.0);
        for (var i = li; i < KB * dims / 4u; i += WG) {
            let j = i / (dims / 4u);
            let d = 4u * (i % (dims / 4u));
            if (quads_at(p.k_offset, p.k_stride)) {
                kv_sh[(j * LDK + d) / 4u] = tensor_quad(KEYS, kvh, k0 + j, d, k_scale[j]);
            } else {
                kv_sh[(j * LDK + d) / 4u] = vec4<Operand>(divided_by_power(tensor_run(KEYS, kvh, k0 + j, d), k_scale[j]));
            }
        }
        workgroupBarrier();
        // S = Q·Kᵀ for this subgroup's T queries and the tile's 2T keys.
        s0 = coopLoadT<MatC>(&zero_sh[0], T);
        s1 = coopLoadT<MatC>(&zero_sh[0], T);
        if ((0u < Q_FRAGS) & (0u * T < dims)) {
            s0 = coopMultiplyAdd(qf0, coopLoad<MatB>(&kv_sh[(0u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf0, coopLoad<MatB>(&kv_sh[(T * LDK + 0u * T) / 4u], LDK / 4u), s1);
        }
        if ((1u < Q_FRAGS) & (1u * T < dims)) {
            s0 = coopMultiplyAdd(qf1, coopLoad<MatB>(&kv_sh[(1u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf1, coopLoad<MatB>(&kv_sh[(T * LDK + 1u * T) / 4u], LDK / 4u), s1);
        }
        if ((2u < Q_FRAGS) & (2u * T < dims)) {
            s0 = coopMultiplyAdd(qf2, coopLoad<MatB>(&kv_sh[(2u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf2, coopLoad<MatB>(&kv_sh[(T * LDK + 2u * T) / 4u], LDK / 4u), s1);
        }
        if ((3u < Q_FRAGS) & (3u * T < dims)) {
            s0 = coopMultiplyAdd(qf3, coopLoad<MatB>(&kv_sh[(3u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf3, coopLoad<MatB>(&kv_sh[(T * LDK + 3u * T) / 4u], LDK / 4u), s1);
        }
        if ((4u < Q_FRAGS) & (4u * T < dims)) {
            s0 = coopMultiplyAdd(qf4, coopLoad<MatB>(&kv_sh[(4u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf4, coopLoad<MatB>(&kv_sh[(T * LDK + 4u * T) / 4u], LDK / 4u), s1);
        }
        if ((5u < Q_FRAGS) & (5u * T < dims)) {
            s0 = coopMultiplyAdd(qf5, coopLoad<MatB>(&kv_sh[(5u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf5, coopLoad<MatB>(&kv_sh[(T * LDK + 5u * T) / 4u], LDK / 4u), s1);
        }
        if ((6u < Q_FRAGS) & (6u * T < dims)) {
            s0 = coopMultiplyAdd(qf6, coopLoad<MatB>(&kv_sh[(6u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf6, coopLoad<MatB>(&kv_sh[(T * LDK + 6u * T) / 4u], LDK / 4u), s1);
        }
        if ((7u < Q_FRAGS) & (7u * T < dims)) {
            s0 = coopMultiplyAdd(qf7, coopLoad<MatB>(&kv_sh[(7u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf7, coopLoad<MatB>(&kv_sh[(T * LDK + 7u * T) / 4u], LDK / 4u), s1);
        }
        if ((8u < Q_FRAGS) & (8u * T < dims)) {
            s0 = coopMultiplyAdd(qf8, coopLoad<MatB>(&kv_sh[(8u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf8, coopLoad<MatB>(&kv_sh[(T * LDK + 8u * T) / 4u], LDK / 4u), s1);
        }
        if ((9u < Q_FRAGS) & (9u * T < dims)) {
            s0 = coopMultiplyAdd(qf9, coopLoad<MatB>(&kv_sh[(9u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf9, coopLoad<MatB>(&kv_sh[(T * LDK + 9u * T) / 4u], LDK / 4u), s1);
        }
        if ((10u < Q_FRAGS) & (10u * T < dims)) {
            s0 = coopMultiplyAdd(qf10, coopLoad<MatB>(&kv_sh[(10u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf10, coopLoad<MatB>(&kv_sh[(T * LDK + 10u * T) / 4u], LDK / 4u), s1);
        }
        if ((11u < Q_FRAGS) & (11u * T < dims)) {
            s0 = coopMultiplyAdd(qf11, coopLoad<MatB>(&kv_sh[(11u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf11, coopLoad<MatB>(&kv_sh[(T * LDK + 11u * T) / 4u], LDK / 4u), s1);
        }
        if ((12u < Q_FRAGS) & (12u * T < dims)) {
            s0 = coopMultiplyAdd(qf12, coopLoad<MatB>(&kv_sh[(12u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf12, coopLoad<MatB>(&kv_sh[(T * LDK + 12u * T) / 4u], LDK / 4u), s1);
        }
        if ((13u < Q_FRAGS) & (13u * T < dims)) {
            s0 = coopMultiplyAdd(qf13, coopLoad<MatB>(&kv_sh[(13u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf13, coopLoad<MatB>(&kv_sh[(T * LDK + 13u * T) / 4u], LDK / 4u), s1);
        }
        if ((14u < Q_FRAGS) & (14u * T < dims)) {
            s0 = coopMultiplyAdd(qf14, coopLoad<MatB>(&kv_sh[(14u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf14, coopLoad<MatB>(&kv_sh[(T * LDK + 14u * T) / 4u], LDK / 4u), s1);
        }
        if ((15u < Q_FRAGS) & (15u * T < dims)) {
            s0 = coopMultiplyAdd(qf15, coopLoad<MatB>(&kv_sh[(15u * T) / 4u], LDK / 4u), s0);
            s1 = coopMultiplyAdd(qf15, coopLoad<MatB>(&kv_sh[(T * LDK + 15u * T) / 4u], LDK / 4u), s1);
        }
        coopStoreT(s0, &s_sh[mine], KB);
        coopStoreT(s1, &s_sh[mine + T], KB);
        workgroupBarrier();
        // The online softmax on every invocation. First each (row, segment):
        // its scores scaled back and masked, and their largest.
        for (var i = li; i < QB * segs; i += WG) {
            let r = i / segs;
            let start = (i % segs) * seg_len;
            var largest = MASKED;
            for (var j = start; j < start + seg_len; j++) {
                var s = MASKED;
                if (visible(q0 + r, k0 + j)) {
                    s = s_sh[r * KB + j] * q_scale[r] * k_scale[j] * p.scale;
                }
                s_sh[r * KB + j] = s;
                largest = max(largest, s);
            }
            seg_max[i] = largest;
        }
        // Every subgroup's scores are in s_sh: the values take the keys' place.
        for (var i = li; i < KB * ODIMS / 4u; i += WG) {
            let j = i / (ODIMS / 4u);
            let c = 4u * (i % (ODIMS / 4u));
            if (quads_at(p.v_offset, p.v_stride)) {
                kv_sh[(j * LDV + c) / 4u] = tensor_quad(VALUES, kvh, k0 + j, d0 + c, v_div);
            } else {
                kv_sh[(j * LDV + c) / 4u] = vec4<Operand>(divided_by_power(tensor_run(VALUES, kvh, k0 + j, d0 + c), v_div));
            }
        }
        workgroupBarrier();
        // Then each (row, segment)'s probabilities under the row's new maximum, and their sum.
        for (var i = li; i < QB * segs; i += WG) {
            let r = i / segs;
            let start = (i % segs) * seg_len;
            let m_new = next_max(r, segs);
            var sum = 0.0;
            for (var j = start; j < start + seg_len; j++) {
                let s = s_sh[r * KB + j];
                var pr = 0.0;
                if (s > MASKED) {
                    pr = exp(s - m_new);
                }
                sum += pr;
                p_sh[r * KB + j] = Operand(pr * P_SHIFT);
            }
            seg_sum[i] = sum;
        }
        workgroupBarrier();
        // Then each row's running sum, and its accumulators' rescale with the values' folded in.
        for (var r = li; r < QB; r += WG) {
            let m_old = row_max[r];
            let m_new = next_max(r, segs);
            var sum = 0.0;
            for (var s = 0u; s < segs; s++) {
                sum += seg_sum[r * segs + s];
            }
            // A row that saw no key before has zero accumulators: nothing to rescale.
            let rescale = select(1.0, exp(m_old - m_new), m_new != m_old && m_old != MASKED);
            if (rescale != 1.0) {
                moved = 1u;
            }
            row_rescale[r] = rescale * v_factor;
            row_sum[r] = row_sum[r] * rescale + sum;
            row_max[r] = m_new;
        }
        // Rescales the accumulators where something moved.
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
        o0 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&kv_sh[(T * LDV + 0u * T) / 4u], LDV / 4u), coopMultiplyAdd(pa0, coopLoadT<MatB>(&kv_sh[(0u * T) / 4u], LDV / 4u), o0));
        o1 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&kv_sh[(T * LDV + 1u * T) / 4u], LDV / 4u), coopMultiplyAdd(pa0, coopLoadT<MatB>(&kv_sh[(1u * T) / 4u], LDV / 4u), o1));
        o2 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&kv_sh[(T * LDV + 2u * T) / 4u], LDV / 4u), coopMultiplyAdd(pa0, coopLoadT<MatB>(&kv_sh[(2u * T) / 4u], LDV / 4u), o2));
        o3 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&kv_sh[(T * LDV + 3u * T) / 4u], LDV / 4u), coopMultiplyAdd(pa0, coopLoadT<MatB>(&kv_sh[(3u * T) / 4u], LDV / 4u), o3));
        o4 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&kv_sh[(T * LDV + 4u * T) / 4u], LDV / 4u), coopMultiplyAdd(pa0, coopLoadT<MatB>(&kv_sh[(4u * T) / 4u], LDV / 4u), o4));
        o5 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&kv_sh[(T * LDV + 5u * T) / 4u], LDV / 4u), coopMultiplyAdd(pa0, coopLoadT<MatB>(&kv_sh[(5u * T) / 4u], LDV / 4u), o5));
        o6 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&kv_sh[(T * LDV + 6u * T) / 4u], LDV / 4u), coopMultiplyAdd(pa0, coopLoadT<MatB>(&kv_sh[(6u * T) / 4u], LDV / 4u), o6));
        o7 = coopMultiplyAdd(pa1, coopLoadT<MatB>(&kv_sh[(T * LDV + 7u * T) / 4u], LDV / 4u), coopMultiplyAdd(pa0, coopLoadT<MatB>(&kv_sh[(7u * T) / 4u], LDV / 4u), o7));
        workgroupBarrier();
        if (li == 0u) {
            moved = 0u;
        }
    }
    workgroupBarrier();
    // An accumulator's value times this is the output before the row's sum divides it.
    let unit = select(v_ref, 1.0, v_ref == 0.0) / P_SHIFT;
    if (O_HALF) {
        // Each row's pieces' largest magnitudes over the 8 tiles, then the
        // tiles again, written under them.
        for (var i = lane; i < T * OUT_PIECES; i += lanes) {
            s_sh[mine + T * T + i] = 0.0;
        }
        workgroupBarrier();
        coopStoreT(o0, &s_sh[mine], T); workgroupBarrier(); piece_largest(mine, sg, lane, lanes, q0, d0, 0u * T, unit); workgroupBarrier();
        coopStoreT(o1, &s_sh[mine], T); workgroupBarrier(); piece_largest(mine, sg, lane, lanes, q0, d0, 1u * T, unit); workgroupBarrier();
        coopStoreT(o2, &s_sh[mine], T); workgroupBarrier(); piece_largest(mine, sg, lane, lanes, q0, d0, 2u * T, unit); workgroupBarrier();
        coopStoreT(o3, &s_sh[mine], T); workgroupBarrier(); piece_largest(mine, sg, lane, lanes, q0, d0, 3u * T, unit); workgroupBarrier();
        coopStoreT(o4, &s_sh[mine], T); workgroupBarrier(); piece_largest(mine, sg, lane, lanes, q0, d0, 4u * T, unit); workgroupBarrier();
        coopStoreT(o5, &s_sh[mine], T); workgroupBarrier(); piece_largest(mine, sg, lane, lanes, q0, d0, 5u * T, unit); workgroupBarrier();
        coopStoreT(o6, &s_sh[mine], T); workgroupBarrier(); piece_largest(mine, sg, lane, lanes, q0, d0, 6u * T, unit); workgroupBarrier();
        coopStoreT(o7, &s_sh[mine], T); workgroupBarrier(); piece_largest(mine, sg, lane, lanes, q0, d0, 7u * T, unit); workgroupBarrier();
        coopStoreT(o0, &s_sh[mine], T); workgroupBarrier(); write_half_tile(mine, sg, lane, lanes, h, q0, d0, 0u * T, unit); workgroupBarrier();
        coopStoreT(o1, &s_sh[mine], T); workgroupBarrier(); write_half_tile(mine, sg, lane, lanes, h, q0, d0, 1u * T, unit); workgroupBarrier();
        coopStoreT(o2, &s_sh[mine], T); workgroupBarrier(); write_half_tile(mine, sg, lane, lanes, h, q0, d0, 2u * T, unit); workgroupBarrier();
        coopStoreT(o3, &s_sh[mine], T); workgroupBarrier(); write_half_tile(mine, sg, lane, lanes, h, q0, d0, 3u * T, unit); workgroupBarrier();
        coopStoreT(o4, &s_sh[mine], T); workgroupBarrier(); write_half_tile(mine, sg, lane, lanes, h, q0, d0, 4u * T, unit); workgroupBarrier();
        coopStoreT(o5, &s_sh[mine], T); workgroupBarrier(); write_half_tile(mine, sg, lane, lanes, h, q0, d0, 5u * T, unit); workgroupBarrier();
        coopStoreT(o6, &s_sh[mine], T); workgroupBarrier(); write_half_tile(mine, sg, lane, lanes, h, q0, d0, 6u * T, unit); workgroupBarrier();
        coopStoreT(o7, &s_sh[mine], T); workgroupBarrier(); write_half_tile(mine, sg, lane, lanes, h, q0, d0, 7u * T, unit); workgroupBarrier();
        write_piece_scales(mine, sg, lane, lanes, h, q0, d0);
    } else {
        coopStoreT(o0, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, q0, d0 + 0u * T, unit); workgroupBarrier();
        coopStoreT(o1, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, q0, d0 + 1u * T, unit); workgroupBarrier();
        coopStoreT(o2, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, q0, d0 + 2u * T, unit); workgroupBarrier();
        coopStoreT(o3, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, q0, d0 + 3u * T, unit); workgroupBarrier();
        coopStoreT(o4, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, q0, d0 + 4u * T, unit); workgroupBarrier();
        coopStoreT(o5, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, q0, d0 + 5u * T, unit); workgroupBarrier();
        coopStoreT(o6, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, q0, d0 + 6u * T, unit); workgroupBarrier();
        coopStoreT(o7, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, q0, d0 + 7u * T, unit); workgroupBarrier();
    }
}

// The subgroup's staged T × T accumulator tile, each row times its rescale.
fn rescale_tile(mine: u32, sg: u32, lane: u32, lanes: u32) {
    for (var i = lane; i < T * T; i += lanes) {
        s_sh[mine + i] *= row_rescale[sg * T + i / T];
    }
}

// What the row's output is multiplied by: `unit` over its sum (0 for a row that saw no key).
fn row_factor(row: u32, unit: f32) -> f32 {
    let l = row_sum[row];
    return select(0.0, unit / l, l > 0.0);
}

// The subgroup's staged output tile (its T queries, dims dt … dt + T) written out as f32.
fn write_tile(mine: u32, sg: u32, lane: u32, lanes: u32, h: u32, q0: u32, dt: u32, unit: f32) {
    for (var i = lane; i < T * T; i += lanes) {
        let row = sg * T + i / T;
        let qi = q0 + row;
        let d = dt + i % T;
        if (qi < p.q_len && d < p.head_dim) {
            o[p.o_offset + qi * p.o_stride + h * p.head_dim + d] = s_sh[mine + i] * row_factor(row, unit);
        }
    }
}

// The staged tile's (dims d0 + dt …) largest magnitude per row and output
// piece, kept after the subgroup's scores (one lane a row: no races).
fn piece_largest(mine: u32, sg: u32, lane: u32, lanes: u32, q0: u32, d0: u32, dt: u32, unit: f32) {
    for (var r = lane; r < T; r += lanes) {
        let factor = row_factor(sg * T + r, unit);
        for (var c = 0u; c < T; c++) {
            let d = d0 + dt + c;
            if (d < p.head_dim) {
                let at = mine + T * T + r * OUT_PIECES + (dt + c) / O_PIECE;
                s_sh[at] = max(s_sh[at], abs(s_sh[mine + r * T + c] * factor));
            }
        }
    }
}

// The range rule's exponent for the output piece holding dim d0 + local of row r (kept ≥ -126 as half_pack.wgsl keeps it).
fn piece_exponent(mine: u32, r: u32, local: u32) -> i32 {
    return max(range_exponent(s_sh[mine + T * T + r * OUT_PIECES + local / O_PIECE]), -126);
}

// The staged tile written as f16 pairs, each divided by its piece's power of two.
fn write_half_tile(mine: u32, sg: u32, lane: u32, lanes: u32, h: u32, q0: u32, d0: u32, dt: u32, unit: f32) {
    for (var i = lane; i < T * T / 2u; i += lanes) {
        let r = i / (T / 2u);
        let c = (i % (T / 2u)) * 2u;
        let qi = q0 + sg * T + r;
        let d = d0 + dt + c;
        if (qi < p.q_len && d < p.head_dim) {
            let factor = row_factor(sg * T + r, unit);
            let e = piece_exponent(mine, r, dt + c);
            let pair = vec2<f32>(ldexp(s_sh[mine + r * T + c] * factor, -e), ldexp(s_sh[mine + r * T + c + 1u] * factor, -e));
            o_half[(p.o_offset + qi * p.o_stride + h * p.head_dim + d) / 2u] = operand_pair(pair);
        }
    }
}

// Each of the subgroup's rows' pieces' scales.
fn write_piece_scales(mine: u32, sg: u32, lane: u32, lanes: u32, h: u32, q0: u32, d0: u32) {
    for (var i = lane; i < T * OUT_PIECES; i += lanes) {
        let r = i / OUT_PIECES;
        let local = (i % OUT_PIECES) * O_PIECE;
        let qi = q0 + sg * T + r;
        if (qi < p.q_len && local < ODIMS && d0 + local < p.head_dim) {
            o_scales[p.o_scale_offset + qi * p.o_scale_stride + (h * p.head_dim + d0 + local) / O_PIECE] = ldexp(1.0, piece_exponent(mine, r, local));
        }
    }
}
