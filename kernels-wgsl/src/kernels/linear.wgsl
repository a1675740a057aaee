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
    if (col >= p.n || gk >= p.k) {
        return vec4<f32>(0.0);
    }
    return weight_run(p.w_offset + col * p.k + gk, min(4u, p.k - gk), W_PAIRED);
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

// CPU adapters' linear (f32 tier): llvmpipe and its kind run invocations
// side by side in SIMD lanes, so this kernel has no workgroup memory and no
// barriers. Each invocation owns one output column n (one row of W, read as
// runs of four bf16) and CPU_ROWS rows of x; the rows are the same for the
// whole workgroup, so x's loads (vec4s) are uniform across the lanes and
// each lane's one varying load of four weights serves 4·CPU_ROWS
// multiply-adds. The launcher takes it where x's rows and W's rows start on
// multiples of 4 elements and k is one (bindings 5 and 6 view x and W so).
const CPU_ROWS: u32 = 8u;
const CPU_COLS: u32 = 64u;

@group(0) @binding(5) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> w4: array<vec2<u32>>;

// Four bf16 weights from their two words.
fn bf16_run(pair: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(
        bitcast<f32>(pair.x << 16u),
        bitcast<f32>(pair.x & 0xffff0000u),
        bitcast<f32>(pair.y << 16u),
        bitcast<f32>(pair.y & 0xffff0000u),
    );
}

@compute @workgroup_size(64)
fn linear_cpu(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let col = wid.x * CPU_COLS + li;
    let row0 = wid.y * CPU_ROWS;
    // Columns and rows past the matrix read its last ones (the loads stay
    // inside) and store nothing.
    let c = min(col, p.n - 1u);
    let w_at = (p.w_offset + c * p.k) / 4u;
    let last = p.m - 1u;
    let x0 = (p.x_offset + min(row0, last) * p.x_stride) / 4u;
    let x1 = (p.x_offset + min(row0 + 1u, last) * p.x_stride) / 4u;
    let x2 = (p.x_offset + min(row0 + 2u, last) * p.x_stride) / 4u;
    let x3 = (p.x_offset + min(row0 + 3u, last) * p.x_stride) / 4u;
    let x4_ = (p.x_offset + min(row0 + 4u, last) * p.x_stride) / 4u;
    let x5 = (p.x_offset + min(row0 + 5u, last) * p.x_stride) / 4u;
    let x6 = (p.x_offset + min(row0 + 6u, last) * p.x_stride) / 4u;
    let x7 = (p.x_offset + min(row0 + 7u, last) * p.x_stride) / 4u;
    var lo = vec4<f32>(0.0);
    var hi = vec4<f32>(0.0);
    for (var t = 0u; t < p.k / 4u; t++) {
        let wv = bf16_run(w4[w_at + t]);
        lo += vec4<f32>(dot(x4[x0 + t], wv), dot(x4[x1 + t], wv), dot(x4[x2 + t], wv), dot(x4[x3 + t], wv));
        hi += vec4<f32>(dot(x4[x4_ + t], wv), dot(x4[x5 + t], wv), dot(x4[x6 + t], wv), dot(x4[x7 + t], wv));
    }
    if (col < p.n) {
        for (var r = 0u; r < 4u; r++) {
            if (row0 + r < p.m) {
                linear_out(row0 + r, col, lo[r]);
            }
            if (row0 + 4u + r < p.m) {
                linear_out(row0 + 4u + r, col, hi[r]);
            }
        }
    }
}
