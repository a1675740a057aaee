//! The official kernel (spec §3) on the CPU. Each kernel thread owns 64 bits of the stream:
//! it starts at its 5-bit gap and decodes every code that *starts* in those bits, reading up
//! to 32 bits ahead; a block's threads get consecutive element indices from a prefix sum that
//! starts at `output_positions[block]`, and only indices below `output_positions[block + 1]`
//! (and `n_elements`) are written. Since thread `t + 1` starts at the element where thread `t`
//! stopped, one walk over the threads in order gives the same indices without the scan.
//! Bits past the end of the stream read as zero (the kernel reads uninitialised registers);
//! whatever they decode to lands past the clamp, as in the kernel.

use super::{bf16_from_parts, Df11Error, Df11Group, BYTES_PER_THREAD, POINTER_MIN, THREADS_PER_BLOCK};

const SEGMENT_BITS: usize = 8 * BYTES_PER_THREAD;

impl<'a> Df11Group<'a> {
    /// Decodes the whole group into `out`, one bf16 word per element.
    pub fn decode_into(&self, out: &mut [u16]) -> Result<(), Df11Error> {
        for (block, words) in self.split_output(out)? {
            self.decode_block_unchecked(block, words);
        }
        Ok(())
    }

    /// Decodes block `block` into `out`, which holds exactly the block's elements,
    /// [`Df11Group::block_output_range`]. Blocks are independent: decode them in any order or
    /// in parallel.
    pub fn decode_block_into(&self, block: usize, out: &mut [u16]) -> Result<(), Df11Error> {
        let range = self.block_output_range(block).ok_or(Df11Error::BlockIndex { block, n_blocks: self.n_blocks })?;
        if out.len() != range.len() {
            return Err(Df11Error::OutputLength { len: out.len(), expected: range.len() });
        }
        self.decode_block_unchecked(block, out);
        Ok(())
    }

    /// Cuts `out` (one word per element of the group) into the disjoint pieces each block
    /// writes, as `(block, piece)` pairs for [`Df11Group::decode_block_into`]; collected into a
    /// `Vec`, they can go to a thread pool.
    pub fn split_output<'o>(&self, out: &'o mut [u16]) -> Result<BlockOutputs<'a, 'o>, Df11Error> {
        if out.len() != self.n_elements() {
            return Err(Df11Error::OutputLength { len: out.len(), expected: self.n_elements() });
        }
        Ok(BlockOutputs { group: *self, rest: out, block: 0 })
    }

    /// `out` is exactly the block's output range (checked by the callers).
    fn decode_block_unchecked(&self, block: usize, out: &mut [u16]) {
        let base = self.position(block);
        let sign_mantissa = self.fields.sign_mantissa.get(base..base + out.len()).unwrap_or_default();
        let mut written = 0;
        let first_thread = block * THREADS_PER_BLOCK;
        'threads: for thread in first_thread..first_thread + THREADS_PER_BLOCK {
            let segment_end = (thread + 1) * SEGMENT_BITS;
            let mut pos = thread * SEGMENT_BITS + self.gap(thread);
            while pos < segment_end {
                let (exponent, length) = self.decode_one(self.peek32(pos));
                if length == 0 {
                    // Four lookups ended on a pointer: only garbage bits get here, and the
                    // kernel would spin forever (it shifts by 0). Drop the rest of the thread.
                    continue 'threads;
                }
                let (Some(slot), Some(&sm)) = (out.get_mut(written), sign_mantissa.get(written)) else {
                    break 'threads;
                };
                *slot = bf16_from_parts(exponent, sm);
                written += 1;
                pos += usize::from(length);
            }
        }
        // Only possible when the positions disagree with the bitstream: the kernel would leave
        // these words as whatever its shared memory held. Zero is at least deterministic.
        if let Some(rest) = out.get_mut(written..) {
            rest.fill(0);
        }
    }

    /// Thread `thread`'s 5-bit start offset. The last thread of a file's last block reads one
    /// byte past `gaps` (always with a shift that discards it), so a missing byte reads as 0.
    #[inline]
    fn gap(&self, thread: usize) -> usize {
        let gaps = self.fields.gaps;
        let j = thread * 5 / 8;
        let hi = gaps.get(j).copied().unwrap_or(0);
        let lo = gaps.get(j + 1).copied().unwrap_or(0);
        let pair = u16::from_be_bytes([hi, lo]);
        usize::from((pair >> (11 - thread * 5 % 8)) & 31)
    }

    /// The 32 stream bits from bit `pos` on, MSB first, zero past the end.
    #[inline]
    fn peek32(&self, pos: usize) -> u32 {
        let codes = self.fields.encoded_exponent;
        let byte = pos / 8;
        let shift = pos % 8;
        let window = match codes.get(byte..).and_then(<[u8]>::first_chunk::<8>) {
            Some(bytes) => u64::from_be_bytes(*bytes),
            None => {
                let mut bytes = [0; 8];
                for (dst, src) in bytes.iter_mut().zip(codes.get(byte..).unwrap_or_default()) {
                    *dst = *src;
                }
                u64::from_be_bytes(bytes)
            }
        };
        ((window << shift) >> 32) as u32
    }

    /// The exponent the code at the top of `bits` stands for and its length; up to four
    /// table lookups, one per byte, exactly as the kernel. A length of 0 means the walk
    /// ended on a pointer (`new` checks that pointer values have no length).
    #[inline]
    fn decode_one(&self, bits: u32) -> (u8, u8) {
        let luts = self.fields.luts;
        let [b0, b1, b2, b3] = bits.to_be_bytes();
        let mut value = luts[usize::from(b0)];
        for byte in [b1, b2, b3] {
            if value < POINTER_MIN {
                break;
            }
            // `new` checked that every pointer names an existing table.
            value = luts[256 * (256 - usize::from(value)) + usize::from(byte)];
        }
        let lengths = 256 * (self.n_luts() - 1);
        (value, luts[lengths + usize::from(value)])
    }
}

/// The output pieces of a group's blocks, from [`Df11Group::split_output`].
#[derive(Debug)]
pub struct BlockOutputs<'g, 'o> {
    group: Df11Group<'g>,
    rest: &'o mut [u16],
    block: usize,
}

impl<'o> Iterator for BlockOutputs<'_, 'o> {
    type Item = (usize, &'o mut [u16]);

    fn next(&mut self) -> Option<Self::Item> {
        let block = self.block;
        let len = self.group.block_output_range(block)?.len();
        // Ranges are contiguous and cover every element (checked in `new`), so `len` fits.
        let rest = core::mem::take(&mut self.rest);
        let (piece, rest) = rest.split_at_mut(len.min(rest.len()));
        self.rest = rest;
        self.block += 1;
        Some((block, piece))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.group.n_blocks().saturating_sub(self.block);
        (left, Some(left))
    }
}

impl ExactSizeIterator for BlockOutputs<'_, '_> {}
