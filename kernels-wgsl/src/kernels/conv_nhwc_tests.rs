//! Tests of `conv_nhwc.rs`: the channels-last f16 convolution against the
//! f64 oracle (NCHW) on the operands as the tier rounds them.

use super::*;
use crate::range_rule::{pack_rows, unpack_rows};
use crate::testing::*;
use crate::GpuOptions;
use flux_lite_core::oracle::{self as r, Weights};

#[path = "conv_nhwc_block_tests.rs"]
mod blocks;

/// `[channels, pixels]` values as `[pixels, channels]` rows, and back.
fn to_nhwc(x: &[f32], channels: usize, pixels: usize) -> Vec<f32> {
    (0..pixels * channels).map(|i| x[(i % channels) * pixels + i / channels]).collect()
}

fn to_nchw(x: &[f32], channels: usize, pixels: usize) -> Vec<f32> {
    (0..pixels * channels).map(|i| x[(i % pixels) * channels + i / pixels]).collect()
}

/// W `[co, ci, ky, kx]` (PyTorch's) as `[co, ky, kx, ci]`.
fn taps_channels_last(w: &[u16], s: &ConvShape) -> Vec<u16> {
    let (ci, kk) = (s.in_channels, s.kernel * s.kernel);
    (0..w.len()).map(|i| {
        let (co, rest) = (i / (kk * ci), i % (kk * ci));
        let (tap, c) = (rest / ci, rest % ci);
        w[co * ci * kk + c * kk + tap]
    }).collect()
}

/// The convolution of `s` over seeded channels-last f16 input (a range
/// scale a pixel, some pixels far from the others in range), read as
/// stored or upsampled, against the oracle on the f16 values (their f32
/// sums: the f32 kernels' bound) and on the exact ones (the half tiers'
/// product bound); with `residual`, onto seeded values already in y.
fn check_nhwc_conv(gpu: &Gpu, s: ConvShape, input: NhwcInput, residual: bool, seed: u64) {
    check_nhwc_conv_ordered(gpu, s, input, residual, seed, TapOrder::ChannelsLast);
}

/// [`check_nhwc_conv`] with W's taps in `order`.
fn check_nhwc_conv_ordered(gpu: &Gpu, s: ConvShape, input: NhwcInput, residual: bool, seed: u64, order: TapOrder) {
    check_nhwc_conv_from(gpu, s, input, residual, seed, order, None);
}

/// A pixel's `channels` values packed as f16 under a scale every `piece`
/// of them (one a pixel without), and the values they stand for.
/// An odd channel count's row takes whole words, its last half zero.
fn pack_pixels(x: &[f32], pixels: usize, channels: usize, piece: Option<usize>) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    if channels % 2 == 1 && piece.is_none() {
        let padded: Vec<f32> = x.chunks(channels).flat_map(|px| px.iter().copied().chain([0.0])).collect();
        let (words, scales, values) = pack_pixels(&padded, pixels, channels + 1, None);
        return (words, scales, values.chunks(channels + 1).flat_map(|px| px[..channels].to_vec()).collect());
    }
    let piece = piece.unwrap_or(channels);
    let (words, scales) = pack_rows(x, pixels * channels / piece, piece);
    let values = unpack_rows(&words, &scales, piece);
    (words, scales, values)
}

/// [`check_nhwc_conv_ordered`] over an input in pieces of `x_piece` channels
/// (a scale a pixel without), as the VAE's stream is written.
fn check_nhwc_conv_from(gpu: &Gpu, s: ConvShape, input: NhwcInput, residual: bool, seed: u64, order: TapOrder, x_piece: Option<usize>) {
    let up = if input == NhwcInput::Upsampled { 2 } else { 1 };
    let (pixels, out_pixels) = (s.height * s.width, s.out_height * s.out_width);
    let mut rng = Rng::new(seed);
    let mut x = rng.normals(s.in_channels * pixels, 1.0);
    // A pixel a hundred times larger and one a thousand times smaller than the rest.
    for c in 0..s.in_channels {
        x[c * pixels + pixels / 2] *= 100.0;
        x[c * pixels + pixels / 3] *= 1e-3;
    }
    let (words, scales, x16) = pack_pixels(&to_nhwc(&x, s.in_channels, pixels), pixels, s.in_channels, x_piece);
    let x16 = to_nchw(&x16, s.in_channels, pixels);
    let w = rng.bf16s(s.out_channels * s.in_channels * s.kernel * s.kernel, 0.3);
    let b = rng.bf16s(s.out_channels, 1.0);
    let widen = |v: &[u16]| -> Vec<f32> { v.iter().map(|&h| flux_lite_core::numerics::bf16::to_f32(h)).collect() };
    let (wf, bf) = (widen(&w), widen(&b));
    let round = operand_rounding(gpu);
    let w16: Vec<f32> = wf.iter().map(|&v| round(v)).collect();
    // The oracle's input: the stored values, upsampled where the kernel reads them so.
    let seen = |v: &[f32]| -> (Vec<f32>, ConvShape) {
        if up == 1 {
            return (v.to_vec(), s);
        }
        let mut wide = vec![0.0; s.in_channels * 4 * pixels];
        r::upsample_nearest2x(v, s.in_channels, s.height, s.width, &mut wide);
        (wide.iter().map(|&v| v as f32).collect(), ConvShape { height: 2 * s.height, width: 2 * s.width, ..s })
    };
    let before = if residual { rng.normals(s.out_channels * out_pixels, 1.0) } else { vec![0.0; s.out_channels * out_pixels] };
    let oracle = |input: &[f32], weights: &[f32]| -> Vec<f64> {
        let (input, shape) = seen(input);
        let mut y = vec![0.0; s.out_channels * out_pixels];
        r::conv2d(&input, Weights::F32(weights), Weights::F32(&bf), shape, &mut y);
        y.iter().zip(&before).map(|(v, b)| v + f64::from(*b)).collect()
    };
    let (rounded, exact) = (oracle(&x16, &w16), oracle(&x, &wf));
    let xb = gpu.upload_u32("x", &words);
    let xs = gpu.upload_f32("x scales", &scales);
    let stored_w = match order {
        TapOrder::ChannelsLast => taps_channels_last(&w, &s),
        TapOrder::Torch => w.clone(),
    };
    let (wb, bb) = (gpu.upload_bf16("w", &stored_w), gpu.upload_bf16("b", &b));
    let yb = if residual { gpu.upload_f32("y", &to_nhwc(&before, s.out_channels, out_pixels)) } else { poisoned(gpu, s.out_channels * out_pixels) };
    let xh = input_rows(&xb, &xs, s.in_channels, x_piece);
    let got = run_and_read(gpu, &yb, s.out_channels * out_pixels, |enc| {
        let weights = NhwcWeights { w: Weight::bf16(&wb), bias: Weight::bf16(&bb), order };
        conv2d_matrix_nhwc(gpu, enc, xh.into(), weights, NhwcOutput::F32 { y: Mat::new(&yb, s.out_channels as u64), residual, relu: false }, s, input)
    });
    let got = to_nchw(&got, s.out_channels, out_pixels);
    let what = format!("channels-last conv {s:?} {input:?}, W {order:?}, residual {residual}, input pieces {x_piece:?}");
    assert_close(&format!("{what}, vs the operands as the tier rounds them"), &got, &rounded, F32_TOL);
    println!("{what}: relative L2 {:.2e} against the exact operands", rel_l2(&got, &exact));
    assert_close(&format!("{what}, vs exact operands"), &got, &exact, crate::selftest::HALF_PRODUCT);
}

/// f16 rows of `channels` in `buf` and their scales in `scales`: one a pixel, or one every `piece`.
fn input_rows<'a>(buf: &'a wgpu::Buffer, scales: &'a wgpu::Buffer, channels: usize, piece: Option<usize>) -> HalfMat<'a> {
    let data = Mat::new(buf, channels.div_ceil(2) as u64);
    match piece {
        None => HalfMat::rows(data, Mat::new(scales, 1)),
        Some(p) => HalfMat::pieces(data, Mat::new(scales, (channels / p) as u64), p as u64),
    }
}

/// The convolution's f16 output in pieces of `y_piece` (with a residual's
/// f16 rows in the same pieces where `residual`) is its f32 output (onto
/// the residual's values), rounded under the range rule a piece: the same
/// words and scales as the host's packing of the f32 kernel's values, bit
/// for bit (the f32 output is held to the oracle above).
fn check_half_output(gpu: &Gpu, s: ConvShape, input: NhwcInput, [x_piece, y_piece]: [Option<usize>; 2], residual: bool, relu: bool, seed: u64) {
    let (pixels, out_pixels, cout) = (s.height * s.width, s.out_height * s.out_width, s.out_channels);
    let mut rng = Rng::new(seed);
    let mut x = rng.normals(s.in_channels * pixels, 1.0);
    x.iter_mut().skip(pixels / 2).step_by(pixels).for_each(|v| *v *= 100.0);
    let (words, scales, _) = pack_pixels(&x, pixels, s.in_channels, x_piece);
    let (xb, xs) = (gpu.upload_u32("x", &words), gpu.upload_f32("x scales", &scales));
    let xh = input_rows(&xb, &xs, s.in_channels, x_piece);
    let (w, b) = (rng.bf16s(cout * s.in_channels * s.kernel * s.kernel, 0.3), rng.bf16s(cout, 1.0));
    let (wb, bb) = (gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
    let weights = NhwcWeights { w: Weight::bf16(&wb), bias: Weight::bf16(&bb), order: TapOrder::Torch };
    let y_piece = y_piece.unwrap_or(cout);
    // The residual: f16 rows in the output's pieces, a few pixels far larger than the rest.
    let mut before = rng.normals(cout * out_pixels, 2.0);
    before.iter_mut().step_by(7 * cout).for_each(|v| *v *= 300.0);
    let (r_words, r_scales, r_values) = pack_pixels(&before, out_pixels, cout, Some(y_piece));
    // The f32 kernel's values, onto the residual's where there is one.
    let yb = if residual { gpu.upload_f32("y", &r_values) } else { poisoned(gpu, cout * out_pixels) };
    let f32_out = run_and_read(gpu, &yb, cout * out_pixels, |enc| conv2d_matrix_nhwc(gpu, enc, xh.into(), weights, NhwcOutput::F32 { y: Mat::new(&yb, cout as u64), residual, relu }, s, input));
    let (want_words, want_scales, _) = pack_pixels(&f32_out, out_pixels, cout, Some(y_piece));
    // The f16 kernel: words from word `lead` (0: a pixel's four outputs a
    // store where the channels allow; 1: one word at a time), then scales,
    // in one poisoned buffer; the residual in its own.
    let (words_len, scales_len) = (out_pixels * cout / 2, out_pixels * cout / y_piece);
    let (rb, rs) = (gpu.upload_u32("residual", &r_words), gpu.upload_f32("residual scales", &r_scales));
    for lead in [0usize, 1] {
        let out = poisoned(gpu, lead + words_len + scales_len);
        let y = HalfMat::pieces(Mat { buf: &out, offset: lead as u64, stride: (cout / 2) as u64 }, Mat { buf: &out, offset: (lead + words_len) as u64, stride: (cout / y_piece) as u64 }, y_piece as u64);
        let r = residual.then(|| HalfMat::pieces(Mat::new(&rb, (cout / 2) as u64), Mat::new(&rs, (cout / y_piece) as u64), y_piece as u64));
        let all = run_and_read(gpu, &out, lead + words_len + scales_len, |enc| conv2d_matrix_nhwc(gpu, enc, xh.into(), weights, NhwcOutput::Half { y, residual: r, relu }, s, input));
        let got_words: Vec<u32> = all[lead..lead + words_len].iter().map(|v| v.to_bits()).collect();
        let what = format!("{s:?} {input:?}, input pieces {x_piece:?}, output pieces of {y_piece}, residual {residual}, relu {relu}, from word {lead}");
        assert_eq!(&all[lead + words_len..], &want_scales[..], "{what}: piece scales");
        let differ = got_words.iter().zip(&want_words).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{what}: {differ} of {words_len} words differ from the f32 output's packing");
    }
}

/// The f32 output (onto y's values) written four channels of a pixel at a
/// time (y from a whole vec4) and one at a time (from element 1): the
/// same bits; ReLU'd after the bias and y's values (a tiny decoder's
/// blocks), the plain rows (held to the oracle above) with every negative
/// output zeroed, bit for bit, both ways.
fn check_vector_stores(gpu: &Gpu, s: ConvShape, seed: u64) {
    let (pixels, out_pixels, cout) = (s.height * s.width, s.out_height * s.out_width, s.out_channels);
    let mut rng = Rng::new(seed);
    let (words, scales, _) = pack_pixels(&rng.normals(s.in_channels * pixels, 1.0), pixels, s.in_channels, None);
    let (xb, xs) = (gpu.upload_u32("x", &words), gpu.upload_f32("x scales", &scales));
    let (wb, bb) = (gpu.upload_bf16("w", &rng.bf16s(cout * s.in_channels * s.kernel * s.kernel, 0.3)), gpu.upload_bf16("b", &rng.bf16s(cout, 1.0)));
    let weights = NhwcWeights { w: Weight::bf16(&wb), bias: Weight::bf16(&bb), order: TapOrder::Torch };
    let before = rng.normals(cout * out_pixels, 1.0);
    let run = |lead: usize, relu: bool| -> Vec<u32> {
        let yb = gpu.upload_f32("y", &[vec![f32::NAN; lead], before.clone()].concat());
        let y = Mat { buf: &yb, offset: lead as u64, stride: cout as u64 };
        let all = run_and_read(gpu, &yb, lead + before.len(), |enc| conv2d_matrix_nhwc(gpu, enc, input_rows(&xb, &xs, s.in_channels, None).into(), weights, NhwcOutput::F32 { y, residual: true, relu }, s, NhwcInput::Plain));
        all[lead..].iter().map(|v| v.to_bits()).collect()
    };
    let (quads, singles) = (run(0, false), run(1, false));
    assert_eq!(quads, singles, "{s:?}: four outputs a store and one");
    assert!(quads.iter().all(|&b| f32::from_bits(b).is_finite()), "{s:?}: every output written");
    let negative = quads.iter().filter(|&&b| f32::from_bits(b) < 0.0).count();
    assert!(negative > 0 && negative < quads.len(), "{s:?}: outputs of both signs ({negative} of {} negative)", quads.len());
    let zeroed: Vec<u32> = quads.iter().map(|&b| f32::from_bits(b).max(0.0).to_bits()).collect();
    for lead in [0, 1] {
        let relu = run(lead, true);
        let differ = relu.iter().zip(&zeroed).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{s:?}, ReLU'd from element {lead}: {differ} of {} outputs differ from the plain ones zeroed", zeroed.len());
    }
}

/// An f32 W (a tiny decoder's file) packed into f16 under its rows' kept
/// range scales, into a buffer of its own, gives the bits of the f32 W
/// rounded in every tile; its bias (and a norm's gamma and beta) stay f32.
#[test]
fn a_packed_f32_w_gives_the_bits_of_the_f32_one() {
    use crate::kernels::half_pack::pack_weight_half_f32;
    use crate::kernels::linear::measure_weight_rows;
    let Some(gpu) = f16_matrix_gpu() else { return };
    for (order, s) in [(TapOrder::ChannelsLast, ConvShape::same(32, 40, 9, 7, 3)), (TapOrder::Torch, ConvShape::same(64, 32, 5, 6, 1))] {
        let (pixels, cout, taps) = (s.height * s.width, s.out_channels, s.in_channels * s.kernel * s.kernel);
        let mut rng = Rng::new(99);
        let (words, scales, _) = pack_pixels(&rng.normals(s.in_channels * pixels, 1.0), pixels, s.in_channels, None);
        let (xb, xs) = (gpu.upload_u32("x", &words), gpu.upload_f32("x scales", &scales));
        let xh = input_rows(&xb, &xs, s.in_channels, None);
        // Full f32 significands; a row far larger than the rest, one far smaller.
        let mut w = rng.normals(cout * taps, 0.3);
        w[..taps].iter_mut().for_each(|v| *v *= 512.0);
        w[taps..2 * taps].iter_mut().for_each(|v| *v /= 4096.0);
        let (wb, bb) = (gpu.upload_f32("w", &w), gpu.upload_f32("b", &rng.normals(cout, 1.0)));
        let row_scales = gpu.storage("w row scales", 4 * cout as u64);
        gpu.submit(|enc| measure_weight_rows(&gpu, enc, Weight::f32(&wb), cout as u64, taps as u64, &row_scales, 0)).unwrap();
        let halves = gpu.storage("packed w", 2 * (cout * taps) as u64);
        gpu.submit(|enc| pack_weight_half_f32(&gpu, enc, Weight::f32(&wb), &halves, Mat::new(&row_scales, 1), [cout as u64, taps as u64])).unwrap();
        let run = |w: Weight<'_>| -> Vec<u32> {
            let weights = NhwcWeights { w, bias: Weight::f32(&bb), order };
            let y = poisoned(&gpu, cout * pixels);
            let out = run_and_read(&gpu, &y, cout * pixels, |enc| conv2d_matrix_nhwc(&gpu, enc, xh.into(), weights, NhwcOutput::F32 { y: Mat::new(&y, cout as u64), residual: false, relu: false }, s, NhwcInput::Plain));
            out.iter().map(|v| v.to_bits()).collect()
        };
        let kept = |packed| Some(crate::RowScales { buf: &row_scales, offset: 0, k: taps as u64, packed });
        let f32 = run(Weight { scales: kept(false), ..Weight::f32(&wb) });
        let packed = run(Weight { scales: kept(true), ..Weight::bf16(&halves) });
        let differ = f32.iter().zip(&packed).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{order:?} {s:?}: {differ} of {} outputs differ", f32.len());
    }
}

#[test]
fn the_channels_last_conv_relus_its_outputs_after_the_bias_and_the_residual() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    // The f32 rows ReLU'd: check_vector_stores. f16 pieces: those rows packed, onto a residual and without, upsampled.
    check_half_output(&gpu, ConvShape::same(32, 64, 9, 7, 3), NhwcInput::Plain, [Some(32), Some(32)], true, true, 95);
    let upsampled = ConvShape { out_height: 10, out_width: 14, ..ConvShape::same(16, 16, 5, 7, 3) };
    check_half_output(&gpu, upsampled, NhwcInput::Upsampled, [Some(16), Some(16)], false, true, 96);
}

#[test]
fn the_channels_last_convs_vector_stores_give_its_element_stores_bits() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    // Channels past one block and a last quad partly past them (70), and whole blocks (64).
    check_vector_stores(&gpu, ConvShape::same(12, 70, 9, 7, 3), 90);
    check_vector_stores(&gpu, ConvShape::same(16, 64, 6, 5, 1), 91);
}

#[test]
fn the_channels_last_conv_writes_f16_pieces_as_the_range_rule_packs_its_f32_output() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    // Pieces of 32 and 16 (whole blocks, several a block), over more than one block of channels and pixels.
    check_half_output(&gpu, ConvShape::same(32, 96, 11, 9, 3), NhwcInput::Plain, [Some(16), Some(32)], true, false, 80);
    check_half_output(&gpu, ConvShape::same(16, 64, 13, 7, 3), NhwcInput::Plain, [None, Some(16)], false, false, 81);
    check_half_output(&gpu, ConvShape::same(64, 32, 6, 10, 1), NhwcInput::Plain, [Some(32), Some(32)], true, false, 82);
    // One piece a pixel narrower than a block; the upsampled read.
    check_half_output(&gpu, ConvShape::same(16, 16, 9, 9, 3), NhwcInput::Plain, [Some(16), None], true, false, 83);
    // Fewer channels than a block, in pieces narrower than a quarter of it
    // (8 × 8 tiles: 32 of 64 columns in pieces of 8; the block's columns
    // past them share the last piece's slot: matrix_gemm.wgsl's piece_slot).
    let quarter = gpu.matrix().map(|c| c.size as usize).expect("a matrix device");
    check_half_output(&gpu, ConvShape::same(16, 4 * quarter, 9, 7, 3), NhwcInput::Plain, [Some(16), Some(quarter)], true, false, 85);
    let upsampled = ConvShape { out_height: 10, out_width: 14, ..ConvShape::same(32, 32, 5, 7, 3) };
    check_half_output(&gpu, upsampled, NhwcInput::Upsampled, [Some(32), Some(32)], false, false, 84);
}

#[test]
fn the_channels_last_conv_reads_its_input_in_pieces() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    // Pieces of 16 and 32; a pixel a hundred times larger than the rest, so that A's row scale comes of one piece.
    check_nhwc_conv_from(&gpu, ConvShape::same(64, 40, 9, 11, 3), NhwcInput::Plain, true, 85, TapOrder::Torch, Some(16));
    check_nhwc_conv_from(&gpu, ConvShape::same(96, 24, 7, 5, 1), NhwcInput::Plain, false, 86, TapOrder::Torch, Some(32));
    let upsampled = ConvShape { out_height: 10, out_width: 14, ..ConvShape::same(32, 16, 5, 7, 3) };
    check_nhwc_conv_from(&gpu, upsampled, NhwcInput::Upsampled, false, 87, TapOrder::Torch, Some(16));
}

/// The convolution normalising its input as it reads it (a GroupNorm, then
/// `activation`, of the stream's f16 pieces) gives the sums it gives over
/// the rows the GroupNorm pass writes (held to the oracle by its own test;
/// for ReLU, those rows with every negative value zeroed: rounding keeps a
/// sign, so that is the rounding of the ReLU'd values): the same f16
/// operands wherever they are normal f16 under either scale, so the same
/// bits but for values the looser bound's scale takes below f16's normals.
fn check_normalised_input(gpu: &Gpu, s: ConvShape, input: NhwcInput, groups: usize, activation: NormActivation, seed: u64) {
    use crate::kernels::group_norm::{group_merge, group_moments, GroupAffine, GroupShape, GroupStats};
    use crate::kernels::group_norm_nhwc::group_norm_nhwc_half;
    use crate::kernels::Input;
    let (cin, cout, pixels, out_pixels) = (s.in_channels, s.out_channels, s.height * s.width, s.out_height * s.out_width);
    let mut rng = Rng::new(seed);
    let mut x = rng.normals(cin * pixels, 2.0);
    // A group far off zero, and one pixel far larger than the rest.
    x[..cin / groups].iter_mut().for_each(|v| *v += 40.0);
    x.iter_mut().skip(pixels / 3 * cin).take(cin).for_each(|v| *v *= 50.0);
    let (words, scales, _) = pack_pixels(&x, pixels, cin, Some(16));
    let (xb, xs) = (gpu.upload_u32("stream", &words), gpu.upload_f32("stream scales", &scales));
    let stream = input_rows(&xb, &xs, cin, Some(16));
    let (gamma, beta) = (rng.bf16s(cin, 1.0), rng.bf16s(cin, 0.5));
    let (gb, bb) = (gpu.upload_bf16("gamma", &gamma), gpu.upload_bf16("beta", &beta));
    let (w, b) = (rng.bf16s(cout * cin * s.kernel * s.kernel, 0.3), rng.bf16s(cout, 1.0));
    let (wb, bias) = (gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
    let weights = NhwcWeights { w: Weight::bf16(&wb), bias: Weight::bf16(&bias), order: TapOrder::Torch };
    let shape = GroupShape { channels: cin as u64, pixels: pixels as u64, width: s.width as u64, groups: groups as u64, channels_last: true };
    let affine = GroupAffine { gamma: Weight::bf16(&gb), beta: Weight::bf16(&bb), silu: activation == NormActivation::Silu };
    // The statistics, then the normalised rows as the GroupNorm pass writes them.
    let elements = 2 * groups * s.height + 2 * groups + pixels * (cin / 2 + 1);
    let scratch = gpu.storage("scratch", 4 * elements as u64);
    let moments = Mat { buf: &scratch, offset: 0, stride: 0 };
    let stats = Mat { buf: &scratch, offset: (2 * groups * s.height) as u64, stride: 0 };
    let normed_at = 2 * groups * s.height + 2 * groups;
    let normed = |buf| HalfMat::rows(Mat { buf, offset: normed_at as u64, stride: (cin / 2) as u64 }, Mat { buf, offset: (normed_at + pixels * cin / 2) as u64, stride: 1 });
    let mut passes = run_and_read(gpu, &scratch, elements, |enc| {
        group_moments(gpu, enc, Input::Half(stream), moments, shape)?;
        group_merge(gpu, enc, GroupStats { moments, stats, eps: 1e-6 }, shape.moments())?;
        group_norm_nhwc_half(gpu, enc, Input::Half(stream), stats, affine, normed(&scratch), shape)
    });
    if activation == NormActivation::Relu {
        // Each f16 half with its sign bit set becomes zero.
        for word in &mut passes[normed_at..normed_at + pixels * cin / 2] {
            let bits = word.to_bits();
            let keep = |half: u32| if half & 0x8000 != 0 { 0 } else { half };
            *word = f32::from_bits(keep(bits & 0xffff) | keep(bits >> 16) << 16);
        }
    }
    let passed = gpu.upload_f32("normalised rows", &passes);
    let (two_pass, fused) = (poisoned(gpu, cout * out_pixels), poisoned(gpu, cout * out_pixels));
    let want = run_and_read(gpu, &two_pass, cout * out_pixels, |enc| {
        conv2d_matrix_nhwc(gpu, enc, normed(&passed).into(), weights, NhwcOutput::F32 { y: Mat::new(&two_pass, cout as u64), residual: false, relu: false }, s, input)
    });
    let norm = NhwcNorm { stats, gamma: Weight::bf16(&gb), beta: Weight::bf16(&bb), groups: groups as u64, activation };
    let got = run_and_read(gpu, &fused, cout * out_pixels, |enc| conv2d_matrix_nhwc(gpu, enc, NhwcSource { rows: stream, norm: Some(norm) }, weights, NhwcOutput::F32 { y: Mat::new(&fused, cout as u64), residual: false, relu: false }, s, input));
    let largest = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    println!("{s:?} {input:?}, {groups} groups, {activation:?}: {differ} of {} outputs differ from the passes', at most {worst:.2e} (largest {largest:.2e})", want.len());
    assert!(worst <= largest * 2f32.powi(-20), "{s:?}, {activation:?}: fused {worst:.3e} off the passes' (largest {largest:.3e})");
}

#[test]
fn the_channels_last_conv_normalises_its_input_as_the_group_norm_pass_would() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    check_normalised_input(&gpu, ConvShape::same(64, 32, 9, 11, 3), NhwcInput::Plain, 8, NormActivation::Silu, 90);
    check_normalised_input(&gpu, ConvShape::same(32, 48, 7, 6, 3), NhwcInput::Plain, 4, NormActivation::None, 91);
    let upsampled = ConvShape { out_height: 10, out_width: 12, ..ConvShape::same(32, 16, 5, 6, 3) };
    check_normalised_input(&gpu, upsampled, NhwcInput::Upsampled, 2, NormActivation::Silu, 92);
    // A tiny decoder's global norm: 4 groups, ReLU after, into a 1×1 convolution.
    check_normalised_input(&gpu, ConvShape::same(64, 16, 9, 7, 1), NhwcInput::Plain, 4, NormActivation::Relu, 97);
    check_normalised_input(&gpu, ConvShape::same(32, 24, 6, 5, 3), NhwcInput::Plain, 4, NormActivation::Relu, 98);
}

/// A W packed into f16 under its rows' kept range scales where it reaches
/// the device gives the bits of the bf16 W rounded in every tile: staged
/// as bf16 pairs (taps last) and value by value (PyTorch's order).
#[test]
fn a_packed_w_gives_the_bits_of_the_bf16_one() {
    use crate::kernels::half_pack::pack_weight_half;
    use crate::kernels::linear::measure_weight_rows;
    let Some(gpu) = f16_matrix_gpu() else { return };
    for (order, s) in [(TapOrder::ChannelsLast, ConvShape::same(32, 40, 9, 7, 3)), (TapOrder::Torch, ConvShape::same(16, 24, 6, 5, 3)), (TapOrder::Torch, ConvShape::same(64, 32, 5, 6, 1))] {
        let (pixels, cout, taps) = (s.height * s.width, s.out_channels, s.in_channels * s.kernel * s.kernel);
        let mut rng = Rng::new(95);
        let x = rng.normals(s.in_channels * pixels, 1.0);
        let (words, scales, _) = pack_pixels(&x, pixels, s.in_channels, None);
        let (xb, xs) = (gpu.upload_u32("x", &words), gpu.upload_f32("x scales", &scales));
        let xh = input_rows(&xb, &xs, s.in_channels, None);
        // A row far larger than the rest, one far smaller.
        let mut w = rng.bf16s(cout * taps, 0.3);
        w[..taps].iter_mut().for_each(|v| *v = flux_lite_core::numerics::bf16::from_f32(flux_lite_core::numerics::bf16::to_f32(*v) * 512.0));
        w[taps..2 * taps].iter_mut().for_each(|v| *v = flux_lite_core::numerics::bf16::from_f32(flux_lite_core::numerics::bf16::to_f32(*v) / 4096.0));
        let b = rng.bf16s(cout, 1.0);
        let run = |packed: bool| -> Vec<u32> {
            let (wb, bb) = (gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
            let row_scales = gpu.storage("w row scales", 4 * cout as u64);
            gpu.submit(|enc| measure_weight_rows(&gpu, enc, Weight::bf16(&wb), cout as u64, taps as u64, &row_scales, 0)).unwrap();
            if packed {
                gpu.submit(|enc| pack_weight_half(&gpu, enc, Weight::bf16(&wb), Mat::new(&row_scales, 1), [cout as u64, taps as u64])).unwrap();
            }
            let kept = crate::RowScales { buf: &row_scales, offset: 0, k: taps as u64, packed };
            let weights = NhwcWeights { w: Weight { scales: Some(kept), ..Weight::bf16(&wb) }, bias: Weight::bf16(&bb), order };
            let y = poisoned(&gpu, cout * pixels);
            let out = run_and_read(&gpu, &y, cout * pixels, |enc| conv2d_matrix_nhwc(&gpu, enc, xh.into(), weights, NhwcOutput::F32 { y: Mat::new(&y, cout as u64), residual: false, relu: false }, s, NhwcInput::Plain));
            out.iter().map(|v| v.to_bits()).collect()
        };
        let (bf16, packed) = (run(false), run(true));
        let differ = bf16.iter().zip(&packed).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{order:?} {s:?}: {differ} of {} outputs differ", bf16.len());
    }
}

/// Every shape under the adapter's own staging of the GEMM core's k
/// steps; under the leaner stagings (`STAGINGS`),
/// a 3×3 over several blocks with a residual, and a downsampler.
#[test]
fn the_channels_last_conv_on_matrix_units_matches_the_oracle() {
    for (i, staging) in crate::kernels::linear::tests::STAGINGS.into_iter().enumerate() {
        let Some(gpu) = crate::kernels::linear::tests::staged_gpu(staging).and_then(with_f16_tiles) else { return };
        println!("{}", gpu.matrix().unwrap().describe());
        if i == 0 {
            check_nhwc_convs(&gpu);
        } else {
            check_nhwc_conv(&gpu, ConvShape::same(8, 130, 12, 13, 3), NhwcInput::Plain, true, 62);
            check_nhwc_conv(&gpu, downsampler(10, 14, 12), NhwcInput::Plain, true, 70);
        }
    }
}

fn check_nhwc_convs(gpu: &Gpu) {
    // 3×3 and 1×1; more than one block of output channels and of pixels; a residual.
    check_nhwc_conv(gpu, ConvShape::same(6, 10, 13, 9, 3), NhwcInput::Plain, false, 60);
    check_nhwc_conv(gpu, ConvShape::same(16, 20, 33, 17, 1), NhwcInput::Plain, false, 61);
    check_nhwc_conv(gpu, ConvShape::same(8, 130, 12, 13, 3), NhwcInput::Plain, true, 62);
    // Through the ×2 upsampling: a 5×7 input convolved at 10×14.
    let upsampled = ConvShape { out_height: 10, out_width: 14, ..ConvShape::same(12, 9, 5, 7, 3) };
    check_nhwc_conv(gpu, upsampled, NhwcInput::Upsampled, false, 63);
    // W as the model's files hold it.
    check_nhwc_conv_ordered(gpu, ConvShape::same(6, 10, 13, 9, 3), NhwcInput::Plain, true, 66, TapOrder::Torch);
    check_nhwc_conv_ordered(gpu, upsampled, NhwcInput::Upsampled, false, 67, TapOrder::Torch);
    // The encoder's: an image's three channels (a pixel two words); a
    // downsampler (stride 2, one row and column of zeros below and right).
    check_nhwc_conv(gpu, ConvShape::same(3, 12, 11, 10, 3), NhwcInput::Plain, false, 68);
    check_nhwc_conv_ordered(gpu, ConvShape::same(3, 12, 11, 10, 3), NhwcInput::Plain, false, 69, TapOrder::Torch);
    check_nhwc_conv(gpu, downsampler(10, 14, 12), NhwcInput::Plain, true, 70);
}

/// `Downsample2D`'s convolution of `channels` at `h × w` (even): 3×3,
/// stride 2, no padding above or left, to `h/2 × w/2`.
fn downsampler(channels: usize, h: usize, w: usize) -> ConvShape {
    ConvShape { stride: 2, pad_top: 0, pad_left: 0, out_height: h / 2, out_width: w / 2, ..ConvShape::same(channels, channels, h, w, 3) }
}

#[test]
fn the_channels_last_conv_in_pieces_of_pixels_matches_the_oracle() {
    // The tier checked first: where it is missing the test says so.
    let Some(tiles) = f16_matrix_gpu().map(|gpu| gpu.matrix().unwrap().size as usize / 8) else { return };
    // Bindings of 16 KiB with 8×8 tiles, 32 KiB with 16×16 (a block's input
    // window is then 19,136 bytes): the output in pieces of a few blocks of
    // pixels, each with its window of input rows.
    let small = Gpu::new(&GpuOptions { max_storage_binding: Some((16 << 10) * tiles as u64), precision: crate::Precision::Matrix, ..options() }).unwrap_or_else(|e| panic!("{e}"));
    let s = ConvShape::same(16, 24, 40 * tiles, 23, 3);
    let pixels = 920 * tiles;
    // 920 output pixels of 96 bytes (1,840 with 16×16 tiles): at least six pieces, and W's scales measured once.
    let (x, y) = (small.storage("x", 4 * pixels as u64 * 9), small.storage("y", 4 * pixels as u64 * 24));
    let (w, b) = (small.storage("w", 2 * 24 * 144 + 4), small.storage("b", 64));
    let mut recorded = Vec::new();
    let xh = HalfMat::rows(Mat::new(&x, 8), Mat { buf: &x, offset: pixels as u64 * 8, stride: 1 });
    let weights = NhwcWeights { w: Weight::bf16(&w), bias: Weight::bf16(&b), order: TapOrder::ChannelsLast };
    let out = NhwcOutput::F32 { y: Mat::new(&y, 24), residual: false, relu: false };
    conv2d_matrix_nhwc(&small, &mut recorded, xh.into(), weights, out, s, NhwcInput::Plain).unwrap_or_else(|e| panic!("{e}"));
    assert!(recorded.len() >= 7, "{} dispatches", recorded.len());
    check_nhwc_conv(&small, s, NhwcInput::Plain, true, 64);
    let upsampled = ConvShape { out_height: 36, out_width: 22, ..ConvShape::same(16, 12, 18, 11, 3) };
    check_nhwc_conv(&small, upsampled, NhwcInput::Upsampled, false, 65);
    check_nhwc_conv(&small, downsampler(16, 40, 46), NhwcInput::Plain, false, 71);
}

#[test]
fn the_channels_last_conv_refuses_what_it_cannot_take() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let buf = gpu.upload_f32("any", &[0.0; 64]);
    let xh = HalfMat::rows(Mat::new(&buf, 2), Mat::new(&buf, 1));
    let mut sink = Vec::new();
    let weights = NhwcWeights { w: Weight::f32(&buf), bias: Weight::f32(&buf), order: TapOrder::Torch };
    // Taps past two zeros of padding; an output the taps of the input cannot make; a stride through the upsampling.
    let out = NhwcOutput::F32 { y: Mat::new(&buf, 4), residual: false, relu: false };
    let padded = ConvShape { pad_top: 2, pad_left: 2, out_height: 6, out_width: 6, ..ConvShape::same(4, 4, 4, 4, 3) };
    assert!(conv2d_matrix_nhwc(&gpu, &mut sink, xh.into(), weights, out, padded, NhwcInput::Plain).is_err());
    let strided = ConvShape { stride: 2, out_height: 4, out_width: 4, ..ConvShape::same(4, 4, 4, 4, 3) };
    assert!(conv2d_matrix_nhwc(&gpu, &mut sink, xh.into(), weights, out, strided, NhwcInput::Plain).is_err());
    let up_strided = ConvShape { stride: 2, out_height: 4, out_width: 4, ..ConvShape::same(4, 4, 4, 4, 3) };
    assert!(conv2d_matrix_nhwc(&gpu, &mut sink, xh.into(), weights, out, up_strided, NhwcInput::Upsampled).is_err());
    // An odd channel count's rows given half-word apart.
    let odd = ConvShape::same(3, 4, 4, 4, 3);
    let tight = HalfMat::rows(Mat::new(&buf, 1), Mat::new(&buf, 1));
    assert!(conv2d_matrix_nhwc(&gpu, &mut sink, tight.into(), weights, out, odd, NhwcInput::Plain).is_err());
    // f16 outputs in pieces that do not divide the channels, or more than four a block.
    let half = |piece: u64| NhwcOutput::Half { y: HalfMat::pieces(Mat::new(&buf, 2), Mat::new(&buf, 4 / piece), piece), residual: None, relu: false };
    assert!(conv2d_matrix_nhwc(&gpu, &mut sink, xh.into(), weights, half(3), ConvShape::same(4, 4, 4, 4, 3), NhwcInput::Plain).is_err());
    let wide = |piece: u64| NhwcOutput::Half { y: HalfMat::pieces(Mat::new(&buf, 64), Mat::new(&buf, 128 / piece), piece), residual: None, relu: false };
    assert!(conv2d_matrix_nhwc(&gpu, &mut sink, xh.into(), weights, wide(2), ConvShape::same(4, 128, 4, 4, 3), NhwcInput::Plain).is_err());
    assert!(sink.is_empty(), "nothing recorded for a refused convolution");
}

thread_local! {
    /// Set by [`with_element_fetch`]: the channels-last convolution fetches element by element.
    pub(crate) static ELEMENT_FETCH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `run` with the channels-last convolution fetching element by element where it would fetch four taps at a time.
fn with_element_fetch<T>(run: impl FnOnce() -> T) -> T {
    with_switch(&ELEMENT_FETCH, run)
}

/// What a case of [`check_quad_fetch`] reads: the input in pieces, a
/// GroupNorm (groups, SiLU) applied as read, W packed into f16.
#[derive(Clone, Copy, Default)]
struct QuadCase {
    x_piece: Option<usize>,
    norm: Option<(usize, bool)>,
    packed: bool,
}

/// The convolution of `s` fetching its k steps four taps at a time gives
/// the bits of fetching them element by element (the same operands
/// rounded the same way, the same products in the same order); the case
/// is one the launcher takes the quads for.
fn check_quad_fetch(gpu: &Gpu, s: ConvShape, input: NhwcInput, case: QuadCase, seed: u64) {
    use crate::kernels::half_pack::pack_weight_half;
    use crate::kernels::linear::measure_weight_rows;
    let c = gpu.matrix().expect("a matrix device");
    let what = format!("{s:?} {input:?}, input pieces {:?}, norm {:?}, packed W {}", case.x_piece, case.norm, case.packed);
    assert!(fetches_quads(c, super::super::conv::ConvBlock::for_channels(c, s.out_channels as u64), &s, true, 0, WeightDtype::Bf16, case.x_piece.map(|p| p as u64), case.norm.map(|n| n.0 as u64)), "{what}: not a case for the quads");
    let (pixels, out_pixels, cout, taps) = (s.height * s.width, s.out_height * s.out_width, s.out_channels, s.in_channels * s.kernel * s.kernel);
    let mut rng = Rng::new(seed);
    let mut x = rng.normals(s.in_channels * pixels, 1.0);
    x.iter_mut().skip(pixels / 2 * s.in_channels).take(s.in_channels).for_each(|v| *v *= 100.0);
    let (words, scales, _) = pack_pixels(&x, pixels, s.in_channels, case.x_piece);
    let (xb, xs) = (gpu.upload_u32("x", &words), gpu.upload_f32("x scales", &scales));
    let rows = input_rows(&xb, &xs, s.in_channels, case.x_piece);
    let (w, b) = (rng.bf16s(cout * taps, 0.3), rng.bf16s(cout, 1.0));
    let (wb, bb) = (gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
    let row_scales = gpu.storage("w row scales", 4 * cout as u64);
    gpu.submit(|enc| measure_weight_rows(gpu, enc, Weight::bf16(&wb), cout as u64, taps as u64, &row_scales, 0)).unwrap();
    if case.packed {
        gpu.submit(|enc| pack_weight_half(gpu, enc, Weight::bf16(&wb), Mat::new(&row_scales, 1), [cout as u64, taps as u64])).unwrap();
    }
    let kept = crate::RowScales { buf: &row_scales, offset: 0, k: taps as u64, packed: case.packed };
    let weights = NhwcWeights { w: Weight { scales: Some(kept), ..Weight::bf16(&wb) }, bias: Weight::bf16(&bb), order: TapOrder::ChannelsLast };
    // A group's (mean, 1/σ), one group far off zero, and gamma and beta.
    let groups = case.norm.map_or(1, |n| n.0);
    let stats: Vec<f32> = (0..groups).flat_map(|g| [if g == 0 { 30.0 } else { 0.1 * g as f32 }, 0.5 + 0.25 * g as f32]).collect();
    let (sb, gb, nb) = (gpu.upload_f32("stats", &stats), gpu.upload_bf16("gamma", &rng.bf16s(s.in_channels, 1.0)), gpu.upload_bf16("beta", &rng.bf16s(s.in_channels, 0.5)));
    let norm = case.norm.map(|(groups, silu)| NhwcNorm { stats: Mat::new(&sb, 0), gamma: Weight::bf16(&gb), beta: Weight::bf16(&nb), groups: groups as u64, activation: if silu { NormActivation::Silu } else { NormActivation::None } });
    let run = || -> Vec<u32> {
        let y = poisoned(gpu, cout * out_pixels);
        let out = run_and_read(gpu, &y, cout * out_pixels, |enc| conv2d_matrix_nhwc(gpu, enc, NhwcSource { rows, norm }, weights, NhwcOutput::F32 { y: Mat::new(&y, cout as u64), residual: false, relu: false }, s, input));
        out.iter().map(|v| v.to_bits()).collect()
    };
    let (quads, elements) = (run(), with_element_fetch(run));
    let differ = quads.iter().zip(&elements).filter(|(a, b)| a != b).count();
    assert_eq!(differ, 0, "{what}: {differ} of {} outputs differ", quads.len());
    assert!(quads.iter().all(|&b| f32::from_bits(b).is_finite()), "{what}: every output written");
}

#[test]
fn the_channels_last_conv_fetching_four_taps_at_a_time_gives_the_element_fetchs_bits() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let plain = QuadCase::default();
    // 3×3 over more than one block of channels and pixels; 1×1 in pieces; through the upsampling; a downsampler.
    check_quad_fetch(&gpu, ConvShape::same(16, 72, 11, 9, 3), NhwcInput::Plain, plain, 100);
    check_quad_fetch(&gpu, ConvShape::same(32, 40, 6, 5, 1), NhwcInput::Plain, QuadCase { x_piece: Some(16), ..plain }, 101);
    let upsampled = ConvShape { out_height: 10, out_width: 14, ..ConvShape::same(16, 12, 5, 7, 3) };
    check_quad_fetch(&gpu, upsampled, NhwcInput::Upsampled, QuadCase { x_piece: Some(8), ..plain }, 102);
    check_quad_fetch(&gpu, downsampler(16, 12, 10), NhwcInput::Plain, plain, 103);
    // Normalised as read (groups of 4 channels, SiLU after; groups of 8), and over a packed W.
    check_quad_fetch(&gpu, ConvShape::same(32, 24, 7, 6, 3), NhwcInput::Plain, QuadCase { x_piece: Some(16), norm: Some((8, true)), ..plain }, 104);
    check_quad_fetch(&gpu, ConvShape::same(16, 20, 6, 5, 3), NhwcInput::Plain, QuadCase { norm: Some((2, false)), packed: true, ..plain }, 105);
    check_quad_fetch(&gpu, ConvShape::same(16, 24, 9, 7, 3), NhwcInput::Plain, QuadCase { packed: true, ..plain }, 106);
}
