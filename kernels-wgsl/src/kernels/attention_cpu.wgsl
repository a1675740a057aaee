// Attention for CPU adapters (lavapipe, SwiftShader, WARP). Such a driver
// runs a workgroup's invocations side by side in SIMD lanes, and inside a
// loop it fetches each storage load lane by lane, whatever the address, so
// a vec4 load costs about what an f32 load does and the kernel is as fast as
// the FMAs each load feeds; barriers and idle invocations cost in full. So:
// each invocation owns four queries of one head (256 a workgroup), q, k and
// v are read as vec4s, every key and value vec4 serves all four queries, and
// there is no workgroup memory, no barrier and no lane-divergent branch
// before the final stores (queries past the last compute on the last one
// and write nothing).
//
// Per block of CPU_KEYS keys: the scores (q·k, one accumulator per key so
// that one read of q serves every key), the online softmax's new maximum,
// one rescale of the output, then the weighted values (one read of the
// output accumulator serves every key). Same interface, masks, causality,
// grouped-query heads as `attention.wgsl`; head_dim
// a multiple of 4, at most 4·CPU_MAX_VEC4.

// Invocations a workgroup, and queries a workgroup (four an invocation).
const CPU_INVOCATIONS: u32 = 64u;
const CPU_QUERIES: u32 = 256u;
const CPU_KEYS: u32 = 8u;
const CPU_MAX_VEC4: u32 = 32u;
// head_dim / 4, set by the host so the dim loops have a constant trip count.
override HEAD_VEC4: u32 = 32u;

// q again, as vec4s (k and v at bindings 8 and 9, read four at a time
// through key4_at/value4_at): the host takes this kernel only where
// head_dim, the offsets and the strides are multiples of 4, so that each
// load brings four values (inside a loop a CPU driver fetches each load lane
// by lane, so one vec4 load costs about what one f32 load does).
@group(0) @binding(7) var<storage, read_write> q4: array<vec4<f32>>;

// The online softmax's update of one query over a block of keys: its
// scores become weights against the new running maximum, `m` and `l` (the
// running sum) move on, and the factor its output row must be rescaled by
// is returned.
fn softmax_block(dots: ptr<function, array<f32, CPU_KEYS>>, m: ptr<function, f32>, l: ptr<function, f32>, qi: u32, k0: u32) -> f32 {
    var m_new = *m;
    for (var j = 0u; j < CPU_KEYS; j++) {
        (*dots)[j] = select(MASKED, (*dots)[j] * p.scale, visible(qi, k0 + j));
        m_new = max(m_new, (*dots)[j]);
    }
    let rescale = exp(*m - m_new);
    var sum = *l * rescale;
    for (var j = 0u; j < CPU_KEYS; j++) {
        (*dots)[j] = select(0.0, exp((*dots)[j] - m_new), (*dots)[j] > MASKED);
        sum += (*dots)[j];
    }
    *m = m_new;
    *l = sum;
    return rescale;
}

// The factor that normalises an output row whose weights sum to `l` (both entry points' rows end here).
fn finish_row(l: f32) -> f32 {
    return select(0.0, 1.0 / l, l > 0.0);
}

// Four values `c·4 ..` of query `qi`'s output row.
fn store_out(qi: u32, h: u32, c: u32, out: vec4<f32>) {
    let ob = p.o_offset + qi * p.o_stride + h * p.head_dim + c * 4u;
    for (var i = 0u; i < 4u; i++) {
        o[ob + i] = out[i];
    }
}

// Query `qi`'s output row, normalised.
fn write_row(acc: ptr<function, array<vec4<f32>, CPU_MAX_VEC4>>, l: f32, qi: u32, h: u32) {
    if (qi >= p.q_len) {
        return;
    }
    let inv = finish_row(l);
    for (var c = 0u; c < HEAD_VEC4; c++) {
        store_out(qi, h, c, (*acc)[c] * inv);
    }
}

// Each invocation owns four queries, CPU_INVOCATIONS apart, so every key
// and value vec4 it loads serves all four (four named sets of registers: an
// array indexed by query would live in memory, not registers).
@compute @workgroup_size(64)
fn attention_cpu(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.y;
    let kvh = h / (p.q_heads / p.kv_heads);
    let q0 = wid.x * CPU_QUERIES;
    let qi_a = q0 + lid.x;
    let qi_b = qi_a + CPU_INVOCATIONS;
    let qi_c = qi_b + CPU_INVOCATIONS;
    let qi_d = qi_c + CPU_INVOCATIONS;
    let qb_a = (p.q_offset + min(qi_a, p.q_len - 1u) * p.q_stride + h * p.head_dim) / 4u;
    let qb_b = (p.q_offset + min(qi_b, p.q_len - 1u) * p.q_stride + h * p.head_dim) / 4u;
    let qb_c = (p.q_offset + min(qi_c, p.q_len - 1u) * p.q_stride + h * p.head_dim) / 4u;
    let qb_d = (p.q_offset + min(qi_d, p.q_len - 1u) * p.q_stride + h * p.head_dim) / 4u;
    var qv_a: array<vec4<f32>, CPU_MAX_VEC4>;
    var qv_b: array<vec4<f32>, CPU_MAX_VEC4>;
    var qv_c: array<vec4<f32>, CPU_MAX_VEC4>;
    var qv_d: array<vec4<f32>, CPU_MAX_VEC4>;
    var acc_a: array<vec4<f32>, CPU_MAX_VEC4>;
    var acc_b: array<vec4<f32>, CPU_MAX_VEC4>;
    var acc_c: array<vec4<f32>, CPU_MAX_VEC4>;
    var acc_d: array<vec4<f32>, CPU_MAX_VEC4>;
    for (var c = 0u; c < HEAD_VEC4; c++) {
        qv_a[c] = q4[qb_a + c];
        qv_b[c] = q4[qb_b + c];
        qv_c[c] = q4[qb_c + c];
        qv_d[c] = q4[qb_d + c];
    }
    var m_a = MASKED;
    var m_b = MASKED;
    var m_c = MASKED;
    var m_d = MASKED;
    var l_a = 0.0;
    var l_b = 0.0;
    var l_c = 0.0;
    var l_d = 0.0;
    var k_end = p.kv_len;
    if (p.causal != 0u) {
        k_end = min(p.kv_len, q0 + CPU_QUERIES + p.q_position);
    }
    for (var k0 = 0u; k0 < k_end; k0 += CPU_KEYS) {
        // Row starts of this block's keys and values, clamped into the matrix.
        var kb: array<u32, CPU_KEYS>;
        var vb: array<u32, CPU_KEYS>;
        var ks: array<f32, CPU_KEYS>;
        var vs: array<f32, CPU_KEYS>;
        for (var j = 0u; j < CPU_KEYS; j++) {
            let kj = min(k0 + j, p.kv_len - 1u);
            kb[j] = (p.k_offset + kj * p.k_stride + kvh * p.head_dim) / 4u;
            vb[j] = (p.v_offset + kj * p.v_stride + kvh * p.head_dim) / 4u;
            ks[j] = key_scale(kj, kvh);
            vs[j] = value_scale(kj, kvh);
        }
        var dots_a: array<f32, CPU_KEYS>;
        var dots_b: array<f32, CPU_KEYS>;
        var dots_c: array<f32, CPU_KEYS>;
        var dots_d: array<f32, CPU_KEYS>;
        for (var c = 0u; c < HEAD_VEC4; c++) {
            let qa = qv_a[c];
            let qb = qv_b[c];
            let qc = qv_c[c];
            let qd = qv_d[c];
            for (var j = 0u; j < CPU_KEYS; j++) {
                let kc = key4_at(kb[j] + c);
                dots_a[j] = fma(qa.w, kc.w, fma(qa.z, kc.z, fma(qa.y, kc.y, fma(qa.x, kc.x, dots_a[j]))));
                dots_b[j] = fma(qb.w, kc.w, fma(qb.z, kc.z, fma(qb.y, kc.y, fma(qb.x, kc.x, dots_b[j]))));
                dots_c[j] = fma(qc.w, kc.w, fma(qc.z, kc.z, fma(qc.y, kc.y, fma(qc.x, kc.x, dots_c[j]))));
                dots_d[j] = fma(qd.w, kc.w, fma(qd.z, kc.z, fma(qd.y, kc.y, fma(qd.x, kc.x, dots_d[j]))));
            }
        }
        for (var j = 0u; j < CPU_KEYS; j++) {
            dots_a[j] *= ks[j];
            dots_b[j] *= ks[j];
            dots_c[j] *= ks[j];
            dots_d[j] *= ks[j];
        }
        let rescale_a = softmax_block(&dots_a, &m_a, &l_a, qi_a, k0);
        let rescale_b = softmax_block(&dots_b, &m_b, &l_b, qi_b, k0);
        let rescale_c = softmax_block(&dots_c, &m_c, &l_c, qi_c, k0);
        let rescale_d = softmax_block(&dots_d, &m_d, &l_d, qi_d, k0);
        for (var c = 0u; c < HEAD_VEC4; c++) {
            var a = acc_a[c] * rescale_a;
            var b = acc_b[c] * rescale_b;
            var e = acc_c[c] * rescale_c;
            var f = acc_d[c] * rescale_d;
            for (var j = 0u; j < CPU_KEYS; j++) {
                let vc = value4_at(vb[j] + c) * vs[j];
                a = fma(vec4<f32>(dots_a[j]), vc, a);
                b = fma(vec4<f32>(dots_b[j]), vc, b);
                e = fma(vec4<f32>(dots_c[j]), vc, e);
                f = fma(vec4<f32>(dots_d[j]), vc, f);
            }
            acc_a[c] = a;
            acc_b[c] = b;
            acc_c[c] = e;
            acc_d[c] = f;
        }
    }
    write_row(&acc_a, l_a, qi_a, h);
    write_row(&acc_b, l_b, qi_b, h);
    write_row(&acc_c, l_c, qi_c, h);
    write_row(&acc_d, l_d, qi_d, h);
}

// Heads wider than 4·CPU_MAX_VEC4 (the VAE's mid-block attention: one head
// of 512 channels): one query an invocation, 64 a workgroup, the same
// blocks of keys. Its own entry point because the registers a query holds
// are sized for the widest head: the narrow kernel above would pay for
// them on every head.
const CPU_WIDE_VEC4: u32 = 128u;
const CPU_WIDE_QUERIES: u32 = 64u;

// [`write_row`] for the wide kernel's row (WGSL cannot take either array size).
fn write_wide_row(acc: ptr<function, array<vec4<f32>, CPU_WIDE_VEC4>>, l: f32, qi: u32, h: u32) {
    if (qi >= p.q_len) {
        return;
    }
    let inv = finish_row(l);
    for (var c = 0u; c < HEAD_VEC4; c++) {
        store_out(qi, h, c, (*acc)[c] * inv);
    }
}

@compute @workgroup_size(64)
fn attention_cpu_wide(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.y;
    let kvh = h / (p.q_heads / p.kv_heads);
    let q0 = wid.x * CPU_WIDE_QUERIES;
    let qi = q0 + lid.x;
    let qb = (p.q_offset + min(qi, p.q_len - 1u) * p.q_stride + h * p.head_dim) / 4u;
    var qv: array<vec4<f32>, CPU_WIDE_VEC4>;
    var acc: array<vec4<f32>, CPU_WIDE_VEC4>;
    for (var c = 0u; c < HEAD_VEC4; c++) {
        qv[c] = q4[qb + c];
    }
    var m = MASKED;
    var l = 0.0;
    var k_end = p.kv_len;
    if (p.causal != 0u) {
        k_end = min(p.kv_len, q0 + CPU_WIDE_QUERIES + p.q_position);
    }
    for (var k0 = 0u; k0 < k_end; k0 += CPU_KEYS) {
        var kb: array<u32, CPU_KEYS>;
        var vb: array<u32, CPU_KEYS>;
        var ks: array<f32, CPU_KEYS>;
        var vs: array<f32, CPU_KEYS>;
        for (var j = 0u; j < CPU_KEYS; j++) {
            let kj = min(k0 + j, p.kv_len - 1u);
            kb[j] = (p.k_offset + kj * p.k_stride + kvh * p.head_dim) / 4u;
            vb[j] = (p.v_offset + kj * p.v_stride + kvh * p.head_dim) / 4u;
            ks[j] = key_scale(kj, kvh);
            vs[j] = value_scale(kj, kvh);
        }
        var dots: array<f32, CPU_KEYS>;
        for (var c = 0u; c < HEAD_VEC4; c++) {
            let q = qv[c];
            for (var j = 0u; j < CPU_KEYS; j++) {
                let kc = key4_at(kb[j] + c);
                dots[j] = fma(q.w, kc.w, fma(q.z, kc.z, fma(q.y, kc.y, fma(q.x, kc.x, dots[j]))));
            }
        }
        for (var j = 0u; j < CPU_KEYS; j++) {
            dots[j] *= ks[j];
        }
        let rescale = softmax_block(&dots, &m, &l, qi, k0);
        for (var c = 0u; c < HEAD_VEC4; c++) {
            var a = acc[c] * rescale;
            for (var j = 0u; j < CPU_KEYS; j++) {
                a = fma(vec4<f32>(dots[j]), value4_at(vb[j] + c) * vs[j], a);
            }
            acc[c] = a;
        }
    }
    write_wide_row(&acc, l, qi, h);
}
