// The linear family's interface, shared by `linear.wgsl` (f32 and f16
// tiers) and `linear_matrix.wgsl` (matrix tier): the parameter block
// (LinearParams on the host); the bindings and the bias are
// `product_io.wgsl`'s. Offsets and strides let one call read or write a
// window of a larger tensor.

override HAS_BIAS: bool = false;
// y += x·Wᵀ instead of y = x·Wᵀ: the output's old value joins the sum last
// (a LoRA adapter's up product onto the base linear's output).
override ACCUMULATE: bool = false;
// y += gate ⊙ (x·Wᵀ + b) instead (`GATED`): the gated residual in the
// product's epilogue, y the residual stream, the gate one row at binding 11;
// the same fma as elementwise.wgsl's gated_residual over the stored product.
override GATED: bool = false;
// y = factor[r]·y + x·Wᵀ instead (`ROW_SCALED`): the old output rescaled by
// a factor a row (binding 11 from p.gate_offset) as the product joins it,
// one fma: the chunked attention's P·V onto its output so far, each row
// rescaled by its softmax's factor.
override ROW_SCALED: bool = false;
// y = silu(x·W_gateᵀ) ⊙ (x·W_upᵀ) instead (`SWIGLU`): the feed-forward's
// gate in the product's epilogue. W's rows p.up_row apart are one output's
// gate and up rows; the kernel's columns come in blocks whose first half are
// gate rows and second half the up rows of the same outputs, so one
// invocation (or one workgroup) holds both sums of an output
// (`paired_out`, `paired_w_row`); p.n counts outputs. No bias, no gate.
override SWIGLU: bool = false;

struct Params {
    m: u32, n: u32, k: u32,
    x_offset: u32, x_stride: u32,
    w_offset: u32, b_offset: u32,
    y_offset: u32, y_stride: u32,
    // The matrix tier's: where x's and W's row scales start in its scales.
    x_scales: u32, w_scales: u32,
    // GATED's: where the gate's first column is (ROW_SCALED's: the first row's factor).
    gate_offset: u32,
    // SWIGLU's: W's rows from an output's gate row to its up row.
    up_row: u32,
    // X_PIECE's: x's scales from one row to the next.
    x_scales_stride: u32,
    // Y_HALF's: where y's piece scales start, and from one row to the next.
    y_scales: u32, y_scales_stride: u32,
    // HEAD_NORM's (linear_head_norm.wgsl): this call's first output column
    // of the product, the columns the first and both norm weights norm,
    // where each weight starts, the RoPE tables' first element, and ε.
    head_col0: u32, head_first: u32, head_cols: u32,
    norm_first: u32, norm_second: u32,
    table_offset: u32, head_eps: f32,
    // W_STACKED's (linear_matrix.wgsl): x's rows in stacks of this many,
    // the first row of this call's in the whole product, the stacks that
    // share one W and the first stack's place among them.
    stack_rows: u32, row_base: u32,
    stack_group: u32, stack_skew: u32,
    // SOFTMAX's (linear_matrix.wgsl): the factor from a score to its
    // base-2 exponent (the attention's 1/√d times log₂ e), the query of
    // this call's row 0 and the key of its column 0, and where the key
    // mask starts.
    softmax_scale: f32, q_first: u32, k_first: u32, keep_offset: u32, _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(11) var<storage, read_write> gate: array<f32>;

// y[r, c] = value (+ b[c]) (+ y's old value): one output of the product,
// as every tier's linear writes it.
fn linear_out(r: u32, c: u32, value: f32) {
    var out = value;
    if (HAS_BIAS) {
        out += bias(p.b_offset + c);
    }
    let at = p.y_offset + r * p.y_stride + c;
    if (GATED) {
        y[at] = fma(gate[p.gate_offset + c], out, y[at]);
        return;
    }
    if (ROW_SCALED) {
        y[at] = fma(gate[p.gate_offset + r], y[at], out);
        return;
    }
    if (ACCUMULATE) {
        out += y[at];
    }
    y[at] = out;
}

// With SWIGLU, the output of the kernel's column `col` in blocks of
// `block` columns (the first half gate sums, the second half up sums).
fn paired_out(col: u32, block: u32) -> u32 {
    return (col / block) * (block / 2u) + col % (block / 2u);
}

// The row of W behind the kernel's column `col` (in blocks of `block`).
fn paired_w_row(col: u32, block: u32) -> u32 {
    if (!SWIGLU) {
        return col;
    }
    return paired_out(col, block) + select(0u, p.up_row, col % block >= block / 2u);
}

// Whether the kernel's column `col` (in blocks of `block`) is an output's.
fn column_inside(col: u32, block: u32) -> bool {
    if (!SWIGLU) {
        return col < p.n;
    }
    return paired_out(col, block) < p.n;
}

// paired_w_row of the column clamped into the matrix (the lanes kernel's
// reads past it compute on the last column and store nothing).
fn paired_w_row_clamped(col: u32, block: u32) -> u32 {
    if (!SWIGLU) {
        return min(col, p.n - 1u);
    }
    let row = min(paired_out(col, block), p.n - 1u);
    return row + select(0u, p.up_row, col % block >= block / 2u);
}

// y[r, c] = silu(gate)·up: the element-wise SwiGLU's arithmetic on the sums
// it would have read back.
fn swiglu_out(r: u32, c: u32, gate_sum: f32, up_sum: f32) {
    y[p.y_offset + r * p.y_stride + c] = silu(gate_sum) * up_sum;
}
