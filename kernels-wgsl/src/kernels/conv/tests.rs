//! Tests of `conv.rs`.

use super::*;
use crate::testing::*;
use flux_lite_core::oracle::{self as r, Weights};

/// The selftest's convolution check (random bf16 weights and bias, NaN-poisoned output), held to the f32 bound.
fn check_conv(s: ConvShape, seed: u64) {
    let worst = crate::selftest::check_conv(gpu(), s, seed).unwrap_or_else(|e| panic!("conv {s:?}: {e}"));
    assert!(worst <= F32_TOL, "conv {s:?}: relative L2 {worst:.3e} > {F32_TOL:.0e}");
}

/// `y`'s bits after [`conv2d`] of seeded x, W (bf16 or f32) and bias on `gpu`.
fn conv_bits(gpu: &Gpu, s: ConvShape, seed: u64, bf16: bool) -> Vec<u32> {
    conv_bits_then(gpu, s, seed, bf16, ConvEpilogue::default())
}

/// The values a residual convolution of `s` finds in its output ([`conv_bits_then`]).
fn residual_values(s: ConvShape, seed: u64) -> Vec<f32> {
    Rng::new(seed + 1000).normals(s.out_channels * s.out_height * s.out_width, 1.0)
}

/// [`conv_bits`] with the epilogue `then` in the kernel; a residual one
/// adds onto [`residual_values`].
fn conv_bits_then(gpu: &Gpu, s: ConvShape, seed: u64, bf16: bool, then: ConvEpilogue) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    let x = rng.normals(s.in_channels * s.height * s.width, 1.0);
    let taps = s.out_channels * s.in_channels * s.kernel * s.kernel;
    let (wbits, wf, bbits, bf) = (rng.bf16s(taps, 0.2), rng.normals(taps, 0.2), rng.bf16s(s.out_channels, 0.5), rng.normals(s.out_channels, 0.5));
    let xb = gpu.upload_f32("x", &x);
    let (wb, bb) = if bf16 { (gpu.upload_bf16("w", &wbits), gpu.upload_bf16("b", &bbits)) } else { (gpu.upload_f32("w", &wf), gpu.upload_f32("b", &bf)) };
    let weight = |buf| if bf16 { Weight::bf16(buf) } else { Weight::f32(buf) };
    let out = s.out_channels * s.out_height * s.out_width;
    let yb = if then.residual { gpu.upload_f32("y", &residual_values(s, seed)) } else { poisoned(gpu, out) };
    let got = run_and_read(gpu, &yb, out, |enc| {
        conv2d_then(gpu, enc, Mat::new(&xb, (s.height * s.width) as u64), weight(&wb), weight(&bb), Mat::new(&yb, (s.out_height * s.out_width) as u64), s, then)
    });
    got.iter().map(|v| v.to_bits()).collect()
}

/// Shapes the lanes kernel takes: 3×3 and 1×1, input channels in steps
/// of 8, widths of whole vec4s. The wide shape (more than 16 output
/// channels): widths ending inside a block of 8 pixels (20, 36),
/// output channels past a workgroup's 32 (40, 72) and below it (17,
/// 33); the long one (16 pixels a block, from 128² output pixels): a
/// width of one block and a half (24), 3×3 and 1×1, and a band. The
/// thin one (3, 16): rows wider than its 32 pixels, ending inside a block.
/// Bands of a banded decode (`ConvShape::input_rows`): the first (the
/// top row padding), a middle one (a halo row either side) and the last
/// (the rows past the input zero), wide and thin.
fn lanes_shapes() -> [ConvShape; 15] {
    let band = |s: ConvShape, height: usize, out_height: usize, pad_top: usize| ConvShape { height, out_height, pad_top, ..s };
    [
        band(ConvShape::same(16, 40, 0, 16, 3), 6, 5, 1),
        band(ConvShape::same(32, 72, 0, 20, 3), 7, 5, 0),
        band(ConvShape::same(16, 40, 0, 12, 3), 4, 3, 0),
        band(ConvShape::same(16, 3, 0, 36, 3), 5, 3, 0),
        ConvShape::same(16, 40, 12, 16, 3),
        ConvShape::same(32, 72, 7, 20, 3),
        ConvShape::same(16, 40, 3, 36, 3),
        ConvShape::same(8, 17, 5, 8, 1),
        ConvShape::same(24, 33, 9, 12, 1),
        ConvShape::same(16, 3, 9, 36, 3),
        ConvShape::same(64, 16, 6, 40, 3),
        ConvShape::same(8, 3, 5, 44, 1),
        ConvShape::same(8, 40, 683, 24, 3),
        ConvShape::same(8, 20, 683, 24, 1),
        band(ConvShape::same(8, 36, 0, 24, 3), 700, 683, 1),
    ]
}

#[test]
fn the_lanes_conv_matches_the_oracle_and_the_tiled_kernels_bits() {
    let Some((lanes, tiled)) = lanes_and_per_lane("the lanes conv2d", "patches") else { return };
    for (i, s) in lanes_shapes().into_iter().enumerate() {
        // The lanes kernel takes each of them (a band too), not the tiled one.
        let taken = lanes_launch(lanes, &s, true, s.out_channels as u64, 0, 0, true);
        let Some((Module::ConvLanes { long, .. }, _)) = taken else { panic!("conv {s:?} is not taken by the lanes kernel") };
        assert_eq!(long, i >= 12, "conv {s:?}: the long shape is for 128² output pixels and more");
        check_conv(s, 60 + i as u64);
        for bf16 in [true, false] {
            let (a, b) = (conv_bits(lanes, s, 70 + i as u64, bf16), conv_bits(&tiled, s, 70 + i as u64, bf16));
            let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
            assert_eq!(differ, 0, "conv {s:?} bf16={bf16}: {differ} of {} outputs differ in their bits", a.len());
        }
    }
}

#[test]
fn conv3x3_same_padding() {
    check_conv(ConvShape::same(5, 7, 13, 9, 3), 40);
}

#[test]
fn conv3x3_over_several_output_tiles() {
    // 140 output channels and 17·19 pixels span 2×3 tiles of 128, with 180
    // taps (even: weights load as u32 pairs) ending in half a k-step.
    check_conv(ConvShape::same(20, 140, 17, 19, 3), 43);
}

/// At most 16 output channels run on the thin kernel (f32 tier), 17 on the tiles.
#[test]
fn thin_convolutions_on_both_sides_of_the_threshold() {
    check_conv(ConvShape::same(8, 16, 9, 10, 3), 44);
    check_conv(ConvShape::same(8, 17, 9, 10, 3), 45);
    check_conv(ConvShape::same(128, 3, 6, 5, 3), 46);
}

#[test]
fn wide_tiles_on_both_sides_of_their_threshold() {
    // 33 and 64 output channels take the 64×256 tiles, 65 the 128×128
    // ones; 23×29 pixels span three 256-pixel tiles, the last one short;
    // 45 taps end inside a step of 8.
    check_conv(ConvShape::same(5, 33, 23, 29, 3), 47);
    check_conv(ConvShape::same(5, 64, 23, 29, 3), 48);
    check_conv(ConvShape::same(5, 65, 23, 29, 3), 49);
}

/// The wide tiles give the 128×128 tiles' bits (each output's sum in
/// the same order; on the f16 tier the same row scales), on the f32 tier
/// and, where the adapter has it, the f16 tier; past one wide tile of
/// pixels, with the residual and ReLU epilogue.
#[test]
fn wide_tiles_give_the_square_tiles_bits_on_both_tiers() {
    // 5 input channels: not the lanes kernel's shape, so the tiled kernels run on a CPU adapter too.
    let shapes = [ConvShape::same(5, 33, 23, 29, 3), ConvShape::same(5, 64, 9, 40, 3), ConvShape::same(6, 20, 11, 13, 1)];
    let check = |g: &Gpu| {
        for (i, s) in shapes.into_iter().enumerate() {
            for then in [ConvEpilogue::default(), ConvEpilogue { residual: true, relu: true }] {
                let seed = 140 + i as u64;
                let wide = conv_bits_then(g, s, seed, true, then);
                let square = with_square_tiles(|| conv_bits_then(g, s, seed, true, then));
                assert!(wide.iter().all(|&b| f32::from_bits(b).is_finite()), "{s:?}: values left unwritten");
                assert_eq!(wide, square, "{s:?} on {}, {then:?}: wide tiles differ from square ones", g.describe());
            }
        }
    };
    check(gpu());
    if let Some(half) = half_gpu() {
        check(&half);
    }
}

#[test]
fn conv1x1() {
    check_conv(ConvShape::same(6, 11, 7, 5, 1), 41);
}

#[test]
fn conv3x3_stride2_with_asymmetric_padding() {
    // The VAE encoder's downsampler: pad (0, 1, 0, 1), then a stride-2 3×3 convolution.
    check_conv(crate::selftest::downsampler(4, 3, 9, 8), 42);
}

#[test]
fn upsample_nearest() {
    assert_eq!(crate::selftest::check_upsample(gpu()).unwrap_or_else(|e| panic!("{e}")), 0.0, "upsample is not exact");
}

/// A half tier's conv2d against the oracle on its f16-rounded operands
/// (f32 sums: the f32 kernels' bound) and on the exact ones (f16 rounding
/// of both: measured 1.59e-4 – 1.96e-4 relative L2 on Mesa 26's lavapipe,
/// matrix tier, 2026-11-25; bound 5e-4 as for the half tiers' linear).
fn check_half_conv(gpu: &Gpu, s: ConvShape, seed: u64) {
    let mut rng = Rng::new(seed);
    let x = rng.normals(s.in_channels * s.height * s.width, 1.0);
    let w = rng.bf16s(s.out_channels * s.in_channels * s.kernel * s.kernel, 0.3);
    let b = rng.bf16s(s.out_channels, 1.0);
    let widen = |v: &[u16]| -> Vec<f32> { v.iter().map(|&h| flux_lite_core::numerics::bf16::to_f32(h)).collect() };
    let (wf, bf) = (widen(&w), widen(&b));
    let n_out = s.out_channels * s.out_height * s.out_width;
    let mut exact = vec![0.0; n_out];
    r::conv2d(&x, Weights::F32(&wf), Weights::F32(&bf), s, &mut exact);
    let round = operand_rounding(gpu);
    let (x16, w16): (Vec<f32>, Vec<f32>) = (x.iter().map(|&v| round(v)).collect(), wf.iter().map(|&v| round(v)).collect());
    let mut rounded = vec![0.0; n_out];
    r::conv2d(&x16, Weights::F32(&w16), Weights::F32(&bf), s, &mut rounded);
    let (xb, wb, bb, yb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b), poisoned(gpu, n_out));
    let got = run_and_read(gpu, &yb, n_out, |enc| conv2d(gpu, enc, Mat::new(&xb, 0), Weight::bf16(&wb), Weight::bf16(&bb), Mat::new(&yb, 0), s));
    let tier = gpu.precision().name();
    assert_close(&format!("{tier} conv {s:?}, vs the operands as the tier rounds them"), &got, &rounded, F32_TOL);
    println!("{tier} conv {s:?}: relative L2 {:.2e} against the exact operands", rel_l2(&got, &exact));
    assert_close(&format!("{tier} conv {s:?}, vs exact operands"), &got, &exact, crate::selftest::HALF_PRODUCT);
}

fn check_half_tier(gpu: &Gpu) {
    check_half_conv(gpu, ConvShape::same(5, 7, 13, 9, 3), 50);
    check_half_conv(gpu, ConvShape::same(16, 20, 33, 17, 1), 51);
    // Stride 2 with asymmetric padding (the VAE encoder's downsampling).
    let down = ConvShape { in_channels: 6, height: 13, width: 11, out_channels: 9, out_height: 6, out_width: 5, kernel: 3, stride: 2, pad_top: 0, pad_left: 0 };
    check_half_conv(gpu, down, 52);
    // More than one 128×128 tile of output channels and of pixels.
    check_half_conv(gpu, ConvShape::same(4, 130, 12, 13, 3), 53);
    // Narrow blocks on the matrix tier (4T output channels or fewer; 8×8 tiles: 32).
    check_half_conv(gpu, ConvShape::same(8, 32, 20, 11, 3), 56);
}

#[test]
fn conv_on_matrix_units_matches_the_oracle() {
    let Some(gpu) = matrix_gpu() else { return };
    check_half_tier(&gpu);
}

/// The matrix conv2d in pieces of one run of a block's pixels gives the
/// bits of one call: the runs, and so their scales, are the same.
#[test]
fn the_matrix_conv_in_pieces_of_pixels_gives_one_calls_bits() {
    let Some(gpu) = matrix_gpu() else { return };
    let c = gpu.matrix().unwrap_or_else(|| panic!("a matrix-tier device without its matrix configuration"));
    let s = ConvShape::same(6, 20, 17, 17, 3);
    let mut rng = Rng::new(54);
    let x = rng.normals(s.in_channels * s.height * s.width, 1.0);
    let (w, b) = (rng.bf16s(s.out_channels * s.in_channels * 9, 0.3), rng.bf16s(s.out_channels, 1.0));
    let (xb, wb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
    let n_out = s.out_channels * s.out_height * s.out_width;
    let block = c.size as usize * MATRIX_BLOCK_TILES as usize;
    assert!(s.out_height * s.out_width > 2 * block, "the shape must span three runs or more");
    let run = |cap: u64| {
        let yb = poisoned(&gpu, n_out);
        run_and_read(&gpu, &yb, n_out, |enc| {
            let xw = window(&gpu, &xb, 4, 0..x.len() as u64, "x")?;
            conv2d_matrix(&gpu, enc, &xw, Weight::bf16(&wb), Weight::bf16(&bb), Mat::new(&yb, 0), s, c, cap, ConvEpilogue::default())
        })
    };
    let (whole, pieces) = (run(RANGE_SCALES_ROWS), run(1));
    assert!(whole.iter().all(|v| v.is_finite()), "the whole call left values unwritten");
    assert_eq!(whole.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), pieces.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "pieces of one run differ from one call");
}

/// The matrix conv2d over a weight whose rows' scales were measured
/// once (`measure_weight_rows` over its taps, as a weight reaching the
/// device has them) gives the bits of one that measures W itself, in
/// pieces of pixels too; and it records one pass fewer.
#[test]
fn the_matrix_conv_reads_a_weights_stored_scales_with_the_bits_it_would_measure() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let c = gpu.matrix().unwrap_or_else(|| panic!("a matrix-tier device without its matrix configuration"));
    let s = ConvShape::same(6, 20, 17, 17, 3);
    let taps = (s.in_channels * 9) as u64;
    let mut rng = Rng::new(55);
    let x = rng.normals(s.in_channels * s.height * s.width, 1.0);
    let mut w = rng.bf16s(s.out_channels * taps as usize, 0.3);
    // A row far above f16's range: its scale must be its own.
    let far = 5 * taps as usize..6 * taps as usize;
    w[far].iter_mut().for_each(|v| *v = half::bf16::from_f32(half::bf16::from_bits(*v).to_f32() * 1e6).to_bits());
    let b = rng.bf16s(s.out_channels, 1.0);
    let (xb, wb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
    let scales = gpu.storage("weight row scales", 4 * (s.out_channels as u64 + 3));
    let mut measure: Vec<crate::Dispatch> = Vec::new();
    super::super::linear::measure_weight_rows(&gpu, &mut measure, Weight::bf16(&wb), s.out_channels as u64, taps, &scales, 3).unwrap();
    gpu.submit(|enc| {
        crate::encode(enc, &measure);
        Ok(())
    })
    .unwrap();
    let stored = Weight { scales: Some(crate::RowScales { buf: &scales, offset: 3, k: taps, packed: false }), ..Weight::bf16(&wb) };
    let n_out = s.out_channels * s.out_height * s.out_width;
    let run = |weight: Weight<'_>, cap: u64| {
        let yb = poisoned(&gpu, n_out);
        let xw = window(&gpu, &xb, 4, 0..x.len() as u64, "x").unwrap();
        let mut recorded: Vec<crate::Dispatch> = Vec::new();
        conv2d_matrix(&gpu, &mut recorded, &xw, weight, Weight::bf16(&bb), Mat::new(&yb, 0), s, c, cap, ConvEpilogue::default()).unwrap();
        let got = run_and_read(&gpu, &yb, n_out, |enc| {
            crate::encode(enc, &recorded);
            Ok(())
        });
        (got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), recorded.len())
    };
    let ((with, with_passes), (without, without_passes)) = (run(stored, RANGE_SCALES_ROWS), run(Weight::bf16(&wb), RANGE_SCALES_ROWS));
    assert!(with.iter().all(|v| f32::from_bits(*v).is_finite()), "values left unwritten or not finite");
    assert_eq!(with, without, "stored and measured scales differ");
    assert_eq!(with_passes + 1, without_passes, "the stored scales' call still measures W");
    assert_eq!(run(stored, 1).0, without, "in pieces of pixels, stored and measured scales differ");
}

/// A convolution with its ReLU in the kernel's epilogue stores relu's
/// values of the plain convolution's output, bit for bit (relu's own
/// `max`), on every kernel: the tiled one (wide and 128-row tiles), the
/// thin one, the CPU lanes ones where the adapter takes them, and the
/// half tiers' where it has them.
#[test]
fn a_convolution_with_its_relu_stores_the_relu_of_its_output() {
    // Wide and thin lanes shapes, 128-row tiles past one tile, a 1×1.
    let shapes = [ConvShape::same(16, 40, 12, 16, 3), ConvShape::same(16, 3, 9, 36, 3), ConvShape::same(8, 130, 5, 7, 3), ConvShape::same(8, 20, 9, 12, 1)];
    let check = |g: &Gpu| {
        for (i, s) in shapes.into_iter().enumerate() {
            let plain = conv_bits(g, s, 90 + i as u64, true);
            let fused = conv_bits_then(g, s, 90 + i as u64, true, ConvEpilogue { residual: false, relu: true });
            let want: Vec<u32> = plain.iter().map(|&b| f32::from_bits(b).max(0.0).to_bits()).collect();
            assert!(plain.iter().any(|&b| f32::from_bits(b) < 0.0), "{s:?}: no negative output to clip");
            assert_eq!(fused, want, "{s:?} on {}: the fused ReLU differs from relu of the output", g.describe());
        }
    };
    each_kernel_shape(gpu(), crate::testing::options(), check);
    for tier in [half_gpu(), matrix_gpu()].into_iter().flatten() {
        check(&tier);
    }
}

/// A convolution with a residual in its epilogue stores its plain
/// output plus the values it found in y (one f32 addition, as an add
/// pass after it), then the ReLU where asked, bit for bit, on every
/// kernel as above.
#[test]
fn a_residual_convolution_adds_its_output_onto_ys_values() {
    let shapes = [ConvShape::same(16, 40, 12, 16, 3), ConvShape::same(16, 3, 9, 36, 3), ConvShape::same(8, 130, 5, 7, 3), ConvShape::same(8, 20, 9, 12, 1)];
    let check = |g: &Gpu| {
        for (i, s) in shapes.into_iter().enumerate() {
            let seed = 95 + i as u64;
            let plain = conv_bits(g, s, seed, true);
            let sums: Vec<f32> = plain.iter().zip(residual_values(s, seed)).map(|(&b, r)| f32::from_bits(b) + r).collect();
            for relu in [false, true] {
                let fused = conv_bits_then(g, s, seed, true, ConvEpilogue { residual: true, relu });
                let want: Vec<u32> = sums.iter().map(|&v| if relu { v.max(0.0) } else { v }.to_bits()).collect();
                assert_eq!(fused, want, "{s:?} on {}, relu {relu}: the fused sum differs from the output plus y", g.describe());
            }
        }
    };
    each_kernel_shape(gpu(), crate::testing::options(), check);
    for tier in [half_gpu(), matrix_gpu()].into_iter().flatten() {
        check(&tier);
    }
}

thread_local! {
    /// Set by [`with_square_tiles`]: the tiled conv2d takes 128×128 tiles
    /// and the matrix one square blocks, where they would take wide tiles
    /// or narrow blocks.
    pub(crate) static SQUARE_TILES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `run` with the convolutions on square tiles and blocks only.
pub(crate) fn with_square_tiles<T>(run: impl FnOnce() -> T) -> T {
    with_switch(&SQUARE_TILES, run)
}

/// Narrow blocks are taken where they pad fewer output channels (at
/// most 4T, and just past a multiple of 8T), square ones elsewhere.
#[test]
fn narrow_blocks_take_the_convolutions_square_ones_half_fill() {
    use crate::precision::MatrixConfig;
    let c16 = MatrixConfig { size: 16, subgroup: 32, operands: MatrixOperands::F16, staging: crate::precision::GemmStaging::DEEP };
    let pick = |n| ConvBlock::for_channels(c16, n);
    for n in [3, 16, 64, 129, 192] {
        assert_eq!(pick(n), ConvBlock::Narrow, "{n} output channels with 16×16 tiles");
    }
    for n in [65, 128, 256, 512, 200] {
        assert_eq!(pick(n), ConvBlock::Square, "{n} output channels with 16×16 tiles");
    }
    assert_eq!((ConvBlock::Narrow.columns(c16), ConvBlock::Square.columns(c16)), (64, 128));
}

/// The matrix conv2d in narrow blocks gives the bits of square ones (the
/// same rows, runs and scales, each output's products in the same
/// order), with bf16 and f32 weights, its ReLU and residual epilogue,
/// several blocks of pixels, and past a square block's channels.
#[test]
fn narrow_matrix_blocks_give_the_square_blocks_bits() {
    let Some(gpu) = matrix_gpu() else { return };
    let c = gpu.matrix().unwrap_or_else(|| panic!("a matrix-tier device without its matrix configuration"));
    let t = c.size as usize;
    // Channels of one narrow block, of less than one, and just past a square block (8T + 3).
    let shapes = [ConvShape::same(8, 4 * t, 21, 13, 3), ConvShape::same(5, 3, 9, 36, 3), ConvShape::same(16, 8 * t + 3, 7, 9, 1)];
    for (i, s) in shapes.into_iter().enumerate() {
        assert_eq!(ConvBlock::for_channels(c, s.out_channels as u64), ConvBlock::Narrow, "{s:?}");
        for (bf16, then) in [(true, ConvEpilogue::default()), (false, ConvEpilogue { residual: true, relu: true })] {
            let seed = 130 + i as u64;
            let narrow = conv_bits_then(&gpu, s, seed, bf16, then);
            let square = with_square_tiles(|| conv_bits_then(&gpu, s, seed, bf16, then));
            assert!(narrow.iter().all(|&b| f32::from_bits(b).is_finite()), "{s:?}: values left unwritten");
            assert_eq!(narrow, square, "{s:?}, bf16 {bf16}, {then:?}: narrow blocks differ from square ones");
        }
    }
}

#[test]
fn conv_on_f16_tiles_matches_the_oracle() {
    let Some(gpu) = half_gpu() else { return };
    check_half_tier(&gpu);
}

/// Every staging of the GEMM core's k steps gives the matrix convolution
/// the deep staging's bits: bf16 W as pairs, f32 W element by element,
/// square and narrow blocks, a residual.
#[test]
fn every_staging_of_the_matrix_conv_gives_the_same_bits() {
    use crate::kernels::linear::tests::{staged_gpu, STAGINGS};
    let shapes = [(ConvShape::same(16, 40, 9, 11, 3), true), (ConvShape::same(12, 130, 7, 6, 3), false), (ConvShape::same(24, 24, 10, 9, 1), true)];
    let mut reference: Option<Vec<Vec<u32>>> = None;
    for asked in STAGINGS {
        let Some(gpu) = staged_gpu(asked) else { return };
        let staging = gpu.matrix().unwrap().staging;
        let mut outputs: Vec<Vec<u32>> = shapes.iter().map(|&(s, bf16)| conv_bits(&gpu, s, 80, bf16)).collect();
        outputs.push(conv_bits_then(&gpu, shapes[0].0, 81, true, ConvEpilogue { residual: true, ..Default::default() }));
        assert!(outputs.iter().flatten().all(|&v| f32::from_bits(v).is_finite()), "{staging:?}: values left unwritten");
        match &reference {
            None => reference = Some(outputs),
            Some(first) => assert!(first == &outputs, "{staging:?} differs from the deep staging"),
        }
    }
}
