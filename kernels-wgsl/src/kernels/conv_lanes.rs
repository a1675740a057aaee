//! The source of the CPU adapters' convolution (`conv2d_lanes`): 3×3 and
//! 1×1 kernels, stride 1, the output the input's width (the VAE's), its
//! rows all of the input's or a band of them (a banded decode's: output row
//! `oy` reads input rows from `oy − pad_top`, rows outside the input zero).
//!
//! As `linear_lanes`: each lane owns [`Shape::cols`] output channels (their weight
//! rows, read by the lane itself, each vec4 just before its products), and
//! the pixels are shared: each subgroup
//! takes [`Shape::pixels`] consecutive pixels of one output row, reads the input
//! patch they need (K rows of its pixels + K − 1 columns per input channel) together
//! as aligned vec4s, one share a lane, and hands each value to every lane
//! with `subgroupBroadcast` (a CPU driver fetches a storage load lane by
//! lane, so a patch costs each lane a few loads instead of all of them).
//! Input channels go [`CHANNELS`] at a time. `subgroupBroadcast` takes a
//! constant lane, so a step's products are written out for each subgroup
//! size, kernel size and [`Shape`]. Each output's sum runs over the taps
//! (ci, ky, kx) in order, one `fma` each, the bias after it, as `conv2d`
//! and `conv2d_thin` sum: the same bits.

/// How a subgroup's work is cut: output channels a lane owns, and
/// consecutive output pixels (of one row) the subgroup takes. Each lane
/// holds `cols × pixels` sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub cols: u32,
    pub pixels: u32,
}

/// For most convolutions of small images: 4 channels a lane, 8 pixels.
pub const WIDE: Shape = Shape { cols: 4, pixels: 8 };
/// For the same at [`LONG_MIN_PIXELS`] output pixels and more: 4 channels a
/// lane, 16 pixels, so each weight vec4 a lane loads serves 16 pixels (on
/// lavapipe 1.35–1.6× [`WIDE`], docs/history/performance-2026-11.md). Its source is twice
/// as long and compiles that much slower, so small images keep [`WIDE`].
pub const LONG: Shape = Shape { cols: 4, pixels: 16 };
/// Output pixels (of the call: a band's) from which [`LONG`] is taken.
pub const LONG_MIN_PIXELS: usize = 128 * 128;

/// The shape of a module: [`THIN`] where `thin`, else [`LONG`] where `long`, else [`WIDE`].
pub fn shape(thin: bool, long: bool) -> Shape {
    if thin { THIN } else if long { LONG } else { WIDE }
}
/// For at most [`super::conv::THIN_MAX`] output channels (an RGB
/// `conv_out`): one channel a lane, 32 pixels, so a patch serves four times
/// the pixels where most lanes' channels are past the output's.
pub const THIN: Shape = Shape { cols: 1, pixels: 32 };

/// Input channels a step.
pub const CHANNELS: u32 = 8;

use super::lanes::{emit, weight_vec4, LANE_COUNTS, PRODUCT_PRELUDE};

/// Vec4s of a patch row: the pixels' columns and `pad` either side, on
/// vec4 boundaries (the first at `ox0 / 4 - ROW_LEAD` vec4s).
fn row_vec4s(kernel: u32, pixels: u32) -> u32 {
    if kernel == 1 { pixels / 4 } else { pixels / 4 + 2 }
}
fn row_lead(kernel: u32) -> u32 {
    if kernel == 1 { 0 } else { 1 }
}

/// The entry's source after the shared parts (`product_io.wgsl`,
/// `conv_io.wgsl`), for subgroups of `lanes`, `kernel`×`kernel` taps and
/// the work cut as `shape` says.
pub fn source(lanes: u32, kernel: u32, shape: Shape) -> String {
    let Shape { cols, pixels } = shape;
    assert!(LANE_COUNTS.contains(&lanes), "no conv2d_lanes for subgroups of {lanes}");
    assert!(kernel == 1 || kernel == 3, "no conv2d_lanes for {kernel}×{kernel} kernels");
    let pad = (kernel - 1) / 2;
    let v4r = row_vec4s(kernel, pixels);
    let per_channel = kernel * v4r; // patch vec4s of one input channel
    let patch = CHANNELS * per_channel; // a step's patch vec4s
    assert!(patch.is_multiple_of(lanes));
    let per_lane = patch / lanes;
    let mut s = String::new();
    s.push_str(PRODUCT_PRELUDE);
    let ind = "    ";
    emit!(s, "@compute @workgroup_size(64)");
    emit!(s, "fn conv2d_lanes(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {{");
    emit!(s, "{ind}let row_blocks = (p.width + {}u) / {pixels}u;", pixels - 1);
    emit!(s, "{ind}let block = wid.x * {}u + sg;", 64 / lanes);
    emit!(s, "{ind}let oy = min(block / row_blocks, p.out_height - 1u);");
    emit!(s, "{ind}let ox0 = (block % row_blocks) * {pixels}u;");
    emit!(s, "{ind}let live = block < row_blocks * p.out_height;");
    emit!(s, "{ind}let co0 = wid.y * {}u + lane;", lanes * cols);
    emit!(s, "{ind}let k = taps();");
    emit!(s, "{ind}let wdiv = select(4u, 8u, WEIGHT_BF16);");
    emit!(s, "{ind}let last = (p.w_offset + p.out_channels * k) / wdiv - 1u;");
    for c in 0..cols {
        emit!(s, "{ind}let wb{c} = (p.w_offset + min(co0 + {}u, p.out_channels - 1u) * k) / wdiv;", c * lanes);
        for r in 0..pixels {
            emit!(s, "{ind}var acc{r}_{c} = 0.0;");
        }
    }
    // This lane's share of each step's patch: vec4 `lane + lanes·i` of
    // CHANNELS × kernel rows × v4r vec4s. Its place in the step is fixed;
    // its address moves by one step's channels.
    emit!(s, "{ind}let row4 = p.width / 4u;");
    emit!(s, "{ind}let col4_0 = ox0 / 4u;");
    for i in 0..per_lane {
        emit!(s, "{ind}let v{i} = lane + {}u;", i * lanes);
        emit!(s, "{ind}let ci{i} = v{i} / {per_channel}u;");
        emit!(s, "{ind}let iy{i} = oy + (v{i} % {per_channel}u) / {v4r}u - p.pad_top;");
        emit!(s, "{ind}let c4_{i} = col4_0 + v{i} % {v4r}u - {}u;", row_lead(kernel));
        emit!(s, "{ind}let in{i} = iy{i} < p.height && c4_{i} < row4;");
        emit!(s, "{ind}let at{i} = p.x_offset / 4u + (ci{i} * p.height + iy{i}) * row4 + c4_{i};");
    }
    emit!(s, "{ind}let step4 = {CHANNELS}u * p.height * row4;");
    emit!(s, "{ind}for (var c0 = 0u; c0 < p.in_channels; c0 += {CHANNELS}u) {{");
    let ind = "        ";
    emit!(s, "{ind}let shift = (c0 / {CHANNELS}u) * step4;");
    for i in 0..per_lane {
        emit!(s, "{ind}let xl{i} = select(vec4<f32>(0.0), x4[select(0u, at{i} + shift, in{i})], in{i});");
    }
    // The products, tap by tap in (ci, ky, kx) order; the owned rows' taps
    // fetched as vec4s (`w{c}_{t}`: taps 4t .. 4t + 3) before the first
    // product that needs them.
    let first = format!("c0 * {}u", kernel * kernel);
    let comps = ["x", "y", "z", "w"];
    for ci in 0..CHANNELS {
        for ky in 0..kernel {
            // The patch row's values, broadcast: column j is ox0 - pad + j.
            let first_col = row_lead(kernel) * 4 - pad; // offset of column 0 in the row's vec4s
            for j in 0..pixels + kernel - 1 {
                let v = ci * per_channel + ky * v4r + (first_col + j) / 4;
                let comp = comps[((first_col + j) % 4) as usize];
                emit!(s, "{ind}let p{ci}_{ky}_{j} = subgroupBroadcast(xl{}, {}u).{comp};", v / lanes, v % lanes);
            }
            for kx in 0..kernel {
                let t = (ci * kernel + ky) * kernel + kx;
                if t.is_multiple_of(4) {
                    for c in 0..cols {
                        weight_vec4(&mut s, ind, c, &first, t / 4);
                    }
                }
                let wc = |c: u32| format!("w{c}_{}.{}", t / 4, comps[(t % 4) as usize]);
                for r in 0..pixels {
                    for c in 0..cols {
                        emit!(s, "{ind}acc{r}_{c} = fma({}, p{ci}_{ky}_{}, acc{r}_{c});", wc(c), r + kx);
                    }
                }
            }
        }
    }
    emit!(s, "    }}");
    let ind = "    ";
    emit!(s, "{ind}let plane = p.out_height * p.width;");
    for c in 0..cols {
        emit!(s, "{ind}let oc{c} = co0 + {}u;", c * lanes);
        emit!(s, "{ind}if (live && oc{c} < p.out_channels) {{");
        emit!(s, "{ind}    let b{c} = bias(p.b_offset + oc{c});");
        for r in 0..pixels {
            emit!(s, "{ind}    if (ox0 + {r}u < p.width) {{ store_output(p.y_offset + oc{c} * plane + oy * p.width + ox0 + {r}u, acc{r}_{c} + b{c}); }}");
        }
        emit!(s, "{ind}}}");
    }
    emit!(s, "}}");
    s
}
