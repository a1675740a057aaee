// The queries' and keys' per-head RMSNorm + interleaved RoPE in their
// projection's epilogue (matrix_gemm.wgsl's `head_norm()`: HEAD_NORM
// outputs a head, 0 where the product norms none), with its f16 pieces:
// outputs [0, p.head_first) of the product (counted from its first column,
// p.head_col0 of this call's) are normed by the weight at binding 16,
// outputs [p.head_first, p.head_cols) by the one at 17, and the rest (the
// values) go out as they are. Row r is rotated by its table row, p.m rows of
// HEAD_NORM f32 at bindings 18 (cos) and 19 (sin) from element
// p.table_offset. The values norm_half.wgsl's rms_norm_rope_half computes
// from the same sums (its sum of squares in another order), rounded to f16
// once, after the rotation.

override HEAD_NORM: u32 = 0u;
// HEAD_NORM as a divisor (a constant zero one is invalid even where unread).
override HEAD_NORM_DIVISOR: u32 = max(HEAD_NORM, 1u);
override NORM_W_BF16: bool = true;
@group(0) @binding(16) var<storage, read> norm_first_w: array<u32>;
@group(0) @binding(17) var<storage, read> norm_second_w: array<u32>;
@group(0) @binding(18) var<storage, read> rope_cos: array<f32>;
@group(0) @binding(19) var<storage, read> rope_sin: array<f32>;

fn head_norm() -> u32 {
    return HEAD_NORM;
}

fn head_norm_eps() -> f32 {
    return p.head_eps;
}

// Dim i of the norm weight of output column `col` of the product.
fn norm_weight(col: u32, i: u32) -> f32 {
    if (col < p.head_first) {
        let e = p.norm_first + i;
        return weight_value(norm_first_w[weight_word(e, NORM_W_BF16)], e, NORM_W_BF16);
    }
    let e = p.norm_second + i;
    return weight_value(norm_second_w[weight_word(e, NORM_W_BF16)], e, NORM_W_BF16);
}

// Outputs c … c + 3 of row r (c a multiple of 4: two interleaved pairs of
// one head) normed under their head's inverse RMS `inv` and rotated, each
// pair at the angle of its first dim, as rms_norm_rope_half computes them;
// the values' outputs and rows past the matrix as they are.
fn head_norm_quad(r: u32, c: u32, values: vec4<f32>, inv: f32) -> vec4<f32> {
    let col = p.head_col0 + c;
    if (r >= p.m || col >= p.head_cols) {
        return values;
    }
    let i = col % HEAD_NORM_DIVISOR;
    let a = vec4<f32>(norm_weight(col, i) * (values.x * inv), norm_weight(col, i + 1u) * (values.y * inv), norm_weight(col, i + 2u) * (values.z * inv), norm_weight(col, i + 3u) * (values.w * inv));
    let tab = p.table_offset + r * HEAD_NORM + i;
    let angles = vec4<f32>(rope_cos[tab], rope_sin[tab], rope_cos[tab + 2u], rope_sin[tab + 2u]);
    return vec4<f32>(a.x * angles.x - a.y * angles.y, a.y * angles.x + a.x * angles.y, a.z * angles.z - a.w * angles.w, a.w * angles.z + a.z * angles.w);
}
