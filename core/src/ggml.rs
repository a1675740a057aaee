//! GGML's tensor types as GGUF files store them: each type's id, the
//! elements of one block and the bytes that block takes (ggml's
//! `ggml_type_traits`, restated), and FP8 (E4M3) with a per-tensor scale as
//! scaled-FP8 safetensors files store it. The block layouts are read by the
//! device's expansion kernel (`ggml.wgsl`) and by [`expand_into`] here.

/// A GGUF tensor type flux-lite reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    /// Not a GGUF type: one byte a weight (sign, 4 exponent bits biased by
    /// 7, 3 mantissa bits; no infinities), times the tensor's scale.
    F8E4M3,
}

/// Elements of a K-quant super-block.
pub const QK_K: usize = 256;

impl GgmlType {
    pub const ALL: [GgmlType; 13] = [
        Self::F32,
        Self::F16,
        Self::Bf16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2K,
        Self::Q3K,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
    ];

    /// The type with GGUF id `id`, if flux-lite reads it (FP8 has none).
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The id a GGUF tensor info stores (FP8's, 248, is the expansion
    /// kernel's alone).
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q2K => 10,
            Self::Q3K => 11,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::Bf16 => 30,
            Self::F8E4M3 => 248,
        }
    }

    /// Its name as llama.cpp and gguf-py spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Bf16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::F8E4M3 => "F8_E4M3",
        }
    }

    /// The type named `name` (any case), e.g. `q4_k`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Elements one block holds.
    pub fn block_elements(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::Bf16 | Self::F8E4M3 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 => 32,
            Self::Q2K | Self::Q3K | Self::Q4K | Self::Q5K | Self::Q6K => QK_K,
        }
    }

    /// Bytes one block takes.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
            Self::F8E4M3 => 1,
            // d, then 16 bytes of nibbles
            Self::Q4_0 => 18,
            // d, m, nibbles
            Self::Q4_1 => 20,
            // d, 4 bytes of fifth bits, nibbles
            Self::Q5_0 => 22,
            // d, m, fifth bits, nibbles
            Self::Q5_1 => 24,
            // d, 32 signed bytes
            Self::Q8_0 => 34,
            // 16 scale bytes, 64 bytes of 2-bit values, d, dmin
            Self::Q2K => 84,
            // 32 bytes of high bits, 64 of 2-bit values, 12 of 6-bit scales, d
            Self::Q3K => 110,
            // d, dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles
            Self::Q4K => 144,
            // d, dmin, scales and mins, 32 bytes of fifth bits, nibbles
            Self::Q5K => 176,
            // 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 signed scales, d
            Self::Q6K => 210,
        }
    }

    /// Whether the type is quantized (GGML blocks, or FP8 with its scale):
    /// expanded where it is read, not copied as a float.
    pub fn is_quantized(self) -> bool {
        self.block_elements() > 1 || self == Self::F8E4M3
    }

    /// Bytes of `elements` elements, or `None` when they are not whole
    /// blocks (or their bytes overflow).
    pub fn bytes_of(self, elements: u64) -> Option<u64> {
        let per = self.block_elements() as u64;
        if !elements.is_multiple_of(per) {
            return None;
        }
        (elements / per).checked_mul(self.block_bytes() as u64)
    }
}

/// An IEEE half as f32, exactly.
fn half(b: &[u8], at: usize) -> f32 {
    crate::numerics::f16::to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Q4_K and Q5_K's 6-bit scale (`which` 0) or min (1) of sub-block `j`.
pub fn k4_scale_min(s: &[u8], j: usize, which: usize) -> u32 {
    if j < 4 {
        return (s[j + 4 * which] & 0x3f) as u32;
    }
    let packed = s[8 + j - 4];
    let low = if which == 1 { packed >> 4 } else { packed & 0x0f };
    (low | ((s[j - 4 + 4 * which] >> 2) & 0x30)) as u32
}

/// Q3_K's signed scale of sub-block `i` (0..15).
pub fn k3_scale(s: &[u8], i: usize) -> i32 {
    let low = (s[i & 7] >> (4 * (i >> 3))) & 0x0f;
    let high = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 0x03;
    (low | (high << 4)) as i32 - 32
}

/// Expands whole blocks of `ggml` into `out` (one f32 per element), as
/// gguf-py's `dequantize` computes them and as `ggml.wgsl` does on the
/// device: for the host's few rows (the text encoder's embedding rows).
/// `bytes` holds `out.len() / block_elements` blocks; `scale` multiplies
/// FP8 (GGML types carry their own).
pub fn expand_into(ggml: GgmlType, scale: f32, bytes: &[u8], out: &mut [f32]) {
    let (be, bb) = (ggml.block_elements(), ggml.block_bytes());
    for (block, y) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        expand_block(ggml, block, y);
        if ggml == GgmlType::F8E4M3 {
            y[0] *= scale;
        }
    }
}

/// An FP8 E4M3 byte (`float8_e4m3fn`) as f32, exactly.
pub fn f8_e4m3_to_f32(b: u8) -> f32 {
    let sign = ((b & 0x80) as u32) << 24;
    let (e, m) = (((b >> 3) & 0x0f) as u32, (b & 0x07) as u32);
    let bits = match (e, m) {
        (0x0f, 0x07) => sign | 0x7fc0_0000,
        (0, 0) => sign,
        // Subnormal: m · 2⁻⁹, normalised into f32's range.
        (0, _) => {
            let shift = m.leading_zeros() - 28;
            sign | ((121 - shift) << 23) | ((m << shift) & 0x07) << 20
        }
        _ => sign | ((e + 120) << 23) | (m << 20),
    };
    f32::from_bits(bits)
}

fn expand_block(ggml: GgmlType, b: &[u8], y: &mut [f32]) {
    let nibble = |qs: &[u8], l: usize| ((qs[l & 15] >> (4 * (l >> 4))) & 0x0f) as u32;
    match ggml {
        GgmlType::F32 => y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => y[0] = half(b, 0),
        GgmlType::Bf16 => y[0] = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16),
        GgmlType::F8E4M3 => y[0] = f8_e4m3_to_f32(b[0]),
        GgmlType::Q8_0 => {
            let d = half(b, 0);
            for (l, v) in y.iter_mut().enumerate() {
                *v = (b[2 + l] as i8) as f32 * d;
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let with_min = matches!(ggml, GgmlType::Q4_1 | GgmlType::Q5_1);
            let fifth = matches!(ggml, GgmlType::Q5_0 | GgmlType::Q5_1);
            let d = half(b, 0);
            let m = if with_min { half(b, 2) } else { 0.0 };
            let qh_at = if with_min { 4 } else { 2 };
            let qh = u32::from_le_bytes([b[qh_at], b[qh_at + 1], b[qh_at + 2], b[qh_at + 3]]);
            let qs = &b[qh_at + if fifth { 4 } else { 0 }..];
            for (l, v) in y.iter_mut().enumerate() {
                let mut q = nibble(qs, l);
                if fifth {
                    q |= ((qh >> l) & 1) << 4;
                }
                *v = if with_min { d * q as f32 + m } else { d * (q as i32 - if fifth { 16 } else { 8 }) as f32 };
            }
        }
        GgmlType::Q2K => {
            let (d, dmin) = (half(b, 80), half(b, 82));
            for (i, v) in y.iter_mut().enumerate() {
                let sc = b[i / 16];
                let (dl, ml) = (d * (sc & 0x0f) as f32, dmin * (sc >> 4) as f32);
                let q = (b[16 + 32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
                *v = dl * q as f32 - ml;
            }
        }
        GgmlType::Q3K => {
            let d = half(b, 108);
            for (i, v) in y.iter_mut().enumerate() {
                let dl = d * k3_scale(&b[96..108], i / 16) as f32;
                let low = (b[32 + 32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
                let high = ((b[i % 32] >> (i / 32)) & 1) ^ 1;
                *v = dl * (low as i32 - 4 * high as i32) as f32;
            }
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            let five = ggml == GgmlType::Q5K;
            let qs = if five { 48 } else { 16 };
            for (i, v) in y.iter_mut().enumerate() {
                let r = i / 32;
                let d = half(b, 0) * k4_scale_min(&b[4..16], r, 0) as f32;
                let dm = half(b, 2) * k4_scale_min(&b[4..16], r, 1) as f32;
                let mut q = ((b[qs + 32 * (r / 2) + i % 32] >> (4 * (r % 2))) & 0x0f) as u32;
                if five {
                    q |= (((b[16 + i % 32] >> r) & 1) as u32) << 4;
                }
                *v = d * q as f32 - dm;
            }
        }
        GgmlType::Q6K => {
            let d = half(b, 208);
            for (i, v) in y.iter_mut().enumerate() {
                let (h, r) = (i / 128, i % 128);
                let low = (b[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
                let high = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
                let dl = d * (b[192 + i / 16] as i8) as f32;
                *v = dl * ((low | (high << 4)) as i32 - 32) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(&t.name().to_ascii_lowercase()), Some(t));
        }
        assert_eq!(GgmlType::from_id(9), None, "Q8_1 is not a storage type flux-lite reads");
        assert_eq!(GgmlType::from_id(GgmlType::F8E4M3.id()), None, "FP8 is no GGUF type");
    }

    #[test]
    fn bits_per_weight_are_ggmls() {
        // ggml's advertised sizes: Q4_K 4.5 bits, Q6_K 6.5625, Q2_K 2.625, Q8_0 8.5.
        let bits = |t: GgmlType| t.block_bytes() as f64 * 8.0 / t.block_elements() as f64;
        assert_eq!(bits(GgmlType::Q4K), 4.5);
        assert_eq!(bits(GgmlType::Q6K), 6.5625);
        assert_eq!(bits(GgmlType::Q2K), 2.625);
        assert_eq!(bits(GgmlType::Q3K), 3.4375);
        assert_eq!(bits(GgmlType::Q5K), 5.5);
        assert_eq!(bits(GgmlType::Q8_0), 8.5);
        assert_eq!(GgmlType::Q4K.bytes_of(512), Some(288));
        assert_eq!(GgmlType::Q4K.bytes_of(300), None);
        assert_eq!(GgmlType::F32.bytes_of(u64::MAX / 2), None, "overflow is no size");
    }

    #[test]
    fn every_fp8_byte_widens_as_e4m3fn() {
        for b in 0..=255u8 {
            let (e, m) = (((b >> 3) & 0x0f) as i32, (b & 7) as f64);
            let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
            let want = match (e, b & 7) {
                (15, 7) => f64::NAN,
                (0, _) => sign * m * 2f64.powi(-9),
                _ => sign * (1.0 + m / 8.0) * 2f64.powi(e - 7),
            };
            let got = f8_e4m3_to_f32(b);
            if want.is_nan() {
                assert!(got.is_nan(), "{b:#04x}");
            } else {
                assert_eq!(got as f64, want, "{b:#04x}");
            }
        }
        assert_eq!(f8_e4m3_to_f32(0x7e), 448.0, "the largest finite value");
    }
}
