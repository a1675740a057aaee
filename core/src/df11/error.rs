use super::{Df11Field, MAX_CODE_LEN, MAX_LUT_ROWS};
use core::fmt;

/// Why a group was rejected, or why it could not be decoded into a buffer or encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Df11Error {
    /// `luts` is not 2..=18 rows of 256 bytes.
    LutShape { len: usize },
    /// A decode-table entry is a pointer (240..=255) to a table that does not exist.
    BadPointer { table: usize, key: u8, value: u8, tables: usize },
    /// An exponent the decode tables produce has a code length outside 1..=32.
    CodeLength { exponent: u8, length: u8 },
    /// The length row gives a length to a pointer value (240..=255), which is never an exponent.
    PointerLength { value: u8, length: u8 },
    /// `sign_mantissa` (one byte per element) or `encoded_exponent` reaches 2^31.
    TooLarge { field: Df11Field, len: usize },
    /// `output_positions` is not 4 bytes for each of `n_blocks` or `n_blocks + 1` entries.
    PositionsLength { len: usize, n_blocks: usize },
    /// The first output position is not 0.
    FirstPosition { value: usize },
    /// Output position `index` is smaller than the one before it.
    PositionsDecrease { index: usize, value: usize, previous: usize },
    /// The last output position (given or implied) is not the number of elements.
    LastPosition { value: usize, n_elements: usize },
    /// `gaps` has fewer than 320 bytes per block.
    GapsLength { len: usize, needed: usize },
    /// `split_positions` is not a whole number of i64 values.
    SplitPositionsLength { len: usize },
    /// Split position `index` is negative, smaller than the one before, or past the last element.
    SplitPosition { index: usize, value: i64, n_elements: usize },
    /// The output buffer does not have one word per element of the group (or of the block).
    OutputLength { len: usize, expected: usize },
    /// The group has no such block.
    BlockIndex { block: usize, n_blocks: usize },
    /// Encoding: an exponent of 240 or more (|x| ≥ 2^113, inf or NaN) reads back as a pointer.
    /// `element` is its index in the concatenated weights, or `None` when it came from counts.
    UnencodableExponent { exponent: u8, element: Option<usize> },
    /// Encoding: the weights use an exponent that has no code in the given code book.
    NotInCodebook { exponent: u8, element: usize },
    /// Encoding: nothing to encode (the official encoder fails on an empty group too).
    Empty,
    /// Encoding: the code needs more than 16 sub-tables; the format has pointers for 16.
    TooManyTables { tables: usize },
}

impl fmt::Display for Df11Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Df11Field as F;
        match *self {
            Self::LutShape { len } => {
                write!(f, "DF11 {}: {len} bytes is not 2..={MAX_LUT_ROWS} rows of 256 bytes", F::Luts)
            }
            Self::BadPointer { table, key, value, tables } => write!(
                f,
                "DF11 {}: table {table} entry {key} points to table {}, but there are {tables} decode tables",
                F::Luts,
                256 - usize::from(value)
            ),
            Self::CodeLength { exponent, length } => write!(
                f,
                "DF11 {}: exponent {exponent} appears in the decode tables with code length {length} (must be 1..={MAX_CODE_LEN})",
                F::Luts
            ),
            Self::PointerLength { value, length } => {
                write!(f, "DF11 {}: the length row gives {length} bits to pointer value {value} (must be 0)", F::Luts)
            }
            Self::TooLarge { field, len } => write!(f, "DF11 {field}: {len} bytes, the format allows fewer than 2^31"),
            Self::PositionsLength { len, n_blocks } => write!(
                f,
                "DF11 {}: {len} bytes is not {n_blocks} or {} little-endian u32 entries for the {n_blocks} 4096-byte blocks of {}",
                F::OutputPositions,
                n_blocks + 1,
                F::EncodedExponent
            ),
            Self::FirstPosition { value } => write!(f, "DF11 {}: the first entry is {value}, not 0", F::OutputPositions),
            Self::PositionsDecrease { index, value, previous } => {
                write!(f, "DF11 {}: entry {index} ({value}) is smaller than the one before ({previous})", F::OutputPositions)
            }
            Self::LastPosition { value, n_elements } => write!(
                f,
                "DF11 {}: the last entry is {value}, not the number of elements ({n_elements}, the bytes of {})",
                F::OutputPositions,
                F::SignMantissa
            ),
            Self::GapsLength { len, needed } => write!(f, "DF11 {}: {len} bytes, at least {needed} needed", F::Gaps),
            Self::SplitPositionsLength { len } => {
                write!(f, "DF11 {}: {len} bytes is not a whole number of i64 values", F::SplitPositions)
            }
            Self::SplitPosition { index, value, n_elements } => write!(
                f,
                "DF11 {}: entry {index} ({value}) is negative, decreasing or past the {n_elements} elements",
                F::SplitPositions
            ),
            Self::OutputLength { len, expected } => {
                write!(f, "DF11 decode: the output holds {len} words, the group or block has {expected}")
            }
            Self::BlockIndex { block, n_blocks } => write!(f, "DF11 decode: block {block} of a group of {n_blocks} blocks"),
            Self::UnencodableExponent { exponent, element: Some(i) } => write!(
                f,
                "DF11 encode: element {i} has exponent {exponent} (inf, NaN or |x| ≥ 2^113); only 0..=239 can be coded"
            ),
            Self::UnencodableExponent { exponent, element: None } => {
                write!(f, "DF11 encode: exponent {exponent} has a count; only 0..=239 can be coded")
            }
            Self::NotInCodebook { exponent, element } => {
                write!(f, "DF11 encode: element {element} has exponent {exponent}, which the code book does not code")
            }
            Self::Empty => write!(f, "DF11 encode: the group has no elements"),
            Self::TooManyTables { tables } => {
                write!(f, "DF11 encode: the code needs {tables} sub-tables, the format has pointers for 16")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for Df11Error {}
