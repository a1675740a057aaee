//! GGML's tensor types as GGUF files store them: each type's id, the
//! elements of one block and the bytes that block takes (ggml's
//! `ggml_type_traits`, restated). The block layouts themselves are read by
//! the device's expansion kernel (`ggml.wgsl`).

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

    /// The type with GGUF id `id`, if flux-lite reads it.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The id a GGUF tensor info stores.
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
        }
    }

    /// The type named `name` (any case), e.g. `q4_k`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Elements one block holds.
    pub fn block_elements(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::Bf16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 => 32,
            Self::Q2K | Self::Q3K | Self::Q4K | Self::Q5K | Self::Q6K => QK_K,
        }
    }

    /// Bytes one block takes.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
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

    /// Whether the type is quantized in blocks (not a plain float).
    pub fn is_quantized(self) -> bool {
        self.block_elements() > 1
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
}
