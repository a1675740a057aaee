// 2-D convolution (cross-correlation with bias) over channels-last
// f16 activations on cooperative-matrix units: the VAE's data path on the
// matrix tier. The input is `[pixels, C]` f16 rows, two a word, each pixel's
// row divided by its range scale (range_rule.wgsl) with the scale beside it
// as f32, as the op before writes it (a GroupNorm + SiLU, the latent's
// de-normalisation), or in pieces of X_PIECE channels each under its own
// scale (the stream, as a convolution before wrote it); the output
// `[pixels, out channels]` f32 rows (y's own values added where RESIDUAL),
// or with Y_HALF f16 rows in pieces of Y_PIECE channels (the next ops'
// input and the stream), a residual's f16 rows in the same pieces added
// where RESIDUAL_HALF.
//
// On matrix_gemm.wgsl's core (the linear's) as the product of A = the input
// gathered per output pixel [pixels, taps] and B = Wᵀ [taps, out channels],
// one BM × BN block per workgroup, as conv_matrix.wgsl; but the taps run in
// (ky, kx, ci) order, so a k step reads one neighbour's channels, neighbours
// in memory. W's rows are in that order (`[co, ky, kx, ci]`, `W_TAPS_LAST`:
// B's columns load as pairs) or PyTorch's `[co, ci, ky, kx]`, each value
// then read on its own; bf16, or packed at load as f16 under its rows'
// scales (matrix_fetch.wgsl's `W_HALF`).
//
// A's row scale (an output pixel's) is the largest of its in-image
// neighbours' scales, so every tap's value is its f16 value times a power
// of two of at most 1 (exact, unless it falls below f16's normals: the
// range rule's flush). No pass measures A. With `UPSAMPLE` the input is
// read through a nearest-neighbour ×2 upsampling (neighbour (uy, ux) of the
// upsampled image is input pixel (uy/2, ux/2)): the upsampling pass and its
// 4× tensor are gone. Interface in conv_io.wgsl; `p.height`/`p.width` are
// the input's (before upsampling), `p.x_offset` and `p.x_scales` the window's
// words and scales of input pixel `p.x_first`. A stride (`p.stride`: the
// encoder's downsamplers, padded below and right only) steps the taps'
// window by that many input pixels an output pixel. A pixel's row of an odd
// channel count (the image's three) takes whole words, the last half zero.

// Invocations per workgroup: SUBGROUPS subgroups of the adapter's size.
override WG: u32 = 32u;
// The kernel's size, the input's channels and the output's width, fixed
// when the pipeline is made (a tap's neighbour and channel, a pixel's row
// and column come of divisions by constants).
override KERNEL: u32 = 3u;
override IN_CHANNELS: u32 = 2u;
override OUT_WIDTH: u32 = 1u;
override UPSAMPLE: bool = false;
// Words a pixel's input row takes.
override X_WORDS: u32 = (IN_CHANNELS + 1u) / 2u;

// read_write: the input shares its buffer (the activation arena) with y.
@group(0) @binding(9) var<storage, read_write> x_half: array<u32>;
@group(0) @binding(10) var<storage, read_write> x_pixel_scales: array<f32>;

// Input height and width as the taps see them (upsampled where UPSAMPLE).
fn seen_height() -> u32 {
    return select(p.height, 2u * p.height, UPSAMPLE);
}

fn seen_width() -> u32 {
    return select(p.width, 2u * p.width, UPSAMPLE);
}

// The input pixel under neighbour `nb` (ky·KERNEL + kx) of output pixel
// `pixel`, and whether it lies inside the image. Unsigned wrap-around makes
// neighbours above or left of the image fail the bound check.
fn neighbour(pixel: u32, nb: u32) -> vec2<u32> {
    let uy = pixel / OUT_WIDTH * p.stride + nb / KERNEL - p.pad_top;
    let ux = pixel % OUT_WIDTH * p.stride + nb % KERNEL - p.pad_left;
    let inside = uy < seen_height() && ux < seen_width();
    let shift = select(0u, 1u, UPSAMPLE);
    return vec2<u32>((uy >> shift) * p.width + (ux >> shift), u32(inside));
}

// The input in pieces of X_PIECE channels (0: one scale a pixel).
override X_PIECE: u32 = 0u;
override X_PIECE_DIVISOR: u32 = max(X_PIECE, 1u);

// Scales a pixel of the input.
fn input_pieces() -> u32 {
    return select(1u, IN_CHANNELS / X_PIECE_DIVISOR, X_PIECE > 0u);
}

// The range scale of channel ci of input pixel `src` (its window's).
fn input_scale(src: u32, ci: u32) -> f32 {
    return x_pixel_scales[p.x_scales + (src - p.x_first) * input_pieces() + ci / select(IN_CHANNELS, X_PIECE_DIVISOR, X_PIECE > 0u)];
}

// The input normalised as it is read (NORM_IN: the GroupNorm, then SiLU
// where NORM_ACT is 1 or ReLU where it is 2, that the op before would have
// written as this convolution's input): each group's (mean, 1/√(var + eps)) at binding 16 from p.n_stats,
// NORM_GROUPS groups of the input channels; gamma and beta at 17 and 18
// from p.n_affine, as the bias (WEIGHT_BF16). The expression is norm.wgsl's
// GroupNorm's, so each value is the one that pass would have rounded.
override NORM_IN: bool = false;
override NORM_ACT: u32 = 0u;
override NORM_GROUPS: u32 = 1u;
@group(0) @binding(16) var<storage, read_write> norm_stats: array<f32>;
@group(0) @binding(17) var<storage, read> norm_gamma: array<u32>;
@group(0) @binding(18) var<storage, read> norm_beta: array<u32>;

fn norm_gamma_at(ci: u32) -> f32 {
    let i = p.n_affine + ci;
    return weight_value(norm_gamma[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}

fn norm_beta_at(ci: u32) -> f32 {
    let i = p.n_affine + ci;
    return weight_value(norm_beta[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}

// Input value `v` of channel ci, normalised (where NORM_IN).
fn normed_input(v: f32, ci: u32) -> f32 {
    if (!NORM_IN) {
        return v;
    }
    let g = p.n_stats + 2u * (ci / (IN_CHANNELS / NORM_GROUPS));
    let n = fma((v - norm_stats[g]) * norm_stats[g + 1u], norm_gamma_at(ci), norm_beta_at(ci));
    if (NORM_ACT == 1u) {
        return silu(n);
    }
    return select(n, max(n, 0.0), NORM_ACT == 2u);
}

// What any normalised input value's magnitude stays under, for stored
// values under `largest` in magnitude: |γ|·(largest + |mean|)·(1/σ) + |β|
// at the largest of each over the channels and groups (SiLU never grows a
// magnitude beyond max(|v|, 0.28), ReLU never beyond |v|).
fn normed_bound(largest: f32) -> f32 {
    var mean = 0.0;
    var inverse = 0.0;
    for (var g = 0u; g < NORM_GROUPS; g++) {
        mean = max(mean, abs(norm_stats[p.n_stats + 2u * g]));
        inverse = max(inverse, norm_stats[p.n_stats + 2u * g + 1u]);
    }
    var gamma = 0.0;
    var beta = 0.0;
    for (var ci = 0u; ci < IN_CHANNELS; ci++) {
        gamma = max(gamma, abs(norm_gamma_at(ci)));
        beta = max(beta, abs(norm_beta_at(ci)));
    }
    return max(gamma * (largest + mean) * inverse + beta, 0.28);
}

// A: input channel ci of neighbour nb of output pixel m0 + r, for tap
// k0 + t = nb·C + ci (zero in the padding and past the call's pixels or
// the taps). Out-of-range reads go to the window's first word and are
// selected away.
fn a_at(r: u32, t: u32, m0: u32, k0: u32) -> f32 {
    let row = m0 + r;
    let tap = k0 + t;
    let at = neighbour(p.px_first + row, tap / IN_CHANNELS);
    let ci = tap % IN_CHANNELS;
    let inside = row < p.px_count && tap < taps() && at.y == 1u;
    let word = x_half[select(p.x_offset, p.x_offset + (at.x - p.x_first) * X_WORDS + ci / 2u, inside)];
    let pair = unpack2x16float(word);
    let v = select(pair.x, pair.y, (ci & 1u) == 1u) * input_scale(select(p.x_first, at.x, inside), select(0u, ci, inside));
    return select(0.0, normed_input(v, ci), inside);
}

// Element i of a k step's A: (row, term), terms fastest: a row's taps of
// one neighbour are neighbouring channels, neighbouring f16 in memory.
fn a_element(i: u32) -> vec2<u32> {
    return vec2<u32>(i / KT, i % KT);
}

// Whether W's rows hold their taps in (ky, kx, ci) order, as A's run.
override W_TAPS_LAST: bool = true;

// Where tap `tap` (neighbour·C + channel) lies in a row of W (B_PAIRED
// only where it is `tap` itself).
fn w_term(tap: u32) -> u32 {
    let torch = (tap % IN_CHANNELS) * KERNEL * KERNEL + tap / IN_CHANNELS;
    return select(torch, tap, W_TAPS_LAST);
}


// The range rule's scale of A's row: the largest of the output pixel's
// in-image neighbours' (of each one's pieces; 1 past the call's pixels).
// Normalised as read, the scale of the bound on its values: a stored
// value is under 2¹⁴ times its scale (range_rule.wgsl).
fn a_scale(row: u32) -> f32 {
    if (row >= p.px_count) {
        return 1.0;
    }
    var largest = 0.0;
    for (var nb = 0u; nb < KERNEL * KERNEL; nb++) {
        let at = neighbour(p.px_first + row, nb);
        if (at.y == 1u) {
            for (var j = 0u; j < input_pieces(); j++) {
                largest = max(largest, x_pixel_scales[p.x_scales + (at.x - p.x_first) * input_pieces() + j]);
            }
        }
    }
    if (NORM_IN) {
        return range_scale(normed_bound(largest * 16384.0));
    }
    return select(largest, 1.0, largest == 0.0);
}


// y's pixels as vectors (`Y_VEC4`: whole vec4s of outputs a pixel, y's
// window from a whole one), at bindings 19 (f32) and 20 (f16 pairs, two
// words a vector), the same buffers as bindings 4 and 12: four
// neighbouring channels of a pixel go out in one store.
override Y_VEC4: bool = false;
@group(0) @binding(19) var<storage, read_write> y_vec4: array<vec4<f32>>;
@group(0) @binding(20) var<storage, read_write> y_half_quads: array<vec2<u32>>;

// y[pixel r, channel c + j] (the call's r: y's window starts at its first
// pixel) = values[j] + b[c + j], y's value added where RESIDUAL, ReLU'd
// where RELU (store_output's arithmetic, each output's the same), inside
// the call's pixels and channels only.
fn block_quad_out(r: u32, c: u32, values: vec4<f32>) {
    if (r >= p.px_count) {
        return;
    }
    let at = p.y_offset + r * p.out_channels + c;
    if (Y_VEC4 && c + 3u < p.out_channels) {
        let b = p.b_offset + c;
        var v = values + vec4<f32>(bias(b), bias(b + 1u), bias(b + 2u), bias(b + 3u));
        if (RESIDUAL) {
            v = v + y_vec4[at / 4u];
        }
        y_vec4[at / 4u] = select(v, max(v, vec4<f32>(0.0)), RELU);
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        if (c + j < p.out_channels) {
            store_output(at + j, values[j] + bias(p.b_offset + c + j));
        }
    }
}

// The outputs as f16 rows in pieces of Y_PIECE channels (Y_HALF): words
// at binding 12 from p.y_offset, a pixel's out_channels / 2 apart, the
// pieces' scales at binding 13 from p.y_scales; with RESIDUAL_HALF the
// residual's rows (another tensor, in the same pieces) at 14 and 15, from
// p.r_offset and p.r_scales.
override Y_HALF: bool = false;
override Y_PIECE: u32 = 32u;
override RESIDUAL_HALF: bool = false;
@group(0) @binding(12) var<storage, read_write> y_half: array<u32>;
@group(0) @binding(13) var<storage, read_write> y_half_scales: array<f32>;
@group(0) @binding(14) var<storage, read_write> r_half: array<u32>;
@group(0) @binding(15) var<storage, read_write> r_half_scales: array<f32>;

fn pieces_out() -> bool {
    return Y_HALF;
}

fn out_piece() -> u32 {
    return Y_PIECE;
}

// Pieces a pixel of the output.
fn output_pieces() -> u32 {
    return p.out_channels / Y_PIECE;
}

// The sum with its bias, the residual's value added where RESIDUAL_HALF,
// ReLU'd where RELU (zero outside the call's pixels and channels).
fn piece_value(r: u32, c: u32, value: f32) -> f32 {
    if (r >= p.px_count || c >= p.out_channels) {
        return 0.0;
    }
    var v = value + bias(p.b_offset + c);
    if (RESIDUAL_HALF) {
        let pair = unpack2x16float(r_half[p.r_offset + (r * p.out_channels + c) / 2u]);
        v = v + select(pair.x, pair.y, (c & 1u) == 1u) * r_half_scales[p.r_scales + r * output_pieces() + c / Y_PIECE];
    }
    return select(v, max(v, 0.0), RELU);
}

// Outputs c … c + 3 of pixel r as two words, inside the call only: one
// store where y's pixels are whole vectors.
fn block_half_quad_out(r: u32, c: u32, words: vec2<u32>) {
    if (r >= p.px_count || c >= p.out_channels) {
        return;
    }
    let at = p.y_offset + (r * p.out_channels + c) / 2u;
    if (Y_VEC4 && c + 3u < p.out_channels) {
        y_half_quads[at / 2u] = words;
        return;
    }
    y_half[at] = words.x;
    if (c + 2u < p.out_channels) {
        y_half[at + 1u] = words.y;
    }
}

// The scale of the piece from output c of pixel r, inside the call only.
fn block_piece_scale_out(r: u32, c: u32, scale: f32) {
    if (r < p.px_count && c < p.out_channels) {
        y_half_scales[p.y_scales + r * output_pieces() + c / Y_PIECE] = scale;
    }
}

@compute @workgroup_size(WG)
fn conv2d_matrix_nhwc(
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) lanes: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    matrix_gemm_block(li, sg, lane, lanes, flat_workgroup(wid, nwg), p.out_channels, taps());
}
