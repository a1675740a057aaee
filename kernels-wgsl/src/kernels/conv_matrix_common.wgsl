// What matrix_gemm.wgsl asks alike of both convolution modules
// (conv_matrix.wgsl, conv_matrix_nhwc.wgsl): B = Wᵀ, W's rows [out channels,
// taps] with tap t at the module's `w_term(t)`, and their range scales; and
// the outputs: a convolution's block columns are all its own (the pairing
// is the linear's SwiGLU); each module says how they go out (f32 through
// its `block_quad_out`, or as f16 pieces).

// read_write as binding 5: W's scales may be measured into the same buffer.
@group(0) @binding(8) var<storage, read_write> w_scales: array<f32>;

// B = Wᵀ: W[n0 + c, tap k0 + t].
fn b_at(t: u32, c: u32, n0: u32, k0: u32) -> f32 {
    if (k0 + t < taps() && n0 + c < p.out_channels) {
        let e = p.w_offset + (n0 + c) * taps() + w_term(k0 + t);
        if (W_HALF) {
            // Packed under the column's scale: its value, the scale undone (exact).
            let pair = unpack2x16float(w[e >> 1u]);
            return select(pair.x, pair.y, (e & 1u) == 1u) * b_scale(n0 + c);
        }
        return weight_value(w[weight_word(e, WEIGHT_BF16)], e, WEIGHT_BF16);
    }
    return 0.0;
}

// W's rows start on even elements, the taps are even and each at its own
// term: B's columns load as bf16 pairs.
override B_PAIRED: bool = false;

// The u32 holding W[n0 + c, k0 + t] and W[n0 + c, k0 + t + 1] (t even; zero past W).
fn b_pair(c: u32, t: u32, n0: u32, k0: u32) -> u32 {
    let inside = k0 + t < taps() && n0 + c < p.out_channels;
    let word = w[select(p.w_offset, p.w_offset + (n0 + c) * taps() + k0 + t, inside) >> 1u];
    return select(0u, word, inside);
}

// The range rule's scale of W's row `col` (B's column; 1 for f32 operands).
fn b_scale(col: u32) -> f32 {
    if (!OPERAND_HALF || col >= p.out_channels) {
        return 1.0;
    }
    return w_scales[p.w_scales + col];
}

fn pairs_columns() -> bool {
    return false;
}

fn paired_value(gate_sum: f32, up_sum: f32) -> f32 {
    return 0.0;
}

// A convolution's outputs are no attention's scores.
fn softmax_pieces() -> bool {
    return false;
}

fn block_piece_sum_out(r: u32, c: u32, sum: f32) {
}

// A convolution norms no heads (the linear's queries and keys do).
fn head_norm() -> u32 {
    return 0u;
}

fn head_norm_eps() -> f32 {
    return 0.0;
}

fn head_norm_quad(r: u32, c: u32, values: vec4<f32>, inv: f32) -> vec4<f32> {
    return values;
}
