//! The matrix tier's half-precision data path, producer to product: the
//! LayerNorm + modulation writing a product's input as f16 rows under their
//! range scales (`norm_half.wgsl`), and the matrix linear reading such rows
//! (`linear_matrix.wgsl`'s `X_HALF`). Each is held bit for bit to the f32
//! path it replaces: the f32 kernel's values rounded as the range rule
//! rounds them, and the product over the f32 values those rows stand for.

use crate::kernels::linear::tests::with_element_fetch;
use crate::kernels::attention::{attention, attention_half_into_half, attention_into_half, Attention, HalfQkv, Qkv};
use crate::kernels::linear::{linear, linear_from, linear_into_half, linear_swiglu, linear_swiglu_half, product_writes_pieces, swiglu_writes_pieces, Gemm, Input};
use crate::kernels::half_pack::swiglu_half_pack;
use crate::kernels::elementwise::{elementwise, Elementwise};
use crate::kernels::norm::{layer_norm_modulate, layer_norm_modulate_half, rms_norm, rms_norm_half, rms_norm_inplace, rms_norm_rope, rms_norm_rope_half, LaterModulation, Modulation, RowNorm};
use crate::kernels::rope::{rope, RopeStyle, RopeTables};
use crate::view::HeadRows;
use crate::testing::*;
use crate::range_rule::{pack_rows, unpack_rows};
use crate::view::{HalfMat, Mat, Weight};
use crate::{Gpu, GpuOptions};

/// The f32 LayerNorm + modulation and the f16-output one over the same rows
/// of `gpu` (either kernel shape): the second's words and scales are the
/// first's values packed by the range rule.
fn check_layer_norm_half(gpu: &Gpu) {
    let (tokens, d) = (37usize, 200usize);
    let mut rng = Rng::new(5);
    let mut x = rng.normals(tokens * d, 1.0);
    // Rows far above f16's range and far below its normals take their own scales.
    x[3 * d..4 * d].iter_mut().for_each(|v| *v = *v * 3e6 + 1e6);
    x[9 * d..10 * d].iter_mut().for_each(|v| *v *= 1e-7);
    let mut modulation = rng.normals(2 * d, 0.5);
    modulation[d..].iter_mut().for_each(|v| *v *= 40.0);
    let (xb, mb) = (gpu.upload_f32("x", &x), gpu.upload_f32("modulation", &modulation));
    let shape = RowNorm { tokens: tokens as u64, heads: 1, d: d as u64, eps: 1e-6 };
    let (shift, scale) = (Mat { buf: &mb, offset: 0, stride: 0 }, Mat { buf: &mb, offset: d as u64, stride: 0 });
    let yb = poisoned(gpu, tokens * d);
    let y = run_and_read(gpu, &yb, tokens * d, |enc| layer_norm_modulate(gpu, enc, Mat::new(&xb, d as u64), Modulation::of(shift, scale), Mat::new(&yb, d as u64), shape));
    // Rows from element 6 of a buffer with a wider stride, as the arena's spans sit.
    let (at, stride) = (6u64, (d / 2 + 3) as u64);
    let out = poisoned(gpu, at as usize + tokens * stride as usize + tokens + 8);
    let (words_at, scales_at) = (at, at + tokens as u64 * stride);
    let dst = HalfMat::rows(Mat { buf: &out, offset: words_at, stride }, Mat { buf: &out, offset: scales_at, stride: 1 });
    let all = run_and_read(gpu, &out, at as usize + tokens * stride as usize + tokens, |enc| {
        layer_norm_modulate_half(gpu, enc, Mat::new(&xb, d as u64), Modulation::of(shift, scale), dst, shape)
    });
    assert_rows_packed(&all, [words_at as usize, stride as usize, scales_at as usize], &y, [tokens, d]);
}

/// `all` holds `y` `[tokens, d]` as f16 rows under one range scale a row:
/// the words from `words_at`, `stride` a row, the scales from `scales_at`.
fn assert_rows_packed(all: &[f32], [words_at, stride, scales_at]: [usize; 3], y: &[f32], [tokens, d]: [usize; 2]) {
    let (want_words, want_scales) = pack_rows(y, tokens, d);
    for row in 0..tokens {
        let first = words_at + row * stride;
        let got: Vec<u32> = all[first..first + d / 2].iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want_words[row * d / 2..(row + 1) * d / 2], "row {row}'s f16 values");
        assert_eq!(all[scales_at + row], want_scales[row], "row {row}'s scale");
    }
}

#[test]
fn layer_norm_modulate_half_writes_the_f32_values_as_the_range_rule_rounds_them() {
    // The module needs shader f16, which the f16 tier's device has.
    let Some(gpu) = half_gpu() else { return };
    each_kernel_shape(&gpu, GpuOptions { precision: crate::Precision::F16, ..options() }, check_layer_norm_half);
}

/// The f32 RMSNorm and the f16-output one over the same rows of `gpu`
/// (either kernel shape): the second's words and scales are the first's
/// values packed by the range rule.
fn check_rms_norm_half(gpu: &Gpu) {
    let (tokens, d) = (29usize, 136usize);
    let mut rng = Rng::new(8);
    let mut x = rng.normals(tokens * d, 1.0);
    x[2 * d..3 * d].iter_mut().for_each(|v| *v *= 5e5);
    let mut w = rng.bf16s(d, 1.0);
    // Weights that carry the normalised values past f16's range and below its normals.
    w[..4].iter_mut().for_each(|v| *v = half::bf16::from_f32(9e5).to_bits());
    w[4..8].iter_mut().for_each(|v| *v = half::bf16::from_f32(1e-9).to_bits());
    let (xb, wb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w));
    let shape = RowNorm { tokens: tokens as u64, heads: 1, d: d as u64, eps: 1e-6 };
    let yb = poisoned(gpu, tokens * d);
    let y = run_and_read(gpu, &yb, tokens * d, |enc| rms_norm(gpu, enc, Mat::new(&xb, d as u64), Weight::bf16(&wb), Mat::new(&yb, d as u64), shape));
    let (at, stride) = (3u64, (d / 2 + 1) as u64);
    let len = at as usize + tokens * stride as usize + tokens;
    let out = poisoned(gpu, len);
    let (words_at, scales_at) = (at, at + tokens as u64 * stride);
    let dst = HalfMat::rows(Mat { buf: &out, offset: words_at, stride }, Mat { buf: &out, offset: scales_at, stride: 1 });
    let all = run_and_read(gpu, &out, len, |enc| rms_norm_half(gpu, enc, Mat::new(&xb, d as u64), Weight::bf16(&wb), dst, shape));
    assert_rows_packed(&all, [words_at as usize, stride as usize, scales_at as usize], &y, [tokens, d]);
}

#[test]
fn rms_norm_half_writes_the_f32_values_as_the_range_rule_rounds_them() {
    let Some(gpu) = half_gpu() else { return };
    each_kernel_shape(&gpu, GpuOptions { precision: crate::Precision::F16, ..options() }, check_rms_norm_half);
}

/// The SwiGLU of f32 gate and up rows written as f16 pieces in one pass:
/// the element-wise SwiGLU's values, each piece rounded by the range rule.
fn check_swiglu_half_pack(gpu: &Gpu, [m, n]: [usize; 2], piece: usize) {
    let mut rng = Rng::new((m * 3 + n) as u64);
    // Gate and up side by side in one row, as a feed-forward's products write them.
    let mut gate_up = rng.normals(m * 2 * n, 2.0);
    gate_up[2 * n..3 * n].iter_mut().for_each(|v| *v *= 4e3);
    gate_up[5 * n..5 * n + piece].iter_mut().for_each(|v| *v *= 1e-5);
    let xb = gpu.upload_f32("gate and up", &gate_up);
    let (gate, up) = (Mat::new(&xb, 2 * n as u64), Mat { buf: &xb, offset: n as u64, stride: 2 * n as u64 });
    let yb = poisoned(gpu, m * n);
    let y = run_and_read(gpu, &yb, m * n, |enc| elementwise(gpu, enc, Elementwise::SwiGlu, gate, Some(up), Mat::new(&yb, n as u64), [m as u64, n as u64]));
    let shape = HeadRows { tokens: m as u64, heads: (n / piece) as u64, head_dim: piece as u64 };
    check_written_in_pieces(gpu, &y, [m, n], piece, |enc, dst| swiglu_half_pack(gpu, enc, gate, up, dst.data, dst.scales, shape));
}

#[test]
fn swiglu_half_pack_writes_the_element_wise_swiglu_as_the_range_rule_rounds_each_piece() {
    let Some(gpu) = half_gpu() else { return };
    check_swiglu_half_pack(&gpu, [13, 192], 64);
    check_swiglu_half_pack(&gpu, [70, 80], 40);
    check_swiglu_half_pack(&gpu, [8, 64], 16);
}

/// `y = x·Wᵀ (+ b)` over f16 rows and over the f32 values they stand for,
/// on the matrix tier: the same bits.
fn check_linear_over_half_rows(gpu: &Gpu, [m, n, k]: [usize; 3], bf16: bool, with_bias: bool) {
    check_linear_over_half_pieces(gpu, [m, n, k], k, bf16, with_bias);
}

/// [`check_linear_over_half_rows`] over rows whose every `piece` values
/// have their own scale (one a row where `piece` is `k`), the scales a
/// row 1 apart more than the row's pieces (as a wider tensor's would be).
fn check_linear_over_half_pieces(gpu: &Gpu, [m, n, k]: [usize; 3], piece: usize, bf16: bool, with_bias: bool) {
    let mut rng = Rng::new((m * 131 + n * 7 + k + piece) as u64);
    let mut x = rng.normals(m * k, 1.0);
    x[..k].iter_mut().for_each(|v| *v *= 1e5);
    x[(m - 1) * k..].iter_mut().for_each(|v| *v *= 1e-6);
    // Pieces of one row far apart in range: each its own scale.
    if piece < k {
        x[k..k + piece].iter_mut().for_each(|v| *v *= 3e4);
        x[2 * k + piece..2 * k + 2 * piece].iter_mut().for_each(|v| *v *= 1e-4);
    }
    let pieces = k / piece;
    let (words, piece_scales) = pack_rows(&x, m * pieces, piece);
    let scale_stride = if piece < k { pieces + 1 } else { 1 };
    let mut scales = vec![f32::NAN; m * scale_stride];
    for (i, s) in piece_scales.iter().enumerate() {
        scales[i / pieces * scale_stride + i % pieces] = *s;
    }
    // The f32 values the f16 rows stand for.
    let values = unpack_rows(&words, &piece_scales, piece);
    let wb = if bf16 { gpu.upload_bf16("w", &rng.bf16s(n * k, 0.1)) } else { gpu.upload_f32("w", &rng.normals(n * k, 0.1)) };
    let bb = gpu.upload_bf16("b", &rng.bf16s(n, 1.0));
    let weight = |b| if bf16 { Weight::bf16(b) } else { Weight::f32(b) };
    let bias = with_bias.then(|| Weight::bf16(&bb));
    let s = Gemm { m: m as u64, n: n as u64, k: k as u64 };
    let xb = gpu.upload_f32("x", &values);
    let (hb, sb) = (gpu.upload_u32("x half", &words), gpu.upload_f32("x scales", &scales));
    let (y32, y16) = (poisoned(gpu, m * n), poisoned(gpu, m * n));
    let from_f32 = run_and_read(gpu, &y32, m * n, |enc| linear(gpu, enc, Mat::new(&xb, k as u64), weight(&wb), bias, Mat::new(&y32, n as u64), s));
    let half_rows = match piece < k {
        true => HalfMat::pieces(Mat::new(&hb, (k / 2) as u64), Mat::new(&sb, scale_stride as u64), piece as u64),
        false => HalfMat::rows(Mat::new(&hb, (k / 2) as u64), Mat::new(&sb, 1)),
    };
    let from_half = run_and_read(gpu, &y16, m * n, |enc| linear_from(gpu, enc, Input::Half(half_rows), weight(&wb), bias, Mat::new(&y16, n as u64), s));
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&from_half), bits(&from_f32), "{m}×{k}·{k}×{n} in pieces of {piece}, bf16 W {bf16}, bias {with_bias}");
    assert!(from_half.iter().all(|v| v.is_finite()));
}

#[test]
fn linear_on_matrix_units_over_half_rows_equals_it_over_their_f32_values() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    // Ragged blocks with bias; whole vec4s (read as vec4s, then element by
    // element); f32 weights (a LoRA's), whose columns are staged one by one.
    check_linear_over_half_rows(&gpu, [70, 131, 78], true, true);
    check_linear_over_half_rows(&gpu, [64, 96, 128], true, false);
    with_element_fetch(|| check_linear_over_half_rows(&gpu, [64, 96, 128], true, false));
    check_linear_over_half_rows(&gpu, [13, 70, 36], false, true);
}

#[test]
fn linear_on_matrix_units_over_half_pieces_equals_it_over_their_f32_values() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    // Pieces of 64 values as the producers write them, read as vec4s and
    // element by element; pieces of 12 off the k steps; f32 weights.
    check_linear_over_half_pieces(&gpu, [70, 131, 256], 64, true, true);
    with_element_fetch(|| check_linear_over_half_pieces(&gpu, [70, 131, 256], 64, true, false));
    check_linear_over_half_pieces(&gpu, [33, 40, 96], 12, true, false);
    check_linear_over_half_pieces(&gpu, [13, 70, 128], 32, false, true);
}

/// `silu(x·W_gateᵀ) ⊙ (x·W_upᵀ)` into f16 pieces and into f32 rows: the
/// pieces are the f32 rows' values, each piece of `piece` divided by its
/// range scale and rounded to f16 ([`check_written_in_pieces`]).
fn check_swiglu_into_half_pieces(gpu: &Gpu, [m, n, k]: [usize; 3], piece: usize) {
    let mut rng = Rng::new((m * 17 + n * 5 + k) as u64);
    let mut x = rng.normals(m * k, 1.0);
    // Rows whose outputs lie far apart in range, each piece its own scale.
    x[k..2 * k].iter_mut().for_each(|v| *v *= 3e3);
    x[3 * k..4 * k].iter_mut().for_each(|v| *v *= 1e-3);
    // One piece's gate rows far larger than the others'.
    let mut w = rng.bf16s(piece * k, 5.0);
    w.extend(rng.bf16s((2 * n - piece) * k, 0.1));
    let (xb, wb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w));
    let s = Gemm { m: m as u64, n: n as u64, k: k as u64 };
    let yb = poisoned(gpu, m * n);
    let y = run_and_read(gpu, &yb, m * n, |enc| linear_swiglu(gpu, enc, Input::F32(Mat::new(&xb, k as u64)), Weight::bf16(&wb), Mat::new(&yb, n as u64), s));
    check_written_in_pieces(gpu, &y, [m, n], piece, |enc, dst| linear_swiglu_half(gpu, enc, Input::F32(Mat::new(&xb, k as u64)), Weight::bf16(&wb), dst, s));
}

/// What `write` writes as f16 rows in pieces of `piece` (into words in a
/// wider tensor from an even column, rows whole vec4s apart or not, the
/// scales a row 3 apart more than its pieces) is `y` `[m, n]`, each piece
/// divided by its range scale and rounded to f16, with those scales.
fn check_written_in_pieces(gpu: &Gpu, y: &[f32], [m, n]: [usize; 2], piece: usize, write: impl Fn(&mut dyn crate::dispatch::Sink, HalfMat<'_>) -> Result<(), crate::GpuError>) {
    // Rows of n / 2 + 2 words hold whole vec4s of f16 where n does
    // (linear_matrix.wgsl's Y_VEC4: four outputs a store), of n / 2 + 3 never.
    for pad in [2, 3] {
        check_written_in_rows_of(gpu, y, [m, n], piece, n / 2 + pad, &write);
    }
}

fn check_written_in_rows_of(gpu: &Gpu, y: &[f32], [m, n]: [usize; 2], piece: usize, word_stride: usize, write: impl Fn(&mut dyn crate::dispatch::Sink, HalfMat<'_>) -> Result<(), crate::GpuError>) {
    let pieces = n.div_ceil(piece);
    let (words_at, scales_stride) = (2usize, pieces + 3);
    let scales_at = words_at + m * word_stride;
    let len = scales_at + m * scales_stride;
    let out = poisoned(gpu, len);
    let dst = HalfMat::pieces(Mat { buf: &out, offset: words_at as u64, stride: word_stride as u64 }, Mat { buf: &out, offset: scales_at as u64, stride: scales_stride as u64 }, piece as u64);
    let all = run_and_read(gpu, &out, len, |enc| write(enc, dst));
    for row in 0..m {
        for p in 0..pieces {
            let cols = p * piece..((p + 1) * piece).min(n);
            let (want_words, want_scales) = pack_rows(&y[row * n + cols.start..row * n + cols.end], 1, cols.len());
            let first = words_at + row * word_stride + cols.start / 2;
            let got: Vec<u32> = all[first..first + cols.len() / 2].iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want_words, "row {row}, piece {p}: f16 values, rows {word_stride} words apart");
            assert_eq!(all[scales_at + row * scales_stride + p], want_scales[0], "row {row}, piece {p}: scale, rows {word_stride} words apart");
        }
    }
}

/// `x·Wᵀ` into f16 pieces and into f32 rows: the pieces are the f32 rows'
/// values, each piece divided by its range scale and rounded to f16
/// ([`check_written_in_pieces`]).
fn check_linear_into_half_pieces(gpu: &Gpu, [m, n, k]: [usize; 3], piece: usize) {
    let mut rng = Rng::new((m * 29 + n * 3 + k) as u64);
    let mut x = rng.normals(m * k, 1.0);
    x[2 * k..3 * k].iter_mut().for_each(|v| *v *= 5e3);
    // One piece's weight rows far larger than the others'.
    let mut w = rng.bf16s(piece * k, 4.0);
    w.extend(rng.bf16s((n - piece) * k, 0.05));
    let (xb, wb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w));
    let s = Gemm { m: m as u64, n: n as u64, k: k as u64 };
    let yb = poisoned(gpu, m * n);
    let y = run_and_read(gpu, &yb, m * n, |enc| linear_from(gpu, enc, Input::F32(Mat::new(&xb, k as u64)), Weight::bf16(&wb), None, Mat::new(&yb, n as u64), s));
    check_written_in_pieces(gpu, &y, [m, n], piece, |enc, dst| linear_into_half(gpu, enc, Input::F32(Mat::new(&xb, k as u64)), Weight::bf16(&wb), dst, s));
}

#[test]
fn linear_into_half_pieces_writes_the_f32_values_as_the_range_rule_rounds_each_piece() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let block = gpu.matrix().expect("the matrix tier").size as usize * 8;
    // A block's outputs in two and four pieces (one would be a piece wider than klein's heads' half).
    for piece in [block / 2, block / 4] {
        assert!(product_writes_pieces(&gpu, piece as u64, false));
        check_linear_into_half_pieces(&gpu, [70, 3 * piece + 4, 96], piece);
        check_linear_into_half_pieces(&gpu, [128, 2 * block, 64], piece);
    }
    with_element_fetch(|| check_linear_into_half_pieces(&gpu, [33, 3 * block / 2, 96], block / 2));
    assert!(!product_writes_pieces(&gpu, (block / 8) as u64, false), "8 pieces a block");
}

/// The per-head RMSNorm + RoPE in place on f16 rows in pieces, and the f32
/// one (GPU-shaped, whose sums it shares) over the values those rows stand
/// for: the f32 result as the range rule rounds each piece. Rows in a
/// column window of wider words, scales a token 1 apart more than its pieces.
fn check_rms_norm_rope_half(gpu: &Gpu, f32_gpu: &Gpu, [tokens, heads, d]: [usize; 3], piece: usize, style: RopeStyle) {
    let width = heads * d;
    let mut rng = Rng::new((tokens * 7 + heads + d + piece) as u64);
    let mut x = rng.normals(tokens * width, 1.5);
    x[3 * width..4 * width].iter_mut().for_each(|v| *v *= 2e3);
    let pieces = width / piece;
    let (words, piece_scales) = pack_rows(&x, tokens * pieces, piece);
    let values = unpack_rows(&words, &piece_scales, piece);
    let w = rng.bf16s(d, 1.0);
    let first_row = 3usize;
    let angles: Vec<f64> = (0..(first_row + tokens) * d).map(|i| (i as f64 * 0.41).sin() * 2.5).collect();
    let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
    let shape = RowNorm { tokens: tokens as u64, heads: heads as u64, d: d as u64, eps: 1e-6 };
    // The f32 pass over the values.
    let want = {
        let g = f32_gpu;
        let (wb, cb, sb) = (g.upload_bf16("w", &w), g.upload_f32("cos", &cos), g.upload_f32("sin", &sin));
        let tables = RopeTables { cos: &cb, sin: &sb, first_row: first_row as u64 };
        let xb = g.upload_f32("x", &values);
        let rows = Mat::new(&xb, width as u64);
        run_and_read(g, &xb, tokens * width, |enc| match style {
            RopeStyle::Interleaved => rms_norm_rope(g, enc, rows, Weight::bf16(&wb), tables, shape),
            // Qwen3's: the per-head norm, then the rotate-half RoPE.
            RopeStyle::RotateHalf => {
                rms_norm_inplace(g, enc, rows, Weight::bf16(&wb), shape)?;
                rope(g, enc, style, rows, tables, HeadRows { tokens: tokens as u64, heads: heads as u64, head_dim: d as u64 })
            }
        })
    };
    let (wb, cb, sb) = (gpu.upload_bf16("w", &w), gpu.upload_f32("cos", &cos), gpu.upload_f32("sin", &sin));
    let tables = RopeTables { cos: &cb, sin: &sb, first_row: first_row as u64 };
    let (word_stride, from, scales_stride) = (width / 2 + 5, 2usize, pieces + 1);
    let scales_at = tokens * word_stride;
    let mut buffer = vec![0u32; scales_at + tokens * scales_stride];
    for t in 0..tokens {
        buffer[t * word_stride + from..t * word_stride + from + width / 2].copy_from_slice(&words[t * width / 2..(t + 1) * width / 2]);
        for p in 0..pieces {
            buffer[scales_at + t * scales_stride + p] = piece_scales[t * pieces + p].to_bits();
        }
    }
    let out = gpu.upload_u32("rows", &buffer);
    let data = HalfMat::pieces(Mat { buf: &out, offset: from as u64, stride: word_stride as u64 }, Mat { buf: &out, offset: scales_at as u64, stride: scales_stride as u64 }, piece as u64);
    let all = run_and_read(gpu, &out, buffer.len(), |enc| rms_norm_rope_half(gpu, enc, data, Weight::bf16(&wb), tables, style, shape));
    let (want_words, want_scales) = pack_rows(&want, tokens * pieces, piece);
    for t in 0..tokens {
        let got: Vec<u32> = all[t * word_stride + from..t * word_stride + from + width / 2].iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want_words[t * width / 2..(t + 1) * width / 2], "token {t}: f16 values");
        let got_scales = &all[scales_at + t * scales_stride..scales_at + t * scales_stride + pieces];
        assert_eq!(got_scales, &want_scales[t * pieces..(t + 1) * pieces], "token {t}: scales");
        // The words before the window are untouched.
        assert_eq!(all[t * word_stride].to_bits(), 0, "token {t}: outside the window");
    }
}

#[test]
fn rms_norm_rope_on_half_pieces_equals_it_on_their_f32_values_rounded_by_the_range_rule() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let f32_gpu = Gpu::new(&GpuOptions { gpu_shaped_kernels: true, ..options() }).unwrap_or_else(|e| panic!("{e}"));
    // klein's heads in two pieces; a head one piece; heads in four pieces.
    check_rms_norm_rope_half(&gpu, &f32_gpu, [37, 3, 128], 64, RopeStyle::Interleaved);
    check_rms_norm_rope_half(&gpu, &f32_gpu, [20, 2, 64], 64, RopeStyle::Interleaved);
    check_rms_norm_rope_half(&gpu, &f32_gpu, [9, 4, 64], 16, RopeStyle::Interleaved);
}

#[test]
fn rotate_half_rms_norm_rope_on_half_pieces_equals_the_norm_then_rope_on_their_f32_values_rounded_by_the_range_rule() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let f32_gpu = Gpu::new(&GpuOptions { gpu_shaped_kernels: true, ..options() }).unwrap_or_else(|e| panic!("{e}"));
    // Qwen3-4B's heads in two pieces (a pair's values in different pieces); in four; one piece.
    check_rms_norm_rope_half(&gpu, &f32_gpu, [37, 3, 128], 64, RopeStyle::RotateHalf);
    check_rms_norm_rope_half(&gpu, &f32_gpu, [9, 4, 64], 16, RopeStyle::RotateHalf);
    check_rms_norm_rope_half(&gpu, &f32_gpu, [11, 2, 32], 32, RopeStyle::RotateHalf);
}

#[test]
fn swiglu_into_half_pieces_writes_the_f32_values_as_the_range_rule_rounds_each_piece() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let config = gpu.matrix().expect("the matrix tier");
    let block = config.size as usize * 4;
    // A block's outputs in one, two and four pieces; a piece that is not whole in a block refused.
    for piece in [block, block / 2, block / 4] {
        assert!(swiglu_writes_pieces(&gpu, piece as u64), "{config:?} writes pieces of {piece}");
        // Ragged rows and a ragged last piece; whole blocks.
        check_swiglu_into_half_pieces(&gpu, [70, 3 * piece / 2 + 2, 96], piece);
        check_swiglu_into_half_pieces(&gpu, [128, 2 * block, 128], piece);
    }
    with_element_fetch(|| check_swiglu_into_half_pieces(&gpu, [70, 3 * block / 2 + 2, 96], block));
    assert!(!swiglu_writes_pieces(&gpu, (block / 8) as u64) && !swiglu_writes_pieces(&gpu, (3 * block / 4) as u64));
}

/// Attention into f16 pieces and into f32 rows on the matrix tier: the
/// pieces are the f32 output's values, each piece of a query's row divided
/// by its range scale and rounded to f16; the output a column window of a
/// wider tensor, its scales a row 1 apart more than its pieces.
fn check_attention_into_half_pieces(gpu: &Gpu, [len, heads, head_dim]: [usize; 3], piece: usize) {
    check_attention_of_half_pieces(gpu, [len, heads, head_dim], piece, false);
}

/// How an attention of f16 pieces is asked: query heads to a key head, and
/// whether it is causal over keys whose last `padding` are masked (a
/// right-padded prompt's, as the text encoder attends).
#[derive(Clone, Copy)]
struct Masking {
    group: usize,
    causal: bool,
    padding: usize,
}

const UNMASKED: Masking = Masking { group: 1, causal: false, padding: 0 };

/// [`check_attention_into_half_pieces`], and with `half_inputs` over
/// queries, keys and values as f16 rows in pieces too (the f32 attention
/// then over the values they stand for).
fn check_attention_of_half_pieces(gpu: &Gpu, shape: [usize; 3], piece: usize, half_inputs: bool) {
    check_masked_attention_of_half_pieces(gpu, shape, piece, half_inputs, UNMASKED);
}

/// [`check_attention_of_half_pieces`] with grouped heads, causal and a key mask.
fn check_masked_attention_of_half_pieces(gpu: &Gpu, [len, heads, head_dim]: [usize; 3], piece: usize, half_inputs: bool, masking: Masking) {
    let width = heads * head_dim;
    let kv_heads = heads / masking.group;
    let kv_width = kv_heads * head_dim;
    let mut rng = Rng::new((len * 3 + heads * 11 + head_dim) as u64);
    let (mut q, mut k) = (rng.normals(len * width, 1.0), rng.normals(len * kv_width, 1.0));
    let mut v = rng.normals(len * kv_width, 1.0);
    // A head's values far larger in its first dims: pieces of one row far apart in range.
    for row in v.chunks_mut(kv_width) {
        row[..head_dim / 2].iter_mut().for_each(|x| *x *= 4e3);
    }
    // Each as f16 pieces: their words and scales, and the values they stand for.
    let mut packed = Vec::new();
    for (t, w) in [(&mut q, width), (&mut k, kv_width), (&mut v, kv_width)] {
        let (words, scales) = pack_rows(t, len * w / piece, piece);
        *t = unpack_rows(&words, &scales, piece);
        packed.push((gpu.upload_u32("words", &words), gpu.upload_f32("scales", &scales), w));
    }
    let half_of = |i: usize| {
        let w = packed[i].2;
        HalfMat::pieces(Mat::new(&packed[i].0, (w / 2) as u64), Mat::new(&packed[i].1, (w / piece) as u64), piece as u64)
    };
    let (qb, kb, vb) = (gpu.upload_f32("q", &q), gpu.upload_f32("k", &k), gpu.upload_f32("v", &v));
    let qkv = Qkv { q: Mat::new(&qb, width as u64), k: Mat::new(&kb, kv_width as u64), v: Mat::new(&vb, kv_width as u64) };
    let keep: Vec<u32> = (0..len).map(|j| u32::from(j + masking.padding < len)).collect();
    let mask = gpu.upload_u32("key mask", &keep);
    let key_keep = (masking.padding > 0).then_some(&*mask);
    let s = Attention {
        q_len: len as u64,
        kv_len: len as u64,
        q_heads: heads as u64,
        kv_heads: kv_heads as u64,
        head_dim: head_dim as u64,
        scale: (1.0 / (head_dim as f64).sqrt()) as f32,
        causal: masking.causal,
    };
    let ob = poisoned(gpu, len * width);
    let o = run_and_read(gpu, &ob, len * width, |enc| attention(gpu, enc, qkv, key_keep, Mat::new(&ob, width as u64), s));
    let pieces = width / piece;
    let (words_at, word_stride, scales_stride) = (4usize, width / 2 + 2, pieces + 1);
    let scales_at = words_at + len * word_stride;
    let total = scales_at + len * scales_stride;
    let out = poisoned(gpu, total);
    let dst = HalfMat::pieces(Mat { buf: &out, offset: words_at as u64, stride: word_stride as u64 }, Mat { buf: &out, offset: scales_at as u64, stride: scales_stride as u64 }, piece as u64);
    let all = run_and_read(gpu, &out, total, |enc| match half_inputs {
        true => attention_half_into_half(gpu, enc, HalfQkv { q: half_of(0), k: half_of(1), v: half_of(2) }, key_keep, dst, s),
        false => attention_into_half(gpu, enc, qkv, key_keep, dst, s),
    });
    let (want_words, want_scales) = pack_rows(&o, len * pieces, piece);
    for row in 0..len {
        let first = words_at + row * word_stride;
        let got: Vec<u32> = all[first..first + width / 2].iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want_words[row * width / 2..(row + 1) * width / 2], "query {row}: f16 values");
        let got_scales = &all[scales_at + row * scales_stride..scales_at + row * scales_stride + pieces];
        assert_eq!(got_scales, &want_scales[row * pieces..(row + 1) * pieces], "query {row}: scales");
    }
}

#[test]
fn attention_into_half_pieces_writes_the_f32_output_as_the_range_rule_rounds_each_piece() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    check_attention_into_half_pieces(&gpu, [37, 2, 128], 64);
    check_attention_into_half_pieces(&gpu, [20, 3, 64], 64);
    check_attention_into_half_pieces(&gpu, [9, 4, 16], 16);
}

#[test]
fn attention_over_half_pieces_equals_it_over_their_f32_values() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    check_attention_of_half_pieces(&gpu, [37, 2, 128], 64, true);
    check_attention_of_half_pieces(&gpu, [20, 3, 64], 32, true);
}

#[test]
fn causal_grouped_masked_attention_of_half_pieces_equals_it_over_their_f32_values() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    // Qwen3's attention: four query heads a key head, causal, a right-padded prompt's keys masked.
    let qwen = Masking { group: 4, causal: true, padding: 9 };
    check_masked_attention_of_half_pieces(&gpu, [45, 8, 128], 64, true, qwen);
    check_masked_attention_of_half_pieces(&gpu, [45, 8, 128], 64, false, qwen);
    check_masked_attention_of_half_pieces(&gpu, [21, 4, 32], 32, true, Masking { group: 2, ..qwen });
}

#[test]
fn linear_refuses_half_rows_off_the_matrix_tier() {
    let gpu = gpu();
    let (hb, sb, yb) = (gpu.upload_u32("x half", &[0; 8]), gpu.upload_f32("x scales", &[1.0; 2]), gpu.storage("y", 16));
    let wb = gpu.upload_f32("w", &[0.0; 16]);
    let half_rows = HalfMat::rows(Mat::new(&hb, 4), Mat::new(&sb, 1));
    let mut sink = Vec::new();
    let got = linear_from(gpu, &mut sink, Input::Half(half_rows), Weight::f32(&wb), None, Mat::new(&yb, 2), Gemm { m: 2, n: 2, k: 8 });
    assert!(gpu.matrix().is_none() && got.is_err(), "{got:?}");
}

/// One LayerNorm pass whose rows from 17 on take a later shift and scale
/// gives the bits of two passes, one over each part: into f32 rows, or
/// (`half`) into f16 rows under their range scales.
fn check_later_modulation(gpu: &Gpu, half: bool) {
    let (tokens, d, split) = (41usize, 64usize, 17usize);
    let mut rng = Rng::new(17);
    let x = rng.normals(tokens * d, 2.0);
    let modulation = rng.normals(4 * d, 0.5);
    let (xb, mb) = (gpu.upload_f32("x", &x), gpu.upload_f32("modulation", &modulation));
    let row = |i: usize| Mat { buf: &mb, offset: (i * d) as u64, stride: 0 };
    let (first, later) = (Modulation::of(row(0), row(1)), Modulation::of(row(2), row(3)));
    let len = if half { tokens * d / 2 + tokens } else { tokens * d };
    let run = |one_pass: bool| {
        let out = poisoned(gpu, len);
        run_and_read(gpu, &out, len, |enc| {
            // Rows `r0 .. r0 + n` under `m`.
            let mut pass = |r0: usize, n: usize, m: Modulation<'_>| {
                let src = Mat { buf: &xb, offset: (r0 * d) as u64, stride: d as u64 };
                let shape = RowNorm { tokens: n as u64, heads: 1, d: d as u64, eps: 1e-6 };
                match half {
                    true => {
                        let data = Mat { buf: &out, offset: (r0 * d / 2) as u64, stride: (d / 2) as u64 };
                        let scales = Mat { buf: &out, offset: (tokens * d / 2 + r0) as u64, stride: 1 };
                        layer_norm_modulate_half(gpu, enc, src, m, HalfMat::rows(data, scales), shape)
                    }
                    false => layer_norm_modulate(gpu, enc, src, m, Mat { buf: &out, offset: (r0 * d) as u64, stride: d as u64 }, shape),
                }
            };
            if one_pass {
                let both = Modulation { later: Some(LaterModulation { row: split as u64, shift: later.shift, scale: later.scale }), ..first };
                return pass(0, tokens, both);
            }
            pass(0, split, first)?;
            pass(split, tokens - split, later)
        })
    };
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let (one, two) = (run(true), run(false));
    assert_eq!(bits(&one), bits(&two), "half {half}, on {}", gpu.precision().name());
    assert!(one.iter().all(|v| v.is_finite()), "every value written");
}

#[test]
fn a_later_modulation_gives_the_bits_of_two_passes() {
    each_kernel_shape(gpu(), options(), |g| check_later_modulation(g, false));
    // Rows in pieces of 15 (bindings of 4 KiB): the later row counted from each piece's first.
    let small = Gpu::new(&GpuOptions { max_storage_binding: Some(4096), ..options() }).unwrap_or_else(|e| panic!("{e}"));
    check_later_modulation(&small, false);
}

#[test]
fn a_later_modulation_gives_the_bits_of_two_passes_into_f16_rows() {
    let Some(gpu) = half_gpu() else { return };
    each_kernel_shape(&gpu, GpuOptions { precision: crate::Precision::F16, ..options() }, |g| check_later_modulation(g, true));
}

/// A bf16 weight packed in place into f16 under its rows' measured scales
/// gives the range rule's words for its values (`range_rule::pack_rows`),
/// whole and split over rows where a binding holds only part of it
/// (bindings of 4 KiB against 12 KiB of words; before the split, such a
/// weight was refused).
#[test]
fn a_weight_packed_into_f16_gives_the_range_rules_words_whole_and_split_over_rows() {
    use crate::kernels::{measure_weight_rows, pack_weight_half};
    let (n, k) = (48usize, 128usize);
    let mut rng = Rng::new(81);
    let mut w = rng.bf16s(n * k, 0.1);
    // Rows far above and far below f16's range take their own scales.
    let scaled = |v: u16, by: f32| half::bf16::from_f32(half::bf16::from_bits(v).to_f32() * by).to_bits();
    w[3 * k..4 * k].iter_mut().for_each(|v| *v = scaled(*v, 1e6));
    w[40 * k..41 * k].iter_mut().for_each(|v| *v = scaled(*v, 1e-6));
    let values: Vec<f32> = w.iter().map(|v| half::bf16::from_bits(*v).to_f32()).collect();
    let (expected, _) = pack_rows(&values, n, k);
    let small = small_binding_gpu(4 << 10);
    for (what, gpu) in [("whole", gpu()), ("split over rows", &small)] {
        let wb = gpu.upload_bf16("w", &w);
        let scales = gpu.storage("weight row scales", 4 * n as u64);
        gpu.submit(|enc| measure_weight_rows(gpu, enc, Weight::bf16(&wb), n as u64, k as u64, &scales, 0)).unwrap();
        gpu.submit(|enc| pack_weight_half(gpu, enc, Weight::bf16(&wb), Mat::new(&scales, 1), [n as u64, k as u64])).unwrap_or_else(|e| panic!("{what}: {e}"));
        let bytes = gpu.read_bytes(&wb, 0, 2 * (n * k) as u64).unwrap();
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
        let differ = words.iter().zip(&expected).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{what}: {differ} of {} words differ from the range rule's", expected.len());
    }
}

/// The flash kernel (forced, whatever the device's start-up check found)
/// over f16 pieces copies each run of four dims as stored, shifted from its
/// piece's scale to its row's (or the tile's values') by one f16 multiply,
/// or in f32 where that shift is below f16's normals: the bits of the same
/// kernel over the f32 values those pieces stand for, which it widens,
/// scales and rounds value by value.
#[test]
fn the_flash_kernel_over_half_pieces_copies_them_as_stored_with_the_bits_of_it_over_their_values() {
    use crate::kernels::attention::{flash_attention, flash_attention_half};
    let Some(gpu) = f16_matrix_gpu() else { return };
    for ([len, heads, head_dim], piece) in [([37usize, 2usize, 128usize], 64usize), ([20, 3, 64], 32)] {
        let width = heads * head_dim;
        let mut rng = Rng::new((len + head_dim) as u64);
        let mut qkv: Vec<Vec<f32>> = (0..3).map(|_| rng.normals(len * width, 1.0)).collect();
        for (i, row) in qkv[0].chunks_mut(width).enumerate() {
            // A query's first piece 10⁵ times its others' range: those shift by
            // less than f16's smallest normal, in f32.
            if i % 3 == 0 {
                row[..piece].iter_mut().for_each(|x| *x *= 1e5);
            }
        }
        for (i, row) in qkv[1].chunks_mut(width).enumerate() {
            // A key's later pieces tiny beside its first: the same in f32; others 8 times apart, in f16.
            let factor = if i % 2 == 0 { 1e-6 } else { 0.125 };
            row[piece..].iter_mut().for_each(|x| *x *= factor);
        }
        // The values' first dims far larger, 10⁵ or 4·10³ times, in turn:
        // the tile's shared scale is theirs, and the output's dims of the
        // values' small pieces are made of those pieces alone, so their
        // shifts (in f32 below f16's normals, else in f16) show in its bits.
        for (i, row) in qkv[2].chunks_mut(width).enumerate() {
            let factor = if i % 2 == 0 { 1e5 } else { 4e3 };
            row[..head_dim / 2].iter_mut().for_each(|x| *x *= factor);
        }
        let mut packed = Vec::new();
        for t in qkv.iter_mut() {
            let (words, scales) = pack_rows(t, len * width / piece, piece);
            *t = unpack_rows(&words, &scales, piece);
            packed.push((gpu.upload_u32("words", &words), gpu.upload_f32("scales", &scales)));
        }
        let half_of = |i: usize| HalfMat::pieces(Mat::new(&packed[i].0, (width / 2) as u64), Mat::new(&packed[i].1, (width / piece) as u64), piece as u64);
        let values: Vec<_> = qkv.iter().map(|t| gpu.upload_f32("values", t)).collect();
        let s = Attention { q_len: len as u64, kv_len: len as u64, q_heads: heads as u64, kv_heads: heads as u64, head_dim: head_dim as u64, scale: (1.0 / (head_dim as f64).sqrt()) as f32, causal: false };
        let ob = poisoned(&gpu, len * width);
        let of_values = Qkv { q: Mat::new(&values[0], width as u64), k: Mat::new(&values[1], width as u64), v: Mat::new(&values[2], width as u64) };
        let o = run_and_read(&gpu, &ob, len * width, |enc| flash_attention(&gpu, enc, of_values, Mat::new(&ob, width as u64), s));
        let pieces = width / piece;
        let out = poisoned(&gpu, len * (width / 2 + pieces));
        let words_end = (len * width / 2) as u64;
        let dst = HalfMat::pieces(Mat::new(&out, (width / 2) as u64), Mat { buf: &out, offset: words_end, stride: pieces as u64 }, piece as u64);
        let all = run_and_read(&gpu, &out, len * (width / 2 + pieces), |enc| flash_attention_half(&gpu, enc, HalfQkv { q: half_of(0), k: half_of(1), v: half_of(2) }, dst, s));
        let (want_words, want_scales) = pack_rows(&o, len * pieces, piece);
        let got_words: Vec<u32> = all[..len * width / 2].iter().map(|v| v.to_bits()).collect();
        assert_eq!(got_words, want_words, "{len} queries, {heads} heads of {head_dim}, pieces of {piece}: f16 values");
        assert_eq!(&all[len * width / 2..], &want_scales[..], "{len} queries, {heads} heads of {head_dim}, pieces of {piece}: scales");
    }
}
