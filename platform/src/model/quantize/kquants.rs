//! The K-quants (Q2_K … Q6_K) as llama.cpp's reference quantizers
//! (`quantize_row_q*_K_ref`) write them, bit for bit where every float
//! operation is rounded as written (no multiply-add contraction): each
//! sub-block's scale (and minimum) fitted by a small search for the
//! least weighted error, the scales themselves quantized to 4, 6 or 8 bits
//! under the block's f16 scale, then every value rounded against its
//! sub-block's quantized scale. The byte layouts are the ones
//! `flux_lite_core::ggml` expands (Q4_K: d, dmin, 12 bytes of 6-bit scales
//! and mins, 128 bytes of nibbles; …). The goldens come from llama.cpp's own
//! code (`test_vectors/generate_kquants.py`).

use flux_lite_core::ggml::{k3_scale, k4_scale_min, GgmlType, QK_K};

/// Below this, a sub-block's values count as all zero (ggml's `GROUP_MAX_EPS`).
const ALL_ZERO: f32 = 1e-15;

/// `v` rounded to the nearest integer, ties to even, as ggml's
/// `nearest_int` computes it: 1.5·2²³ added in f32 and the integer read
/// from the mantissa. Exact for |v| < 2²²; outside that range (infinities
/// of a degenerate fit) the result is what the same arithmetic gives.
fn nearest_int(v: f32) -> i32 {
    let shifted = v + 12_582_912.0;
    (shifted.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// f32 to f16 bits, nearest even; NaN as ggml writes it (quiet, sign kept).
fn f16_bits(v: f32) -> u16 {
    if v.is_nan() {
        return ((v.to_bits() >> 16) as u16 & 0x8000) | 0x7e00;
    }
    half::f16::from_f32(v).to_bits()
}

fn f16_value(bits: u16) -> f32 {
    flux_lite_core::numerics::f16::to_f32(bits)
}

/// How a sub-block's scale-and-minimum fit searches (`make_qkx2_quants`'s arguments).
struct MinSearch {
    /// Largest level (3, 15, 31).
    top: i32,
    /// The trial scales: (top + rmin + rdelta·step) / range for step 0 ..= steps.
    rmin: f32,
    rdelta: f32,
    steps: i32,
    /// Absolute error instead of squared.
    absolute: bool,
}

/// Fits `x ≈ scale·L + min` (min ≤ 0) with levels `L` in 0 ..= top under
/// `weights`: returns (scale, −min) and leaves the levels in `levels`.
fn fit_with_min(x: &[f32], weights: &[f32], levels: &mut [u8], s: &MinSearch) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = if x[i] < min { x[i] } else { min };
        max = if x[i] > max { x[i] } else { max };
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let error = |diff: f32| if s.absolute { diff.abs() } else { diff * diff };
    let iscale = s.top as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        levels[i] = nearest_int(iscale * (x[i] - min)).clamp(0, s.top) as u8;
        best_error += weights[i] * error(scale * levels[i] as f32 + min - x[i]);
    }
    let mut trial = vec![0u8; n];
    for step in 0..=s.steps {
        let iscale = (s.rmin + s.rdelta * step as f32 + s.top as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, s.top);
            trial[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                cur_error += weights[i] * error(this_scale * trial[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                levels.copy_from_slice(&trial);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The value of largest magnitude (the first of equals), and that magnitude:
/// a sub-block's `max`/`amax`, and a block's largest sub-block scale.
fn largest(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// Q6_K's sub-block fit (`make_qx_quants`, weights x²): a signed scale
/// with levels −top .. top − 1 stored as 0 .. 2·top − 1, the best of 19
/// trial scales around −top / max by weighted least squares.
fn fit_signed(x: &[f32], top: i32, levels: &mut [u8]) -> f32 {
    let (max, amax) = largest(x);
    if amax < ALL_ZERO {
        levels.fill(0);
        return 0.0;
    }
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-top, top - 1) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let set = |iscale: f32, levels: &mut [u8]| {
        for (q, &v) in levels.iter_mut().zip(x) {
            *q = (top + nearest_int(iscale * v).clamp(-top, top - 1)) as u8;
        }
    };
    let iscale = -(top as f32) / max;
    set(iscale, levels);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(top as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            set(iscale, levels);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Q3_K's sub-block fit (`make_q3_quants` with its refinement): levels
/// −top .. top − 1 from −top / max, then up to five passes moving single
/// levels while the weighted (x²) least-squares fit improves; returns the
/// fitted scale, levels stored as 0 .. 2·top − 1.
fn fit_signed_refined(x: &[f32], top: i32, levels: &mut [u8]) -> f32 {
    let (max, amax) = largest(x);
    if amax < ALL_ZERO {
        levels.fill(0);
        return 0.0;
    }
    let iscale = -(top as f32) / max;
    let mut l: Vec<i32> = x.iter().map(|&v| nearest_int(iscale * v).clamp(-top, top - 1)).collect();
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &v) in x.iter().enumerate() {
        let w = v * v;
        sumlx += w * v * l[i] as f32;
        suml2 += w * l[i] as f32 * l[i] as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (i, &v) in x.iter().enumerate() {
            let w = v * v;
            let mut slx = sumlx - w * v * l[i] as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * l[i] as f32 * l[i] as f32;
                let new_l = nearest_int(v * sl2 / slx).clamp(-top, top - 1);
                if new_l != l[i] {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for (q, l) in levels.iter_mut().zip(&l) {
        *q = (l + top) as u8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// Four 2-bit levels a byte: byte `l` of each 32-byte run of a 128-value
/// half holds values l, l + 32, l + 64, l + 96 (Q2_K and Q3_K's low bits).
fn pack_2bit(levels: &[u8], out: &mut Vec<u8>) {
    for half in levels.chunks_exact(128) {
        out.extend((0..32).map(|l| half[l] | (half[l + 32] << 2) | (half[l + 64] << 4) | (half[l + 96] << 6)));
    }
}

/// Q2_K: 16 sub-blocks of 16, each `d·(s & 15)·q − dmin·(s >> 4)`.
fn q2_k(x: &[f32], out: &mut Vec<u8>) {
    let search = MinSearch { top: 3, rmin: -0.5, rdelta: 0.1, steps: 15, absolute: true };
    let mut levels = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
    for j in 0..16 {
        let part = &x[16 * j..16 * j + 16];
        let weights: Vec<f32> = part.iter().map(|v| v.abs()).collect();
        (scales[j], mins[j]) = fit_with_min(part, &weights, &mut levels[16 * j..16 * j + 16], &search);
    }
    let max_scale = scales.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let mut packed = [0u8; 16];
    let mut d = 0u16;
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for (p, &s) in packed.iter_mut().zip(&scales) {
            *p = nearest_int(iscale * s) as u8;
        }
        d = f16_bits(max_scale / 15.0);
    }
    let mut dmin = 0u16;
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for (p, &m) in packed.iter_mut().zip(&mins) {
            *p |= (nearest_int(iscale * m) << 4) as u8;
        }
        dmin = f16_bits(max_min / 15.0);
    }
    for (j, &sm) in packed.iter().enumerate() {
        let dl = f16_value(d) * (sm & 0x0f) as f32;
        if dl == 0.0 {
            continue;
        }
        let ml = f16_value(dmin) * (sm >> 4) as f32;
        for i in 16 * j..16 * j + 16 {
            levels[i] = nearest_int((x[i] + ml) / dl).clamp(0, 3) as u8;
        }
    }
    out.extend(packed);
    pack_2bit(&levels, out);
    out.extend(d.to_le_bytes());
    out.extend(dmin.to_le_bytes());
}

/// Q3_K: 16 sub-blocks of 16 with signed 6-bit scales, levels −4 .. 3 as
/// two low bits and a high-bit mask.
fn q3_k(x: &[f32], out: &mut Vec<u8>) {
    let mut levels = [0u8; QK_K];
    let scales: [f32; 16] = std::array::from_fn(|j| fit_signed_refined(&x[16 * j..16 * j + 16], 4, &mut levels[16 * j..16 * j + 16]));
    let (max_scale, _) = largest(&scales);
    let mut packed = [0u8; 12];
    let mut d = 0u16;
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &s) in scales.iter().enumerate() {
            let l = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                packed[j] = l & 0x0f;
            } else {
                packed[j - 8] |= (l & 0x0f) << 4;
            }
            packed[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
        }
        d = f16_bits(1.0 / iscale);
    }
    for j in 0..16 {
        let dl = f16_value(d) * k3_scale(&packed, j) as f32;
        if dl == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            levels[i] = (nearest_int(x[i] / dl).clamp(-4, 3) + 4) as u8;
        }
    }
    let mut hmask = [0u8; 32];
    for (j, l) in levels.iter_mut().enumerate() {
        if *l > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            *l -= 4;
        }
    }
    out.extend(hmask);
    pack_2bit(&levels, out);
    out.extend(packed);
    out.extend(d.to_le_bytes());
}

/// Q4_K and Q5_K: 8 sub-blocks of 32, each `d·sc·q − dmin·m` with 6-bit
/// `sc` and `m`; levels 0 .. 15 (Q4_K) or 0 .. 31 (Q5_K, the fifth bits
/// in their own 32 bytes).
fn q4_q5_k(x: &[f32], five: bool, out: &mut Vec<u8>) {
    let search = if five {
        MinSearch { top: 31, rmin: -0.5, rdelta: 0.1, steps: 15, absolute: false }
    } else {
        MinSearch { top: 15, rmin: -1.0, rdelta: 0.1, steps: 20, absolute: false }
    };
    let mut levels = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    for j in 0..8 {
        let part = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in part {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: Vec<f32> = part.iter().map(|v| av_x + v.abs()).collect();
        (scales[j], mins[j]) = fit_with_min(part, &weights, &mut levels[32 * j..32 * j + 32], &search);
    }
    let max_scale = scales.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0f) | ((lm & 0x0f) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let (d, dmin) = (f16_bits(max_scale / 63.0), f16_bits(max_min / 63.0));
    let top = search.top;
    for j in 0..8 {
        let dl = f16_value(d) * k4_scale_min(&packed, j, 0) as f32;
        if dl == 0.0 {
            continue;
        }
        let ml = f16_value(dmin) * k4_scale_min(&packed, j, 1) as f32;
        for i in 32 * j..32 * j + 32 {
            levels[i] = nearest_int((x[i] + ml) / dl).clamp(0, top) as u8;
        }
    }
    out.extend(d.to_le_bytes());
    out.extend(dmin.to_le_bytes());
    out.extend(packed);
    if five {
        let mut qh = [0u8; 32];
        for (i, l) in levels.iter_mut().enumerate() {
            if *l > 15 {
                qh[i % 32] |= 1 << (i / 32);
                *l -= 16;
            }
        }
        out.extend(qh);
    }
    // Nibbles: byte l of each 32-byte run holds values l (low) and l + 32 (high) of a 64-value run.
    for run in levels.chunks_exact(64) {
        out.extend((0..32).map(|l| run[l] | (run[l + 32] << 4)));
    }
}

/// Q6_K: 16 sub-blocks of 16 with signed 8-bit scales, levels −32 .. 31
/// as four low bits and two high bits.
fn q6_k(x: &[f32], out: &mut Vec<u8>) {
    let mut levels = [0u8; QK_K];
    let scales: [f32; 16] = std::array::from_fn(|j| fit_signed(&x[16 * j..16 * j + 16], 32, &mut levels[16 * j..16 * j + 16]));
    let (max_scale, max_abs_scale) = largest(&scales);
    if max_abs_scale < ALL_ZERO {
        out.extend([0u8; 210]);
        return;
    }
    let iscale = -128.0 / max_scale;
    let d = f16_bits(1.0 / iscale);
    let packed: Vec<i8> = scales.iter().map(|&s| nearest_int(iscale * s).min(127) as i8).collect();
    for (j, &sc) in packed.iter().enumerate() {
        let dl = f16_value(d) * sc as f32;
        if dl == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            levels[i] = (nearest_int(x[i] / dl).clamp(-32, 31) + 32) as u8;
        }
    }
    let (mut ql, mut qh) = (Vec::with_capacity(128), Vec::with_capacity(64));
    for half in levels.chunks_exact(128) {
        let mut low = [0u8; 64];
        for l in 0..32 {
            low[l] = (half[l] & 0x0f) | ((half[l + 64] & 0x0f) << 4);
            low[l + 32] = (half[l + 32] & 0x0f) | ((half[l + 96] & 0x0f) << 4);
            qh.push((half[l] >> 4) | ((half[l + 32] >> 4) << 2) | ((half[l + 64] >> 4) << 4) | ((half[l + 96] >> 4) << 6));
        }
        ql.extend(low);
    }
    out.extend(ql);
    out.extend(qh);
    out.extend(packed.iter().map(|&s| s as u8));
    out.extend(d.to_le_bytes());
}

/// One block of 256 values in `ggml` (a K-quant) onto `out`.
pub(super) fn quantize_block(ggml: GgmlType, x: &[f32], out: &mut Vec<u8>) {
    match ggml {
        GgmlType::Q2K => q2_k(x, out),
        GgmlType::Q3K => q3_k(x, out),
        GgmlType::Q4K => q4_q5_k(x, false, out),
        GgmlType::Q5K => q4_q5_k(x, true, out),
        GgmlType::Q6K => q6_k(x, out),
        _ => unreachable!("{} is no K-quant", ggml.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::nearest_int;

    #[test]
    fn nearest_int_rounds_ties_to_even_in_range() {
        for (v, want) in [(0.5f32, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (3.49, 3), (-7.51, -8), (4_194_303.0, 4_194_303)] {
            assert_eq!(nearest_int(v), want, "{v}");
        }
    }
}
