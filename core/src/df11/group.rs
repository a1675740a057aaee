use super::{
    Df11Error, Df11Field, BLOCK_BYTES, GAP_BYTES_PER_BLOCK, MAX_CODE_LEN, MAX_GROUP_LEN, MAX_LUT_ROWS, POINTER_MIN,
};
use core::ops::Range;

/// The six tensors of a group as the bytes stored in the file (see [`Df11Field`]).
/// `output_positions` are little-endian u32 and `split_positions` little-endian i64, taken as
/// bytes so a view can borrow straight from a memory-mapped file whatever its alignment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Df11Fields<'a> {
    pub luts: &'a [u8],
    pub encoded_exponent: &'a [u8],
    pub sign_mantissa: &'a [u8],
    pub output_positions: &'a [u8],
    pub gaps: &'a [u8],
    pub split_positions: &'a [u8],
}

impl<'a> Df11Fields<'a> {
    pub fn get(&self, field: Df11Field) -> &'a [u8] {
        match field {
            Df11Field::Luts => self.luts,
            Df11Field::EncodedExponent => self.encoded_exponent,
            Df11Field::SignMantissa => self.sign_mantissa,
            Df11Field::OutputPositions => self.output_positions,
            Df11Field::Gaps => self.gaps,
            Df11Field::SplitPositions => self.split_positions,
        }
    }

    /// Bytes of all six fields together: the group's size on disk.
    pub fn total_bytes(&self) -> usize {
        Df11Field::ALL.iter().map(|&f| self.get(f).len()).sum()
    }
}

/// A checked view of one DF11 group. [`Df11Group::new`] checks every invariant the decoder
/// relies on, so decoding never reads out of bounds, never panics and always ends.
#[derive(Debug, Clone, Copy)]
pub struct Df11Group<'a> {
    pub(super) fields: Df11Fields<'a>,
    pub(super) n_blocks: usize,
}

impl<'a> Df11Group<'a> {
    pub fn new(fields: Df11Fields<'a>) -> Result<Self, Df11Error> {
        let n_elements = fields.sign_mantissa.len();
        let n_bytes = fields.encoded_exponent.len();
        if n_elements >= MAX_GROUP_LEN {
            return Err(Df11Error::TooLarge { field: Df11Field::SignMantissa, len: n_elements });
        }
        if n_bytes >= MAX_GROUP_LEN {
            return Err(Df11Error::TooLarge { field: Df11Field::EncodedExponent, len: n_bytes });
        }
        check_luts(fields.luts)?;
        let group = Self { fields, n_blocks: n_bytes.div_ceil(BLOCK_BYTES) };
        group.check_positions()?;
        let needed = GAP_BYTES_PER_BLOCK * group.n_blocks;
        if fields.gaps.len() < needed {
            return Err(Df11Error::GapsLength { len: fields.gaps.len(), needed });
        }
        group.check_split_positions()?;
        Ok(group)
    }

    pub fn fields(&self) -> Df11Fields<'a> {
        self.fields
    }

    /// Elements (bf16 words) the group decodes to.
    pub fn n_elements(&self) -> usize {
        self.fields.sign_mantissa.len()
    }

    /// Bytes of the Huffman bitstream.
    pub fn n_bytes(&self) -> usize {
        self.fields.encoded_exponent.len()
    }

    /// 4096-byte blocks of the bitstream: the kernel's grid size, and the units of
    /// [`Df11Group::decode_block_into`].
    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Rows of `luts` (decode tables plus the length row).
    pub fn n_luts(&self) -> usize {
        self.fields.luts.len() / 256
    }

    /// The elements block `block` decodes, or `None` past the last block. The ranges of all
    /// blocks are disjoint, in order, and cover `0..n_elements`.
    pub fn block_output_range(&self, block: usize) -> Option<Range<usize>> {
        (block < self.n_blocks).then(|| self.position(block)..self.position(block + 1))
    }

    /// Where each linear starts after the first, as stored.
    pub fn split_positions(&self) -> impl ExactSizeIterator<Item = usize> + 'a {
        // Checked in `new` to be in 0..=n_elements, which is < 2^31.
        self.fields.split_positions.chunks_exact(8).map(|c| {
            let mut le = [0; 8];
            le.copy_from_slice(c);
            i64::from_le_bytes(le) as usize
        })
    }

    /// The element range of each linear of the group, in order (one range for a lone linear).
    pub fn weight_ranges(&self) -> impl Iterator<Item = Range<usize>> + 'a {
        let n = self.n_elements();
        let mut start = 0;
        self.split_positions().chain(core::iter::once(n)).map(move |end| {
            let range = start..end;
            start = end;
            range
        })
    }

    /// Dynamic shared memory the official kernel launch asks for: 4 bytes per thread plus one,
    /// and 2 bytes per element of the fullest block. CuPy launches without raising the 48 KiB
    /// default limit, so a larger value means the official loader cannot decode this group.
    pub fn official_shared_mem_bytes(&self) -> usize {
        let widest = (0..self.n_blocks).map(|b| self.position(b + 1) - self.position(b)).max().unwrap_or(0);
        super::THREADS_PER_BLOCK * 4 + 4 + 2 * widest
    }

    /// Entry `i` of `output_positions`; the entry after the stored ones is `n_elements` (files
    /// whose last byte starts no code have only `n_blocks` entries, spec §2.7).
    pub(super) fn position(&self, i: usize) -> usize {
        let bytes = self.fields.output_positions;
        match bytes.get(4 * i..4 * i + 4) {
            Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]) as usize,
            _ => self.n_elements(),
        }
    }

    fn check_positions(&self) -> Result<(), Df11Error> {
        let len = self.fields.output_positions.len();
        let entries = len / 4;
        if !len.is_multiple_of(4) || (entries != self.n_blocks && entries != self.n_blocks + 1) {
            return Err(Df11Error::PositionsLength { len, n_blocks: self.n_blocks });
        }
        let first = self.position(0);
        if first != 0 {
            return Err(Df11Error::FirstPosition { value: first });
        }
        let mut previous = first;
        for index in 1..=self.n_blocks {
            let value = self.position(index);
            if value < previous {
                return Err(Df11Error::PositionsDecrease { index, value, previous });
            }
            previous = value;
        }
        if previous != self.n_elements() {
            return Err(Df11Error::LastPosition { value: previous, n_elements: self.n_elements() });
        }
        Ok(())
    }

    fn check_split_positions(&self) -> Result<(), Df11Error> {
        let bytes = self.fields.split_positions;
        if !bytes.len().is_multiple_of(8) {
            return Err(Df11Error::SplitPositionsLength { len: bytes.len() });
        }
        let n_elements = self.n_elements();
        let mut previous = 0;
        for (index, c) in bytes.chunks_exact(8).enumerate() {
            let mut le = [0; 8];
            le.copy_from_slice(c);
            let value = i64::from_le_bytes(le);
            // n_elements < 2^31, so it converts to i64 exactly.
            if value < previous || value > n_elements as i64 {
                return Err(Df11Error::SplitPosition { index, value, n_elements });
            }
            previous = value;
        }
        Ok(())
    }
}

/// Every decode-table value is an exponent whose code length is 1..=32, or a pointer to an
/// existing sub-table (never the root, since `256 - value` ≥ 1); pointer values have no length.
/// Together with the decoder's four-lookup limit this bounds every table walk.
fn check_luts(luts: &[u8]) -> Result<(), Df11Error> {
    let rows = luts.len() / 256;
    if !luts.len().is_multiple_of(256) || !(2..=MAX_LUT_ROWS).contains(&rows) {
        return Err(Df11Error::LutShape { len: luts.len() });
    }
    let tables = rows - 1;
    let (decode, lengths) = luts.split_at(256 * tables);
    for (value, &length) in lengths.iter().enumerate().skip(usize::from(POINTER_MIN)) {
        if length != 0 {
            return Err(Df11Error::PointerLength { value: value as u8, length });
        }
    }
    for (table, row) in decode.chunks_exact(256).enumerate() {
        for (key, &value) in row.iter().enumerate() {
            if value >= POINTER_MIN {
                if 256 - usize::from(value) >= tables {
                    return Err(Df11Error::BadPointer { table, key: key as u8, value, tables });
                }
            } else {
                let length = lengths[usize::from(value)];
                if !(1..=MAX_CODE_LEN).contains(&length) {
                    return Err(Df11Error::CodeLength { exponent: value, length });
                }
            }
        }
    }
    Ok(())
}
