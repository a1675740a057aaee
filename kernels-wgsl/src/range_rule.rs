//! The host's side of `range_rule.wgsl`: a row's power-of-two scale, and
//! rows packed as the matrix tier's f16 operands under it. What the
//! start-up checks feed the kernels, and what the tests hold them to.

/// The range rule's scale of a row whose largest magnitude is `largest`
/// (range_rule.wgsl: the power of two bringing it into [2¹³, 2¹⁴); 1 for 0).
pub fn range_scale(largest: f32) -> f32 {
    if largest == 0.0 {
        return 1.0;
    }
    // frexp's exponent: largest = m·2^e with m in [0.5, 1).
    let e = largest.log2().floor() as i32 + 1;
    2f32.powi(e - 14)
}

/// `rows` rows of `k` values as the matrix tier's f16 rows: each value times
/// the inverse of its row's range scale, rounded to f16 (ties to even), two a
/// word; and the scales.
pub fn pack_rows(x: &[f32], rows: usize, k: usize) -> (Vec<u32>, Vec<f32>) {
    let mut words = Vec::with_capacity(rows * k / 2);
    let mut scales = Vec::with_capacity(rows);
    for row in x.chunks(k).take(rows) {
        let scale = range_scale(row.iter().fold(0f32, |m, v| m.max(v.abs())));
        let inverse = 1.0 / scale;
        let half = |v: f32| half::f16::from_f32(v * inverse).to_bits() as u32;
        words.extend(row.chunks(2).map(|p| half(p[0]) | half(p[1]) << 16));
        scales.push(scale);
    }
    (words, scales)
}

/// The values packed rows stand for: each f16 widened times its row's scale (`k` values a row).
pub fn unpack_rows(words: &[u32], scales: &[f32], k: usize) -> Vec<f32> {
    let half = |bits: u32| half::f16::from_bits(bits as u16).to_f32();
    words.iter().enumerate().flat_map(|(i, w)| {
        let s = scales[2 * i / k];
        [half(*w & 0xffff) * s, half(*w >> 16) * s]
    }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_pack_under_their_scale_and_unpack_to_what_they_stand_for() {
        assert_eq!((range_scale(0.0), range_scale(1.0), range_scale(16384.0)), (1.0, 2f32.powi(-13), 2.0));
        let x = [1.0, -3.0, 0.5, 0.25, 1e6, 2e6];
        let (words, scales) = pack_rows(&x, 3, 2);
        assert_eq!(scales, [range_scale(3.0), range_scale(0.5), range_scale(2e6)]);
        // Powers of two and small integers times them are exact in f16.
        assert_eq!(unpack_rows(&words, &scales, 2)[..4], x[..4]);
        // Past f16's range: scaled by 2⁷, rounded to f16's spacing there (4 and 8), scaled back.
        assert_eq!(unpack_rows(&words, &scales, 2)[4..], [999_936.0, 1_999_872.0]);
    }
}
