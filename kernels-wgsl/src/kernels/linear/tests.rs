//! Tests of `linear.rs`.

use super::*;
use crate::testing::*;
use flux_lite_core::oracle::{self as r, Weights};
use crate::device::GpuOptions;

/// [`check_linear_on`] on every kernel shape lavapipe has: the lanes
/// kernel where k allows it, the tiled one everywhere.
fn check_linear(seed: u64, m: usize, n: usize, k: usize, bf16: bool, with_bias: bool) {
    each_kernel_shape(gpu(), crate::testing::options(), |g| check_linear_on(g, seed, m, n, k, bf16, with_bias));
}

fn check_linear_on(gpu: &Gpu, seed: u64, m: usize, n: usize, k: usize, bf16: bool, with_bias: bool) {
    let mut rng = Rng::new(seed);
    let x = rng.normals(m * k, 1.0);
    let (wbits, wf) = (rng.bf16s(n * k, 0.1), rng.normals(n * k, 0.1));
    let (bbits, bf) = (rng.bf16s(n, 1.0), rng.normals(n, 1.0));
    let (w_ref, b_ref) = if bf16 { (Weights::Bf16(&wbits), Weights::Bf16(&bbits)) } else { (Weights::F32(&wf), Weights::F32(&bf)) };
    let mut want = vec![0.0; m * n];
    r::linear(&x, w_ref, with_bias.then_some(b_ref), m, n, k, &mut want);

    let xb = gpu.upload_f32("x", &x);
    let (wb, bb) = if bf16 {
        (gpu.upload_bf16("w", &wbits), gpu.upload_bf16("b", &bbits))
    } else {
        (gpu.upload_f32("w", &wf), gpu.upload_f32("b", &bf))
    };
    let weight = |buf| if bf16 { Weight::bf16(buf) } else { Weight::f32(buf) };
    let yb = poisoned(gpu, m * n);
    let got = run_and_read(gpu, &yb, m * n, |enc| {
        let bias = with_bias.then(|| weight(&bb));
        linear(gpu, enc, Mat::new(&xb, k as u64), weight(&wb), bias, Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
    });
    assert_close(&format!("linear {m}x{n}x{k} bf16={bf16} bias={with_bias}"), &got, &want, F32_TOL);
}

#[test]
fn linear_bf16_with_bias() {
    check_linear(1, 70, 131, 77, true, true);
}

#[test]
fn linear_in_runs_of_four_past_every_block_edge() {
    check_linear(7, 13, 70, 36, true, true);
    check_linear(8, 9, 129, 4, true, false);
}

#[test]
fn linear_bf16_odd_k_no_bias() {
    // Odd k puts weight rows across u32 halves.
    check_linear(2, 1, 65, 33, true, false);
}

#[test]
fn linear_bf16_pairs_over_several_tiles() {
    // Even k at an even offset: weights load as u32 pairs; 300×260 spans
    // 3×3 output tiles with partial ones, and k = 100 ends in half a k-step.
    check_linear(5, 300, 260, 100, true, true);
}

#[test]
fn linear_bf16_even_k_at_an_odd_weight_offset() {
    // Rows of even length that start on the high half of a word cannot load as pairs.
    let gpu = gpu();
    let (m, n, k) = (131usize, 133usize, 64usize);
    let mut rng = Rng::new(6);
    let x = rng.normals(m * k, 1.0);
    let w = rng.bf16s(n * k + 1, 0.1);
    let mut want = vec![0.0; m * n];
    r::linear(&x, Weights::Bf16(&w[1..]), None, m, n, k, &mut want);
    let (xb, wb, yb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), poisoned(gpu, m * n));
    let got = run_and_read(gpu, &yb, m * n, |enc| {
        let w = Weight { offset: 1, ..Weight::bf16(&wb) };
        linear(gpu, enc, Mat::new(&xb, k as u64), w, None, Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
    });
    assert_close("linear at an odd weight offset", &got, &want, F32_TOL);
}

/// `y` (first holding `y0`) after [`linear`], or [`linear_add`] where
/// `add`, of random x and W of these sizes, on `gpu`.
#[allow(clippy::too_many_arguments)] // the product's sizes and options
fn product_bits(gpu: &Gpu, seed: u64, m: usize, n: usize, k: usize, bf16: bool, with_bias: bool, add: bool) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    let x = rng.normals(m * k, 1.0);
    let (wbits, wf, bbits) = (rng.bf16s(n * k, 0.1), rng.normals(n * k, 0.1), rng.bf16s(n, 1.0));
    let y0 = rng.normals(m * n, 1.0);
    let xb = gpu.upload_f32("x", &x);
    let (wb, bb) = (if bf16 { gpu.upload_bf16("w", &wbits) } else { gpu.upload_f32("w", &wf) }, gpu.upload_bf16("b", &bbits));
    let weight = if bf16 { Weight::bf16(&wb) } else { Weight::f32(&wb) };
    let yb = gpu.upload_f32("y", &y0);
    let (xm, ym, s) = (Mat::new(&xb, k as u64), Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 });
    let got = run_and_read(gpu, &yb, m * n, |enc| {
        if add {
            linear_add(gpu, enc, xm, weight, ym, s)
        } else {
            linear(gpu, enc, xm, weight, with_bias.then(|| Weight::bf16(&bb)), ym, s)
        }
    });
    got.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn the_lanes_linear_gives_the_tiled_kernels_bits() {
    // Sizes past every edge of the lanes kernel (8 rows, 256 columns a
    // workgroup, 32 terms a step), k a multiple of 8 so that it runs.
    let Some((lanes, tiled)) = lanes_and_per_lane("the lanes linear", "rows") else { return };
    for (seed, m, n, k, bf16, bias, add) in [
        (21, 70, 300, 64, true, true, false),
        (22, 9, 131, 40, true, false, false),
        (23, 129, 260, 200, false, true, false),
        (24, 17, 513, 96, true, false, true),
        (25, 3, 7, 8, false, false, false),
    ] {
        let (a, b) = (product_bits(lanes, seed, m, n, k, bf16, bias, add), product_bits(&tiled, seed, m, n, k, bf16, bias, add));
        let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        assert_eq!(differ, 0, "{m}×{k}·{k}×{n} bf16={bf16} bias={bias} add={add}: {differ} of {} outputs differ in their bits", a.len());
    }
}

#[test]
fn linear_f32() {
    check_linear(3, 129, 64, 200, false, true);
    check_linear(6, 70, 300, 64, true, true);
}

#[test]
fn linear_reads_and_writes_column_windows() {
    // x is columns [5, 5+k) of a 40-wide buffer; y goes to columns [3, 3+n) of a 50-wide one.
    let gpu = gpu();
    let (m, n, k) = (37usize, 29usize, 31usize);
    let mut rng = Rng::new(4);
    let wide_x = rng.normals(m * 40, 1.0);
    let x: Vec<f32> = (0..m).flat_map(|i| wide_x[i * 40 + 5..i * 40 + 5 + k].to_vec()).collect();
    let w = rng.bf16s(n * k, 0.2);
    let mut want = vec![0.0; m * n];
    r::linear(&x, Weights::Bf16(&w), None, m, n, k, &mut want);

    let xb = gpu.upload_f32("x", &wide_x);
    let wb = gpu.upload_bf16("w", &w);
    let yb = poisoned(gpu, m * 50);
    let got = run_and_read(gpu, &yb, m * 50, |enc| {
        let x = Mat { buf: &xb, offset: 5, stride: 40 };
        let y = Mat { buf: &yb, offset: 3, stride: 50 };
        linear(gpu, enc, x, Weight::bf16(&wb), None, y, Gemm { m: m as u64, n: n as u64, k: k as u64 })
    });
    let window: Vec<f32> = (0..m).flat_map(|i| got[i * 50 + 3..i * 50 + 3 + n].to_vec()).collect();
    assert_close("linear into a column window", &window, &want, F32_TOL);
    let outside = (0..m).flat_map(|i| (0..50).filter(|c| !(3..3 + n).contains(c)).map(move |c| i * 50 + c));
    assert!(outside.into_iter().all(|i| got[i].is_nan()), "linear wrote outside its window");
}

#[test]
fn linear_splits_tensors_larger_than_a_storage_binding() {
    // Cap bindings at 64 KiB: the 100 KiB bf16 weight, 140 KiB input and
    // 180 KiB output can each be bound only in pieces.
    let gpu = small_binding_gpu(64 << 10);
    assert_eq!(gpu.max_binding(), 64 << 10);
    let (m, n, k) = (180usize, 250usize, 200usize);
    assert!((n * k * 2) as u64 > gpu.max_binding() && (m * k * 4) as u64 > gpu.max_binding());
    let mut rng = Rng::new(5);
    let x = rng.normals(m * k, 1.0);
    let w = rng.bf16s(n * k, 0.1);
    let b = rng.bf16s(n, 1.0);
    let mut want = vec![0.0; m * n];
    r::linear(&x, Weights::Bf16(&w), Some(Weights::Bf16(&b)), m, n, k, &mut want);
    let (xb, wb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
    let yb = poisoned(&gpu, m * n);
    let got = run_and_read(&gpu, &yb, m * n, |enc| {
        linear(&gpu, enc, Mat::new(&xb, k as u64), Weight::bf16(&wb), Some(Weight::bf16(&bb)), Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
    });
    assert_close("split linear", &got, &want, F32_TOL);
}

#[test]
fn linear_refuses_a_single_row_larger_than_a_binding() {
    let gpu = small_binding_gpu(4 << 10);
    // One f32 input row is 6000 bytes; one bf16 weight row (3000) would fit.
    let k = 1500usize;
    let xb = gpu.storage("x", (k * 4) as u64);
    let wb = gpu.storage("w", (k * 2) as u64);
    let yb = gpu.storage("y", 4);
    let err = gpu
        .submit(|enc| linear(&gpu, enc, Mat::new(&xb, k as u64), Weight::bf16(&wb), None, Mat::new(&yb, 1), Gemm { m: 1, n: 1, k: k as u64 }))
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("linear input") && msg.contains("4096 bytes"), "{msg}");
}

/// The half tiers' bound against the exact f32 product (why and what
/// was measured: [`crate::selftest::HALF_PRODUCT`]).
const HALF_TOL: f64 = crate::selftest::HALF_PRODUCT;

/// A half tier's linear against the oracle twice: on the operands
/// rounded to f16 as the tier sees them (the f32 kernels' 1e-5: only the
/// order of the f32 sums differs), and on the exact operands ([`HALF_TOL`]).
fn check_half_linear(gpu: &Gpu, seed: u64, [m, n, k]: [usize; 3], bf16: bool, with_bias: bool) {
    let mut rng = Rng::new(seed);
    let x = rng.normals(m * k, 1.0);
    let (wbits, wf) = (rng.bf16s(n * k, 0.1), rng.normals(n * k, 0.1));
    let (bbits, bf) = (rng.bf16s(n, 1.0), rng.normals(n, 1.0));
    let w_values: Vec<f32> = if bf16 { wbits.iter().map(|&b| flux_lite_core::numerics::bf16::to_f32(b)).collect() } else { wf.clone() };
    let bias_values: Vec<f32> = if bf16 { bbits.iter().map(|&b| flux_lite_core::numerics::bf16::to_f32(b)).collect() } else { bf.clone() };
    let bias_ref = with_bias.then_some(Weights::F32(&bias_values));
    let mut exact = vec![0.0; m * n];
    r::linear(&x, Weights::F32(&w_values), bias_ref, m, n, k, &mut exact);
    let round = operand_rounding(gpu);
    let (x16, w16): (Vec<f32>, Vec<f32>) = (x.iter().map(|&v| round(v)).collect(), w_values.iter().map(|&v| round(v)).collect());
    let mut rounded = vec![0.0; m * n];
    r::linear(&x16, Weights::F32(&w16), bias_ref, m, n, k, &mut rounded);

    let xb = gpu.upload_f32("x", &x);
    let (wb, bb) = if bf16 { (gpu.upload_bf16("w", &wbits), gpu.upload_bf16("b", &bbits)) } else { (gpu.upload_f32("w", &wf), gpu.upload_f32("b", &bf)) };
    let weight = |buf| if bf16 { Weight::bf16(buf) } else { Weight::f32(buf) };
    let yb = poisoned(gpu, m * n);
    let got = run_and_read(gpu, &yb, m * n, |enc| {
        let bias = with_bias.then(|| weight(&bb));
        linear(gpu, enc, Mat::new(&xb, k as u64), weight(&wb), bias, Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
    });
    let what = format!("{} linear {m}x{n}x{k} bf16={bf16} bias={with_bias}", gpu.precision().name());
    assert_close(&format!("{what}, vs the operands as the tier rounds them"), &got, &rounded, F32_TOL);
    let err = rel_l2(&got, &exact);
    println!("{what}: relative L2 {err:.2e} against the exact product");
    assert_close(&format!("{what}, vs exact operands"), &got, &exact, HALF_TOL);
}

/// Sizes off every tile edge (8, 16 and 128), bf16 and f32 weights, with and without bias.
fn check_half_tier(gpu: &Gpu) {
    check_half_linear(gpu, 21, [70, 131, 77], true, true);
    check_half_linear(gpu, 22, [1, 65, 33], true, false);
    check_half_linear(gpu, 23, [33, 20, 100], false, true);
    check_half_linear(gpu, 24, [128, 96, 64], true, true);
    check_half_linear(gpu, 25, [300, 260, 100], true, true);
    // k on whole vec4s: the matrix tier reads x and W as vec4s.
    check_half_linear(gpu, 26, [300, 260, 136], true, true);
    held_within("half-tier linear adding onto its output", crate::selftest::check_linear_add(gpu, 45, 70, 12, 9), HALF_TOL);
}

#[test]
fn linear_add_sums_onto_its_output_window_and_leaves_the_rest() {
    held("linear adding onto its output", crate::selftest::check_linear_add(gpu(), 45, 70, 12, 9));
    // Past one 128×128 tile both ways, with an odd rank.
    held("linear adding onto its output, several tiles", crate::selftest::check_linear_add(gpu(), 150, 260, 7, 10));
}

#[test]
fn linear_on_matrix_units_matches_the_oracle() {
    let Some(gpu) = matrix_gpu() else { return };
    let c = gpu.matrix().unwrap();
    println!("matrix tier on {}: {}×{} tiles, subgroup {}", gpu.describe(), c.size, c.size, c.subgroup);
    check_half_tier(&gpu);
}

/// The matrix linear where bindings split x, W and y into pieces and x
/// is a column window of a wider tensor: each piece measures its own
/// rows' range scales into the shared scales buffer before its tiles.
#[test]
fn linear_on_matrix_units_splits_and_reads_a_window() {
    // From column 5 of 207 (x read element by element), and from column
    // 4 of 212 (each piece's window on whole vec4s: read as vec4s).
    for (wide, from) in [(207usize, 5usize), (212, 4)] {
        let got = split_window_case(wide, from);
        if wide == 212 {
            let by_elements = with_element_fetch(|| split_window_case(wide, from));
            assert_eq!(bits(&got), bits(&by_elements), "vec4 and element fetching differ");
        }
    }
}

/// [`linear_on_matrix_units_splits_and_reads_a_window`]'s product from
/// column `from` of a `wide` x, checked against the oracle; its output.
fn split_window_case(wide: usize, from: usize) -> Vec<f32> {
    let Some(gpu) = tier_gpu_with(GpuOptions { precision: Precision::Matrix, max_storage_binding: Some(64 << 10), ..crate::testing::options() }) else { return Vec::new() };
    let (m, n, k) = (180usize, 250usize, 200usize);
    let mut rng = Rng::new(41);
    let mut xs = rng.normals(m * wide, 1.0);
    // A row of 1e5s in a later piece: its scale must be its own, or f16 overflows.
    xs[170 * wide..171 * wide].iter_mut().for_each(|v| *v *= 1e5);
    let x: Vec<f32> = (0..m).flat_map(|i| xs[i * wide + from..i * wide + from + k].to_vec()).collect();
    let w = rng.bf16s(n * k, 0.1);
    let b = rng.bf16s(n, 1.0);
    let mut want = vec![0.0; m * n];
    r::linear(&x, Weights::Bf16(&w), Some(Weights::Bf16(&b)), m, n, k, &mut want);
    let (xb, wb, bb) = (gpu.upload_f32("x", &xs), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
    let yb = poisoned(&gpu, m * n);
    let got = run_and_read(&gpu, &yb, m * n, |enc| {
        let x = Mat::new(&xb, wide as u64).cols_from(from as u64);
        linear(&gpu, enc, x, Weight::bf16(&wb), Some(Weight::bf16(&bb)), Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
    });
    assert_close(&format!("matrix linear, split, from column {from} of {wide}"), &got, &want, HALF_TOL);
    got
}

thread_local! {
    /// Set by [`with_element_fetch`]: the matrix linear reads x and W element by element.
    pub(crate) static ELEMENT_FETCH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `run` with the matrix linear reading element by element where it would read vec4s.
pub(crate) fn with_element_fetch<T>(run: impl FnOnce() -> T) -> T {
    with_switch(&ELEMENT_FETCH, run)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The matrix linear reading x and W as vec4s gives the bits of reading
/// them element by element (the same values rounded the same way, the
/// same products in the same order), with and without bias, off every
/// tile edge, over several k steps.
#[test]
fn the_matrix_linears_vec4_fetching_gives_the_element_fetchings_bits() {
    let Some(gpu) = matrix_gpu() else { return };
    for (seed, [m, n, k], with_bias) in [(60, [300usize, 260usize, 136usize], true), (61, [7, 33, 64], false), (62, [129, 129, 8], true)] {
        let mut rng = Rng::new(seed);
        let x = rng.normals(m * k, 1.0);
        let (w, b) = (rng.bf16s(n * k, 0.1), rng.bf16s(n, 1.0));
        let (xb, wb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
        let run = || {
            let yb = poisoned(&gpu, m * n);
            run_and_read(&gpu, &yb, m * n, |enc| {
                let bias = with_bias.then(|| Weight::bf16(&bb));
                linear(&gpu, enc, Mat::new(&xb, k as u64), Weight::bf16(&wb), bias, Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
            })
        };
        let (vec4s, elements) = (run(), with_element_fetch(run));
        assert!(vec4s.iter().all(|v| v.is_finite()), "{m}×{n}×{k}: values left unwritten");
        assert_eq!(bits(&vec4s), bits(&elements), "{m}×{n}×{k}: vec4 and element fetching differ");
    }
}


/// A W packed in place as f16 under its rows' kept scales (rows far above
/// and far below f16's range among them) gives the bits of the bf16 W under
/// the same scales: read as vec4s (k a multiple of 8) or as pairs, and
/// element by element.
#[test]
fn the_matrix_linear_over_a_packed_w_gives_the_bits_of_the_bf16_one() {
    let Some(gpu) = tier_gpu_with(GpuOptions { precision: Precision::Matrix, ..crate::testing::options() }).and_then(with_f16_tiles) else { return };
    for (seed, [m, n, k]) in [(72u64, [70usize, 90usize, 136usize]), (73, [33, 40, 138])] {
        let mut rng = Rng::new(seed);
        let x = rng.normals(m * k, 1.0);
        let mut w = rng.bf16s(n * k, 0.1);
        let scaled = |v: u16, by: f32| half::bf16::from_f32(half::bf16::from_bits(v).to_f32() * by).to_bits();
        w[3 * k..4 * k].iter_mut().for_each(|v| *v = scaled(*v, 1e6));
        w[5 * k..6 * k].iter_mut().for_each(|v| *v = scaled(*v, 1e-6));
        let b = rng.bf16s(n, 1.0);
        let s = Gemm { m: m as u64, n: n as u64, k: k as u64 };
        let run = |packed: bool, element: bool| -> Vec<u32> {
            let (xb, wb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
            let scales = gpu.storage("weight row scales", 4 * n as u64);
            gpu.submit(|enc| measure_weight_rows(&gpu, enc, Weight::bf16(&wb), n as u64, k as u64, &scales, 0)).unwrap();
            if packed {
                gpu.submit(|enc| crate::kernels::pack_weight_half(&gpu, enc, Weight::bf16(&wb), Mat::new(&scales, 1), [n as u64, k as u64])).unwrap();
            }
            let weight = Weight { scales: Some(crate::RowScales { buf: &scales, offset: 0, k: k as u64, packed }), ..Weight::bf16(&wb) };
            let product = || {
                let yb = poisoned(&gpu, m * n);
                run_and_read(&gpu, &yb, m * n, |enc| linear(&gpu, enc, Mat::new(&xb, k as u64), weight, Some(Weight::bf16(&bb)), Mat::new(&yb, n as u64), s))
            };
            bits(&if element { with_element_fetch(product) } else { product() })
        };
        for element in [false, true] {
            let (bf16, packed) = (run(false, element), run(true, element));
            let differ = bf16.iter().zip(&packed).filter(|(a, b)| a != b).count();
            assert_eq!(differ, 0, "{m}×{n}×{k}, element by element {element}: {differ} of {} outputs differ", bf16.len());
        }
    }
}

/// A matrix linear over a weight whose rows' scales were measured once
/// (`measure_weight_rows`, as a weight reaching the device has them)
/// gives the bits of one that measures W itself, over a part of the
/// weight's rows, in pieces (bindings of 64 KiB) and whole, read as
/// vec4s (k = 136) and element by element (k = 131); and it records
/// one pass fewer: no measure of W.
#[test]
fn the_matrix_linear_reads_a_weights_stored_scales_with_the_bits_it_would_measure() {
    for limit in [Some(64u64 << 10), None] {
        let Some(gpu) = tier_gpu_with(GpuOptions { precision: Precision::Matrix, max_storage_binding: limit, ..crate::testing::options() }).and_then(with_f16_tiles) else { return };
        for (seed, [m, n, k]) in [(70u64, [180usize, 250usize, 136usize]), (71, [33, 70, 131])] {
            let (first, rows) = (40usize, n + 45);
            let mut rng = Rng::new(seed);
            let x = rng.normals(m * k, 1.0);
            let mut w = rng.bf16s(rows * k, 0.1);
            // A row far above f16's range: its scale must be its own.
            w[(first + 3) * k..(first + 4) * k].iter_mut().for_each(|v| *v = half::bf16::from_f32(half::bf16::from_bits(*v).to_f32() * 1e6).to_bits());
            let b = rng.bf16s(rows, 1.0);
            let (xb, wb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
            let scales = gpu.storage("weight row scales", 4 * (rows as u64 + 5));
            let s = Gemm { m: m as u64, n: n as u64, k: k as u64 };
            let mut measure: Vec<crate::Dispatch> = Vec::new();
            measure_weight_rows(&gpu, &mut measure, Weight::bf16(&wb), rows as u64, k as u64, &scales, 5).unwrap();
            gpu.submit(|enc| {
                crate::encode(enc, &measure);
                Ok(())
            })
            .unwrap();
            let stored = Weight { scales: Some(crate::RowScales { buf: &scales, offset: 5, k: k as u64, packed: false }), ..Weight::bf16(&wb) };
            let run = |weight: Weight<'_>| {
                let yb = poisoned(&gpu, m * n);
                let mut recorded: Vec<crate::Dispatch> = Vec::new();
                let bias = Some(Weight::bf16(&bb).rows_from(first as u64, 1));
                linear(&gpu, &mut recorded, Mat::new(&xb, k as u64), weight.rows_from(first as u64, k as u64), bias, Mat::new(&yb, n as u64), s).unwrap();
                let got = run_and_read(&gpu, &yb, m * n, |enc| {
                    crate::encode(enc, &recorded);
                    Ok(())
                });
                (got, recorded.len())
            };
            let ((with, with_passes), (without, without_passes)) = (run(stored), run(Weight::bf16(&wb)));
            assert!(with.iter().all(|v| v.is_finite()), "{m}×{n}×{k}: values left unwritten or not finite");
            assert_eq!(bits(&with), bits(&without), "{m}×{n}×{k}, bindings {limit:?}: stored and measured scales differ");
            if limit.is_none() {
                assert_eq!(with_passes + 1, without_passes, "{m}×{n}×{k}: the stored scales' product still measures W");
            }
        }
    }
}

#[test]
fn linear_on_f16_tiles_matches_the_oracle() {
    let Some(gpu) = half_gpu() else { return };
    check_half_tier(&gpu);
}

#[test]
fn linear_on_matrix_units_keeps_values_beyond_f16_finite_and_close() {
    let Some(gpu) = matrix_gpu() else { return };
    check_range_rule(&gpu);
}

#[test]
fn linear_on_f16_tiles_keeps_values_beyond_f16_finite_and_close() {
    let Some(gpu) = half_gpu() else { return };
    check_range_rule(&gpu);
}

/// The range rule (range_rule.wgsl): rows of x and of W far above f16's
/// 65504 or below its smallest normal (6.1e-5) give what f32 gives, row
/// by row, and never Inf or NaN.
fn check_range_rule(gpu: &Gpu) {
    let (m, n, k) = (24usize, 19usize, 40usize);
    let mut rng = Rng::new(31);
    let mut x = rng.normals(m * k, 1.0);
    x[..k].iter_mut().for_each(|v| *v *= 1e5); // a row of 1e5s
    x[k..2 * k].iter_mut().for_each(|v| *v *= 1e-6); // a row of 1e-6s
    x[2 * k + 3] = 1e5; // one outlier among ordinary values
    let mut w = rng.normals(n * k, 0.1);
    w[..k].iter_mut().for_each(|v| *v *= 1e6); // weights of 1e5
    w[k..2 * k].iter_mut().for_each(|v| *v *= 1e-5); // weights of 1e-6
    let mut want = vec![0.0; m * n];
    r::linear(&x, Weights::F32(&w), None, m, n, k, &mut want);
    let (xb, wb, yb) = (gpu.upload_f32("x", &x), gpu.upload_f32("w", &w), poisoned(gpu, m * n));
    let got = run_and_read(gpu, &yb, m * n, |enc| {
        linear(gpu, enc, Mat::new(&xb, k as u64), Weight::f32(&wb), None, Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
    });
    assert!(want.iter().all(|v| v.is_finite()));
    assert!(got.iter().all(|v| v.is_finite()), "Inf or NaN where f32 is finite");
    // Row by row (and for the two outlier columns), the outliers are as
    // close to f32 as the ordinary rows are: f16 rounding, nothing more.
    let row_err = |row: usize| rel_l2(&got[row * n..][..n], &want[row * n..][..n]);
    let col_err = |col: usize| {
        let g: Vec<f32> = (0..m).map(|r| got[r * n + col]).collect();
        rel_l2(&g, &(0..m).map(|r| want[r * n + col]).collect::<Vec<_>>())
    };
    let ordinary = (3..m).map(row_err).fold(0.0f64, f64::max);
    println!("{} tier, ordinary rows: worst relative L2 {ordinary:.2e}", gpu.precision().name());
    for (what, err) in [("row of 1e5", row_err(0)), ("row of 1e-6", row_err(1)), ("row with an outlier", row_err(2)), ("weights of 1e5", col_err(0)), ("weights of 1e-6", col_err(1))] {
        println!("{what}: relative L2 {err:.2e}");
        assert!(err <= 2.0 * ordinary.max(HALF_TOL / 2.0), "{what}: relative L2 {err:.2e}, ordinary rows {ordinary:.2e}");
    }
}

/// A matrix device staging its products so (`None`: as the adapter chooses).
pub(crate) fn staged_gpu((staging, memory): Staged) -> Option<Gpu> {
    tier_gpu_with(GpuOptions { precision: Precision::Matrix, gemm_staging: staging, max_workgroup_memory: memory, ..crate::testing::options() })
}

/// A staging asked for, and the workgroup memory a device is asked to have.
pub(crate) type Staged = (Option<crate::GemmStaging>, Option<u32>);

/// The adapter's own staging (lavapipe's 8×8 f16 tiles in its 32 KiB: deep;
/// NVIDIA's 16×16 in its 48 KiB: lean), then the two leaner ones.
pub(crate) const STAGINGS: [Staged; 3] = [(None, None), (Some(crate::GemmStaging::SINGLE), None), (Some(crate::GemmStaging::LEAN), None)];

/// The deep staging where its two out-slots do not fit: the workgroup
/// memory asked for is exactly its bytes with one (8×8 f16 tiles: 15,104
/// of 16,128; 16×16: 48,640 of 52,736), on the core all the GEMM's modules
/// share.
fn one_out_slot(config: crate::MatrixConfig) -> Staged {
    let deep = crate::MatrixConfig { staging: crate::GemmStaging::DEEP.one_out_slot(), ..config };
    (Some(crate::GemmStaging::DEEP), Some(deep.linear_workgroup_bytes()))
}

/// Every staging of the GEMM core's k steps gives the bits of the
/// adapter's own (the same products, summed in the same order): x and W as
/// vec4s, W's bf16 pairs and f32 W element by element (staged before the
/// products into the other buffer, or after them into the one), off every
/// tile edge, over several k steps; and the deep staging with one
/// out-slot. On 8×8 f16 tiles in 32 KiB: deep, single, lean; on 16×16 in
/// 48 KiB, where the deep staging's two out-slots never fit: lean, single;
/// on 8×8 f32 tiles in 32 KiB: single, lean.
#[test]
fn every_staging_of_the_matrix_linear_gives_the_same_bits() {
    let Some(adapters) = staged_gpu((None, None)) else { return };
    let config = adapters.matrix().unwrap();
    drop(adapters);
    let mut reference: Option<Vec<Vec<u32>>> = None;
    let mut stagings = Vec::new();
    for asked in STAGINGS.into_iter().chain([one_out_slot(config)]) {
        let Some(gpu) = staged_gpu(asked) else { return };
        let staging = gpu.matrix().unwrap().staging;
        println!("{}", gpu.matrix().unwrap().describe());
        stagings.push(staging);
        let mut outputs = Vec::new();
        for (seed, [m, n, k], bf16, elements) in [(70, [300usize, 260usize, 136usize], true, false), (71, [129, 70, 77], true, false), (72, [65, 33, 48], false, false), (73, [140, 129, 40], true, true)] {
            let mut rng = Rng::new(seed);
            let x = rng.normals(m * k, 1.0);
            let (wbits, wf, b) = (rng.bf16s(n * k, 0.1), rng.normals(n * k, 0.1), rng.bf16s(n, 1.0));
            let xb = gpu.upload_f32("x", &x);
            let (wb, bb) = (if bf16 { gpu.upload_bf16("w", &wbits) } else { gpu.upload_f32("w", &wf) }, gpu.upload_bf16("b", &b));
            let run = || {
                let yb = poisoned(&gpu, m * n);
                run_and_read(&gpu, &yb, m * n, |enc| {
                    let w = if bf16 { Weight::bf16(&wb) } else { Weight::f32(&wb) };
                    linear(&gpu, enc, Mat::new(&xb, k as u64), w, Some(Weight::bf16(&bb)), Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
                })
            };
            let y = if elements { with_element_fetch(run) } else { run() };
            assert!(y.iter().all(|v| v.is_finite()), "{m}×{n}×{k} under {staging:?}: values left unwritten");
            outputs.push(bits(&y));
        }
        match &reference {
            None => reference = Some(outputs),
            Some(first) => assert!(first == &outputs, "{staging:?} differs from {:?}", stagings[0]),
        }
    }
    use crate::GemmStaging as G;
    assert_eq!(stagings, [config.staging, G::SINGLE, G::LEAN, G::DEEP.one_out_slot()], "the tier staged otherwise than this test means to cover");
    let distinct = stagings.iter().enumerate().filter(|(i, s)| !stagings[..*i].contains(s)).count();
    assert!(distinct >= 3, "fewer than three stagings compared: {stagings:?}");
}

/// A staging asked for that does not fit the device's workgroup memory
/// once is refused when the device is made, naming the bytes.
#[test]
fn a_forced_staging_that_does_not_fit_is_refused_naming_the_bytes() {
    let options = GpuOptions { precision: Precision::Matrix, max_workgroup_memory: Some(10 << 10), gemm_staging: Some(crate::GemmStaging::DEEP), ..crate::testing::options() };
    if staged_gpu((None, None)).is_none() {
        return;
    }
    let Err(refused) = Gpu::new(&options) else { panic!("a deep staging in 10 KiB of workgroup memory was taken") };
    let refused = refused.to_string();
    assert!(refused.contains("needs") && refused.contains("bytes of workgroup memory and the adapter has 10240"), "{refused}");
}

/// A stacked product (`linear_stacked`: each stack of x's rows on its own
/// rows of W, in one dispatch) gives every stack the bits of its own
/// product over those rows of W alone: set and rescaling onto its output,
/// the last stack short, W's scales measured over every stack's rows,
/// stacks apart and two to a W starting one into a group (grouped heads);
/// and a stack that is not whole blocks is refused.
#[test]
fn a_stacked_product_gives_each_stack_the_bits_of_its_own_product() {
    let Some(gpu) = f16_matrix_gpu() else { return };
    let (stack, count, n) = (128usize, 3usize, 40usize);
    for (seed, k) in [(80u64, 136usize), (81, 130)] {
        let m = 2 * stack + 70;
        let mut rng = Rng::new(seed);
        let (x, w) = (rng.normals(m * k, 1.0), rng.bf16s(count * n * k, 0.1));
        let (y0, factors) = (rng.normals(m * n, 1.0), rng.normals(m, 1.0));
        let (xb, wb, fb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_f32("factors", &factors));
        for (rescaling, [group, skew]) in [(false, [1, 0]), (true, [1, 0]), (true, [2, 1])] {
            let factors = rescaling.then(|| Mat::new(&fb, 1));
            let yb = gpu.upload_f32("y", &y0);
            let stacks = Stack { rows: stack as u64, count: count as u64, group, skew };
            let s = Gemm { m: m as u64, n: n as u64, k: k as u64 };
            let stacked = run_and_read(&gpu, &yb, m * n, |enc| linear_stacked(&gpu, enc, Input::F32(Mat::new(&xb, k as u64)), Weight::bf16(&wb), Mat::new(&yb, n as u64), factors, s, stacks));
            let yb = gpu.upload_f32("y", &y0);
            let apart = run_and_read(&gpu, &yb, m * n, |enc| {
                for i in 0..count {
                    let (first, rows) = ((i * stack) as u64, (stack.min(m - i * stack)) as u64);
                    let x = Input::F32(Mat { offset: first * k as u64, ..Mat::new(&xb, k as u64) });
                    let w_first = (i as u64 + skew) / group * n as u64;
                    let (w, y) = (Weight::bf16(&wb).rows_from(w_first, k as u64), Mat { offset: first * n as u64, ..Mat::new(&yb, n as u64) });
                    let s = Gemm { m: rows, ..s };
                    match factors {
                        Some(f) => linear_rescaling(&gpu, enc, x, w, y, Mat { offset: first, ..f }, s)?,
                        None => linear_from(&gpu, enc, x, w, None, y, s)?,
                    }
                }
                Ok(())
            });
            assert!(stacked.iter().all(|v| v.is_finite()), "k {k}: values not finite");
            assert_eq!(bits(&stacked), bits(&apart), "k {k}, rescaling {rescaling}, {group} a W from {skew}: a stack's outputs differ from its own product's");
        }
        let yb = gpu.storage("y", (4 * m * n) as u64);
        let mut sink: Vec<crate::Dispatch> = Vec::new();
        let ragged = Stack::apart(100, 4);
        let refused = linear_stacked(&gpu, &mut sink, Input::F32(Mat::new(&xb, k as u64)), Weight::bf16(&wb), Mat::new(&yb, n as u64), None, Gemm { m: m as u64, n: n as u64, k: k as u64 }, ragged);
        assert!(matches!(refused, Err(GpuError::UnsupportedShape(_))), "stacks of 100 rows: {refused:?}");
    }
}
