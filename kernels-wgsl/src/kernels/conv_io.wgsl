// The conv family's interface, shared by `conv.wgsl` (f32 tier, and the
// upsampling) and `conv_matrix.wgsl` (matrix tier): the parameter block
// (ConvParams on the host), the bindings over [channels, height, width]
// tensors, the bias, and the taps (ci, ky, kx) of one output value.

override WEIGHT_BF16: bool = true;

struct Params {
    in_channels: u32, height: u32, width: u32,
    out_channels: u32, out_height: u32, out_width: u32,
    kernel: u32, stride: u32, pad_top: u32, pad_left: u32,
    x_offset: u32, w_offset: u32, b_offset: u32, y_offset: u32,
    _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> b: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

fn bias(i: u32) -> f32 {
    return weight_value(b[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}

fn taps() -> u32 {
    return p.in_channels * p.kernel * p.kernel;
}
