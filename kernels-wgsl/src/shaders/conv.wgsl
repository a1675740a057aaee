// 2-D convolution over [channels, height, width] (cross-correlation with
// bias, weights [out, in, k, k] bf16 or f32), and nearest ×2 upsampling.
// One invocation per output element; output-channel windows come in through
// the offsets so a launcher can split a large output.

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

fn weight(i: u32) -> f32 {
    return weight_value(w[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}

fn bias(i: u32) -> f32 {
    return weight_value(b[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}

@compute @workgroup_size(64)
fn conv2d(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let flat = gid.x + gid.y * nwg.x * 64u;
    let plane = p.out_height * p.out_width;
    if (flat >= p.out_channels * plane) { return; }
    let co = flat / plane;
    let oy = (flat % plane) / p.out_width;
    let ox = flat % p.out_width;
    let kk = p.kernel * p.kernel;
    var acc = bias(p.b_offset + co);
    for (var ci = 0u; ci < p.in_channels; ci++) {
        let w_base = p.w_offset + (co * p.in_channels + ci) * kk;
        let x_base = p.x_offset + ci * p.height * p.width;
        for (var ky = 0u; ky < p.kernel; ky++) {
            // Unsigned wrap-around makes rows above the image fail the bound check.
            let iy = oy * p.stride + ky - p.pad_top;
            if (iy >= p.height) { continue; }
            for (var kx = 0u; kx < p.kernel; kx++) {
                let ix = ox * p.stride + kx - p.pad_left;
                if (ix >= p.width) { continue; }
                acc = fma(x[x_base + iy * p.width + ix], weight(w_base + ky * p.kernel + kx), acc);
            }
        }
    }
    y[p.y_offset + flat] = acc;
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
