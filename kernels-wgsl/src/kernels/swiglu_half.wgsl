// (after half_pack.wgsl, with f16 enabled) A feed-forward's SwiGLU written as the down projection's f16 operand:
// value i of (token, piece) row `row` is elementwise.wgsl's swiglu,
// silu(gate)·up, and each piece of head_dim values is rounded under its
// range scale as half_pack rounds a row (through f16(), as the products'
// tiles convert), its scale beside it: the SwiGLU and the pack in one pass.
@group(0) @binding(4) var<storage, read_write> up: array<f32>;

fn swiglu_value(token: u32, i: u32) -> f32 {
    return silu(src[p.src_offset + token * p.src_stride + i]) * up[p.up_offset + token * p.up_stride + i];
}

@compute @workgroup_size(64)
fn swiglu_half_pack(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_workgroup(wid, nwg) * 64u + lid.x;
    if (row >= p.rows * p.heads) {
        return;
    }
    let token = row / p.heads;
    let head = row % p.heads;
    let first = head * p.head_dim;
    var largest = 0.0;
    for (var i = 0u; i < p.head_dim; i++) {
        largest = max(largest, abs(swiglu_value(token, first + i)));
    }
    let e = max(range_exponent(largest), -126);
    let d0 = p.dst_offset + token * p.dst_stride + head * (p.head_dim / 2u);
    for (var i = 0u; i < p.head_dim / 2u; i++) {
        let lo = f16(ldexp(swiglu_value(token, first + 2u * i), -e));
        let hi = f16(ldexp(swiglu_value(token, first + 2u * i + 1u), -e));
        dst[d0 + i] = pack2x16float(vec2<f32>(f32(lo), f32(hi)));
    }
    scales[p.scale_offset + token * p.scale_stride + head] = ldexp(1.0, e);
}
