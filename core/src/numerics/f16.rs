//! IEEE binary16 to f32, exactly (GGUF's block scales are halves).

/// The f32 of half `h`: exact for every half, subnormals, infinities and
/// NaNs (payload kept) included.
pub fn to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let (e, m) = ((h >> 10) & 0x1f, h & 0x3ff);
    let bits = match (e, m) {
        (0, 0) => sign,
        // Subnormal: m · 2⁻²⁴, normalised into f32's range.
        (0, _) => {
            let shift = m.leading_zeros() - 21;
            sign | ((113 - shift) << 23) | ((m << shift) & 0x3ff) << 13
        }
        (0x1f, _) => sign | 0x7f80_0000 | (m << 13),
        _ => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_half_widens_as_the_standard_says() {
        for h in 0..=u16::MAX {
            let (e, m) = ((h >> 10) & 0x1f, (h & 0x3ff) as f64);
            let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
            let want = match e {
                0 => sign * m * 2f64.powi(-24),
                0x1f if m == 0.0 => sign * f64::INFINITY,
                0x1f => f64::NAN,
                _ => sign * (1.0 + m / 1024.0) * 2f64.powi(e as i32 - 15),
            };
            let got = to_f32(h);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(got as f64, want, "{h:#06x}");
                assert_eq!(got.is_sign_negative(), h & 0x8000 != 0, "{h:#06x}");
            }
        }
    }
}
