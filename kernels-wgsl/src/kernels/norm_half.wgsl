// The matrix tier's LayerNorm + modulation for a product's input: the values
// norm.wgsl's `layer_norm_modulate` computes (its `ln_moments` and
// `ln_value`), written as f16 two a word, each row divided by its range
// scale (range_rule.wgsl), with the scale beside it as f32. These are the
// operands the matrix linear would round them to itself (x·(1/scale) in f32,
// then to f16), so the product reads them as they are instead of measuring
// and rounding them again. Rows are whole (heads = 1) and d is even.
// Also the per-head RMSNorm + RoPE in place on f16 rows in pieces
// (`rms_norm_rope_half`: the queries and keys as their projections wrote them).

@group(0) @binding(6) var<storage, read_write> dst_half: array<u32>;
@group(0) @binding(7) var<storage, read_write> dst_scales: array<f32>;

// The largest of `v` over the workgroup; every invocation gets it.
fn workgroup_max(v: f32, t: u32) -> f32 {
    partial[t] = v;
    workgroupBarrier();
    for (var s = THREADS / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            partial[t] = max(partial[t], partial[t + s]);
        }
        workgroupBarrier();
    }
    let largest = partial[0];
    workgroupBarrier();
    return largest;
}

// Values 2j and 2j + 1 of `row` as an f16 pair under `inverse` (1/scale).
// Rounded by the conversion to f16 the products' tiles use (`Operand(…)`);
// packing the f16 values widened back is then exact in any rounding mode.
fn half_pair(row: u32, j: u32, moments: vec2<f32>, inverse: f32) -> u32 {
    let lo = f16(ln_value(row, 2u * j, moments) * inverse);
    let hi = f16(ln_value(row, 2u * j + 1u, moments) * inverse);
    return pack2x16float(vec2<f32>(f32(lo), f32(hi)));
}

fn write_half_row(row: u32, j: u32, moments: vec2<f32>, inverse: f32) {
    dst_half[p.dst_offset + row * p.dst_stride + j] = half_pair(row, j, moments, inverse);
}

@compute @workgroup_size(128)
fn layer_norm_modulate_half(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                            @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_workgroup(wid, nwg);
    if (row >= p.rows) { return; }
    let t = lid.x;
    let moments = ln_moments(row, t);
    var m = 0.0;
    for (var i = t; i < p.d; i += THREADS) {
        m = max(m, abs(ln_value(row, i, moments)));
    }
    let scale = range_scale(workgroup_max(m, t));
    let inverse = 1.0 / scale;
    for (var j = t; j < p.d / 2u; j += THREADS) {
        write_half_row(row, j, moments, inverse);
    }
    if (t == 0u) {
        dst_scales[p.scales_offset + row] = scale;
    }
}

@compute @workgroup_size(64)
fn layer_norm_modulate_half_lanes(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = lane_row(lid, wid, nwg);
    if (row >= p.rows) { return; }
    let moments = ln_moments_lane(row);
    var m = 0.0;
    for (var i = 0u; i < p.d; i++) {
        m = max(m, abs(ln_value(row, i, moments)));
    }
    let scale = range_scale(m);
    let inverse = 1.0 / scale;
    for (var j = 0u; j < p.d / 2u; j++) {
        write_half_row(row, j, moments, inverse);
    }
    dst_scales[p.scales_offset + row] = scale;
}

// Value i of (token, head) row `row` of f16 rows in pieces of p.piece values
// (words from p.dst_offset, p.dst_stride a token; scales from
// p.scales_offset, p.scales_stride a token), widened and scaled back.
fn piece_value(row: u32, i: u32) -> f32 {
    let token = row / p.heads;
    let head = row % p.heads;
    let pair = unpack2x16float(dst_half[p.dst_offset + token * p.dst_stride + head * (p.d / 2u) + i / 2u]);
    let scale = dst_scales[p.scales_offset + token * p.scales_stride + (head * p.d + i) / p.piece];
    return select(pair.x, pair.y, (i & 1u) == 1u) * scale;
}

// norm.wgsl's rms_norm_rope on f16 rows in pieces, in place: the row's
// values widened and scaled back, its inverse RMS summed as
// inverse_rms_of_dst sums it, each pair normed and rotated as
// norm_rope_pair (FLUX.2's interleaved pairs) or rope.wgsl's rope_half
// (Qwen3's pairs (i, i + d/2), `ROTATE_HALF`) compute it (invocation t the
// pair t: heads of at most 2·THREADS values), the rotated values gathered
// in workgroup memory, then each piece rounded to f16 under its new range
// scale (kept ≥ 2⁻¹²⁶, as half_pack.wgsl keeps it). Every value is read
// before the barriers that precede the first write.
override ROTATE_HALF: bool = false;
var<workgroup> rotated: array<f32, 256>;

@compute @workgroup_size(128)
fn rms_norm_rope_half(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_workgroup(wid, nwg);
    if (row >= p.rows) { return; }
    let t = lid.x;
    var ss = 0.0;
    for (var i = t; i < p.d; i += THREADS) {
        let v = piece_value(row, i);
        ss = fma(v, v, ss);
    }
    let inv = inverseSqrt(workgroup_sum(ss, t) / f32(p.d) + p.eps);
    let pairs = p.d / 2u;
    if (t < pairs) {
        let i = select(2u * t, t, ROTATE_HALF);
        let j = select(2u * t + 1u, t + pairs, ROTATE_HALF);
        let a = weight(p.w_offset + i) * (piece_value(row, i) * inv);
        let b = weight(p.w_offset + j) * (piece_value(row, j) * inv);
        let tab = (p.table_row + row / p.heads) * p.d;
        // Interleaved pairs share the angle of their first value; rotate-half
        // tables hold each half's own (equal) entries.
        let j_tab = select(i, j, ROTATE_HALF);
        rotated[i] = a * cos_table[tab + i] - b * sin_table[tab + i];
        rotated[j] = b * cos_table[tab + j_tab] + a * sin_table[tab + j_tab];
    }
    workgroupBarrier();
    if (t < pairs) {
        // Word t holds values 2t and 2t + 1; their piece's largest magnitude.
        let first = (2u * t) / p.piece * p.piece;
        var largest = 0.0;
        for (var v = first; v < first + p.piece; v++) {
            largest = max(largest, abs(rotated[v]));
        }
        let e = max(range_exponent(largest), -126);
        let token = row / p.heads;
        let head = row % p.heads;
        let lo = f16(ldexp(rotated[2u * t], -e));
        let hi = f16(ldexp(rotated[2u * t + 1u], -e));
        dst_half[p.dst_offset + token * p.dst_stride + head * pairs + t] = pack2x16float(vec2<f32>(f32(lo), f32(hi)));
        if (2u * t == first) {
            dst_scales[p.scales_offset + token * p.scales_stride + (head * p.d + first) / p.piece] = ldexp(1.0, e);
        }
    }
}

// norm.wgsl's rms_norm (whole rows) into f16 rows under their range scales,
// as layer_norm_modulate_half writes the LayerNorm's: value i is rms_norm's
// expression, the row's largest magnitude gives the scale, and each value
// is rounded as the products' tiles round it.
fn rms_value(row: u32, i: u32, inv: f32) -> f32 {
    return weight(p.w_offset + i) * (src[src_index(row, i)] * inv);
}

fn write_rms_half_row(row: u32, j: u32, inv: f32, inverse: f32) {
    let lo = f16(rms_value(row, 2u * j, inv) * inverse);
    let hi = f16(rms_value(row, 2u * j + 1u, inv) * inverse);
    dst_half[p.dst_offset + row * p.dst_stride + j] = pack2x16float(vec2<f32>(f32(lo), f32(hi)));
}

@compute @workgroup_size(128)
fn rms_norm_half(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_workgroup(wid, nwg);
    if (row >= p.rows) { return; }
    let t = lid.x;
    let inv = inverse_rms_of_src(row, t);
    var m = 0.0;
    for (var i = t; i < p.d; i += THREADS) {
        m = max(m, abs(rms_value(row, i, inv)));
    }
    let scale = range_scale(workgroup_max(m, t));
    let inverse = 1.0 / scale;
    for (var j = t; j < p.d / 2u; j += THREADS) {
        write_rms_half_row(row, j, inv, inverse);
    }
    if (t == 0u) {
        dst_scales[p.scales_offset + row] = scale;
    }
}

// The same by one invocation a row (CPU adapters), summed as rms_norm_lanes sums.
@compute @workgroup_size(64)
fn rms_norm_half_lanes(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = lane_row(lid, wid, nwg);
    if (row >= p.rows) { return; }
    let inv = inverse_rms_of_src_lane(row);
    var m = 0.0;
    for (var i = 0u; i < p.d; i++) {
        m = max(m, abs(rms_value(row, i, inv)));
    }
    let scale = range_scale(m);
    let inverse = 1.0 / scale;
    for (var j = 0u; j < p.d / 2u; j++) {
        write_rms_half_row(row, j, inv, inverse);
    }
    dst_scales[p.scales_offset + row] = scale;
}
