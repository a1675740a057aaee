//! Every WGSL kernel against core's f64 reference, on fresh random inputs,
//! with sizes that are not multiples of the tiles and poisoned outputs.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use flux_lite_core::reference::{self as r, Weights};
use flux_lite_core::rope;
use flux_lite_platform::ops::{self, Attention, ConvShape, Elementwise, Mat, RopeStyle, RowNorm, Weight};

fn check_linear(seed: u64, m: usize, n: usize, k: usize, bf16: bool, with_bias: bool) {
    let gpu = gpu();
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
        ops::linear(gpu, enc, Mat::new(&xb, k as u64), weight(&wb), bias, Mat::new(&yb, n as u64), m as u64, n as u64, k as u64)
    });
    assert_close(&format!("linear {m}x{n}x{k} bf16={bf16} bias={with_bias}"), &got, &want, F32_TOL);
}

#[test]
fn linear_bf16_with_bias() {
    check_linear(1, 70, 131, 77, true, true);
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
        ops::linear(gpu, enc, Mat::new(&xb, k as u64), w, None, Mat::new(&yb, n as u64), m as u64, n as u64, k as u64)
    });
    assert_close("linear at an odd weight offset", &got, &want, F32_TOL);
}

#[test]
fn linear_f32() {
    check_linear(3, 129, 64, 200, false, true);
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
        ops::linear(gpu, enc, x, Weight::bf16(&wb), None, y, m as u64, n as u64, k as u64)
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
        ops::linear(&gpu, enc, Mat::new(&xb, k as u64), Weight::bf16(&wb), Some(Weight::bf16(&bb)), Mat::new(&yb, n as u64), m as u64, n as u64, k as u64)
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
        .submit(|enc| ops::linear(&gpu, enc, Mat::new(&xb, k as u64), Weight::bf16(&wb), None, Mat::new(&yb, 1), 1, 1, k as u64))
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("linear input") && msg.contains("4096 bytes"), "{msg}");
}

#[test]
fn rms_norm_rows_with_bf16_weight() {
    let gpu = gpu();
    let (rows, d) = (37usize, 300usize);
    let mut rng = Rng::new(6);
    let x = rng.normals(rows * d, 3.0);
    let w = rng.bf16s(d, 1.0);
    let mut want = vec![0.0; rows * d];
    r::rms_norm(&x, Weights::Bf16(&w), rows, d, 1e-6, &mut want);
    let (xb, wb, yb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), poisoned(gpu, rows * d));
    let s = RowNorm { tokens: rows as u64, heads: 1, d: d as u64, eps: 1e-6 };
    let got = run_and_read(gpu, &yb, rows * d, |enc| {
        ops::rms_norm(gpu, enc, Mat::new(&xb, d as u64), Weight::bf16(&wb), Mat::new(&yb, d as u64), s)
    });
    assert_close("rms_norm", &got, &want, F32_TOL);
}

#[test]
fn rms_norm_per_head_in_place_on_a_strided_view() {
    // q of a fused [tokens, 3·heads·d + 10] projection: heads of width d at columns [7, 7 + heads·d).
    let gpu = gpu();
    let (tokens, heads, d) = (19usize, 3usize, 24usize);
    let stride = 3 * heads * d + 10;
    let mut rng = Rng::new(7);
    let fused = rng.normals(tokens * stride, 2.0);
    let w = rng.bf16s(d, 1.0);
    let q: Vec<f32> = (0..tokens).flat_map(|t| fused[t * stride + 7..t * stride + 7 + heads * d].to_vec()).collect();
    let mut want = vec![0.0; tokens * heads * d];
    r::rms_norm(&q, Weights::Bf16(&w), tokens * heads, d, 1e-6, &mut want);
    let (fb, wb) = (gpu.upload_f32("fused", &fused), gpu.upload_bf16("w", &w));
    let s = RowNorm { tokens: tokens as u64, heads: heads as u64, d: d as u64, eps: 1e-6 };
    let got = run_and_read(gpu, &fb, tokens * stride, |enc| {
        ops::rms_norm_inplace(gpu, enc, Mat { buf: &fb, offset: 7, stride: stride as u64 }, Weight::bf16(&wb), s)
    });
    let window: Vec<f32> = (0..tokens).flat_map(|t| got[t * stride + 7..t * stride + 7 + heads * d].to_vec()).collect();
    assert_close("per-head rms_norm", &window, &want, F32_TOL);
    for t in 0..tokens {
        for c in (0..7).chain(7 + heads * d..stride) {
            assert_eq!(got[t * stride + c], fused[t * stride + c], "touched outside the heads");
        }
    }
}

#[test]
fn layer_norm_with_modulation() {
    let gpu = gpu();
    let (rows, d) = (41usize, 333usize);
    let mut rng = Rng::new(8);
    // A large common offset checks that the variance is taken around the mean.
    let x: Vec<f32> = rng.normals(rows * d, 1.0).into_iter().map(|v| v + 20.0).collect();
    let modulation = rng.normals(6 * d, 0.5); // (shift1, scale1, gate1, shift2, scale2, gate2)
    let (shift, scale) = (&modulation[3 * d..4 * d], &modulation[4 * d..5 * d]);
    let mut want = vec![0.0; rows * d];
    r::layer_norm_modulate(&x, shift, scale, rows, d, 1e-6, &mut want);
    let (xb, mb, yb) = (gpu.upload_f32("x", &x), gpu.upload_f32("mod", &modulation), poisoned(gpu, rows * d));
    let s = RowNorm { tokens: rows as u64, heads: 1, d: d as u64, eps: 1e-6 };
    let got = run_and_read(gpu, &yb, rows * d, |enc| {
        let shift = Mat { buf: &mb, offset: 3 * d as u64, stride: 0 };
        let scale = Mat { buf: &mb, offset: 4 * d as u64, stride: 0 };
        ops::layer_norm_modulate(gpu, enc, Mat::new(&xb, d as u64), shift, scale, Mat::new(&yb, d as u64), s)
    });
    assert_close("layer_norm_modulate", &got, &want, F32_TOL);
}

fn check_group_norm(silu: bool) {
    let gpu = gpu();
    let (channels, groups, pixels) = (24usize, 8usize, 13 * 11);
    let mut rng = Rng::new(9 + silu as u64);
    let x: Vec<f32> = rng.normals(channels * pixels, 2.0).into_iter().map(|v| v - 3.0).collect();
    let (gamma, beta) = (rng.bf16s(channels, 1.0), rng.bf16s(channels, 1.0));
    let mut want = vec![0.0; channels * pixels];
    r::group_norm(&x, Weights::Bf16(&gamma), Weights::Bf16(&beta), channels, pixels, groups, 1e-6, silu, &mut want);
    let (xb, gb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("gamma", &gamma), gpu.upload_bf16("beta", &beta));
    let yb = poisoned(gpu, channels * pixels);
    let got = run_and_read(gpu, &yb, channels * pixels, |enc| {
        let g = ops::Groups { channels: channels as u64, pixels: pixels as u64, groups: groups as u64 };
        ops::group_norm(gpu, enc, Mat::new(&xb, 0), Weight::bf16(&gb), Weight::bf16(&bb), Mat::new(&yb, 0), g, 1e-6, silu)
    });
    assert_close(&format!("group_norm silu={silu}"), &got, &want, F32_TOL);
}

#[test]
fn group_norm_affine() {
    check_group_norm(false);
}

#[test]
fn group_norm_then_silu() {
    check_group_norm(true);
}

/// GroupNorm split over pixel bands: each band's moments from `group_stats`
/// against f64, merged on the host, then `group_norm_apply` on every band
/// against the reference GroupNorm of the whole tensor.
#[test]
fn group_norm_over_pixel_bands_matches_the_whole() {
    use flux_lite_platform::vae_bands::Moments;
    let gpu = gpu();
    let (channels, groups, pixels) = (12usize, 4usize, 37usize);
    let per = channels / groups;
    let mut rng = Rng::new(70);
    let x: Vec<f32> = rng.normals(channels * pixels, 1.5).into_iter().map(|v| v + 2.0).collect();
    let (gamma, beta) = (rng.bf16s(channels, 1.0), rng.bf16s(channels, 1.0));
    let eps = 1e-6;
    let mut want = vec![0.0; channels * pixels];
    r::group_norm(&x, Weights::Bf16(&gamma), Weights::Bf16(&beta), channels, pixels, groups, eps, true, &mut want);
    let band = |p0: usize, p1: usize| -> Vec<f32> { (0..channels).flat_map(|c| x[c * pixels + p0..c * pixels + p1].to_vec()).collect() };
    let bands = [(0, 10), (10, 25), (25, 37)];
    let g = |n: usize| ops::Groups { channels: channels as u64, pixels: n as u64, groups: groups as u64 };

    let mut moments = vec![Moments::default(); groups];
    for &(p0, p1) in &bands {
        let xs = band(p0, p1);
        let xb = gpu.upload_f32("x", &xs);
        let sb = poisoned(gpu, 2 * groups);
        let got = run_and_read(gpu, &sb, 2 * groups, |enc| ops::group_stats(gpu, enc, Mat::new(&xb, 0), Mat::new(&sb, 0), g(p1 - p0)));
        let n = per * (p1 - p0);
        let want: Vec<f64> = xs
            .chunks(n)
            .flat_map(|grp| {
                let mean = grp.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
                [mean, grp.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>()]
            })
            .collect();
        assert_close(&format!("group_stats pixels {p0}..{p1}"), &got, &want, F32_TOL);
        for (m, s) in moments.iter_mut().zip(got.chunks(2)) {
            m.merge(Moments { count: n as f64, mean: s[0] as f64, m2: s[1] as f64 });
        }
    }
    let stats: Vec<f32> = moments.iter().flat_map(|m| [m.mean as f32, (1.0 / (m.variance() + eps).sqrt()) as f32]).collect();
    let (gb, bb, sb) = (gpu.upload_bf16("gamma", &gamma), gpu.upload_bf16("beta", &beta), gpu.upload_f32("stats", &stats));
    for &(p0, p1) in &bands {
        let xb = gpu.upload_f32("x", &band(p0, p1));
        let n = channels * (p1 - p0);
        let yb = poisoned(gpu, n);
        let got = run_and_read(gpu, &yb, n, |enc| {
            ops::group_norm_apply(gpu, enc, Mat::new(&xb, 0), Mat::new(&sb, 0), Weight::bf16(&gb), Weight::bf16(&bb), Mat::new(&yb, 0), g(p1 - p0), true)
        });
        let want_band: Vec<f64> = (0..channels).flat_map(|c| want[c * pixels + p0..c * pixels + p1].to_vec()).collect();
        assert_close(&format!("group_norm_apply pixels {p0}..{p1}"), &got, &want_band, F32_TOL);
    }
}

#[test]
fn rope_interleaved_with_flux_tables() {
    let gpu = gpu();
    let (tokens, heads, head_dim) = (23usize, 3usize, 16usize);
    let axes = [4usize, 4, 4, 4];
    let (mut cos, mut sin) = (vec![0f32; tokens * head_dim], vec![0f32; tokens * head_dim]);
    for t in 0..tokens {
        let pos = if t < 5 { rope::text_position(t) } else { rope::image_position(0, (t - 5) / 6, (t - 5) % 6) };
        let row = t * head_dim..(t + 1) * head_dim;
        rope::flux_row(pos, &axes, 2000.0, &mut cos[row.clone()], &mut sin[row]);
    }
    check_rope(gpu, RopeStyle::Interleaved, tokens, heads, head_dim, &cos, &sin, 10);
}

#[test]
fn rope_rotate_half_with_qwen_tables() {
    let gpu = gpu();
    let (tokens, heads, head_dim) = (17usize, 4usize, 8usize);
    let (mut cos, mut sin) = (vec![0f32; tokens * head_dim], vec![0f32; tokens * head_dim]);
    for t in 0..tokens {
        let row = t * head_dim..(t + 1) * head_dim;
        rope::qwen_row(t * 31, head_dim, 1e6, &mut cos[row.clone()], &mut sin[row]);
    }
    check_rope(gpu, RopeStyle::RotateHalf, tokens, heads, head_dim, &cos, &sin, 11);
}

#[allow(clippy::too_many_arguments)]
fn check_rope(gpu: &flux_lite_platform::Gpu, style: RopeStyle, tokens: usize, heads: usize, head_dim: usize, cos: &[f32], sin: &[f32], seed: u64) {
    let mut rng = Rng::new(seed);
    let stride = heads * head_dim + 6; // a strided view, as q inside a fused projection
    let data = rng.normals(tokens * stride, 1.0);
    let x: Vec<f32> = (0..tokens).flat_map(|t| data[t * stride + 2..t * stride + 2 + heads * head_dim].to_vec()).collect();
    let mut want = vec![0.0; x.len()];
    match style {
        RopeStyle::Interleaved => r::rope_interleaved(&x, cos, sin, tokens, heads, head_dim, &mut want),
        RopeStyle::RotateHalf => r::rope_rotate_half(&x, cos, sin, tokens, heads, head_dim, &mut want),
    }
    // Tables with two leading rows that must be skipped via table_row.
    let pad = vec![f32::NAN; 2 * head_dim];
    let cos_b = gpu.upload_f32("cos", &[pad.clone(), cos.to_vec()].concat());
    let sin_b = gpu.upload_f32("sin", &[pad, sin.to_vec()].concat());
    let db = gpu.upload_f32("data", &data);
    let got = run_and_read(gpu, &db, data.len(), |enc| {
        let view = Mat { buf: &db, offset: 2, stride: stride as u64 };
        ops::rope(gpu, enc, style, view, &cos_b, &sin_b, 2, tokens as u64, heads as u64, head_dim as u64)
    });
    let window: Vec<f32> = (0..tokens).flat_map(|t| got[t * stride + 2..t * stride + 2 + heads * head_dim].to_vec()).collect();
    assert_close(&format!("rope {style:?}"), &window, &want, F32_TOL);
}

struct AttnCase {
    q_len: usize,
    kv_len: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    causal: bool,
    padded_keys: usize,
}

fn check_attention(gpu: &flux_lite_platform::Gpu, c: AttnCase, seed: u64) {
    let mut rng = Rng::new(seed);
    let q = rng.normals(c.q_len * c.q_heads * c.head_dim, 1.0);
    let k = rng.normals(c.kv_len * c.kv_heads * c.head_dim, 1.0);
    let v = rng.normals(c.kv_len * c.kv_heads * c.head_dim, 1.0);
    let keep: Vec<u32> = (0..c.kv_len).map(|j| (j < c.kv_len - c.padded_keys) as u32).collect();
    let scale = 1.0 / (c.head_dim as f64).sqrt();
    let shape = r::AttentionShape {
        q_len: c.q_len,
        kv_len: c.kv_len,
        q_heads: c.q_heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        scale: scale as f32 as f64,
        causal: c.causal,
    };
    let mut want = vec![0.0; q.len()];
    let mut scratch = vec![0.0; c.kv_len];
    let mask = (c.padded_keys > 0).then_some(keep.as_slice());
    r::attention(&q, &k, &v, mask, shape, &mut scratch, &mut want);
    let (qb, kb, vb, mb) = (gpu.upload_f32("q", &q), gpu.upload_f32("k", &k), gpu.upload_f32("v", &v), gpu.upload_u32("keep", &keep));
    let ob = poisoned(gpu, q.len());
    let s = Attention {
        q_len: c.q_len as u64,
        kv_len: c.kv_len as u64,
        q_heads: c.q_heads as u64,
        kv_heads: c.kv_heads as u64,
        head_dim: c.head_dim as u64,
        scale: scale as f32,
        causal: c.causal,
    };
    let got = run_and_read(gpu, &ob, q.len(), |enc| {
        let qw = (c.q_heads * c.head_dim) as u64;
        let kw = (c.kv_heads * c.head_dim) as u64;
        ops::attention(gpu, enc, Mat::new(&qb, qw), Mat::new(&kb, kw), Mat::new(&vb, kw), mask.map(|_| &*mb), Mat::new(&ob, qw), None, s)
    });
    assert_close(
        &format!("attention {}x{} heads {}/{} d {} causal={}", c.q_len, c.kv_len, c.q_heads, c.kv_heads, c.head_dim, c.causal),
        &got,
        &want,
        F32_TOL,
    );
}

#[test]
fn attention_joint_non_causal() {
    check_attention(gpu(), AttnCase { q_len: 45, kv_len: 45, q_heads: 3, kv_heads: 3, head_dim: 24, causal: false, padded_keys: 0 }, 12);
}

#[test]
fn attention_causal_grouped_query_with_padding_mask() {
    // Qwen3's shape ratio (4 query heads per kv head), right padding.
    check_attention(gpu(), AttnCase { q_len: 37, kv_len: 37, q_heads: 8, kv_heads: 2, head_dim: 16, causal: true, padded_keys: 9 }, 13);
}

#[test]
fn attention_head_dims_across_the_staged_chunks() {
    // Scores stage q and k 64 dims at a time, as vec4s: 128 (the models') is
    // two whole chunks, 100 ends mid-chunk; 70 queries end mid-workgroup.
    check_attention(gpu(), AttnCase { q_len: 70, kv_len: 70, q_heads: 2, kv_heads: 2, head_dim: 128, causal: false, padded_keys: 0 }, 16);
    check_attention(gpu(), AttnCase { q_len: 33, kv_len: 33, q_heads: 4, kv_heads: 2, head_dim: 100, causal: true, padded_keys: 3 }, 17);
    // 18 dims end inside a staged vec4.
    check_attention(gpu(), AttnCase { q_len: 21, kv_len: 21, q_heads: 3, kv_heads: 3, head_dim: 18, causal: false, padded_keys: 0 }, 18);
}

#[test]
fn attention_single_head_wide_like_the_vae_mid_block() {
    check_attention(gpu(), AttnCase { q_len: 50, kv_len: 50, q_heads: 1, kv_heads: 1, head_dim: 512, causal: false, padded_keys: 0 }, 14);
}

#[test]
fn attention_splits_queries_and_keeps_causality() {
    // 8 KiB bindings: each query window holds a few rows; causal positions must carry over.
    let gpu = small_binding_gpu(8 << 10);
    check_attention(&gpu, AttnCase { q_len: 60, kv_len: 60, q_heads: 2, kv_heads: 1, head_dim: 8, causal: true, padded_keys: 5 }, 15);
}

/// Attention over two key chunks, each with its log-sum-exp, merged on the
/// host: equals attention over all keys; each chunk's log-sum-exp equals f64.
#[test]
fn attention_over_key_chunks_merges_by_log_sum_exp() {
    use flux_lite_platform::vae_bands::AttentionMerge;
    let gpu = gpu();
    let (q_len, kv_len, heads, d) = (21usize, 40usize, 2usize, 24usize);
    let mut rng = Rng::new(71);
    let (q, k, v) = (rng.normals(q_len * heads * d, 1.0), rng.normals(kv_len * heads * d, 1.0), rng.normals(kv_len * heads * d, 1.0));
    let scale = (1.0 / (d as f64).sqrt()) as f32;
    let shape = |kv: usize| r::AttentionShape { q_len, kv_len: kv, q_heads: heads, kv_heads: heads, head_dim: d, scale: scale as f64, causal: false };
    let mut want = vec![0.0; q.len()];
    r::attention(&q, &k, &v, None, shape(kv_len), &mut vec![0.0; kv_len], &mut want);
    let width = heads * d;
    let mut merge = AttentionMerge::new(q_len as u64, heads as u64, d as u64);
    let qb = gpu.upload_f32("q", &q);
    for (k0, k1) in [(0usize, 17usize), (17, 40)] {
        let (kb, vb) = (gpu.upload_f32("k", &k[k0 * width..k1 * width]), gpu.upload_f32("v", &v[k0 * width..k1 * width]));
        let (ob, lb) = (poisoned(gpu, q.len()), poisoned(gpu, q_len * heads));
        let s = Attention { q_len: q_len as u64, kv_len: (k1 - k0) as u64, q_heads: heads as u64, kv_heads: heads as u64, head_dim: d as u64, scale, causal: false };
        let w = width as u64;
        let lse = run_and_read(gpu, &lb, q_len * heads, |enc| {
            ops::attention(gpu, enc, Mat::new(&qb, w), Mat::new(&kb, w), Mat::new(&vb, w), None, Mat::new(&ob, w), Some(Mat::new(&lb, heads as u64)), s)
        });
        let out = run_and_read(gpu, &ob, q.len(), |_| Ok(()));
        let want_lse: Vec<f64> = (0..q_len * heads)
            .map(|i| {
                let (row, h) = (i / heads, i % heads);
                let qr = &q[(row * heads + h) * d..][..d];
                let scores: Vec<f64> = (k0..k1)
                    .map(|j| qr.iter().zip(&k[(j * heads + h) * d..][..d]).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale as f64)
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                m + scores.iter().map(|s| (s - m).exp()).sum::<f64>().ln()
            })
            .collect();
        assert_close(&format!("attention log-sum-exp keys {k0}..{k1}"), &lse, &want_lse, F32_TOL);
        merge.add(&out, &lse);
    }
    assert_close("attention merged over key chunks", &merge.finish(), &want, F32_TOL);
}

fn check_elementwise(op: Elementwise, seed: u64) {
    let gpu = gpu();
    let (rows, cols) = (13usize, 77usize);
    let mut rng = Rng::new(seed);
    // a is columns [4, 4+cols) of a wider buffer; b a plain [rows, cols]; gate one row.
    let a_wide = rng.normals(rows * (cols + 9), 2.0);
    let a: Vec<f32> = (0..rows).flat_map(|i| a_wide[i * (cols + 9) + 4..i * (cols + 9) + 4 + cols].to_vec()).collect();
    let b = rng.normals(rows * cols, 2.0);
    let gate = rng.normals(cols, 1.0);
    let dst0 = rng.normals(rows * cols, 1.0);
    let want: Vec<f64> = (0..rows * cols)
        .map(|i| {
            let (x, y, d) = (a[i] as f64, b[i] as f64, dst0[i] as f64);
            match op {
                Elementwise::Silu => r::silu(x),
                Elementwise::SwiGlu => r::silu(x) * y,
                Elementwise::GatedResidual => d + gate[i % cols] as f64 * x,
                Elementwise::Add => x + y,
                Elementwise::AddInPlace => d + x,
                Elementwise::Scale(s) => x * s as f64,
                Elementwise::Axpy(s) => d + (x as f32 * s) as f64,
                Elementwise::Copy => x,
            }
        })
        .collect();
    let ab = gpu.upload_f32("a", &a_wide);
    let bb = gpu.upload_f32("b", if op == Elementwise::GatedResidual { &gate } else { &b });
    let reads_dst = matches!(op, Elementwise::GatedResidual | Elementwise::AddInPlace | Elementwise::Axpy(_));
    let db = if reads_dst { gpu.upload_f32("dst", &dst0) } else { poisoned(gpu, rows * cols) };
    let second = match op {
        Elementwise::SwiGlu | Elementwise::Add => Some(Mat::new(&bb, cols as u64)),
        Elementwise::GatedResidual => Some(Mat { buf: &bb, offset: 0, stride: 0 }),
        _ => None,
    };
    let got = run_and_read(gpu, &db, rows * cols, |enc| {
        let a = Mat { buf: &ab, offset: 4, stride: (cols + 9) as u64 };
        ops::elementwise(gpu, enc, op, a, second, Mat::new(&db, cols as u64), rows as u64, cols as u64)
    });
    assert_close(&format!("{op:?}"), &got, &want, F32_TOL);
}

#[test]
fn elementwise_ops() {
    for (i, op) in [
        Elementwise::Silu,
        Elementwise::SwiGlu,
        Elementwise::GatedResidual,
        Elementwise::Add,
        Elementwise::AddInPlace,
        Elementwise::Scale(-0.37),
        Elementwise::Axpy(-0.0625),
        Elementwise::Copy,
    ]
    .into_iter()
    .enumerate()
    {
        check_elementwise(op, 20 + i as u64);
    }
}

#[test]
fn concatenate_and_split_along_features() {
    // [txt ; img] joint attention inputs become one [rows, 2·cols] tensor and back.
    let gpu = gpu();
    let (rows, c1, c2) = (9usize, 21usize, 34usize);
    let mut rng = Rng::new(30);
    let (p1, p2) = (rng.normals(rows * c1, 1.0), rng.normals(rows * c2, 1.0));
    let (b1, b2) = (gpu.upload_f32("p1", &p1), gpu.upload_f32("p2", &p2));
    let cat = poisoned(gpu, rows * (c1 + c2));
    let w = (c1 + c2) as u64;
    let got = run_and_read(gpu, &cat, rows * (c1 + c2), |enc| {
        ops::elementwise(gpu, enc, Elementwise::Copy, Mat::new(&b1, c1 as u64), None, Mat::new(&cat, w), rows as u64, c1 as u64)?;
        ops::elementwise(gpu, enc, Elementwise::Copy, Mat::new(&b2, c2 as u64), None, Mat::new(&cat, w).cols_from(c1 as u64), rows as u64, c2 as u64)
    });
    let want: Vec<f64> = (0..rows).flat_map(|i| p1[i * c1..(i + 1) * c1].iter().chain(&p2[i * c2..(i + 1) * c2]).map(|&v| v as f64).collect::<Vec<_>>()).collect();
    assert_close("concat", &got, &want, 0.0);
    let back = poisoned(gpu, rows * c2);
    let split = run_and_read(gpu, &back, rows * c2, |enc| {
        ops::elementwise(gpu, enc, Elementwise::Copy, Mat::new(&cat, w).cols_from(c1 as u64), None, Mat::new(&back, c2 as u64), rows as u64, c2 as u64)
    });
    assert_eq!(split, p2);
}

#[test]
fn elementwise_splits_rows_under_a_small_binding() {
    let gpu = small_binding_gpu(4 << 10);
    let (rows, cols) = (300usize, 50usize); // 60 KB per operand
    let mut rng = Rng::new(31);
    let (a, b) = (rng.normals(rows * cols, 1.0), rng.normals(rows * cols, 1.0));
    let want: Vec<f64> = a.iter().zip(&b).map(|(&x, &y)| r::silu(x as f64) * y as f64).collect();
    let (ab, bb, db) = (gpu.upload_f32("a", &a), gpu.upload_f32("b", &b), poisoned(&gpu, rows * cols));
    let got = run_and_read(&gpu, &db, rows * cols, |enc| {
        let m = |buf| Mat::new(buf, cols as u64);
        ops::elementwise(&gpu, enc, Elementwise::SwiGlu, m(&ab), Some(m(&bb)), m(&db), rows as u64, cols as u64)
    });
    assert_close("split swiglu", &got, &want, F32_TOL);
}

#[test]
fn transpose_between_channels_and_tokens() {
    let gpu = gpu();
    let (rows, cols) = (23usize, 37usize);
    let a = Rng::new(32).normals(rows * cols, 1.0);
    let want: Vec<f64> = (0..cols).flat_map(|c| (0..rows).map(move |r| (r, c))).map(|(r, c)| a[r * cols + c] as f64).collect();
    let (ab, db) = (gpu.upload_f32("a", &a), poisoned(gpu, rows * cols));
    let got = run_and_read(gpu, &db, rows * cols, |enc| {
        ops::transpose(gpu, enc, Mat::new(&ab, cols as u64), Mat::new(&db, rows as u64), rows as u64, cols as u64)
    });
    assert_close("transpose", &got, &want, 0.0);
}

fn check_conv(s: ConvShape, seed: u64) {
    let gpu = gpu();
    let mut rng = Rng::new(seed);
    let x = rng.normals(s.in_channels * s.height * s.width, 1.0);
    let w = rng.bf16s(s.out_channels * s.in_channels * s.kernel * s.kernel, 0.3);
    let b = rng.bf16s(s.out_channels, 1.0);
    let n_out = s.out_channels * s.out_height * s.out_width;
    let mut want = vec![0.0; n_out];
    r::conv2d(&x, Weights::Bf16(&w), Weights::Bf16(&b), s, &mut want);
    let (xb, wb, bb, yb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b), poisoned(gpu, n_out));
    let got = run_and_read(gpu, &yb, n_out, |enc| {
        ops::conv2d(gpu, enc, Mat::new(&xb, 0), Weight::bf16(&wb), Weight::bf16(&bb), Mat::new(&yb, 0), s)
    });
    assert_close(&format!("conv {s:?}"), &got, &want, F32_TOL);
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

#[test]
fn conv1x1() {
    check_conv(ConvShape::same(6, 11, 7, 5, 1), 41);
}

#[test]
fn conv3x3_stride2_with_asymmetric_padding() {
    // The VAE encoder's downsampler: pad (0, 1, 0, 1), then a stride-2 3×3 convolution.
    let (h, w) = (9usize, 8usize);
    let s = ConvShape {
        in_channels: 4,
        out_channels: 3,
        height: h,
        width: w,
        kernel: 3,
        stride: 2,
        pad_top: 0,
        pad_left: 0,
        out_height: (h + 1 - 3) / 2 + 1,
        out_width: (w + 1 - 3) / 2 + 1,
    };
    check_conv(s, 42);
}

#[test]
fn upsample_nearest() {
    let gpu = gpu();
    let (c, h, w) = (3usize, 5usize, 7usize);
    let x = Rng::new(43).normals(c * h * w, 1.0);
    let mut want = vec![0.0; 4 * x.len()];
    r::upsample_nearest2x(&x, c, h, w, &mut want);
    let (xb, yb) = (gpu.upload_f32("x", &x), poisoned(gpu, 4 * x.len()));
    let got = run_and_read(gpu, &yb, 4 * x.len(), |enc| {
        ops::upsample_nearest2x(gpu, enc, Mat::new(&xb, 0), Mat::new(&yb, 0), c as u64, h as u64, w as u64)
    });
    assert_close("upsample", &got, &want, 0.0);
}

#[test]
fn vae_mid_block_attention_through_the_attention_kernel() {
    // GroupNorm → tokens → q, k, v (with bias) → single-head attention → out proj → channels → residual.
    let gpu = gpu();
    let (c, hh, ww, groups) = (32usize, 5usize, 7usize, 8usize);
    let p = hh * ww;
    let mut rng = Rng::new(44);
    let x = rng.normals(c * p, 1.0);
    let (gamma, beta) = (rng.bf16s(c, 1.0), rng.bf16s(c, 0.5));
    let lin: Vec<(Vec<u16>, Vec<u16>)> = (0..4).map(|_| (rng.bf16s(c * c, 0.2), rng.bf16s(c, 0.2))).collect();

    // Reference, step by step in f64 (rounded to f32 between steps as the GPU stores them).
    let to32 = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    let mut gn = vec![0.0; c * p];
    r::group_norm(&x, Weights::Bf16(&gamma), Weights::Bf16(&beta), c, p, groups, 1e-6, false, &mut gn);
    let gn32 = to32(&gn);
    let tokens: Vec<f32> = (0..p).flat_map(|i| (0..c).map(move |ch| (i, ch))).map(|(i, ch)| gn32[ch * p + i]).collect();
    let proj = |idx: usize, input: &[f32]| {
        let mut out = vec![0.0; p * c];
        r::linear(input, Weights::Bf16(&lin[idx].0), Some(Weights::Bf16(&lin[idx].1)), p, c, c, &mut out);
        to32(&out)
    };
    let (q, k, v) = (proj(0, &tokens), proj(1, &tokens), proj(2, &tokens));
    let scale = 1.0 / (c as f32).sqrt();
    let shape = r::AttentionShape { q_len: p, kv_len: p, q_heads: 1, kv_heads: 1, head_dim: c, scale: scale as f64, causal: false };
    let mut att = vec![0.0; p * c];
    r::attention(&q, &k, &v, None, shape, &mut vec![0.0; p], &mut att);
    let out = proj(3, &to32(&att));
    let want: Vec<f64> = (0..c).flat_map(|ch| (0..p).map(move |i| (ch, i))).map(|(ch, i)| x[ch * p + i] as f64 + out[i * c + ch] as f64).collect();

    let xb = gpu.upload_f32("x", &x);
    let (gb, bb) = (gpu.upload_bf16("gamma", &gamma), gpu.upload_bf16("beta", &beta));
    let lb: Vec<(flux_lite_platform::DeviceBuffer, flux_lite_platform::DeviceBuffer)> = lin.iter().map(|(w, b)| (gpu.upload_bf16("w", w), gpu.upload_bf16("b", b))).collect();
    let bufs: Vec<flux_lite_platform::DeviceBuffer> = (0..7).map(|_| poisoned(gpu, c * p)).collect();
    let [gnb, tok, qb, kb, vb, ab, ob] = [0, 1, 2, 3, 4, 5, 6].map(|i| &bufs[i]);
    let result = poisoned(gpu, c * p);
    let got = run_and_read(gpu, &xb, c * p, |enc| {
        let (cu, pu) = (c as u64, p as u64);
        ops::group_norm(gpu, enc, Mat::new(&xb, 0), Weight::bf16(&gb), Weight::bf16(&bb), Mat::new(gnb, 0), ops::Groups { channels: cu, pixels: pu, groups: groups as u64 }, 1e-6, false)?;
        ops::transpose(gpu, enc, Mat::new(gnb, pu), Mat::new(tok, cu), cu, pu)?;
        for (i, dst) in [qb, kb, vb].into_iter().enumerate() {
            ops::linear(gpu, enc, Mat::new(tok, cu), Weight::bf16(&lb[i].0), Some(Weight::bf16(&lb[i].1)), Mat::new(dst, cu), pu, cu, cu)?;
        }
        let s = Attention { q_len: pu, kv_len: pu, q_heads: 1, kv_heads: 1, head_dim: cu, scale, causal: false };
        ops::attention(gpu, enc, Mat::new(qb, cu), Mat::new(kb, cu), Mat::new(vb, cu), None, Mat::new(ab, cu), None, s)?;
        ops::linear(gpu, enc, Mat::new(ab, cu), Weight::bf16(&lb[3].0), Some(Weight::bf16(&lb[3].1)), Mat::new(ob, cu), pu, cu, cu)?;
        ops::transpose(gpu, enc, Mat::new(ob, cu), Mat::new(&result, pu), pu, cu)?;
        ops::elementwise(gpu, enc, Elementwise::AddInPlace, Mat::new(&result, pu), None, Mat::new(&xb, pu), cu, pu)
    });
    assert_close("vae mid attention", &got, &want, F32_TOL);
}

/// `fma_peak`'s sum for invocation `i` after `steps` FMAs per chain, in f64
/// from the kernel's f32 starting values.
fn fma_peak_reference(i: u32, steps: u32) -> f64 {
    let s = (i & 1023) as f32 * 1e-3;
    let base = [s, s + 0.01, s + 0.02, s + 0.03];
    let m = [0.999f32, 0.998, 0.997, 0.996];
    let mut total = 0.0;
    for chain in 0..8 {
        for lane in 0..4 {
            let mut a = (base[lane] + [0.0f32, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7][chain]) as f64;
            for _ in 0..steps {
                a = a * m[lane] as f64 + 1e-3f32 as f64;
            }
            total += a;
        }
    }
    total
}

#[test]
fn fma_peak_computes_its_chains() {
    // The ceiling kernel's work must be real: every invocation's chains, 4 unrolled FMAs an iteration.
    let gpu = gpu();
    let (workgroups, iterations) = (5u64, 7u32);
    let count = (256 * workgroups) as usize;
    let sink = poisoned(gpu, count);
    let got = run_and_read(gpu, &sink, count, |enc| ops::fma_peak(gpu, enc, &sink, workgroups, iterations));
    let want: Vec<f64> = (0..count as u32).map(|i| fma_peak_reference(i, 4 * iterations)).collect();
    assert_close("fma_peak", &got, &want, F32_TOL);
}

#[test]
fn copy_peak_copies_every_vec4() {
    let gpu = gpu();
    let vec4s = 1000u64;
    let src: Vec<f32> = Rng::new(44).normals(4 * vec4s as usize, 1.0);
    let (sb, db) = (gpu.upload_f32("src", &src), poisoned(gpu, 4 * vec4s as usize + 4));
    let got = run_and_read(gpu, &db, 4 * vec4s as usize + 4, |enc| ops::copy_peak(gpu, enc, &sb, &db, vec4s));
    assert!(got[..src.len()].iter().zip(&src).all(|(g, s)| g.to_bits() == s.to_bits()), "copy_peak changed a value");
    assert!(got[src.len()..].iter().all(|v| v.is_nan()), "copy_peak wrote past its count");
}
