//! `decode.cu` modelled phase by phase (spec §3): per block, every thread counts the codes
//! starting in its 64 bits from its 12 register bytes, a prefix sum gives each thread its
//! first element, the threads decode into a staging buffer, and the block copies out the
//! elements below `output_positions[block + 1]` and `n_elements`. The decoder takes shortcuts
//! (one walk per block, no staging); on every input `Df11Group::new` accepts, it must give the
//! same words. Two conventions where the kernel has none: bytes past the stream read as 0
//! (uninitialised registers), and unwritten staging words are 0.

use super::super::{Df11Fields, Df11Group, BLOCK_BYTES, THREADS_PER_BLOCK};
use super::{decode as decode_with_group, Rng};
use crate::df11::Df11GroupBuf;
use proptest::prelude::*;

pub(in crate::df11) fn decode(f: &Df11Fields<'_>) -> Vec<u16> {
    let n = f.sign_mantissa.len();
    let n_bytes = f.encoded_exponent.len();
    let position = |i: usize| match f.output_positions.get(4 * i..4 * i + 4) {
        Some(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize,
        None => n,
    };
    let mut out = vec![0u16; n];
    for block in 0..n_bytes.div_ceil(BLOCK_BYTES) {
        let threads: Vec<Thread> = (0..THREADS_PER_BLOCK).map(|t| Thread::load(f, block * THREADS_PER_BLOCK + t)).collect();
        let counts: Vec<usize> = threads.iter().map(|th| th.walk(f, |_| true)).collect();
        let base = position(block);
        let mut staging = vec![0u16; position(block + 1) - base];
        let mut start = base;
        for (th, &count) in threads.iter().zip(&counts) {
            let end = (start + count).min(n);
            let mut idx = start;
            th.walk(f, |exponent| {
                if idx >= end {
                    return false;
                }
                let sm = f.sign_mantissa[idx];
                let word = (u16::from(sm & 128 | exponent >> 1) << 8) | u16::from(exponent << 7 | sm & 127);
                if let Some(slot) = staging.get_mut(idx - base) {
                    *slot = word;
                }
                idx += 1;
                true
            });
            start += count;
        }
        let copy = position(block + 1).min(n) - base;
        out[base..base + copy].copy_from_slice(&staging[..copy]);
    }
    out
}

struct Thread {
    registers: [u8; 12],
    gap: u32,
}

impl Thread {
    fn load(f: &Df11Fields<'_>, global: usize) -> Self {
        let mut registers = [0; 12];
        for (i, r) in registers.iter_mut().enumerate() {
            *r = f.encoded_exponent.get(global * 8 + i).copied().unwrap_or(0);
        }
        let hi = f.gaps.get(global * 5 / 8).copied().unwrap_or(0);
        let lo = f.gaps.get(global * 5 / 8 + 1).copied().unwrap_or(0);
        let gap = (u32::from(u16::from_le_bytes([lo, hi])) >> (11 - global * 5 % 8)) & 0x1f;
        Self { registers, gap }
    }

    /// The kernel's two loops (before and after the 4 look-ahead bytes join the 64-bit
    /// buffer); `emit` gets each exponent and says whether to go on. Returns the count.
    fn walk(&self, f: &Df11Fields<'_>, mut emit: impl FnMut(u8) -> bool) -> usize {
        let r = &self.registers;
        let mut long = u64::from_be_bytes([r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]]) << self.gap;
        let mut free = self.gap;
        let mut count = 0;
        for phase in 0..2 {
            if phase == 1 {
                long |= u64::from(u32::from_be_bytes([r[8], r[9], r[10], r[11]])) << (free - 32);
                free -= 32;
            }
            while free < 32 {
                let (exponent, length) = lookup(f.luts, long);
                // Length 0: the lookups ended on a pointer; the kernel would spin here.
                if length == 0 || !emit(exponent) {
                    return count;
                }
                count += 1;
                long <<= length;
                free += u32::from(length);
            }
        }
        count
    }
}

fn lookup(luts: &[u8], long: u64) -> (u8, u8) {
    let byte = |shift: u32| ((long >> shift) & 0xff) as usize;
    let mut decoded = luts[byte(56)];
    for shift in [48, 40, 32] {
        if decoded >= 240 {
            decoded = luts[256 * (256 - usize::from(decoded)) + byte(shift)];
        }
    }
    (decoded, luts[luts.len() - 256 + usize::from(decoded)])
}

/// Fields made from raw proptest bytes, forced into a shape `new` accepts: pointers aimed
/// at existing tables, lengths 1..=32 for exponents and 0 for pointers, positions rising
/// from 0 to n, enough gaps. Bitstream, gaps and sign/mantissa bytes stay arbitrary.
fn shaped(raw: &RawGroup) -> Df11GroupBuf {
    let tables = raw.tables;
    let mut luts: Vec<u8> = raw.tables_bytes.iter().take(256 * tables).copied().collect();
    luts.resize(256 * tables, 0);
    for v in &mut luts {
        if *v >= 240 {
            *v = if tables > 1 { (256 - (1 + usize::from(*v) % (tables - 1))) as u8 } else { *v % 240 };
        }
    }
    luts.extend((0..=255u8).map(|v| if v >= 240 { 0 } else { 1 + raw.lengths_seed.wrapping_mul(v) % 32 }));
    let n_blocks = raw.encoded_exponent.len().div_ceil(BLOCK_BYTES);
    // Without code bytes there are no blocks, and only an empty group is consistent.
    let sign_mantissa = if n_blocks == 0 { Vec::new() } else { raw.sign_mantissa.clone() };
    let n = sign_mantissa.len();
    let mut positions: Vec<u32> = raw.cuts.iter().take(n_blocks).map(|&c| (c as usize % (n + 1)) as u32).collect();
    positions.resize(n_blocks, 0);
    positions.sort_unstable();
    if let Some(first) = positions.first_mut() {
        *first = 0;
    }
    if raw.full_positions || n_blocks == 0 {
        positions.push(n as u32);
    }
    let mut gaps = raw.gaps.clone();
    gaps.resize(320 * n_blocks + raw.extra_gaps, 0x55);
    let mut split: Vec<i64> = raw.cuts.iter().skip(n_blocks).take(3).map(|&c| (c as usize % (n + 1)) as i64).collect();
    split.sort_unstable();
    Df11GroupBuf {
        luts,
        encoded_exponent: raw.encoded_exponent.clone(),
        sign_mantissa,
        output_positions: positions.iter().flat_map(|p| p.to_le_bytes()).collect(),
        gaps,
        split_positions: split.iter().flat_map(|p| p.to_le_bytes()).collect(),
    }
}

#[derive(Debug, Clone)]
struct RawGroup {
    tables: usize,
    tables_bytes: Vec<u8>,
    lengths_seed: u8,
    encoded_exponent: Vec<u8>,
    sign_mantissa: Vec<u8>,
    cuts: Vec<u32>,
    full_positions: bool,
    gaps: Vec<u8>,
    extra_gaps: usize,
}

fn raw_group() -> impl Strategy<Value = RawGroup> {
    (
        1usize..=17,
        prop::collection::vec(any::<u8>(), 0..256 * 17),
        any::<u8>(),
        prop::collection::vec(any::<u8>(), 0..3 * BLOCK_BYTES),
        prop::collection::vec(any::<u8>(), 0..20_000),
        prop::collection::vec(any::<u32>(), 0..8),
        any::<bool>(),
        prop::collection::vec(any::<u8>(), 0..1000),
        0usize..3,
    )
        .prop_map(
            |(tables, tables_bytes, lengths_seed, encoded_exponent, sign_mantissa, cuts, full_positions, gaps, extra_gaps)| {
                RawGroup {
                    tables,
                    tables_bytes,
                    lengths_seed: lengths_seed | 1,
                    encoded_exponent,
                    sign_mantissa,
                    cuts,
                    full_positions,
                    gaps,
                    extra_gaps,
                }
            },
        )
}

/// A valid group from our encoder, to mutate.
fn encoded(seed: u64, n: usize, spread: u64) -> Df11GroupBuf {
    let mut rng = Rng::new(seed);
    let exponents: Vec<u8> = (0..n).map(|_| 110 + (rng.below(spread) as u8).min(rng.below(spread) as u8)).collect();
    let w = rng.words_with_exponents(&exponents);
    Df11GroupBuf::encode(&[&w]).expect("encodable")
}

fn field_mut(buf: &mut Df11GroupBuf, field: usize) -> &mut Vec<u8> {
    match field % 6 {
        0 => &mut buf.luts,
        1 => &mut buf.encoded_exponent,
        2 => &mut buf.sign_mantissa,
        3 => &mut buf.output_positions,
        4 => &mut buf.gaps,
        _ => &mut buf.split_positions,
    }
}

fn check_matches_model(buf: &Df11GroupBuf) -> Result<(), TestCaseError> {
    if let Ok(group) = Df11Group::new(buf.fields()) {
        let ours = decode_with_group(&group);
        let model = decode(&buf.fields());
        prop_assert!(ours == model, "decoder and kernel model disagree");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(fields in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..1200), 6)) {
        let buf = Df11GroupBuf {
            luts: fields[0].clone(),
            encoded_exponent: fields[1].clone(),
            sign_mantissa: fields[2].clone(),
            output_positions: fields[3].clone(),
            gaps: fields[4].clone(),
            split_positions: fields[5].clone(),
        };
        check_matches_model(&buf)?;
    }

    #[test]
    fn accepted_garbage_decodes_like_the_kernel(raw in raw_group()) {
        let buf = shaped(&raw);
        prop_assert!(Df11Group::new(buf.fields()).is_ok(), "{:?}", Df11Group::new(buf.fields()).err());
        check_matches_model(&buf)?;
    }

    #[test]
    fn mutated_groups_never_panic(
        seed in any::<u64>(),
        n in 1usize..12_000,
        spread in 2u64..130,
        edits in prop::collection::vec((0usize..6, any::<usize>(), any::<u8>(), 0u8..4), 1..6),
    ) {
        let mut buf = encoded(seed, n, spread);
        for (field, at, value, kind) in edits {
            let v = field_mut(&mut buf, field);
            match kind {
                0 | 1 if !v.is_empty() => {
                    let i = at % v.len();
                    v[i] = value;
                }
                2 => v.truncate(at % (v.len() + 1)),
                _ => v.extend(core::iter::repeat_n(value, at % 300)),
            }
        }
        check_matches_model(&buf)?;
    }
}
