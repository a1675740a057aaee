// f32 rows `[tokens, heads·head_dim]` into the half-K/V layout
// (`attention_kv_half.wgsl`): each (token, head) row of head_dim values is
// divided by its range scale (range_rule.wgsl: the power of two that brings
// its largest magnitude into [2¹³, 2¹⁴), so no value overflows f16 and
// small rows keep f16's precision), rounded to f16 two a word, and its
// scale stored as f32 (a token's scales p.scale_stride apart). One invocation a row: a row is a few hundred bytes,
// and a CPU adapter runs invocations side by side in its SIMD lanes.

struct Params {
    rows: u32, heads: u32, head_dim: u32,
    src_offset: u32, src_stride: u32,
    dst_offset: u32, dst_stride: u32,
    scale_offset: u32, scale_stride: u32,
    // swiglu_half_pack's: the up rows (the gate rows are `src`'s).
    up_offset: u32, up_stride: u32, _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;
@group(0) @binding(3) var<storage, read_write> scales: array<f32>;

@compute @workgroup_size(64)
fn half_pack(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_workgroup(wid, nwg) * 64u + lid.x;
    if (row >= p.rows * p.heads) {
        return;
    }
    let token = row / p.heads;
    let head = row % p.heads;
    let s0 = p.src_offset + token * p.src_stride + head * p.head_dim;
    var largest = 0.0;
    for (var i = 0u; i < p.head_dim; i++) {
        largest = max(largest, abs(src[s0 + i]));
    }
    // ldexp by the exponent, not a product by 1/scale: 2^-e can overflow f32
    // where 2^e is tiny. The exponent stays ≥ −126 so the scale is normal.
    let e = max(range_exponent(largest), -126);
    let d0 = p.dst_offset + token * p.dst_stride + head * (p.head_dim / 2u);
    for (var i = 0u; i < p.head_dim / 2u; i++) {
        let pair = vec2<f32>(ldexp(src[s0 + 2u * i], -e), ldexp(src[s0 + 2u * i + 1u], -e));
        dst[d0 + i] = pack2x16float(pair);
    }
    scales[p.scale_offset + token * p.scale_stride + head] = ldexp(1.0, e);
}

// A bf16 weight `[rows, p.head_dim]` packed in place into the matrix tier's
// f16 operand, once where it reaches the device: each value divided by its
// row's range scale (kept beside it, at binding 3 from p.scale_offset) and
// rounded to f16, two a word, as a product's staging would round it every
// tile. One invocation a word (a row's values are even in number, so a
// word never straddles two rows); p.rows counts the words, from
// p.dst_offset.
@compute @workgroup_size(64)
fn pack_weight_half(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_workgroup(wid, nwg) * 64u + lid.x;
    if (i >= p.rows) {
        return;
    }
    let word = dst[p.dst_offset + i];
    let inverse = 1.0 / scales[p.scale_offset + 2u * i / p.head_dim];
    dst[p.dst_offset + i] = pack2x16float(vec2<f32>(bitcast<f32>(word << 16u) * inverse, bitcast<f32>(word & 0xffff0000u) * inverse));
}

// An f32 weight `[rows, p.head_dim]` (binding 1 from p.src_offset) packed
// the same way into a buffer of its own (binding 2 from p.dst_offset, half
// its bytes): each value divided by its row's kept range scale and rounded
// to f16, two a word, as a product's staging would round it every tile.
// One invocation a word; p.rows counts the words.
@compute @workgroup_size(64)
fn pack_weight_half_f32(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_workgroup(wid, nwg) * 64u + lid.x;
    if (i >= p.rows) {
        return;
    }
    let inverse = 1.0 / scales[p.scale_offset + 2u * i / p.head_dim];
    let at = p.src_offset + 2u * i;
    dst[p.dst_offset + i] = pack2x16float(vec2<f32>(src[at] * inverse, src[at + 1u] * inverse));
}
