// softmax(q·kᵀ·scale + mask)·v on cooperative-matrix units: the matrix
// tier's attention, with attention.wgsl's online softmax, masks and grouped
// heads (interface in attention_io.wgsl).
//
// One workgroup, which is one subgroup of WG invocations, handles T queries
// of one head; keys stream through in tiles of T. Both products run on T×T
// `Operand` tiles (f16, or f32 where offered) into f32 accumulators: the
// scores S = Q·Kᵀ over head_dim in chunks of T, then O += P·V for each
// chunk of T output dims. f16 operands are rounded under range_rule.wgsl's
// rule: per query and per key over the whole head_dim, per row of
// probabilities and per value column within a key tile (f32 ones skip the
// measuring; their scales stay 1). The softmax and the running output stay f32 in workgroup
// memory. Head dims up to MAX_DIM, which the module sets (attention_head_128.wgsl
// for FLUX's heads, attention_head_512.wgsl for the VAE's single 512-wide one).
//
// A workgroup writes O_DIMS of the head's output dims (dims wid.z·O_DIMS
// on; the launcher's choice: all of them, or for the 512-wide head on an
// adapter short of workgroup memory a half or a quarter, each workgroup
// computing the scores over the whole head), so its running output is T
// rows of O_DIMS.
//
// As attention.wgsl, a call over a chunk of the keys continues an earlier
// chunk's online softmax (CARRY_FROM: each row's running max and sum from
// the state, its unnormalised output from o) and/or leaves its own
// (CARRY_KEEP), so calls over chunks of whole key tiles give the bits of one.

override WG: u32 = 8u;
override O_DIMS: u32 = MAX_DIM;
override O_ACC: u32 = T * O_DIMS;
const CARRY_FROM: u32 = 1u;
const CARRY_KEEP: u32 = 2u;

fn state_at(qi: u32, h: u32) -> u32 {
    return p.state_offset + 2u * (qi * p.q_heads + h);
}

var<workgroup> a_tile: array<Operand, T * T>;
var<workgroup> b_tile: array<Operand, T * T>;
// The scores, then the tile's probabilities (f32, row-major).
var<workgroup> s_tile: array<f32, T * T>;
// One chunk of P·V, and zeros to start each product's accumulator from.
var<workgroup> pv_tile: array<f32, T * T>;
var<workgroup> zero_tile: array<f32, T * T>;
// The running output of the workgroup's dims, [T][O_DIMS].
var<workgroup> o_acc: array<f32, O_ACC>;
var<workgroup> q_scale: array<f32, T>;
var<workgroup> k_scale: array<f32, T>;
var<workgroup> p_scale: array<f32, T>;
var<workgroup> v_scale: array<f32, T>;
var<workgroup> row_max: array<f32, T>;
var<workgroup> row_sum: array<f32, T>;
var<workgroup> row_rescale: array<f32, T>;

// The product of the staged a_tile and b_tile, started from zero.
fn staged_product() -> MatC {
    return coopMultiplyAdd(coopLoadT<MatA>(&a_tile[0], T), coopLoadT<MatB>(&b_tile[0], T), coopLoadT<MatC>(&zero_tile[0], T));
}

@compute @workgroup_size(WG)
fn attention_matrix(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.y;
    let kvh = h / (p.q_heads / p.kv_heads);
    let q0 = wid.x * T;
    // head_dim rounded up to whole tiles (the dims past it are zeros).
    let dims = (p.head_dim + T - 1u) / T * T;
    // The workgroup's output dims: dz … d_end.
    let dz = wid.z * O_DIMS;
    let d_end = min(dims, dz + O_DIMS);
    for (var i = li; i < T * O_DIMS; i += WG) {
        let r = i / O_DIMS;
        let d = dz + i % O_DIMS;
        var carried = 0.0;
        if ((p.carry & CARRY_FROM) != 0u && q0 + r < p.q_len && d < p.head_dim) {
            carried = o[p.o_offset + (q0 + r) * p.o_stride + h * p.head_dim + d];
        }
        o_acc[i] = carried;
    }
    for (var i = li; i < T * T; i += WG) {
        zero_tile[i] = 0.0;
    }
    for (var r = li; r < T; r += WG) {
        var largest = 0.0;
        for (var d = 0u; OPERAND_HALF && d < p.head_dim; d++) {
            largest = max(largest, abs(tensor_at(QUERIES, h, q0 + r, d)));
        }
        q_scale[r] = range_scale(largest);
        row_max[r] = MASKED;
        row_sum[r] = 0.0;
        if ((p.carry & CARRY_FROM) != 0u && q0 + r < p.q_len) {
            row_max[r] = state[state_at(q0 + r, h)];
            row_sum[r] = state[state_at(q0 + r, h) + 1u];
        }
    }
    var k_end = p.kv_len;
    if (p.causal != 0u) {
        k_end = min(p.kv_len, q0 + T + p.q_position);
    }
    workgroupBarrier();
    for (var k0 = 0u; k0 < k_end; k0 += T) {
        for (var j = li; j < T; j += WG) {
            var largest = 0.0;
            for (var d = 0u; OPERAND_HALF && d < p.head_dim; d++) {
                largest = max(largest, abs(tensor_at(KEYS, kvh, k0 + j, d)));
            }
            k_scale[j] = range_scale(largest);
        }
        workgroupBarrier();
        // S = Q·Kᵀ: A[r, t] = Q[q0 + r, d0 + t], B[t, j] = K[k0 + j, d0 + t].
        var scores = coopLoadT<MatC>(&zero_tile[0], T);
        for (var d0 = 0u; d0 < dims; d0 += T) {
            for (var i = li; i < T * T; i += WG) {
                let r = i / T;
                let c = i % T;
                a_tile[i] = Operand(tensor_at(QUERIES, h, q0 + r, d0 + c) / q_scale[r]);
                b_tile[i] = Operand(tensor_at(KEYS, kvh, k0 + c, d0 + r) / k_scale[c]);
            }
            workgroupBarrier();
            scores = coopMultiplyAdd(coopLoadT<MatA>(&a_tile[0], T), coopLoadT<MatB>(&b_tile[0], T), scores);
            workgroupBarrier();
        }
        coopStoreT(scores, &s_tile[0], T);
        workgroupBarrier();
        // The online softmax, one query row per invocation.
        for (var r = li; r < T; r += WG) {
            let m_old = row_max[r];
            var m_new = m_old;
            for (var j = 0u; j < T; j++) {
                var s = MASKED;
                if (visible(q0 + r, k0 + j)) {
                    s = s_tile[r * T + j] * q_scale[r] * k_scale[j] * p.scale;
                }
                s_tile[r * T + j] = s;
                m_new = max(m_new, s);
            }
            var tile_sum = 0.0;
            var largest = 0.0;
            for (var j = 0u; j < T; j++) {
                let s = s_tile[r * T + j];
                var pr = 0.0;
                if (s > MASKED) {
                    pr = exp(s - m_new);
                }
                s_tile[r * T + j] = pr;
                tile_sum += pr;
                if (OPERAND_HALF) {
                    largest = max(largest, pr);
                }
            }
            let rescale = exp(m_old - m_new);
            row_rescale[r] = rescale;
            row_sum[r] = row_sum[r] * rescale + tile_sum;
            row_max[r] = m_new;
            p_scale[r] = range_scale(largest);
        }
        workgroupBarrier();
        // O = O·rescale + P·V, T output dims at a time: A = P, B[j, c] = V[k0 + j, d0 + c].
        for (var d0 = dz; d0 < d_end; d0 += T) {
            for (var c = li; c < T; c += WG) {
                var largest = 0.0;
                for (var j = 0u; OPERAND_HALF && j < T; j++) {
                    largest = max(largest, abs(tensor_at(VALUES, kvh, k0 + j, d0 + c)));
                }
                v_scale[c] = range_scale(largest);
            }
            workgroupBarrier();
            for (var i = li; i < T * T; i += WG) {
                let r = i / T;
                let c = i % T;
                a_tile[i] = Operand(s_tile[i] / p_scale[r]);
                b_tile[i] = Operand(tensor_at(VALUES, kvh, k0 + r, d0 + c) / v_scale[c]);
            }
            workgroupBarrier();
            coopStoreT(staged_product(), &pv_tile[0], T);
            workgroupBarrier();
            for (var i = li; i < T * T; i += WG) {
                let r = i / T;
                let at = r * O_DIMS + d0 - dz + i % T;
                o_acc[at] = o_acc[at] * row_rescale[r] + pv_tile[i] * p_scale[r] * v_scale[i % T];
            }
            workgroupBarrier();
        }
    }
    if (O_HALF) {
        // One (query, piece) an invocation: its largest magnitude, then its values.
        let pieces = (min(p.head_dim, dz + O_DIMS) - dz) / O_PIECE;
        for (var i = li; i < T * pieces; i += WG) {
            let r = i / pieces;
            let d0 = dz + (i % pieces) * O_PIECE;
            let qi = q0 + r;
            if (qi < p.q_len) {
                let l = row_sum[r];
                let inverse = select(0.0, 1.0 / l, l > 0.0);
                var largest = 0.0;
                for (var d = d0; d < d0 + O_PIECE; d++) {
                    largest = max(largest, abs(o_acc[r * O_DIMS + d - dz] * inverse));
                }
                let e = max(range_exponent(largest), -126);
                for (var d = d0; d < d0 + O_PIECE; d += 2u) {
                    let pair = vec2<f32>(ldexp(o_acc[r * O_DIMS + d - dz] * inverse, -e), ldexp(o_acc[r * O_DIMS + d - dz + 1u] * inverse, -e));
                    o_half[(p.o_offset + qi * p.o_stride + h * p.head_dim + d) / 2u] = operand_pair(pair);
                }
                o_scales[p.o_scale_offset + qi * p.o_scale_stride + (h * p.head_dim + d0) / O_PIECE] = ldexp(1.0, e);
            }
        }
    }
    // Kept for the next chunk: the state (every workgroup of the queries
    // has the same; the first writes it), and the output unnormalised.
    let keep = (p.carry & CARRY_KEEP) != 0u;
    for (var r = li; keep && wid.z == 0u && r < T; r += WG) {
        if (q0 + r < p.q_len) {
            state[state_at(q0 + r, h)] = row_max[r];
            state[state_at(q0 + r, h) + 1u] = row_sum[r];
        }
    }
    for (var i = li; !O_HALF && i < T * O_DIMS; i += WG) {
        let r = i / O_DIMS;
        let d = dz + i % O_DIMS;
        let qi = q0 + r;
        if (qi < p.q_len && d < p.head_dim) {
            let l = row_sum[r];
            o[p.o_offset + qi * p.o_stride + h * p.head_dim + d] = o_acc[i] * select(select(0.0, 1.0 / l, l > 0.0), 1.0, keep);
        }
    }
}
