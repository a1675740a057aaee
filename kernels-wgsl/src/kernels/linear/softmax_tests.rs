//! Tests of `softmax.rs`: the scores' product writing probabilities
//! against the host's arithmetic over the same product's f32 scores.

use super::*;
use crate::kernels::half_pack::half_pack;
use crate::kernels::linear::linear_from;
use crate::testing::*;
use crate::view::{HeadRows, RowScales, WeightDtype};
use flux_lite_core::ir::ProbabilityRow;
use half::f16;

/// One case: `m` queries from `q_first` over `n` keys from `k_first` of
/// width `d`, scores scaled by `spread`, every `hide`-th key masked (0: none).
struct Case {
    m: usize,
    n: usize,
    d: usize,
    q_first: u64,
    k_first: u64,
    causal: bool,
    hide: usize,
    spread: f32,
}

/// f16 rows of `rows` × `d` packed under their range scales, as the attention packs them.
fn packed_rows<'a>(gpu: &Gpu, enc: &mut wgpu::CommandEncoder, src: &'a wgpu::Buffer, [words, scales]: [&'a wgpu::Buffer; 2], rows: usize, d: usize) -> Result<HalfMat<'a>, crate::error::GpuError> {
    let (words, scales) = (Mat::new(words, d as u64 / 2), Mat::new(scales, 1));
    half_pack(gpu, enc, Mat::new(src, d as u64), words, scales, HeadRows { tokens: rows as u64, heads: 1, head_dim: d as u64 })?;
    Ok(HalfMat::rows(words, scales))
}

fn check(gpu: &Gpu, seed: u64, c: &Case) {
    let Case { m, n, d, .. } = *c;
    let mut rng = Rng::new(seed);
    let (q, k) = (rng.normals(m * d, c.spread), rng.normals(n * d, 1.0));
    let keep: Vec<u32> = (0..c.k_first as usize + n).map(|i| u32::from(c.hide == 0 || i % c.hide != 0)).collect();
    let (qb, kb, keep_b) = (gpu.upload_f32("q", &q), gpu.upload_f32("k", &k), gpu.upload_u32("keep", &keep));
    let (qw, qs) = (gpu.storage("q words", (2 * m * d) as u64), gpu.storage("q scales", (4 * m) as u64));
    let (kw, ks) = (gpu.storage("k words", (2 * n * d) as u64), gpu.storage("k scales", (4 * n) as u64));
    // Rows wider than the layout needs: the product keeps to each row's own words.
    let row = ProbabilityRow::of(n as u64);
    let stride = row.words + 8;
    let (scores_b, out) = (gpu.storage("scores", 4 * m as u64 * n as u64), poisoned(gpu, m * stride as usize));
    let scores = Scores { scale: 1.0 / (d as f32).sqrt(), causal: c.causal, keep: (c.hide > 0).then_some(&*keep_b), q_first: c.q_first, k_first: c.k_first };
    let s = Gemm { m: m as u64, n: n as u64, k: d as u64 };
    let words = Mat::new(&out, stride);
    let probabilities = Probabilities { words, exponents: Mat { offset: row.exponents, ..words }, sums: Mat { offset: row.sums, ..words } };
    let got = run_and_read(gpu, &out, m * stride as usize, |enc| {
        let x = Input::Half(packed_rows(gpu, enc, &qb, [&qw, &qs], m, d)?);
        packed_rows(gpu, enc, &kb, [&kw, &ks], n, d)?;
        let w = Weight { buf: &kw, offset: 0, dtype: WeightDtype::Bf16, scales: Some(RowScales { buf: &ks, offset: 0, k: d as u64, packed: true }) };
        linear_from(gpu, enc, x, w, None, Mat::new(&scores_b, n as u64), s)?;
        linear_softmax(gpu, enc, x, w, probabilities, scores, s)
    });
    let f32_scores = gpu.read_f32(&scores_b, 0, m * n).expect("scores read back");
    let to_exponent = scores.scale * std::f32::consts::LOG2_E;
    let pieces = n.div_ceil(PROBABILITY_PIECE as usize);
    let what = format!("{m} queries from {} over {n} keys from {} of {d}, causal {}, every {}th hidden, spread {}", c.q_first, c.k_first, c.causal, c.hide, c.spread);
    let mut hidden_pieces = 0;
    for r in 0..m {
        let at = r * stride as usize;
        let value = |i: usize| {
            let word = got[at + i / 2].to_bits();
            f16::from_bits((word >> (16 * (i % 2))) as u16).to_f32()
        };
        let counts = |i: usize| {
            let key = c.k_first as usize + i;
            i < n && !(c.causal && key as u64 > c.q_first + r as u64) && keep[key] != 0
        };
        for piece in 0..pieces {
            let keys = piece * 64..((piece + 1) * 64).min(n);
            let t: Vec<f32> = keys.clone().map(|i| if counts(i) { f32_scores[r * n + i] * to_exponent } else { f32::NEG_INFINITY }).collect();
            let largest = t.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e = largest.ceil() - 14.0;
            let exponent = got[at + row.exponents as usize + piece];
            assert_eq!(exponent.to_bits(), e.to_bits(), "{what}: row {r} piece {piece}'s exponent {exponent}, the host's {e}");
            hidden_pieces += usize::from(largest == f32::NEG_INFINITY);
            let (mut large, mut small) = (0u64, 0u64);
            for (j, i) in keys.enumerate() {
                let v = value(i);
                let want = if t[j] == f32::NEG_INFINITY { 0.0 } else { ((t[j] - e) as f64).exp2() };
                // exp2 on the device within a few ulps: at most one f16 step off the exact value's rounding.
                let step = f16::from_f64(want).to_f32().abs().max(6e-8) / 1024.0;
                assert!((v as f64 - want).abs() <= step as f64 * 1.01 + 6e-8, "{what}: row {r} key {i}: {v}, exactly {want}");
                assert!(t[j] != f32::NEG_INFINITY || v == 0.0, "{what}: row {r}'s hidden key {i} has {v}");
                if v >= 0.5 { large += (v * 2048.0) as u64 } else { small += (v * 16777216.0) as u64 }
            }
            let sum = got[at + row.sums as usize + piece];
            let want = large as f32 / 2048.0 + small as f32 / 16777216.0;
            assert_eq!(sum.to_bits(), want.to_bits(), "{what}: row {r} piece {piece}'s sum {sum}, its values' {want}");
        }
        if n % 2 == 1 {
            assert_eq!(value(n), 0.0, "{what}: row {r}'s padding value");
        }
    }
    println!("{what}: {} pieces hidden whole", hidden_pieces);
}

/// Each piece's exponent is the host's from the same product's f32
/// scores; each probability within one f16 step of 2^(t − e) (the
/// device's exp2 against the host's); each sum the exact sum of the
/// piece's f16 values; hidden keys, pieces hidden whole and an odd
/// number of keys' padding zero.
#[test]
fn the_scores_product_writes_the_hosts_probabilities_exponents_and_sums() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let cases = [
        Case { m: 70, n: 201, d: 64, q_first: 150, k_first: 100, causal: true, hide: 7, spread: 1.0 },
        Case { m: 130, n: 128, d: 32, q_first: 0, k_first: 0, causal: false, hide: 0, spread: 30.0 },
        Case { m: 9, n: 64, d: 128, q_first: 3, k_first: 0, causal: true, hide: 0, spread: 1e-3 },
    ];
    for (seed, case) in (90..).zip(&cases) {
        check(&gpu, seed, case);
    }
}

/// Off the matrix tier's f16 operands, or over f32 queries, it is refused.
#[test]
fn scores_as_probabilities_are_refused_without_f16_operands() {
    let gpu = gpu();
    let buf = gpu.storage("any", 4096);
    let words = Mat::new(&buf, 64);
    let probabilities = Probabilities { words, exponents: words, sums: words };
    let mut sink: Vec<crate::Dispatch> = Vec::new();
    let w = Weight::bf16(&buf);
    let refused = linear_softmax(gpu, &mut sink, Input::F32(Mat::new(&buf, 8)), w, probabilities, Scores::default(), Gemm { m: 4, n: 8, k: 8 });
    assert!(matches!(refused, Err(GpuError::UnsupportedShape(_))), "{refused:?}");
}
