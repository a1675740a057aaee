// y[m, n] = Σ_k x[m, k] · W[n, k] (+ b[n]) on cooperative-matrix units: the
// matrix tier's linear, on matrix_gemm.wgsl's core with A = x and B = Wᵀ,
// one BM × BN block of y per workgroup. f16 operands are rounded under the
// range rule with the row scales of x that range_scales.wgsl measured before
// this product (binding 5) and of W's rows (binding 8: measured when W reached
// the device, or by the same pre-pass); the sum is f32. Interface in
// linear_io.wgsl.

// Invocations per workgroup: SUBGROUPS subgroups of the adapter's size.
override WG: u32 = 32u;

@group(0) @binding(5) var<storage, read> scales: array<f32>;
@group(0) @binding(8) var<storage, read> w_scales: array<f32>;

// x on the half-precision data path (`X_HALF`): f16 pairs, each row already
// divided by its range scale, with the scales beside them, as the op before
// the product wrote them (norm_half.wgsl) at bindings 9 and 10; x's offset
// and stride then count f16 values. The values reach the tiles exactly as
// the f32 path rounds them (a value times its power-of-two scale, then times
// the inverse, is the f16 value again), without a pass measuring them.
override X_HALF: bool = false;
// f16 rows in pieces (`X_PIECE` > 0): a scale every X_PIECE values of a row,
// p.x_scales_stride scales from one row to the next, as producers that each
// hold part of a row write them (attention a head's, the SwiGLU epilogue a
// block's columns). The row's scale is the largest of its pieces' (all
// powers of two); a value times its piece's scale, times the inverse of the
// row's, is the f32 path's rounding wherever that is a normal f16 (below
// f16's normals, the two roundings may differ in the last subnormal bit).
override X_PIECE: u32 = 0u;
// X_PIECE as a divisor (a constant zero one is invalid even where unread).
override X_PIECE_DIVISOR: u32 = max(X_PIECE, 1u);
@group(0) @binding(9) var<storage, read_write> x_half: array<u32>;
@group(0) @binding(10) var<storage, read_write> x_half_scales: array<f32>;

// The f16 value at element e of x_half, widened (exactly) to f32.
fn x_half_at(e: u32) -> f32 {
    let pair = unpack2x16float(x_half[e >> 1u]);
    return select(pair.x, pair.y, (e & 1u) == 1u);
}

// A = x: x[m0 + r, k0 + t]. Past the matrix it reads x's first element and
// gives zero: a select, not a branch, so loads can be issued together.
fn a_at(r: u32, t: u32, m0: u32, k0: u32) -> f32 {
    let inside = m0 + r < p.m && k0 + t < p.k;
    let at = select(p.x_offset, p.x_offset + (m0 + r) * p.x_stride + k0 + t, inside);
    if (X_HALF) {
        return select(0.0, x_half_at(at) * x_half_scale(m0 + r, k0 + t), inside);
    }
    return select(0.0, x[at], inside);
}

// Element i of a k step's A: (row, term), terms fastest (x's rows are contiguous).
fn a_element(i: u32) -> vec2<u32> {
    return vec2<u32>(i / KT, i % KT);
}

// x's rows in stacks of p.stack_rows (`W_STACKED`), p.stack_group stacks
// on each W: the rows of stack s read W's rows w·n … w·n + n − 1 (and
// their scales), w = (s + p.stack_skew) / p.stack_group, as rows of one W
// the call binds. The attention on products stacks its heads so: every
// head's `P·V` in one dispatch, grouped heads on their shared values. A
// stack is whole blocks, so a workgroup's rows are one stack's.
override W_STACKED: bool = false;
var<private> w_stack_row: u32;

// W's row holding the kernel's column `col` of this workgroup's stack.
fn w_row(col: u32) -> u32 {
    if (!W_STACKED) {
        return paired_w_row(col, BN);
    }
    return paired_w_row(col, BN) + w_stack_row;
}

// B = Wᵀ: W[n0 + c, k0 + t].
fn b_at(t: u32, c: u32, n0: u32, k0: u32) -> f32 {
    if (k0 + t < p.k && column_inside(n0 + c, BN)) {
        let e = p.w_offset + w_row(n0 + c) * p.k + k0 + t;
        if (W_HALF) {
            // Packed under the column's scale: its value, the scale undone (exact).
            let pair = unpack2x16float(w[e >> 1u]);
            return select(pair.x, pair.y, (e & 1u) == 1u) * b_scale(n0 + c);
        }
        return weight_value(w[weight_word(e, WEIGHT_BF16)], e, WEIGHT_BF16);
    }
    return 0.0;
}

// W's rows start on even elements and k is even: B's columns load as bf16 pairs.
override B_PAIRED: bool = false;

// The u32 holding W[n0 + c, k0 + t] and W[n0 + c, k0 + t + 1] (t even; zero past W).
fn b_pair(c: u32, t: u32, n0: u32, k0: u32) -> u32 {
    let inside = k0 + t < p.k && column_inside(n0 + c, BN);
    let word = w[select(p.w_offset, p.w_offset + w_row(n0 + c) * p.k + k0 + t, inside) >> 1u];
    return select(0u, word, inside);
}

// The range rule's scale of x's row (1 past the matrix, or for f32 operands):
// in pieces, the largest of the row's pieces' scales.
fn a_scale(row: u32) -> f32 {
    if (!OPERAND_HALF || row >= p.m) {
        return 1.0;
    }
    if (X_HALF && X_PIECE > 0u) {
        var largest = 0.0;
        for (var piece = 0u; piece < (p.k + X_PIECE - 1u) / X_PIECE_DIVISOR; piece++) {
            largest = max(largest, x_half_scales[p.x_scales + row * p.x_scales_stride + piece]);
        }
        return largest;
    }
    if (X_HALF) {
        return x_half_scales[p.x_scales + row];
    }
    return scales[p.x_scales + row];
}

// The scale f16 value t of x's row was written under: its piece's, or the
// row's (1 past the matrix).
fn x_half_scale(row: u32, t: u32) -> f32 {
    if (X_PIECE == 0u || row >= p.m) {
        return a_scale(row);
    }
    return x_half_scales[p.x_scales + row * p.x_scales_stride + t / X_PIECE_DIVISOR];
}

// The range rule's scale of W's row `col` (B's column).
fn b_scale(col: u32) -> f32 {
    if (!OPERAND_HALF || !column_inside(col, BN)) {
        return 1.0;
    }
    return w_scales[p.w_scales + w_row(col)];
}

// SWIGLU: a block's two subgroup columns hold the gate's and the up's sums
// of the same outputs (matrix_gemm.wgsl's tile_out pairs them).
fn pairs_columns() -> bool {
    return SWIGLU;
}

// silu(gate)·up: the element-wise SwiGLU's arithmetic on the sums it
// would have read back (linear_io.wgsl's swiglu_out).
fn paired_value(gate_sum: f32, up_sum: f32) -> f32 {
    return silu(gate_sum) * up_sum;
}

// y's rows as vec4s (`Y_VEC4`: y's offset and row stride whole vec4s, of
// f32 values or, with Y_HALF, of f16 ones), at bindings 14 (f32) and 15
// (f16, two words a vector), the same buffers as bindings 4 and 12: four
// neighbouring outputs of a row go out in one store.
override Y_VEC4: bool = false;
@group(0) @binding(14) var<storage, read_write> y_vec4: array<vec4<f32>>;
@group(0) @binding(15) var<storage, read_write> y_half_quads: array<vec2<u32>>;

// y[r, c … c + 3] = values (+ bias, + y's old value, or gated onto it:
// linear_out's arithmetic, each output's the same), inside the matrix only;
// a SwiGLU product's outputs have none of them.
fn block_quad_out(r: u32, c: u32, values: vec4<f32>) {
    if (r >= p.m) {
        return;
    }
    if (!Y_VEC4 || c + 3u >= p.n) {
        for (var j = 0u; j < 4u; j++) {
            if (c + j < p.n) {
                linear_out(r, c + j, values[j]);
            }
        }
        return;
    }
    var out = values;
    if (HAS_BIAS) {
        let at = p.b_offset + c;
        out += vec4<f32>(bias(at), bias(at + 1u), bias(at + 2u), bias(at + 3u));
    }
    let at = (p.y_offset + r * p.y_stride + c) / 4u;
    if (GATED) {
        let g = p.gate_offset + c;
        y_vec4[at] = fma(vec4<f32>(gate[g], gate[g + 1u], gate[g + 2u], gate[g + 3u]), out, y_vec4[at]);
        return;
    }
    if (ROW_SCALED) {
        y_vec4[at] = fma(vec4<f32>(gate[p.gate_offset + r]), y_vec4[at], out);
        return;
    }
    if (ACCUMULATE) {
        out += y_vec4[at];
    }
    y_vec4[at] = out;
}

// The outputs (SwiGLU's or the products themselves, without bias) as the
// next op's f16 operand (`Y_HALF`): f16 pairs at binding 12 (y's offset and
// stride counting f16 values, both even), each row in pieces of Y_PIECE
// outputs (whole pieces in a block's outputs) under their own range scales,
// the scales at binding 13 from p.y_scales, p.y_scales_stride from one row
// to the next (matrix_gemm.wgsl's `pieces_out`).
override Y_HALF: bool = false;
override Y_PIECE: u32 = 64u;
@group(0) @binding(12) var<storage, read_write> y_half: array<u32>;
@group(0) @binding(13) var<storage, read_write> y_half_scales: array<f32>;

fn pieces_out() -> bool {
    return Y_HALF;
}

// Outputs c … c + 3 of row r as two words (each two f16 values), inside
// the matrix only (n even): one store where y's rows are whole vec4s.
fn block_half_quad_out(r: u32, c: u32, words: vec2<u32>) {
    if (r >= p.m || c >= p.n) {
        return;
    }
    let at = p.y_offset + r * p.y_stride + c;
    if (Y_VEC4 && c + 3u < p.n) {
        y_half_quads[at / 4u] = words;
        return;
    }
    y_half[at / 2u] = words.x;
    if (c + 2u < p.n) {
        y_half[at / 2u + 1u] = words.y;
    }
}

fn out_piece() -> u32 {
    return Y_PIECE;
}

// The products go out as they are (no bias: matrix_gemm.wgsl's
// `piece_value`); with SOFTMAX, as the base-2 exponents of the scores'
// probabilities.
fn piece_value(r: u32, c: u32, value: f32) -> f32 {
    if (SOFTMAX) {
        return score_exponent(r, c, value);
    }
    return value;
}

// SOFTMAX (with Y_HALF, in pieces of 64): the products are a chunk of an
// attention's scores, q·k for query p.q_first + r and key p.k_first + c,
// and go out as f16 probabilities, each piece under its own exponent with
// its sum beside (matrix_gemm.wgsl's `tile_softmax_out`; the sums at
// binding 11 from p.gate_offset, laid out as the exponents). With CAUSAL a
// query sees only keys up to its own; with KEY_MASK only keys whose u32 in
// the key mask (binding 5, from p.keep_offset) is not 0.
override SOFTMAX: bool = false;
override CAUSAL: bool = false;
override KEY_MASK: bool = false;

fn softmax_pieces() -> bool {
    return SOFTMAX;
}

// A score's base-2 exponent, or −∞ where its key is hidden from its query
// or it lies past the matrix.
fn score_exponent(r: u32, c: u32, score: f32) -> f32 {
    let key = p.k_first + c;
    var hidden = r >= p.m || c >= p.n || (CAUSAL && key > p.q_first + r);
    if (KEY_MASK && !hidden) {
        hidden = bitcast<u32>(scales[p.keep_offset + key]) == 0u;
    }
    return select(score * p.softmax_scale, bitcast<f32>(0xff800000u), hidden);
}

fn block_piece_sum_out(r: u32, c: u32, sum: f32) {
    if (r < p.m && c < p.n) {
        gate[p.gate_offset + r * p.y_scales_stride + c / Y_PIECE] = sum;
    }
}

// The scale of the piece from output c of row r, inside the matrix only.
fn block_piece_scale_out(r: u32, c: u32, scale: f32) {
    if (r < p.m && c < p.n) {
        y_half_scales[p.y_scales + r * p.y_scales_stride + c / Y_PIECE] = scale;
    }
}

@compute @workgroup_size(WG)
fn linear_matrix(
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) lanes: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    // With SWIGLU the blocks span each output twice (its gate and up rows).
    let n = select(p.n, 2u * p.n, SWIGLU);
    let block = flat_workgroup(wid, nwg);
    if (W_STACKED) {
        // The stack of the block's first row (a block past the matrix takes the last row's).
        let row = p.row_base + min((block / ((n + BN - 1u) / BN)) * BM, p.m - 1u);
        w_stack_row = ((row / p.stack_rows + p.stack_skew) / p.stack_group) * p.n;
    }
    matrix_gemm_block(li, sg, lane, lanes, block, n, p.k);
}
