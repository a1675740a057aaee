// Keys and values stored in half precision (the transformer's half-K/V
// layout): two f16 a word (`pack2x16float`, element 2i in the low half),
// each (token, kv head) row of head_dim values divided by a power of two,
// its range scale (`half_pack.wgsl`), kept as f32 in `k_scales`/`v_scales`
// `[kv_len, kv_heads]`. Offsets and strides in the parameters count f16
// elements. A score is q·k̂ times the key's scale; a value row's weight is
// its probability times the value's scale; both products are exact in f32
// (powers of two), so only the f16 rounding of k and v differs from f32.

@group(0) @binding(2) var<storage, read_write> k: array<u32>;
@group(0) @binding(3) var<storage, read_write> v: array<u32>;
// Four f16 elements a vec2 word pair, for the CPU kernel.
@group(0) @binding(8) var<storage, read_write> k4: array<vec2<u32>>;
@group(0) @binding(9) var<storage, read_write> v4: array<vec2<u32>>;
@group(0) @binding(10) var<storage, read_write> k_scales: array<f32>;
@group(0) @binding(11) var<storage, read_write> v_scales: array<f32>;

fn half_at(word: u32, e: u32) -> f32 {
    let pair = unpack2x16float(word);
    return select(pair.x, pair.y, (e & 1u) == 1u);
}

fn key_at(e: u32) -> f32 {
    return half_at(k[e >> 1u], e);
}

fn value_at(e: u32) -> f32 {
    return half_at(v[e >> 1u], e);
}

fn key4_at(i: u32) -> vec4<f32> {
    let w = k4[i];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

fn value4_at(i: u32) -> vec4<f32> {
    let w = v4[i];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

fn key_scale(kj: u32, kvh: u32) -> f32 {
    return k_scales[p.k_scale_offset + kj * p.kv_heads + kvh];
}

fn value_scale(kj: u32, kvh: u32) -> f32 {
    return v_scales[p.v_scale_offset + kj * p.kv_heads + kvh];
}
