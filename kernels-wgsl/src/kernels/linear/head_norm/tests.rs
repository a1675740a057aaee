//! The projection norming its heads in its epilogue, held to the passes it
//! replaces: the f32 product, the f32 per-head RMSNorm + RoPE over its
//! queries' and keys' columns, and the range rule's rounding of each piece.

use super::{product_norms_heads, HeadNorm};
use crate::kernels::linear::tests::with_element_fetch;
use crate::kernels::linear::{linear_from, linear_into_half_normed, Gemm, Input};
use crate::kernels::norm::{rms_norm_rope, RowNorm};
use crate::kernels::rope::RopeTables;
use crate::range_rule::pack_rows;
use crate::testing::*;
use crate::view::{HalfMat, Mat, Weight};
use crate::{Gpu, GpuOptions};

/// A projection's shape: `m` rows over `k` terms; `parts` of `heads` heads
/// of `head_dim` outputs (queries, keys, values in turn), the first
/// `normed` of them normed (1: one kind's projection; 2: the fused one).
struct Projection {
    m: usize,
    k: usize,
    heads: usize,
    head_dim: usize,
    parts: usize,
    normed: usize,
}

/// f16 values of a piece as their sign-magnitude codes' order: neighbours
/// in f16 differ by one.
fn f16_order(word: u32, high: bool) -> i32 {
    let bits = if high { word >> 16 } else { word & 0xffff } as i32;
    if bits & 0x8000 != 0 {
        -(bits & 0x7fff)
    } else {
        bits
    }
}

/// An f16 value of a piece (its range scale not applied).
fn f16_value(word: u32, high: bool) -> f32 {
    half::f16::from_bits(if high { word >> 16 } else { word & 0xffff } as u16).to_f32()
}

/// How far apart a normed value of the two may lie, in a piece's f16 units
/// (its largest value in [2¹³, 2¹⁴)), where more than one f16 step apart:
/// a few f32 roundings of the piece's largest value. The rotation's
/// `x·cos − y·sin` may be contracted into a fused multiply-add in one
/// module and not in the other (SPIR-V contracts unless told
/// `NoContraction`, and no WGSL says so), which moves the result by up to
/// half an f32 step of a product, at most the pair's length, √2·2¹⁴ here:
/// about 2⁻⁹·⁵. Only a value the rotation nearly cancels, whose f16 steps
/// are far finer, sees that as steps: one at 2.5e-6, in a piece whose
/// largest is 1.2, 7.5e-9 (4 steps) from the pass's in the emulated tiles'
/// module (`FLUX_LITE_EMULATE_MATRIX`), equal in lavapipe's own.
const ROTATION_CONTRACTION: f32 = 1.0 / 256.0;

/// The fused product against the passes: every scale equal; every value of
/// the values' columns equal; every normed value equal, one f16 step away
/// or within [`ROTATION_CONTRACTION`]. The two sum a head's squares in
/// different orders (the pass over its workgroup, the epilogue in column
/// order), so their inverse RMS may differ in the last bits of an f32,
/// which moves a value's rounding to f16 only where it lies that close to
/// a midpoint: a few in a thousand.
fn check_normed_projection(gpu: &Gpu, f32_gpu: &Gpu, p: Projection, piece: usize) -> usize {
    let Projection { m, k, heads, head_dim: d, parts, normed } = p;
    let (part, n) = (heads * d, parts * heads * d);
    let mut rng = Rng::new((m * 31 + n * 7 + k + piece) as u64);
    let mut x = rng.normals(m * k, 1.0);
    x[2 * k..3 * k].iter_mut().for_each(|v| *v *= 5e3);
    let w = rng.bf16s(n * k, 0.1);
    let norm_w: Vec<Vec<u16>> = (0..2).map(|_| rng.bf16s(d, 1.0)).collect();
    let first_row = 3usize;
    let angles: Vec<f64> = (0..(first_row + m) * d).map(|i| (i as f64 * 0.37).sin() * 3.0).collect();
    let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
    let (xb, wb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w));
    let s = Gemm { m: m as u64, n: n as u64, k: k as u64 };
    let input = Input::F32(Mat::new(&xb, k as u64));
    let yb = poisoned(gpu, m * n);
    let y = run_and_read(gpu, &yb, m * n, |enc| linear_from(gpu, enc, input, Weight::bf16(&wb), None, Mat::new(&yb, n as u64), s));
    let shape = RowNorm { tokens: m as u64, heads: heads as u64, d: d as u64, eps: 1e-6 };
    // The f32 pass over each normed part's columns, on a GPU-shaped device.
    let want = {
        let g = f32_gpu;
        let (cb, sb, yb) = (g.upload_f32("cos", &cos), g.upload_f32("sin", &sin), g.upload_f32("y", &y));
        let weights: Vec<_> = norm_w.iter().map(|w| g.upload_bf16("norm", w)).collect();
        let tables = RopeTables { cos: &cb, sin: &sb, first_row: first_row as u64 };
        run_and_read(g, &yb, m * n, |enc| {
            for (i, w) in weights.iter().enumerate().take(normed) {
                rms_norm_rope(g, enc, Mat { buf: &yb, offset: (i * part) as u64, stride: n as u64 }, Weight::bf16(w), tables, shape)?;
            }
            Ok(())
        })
    };
    let (cb, sb) = (gpu.upload_f32("cos", &cos), gpu.upload_f32("sin", &sin));
    let weights: Vec<_> = norm_w.iter().map(|w| gpu.upload_bf16("norm", w)).collect();
    let second = if normed == 2 { &weights[1] } else { &weights[0] };
    let norm = HeadNorm {
        first: Weight::bf16(&weights[0]),
        second: Weight::bf16(second),
        first_cols: part as u64,
        cols: (normed * part) as u64,
        head_dim: d as u64,
        eps: 1e-6,
        tables: RopeTables { cos: &cb, sin: &sb, first_row: first_row as u64 },
    };
    // Rows in a window of wider words, scales a row 3 apart more than its pieces.
    let (pieces, words_at, word_stride) = (n / piece, 2usize, n / 2 + 2);
    let (scales_at, scales_stride) = (words_at + m * word_stride, pieces + 3);
    let len = scales_at + m * scales_stride;
    let out = poisoned(gpu, len);
    let dst = HalfMat::pieces(Mat { buf: &out, offset: words_at as u64, stride: word_stride as u64 }, Mat { buf: &out, offset: scales_at as u64, stride: scales_stride as u64 }, piece as u64);
    let all = run_and_read(gpu, &out, len, |enc| linear_into_half_normed(gpu, enc, input, Weight::bf16(&wb), dst, norm, s));
    let (want_words, want_scales) = pack_rows(&want, m * pieces, piece);
    let mut moved = 0;
    for row in 0..m {
        for pc in 0..pieces {
            let normed_piece = pc * piece < normed * part;
            let scale = all[scales_at + row * scales_stride + pc];
            assert_eq!(scale, want_scales[row * pieces + pc], "row {row}, piece {pc}: scale");
            for j in 0..piece / 2 {
                let got = all[words_at + row * word_stride + pc * piece / 2 + j].to_bits();
                let want = want_words[(row * pieces + pc) * piece / 2 + j];
                for high in [false, true] {
                    let steps = (f16_order(got, high) - f16_order(want, high)).abs();
                    let limit = if normed_piece { 1 } else { 0 };
                    let contracted = normed_piece && (f16_value(got, high) - f16_value(want, high)).abs() <= ROTATION_CONTRACTION;
                    assert!(steps <= limit || contracted, "row {row}, piece {pc}, value {}: {steps} f16 steps from the passes' (normed: {normed_piece})", 2 * j + high as usize);
                    moved += (steps > 0) as usize;
                }
            }
        }
    }
    let normed_values = m * normed * part;
    assert!(moved * 100 <= normed_values, "{moved} of {normed_values} normed values moved by a step");
    moved
}

#[test]
fn a_projection_norming_its_heads_in_its_epilogue_gives_the_norm_passes_values_rounded_once() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let f32_gpu = Gpu::new(&GpuOptions { gpu_shaped_kernels: true, ..options() }).unwrap_or_else(|e| panic!("{e}"));
    let block = gpu.matrix().map(|c| c.size as usize * 8).expect("a matrix device");
    let mut moved = 0;
    // A head a block's outputs a row, and half of them; one kind of
    // projection, and the fused one (queries, keys, values) over ragged rows.
    for d in [block, block / 2] {
        moved += check_normed_projection(&gpu, &f32_gpu, Projection { m: 70, k: 96, heads: 3, head_dim: d, parts: 1, normed: 1 }, d / 2);
        moved += check_normed_projection(&gpu, &f32_gpu, Projection { m: 37, k: 64, heads: 2, head_dim: d, parts: 3, normed: 2 }, d);
    }
    moved += with_element_fetch(|| check_normed_projection(&gpu, &f32_gpu, Projection { m: 33, k: 40, heads: 2, head_dim: block, parts: 3, normed: 2 }, block / 2));
    eprintln!("normed values one f16 step from the passes': {moved}");
}

#[test]
fn heads_other_than_a_block_or_half_of_one_are_left_to_the_norm_pass() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let block = gpu.matrix().map(|c| c.size as u64 * 8).expect("a matrix device");
    assert!(product_norms_heads(&gpu, block / 2, block));
    assert!(product_norms_heads(&gpu, block / 2, block / 2));
    assert!(!product_norms_heads(&gpu, block / 4, block / 4), "a quarter block");
    assert!(!product_norms_heads(&gpu, block, 2 * block), "two blocks");
    let f32_gpu = Gpu::new(&GpuOptions { gpu_shaped_kernels: true, ..options() }).unwrap_or_else(|e| panic!("{e}"));
    assert!(!product_norms_heads(&f32_gpu, block / 2, block), "the f32 tier");
}
