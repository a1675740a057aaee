//! Tests of `conv_nhwc.rs`: the channels-last f16 convolution against the
//! f64 oracle (NCHW) on the operands as the tier rounds them.

use super::*;
use crate::range_rule::{pack_rows, unpack_rows};
use crate::testing::*;
use crate::GpuOptions;
use flux_lite_core::oracle::{self as r, Weights};

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
    let up = if input == NhwcInput::Upsampled { 2 } else { 1 };
    let (pixels, out_pixels) = (s.height * s.width, s.out_height * s.out_width);
    let mut rng = Rng::new(seed);
    let mut x = rng.normals(s.in_channels * pixels, 1.0);
    // A pixel a hundred times larger and one a thousand times smaller than the rest.
    for c in 0..s.in_channels {
        x[c * pixels + pixels / 2] *= 100.0;
        x[c * pixels + pixels / 3] *= 1e-3;
    }
    let (words, scales) = pack_rows(&to_nhwc(&x, s.in_channels, pixels), pixels, s.in_channels);
    let x16 = to_nchw(&unpack_rows(&words, &scales, s.in_channels), s.in_channels, pixels);
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
    let xh = HalfMat::rows(Mat::new(&xb, (s.in_channels / 2) as u64), Mat::new(&xs, 1));
    let then = ConvEpilogue { residual, relu: false };
    let got = run_and_read(gpu, &yb, s.out_channels * out_pixels, |enc| {
        let weights = NhwcWeights { w: Weight::bf16(&wb), bias: Weight::bf16(&bb), order };
        conv2d_matrix_nhwc(gpu, enc, xh, weights, Mat::new(&yb, s.out_channels as u64), s, input, then)
    });
    let got = to_nchw(&got, s.out_channels, out_pixels);
    let what = format!("channels-last conv {s:?} {input:?}, W {order:?}, residual {residual}");
    assert_close(&format!("{what}, vs the operands as the tier rounds them"), &got, &rounded, F32_TOL);
    println!("{what}: relative L2 {:.2e} against the exact operands", rel_l2(&got, &exact));
    assert_close(&format!("{what}, vs exact operands"), &got, &exact, crate::selftest::HALF_PRODUCT);
}

#[test]
fn the_channels_last_conv_on_matrix_units_matches_the_oracle() {
    let Some(gpu) = matrix_gpu() else { return };
    // 3×3 and 1×1; more than one block of output channels and of pixels; a residual.
    check_nhwc_conv(&gpu, ConvShape::same(6, 10, 13, 9, 3), NhwcInput::Plain, false, 60);
    check_nhwc_conv(&gpu, ConvShape::same(16, 20, 33, 17, 1), NhwcInput::Plain, false, 61);
    check_nhwc_conv(&gpu, ConvShape::same(8, 130, 12, 13, 3), NhwcInput::Plain, true, 62);
    // Through the ×2 upsampling: a 5×7 input convolved at 10×14.
    let upsampled = ConvShape { out_height: 10, out_width: 14, ..ConvShape::same(12, 9, 5, 7, 3) };
    check_nhwc_conv(&gpu, upsampled, NhwcInput::Upsampled, false, 63);
    // W as the model's files hold it.
    check_nhwc_conv_ordered(&gpu, ConvShape::same(6, 10, 13, 9, 3), NhwcInput::Plain, true, 66, TapOrder::Torch);
    check_nhwc_conv_ordered(&gpu, upsampled, NhwcInput::Upsampled, false, 67, TapOrder::Torch);
}

#[test]
fn the_channels_last_conv_in_pieces_of_pixels_matches_the_oracle() {
    // The tier checked first: where it is missing the test says so.
    if matrix_gpu().is_none() {
        return;
    }
    // Bindings of 16 KiB: the output in pieces of a few blocks of pixels, each with its window of input rows.
    let small = Gpu::new(&GpuOptions { max_storage_binding: Some(16 << 10), precision: crate::Precision::Matrix, ..options() }).unwrap_or_else(|e| panic!("{e}"));
    let s = ConvShape::same(16, 24, 40, 23, 3);
    // 920 output pixels of 96 bytes: at least six pieces, and W's scales measured once.
    let (x, y) = (small.storage("x", 4 * 920 * 9), small.storage("y", 4 * 920 * 24));
    let (w, b) = (small.storage("w", 2 * 24 * 144 + 4), small.storage("b", 64));
    let mut recorded = Vec::new();
    let xh = HalfMat::rows(Mat::new(&x, 8), Mat { buf: &x, offset: 920 * 8, stride: 1 });
    let weights = NhwcWeights { w: Weight::bf16(&w), bias: Weight::bf16(&b), order: TapOrder::ChannelsLast };
    conv2d_matrix_nhwc(&small, &mut recorded, xh, weights, Mat::new(&y, 24), s, NhwcInput::Plain, ConvEpilogue::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(recorded.len() >= 7, "{} dispatches", recorded.len());
    check_nhwc_conv(&small, s, NhwcInput::Plain, true, 64);
    let upsampled = ConvShape { out_height: 36, out_width: 22, ..ConvShape::same(16, 12, 18, 11, 3) };
    check_nhwc_conv(&small, upsampled, NhwcInput::Upsampled, false, 65);
}

#[test]
fn the_channels_last_conv_refuses_what_it_cannot_take() {
    let Some(gpu) = matrix_gpu() else { return };
    let buf = gpu.upload_f32("any", &[0.0; 64]);
    let xh = HalfMat::rows(Mat::new(&buf, 2), Mat::new(&buf, 1));
    let mut sink = Vec::new();
    let weights = NhwcWeights { w: Weight::f32(&buf), bias: Weight::f32(&buf), order: TapOrder::Torch };
    // Odd input channels; a stride of 2.
    let odd = ConvShape::same(3, 4, 4, 4, 3);
    assert!(conv2d_matrix_nhwc(&gpu, &mut sink, xh, weights, Mat::new(&buf, 4), odd, NhwcInput::Plain, ConvEpilogue::default()).is_err());
    let strided = ConvShape { stride: 2, out_height: 2, out_width: 2, ..ConvShape::same(4, 4, 4, 4, 3) };
    assert!(conv2d_matrix_nhwc(&gpu, &mut sink, xh, weights, Mat::new(&buf, 4), strided, NhwcInput::Plain, ConvEpilogue::default()).is_err());
    assert!(sink.is_empty(), "nothing recorded for a refused convolution");
}
