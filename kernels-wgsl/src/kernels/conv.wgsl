// 2-D convolution over [channels, height, width] (cross-correlation with
// bias, weights [out, in, k, k] bf16 or f32), and nearest ×2 upsampling.
// Output-channel windows come in through the offsets so a launcher can split
// a large output.
//
// The convolution is a matrix product on gemm_tiles.wgsl's tiling:
// y[co, pixel] = Σ_t W[co, t]·X[pixel, t] over the taps t = (ci, ky, kx)
// in that order, a = the weight rows (contiguous), b = the input gathered
// per tap (zero where the tap falls in the padding). Interface in conv_io.wgsl.

// Set when w_offset and in_channels·k² are both even (see linear.wgsl).
override W_PAIRED: bool = false;

// Weights of output channel `co`, taps gt .. gt + 4.
fn load_a(co: u32, gt: u32) -> vec4<f32> {
    let k = taps();
    if (co >= p.out_channels || gt >= k) {
        return vec4<f32>(0.0);
    }
    return weight_run(p.w_offset + co * k + gt, min(4u, k - gt), W_PAIRED);
}

// The input under taps gt .. gt + 4 of output pixel `pixel`. The tap's
// (ci, ky, kx) is divided out once and then counted on with selects: a
// division per element cost more than the loads on CPU adapters (their SIMD
// lanes divide one at a time), and selects keep the lanes together.
fn load_b(pixel: u32, gt: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (pixel >= p.out_height * p.out_width) {
        return v;
    }
    let oy = pixel / p.out_width;
    let ox = pixel - oy * p.out_width;
    let kk = p.kernel * p.kernel;
    var ci = gt / kk;
    let rest = gt - ci * kk;
    var ky = rest / p.kernel;
    var kx = rest - ky * p.kernel;
    let n = taps();
    for (var i = 0u; i < 4u; i++) {
        // Unsigned wrap-around makes taps above or left of the image fail the bound check.
        let iy = oy * p.stride + ky - p.pad_top;
        let ix = ox * p.stride + kx - p.pad_left;
        // Loaded whatever the bound (at index 0 when outside), then zeroed by a
        // select: a load under a condition costs a branch per lane on CPU adapters.
        let inside = gt + i < n && iy < p.height && ix < p.width;
        let at = select(0u, p.x_offset + (ci * p.height + iy) * p.width + ix, inside);
        v[i] = select(0.0, x[at], inside);
        kx = kx + 1u;
        let next_row = kx == p.kernel;
        kx = select(kx, 0u, next_row);
        ky = ky + select(0u, 1u, next_row);
        let next_channel = ky == p.kernel;
        ky = select(ky, 0u, next_channel);
        ci = ci + select(0u, 1u, next_channel);
    }
    return v;
}

@compute @workgroup_size(16, 16)
fn conv2d(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // Tiles run pixel-fastest over a grid that may wrap into y.
    let plane = p.out_height * p.out_width;
    let px_tiles = (plane + TN - 1u) / TN;
    let tile = flat_workgroup(wid, nwg);
    if (tile >= px_tiles * ((p.out_channels + TM - 1u) / TM)) {
        return;
    }
    let co0 = (tile / px_tiles) * TM;
    let px0 = (tile % px_tiles) * TN;
    let acc = gemm_tile(lid, co0, px0, taps());
    for (var i = 0u; i < 8u; i++) {
        let co = tile_row(lid, co0, i);
        if (co >= p.out_channels) {
            continue;
        }
        let bv = bias(p.b_offset + co);
        for (var h = 0u; h < 2u; h++) {
            for (var j = 0u; j < 4u; j++) {
                let px = tile_col(lid, px0, h, j);
                if (px < plane) {
                    store_output(p.y_offset + co * plane + px, tile_value(acc, lid, i, h, j) + bv);
                }
            }
        }
    }
}

// Thin convolutions, at most THIN_MAX output channels (a VAE's last
// convolution to RGB): the 128-row tiles above would spend all but a few of
// their rows on zeros. One invocation per output pixel holds every output
// channel's sum, over the taps (ci, ky, kx) in order with one FMA per term,
// as the tiled kernel sums them; THIN_OC (the output channels) is fixed when
// the pipeline is made, so the sums stay in registers.
const THIN_MAX: u32 = 16u;
override THIN_OC: u32 = 4u;

@compute @workgroup_size(64)
fn conv2d_thin(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let px = gid.x + gid.y * nwg.x * 64u;
    let plane = p.out_height * p.out_width;
    if (px >= plane) {
        return;
    }
    let oy = px / p.out_width;
    let ox = px - oy * p.out_width;
    let k = taps();
    var acc: array<f32, THIN_MAX>;
    var t = 0u;
    for (var ci = 0u; ci < p.in_channels; ci++) {
        for (var ky = 0u; ky < p.kernel; ky++) {
            // Unsigned wrap-around makes taps above or left of the image fail the bound check.
            let iy = oy * p.stride + ky - p.pad_top;
            for (var kx = 0u; kx < p.kernel; kx++) {
                let ix = ox * p.stride + kx - p.pad_left;
                let inside = iy < p.height && ix < p.width;
                let v = select(0.0, x[select(0u, p.x_offset + (ci * p.height + iy) * p.width + ix, inside)], inside);
                for (var co = 0u; co < THIN_OC; co++) {
                    let i = p.w_offset + co * k + t;
                    acc[co] = fma(weight_value(w[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16), v, acc[co]);
                }
                t++;
            }
        }
    }
    for (var co = 0u; co < THIN_OC; co++) {
        if (co < p.out_channels) {
            store_output(p.y_offset + co * plane + px, acc[co] + bias(p.b_offset + co));
        }
    }
}

// y[c, 2h, 2w] = x[c, h, w] repeated over each 2×2 block.
@compute @workgroup_size(64)
fn upsample_nearest2x(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let flat = gid.x + gid.y * nwg.x * 64u;
    let ow = 2u * p.width;
    let plane = 4u * p.height * p.width;
    if (flat >= p.in_channels * plane) { return; }
    let c = flat / plane;
    let oy = (flat % plane) / ow;
    let ox = flat % ow;
    y[p.y_offset + flat] = x[p.x_offset + (c * p.height + oy / 2u) * p.width + ox / 2u];
}
