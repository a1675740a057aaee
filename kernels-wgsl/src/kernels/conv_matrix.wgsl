// 2-D convolution (cross-correlation with bias) on cooperative-matrix units:
// the matrix tier's conv2d, on matrix_gemm.wgsl's core (the linear's) as the
// product of A = the input gathered per output pixel [pixels, taps] and
// B = Wᵀ [taps, output channels], one BM × BN block (pixels × channels) per
// workgroup. The taps t = (ci, ky, kx) run in W's order, so W's rows are B's
// columns exactly as in the linear (bf16 pairs where `B_PAIRED`). A call
// takes output pixels `px_first … px_first + px_count` (a large image runs
// in pieces); rows of A are those pixels. Interface in conv_io.wgsl.
//
// f16 operands are rounded under the range rule: W's rows by their scales
// (binding 8), measured when W reached the device or once per call by
// range_scales.wgsl, and A's (binding 5) by `conv_run_scales` below, one for each run of BM output pixels (a block's
// rows): the power of two for the largest magnitude under any of their taps.
// A run shares one scale where the linear gives each row its own: a run's
// pixels are neighbours, and the scale still keeps every value inside f16
// (values under 2⁻³⁸ of the run's largest flush to zero, as in the rule).

// Invocations per workgroup: SUBGROUPS subgroups of the adapter's size.
override WG: u32 = 32u;
// The kernel's size and the output's width (p.kernel, p.out_width) fixed
// when the pipeline is made: a tap's (ci, ky, kx) and a pixel's row and
// column then come of divisions by constants, in every gathered value (a
// pipeline for each width an image's convolutions have: a handful).
override KERNEL: u32 = 3u;
override OUT_WIDTH: u32 = 1u;

@group(0) @binding(5) var<storage, read_write> scales: array<f32>;

// A: the input under tap k0 + t of output pixel m0 + r (zero in the padding
// and past the call's pixels or the taps). Out-of-range reads go to x's
// first element and are selected away: no branches around the load.
fn a_at(r: u32, t: u32, m0: u32, k0: u32) -> f32 {
    let row = m0 + r;
    let tap = k0 + t;
    let pixel = p.px_first + row;
    let kk = KERNEL * KERNEL;
    let ci = tap / kk;
    let ky = (tap % kk) / KERNEL;
    let kx = tap % KERNEL;
    // Unsigned wrap-around makes taps above or left of the image fail the bound check.
    let iy = (pixel / OUT_WIDTH) * p.stride + ky - p.pad_top;
    let ix = (pixel % OUT_WIDTH) * p.stride + kx - p.pad_left;
    let inside = row < p.px_count && tap < taps() && iy < p.height && ix < p.width;
    let v = x[select(p.x_offset, p.x_offset + (ci * p.height + iy) * p.width + ix, inside)];
    return select(0.0, v, inside);
}

// Element i of a k step's A: (row, term), rows fastest: neighbouring output
// pixels under one tap are neighbouring input values (a tap's terms are a
// plane apart for 1×1 kernels, rows apart for 3×3 ones).
fn a_element(i: u32) -> vec2<u32> {
    return vec2<u32>(i % BM, i / BM);
}

// W's rows hold their taps in A's order, (ci, ky, kx): tap `tap` is term `tap`.
fn w_term(tap: u32) -> u32 {
    return tap;
}

// The range rule's scale of A's row (its run's; 1 past the call's pixels, or for f32 operands).
fn a_scale(row: u32) -> f32 {
    if (!OPERAND_HALF || row >= p.px_count) {
        return 1.0;
    }
    return scales[p.x_scales + row / BM];
}


// y[channel c + j, pixel r] = values[j] + b[c + j] (y's value added where
// RESIDUAL, ReLU'd where RELU), inside the call's pixels and channels only:
// one by one, the four being a plane apart.
fn block_quad_out(r: u32, c: u32, values: vec4<f32>) {
    for (var j = 0u; j < 4u; j++) {
        if (r < p.px_count && c + j < p.out_channels) {
            store_output(p.y_offset + (c + j) * p.out_height * p.out_width + p.px_first + r, values[j] + bias(p.b_offset + c + j));
        }
    }
}

@compute @workgroup_size(WG)
fn conv2d_matrix(
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) lanes: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    matrix_gemm_block(li, sg, lane, lanes, flat_workgroup(wid, nwg), p.out_channels, taps());
}

// The scale of each run of BM pixels, one workgroup a run: each invocation
// takes the largest magnitude under its pixels' taps, then the first
// reduces them (through c_tiles, which holds at least WG floats).
@compute @workgroup_size(WG)
fn conv_run_scales(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let run = flat_workgroup(wid, nwg);
    let runs = (p.px_count + BM - 1u) / BM;
    var largest = 0.0;
    if (run < runs) {
        for (var r = li; r < BM; r += WG) {
            for (var t = 0u; t < taps(); t++) {
                largest = max(largest, abs(a_at(r, t, run * BM, 0u)));
            }
        }
    }
    c_tiles[li] = largest;
    workgroupBarrier();
    if (li == 0u && run < runs) {
        var m = 0.0;
        for (var i = 0u; i < WG; i++) {
            m = max(m, c_tiles[i]);
        }
        scales[p.x_scales + run] = range_scale(m);
    }
}

// The channel-major convolution's outputs go out f32, one by one.
fn pieces_out() -> bool {
    return false;
}

fn block_half_quad_out(r: u32, c: u32, words: vec2<u32>) {}

fn out_piece() -> u32 {
    return 1u;
}

fn block_piece_scale_out(r: u32, c: u32, scale: f32) {}

fn piece_value(r: u32, c: u32, value: f32) -> f32 {
    return value;
}
