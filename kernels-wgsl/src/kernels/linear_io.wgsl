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

struct Params {
    m: u32, n: u32, k: u32,
    x_offset: u32, x_stride: u32,
    w_offset: u32, b_offset: u32,
    y_offset: u32, y_stride: u32,
    // The matrix tier's: where x's and W's row scales start in its scales.
    x_scales: u32, w_scales: u32,
    // GATED's: where the gate's first column is.
    gate_offset: u32,
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
    if (ACCUMULATE) {
        out += y[at];
    }
    y[at] = out;
}
