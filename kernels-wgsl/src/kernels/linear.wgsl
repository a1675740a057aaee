// y[m, n] = Σ_k x[m, k] · W[n, k] (+ b[n]) on the f32 tier (interface in
// linear_io.wgsl). The tiling is gemm_tiles.wgsl's with a = x and b = W; bf16 weights come as
// two u32 words when the host says the window's rows start on even elements
// (W_PAIRED).

// Set when w_offset and k are both even: every 4-element run starting at an
// even k is two whole u32 words.
override W_PAIRED: bool = false;

// x[row, gk .. gk + 4), zero past the matrix.
fn load_a(row: u32, gk: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (row < p.m) {
        let base = p.x_offset + row * p.x_stride + gk;
        for (var i = 0u; i < 4u; i++) {
            if (gk + i < p.k) {
                v[i] = x[base + i];
            }
        }
    }
    return v;
}

// W[col, gk .. gk + 4), zero past the matrix.
fn load_b(col: u32, gk: u32) -> vec4<f32> {
    if (!column_inside(col, TN) || gk >= p.k) {
        return vec4<f32>(0.0);
    }
    return weight_run(p.w_offset + paired_w_row(col, TN) * p.k + gk, min(4u, p.k - gk), W_PAIRED);
}

@compute @workgroup_size(16, 16)
fn linear(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.y * TM;
    let col0 = wid.x * TN;
    let acc = gemm_tile(lid, row0, col0, p.k);
    for (var i = 0u; i < 8u; i++) {
        let r = tile_row(lid, row0, i);
        if (r >= p.m) {
            continue;
        }
        if (SWIGLU) {
            // Column halves h = 0 and 1 are the gate's and the up's sums of the same outputs.
            for (var j = 0u; j < 4u; j++) {
                let c = paired_out(tile_col(lid, col0, 0u, j), TN);
                if (c < p.n) {
                    swiglu_out(r, c, tile_value(acc, lid, i, 0u, j), tile_value(acc, lid, i, 1u, j));
                }
            }
            continue;
        }
        for (var h = 0u; h < 2u; h++) {
            for (var j = 0u; j < 4u; j++) {
                let c = tile_col(lid, col0, h, j);
                if (c < p.n) {
                    linear_out(r, c, tile_value(acc, lid, i, h, j));
                }
            }
        }
    }
}
