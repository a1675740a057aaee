// The conv family's interface, shared by `conv.wgsl` (f32 and f16 tiers,
// and the upsampling) and `conv_matrix.wgsl` (matrix tier): the parameter
// block (ConvParams on the host) over [channels, height, width] tensors and
// the taps (ci, ky, kx) of one output value; the bindings and the bias are
// `product_io.wgsl`'s.

struct Params {
    in_channels: u32, height: u32, width: u32,
    out_channels: u32, out_height: u32, out_width: u32,
    kernel: u32, stride: u32, pad_top: u32, pad_left: u32,
    x_offset: u32, w_offset: u32, b_offset: u32, y_offset: u32,
    // The matrix tier's: the output pixels this call takes, and where the
    // scales of A's runs of pixels and of W's rows start in its scales.
    px_first: u32, px_count: u32, x_scales: u32, w_scales: u32,
    // conv_matrix_nhwc.wgsl's: the input pixel its window starts at, and
    // where its f16 output's scales and its residual's words and scales start.
    x_first: u32, y_scales: u32, r_offset: u32, r_scales: u32,
    // Its input normalised as read: where the statistics, gamma and beta start.
    n_stats: u32, n_affine: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

// y's value added to the sum with its bias where set (a residual block's
// sum in the convolution that ends it: the add pass's one f32 addition on
// the same two values, so its bits).
override RESIDUAL: bool = false;
// ReLU after the bias (and the residual) where set (a convolution whose
// next step is a ReLU): relu's max on the same value, so the bits of the two passes.
override RELU: bool = false;

// Stores an output value at y[at]: the sum with its bias, y's value there
// added where RESIDUAL, ReLU'd where RELU.
fn store_output(at: u32, value: f32) {
    var v = value;
    if (RESIDUAL) {
        v = v + y[at];
    }
    y[at] = select(v, max(v, 0.0), RELU);
}

fn taps() -> u32 {
    return p.in_channels * p.kernel * p.kernel;
}
