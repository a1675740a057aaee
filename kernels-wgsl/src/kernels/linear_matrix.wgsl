// y[m, n] = Σ_k x[m, k] · W[n, k] (+ b[n]) on cooperative-matrix units: the
// matrix tier's linear, on matrix_blocks.wgsl's core with A = x and Bᵀ = W,
// one R·T × R·T block of y per workgroup. f16 operands are rounded under the
// range rule (matrix_blocks.wgsl); the sum is f32. Interface in linear_io.wgsl.

// The subgroup size: one subgroup owns a block, so a workgroup is one subgroup.
override WG: u32 = 8u;
// Set by the host when four consecutive terms are one aligned load: x's
// offset and stride, W's offset and k all multiples of 4, W in bf16. Then
// x and W are read through `x4` and `w4`, the same windows as `x` and `w`.
override VECTOR_RUNS: bool = false;

@group(0) @binding(5) var<storage, read_write> x4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> w4: array<vec2<u32>>;

// A = x: x[m0 + r, k0 + t .. + 4].
fn a_run(r: u32, t: u32, m0: u32, k0: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (m0 + r < p.m && k0 + t < p.k) {
        let e = p.x_offset + (m0 + r) * p.x_stride + k0 + t;
        if (VECTOR_RUNS) {
            v = x4[e / 4u];
        } else {
            for (var i = 0u; i < 4u; i++) {
                if (k0 + t + i < p.k) {
                    v[i] = x[e + i];
                }
            }
        }
    }
    return v;
}

// Bᵀ = W: W[n0 + c, k0 + t .. + 4].
fn b_run(c: u32, t: u32, n0: u32, k0: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (n0 + c < p.n && k0 + t < p.k) {
        let e = p.w_offset + (n0 + c) * p.k + k0 + t;
        if (VECTOR_RUNS) {
            let pair = w4[e / 4u];
            v = vec4<f32>(bf16_at(pair.x, 0u), bf16_at(pair.x, 1u), bf16_at(pair.y, 0u), bf16_at(pair.y, 1u));
        } else {
            for (var i = 0u; i < 4u; i++) {
                if (k0 + t + i < p.k) {
                    v[i] = weight_value(w[weight_word(e + i, WEIGHT_BF16)], e + i, WEIGHT_BF16);
                }
            }
        }
    }
    return v;
}

// y[r, c] = value (+ bias, + y's old value), inside the matrix only.
fn block_value_out(r: u32, c: u32, value: f32) {
    if (r < p.m && c < p.n) {
        var out = value;
        if (HAS_BIAS) {
            out += bias(p.b_offset + c);
        }
        let at = p.y_offset + r * p.y_stride + c;
        if (ACCUMULATE) {
            out += y[at];
        }
        y[at] = out;
    }
}

@compute @workgroup_size(WG)
fn linear_matrix(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let blocks_n = (p.n + BLOCK - 1u) / BLOCK;
    let block = flat_workgroup(wid, nwg);
    matrix_block(li, (block / blocks_n) * BLOCK, (block % blocks_n) * BLOCK, p.k);
}
