//! Tests of `attention_chunks.rs`: against the f64 attention, bit for bit
//! by bands of queries and calls over whole chunks of keys, and where the
//! values reach beyond f16's range.

use super::*;
use crate::selftest::{OneHead, MATRIX_ATTENTION};
use crate::testing::*;

/// The VAE mid-block's width and narrow heads, over one part-filled chunk,
/// over two (the second holding two keys) and over three (the last
/// part-filled), and over odd numbers of keys (one chunk of 301; a second
/// of one key), against the f64 attention.
#[test]
fn chunked_attention_matches_the_oracle() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    for (case, seed) in [([40, 4200, 512], 1), ([33, 300, 64], 2), ([70, 4034, 32], 3), ([9, 301, 32], 7), ([21, 4033, 64], 8)] {
        let got = OneHead::new(case, [1.0, 1.0, 1.0], seed).error(&gpu).unwrap_or_else(|e| panic!("{e}"));
        println!("chunked attention {case:?}: relative L2 {got:.2e}");
        assert!(got <= MATRIX_ATTENTION, "{case:?}: {got:e}");
    }
}

/// The range rule across chunks: queries of 1e-6 (near-uniform weights),
/// keys of 1e3 with queries of 1e-3, values of 1e5 and of 1e-6: finite,
/// and as close to the f64 attention as ordinary values.
#[test]
fn chunked_attention_keeps_values_beyond_f16_finite_and_close() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    for (seed, scales) in [(61, [1e-6, 1.0, 1.0]), (62, [1e-3, 1e3, 1.0]), (63, [1.0, 1.0, 1e5]), (64, [1.0, 1.0, 1e-6])] {
        let head = OneHead::new([19, 4200, 32], scales, seed);
        let got = head.run(&gpu, &[(0, 19)], &[(0, 4200)]).unwrap_or_else(|e| panic!("{e}"));
        assert!(got.iter().all(|v| v.is_finite()), "{scales:?}: Inf or NaN");
        let err = crate::selftest::rel_l2(&got, &head.want);
        println!("scales {scales:?}: relative L2 {err:.2e}");
        assert!(err <= MATRIX_ATTENTION, "{scales:?}: {err:e}");
    }
}

/// Scores spread over hundreds of units (queries and keys of 6): the
/// softmax's maximum moves from chunk to chunk and most weights underflow.
/// f16's rounding of q and k (2⁻¹¹ relative) alone moves such scores by
/// tenths, so the reference takes q and k as the tier rounds them; the
/// probabilities' and the values' rounding stay within the bound.
#[test]
fn chunked_attention_over_sharp_scores_matches_the_oracle_on_its_rounded_operands() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let mut head = OneHead::new([24, 4200, 64], [6.0, 6.0, 1.0], 4);
    let round = |x: &[f32]| x.iter().map(|&v| as_f16(v)).collect::<Vec<_>>();
    head.want = OneHead::reference(&round(&head.q), &round(&head.k), &head.v, [24, 4200, 64]);
    let got = head.run(&gpu, &[(0, 24)], &[(0, 4200)]).unwrap_or_else(|e| panic!("{e}"));
    let err = crate::selftest::rel_l2(&got, &head.want);
    println!("sharp scores: relative L2 {err:.2e} against f64 over q and k rounded to f16");
    assert!(err <= MATRIX_ATTENTION, "{err:e}");
}

/// Bands of queries, each over calls on whole chunks of keys (one chunk a
/// call, or two and the rest) carrying the softmax, give the bits of one
/// call over every query and key: what makes the banded VAE's mid-block
/// attention its whole decode's.
#[test]
fn chunked_attention_by_query_bands_and_key_calls_equals_one_call_bit_for_bit() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let head = OneHead::new([45, 8300, 64], [2.0, 2.0, 1.0], 5);
    let bits = |out: Vec<f32>| out.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let whole = bits(head.run(&gpu, &[(0, 45)], &[(0, 8300)]).unwrap());
    let bands = [(0, 7), (7, 30), (30, 45)];
    let c = flux_lite_core::ir::ATTENTION_KEY_CHUNK as usize;
    for calls in [vec![(0, c), (c, 2 * c), (2 * c, 8300)], vec![(0, 2 * c), (2 * c, 8300)]] {
        assert_eq!(bits(head.run(&gpu, &bands, &calls).unwrap()), whole, "bands {bands:?} over calls {calls:?}");
    }
}

/// Off the matrix tier's f16 operands, a chunked attention is refused.
#[test]
fn chunked_attention_is_refused_off_the_matrix_tiers_f16_operands() {
    let gpu = gpu();
    if runs_chunked_attention(gpu) {
        return crate::skip::skipped("the default device is on the matrix tier with f16 operands, which runs it");
    }
    let err = OneHead::new([4, 8, 8], [1.0; 3], 6).error(gpu).unwrap_err();
    assert!(err.to_string().contains("chunked attention is the matrix tier's"), "{err}");
}

/// A chunk of an odd number of keys packed as the weighted sum's right
/// operand: each column of the values a row of whole f16 pairs, the last
/// padded with a zero, rows apart by those whole pairs (a row of
/// `keys / 2` words would have run each column's last key into the next
/// column's row), under the range rule's scale of the column, as the
/// host's side of the rule packs the transposed values.
#[test]
fn pack_columns_pads_an_odd_number_of_keys_to_whole_pairs() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let (keys, width) = (5usize, 3usize);
    let values: Vec<f32> = (0..keys * width).map(|i| (i as f32 - 6.5) * [1.0, 1e4, 1e-3][i % width]).collect();
    let src = gpu.upload_f32("values", &values);
    let words = keys.div_ceil(2) * width;
    let out = crate::selftest::poisoned(&gpu, words + width);
    let got = run_and_read(&gpu, &out, words + width, |enc| {
        let (packed, scales) = (Mat::new(&out, 0), Mat { buf: &out, offset: words as u64, stride: 1 });
        pack_columns(&gpu, enc, Source::Rows(Mat::new(&src, width as u64)), [packed, scales], [keys as u64, width as u64])
    });
    let column = |c: usize| (0..keys + 1).map(|k| if k < keys { values[k * width + c] } else { 0.0 }).collect::<Vec<f32>>();
    let padded: Vec<f32> = (0..width).flat_map(column).collect();
    let (want_words, want_scales) = crate::range_rule::pack_rows(&padded, width, keys + 1);
    let got_words: Vec<u32> = got[..words].iter().map(|w| w.to_bits()).collect();
    assert_eq!(got_words, want_words);
    assert_eq!(&got[words..], &want_scales[..]);
}

/// The stack's output divided by its sums straight into the attention's
/// f16 pieces gives the bits of dividing it in place (`normalise_rows`)
/// and packing each head's band (`half_pack`): three heads of 64 in pieces
/// of 32, bands of 100 queries in pitches of 128, into heads 1 … 3 of five
/// from query 5, a row whose sum is zero, values reaching 1e5; the rows
/// past a band and the other heads' pieces left as they were.
#[test]
fn normalising_into_pieces_gives_the_bits_of_normalising_then_packing() {
    let gpu = gpu();
    let (heads, pitch, band, width, piece, all_heads, first_query) = (3u64, 128u64, 100u64, 64u64, 32u64, 5u64, 5u64);
    let rows = heads * pitch;
    let mut rng = Rng::new(71);
    let output: Vec<f32> = rng.normals((rows * width) as usize, 1.0).iter().enumerate().map(|(i, v)| if i % 97 == 0 { v * 1e5 } else { *v }).collect();
    let mut state = vec![0.0f32; 2 * rows as usize];
    for (r, sum) in rng.normals(rows as usize, 1.0).into_iter().enumerate() {
        state[2 * r + 1] = if r == 7 { 0.0 } else { 0.5 + sum.abs() * 40.0 };
    }
    let tokens = first_query + band + 3;
    let (row_words, row_scales) = (all_heads * width / 2, all_heads * width / piece);
    let run = |fused: bool| {
        let (outb, stateb) = (gpu.upload_f32("output", &output), gpu.upload_f32("state", &state));
        let pieces = crate::selftest::poisoned(gpu, (tokens * (row_words + row_scales)) as usize);
        let (data, scales) = (Mat::new(&pieces, row_words), Mat { buf: &pieces, offset: tokens * row_words, stride: row_scales });
        let o = HalfMat::pieces(data, scales, piece).cols_from(width).expect("head 1").rows_from(first_query);
        run_and_read(gpu, &pieces, (tokens * (row_words + row_scales)) as usize, |enc| {
            let (out, st) = (Mat::new(&outb, width), Mat::new(&stateb, 2));
            if fused {
                return normalise_into_pieces(gpu, enc, [out, st], o, [heads, pitch, band, width]);
            }
            normalise_rows(gpu, enc, out, st, [rows, width])?;
            for j in 0..heads {
                let head = o.cols_from(j * width).expect("a head's pieces");
                half_pack(gpu, enc, out.rows_from(j * pitch), head.data, head.scales, HeadRows { tokens: band, heads: width / piece, head_dim: piece })?;
            }
            Ok(())
        })
        .iter()
        .map(|v| v.to_bits())
        .collect::<Vec<u32>>()
    };
    let (fused, apart) = (run(true), run(false));
    let differing = fused.iter().zip(&apart).filter(|(a, b)| a != b).count();
    assert_eq!(differing, 0, "{differing} of {} words differ", fused.len());
}

/// Keys and values read where they lie as f16 pieces give the bits of
/// widening them to f32 rows first (on the host: each f16 times its
/// piece's scale) and packing those (the keys by `half_pack`, the values
/// by `pack_columns`): 37 keys of two heads
/// of 64 in pieces of 32, the second head's keys from its first column,
/// pieces whose scales lie 2⁴⁰ apart (a small piece's values go subnormal
/// under its row's scale).
#[test]
fn packing_keys_and_values_from_pieces_gives_the_bits_of_widening_them_first() {
    let gpu = gpu();
    let (keys, d, piece, heads) = (37u64, 64u64, 32u64, 2u64);
    let width = heads * d;
    let mut rng = Rng::new(73);
    let values: Vec<f32> = rng.normals((keys * width) as usize, 1.0).iter().enumerate().map(|(i, v)| v * [1.0, 1e-12, 3e4, 1.0][(i as u64 % width / piece) as usize]).collect();
    let src = gpu.upload_f32("values", &values);
    let pieces_at = gpu.storage("pieces", 4 * keys * (width / 2 + width / piece));
    let (data, scales) = (Mat::new(&pieces_at, width / 2), Mat { buf: &pieces_at, offset: keys * width / 2, stride: width / piece });
    gpu.submit(|enc| half_pack(gpu, enc, Mat::new(&src, width), data, scales, HeadRows { tokens: keys, heads: width / piece, head_dim: piece })).unwrap();
    let stored = HalfMat::pieces(data, scales, piece).cols_from(d).expect("the second head");
    // The second head's values as its pieces stand for them.
    let raw = gpu.read_f32(&pieces_at, 0, (keys * (width / 2 + width / piece)) as usize).unwrap();
    let widened: Vec<f32> = (0..keys * d)
        .map(|i| {
            let (key, c) = (i / d, d + i % d);
            let word = raw[(key * width / 2 + c / 2) as usize].to_bits();
            let value = half::f16::from_bits((word >> (16 * (c % 2))) as u16).to_f32();
            value * raw[(keys * width / 2 + key * width / piece + c / piece) as usize]
        })
        .collect();
    let rows = gpu.upload_f32("widened", &widened);
    let words = d * keys.div_ceil(2) + d;
    let run = |widened: bool| {
        let out = crate::selftest::poisoned(gpu, 2 * words as usize);
        let got = run_and_read(gpu, &out, 2 * words as usize, |enc| {
            let at = |offset: u64| Mat { buf: &out, offset, stride: 0 };
            let source = match widened {
                true => {
                    half_pack(gpu, enc, Mat::new(&rows, d), Mat::new(&out, d / 2), Mat::new(&out, 1).rows_from(keys * d / 2), HeadRows { tokens: keys, heads: 1, head_dim: d })?;
                    Source::Rows(Mat::new(&rows, d))
                }
                false => {
                    pack_key_rows(gpu, enc, Source::Pieces(stored), [at(0), at(keys * d / 2)], [keys, d])?;
                    Source::Pieces(stored)
                }
            };
            pack_columns(gpu, enc, source, [at(words), at(words + d * keys.div_ceil(2))], [keys, d])
        });
        got.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
    };
    let (from_pieces, widened) = (run(false), run(true));
    let differing = from_pieces.iter().zip(&widened).filter(|(a, b)| a != b).count();
    assert_eq!(differing, 0, "{differing} of {} words differ", widened.len());
    assert!(from_pieces.iter().take((keys * d / 2) as usize).any(|&w| w != 0), "the keys were packed");
}
