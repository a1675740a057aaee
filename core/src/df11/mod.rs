//! DFloat11 (DF11): the official losslessly compressed bf16 format (pip `dfloat11` 0.5.0,
//! spec/df11.md), read and written bit-exactly.
//!
//! A bf16 word is split into its 8-bit exponent, Huffman coded, and one raw byte holding the
//! sign and the 7 mantissa bits. One *group* (a matched module: a transformer block, or a lone
//! linear) holds the weights of one or more linears, concatenated, in six tensors; see
//! [`Df11Field`]. [`Df11Group`] is a checked, borrowed view of them and decodes on the CPU
//! exactly as the official CUDA kernel does, one 4 KiB block of code bytes at a time so a
//! caller can spread blocks over threads. With the `alloc` feature, [`Df11GroupBuf`] encodes
//! bf16 weights into a group the official loader accepts, with the official code book.

mod decode;
mod error;
mod group;
pub mod layout;

#[cfg(feature = "alloc")]
mod codebook;
#[cfg(feature = "alloc")]
mod encode;

#[cfg(test)]
mod tests;

pub use decode::BlockOutputs;
pub use error::Df11Error;
pub use group::{Df11Fields, Df11Group};

#[cfg(feature = "alloc")]
pub use codebook::{Code, Codebook};
#[cfg(feature = "alloc")]
pub use encode::{exponent_histogram, Df11GroupBuf};

/// Code bytes one kernel thread starts codes in.
pub const BYTES_PER_THREAD: usize = 8;
/// Threads per kernel block (`dfloat11_config.threads_per_block`).
pub const THREADS_PER_BLOCK: usize = 512;
/// Code bytes per kernel block: `output_positions` has one entry per block.
pub const BLOCK_BYTES: usize = BYTES_PER_THREAD * THREADS_PER_BLOCK;
/// Bytes of `gaps` per block: one 5-bit start offset per thread.
pub const GAP_BYTES_PER_BLOCK: usize = THREADS_PER_BLOCK * 5 / 8;
/// The longest code the kernel can decode: four 8-bit table lookups.
pub const MAX_CODE_LEN: u8 = 32;
/// Decode-table values from here up are pointers to sub-table `256 - value`, so exponents
/// must stay below and there are at most 16 sub-tables.
pub const POINTER_MIN: u8 = 240;
/// Most `luts` rows: the root table, 16 sub-tables and the code-length row.
pub const MAX_LUT_ROWS: usize = 18;
/// Groups are indexed with the kernel's 32-bit `int`: fewer elements (and code bytes) than this.
pub const MAX_GROUP_LEN: usize = 1 << 31;
/// The `dfloat11_config.version` this codec reads and writes.
pub const FORMAT_VERSION: &str = "0.5.0";

/// The six tensors of a group, stored as `<module path>.<name>` in the safetensors file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Df11Field {
    /// U8 `[n_luts, 256]`: decode tables (row 0 the root), then the code length per exponent.
    Luts,
    /// U8: the MSB-first Huffman bitstream of all exponents.
    EncodedExponent,
    /// U8, one per element: sign in bit 7, mantissa in bits 6..0.
    SignMantissa,
    /// U8: little-endian u32 per block, the index of the first element whose code starts in it.
    OutputPositions,
    /// U8: per thread, the 5-bit offset of the first code starting in its 64 bits, packed MSB-first.
    Gaps,
    /// I64: where each linear after the first starts in the concatenation (empty for one linear).
    SplitPositions,
}

impl Df11Field {
    pub const ALL: [Self; 6] =
        [Self::Luts, Self::EncodedExponent, Self::SignMantissa, Self::OutputPositions, Self::Gaps, Self::SplitPositions];

    /// The tensor name suffix in official files.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Luts => "luts",
            Self::EncodedExponent => "encoded_exponent",
            Self::SignMantissa => "sign_mantissa",
            Self::OutputPositions => "output_positions",
            Self::Gaps => "gaps",
            Self::SplitPositions => "split_positions",
        }
    }
}

impl core::fmt::Display for Df11Field {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// The bf16 word of an element from its exponent and its sign/mantissa byte.
#[inline]
pub fn bf16_from_parts(exponent: u8, sign_mantissa: u8) -> u16 {
    (u16::from(sign_mantissa & 0x80) << 8) | (u16::from(exponent) << 7) | u16::from(sign_mantissa & 0x7f)
}

/// The exponent and the sign/mantissa byte of a bf16 word.
#[inline]
pub fn bf16_parts(word: u16) -> (u8, u8) {
    let [hi, lo] = word.to_be_bytes();
    ((word >> 7) as u8, (hi & 0x80) | (lo & 0x7f))
}
