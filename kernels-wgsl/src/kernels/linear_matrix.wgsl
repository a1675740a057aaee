// y[m, n] = Σ_k x[m, k] · W[n, k] (+ b[n]) on cooperative-matrix units: the
// matrix tier's linear, on matrix_blocks.wgsl's core with A = x and B = Wᵀ,
// one R·T × R·T block of y per workgroup. f16 operands are rounded under the
// range rule (matrix_blocks.wgsl); the sum is f32. Interface in linear_io.wgsl.

// The subgroup size: one subgroup owns a block, so a workgroup is one subgroup.
override WG: u32 = 8u;

// A = x: x[m0 + r, k0 + t].
fn a_at(r: u32, t: u32, m0: u32, k0: u32) -> f32 {
    if (m0 + r < p.m && k0 + t < p.k) {
        return x[p.x_offset + (m0 + r) * p.x_stride + k0 + t];
    }
    return 0.0;
}

// B = Wᵀ: W[n0 + c, k0 + t].
fn b_at(t: u32, c: u32, n0: u32, k0: u32) -> f32 {
    if (k0 + t < p.k && n0 + c < p.n) {
        let e = p.w_offset + (n0 + c) * p.k + k0 + t;
        return weight_value(w[weight_word(e, WEIGHT_BF16)], e, WEIGHT_BF16);
    }
    return 0.0;
}

// y[r, c] = value (+ bias, + y's old value), inside the matrix only.
fn block_value_out(r: u32, c: u32, value: f32) {
    if (r < p.m && c < p.n) {
        linear_out(r, c, value);
    }
}

@compute @workgroup_size(WG)
fn linear_matrix(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let blocks_n = (p.n + BLOCK - 1u) / BLOCK;
    let block = flat_workgroup(wid, nwg);
    matrix_block(li, (block / blocks_n) * BLOCK, (block % blocks_n) * BLOCK, p.k);
}
