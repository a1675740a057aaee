use super::super::codebook::uncapped_max_len;
use super::super::{Codebook, Df11GroupBuf, BLOCK_BYTES, GAP_BYTES_PER_BLOCK};
use super::{check_decodes_to, decode, round_trip, Rng};

#[test]
fn random_weights_of_many_sizes() {
    let mut rng = Rng::new(1);
    for (n, scale) in [(1, 1.0), (2, 0.02), (7, 3.0), (100, 0.1), (5000, 0.05), (70_001, 0.02)] {
        let w = rng.weights(n, scale);
        let buf = round_trip(&[&w]);
        let group = buf.group().expect("valid");
        assert_eq!(group.n_blocks(), buf.encoded_exponent.len().div_ceil(BLOCK_BYTES));
        assert_eq!(buf.gaps.len(), GAP_BYTES_PER_BLOCK * group.n_blocks());
        assert_eq!(buf.output_positions.len(), 4 * (group.n_blocks() + 1));
        assert!(buf.split_positions.is_empty());
    }
}

#[test]
fn gaussian_weights_compress_like_df11() {
    // ~2.6-3 bits per exponent: the whole group lands near 70% of bf16 (the paper's figure).
    let w = Rng::new(2).weights(200_000, 0.02);
    let buf = round_trip(&[&w]);
    let ratio = buf.total_bytes() as f64 / (2.0 * w.len() as f64);
    assert!((0.6..0.75).contains(&ratio), "DF11 size {ratio:.3} of bf16");
}

#[test]
fn near_uniform_histogram() {
    // All 240 codable exponents about equally often: 7- and 8-bit codes, EOF deeper.
    let mut rng = Rng::new(3);
    let mut exponents: Vec<u8> = (0..240u32).flat_map(|e| core::iter::repeat_n(e as u8, 9 + (e % 4) as usize)).collect();
    rng.shuffle(&mut exponents);
    let w = rng.words_with_exponents(&exponents);
    let buf = round_trip(&[&w]);
    let codebook = Codebook::from_counts(&super::super::exponent_histogram(&[&w]).expect("codable")).expect("codebook");
    assert!((8..=10).contains(&codebook.max_len()), "max code length {}", codebook.max_len());
    assert_eq!(codebook.luts(), &buf.luts[..]);
}

/// A Fibonacci histogram over 36 exponents: a 36-deep Huffman chain, capped to 32 bits.
pub(super) fn fibonacci_counts() -> [u64; 256] {
    let mut counts = [0u64; 256];
    let (mut a, mut b) = (1u64, 1u64);
    for count in &mut counts[100..136] {
        *count = a;
        (a, b) = (b, a + b);
    }
    counts
}

#[test]
fn codes_of_exactly_32_bits() {
    let counts = fibonacci_counts();
    assert_eq!(uncapped_max_len(&counts), Some(36));
    let codebook = Codebook::from_counts(&counts).expect("codebook");
    assert_eq!(codebook.max_len(), 32);
    assert_eq!(codebook.luts().len() / 256, 5, "root, three sub-table levels, lengths");
    let longest = (100..136).filter(|&e| codebook.code(e).is_some_and(|c| c.len == 32)).count();
    assert!(longest >= 2, "{longest} codes of 32 bits");
    // Data that uses every code, the longest ones most: all four lookups, codes across
    // thread and block boundaries.
    let mut rng = Rng::new(4);
    let mut exponents: Vec<u8> = (100..136).chain(100..136).collect();
    exponents.extend((0..6000).map(|_| 100 + (rng.below(8) as u8).min(rng.below(8) as u8)));
    rng.shuffle(&mut exponents);
    let w = rng.words_with_exponents(&exponents);
    let buf = Df11GroupBuf::encode_with(&codebook, &[&w]).expect("every exponent has a code");
    assert!(buf.encoded_exponent.len() > 2 * BLOCK_BYTES);
    check_decodes_to(&buf, &[&w]);
}

#[test]
fn many_blocks_decode_in_any_order() {
    let mut rng = Rng::new(5);
    let exponents: Vec<u8> = (0..60_000).map(|_| rng.below(240) as u8).collect();
    let w = rng.words_with_exponents(&exponents);
    let buf = round_trip(&[&w]);
    let group = buf.group().expect("valid");
    assert!(group.n_blocks() >= 12, "{} blocks", group.n_blocks());
    // Ranges are contiguous and cover every element.
    let mut next = 0;
    for b in 0..group.n_blocks() {
        let range = group.block_output_range(b).expect("block exists");
        assert_eq!(range.start, next);
        next = range.end;
    }
    assert_eq!(next, w.len());
    assert_eq!(group.block_output_range(group.n_blocks()), None);
    // Blocks decoded one by one, last first, into their own pieces.
    let mut out = vec![0u16; w.len()];
    let mut pieces: Vec<_> = group.split_output(&mut out).expect("right length").collect();
    assert_eq!(pieces.len(), group.n_blocks());
    pieces.reverse();
    for (b, piece) in pieces {
        group.decode_block_into(b, piece).expect("piece fits its block");
    }
    assert!(out == w);
}

#[test]
fn several_linears_share_one_group() {
    let mut rng = Rng::new(6);
    let (a, b, c) = (rng.weights(32 * 48, 0.05), rng.weights(16 * 48, 1.0), rng.weights(24 * 20, 300.0));
    let buf = round_trip(&[&a, &b, &c]);
    let group = buf.group().expect("valid");
    assert_eq!(group.split_positions().collect::<Vec<_>>(), [1536, 2304]);
    let ranges: Vec<_> = group.weight_ranges().collect();
    assert_eq!(ranges, [0..1536, 1536..2304, 2304..2784]);
    let out = decode(&group);
    assert!(out[ranges[1].clone()] == b[..] && out[ranges[2].clone()] == c[..]);
}

#[test]
fn a_single_exponent_still_encodes() {
    // All-zero weights: one exponent and EOF. The official encoder fails here (its LUT loop
    // has no value for the keys below the only entry); ours repeats that entry.
    for n in [1, 2, 9, 10_000] {
        round_trip(&[&vec![0u16; n]]);
        round_trip(&[&vec![0x3f80u16; n]]);
    }
}

#[test]
fn the_end_of_stream_code_adds_at_most_one_byte() {
    let mut rng = Rng::new(7);
    for n in [1, 3, 64, 999] {
        let w = rng.weights(n, 0.1);
        let codebook = Codebook::from_counts(&super::super::exponent_histogram(&[&w]).expect("codable")).expect("ok");
        let bits: usize = w.iter().map(|&x| usize::from(codebook.code(super::super::bf16_parts(x).0).map_or(0, |c| c.len))).sum();
        let buf = Df11GroupBuf::encode_with(&codebook, &[&w]).expect("encodes");
        assert_eq!(buf.encoded_exponent.len(), bits.div_ceil(8), "n = {n}");
    }
}

#[test]
fn positions_one_short_when_the_last_byte_starts_no_code() {
    // Spec §2.7: a code that starts in block 0 and ends exactly at a byte boundary in block 1
    // leaves block 1 without an entry in the official file. Build that stream: a 1-bit code
    // repeated, then one long code across the block boundary.
    let mut counts = [0u64; 256];
    for (i, e) in (100..114).enumerate() {
        counts[e] = 1 << (20 - i);
    }
    let codebook = Codebook::from_counts(&counts).expect("codebook");
    let short = (100..114).find(|&e| codebook.code(e).is_some_and(|c| c.len == 1)).expect("a 1-bit code");
    let (long, len) = (100..114)
        .filter_map(|e| codebook.code(e).map(|c| (e, usize::from(c.len))))
        .find(|&(_, len)| len >= 9)
        .expect("a code of 9+ bits");
    let total_bits = 8 * (BLOCK_BYTES + 1);
    let mut exponents = vec![short; total_bits - len];
    exponents.push(long);
    let mut rng = Rng::new(8);
    let w = rng.words_with_exponents(&exponents);
    let mut buf = Df11GroupBuf::encode_with(&codebook, &[&w]).expect("encodes");
    check_decodes_to(&buf, &[&w]);
    assert_eq!(buf.encoded_exponent.len(), BLOCK_BYTES + 1);
    assert_eq!(buf.output_positions.len(), 4 * 3, "padded to n_blocks + 1");
    // The official file's shape: drop the last entry, which only repeats n_elements.
    buf.output_positions.truncate(8);
    check_decodes_to(&buf, &[&w]);
}

#[test]
fn bits_past_the_stream_are_clamped() {
    // Every stream length mod 64 bits: the last thread decodes the EOF bits and zeros after
    // them, which must land past n_elements.
    let mut rng = Rng::new(9);
    for n in 1..200 {
        let w = rng.weights(n, 0.3);
        round_trip(&[&w]);
    }
}
