//! The channels-last convolution's blocks narrower than square (narrow:
//! 8T pixels × 4T channels; thin: 8T × T) give the square blocks' bits:
//! the same rows, so the same range scales, and each output tile the same
//! products in the same order.

use super::*;
use crate::kernels::conv::{tests::with_square_tiles, ConvBlock};

/// What a case reads and writes besides its f32 rows: its input through a
/// GroupNorm (groups, activation) as read, and f16 pieces of `piece`
/// channels onto a residual, ReLU'd.
#[derive(Clone, Copy, Default)]
struct BlockCase {
    norm: Option<(usize, NormActivation)>,
    piece: Option<usize>,
}

/// The convolution of `s` in the block the launcher takes for its output
/// channels (`block`, fetching four taps at a time where `quads`) gives the
/// square blocks' bits.
fn check_square_bits(gpu: &Gpu, s: ConvShape, block: ConvBlock, quads: bool, case: BlockCase, seed: u64) {
    let c = gpu.matrix().expect("a matrix device");
    let cout = s.out_channels;
    assert_eq!(ConvBlock::for_channels_last(c, cout as u64), block, "{s:?}");
    assert_eq!(fetches_quads(c, block, &s, true, 0, WeightDtype::Bf16, None, case.norm.map(|n| n.0 as u64)), quads, "{s:?}");
    let (pixels, out_pixels, taps) = (s.height * s.width, s.out_height * s.out_width, s.in_channels * s.kernel * s.kernel);
    let mut rng = Rng::new(seed);
    let (words, scales, _) = pack_pixels(&rng.normals(s.in_channels * pixels, 1.0), pixels, s.in_channels, None);
    let (xb, xs) = (gpu.upload_u32("x", &words), gpu.upload_f32("x scales", &scales));
    let xh = input_rows(&xb, &xs, s.in_channels, None);
    let (wb, bb) = (gpu.upload_bf16("w", &taps_channels_last(&rng.bf16s(cout * taps, 0.3), &s)), gpu.upload_bf16("b", &rng.bf16s(cout, 1.0)));
    let weights = NhwcWeights { w: Weight::bf16(&wb), bias: Weight::bf16(&bb), order: TapOrder::ChannelsLast };
    // A group's (mean, 1/σ), and gamma and beta, where the input is normed as read.
    let groups = case.norm.map_or(1, |n| n.0);
    let stats: Vec<f32> = (0..groups).flat_map(|g| [0.2 * g as f32 - 0.3, 0.75 + 0.25 * g as f32]).collect();
    let (sb, gb, nb) = (gpu.upload_f32("stats", &stats), gpu.upload_bf16("gamma", &rng.bf16s(s.in_channels, 1.0)), gpu.upload_bf16("beta", &rng.bf16s(s.in_channels, 0.5)));
    let norm = case.norm.map(|(groups, activation)| NhwcNorm { stats: Mat::new(&sb, 0), gamma: Weight::bf16(&gb), beta: Weight::bf16(&nb), groups: groups as u64, activation });
    let source = NhwcSource { rows: xh, norm };
    let residual = case.piece.map(|piece| (pack_pixels(&rng.normals(cout * out_pixels, 2.0), out_pixels, cout, Some(piece)), piece));
    let residual = residual.map(|((words, scales, _), piece)| (gpu.upload_u32("residual", &words), gpu.upload_f32("residual scales", &scales), piece));
    let run = || -> Vec<Vec<u32>> {
        let y = poisoned(gpu, cout * out_pixels);
        let f32_rows = run_and_read(gpu, &y, cout * out_pixels, |enc| conv2d_matrix_nhwc(gpu, enc, source, weights, NhwcOutput::F32 { y: Mat::new(&y, cout as u64), residual: false, relu: false }, s, NhwcInput::Plain));
        let mut outputs = vec![f32_rows];
        if let Some((rb, rs, piece)) = &residual {
            let (words_len, scales_len) = (out_pixels * cout / 2, out_pixels * cout / piece);
            let out = poisoned(gpu, words_len + scales_len);
            let y = HalfMat::pieces(Mat { buf: &out, offset: 0, stride: (cout / 2) as u64 }, Mat { buf: &out, offset: words_len as u64, stride: (cout / piece) as u64 }, *piece as u64);
            let r = HalfMat::pieces(Mat::new(rb, (cout / 2) as u64), Mat::new(rs, (cout / piece) as u64), *piece as u64);
            outputs.push(run_and_read(gpu, &out, words_len + scales_len, |enc| conv2d_matrix_nhwc(gpu, enc, source, weights, NhwcOutput::Half { y, residual: Some(r), relu: true }, s, NhwcInput::Plain)));
        }
        outputs.into_iter().map(|v| v.iter().map(|x| x.to_bits()).collect()).collect()
    };
    let (narrower, square) = (run(), with_square_tiles(run));
    for ((what, n), q) in ["f32 rows", "f16 pieces"].into_iter().zip(&narrower).zip(&square) {
        let differ = n.iter().zip(q).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{s:?} {block:?} {what}: {differ} of {} differ from square blocks", n.len());
    }
    assert!(narrower[0].iter().all(|&b| f32::from_bits(b).is_finite()), "{s:?} {block:?}: every output written");
}

/// A convolution whose output channels a square block would pad (4T of
/// them: a tiny decoder's 64 on 16×16 tiles) runs in narrow blocks, 8T
/// pixels × 4T channels on two subgroups: into f32 rows, and into f16
/// pieces onto a residual, ReLU'd; fetching four taps at a time and element
/// by element.
#[test]
fn the_channels_last_convs_narrow_blocks_give_the_square_ones_bits() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let t = gpu.matrix().expect("a matrix device").size as usize;
    let pieces = BlockCase { piece: Some(2 * t), ..BlockCase::default() };
    // 4T channels (one narrow block's columns), and 12T (three, where square blocks would pad to 16T).
    check_square_bits(&gpu, ConvShape::same(32, 4 * t, 11, 9, 3), ConvBlock::Narrow, true, pieces, 101);
    check_square_bits(&gpu, ConvShape::same(12, 4 * t, 7, 6, 3), ConvBlock::Narrow, false, pieces, 101);
    check_square_bits(&gpu, ConvShape::same(16, 12 * t, 6, 7, 3), ConvBlock::Narrow, true, pieces, 101);
}

/// A convolution of at most T output channels (an RGB output: the VAE's
/// conv_out through its GroupNorm + SiLU, the tiny decoder's last, after a
/// ReLU) runs in thin blocks, 8T pixels × T channels on two subgroups of
/// 4 × 1 tiles, where a narrow block would pad 3 channels to 4T: into f32
/// rows (and T of them into f16 pieces onto a residual), fetching four taps
/// at a time and element by element.
#[test]
fn the_channels_last_convs_thin_blocks_give_the_square_ones_bits() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let t = gpu.matrix().expect("a matrix device").size as usize;
    let normed = BlockCase { norm: Some((8, NormActivation::Silu)), ..BlockCase::default() };
    check_square_bits(&gpu, ConvShape::same(32, 3, 11, 9, 3), ConvBlock::Thin, true, BlockCase::default(), 102);
    check_square_bits(&gpu, ConvShape::same(64, 3, 9, 10, 3), ConvBlock::Thin, true, normed, 103);
    check_square_bits(&gpu, ConvShape::same(12, 3, 7, 6, 3), ConvBlock::Thin, false, BlockCase::default(), 104);
    check_square_bits(&gpu, ConvShape::same(16, t, 6, 7, 3), ConvBlock::Thin, true, BlockCase { piece: Some(t), ..BlockCase::default() }, 105);
}
