//! bf16 as stored in safetensors (little-endian u16 words) and as the shaders
//! read it (pairs packed in a u32, element `i` in the low half when `i` is even).

/// Widen a bf16 bit pattern to f32 (exact).
pub fn to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Round an f32 to the nearest bf16, ties to even (as torch's `.to(bfloat16)`).
pub fn from_f32(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// Round an f32 through bf16 and back.
pub fn round(x: f32) -> f32 {
    to_f32(from_f32(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_nearest_even_like_torch() {
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
        assert_eq!(round(1.0 + 1.0 / 256.0), 1.0);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
        assert_eq!(round(1.0 + 3.0 / 256.0), 1.0 + 1.0 / 64.0);
        assert_eq!(to_f32(from_f32(-2.5)), -2.5);
        assert_eq!(from_f32(1.0), 0x3f80);
    }
}
