//! Writing a group (spec §2.5–2.7): the bitstream with the official end-of-stream tail, the
//! per-thread gaps and the per-block output positions, as `encode` in `dfloat11_utils.py`.

use super::{
    bf16_parts, Code, Codebook, Df11Error, Df11Field, Df11Fields, Df11Group, BLOCK_BYTES, BYTES_PER_THREAD, MAX_GROUP_LEN,
    POINTER_MIN, THREADS_PER_BLOCK,
};
use alloc::vec::Vec;

const SEGMENT_BITS: u64 = 8 * BYTES_PER_THREAD as u64;
const BLOCK_BITS: u64 = 8 * BLOCK_BYTES as u64;

/// An encoded group that owns its six fields, as the bytes stored in the file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Df11GroupBuf {
    pub luts: Vec<u8>,
    pub encoded_exponent: Vec<u8>,
    pub sign_mantissa: Vec<u8>,
    /// Little-endian u32, `n_blocks + 1` entries.
    pub output_positions: Vec<u8>,
    pub gaps: Vec<u8>,
    /// Little-endian i64, one per linear after the first.
    pub split_positions: Vec<u8>,
}

impl Df11GroupBuf {
    /// Compresses the weights of one group (one slice per linear, each flattened row-major,
    /// in pattern order) with the code book of their exponent histogram, as `compress_model`.
    pub fn encode(weights: &[&[u16]]) -> Result<Self, Df11Error> {
        let codebook = Codebook::from_counts(&exponent_histogram(weights)?)?;
        Self::encode_with(&codebook, weights)
    }

    /// Compresses with a given code book, which must code every exponent the weights use.
    pub fn encode_with(codebook: &Codebook, weights: &[&[u16]]) -> Result<Self, Df11Error> {
        let n = weights.iter().map(|w| w.len()).sum::<usize>();
        if n >= MAX_GROUP_LEN {
            return Err(Df11Error::TooLarge { field: Df11Field::SignMantissa, len: n });
        }
        let mut stream = BitWriter::with_capacity(n / 2);
        let mut sign_mantissa = Vec::with_capacity(n);
        let mut gaps: Vec<u8> = Vec::new();
        let mut positions: Vec<u32> = Vec::new();
        // The official encoder notes, before each code (and before the end-of-stream code), the
        // offset of the first code starting in each new 64-bit segment and the index of the
        // first element starting in each new block. Codes are ≤ 32 bits, so none is skipped.
        let mut mark = |bits: u64, element: usize| {
            if bits / SEGMENT_BITS >= gaps.len() as u64 {
                gaps.push((bits % SEGMENT_BITS) as u8);
            }
            if bits / BLOCK_BITS >= positions.len() as u64 {
                positions.push(element as u32);
            }
        };
        for (element, &word) in weights.iter().flat_map(|w| w.iter()).enumerate() {
            let (exponent, sm) = bf16_parts(word);
            let code = codebook.code(exponent).ok_or(Df11Error::NotInCodebook { exponent, element })?;
            mark(stream.bits, element);
            stream.push(code);
            sign_mantissa.push(sm);
        }
        if stream.pending != 0 {
            mark(stream.bits, n);
            stream.finish_with(codebook.eof());
        }
        positions.push(n as u32);

        let encoded_exponent = stream.bytes;
        if encoded_exponent.len() >= MAX_GROUP_LEN {
            return Err(Df11Error::TooLarge { field: Df11Field::EncodedExponent, len: encoded_exponent.len() });
        }
        let n_blocks = encoded_exponent.len().div_ceil(BLOCK_BYTES);
        // The official file stops at n_blocks entries when the last byte starts no code; the
        // kernel then reads one entry past the end. Padding makes that entry n.
        positions.resize(positions.len().max(n_blocks + 1), n as u32);
        gaps.resize(THREADS_PER_BLOCK * n_blocks, 0);

        let mut split_positions = Vec::with_capacity(8 * weights.len().saturating_sub(1));
        let mut end = 0i64;
        for w in weights.iter().take(weights.len().saturating_sub(1)) {
            end += w.len() as i64;
            split_positions.extend_from_slice(&end.to_le_bytes());
        }
        Ok(Self {
            luts: codebook.luts().to_vec(),
            encoded_exponent,
            sign_mantissa,
            output_positions: positions.iter().flat_map(|p| p.to_le_bytes()).collect(),
            gaps: pack_gaps(&gaps),
            split_positions,
        })
    }

    pub fn fields(&self) -> Df11Fields<'_> {
        Df11Fields {
            luts: &self.luts,
            encoded_exponent: &self.encoded_exponent,
            sign_mantissa: &self.sign_mantissa,
            output_positions: &self.output_positions,
            gaps: &self.gaps,
            split_positions: &self.split_positions,
        }
    }

    /// The checked view, for decoding.
    pub fn group(&self) -> Result<Df11Group<'_>, Df11Error> {
        Df11Group::new(self.fields())
    }

    /// Bytes of all six fields together.
    pub fn total_bytes(&self) -> usize {
        self.fields().total_bytes()
    }
}

/// How often each exponent occurs in the weights; an error names the first element whose
/// exponent cannot be coded (≥ 240) or a group of 2^31 elements or more.
pub fn exponent_histogram(weights: &[&[u16]]) -> Result<[u64; 256], Df11Error> {
    let n = weights.iter().map(|w| w.len()).sum::<usize>();
    if n >= MAX_GROUP_LEN {
        return Err(Df11Error::TooLarge { field: Df11Field::SignMantissa, len: n });
    }
    let mut counts = [0u64; 256];
    for &word in weights.iter().flat_map(|w| w.iter()) {
        counts[usize::from(bf16_parts(word).0)] += 1;
    }
    if let Some(exponent) = (POINTER_MIN..=255).find(|&e| counts[usize::from(e)] != 0) {
        let element = weights.iter().flat_map(|w| w.iter()).position(|&w| bf16_parts(w).0 == exponent);
        return Err(Df11Error::UnencodableExponent { exponent, element });
    }
    Ok(counts)
}

/// MSB-first bits into bytes; fewer than 8 bits wait in `acc`.
struct BitWriter {
    bytes: Vec<u8>,
    acc: u64,
    pending: u32,
    /// Bits pushed so far (the end-of-stream code not included).
    bits: u64,
}

impl BitWriter {
    fn with_capacity(bytes: usize) -> Self {
        Self { bytes: Vec::with_capacity(bytes), acc: 0, pending: 0, bits: 0 }
    }

    fn push(&mut self, code: Code) {
        // pending < 8 and len ≤ 32, so the accumulator never holds more than 39 bits.
        self.acc = (self.acc << code.len) | u64::from(code.bits);
        self.pending += u32::from(code.len);
        self.bits += u64::from(code.len);
        while self.pending >= 8 {
            self.pending -= 8;
            self.bytes.push((self.acc >> self.pending) as u8);
        }
        self.acc &= (1 << self.pending) - 1;
    }

    /// The official tail: append the end-of-stream code and keep only the next byte (its
    /// first bits, zero-padded if the whole code fits).
    fn finish_with(&mut self, eof: Code) {
        let acc = (self.acc << eof.len) | u64::from(eof.bits);
        let len = self.pending + u32::from(eof.len);
        let byte = if len >= 8 { acc >> (len - 8) } else { acc << (8 - len) };
        self.bytes.push(byte as u8);
        self.acc = 0;
        self.pending = 0;
    }
}

/// 5 bits per thread, MSB-first (`np.packbits` of the bits); 512 threads fill 320 bytes.
fn pack_gaps(gaps: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(gaps.len() * 5 / 8 + 1);
    let (mut acc, mut pending) = (0u32, 0u32);
    for &gap in gaps {
        acc = (acc << 5) | u32::from(gap & 31);
        pending += 5;
        if pending >= 8 {
            pending -= 8;
            out.push((acc >> pending) as u8);
            acc &= (1 << pending) - 1;
        }
    }
    if pending > 0 {
        out.push((acc << (8 - pending)) as u8);
    }
    out
}
