//! The official code book (spec §2.2–2.4): a Huffman code over the exponents plus an
//! end-of-stream symbol, limited to 32 bits, and its lookup tables.
//!
//! dahuffman 0.4.2 keeps a heap of `(weight, [(symbol, code), ...])` and breaks weight ties by
//! comparing the lists, i.e. by their first symbols, with its EOF smaller than any exponent. A
//! merged node's list starts with the list of the node popped first, so every node is ordered
//! by `(weight, first leaf)`, a total order: the merge sequence does not depend on the heap's
//! internals and a `BinaryHeap` reproduces it. The node popped first gets bit 0.

use super::{Df11Error, MAX_CODE_LEN, MAX_LUT_ROWS, POINTER_MIN};
use alloc::collections::BinaryHeap;
use alloc::vec;
use alloc::vec::Vec;
use core::cmp::Reverse;

/// A prefix code: the low `len` bits of `bits`, most significant first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Code {
    pub len: u8,
    pub bits: u32,
}

/// The code of every exponent in use, the end-of-stream code, and the `luts` tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Codebook {
    codes: [Code; 256],
    eof: Code,
    luts: Vec<u8>,
}

impl Codebook {
    /// The official code book for an exponent histogram (exponents with count 0 get no code).
    pub fn from_counts(counts: &[u64; 256]) -> Result<Self, Df11Error> {
        if let Some(exponent) = (POINTER_MIN..=255).find(|&e| counts[usize::from(e)] != 0) {
            return Err(Df11Error::UnencodableExponent { exponent, element: None });
        }
        let (codes, eof) = limited_codes(counts).ok_or(Df11Error::Empty)?;
        let luts = build_luts(&codes)?;
        Ok(Self { codes, eof, luts })
    }

    /// The code of `exponent`, if it has one.
    pub fn code(&self, exponent: u8) -> Option<Code> {
        let code = self.codes[usize::from(exponent)];
        (code.len != 0).then_some(code)
    }

    /// The end-of-stream code; only its first bits are ever written (spec §2.5).
    pub fn eof(&self) -> Code {
        self.eof
    }

    /// The longest code, the end-of-stream code included (≤ 32).
    pub fn max_len(&self) -> u8 {
        self.codes.iter().map(|c| c.len).max().unwrap_or(0).max(self.eof.len)
    }

    /// The `luts` tensor, `[n_luts, 256]` row-major.
    pub fn luts(&self) -> &[u8] {
        &self.luts
    }
}

/// Leaf ids: the exponent itself, and this one for the end-of-stream symbol.
const EOF: usize = 256;
const LEAVES: usize = 257;

/// Codes for the histogram, capped at 32 bits by the official heuristic (`get_32bit_codec`):
/// if plain Huffman is deeper, rebuild from the original counts with the k rarest exponents
/// set to 1, k = 2, 3, ..., until it fits. `None` when no exponent has a count.
fn limited_codes(counts: &[u64; 256]) -> Option<([Code; 256], Code)> {
    let mut rarest: Vec<usize> = (0..256).filter(|&e| counts[e] != 0).collect();
    if rarest.is_empty() {
        return None;
    }
    if let Some(codes) = huffman(counts, MAX_CODE_LEN) {
        return Some(codes);
    }
    // The official code picks the k smallest with numpy's argpartition, whose choice among
    // equal counts at the cut is unspecified (and CPU-dependent); equal counts go to the lower
    // exponent here. Only that tie can make our code book differ from an official one.
    rarest.sort_by_key(|&e| (counts[e], e));
    for k in 2..=rarest.len() {
        let mut flattened = *counts;
        for &e in &rarest[..k] {
            flattened[e] = 1;
        }
        if let Some(codes) = huffman(&flattened, MAX_CODE_LEN) {
            return Some(codes);
        }
    }
    // With every count 1 the tree is balanced (≤ 9 levels), so the loop always returns.
    None
}

/// dahuffman's code for `counts` plus an EOF of weight 1, or `None` if a code would be longer
/// than `max_len` bits (codes past 32 bits are meaningless but their lengths are right).
fn huffman(counts: &[u64; 256], max_len: u8) -> Option<([Code; 256], Code)> {
    // Heap entries: (weight, rank of the first leaf, node). EOF ranks below every exponent.
    // Node ids below LEAVES are leaves; internal node i is `children[i - LEAVES]`.
    let mut heap = BinaryHeap::new();
    heap.push(Reverse((1u128, 0u16, EOF)));
    for (e, &count) in counts.iter().enumerate() {
        if count != 0 {
            heap.push(Reverse((u128::from(count), e as u16 + 1, e)));
        }
    }
    let mut children: Vec<[usize; 2]> = Vec::with_capacity(LEAVES);
    while heap.len() > 1 {
        let (Some(Reverse((wa, rank, a))), Some(Reverse((wb, _, b)))) = (heap.pop(), heap.pop()) else { break };
        children.push([a, b]);
        heap.push(Reverse((wa + wb, rank, LEAVES + children.len() - 1)));
    }
    let Reverse((_, _, root)) = heap.pop()?;

    let mut codes = [Code::default(); 256];
    let mut eof = Code::default();
    // Depth-first from the root; a path deeper than `max_len` rejects the whole code.
    let mut stack = vec![(root, 0u8, 0u32)];
    while let Some((node, len, bits)) = stack.pop() {
        if node < LEAVES {
            let code = Code { len, bits };
            if node == EOF {
                eof = code;
            } else {
                codes[node] = code;
            }
            continue;
        }
        if len >= max_len {
            return None;
        }
        let [zero, one] = children[node - LEAVES];
        stack.push((zero, len + 1, bits << 1));
        stack.push((one, len + 1, (bits << 1) | 1));
    }
    Some((codes, eof))
}

/// The decode tables and length row of spec §2.4 (`get_luts`).
///
/// Tables are the code's prefixes of 0, 8, 16 and 24 bits that some exponent's code extends
/// past the next byte boundary, ordered by length then value (the official order: first
/// appearance in code order, stably sorted by length). In a table, an exponent whose code ends
/// within the next byte owns the keys that start with its remaining bits; a longer code puts a
/// pointer `256 - table` under its next byte. Keys without an entry repeat the value before
/// them; a table's leading keys repeat the previous table's last value (the official loop
/// carries it over), and the root's repeat its first entry (where the official code fails).
fn build_luts(codes: &[Code; 256]) -> Result<Vec<u8>, Df11Error> {
    let mut prefixes: Vec<(u8, u32)> = vec![(0, 0)];
    for code in codes.iter().filter(|c| c.len != 0) {
        for level in 1..=(code.len - 1) / 8 {
            prefixes.push((8 * level, prefix(*code, 8 * level)));
        }
    }
    prefixes.sort_unstable();
    prefixes.dedup();
    let tables = prefixes.len();
    if tables + 1 > MAX_LUT_ROWS {
        return Err(Df11Error::TooManyTables { tables: tables - 1 });
    }

    let mut luts = vec![0u8; 256 * (tables + 1)];
    let mut carried = None;
    for (table, &(plen, pbits)) in prefixes.iter().enumerate() {
        let mut entries = [None; 256];
        for (exponent, code) in codes.iter().enumerate() {
            if code.len <= plen || prefix(*code, plen) != pbits {
                continue;
            }
            let rest = code.len - plen;
            let (key, value) = if rest <= 8 {
                ((low_bits(*code, rest) << (8 - rest)) as usize, exponent as u8)
            } else {
                let next = prefix(*code, plen + 8);
                let index = prefixes.binary_search(&(plen + 8, next)).unwrap_or(0);
                ((next & 0xff) as usize, (256 - index) as u8)
            };
            entries[key] = Some(value);
        }
        let row = &mut luts[256 * table..256 * (table + 1)];
        let mut value = carried.or_else(|| entries.iter().flatten().next().copied()).unwrap_or(0);
        for (slot, entry) in row.iter_mut().zip(entries) {
            value = entry.unwrap_or(value);
            *slot = value;
        }
        carried = Some(value);
    }
    let lengths = &mut luts[256 * tables..];
    for (slot, code) in lengths.iter_mut().zip(codes) {
        *slot = code.len;
    }
    Ok(luts)
}

/// The first `len` bits of `code` (`len` ≤ `code.len`).
fn prefix(code: Code, len: u8) -> u32 {
    (u64::from(code.bits) >> (code.len - len)) as u32
}

/// The last `len` bits of `code` (1 ≤ `len` ≤ 8).
fn low_bits(code: Code, len: u8) -> u32 {
    code.bits & ((1 << len) - 1)
}

/// The longest code of plain (uncapped) Huffman, EOF included; `None` past 254 bits.
#[cfg(test)]
pub(super) fn uncapped_max_len(counts: &[u64; 256]) -> Option<u8> {
    let (codes, eof) = huffman(counts, u8::MAX)?;
    codes.iter().map(|c| c.len).max().map(|m| m.max(eof.len))
}
