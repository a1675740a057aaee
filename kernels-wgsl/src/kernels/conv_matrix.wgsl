// 2-D convolution (cross-correlation with bias) on cooperative-matrix units:
// the matrix tier's conv2d, on matrix_tiles.wgsl's core with A = the weight
// rows [out, taps] and B = the input gathered per tap [taps, pixels], the
// taps t = (ci, ky, kx) in that order (zero where a tap falls in the
// padding). f16 operands are rounded under the range rule (matrix_tiles.wgsl).
// Interface in conv_io.wgsl.

// The subgroup size: one subgroup owns a tile, so a workgroup is one subgroup.
override WG: u32 = 8u;

// A: the weight of output channel co0 + r at tap t0 + t.
fn a_at(r: u32, t: u32, co0: u32, t0: u32) -> f32 {
    if (co0 + r < p.out_channels && t0 + t < taps()) {
        let e = p.w_offset + (co0 + r) * taps() + t0 + t;
        return weight_value(w[weight_word(e, WEIGHT_BF16)], e, WEIGHT_BF16);
    }
    return 0.0;
}

// B: the input under tap t0 + t of output pixel px0 + c.
fn b_at(t: u32, c: u32, px0: u32, t0: u32) -> f32 {
    let pixel = px0 + c;
    let tap = t0 + t;
    if (pixel >= p.out_height * p.out_width || tap >= taps()) {
        return 0.0;
    }
    let kk = p.kernel * p.kernel;
    let ci = tap / kk;
    let ky = (tap % kk) / p.kernel;
    let kx = tap % p.kernel;
    // Unsigned wrap-around makes taps above or left of the image fail the bound check.
    let iy = (pixel / p.out_width) * p.stride + ky - p.pad_top;
    let ix = (pixel % p.out_width) * p.stride + kx - p.pad_left;
    if (iy < p.height && ix < p.width) {
        return x[p.x_offset + (ci * p.height + iy) * p.width + ix];
    }
    return 0.0;
}

@compute @workgroup_size(WG)
fn conv2d_matrix(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // Tiles run pixel-fastest over a grid that may wrap into y.
    let plane = p.out_height * p.out_width;
    let px_tiles = (plane + T - 1u) / T;
    let tile = flat_workgroup(wid, nwg);
    let co0 = (tile / px_tiles) * T;
    let px0 = (tile % px_tiles) * T;
    matrix_tile(li, co0, px0, taps());
    for (var i = li; i < T * T; i += WG) {
        let r = i / T;
        let c = i % T;
        if (co0 + r < p.out_channels && px0 + c < plane) {
            y[p.y_offset + (co0 + r) * plane + px0 + c] = c_tile[i] + bias(p.b_offset + co0 + r);
        }
    }
}
