// Keys and values as f32 (every attention kernel but the half-K/V ones):
// the element and vec4 readers the tiled and CPU kernels go through, whose
// range scales are 1 (a product by 1 is exact, so these kernels compute
// what they computed reading the arrays directly).

@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
// k and v again as vec4s, for the CPU kernel (offsets and strides multiples of 4).
@group(0) @binding(8) var<storage, read_write> k4: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> v4: array<vec4<f32>>;

fn key_at(e: u32) -> f32 {
    return k[e];
}

fn value_at(e: u32) -> f32 {
    return v[e];
}

fn key4_at(i: u32) -> vec4<f32> {
    return k4[i];
}

fn value4_at(i: u32) -> vec4<f32> {
    return v4[i];
}

fn key_scale(kj: u32, kvh: u32) -> f32 {
    return 1.0;
}

fn value_scale(kj: u32, kvh: u32) -> f32 {
    return 1.0;
}
