// Attention for CPU adapters (lavapipe, SwiftShader, WARP). Such a driver
// runs a workgroup's invocations side by side in SIMD lanes, so this kernel
// gives every lane the same memory traffic and none of the barriers: each
// invocation owns one query of one head, the workgroup's 64 queries share
// that head, and the keys and values are walked in the same order by every
// lane, so each key and value load is one address for all lanes (a scalar
// load and a broadcast) instead of a gather. No workgroup memory, no
// barrier, and no lane-divergent branch before the final store: lanes past
// the last query compute on the last query and write nothing.
//
// Per block of CPU_KEYS keys: the scores (q·k, one accumulator per key so
// that one read of q serves every key), the online softmax's new maximum,
// one rescale of the output, then the weighted values (one read of the
// output accumulator serves every key). Same interface, masks, causality,
// grouped-query heads and log-sum-exp output as `attention.wgsl`; head_dim
// a multiple of 4, at most 4·CPU_MAX_VEC4.

const CPU_QUERIES: u32 = 64u;
const CPU_KEYS: u32 = 8u;
const CPU_MAX_VEC4: u32 = 32u;
// head_dim / 4, set by the host so the dim loops have a constant trip count.
override HEAD_VEC4: u32 = 32u;

// q, k and v again, as vec4s: the host takes this kernel only where
// head_dim, the offsets and the strides are multiples of 4, so that each
// load brings four values (inside a loop a CPU driver fetches each load lane
// by lane, so one vec4 load costs about what one f32 load does).
@group(0) @binding(7) var<storage, read_write> q4: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> k4: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> v4: array<vec4<f32>>;

// `visible` without short-circuits (each `&&` would be a branch per lane).
// The mask word is read at a clamped index: the same key for every lane.
fn sees(qi: u32, kj: u32) -> bool {
    let in_range = (qi < p.q_len) & (kj < p.kv_len);
    let causal_ok = (p.causal == 0u) | (kj <= qi + p.q_position);
    var kept = true;
    if (p.use_mask != 0u) {
        kept = key_keep[p.mask_offset + min(kj, p.kv_len - 1u)] != 0u;
    }
    return in_range & causal_ok & kept;
}

@compute @workgroup_size(64)
fn attention_cpu(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.y;
    let kvh = h / (p.q_heads / p.kv_heads);
    let q0 = wid.x * CPU_QUERIES;
    let qi = q0 + lid.x;
    let qb = (p.q_offset + min(qi, p.q_len - 1u) * p.q_stride + h * p.head_dim) / 4u;
    var qv: array<vec4<f32>, CPU_MAX_VEC4>;
    var acc: array<vec4<f32>, CPU_MAX_VEC4>;
    for (var c = 0u; c < HEAD_VEC4; c++) {
        qv[c] = q4[qb + c];
        acc[c] = vec4<f32>(0.0);
    }
    var m = MASKED;
    var l = 0.0;
    var k_end = p.kv_len;
    if (p.causal != 0u) {
        k_end = min(p.kv_len, q0 + CPU_QUERIES + p.q_position);
    }
    for (var k0 = 0u; k0 < k_end; k0 += CPU_KEYS) {
        // Row starts of this block's keys and values, clamped into the matrix.
        var kb: array<u32, CPU_KEYS>;
        var vb: array<u32, CPU_KEYS>;
        for (var j = 0u; j < CPU_KEYS; j++) {
            let kj = min(k0 + j, p.kv_len - 1u);
            kb[j] = (p.k_offset + kj * p.k_stride + kvh * p.head_dim) / 4u;
            vb[j] = (p.v_offset + kj * p.v_stride + kvh * p.head_dim) / 4u;
        }
        var dots: array<f32, CPU_KEYS>;
        for (var c = 0u; c < HEAD_VEC4; c++) {
            let qc = qv[c];
            for (var j = 0u; j < CPU_KEYS; j++) {
                let kc = k4[kb[j] + c];
                dots[j] = fma(qc.w, kc.w, fma(qc.z, kc.z, fma(qc.y, kc.y, fma(qc.x, kc.x, dots[j]))));
            }
        }
        var m_new = m;
        for (var j = 0u; j < CPU_KEYS; j++) {
            dots[j] = select(MASKED, dots[j] * p.scale, sees(qi, k0 + j));
            m_new = max(m_new, dots[j]);
        }
        let rescale = exp(m - m_new);
        l *= rescale;
        for (var j = 0u; j < CPU_KEYS; j++) {
            dots[j] = select(0.0, exp(dots[j] - m_new), dots[j] > MASKED);
            l += dots[j];
        }
        for (var c = 0u; c < HEAD_VEC4; c++) {
            var a = acc[c] * rescale;
            for (var j = 0u; j < CPU_KEYS; j++) {
                a = fma(vec4<f32>(dots[j]), v4[vb[j] + c], a);
            }
            acc[c] = a;
        }
        m = m_new;
    }
    if (qi < p.q_len) {
        let inv = select(0.0, 1.0 / l, l > 0.0);
        if (p.write_lse != 0u) {
            lse[p.lse_offset + qi * p.q_heads + h] = m + log(l);
        }
        let ob = p.o_offset + qi * p.o_stride + h * p.head_dim;
        for (var c = 0u; c < HEAD_VEC4; c++) {
            let out = acc[c] * inv;
            for (var i = 0u; i < 4u; i++) {
                o[ob + c * 4u + i] = out[i];
            }
        }
    }
}
