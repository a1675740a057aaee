// Row normalisations. One workgroup per row (or per GroupNorm group); rows
// are addressed as (token, head) so per-head norms of a [tokens, heads·d]
// view need no copy. Statistics are accumulated in f32, variance in two
// passes (mean first) so large means do not cancel.

override WEIGHT_BF16: bool = true;

struct Params {
    rows: u32, d: u32, heads: u32,
    src_offset: u32, src_stride: u32,
    dst_offset: u32, dst_stride: u32,
    w_offset: u32, eps: f32,
    shift_offset: u32, scale_offset: u32,
    groups: u32, silu: u32,
    // norm_half.wgsl's: where the rows' range scales go.
    scales_offset: u32,
    // rms_norm_rope's: the RoPE tables' row of the first token.
    table_row: u32,
    // The LayerNorm's: rows from `later_row` on take the shift and scale
    // at these offsets instead (a second stream's rows in the same pass).
    later_row: u32, later_shift_offset: u32, later_scale_offset: u32,
    // rms_norm_rope_half's: values a scale covers, and a token's scales' stride.
    piece: u32, scales_stride: u32,
    // The GroupNorm's: pixels an image row, and where an f16 source's
    // piece scales start.
    width: u32, src_scales: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read> w2: array<u32>;
@group(0) @binding(5) var<storage, read_write> modulation: array<f32>;
// rms_norm_rope's RoPE tables, [rows, d] f32 (rope.wgsl's).
@group(0) @binding(8) var<storage, read> cos_table: array<f32>;
@group(0) @binding(9) var<storage, read> sin_table: array<f32>;

const THREADS: u32 = 128u;
var<workgroup> partial: array<f32, 128>;

fn weight(i: u32) -> f32 {
    return weight_value(w[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}

fn weight2(i: u32) -> f32 {
    return weight_value(w2[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}

// Sum of `v` over the workgroup; every invocation gets the total.
fn workgroup_sum(v: f32, t: u32) -> f32 {
    partial[t] = v;
    workgroupBarrier();
    for (var s = THREADS / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            partial[t] += partial[t + s];
        }
        workgroupBarrier();
    }
    let total = partial[0];
    workgroupBarrier();
    return total;
}

fn src_index(row: u32, i: u32) -> u32 {
    return p.src_offset + (row / p.heads) * p.src_stride + (row % p.heads) * p.d + i;
}

fn dst_index(row: u32, i: u32) -> u32 {
    return p.dst_offset + (row / p.heads) * p.dst_stride + (row % p.heads) * p.d + i;
}

// dst = w · src / sqrt(mean(src²) + eps)
@compute @workgroup_size(128)
fn rms_norm(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_workgroup(wid, nwg);
    if (row >= p.rows) { return; }
    let t = lid.x;
    let inv = inverse_rms_of_src(row, t);
    for (var i = t; i < p.d; i += THREADS) {
        dst[dst_index(row, i)] = weight(p.w_offset + i) * (src[src_index(row, i)] * inv);
    }
}

// 1/√(mean(src²) + eps) of src's `row`, invocation `t` of THREADS.
fn inverse_rms_of_src(row: u32, t: u32) -> f32 {
    var ss = 0.0;
    for (var i = t; i < p.d; i += THREADS) {
        let v = src[src_index(row, i)];
        ss = fma(v, v, ss);
    }
    return inverseSqrt(workgroup_sum(ss, t) / f32(p.d) + p.eps);
}

// 1/√(mean(dst²) + eps) of dst's `row`, invocation `t` of THREADS; the
// sum's barriers order every read of the row before any write after it.
fn inverse_rms_of_dst(row: u32, t: u32) -> f32 {
    var ss = 0.0;
    for (var i = t; i < p.d; i += THREADS) {
        let v = dst[dst_index(row, i)];
        ss = fma(v, v, ss);
    }
    return inverseSqrt(workgroup_sum(ss, t) / f32(p.d) + p.eps);
}

// The same, in place on dst (per-head q/k norms).
@compute @workgroup_size(128)
fn rms_norm_inplace(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_workgroup(wid, nwg);
    if (row >= p.rows) { return; }
    let t = lid.x;
    let inv = inverse_rms_of_dst(row, t);
    for (var i = t; i < p.d; i += THREADS) {
        let j = dst_index(row, i);
        dst[j] = weight(p.w_offset + i) * (dst[j] * inv);
    }
}

// The per-head RMSNorm in place, then FLUX.2's interleaved RoPE on the
// normalised pair: value i of the row normalised as rms_norm_inplace writes
// it, each pair (2j, 2j + 1) rotated as rope.wgsl's rope_interleaved rotates
// it (token t reads table row table_row + t): the same expressions, so the
// same bits as the two passes, in one.
fn norm_rope_pair(row: u32, j: u32, inv: f32) {
    let i = 2u * j;
    let at = dst_index(row, i);
    let a = weight(p.w_offset + i) * (dst[at] * inv);
    let b = weight(p.w_offset + i + 1u) * (dst[at + 1u] * inv);
    let tab = (p.table_row + row / p.heads) * p.d + i;
    let cs = cos_table[tab];
    let sn = sin_table[tab];
    dst[at] = a * cs - b * sn;
    dst[at + 1u] = b * cs + a * sn;
}

@compute @workgroup_size(128)
fn rms_norm_rope(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_workgroup(wid, nwg);
    if (row >= p.rows) { return; }
    let t = lid.x;
    let inv = inverse_rms_of_dst(row, t);
    for (var j = t; j < p.d / 2u; j += THREADS) {
        norm_rope_pair(row, j, inv);
    }
}

// dst = LN(src)·(1 + scale) + shift, LN without affine; scale and shift are
// d-wide vectors in `modulation`, shared by every row. The statistics and
// each value come from `ln_moments` and `ln_value`, which the f16-output
// variant (norm_half.wgsl) shares, so both give the same f32 values.

// (mean, 1/√(var + eps)) of `row`, invocation `t` of THREADS.
fn ln_moments(row: u32, t: u32) -> vec2<f32> {
    var s = 0.0;
    for (var i = t; i < p.d; i += THREADS) {
        s += src[src_index(row, i)];
    }
    let mean = workgroup_sum(s, t) / f32(p.d);
    var sq = 0.0;
    for (var i = t; i < p.d; i += THREADS) {
        let c = src[src_index(row, i)] - mean;
        sq = fma(c, c, sq);
    }
    return vec2<f32>(mean, inverseSqrt(workgroup_sum(sq, t) / f32(p.d) + p.eps));
}

// Value i of `row`, modulated: LN(src)·(1 + scale) + shift, from its moments.
fn ln_value(row: u32, i: u32, moments: vec2<f32>) -> f32 {
    let xn = (src[src_index(row, i)] - moments.x) * moments.y;
    let later = row >= p.later_row;
    let scale = modulation[select(p.scale_offset, p.later_scale_offset, later) + i];
    let shift = modulation[select(p.shift_offset, p.later_shift_offset, later) + i];
    return fma(xn, 1.0 + scale, shift);
}

@compute @workgroup_size(128)
fn layer_norm_modulate(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_workgroup(wid, nwg);
    if (row >= p.rows) { return; }
    let t = lid.x;
    let moments = ln_moments(row, t);
    for (var i = t; i < p.d; i += THREADS) {
        dst[dst_index(row, i)] = ln_value(row, i, moments);
    }
}

// GroupNorm in three steps (core's GroupShape): each image row's moments,
// their merge in one fixed order, the normalisation. The tensor holds
// `p.rows` channels of `p.d` pixels, channel-major, or channels-last where
// CHANNELS_LAST (a pixel's channels side by side); its pixels are image rows
// of `p.width`; `p.groups` groups of `p.rows / p.groups` channels. Every
// (group, row) is one workgroup's work, and a band of whole rows computes the
// very moments the whole image's run does.
override CHANNELS_LAST: bool = false;

// A channels-last source as f16 rows in pieces of SRC_PIECE channels (the
// VAE's stream on the matrix tier; 0: f32 rows at binding 1): words at
// binding 10 from p.src_offset, the pieces' scales at binding 11 from
// p.src_scales.
override SRC_PIECE: u32 = 0u;
override SRC_PIECE_DIVISOR: u32 = max(SRC_PIECE, 1u);
@group(0) @binding(10) var<storage, read_write> src_half: array<u32>;
@group(0) @binding(11) var<storage, read_write> src_half_scales: array<f32>;

// Channel ch of pixel `pixel` of a channels-last source of `channels`.
fn channels_last_value(pixel: u32, ch: u32, channels: u32) -> f32 {
    let e = pixel * channels + ch;
    if (SRC_PIECE == 0u) {
        return src[p.src_offset + e];
    }
    let pair = unpack2x16float(src_half[p.src_offset + e / 2u]);
    return select(pair.x, pair.y, (e & 1u) == 1u) * src_half_scales[p.src_scales + pixel * (channels / SRC_PIECE_DIVISOR) + ch / SRC_PIECE_DIVISOR];
}

// Value i (< channels a group · width) of group g's share of image row r.
fn group_row_value(g: u32, r: u32, i: u32) -> f32 {
    let per = p.rows / p.groups;
    if (CHANNELS_LAST) {
        return channels_last_value(r * p.width + i / per, g * per + i % per, p.rows);
    }
    let ch = g * per + i / p.width;
    return src[p.src_offset + ch * p.d + r * p.width + i % p.width];
}

// Group wid.x's (mean, Σ(x − mean)²) over image row wid.y, the variance in a
// second pass about the mean, into modulation[shift_offset + 2(row·groups + g) ..].
@compute @workgroup_size(128)
fn group_moments(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let g = wid.x;
    let r = wid.y;
    let t = lid.x;
    let count = (p.rows / p.groups) * p.width;
    var s = 0.0;
    for (var i = t; i < count; i += THREADS) {
        s += group_row_value(g, r, i);
    }
    let mean = workgroup_sum(s, t) / f32(count);
    var sq = 0.0;
    for (var i = t; i < count; i += THREADS) {
        let c = group_row_value(g, r, i) - mean;
        sq = fma(c, c, sq);
    }
    let m2 = workgroup_sum(sq, t);
    if (t == 0u) {
        let at = p.shift_offset + 2u * (r * p.groups + g);
        modulation[at] = mean;
        modulation[at + 1u] = m2;
    }
}

var<workgroup> merge_sets: array<vec3<f32>, 128>;

// Two sets' (count, mean, Σ(x − mean)²) as one (Chan, Golub and LeVeque).
fn merged_moments(a: vec3<f32>, b: vec3<f32>) -> vec3<f32> {
    if (b.x == 0.0) {
        return a;
    }
    if (a.x == 0.0) {
        return b;
    }
    let n = a.x + b.x;
    let delta = b.y - a.y;
    return vec3<f32>(n, a.y + delta * (b.x / n), a.z + b.z + delta * delta * (a.x * b.x / n));
}

// One workgroup a group: the `p.rows` rows' moments at
// modulation[shift_offset ..] (`p.groups` a row, each over `p.width` values)
// folded in one fixed order (invocation t takes rows t, t + 128, … in turn,
// then the 128 sets merge pairwise, halving) into the group's
// (mean, 1/√(var + eps)) at dst[dst_offset + 2g ..].
@compute @workgroup_size(128)
fn group_merge(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let g = wid.x;
    let t = lid.x;
    var acc = vec3<f32>(0.0);
    for (var r = t; r < p.rows; r += THREADS) {
        let at = p.shift_offset + 2u * (r * p.groups + g);
        acc = merged_moments(acc, vec3<f32>(f32(p.width), modulation[at], modulation[at + 1u]));
    }
    merge_sets[t] = acc;
    workgroupBarrier();
    for (var s = THREADS / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            merge_sets[t] = merged_moments(merge_sets[t], merge_sets[t + s]);
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        let m = merge_sets[0];
        dst[p.dst_offset + 2u * g] = m.y;
        dst[p.dst_offset + 2u * g + 1u] = inverseSqrt(m.z / m.x + p.eps);
    }
}

// Pixels a workgroup of group_norm_apply takes.
const APPLY_PIXELS: u32 = 256u;

// Channel-major: group g's share of pixels [j·APPLY_PIXELS, …) normalised
// with the group's (mean, inv) at modulation[shift_offset + 2g ..]:
// (x − mean)·inv·gamma + beta (gamma w, beta w2), SiLU after where p.silu.
// Workgroup g + groups·j; each value alone, so any split of the pixels
// gives the same values.
@compute @workgroup_size(128)
fn group_norm_apply(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
    let flat = flat_workgroup(wid, nwg);
    let g = flat % p.groups;
    let first = (flat / p.groups) * APPLY_PIXELS;
    if (first >= p.d) { return; }
    let pixels = min(APPLY_PIXELS, p.d - first);
    let per = p.rows / p.groups;
    let count = per * pixels;
    let mean = modulation[p.shift_offset + 2u * g];
    let inv = modulation[p.shift_offset + 2u * g + 1u];
    for (var i = lid.x; i < count; i += THREADS) {
        let ch = g * per + i / pixels;
        let at = ch * p.d + first + i % pixels;
        var v = fma((src[p.src_offset + at] - mean) * inv, weight(p.w_offset + ch), weight2(p.w_offset + ch));
        if (p.silu != 0u) {
            v = silu(v);
        }
        dst[p.dst_offset + at] = v;
    }
}

// The row norms for CPU adapters, which run invocations side by side in
// SIMD lanes: one row per invocation, 64 rows a workgroup, no workgroup
// memory or barriers (the kernels above spend a barrier-split reduction and
// up to 127 idle invocations on every row, which a CPU pays in full). Each
// sum runs over the row in order.
const LANE_ROWS: u32 = 64u;

fn lane_row(lid: vec3<u32>, wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return flat_workgroup(wid, nwg) * LANE_ROWS + lid.x;
}

@compute @workgroup_size(64)
fn rms_norm_lanes(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = lane_row(lid, wid, nwg);
    if (row >= p.rows) { return; }
    let inv = inverse_rms_of_src_lane(row);
    for (var i = 0u; i < p.d; i++) {
        dst[dst_index(row, i)] = weight(p.w_offset + i) * (src[src_index(row, i)] * inv);
    }
}

// `inverse_rms_of_src` by one invocation.
fn inverse_rms_of_src_lane(row: u32) -> f32 {
    var ss = 0.0;
    for (var i = 0u; i < p.d; i++) {
        let v = src[src_index(row, i)];
        ss = fma(v, v, ss);
    }
    return inverseSqrt(ss / f32(p.d) + p.eps);
}

// `inverse_rms_of_dst` by one invocation.
fn inverse_rms_of_dst_lane(row: u32) -> f32 {
    var ss = 0.0;
    for (var i = 0u; i < p.d; i++) {
        let v = dst[dst_index(row, i)];
        ss = fma(v, v, ss);
    }
    return inverseSqrt(ss / f32(p.d) + p.eps);
}

@compute @workgroup_size(64)
fn rms_norm_inplace_lanes(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = lane_row(lid, wid, nwg);
    if (row >= p.rows) { return; }
    let inv = inverse_rms_of_dst_lane(row);
    for (var i = 0u; i < p.d; i++) {
        let j = dst_index(row, i);
        dst[j] = weight(p.w_offset + i) * (dst[j] * inv);
    }
}

@compute @workgroup_size(64)
fn layer_norm_modulate_lanes(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                             @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = lane_row(lid, wid, nwg);
    if (row >= p.rows) { return; }
    let moments = ln_moments_lane(row);
    for (var i = 0u; i < p.d; i++) {
        dst[dst_index(row, i)] = ln_value(row, i, moments);
    }
}

@compute @workgroup_size(64)
fn rms_norm_rope_lanes(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = lane_row(lid, wid, nwg);
    if (row >= p.rows) { return; }
    let inv = inverse_rms_of_dst_lane(row);
    for (var j = 0u; j < p.d / 2u; j++) {
        norm_rope_pair(row, j, inv);
    }
}

// `ln_moments` of `row` by one invocation.
fn ln_moments_lane(row: u32) -> vec2<f32> {
    var s = 0.0;
    for (var i = 0u; i < p.d; i++) {
        s += src[src_index(row, i)];
    }
    let mean = s / f32(p.d);
    var sq = 0.0;
    for (var i = 0u; i < p.d; i++) {
        let c = src[src_index(row, i)] - mean;
        sq = fma(c, c, sq);
    }
    return vec2<f32>(mean, inverseSqrt(sq / f32(p.d) + p.eps));
}
