// What the two matrix-product families (linear and conv) bind alike, on
// every tier: the input x and output y (f32), the weights W and bias b
// (bf16, two per u32, or f32 as WEIGHT_BF16 says), and the bias lookup.
// Each family's own parameter block is in `linear_io.wgsl` / `conv_io.wgsl`.

override WEIGHT_BF16: bool = true;

@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> b: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

fn bias(i: u32) -> f32 {
    return weight_value(b[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}
