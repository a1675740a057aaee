// The last step of a GroupNorm over channels-last rows (`[pixels,
// channels]`, f32 or f16 in pieces: norm.wgsl's `channels_last_value`; its statistics from
// norm.wgsl's group_moments and group_merge), written as the next convolution's f16 input: a
// pixel's row divided by its range scale, two values a word, the scale
// beside it (after norm_half.wgsl, whose outputs these are). The VAE's data
// path on the matrix tier. `p.rows` counts pixels, `p.d` channels.

// Channel `ch` of pixel row `row` normalised with its group's statistics,
// times gamma plus beta (norm.wgsl's group_norm_apply expression), SiLU'd where p.silu.
fn nhwc_normed(row: u32, ch: u32) -> f32 {
    let g = ch / (p.d / p.groups);
    let x = channels_last_value(row, ch, p.d);
    var v = fma((x - modulation[p.shift_offset + 2u * g]) * modulation[p.shift_offset + 2u * g + 1u], weight(p.w_offset + ch), weight2(p.w_offset + ch));
    if (p.silu != 0u) {
        v = silu(v);
    }
    return v;
}

// One workgroup a pixel row: its normalised values' largest magnitude gives
// the row's range scale, then each pair is rounded under it.
@compute @workgroup_size(128)
fn group_norm_nhwc_half(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                        @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_workgroup(wid, nwg);
    if (row >= p.rows) { return; }
    let t = lid.x;
    var m = 0.0;
    for (var ch = t; ch < p.d; ch += THREADS) {
        m = max(m, abs(nhwc_normed(row, ch)));
    }
    let scale = range_scale(workgroup_max(m, t));
    let inverse = 1.0 / scale;
    for (var j = t; j < p.d / 2u; j += THREADS) {
        let lo = f16(nhwc_normed(row, 2u * j) * inverse);
        let hi = f16(nhwc_normed(row, 2u * j + 1u) * inverse);
        dst_half[p.dst_offset + row * p.dst_stride + j] = pack2x16float(vec2<f32>(f32(lo), f32(hi)));
    }
    if (t == 0u) {
        dst_scales[p.scales_offset + row] = scale;
    }
}
