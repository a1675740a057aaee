// softmax(q·kᵀ·scale + mask)·v over [len, heads, head_dim] views, tiled with
// an online softmax: scores live only for one BQ×BK tile in workgroup memory,
// never as a full matrix. One workgroup handles BQ queries of one head.
// Scores: the query and key tiles pass through workgroup memory 64 dims at a
// time as vec4s (rows padded by one vec4 against bank conflicts), each
// invocation accumulating 4 of the BQ×BK dot products, four dims per read,
// so every key element read from memory serves BQ queries. Weighted sum: each invocation owns output dims
// t, t+64, … (SLOTS of them, head_dim ≤ 512) for all BQ rows.
// Grouped-query heads: query head h reads kv head h / (q_heads / kv_heads).
// Causal: local query i sits at position q_position + i (so queries can be
// split into windows) and sees keys 0..=that position. Carried (p.carry), a
// call continues the online softmax of an earlier call over the keys before
// its own (CARRY_FROM: each row's running max and sum from
// state[state_offset + 2(row·q_heads + head) ..], its unnormalised output
// from o) and/or leaves its own for the next (CARRY_KEEP: written there
// instead of the normalised output): split at multiples of BK, the calls
// run the very arithmetic of one call over all the keys. Interface in
// attention_io.wgsl; keys and values read through attention_kv_f32.wgsl or
// attention_kv_half.wgsl (their range scales applied to the scores and to
// the value rows).

// Output dims per invocation: ⌈head_dim / 64⌉, set by the host so the slot
// loops have a constant trip count.
override SLOTS: u32 = 8u;

const BQ: u32 = 16u;
const BK: u32 = 16u;
const THREADS: u32 = 64u;
// Dims of q and k staged per pass, and the padded row length in vec4s.
const DC: u32 = 64u;
const ROW: u32 = 17u;

var<workgroup> q_tile: array<vec4<f32>, 272>; // [BQ][ROW]
var<workgroup> k_tile: array<vec4<f32>, 272>; // [BK][ROW]
var<workgroup> scores: array<f32, 256>; // [BQ][BK], then the tile's probabilities
var<workgroup> row_max: array<f32, 16>;
var<workgroup> row_sum: array<f32, 16>;
var<workgroup> row_rescale: array<f32, 16>;

const CARRY_FROM: u32 = 1u;
const CARRY_KEEP: u32 = 2u;

// Where query row qi's carried (max, sum) of head h lie.
fn state_at(qi: u32, h: u32) -> u32 {
    return p.state_offset + 2u * (qi * p.q_heads + h);
}

@compute @workgroup_size(64)
fn attention(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = lid.x;
    let h = wid.y;
    let kvh = h / (p.q_heads / p.kv_heads);
    let q0 = wid.x * BQ;
    // This invocation's scores: key t % BK of rows t / BK + 4i.
    let my_key = t % BK;
    let my_row = t / BK;
    var acc: array<array<f32, 8>, 16>; // [row][slot]
    if (t < BQ) {
        row_max[t] = MASKED;
        row_sum[t] = 0.0;
        if ((p.carry & CARRY_FROM) != 0u && q0 + t < p.q_len) {
            row_max[t] = state[state_at(q0 + t, h)];
            row_sum[t] = state[state_at(q0 + t, h) + 1u];
        }
    }
    if ((p.carry & CARRY_FROM) != 0u) {
        for (var r = 0u; r < BQ; r++) {
            if (q0 + r < p.q_len) {
                let ob = p.o_offset + (q0 + r) * p.o_stride + h * p.head_dim;
                for (var sl = 0u; sl < SLOTS; sl++) {
                    let c = t + sl * THREADS;
                    if (c < p.head_dim) {
                        acc[r][sl] = o[ob + c];
                    }
                }
            }
        }
    }
    var k_end = p.kv_len;
    if (p.causal != 0u) {
        k_end = min(p.kv_len, q0 + BQ + p.q_position);
    }
    workgroupBarrier();
    for (var k0 = 0u; k0 < k_end; k0 += BK) {
        var dots = vec4<f32>(0.0);
        for (var d0 = 0u; d0 < p.head_dim; d0 += DC) {
            // Each invocation stages 4 runs of 4 dims of q and of k.
            for (var e = t; e < BQ * DC / 4u; e += THREADS) {
                let r = e / (DC / 4u);
                let c = (e % (DC / 4u)) * 4u;
                var qv = vec4<f32>(0.0);
                var kv = vec4<f32>(0.0);
                let qb = p.q_offset + (q0 + r) * p.q_stride + h * p.head_dim + d0 + c;
                let kb = p.k_offset + (k0 + r) * p.k_stride + kvh * p.head_dim + d0 + c;
                for (var i = 0u; i < 4u; i++) {
                    if (d0 + c + i < p.head_dim) {
                        if (q0 + r < p.q_len) {
                            qv[i] = q[qb + i];
                        }
                        if (k0 + r < p.kv_len) {
                            kv[i] = key_at(kb + i);
                        }
                    }
                }
                q_tile[r * ROW + c / 4u] = qv;
                k_tile[r * ROW + c / 4u] = kv;
            }
            workgroupBarrier();
            // Past head_dim the staged values are zero: whole vec4s are summed.
            let c_end = (min(DC, p.head_dim - d0) + 3u) / 4u;
            for (var c = 0u; c < c_end; c++) {
                let kv = k_tile[my_key * ROW + c];
                for (var i = 0u; i < 4u; i++) {
                    let qv = q_tile[(my_row + 4u * i) * ROW + c];
                    dots[i] = fma(qv.w, kv.w, fma(qv.z, kv.z, fma(qv.y, kv.y, fma(qv.x, kv.x, dots[i]))));
                }
            }
            workgroupBarrier();
        }
        for (var i = 0u; i < 4u; i++) {
            let r = my_row + 4u * i;
            var s = MASKED;
            if (visible(q0 + r, k0 + my_key)) {
                s = dots[i] * p.scale * key_scale(k0 + my_key, kvh);
            }
            scores[r * BK + my_key] = s;
        }
        workgroupBarrier();
        if (t < BQ) {
            let m_old = row_max[t];
            var m_new = m_old;
            for (var j = 0u; j < BK; j++) {
                m_new = max(m_new, scores[t * BK + j]);
            }
            var tile_sum = 0.0;
            for (var j = 0u; j < BK; j++) {
                let s = scores[t * BK + j];
                var pr = 0.0;
                if (s > MASKED) {
                    pr = exp(s - m_new);
                }
                scores[t * BK + j] = pr;
                tile_sum += pr;
            }
            let rescale = exp(m_old - m_new);
            row_rescale[t] = rescale;
            row_sum[t] = row_sum[t] * rescale + tile_sum;
            row_max[t] = m_new;
        }
        workgroupBarrier();
        for (var r = 0u; r < BQ; r++) {
            let a = row_rescale[r];
            for (var sl = 0u; sl < SLOTS; sl++) {
                acc[r][sl] *= a;
            }
        }
        let j_end = min(BK, p.kv_len - k0);
        for (var j = 0u; j < j_end; j++) {
            let vb = p.v_offset + (k0 + j) * p.v_stride + kvh * p.head_dim;
            let vs = value_scale(k0 + j, kvh);
            for (var sl = 0u; sl < SLOTS; sl++) {
                let c = t + sl * THREADS;
                if (c < p.head_dim) {
                    let vv = value_at(vb + c) * vs;
                    for (var r = 0u; r < BQ; r++) {
                        acc[r][sl] = fma(scores[r * BK + j], vv, acc[r][sl]);
                    }
                }
            }
        }
        workgroupBarrier();
    }
    for (var r = 0u; r < BQ; r++) {
        let qi = q0 + r;
        if (qi < p.q_len) {
            let l = row_sum[r];
            var inv = select(0.0, 1.0 / l, l > 0.0);
            if ((p.carry & CARRY_KEEP) != 0u) {
                if (t == 0u) {
                    state[state_at(qi, h)] = row_max[r];
                    state[state_at(qi, h) + 1u] = l;
                }
                inv = 1.0;
            }
            let ob = p.o_offset + qi * p.o_stride + h * p.head_dim;
            for (var sl = 0u; sl < SLOTS; sl++) {
                let c = t + sl * THREADS;
                if (c < p.head_dim) {
                    o[ob + c] = acc[r][sl] * inv;
                }
            }
        }
    }
}
