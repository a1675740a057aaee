// The linear family's interface, shared by `linear.wgsl` (f32 tier) and
// `linear_matrix.wgsl` (matrix tier): the parameter block (LinearParams on
// the host), the bindings, and the bias. W and b are bf16 (two per u32) or
// f32; offsets and strides let one call read or write a window of a larger
// tensor.

override WEIGHT_BF16: bool = true;
override HAS_BIAS: bool = false;

struct Params {
    m: u32, n: u32, k: u32,
    x_offset: u32, x_stride: u32,
    w_offset: u32, b_offset: u32,
    y_offset: u32, y_stride: u32,
    _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> b: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

fn bias(i: u32) -> f32 {
    return weight_value(b[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}
