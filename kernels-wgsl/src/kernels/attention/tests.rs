//! Tests of `attention.rs`.

use super::*;
use crate::testing::*;
use crate::kernels::elementwise::{elementwise, transpose, Elementwise};
use crate::kernels::half_pack::half_pack;
use crate::kernels::linear::{linear, Gemm};
use crate::kernels::group_norm::{group_norm, GroupAffine, GroupShape, GroupStats};
use crate::view::{HeadRows, Weight};
use flux_lite_core::oracle::{self as r, Weights};

struct AttnCase {
    q_len: usize,
    kv_len: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    causal: bool,
    padded_keys: usize,
}

/// `check` on lavapipe's CPU-shaped attention and on the GPU-shaped one.
fn both_shapes(check: impl Fn(&Gpu)) {
    each_kernel_shape(gpu(), crate::testing::options(), check);
}

fn check_attention(gpu: &Gpu, c: AttnCase, seed: u64) {
    check_attention_within(gpu, c, seed, [1.0; 3], F32_TOL);
}

/// [`check_attention`] with q, k and v scaled by `scales` (random normals
/// otherwise), within relative L2 `tol` of the f64 oracle.
fn check_attention_within(gpu: &Gpu, c: AttnCase, seed: u64, scales: [f32; 3], tol: f64) {
    let mut rng = Rng::new(seed);
    let q = rng.normals(c.q_len * c.q_heads * c.head_dim, scales[0]);
    let k = rng.normals(c.kv_len * c.kv_heads * c.head_dim, scales[1]);
    let v = rng.normals(c.kv_len * c.kv_heads * c.head_dim, scales[2]);
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
    let s = Attention::from(shape);
    let got = run_and_read(gpu, &ob, q.len(), |enc| {
        let qw = (c.q_heads * c.head_dim) as u64;
        let kw = (c.kv_heads * c.head_dim) as u64;
        let qkv = Qkv { q: Mat::new(&qb, qw), k: Mat::new(&kb, kw), v: Mat::new(&vb, kw) };
        match FALLBACK.get() {
            true => attention_with(gpu, enc, AttentionKernel::Matrix(gpu.matrix().unwrap()), qkv, Inputs::F32, None, mask.map(|_| &*mb), Out::F32(Mat::new(&ob, qw)), None, s),
            false => attention(gpu, enc, qkv, mask.map(|_| &*mb), Mat::new(&ob, qw), s),
        }
    });
    let shape = if gpu.cpu_shaped_kernels() { "CPU-shaped" } else { "GPU-shaped" };
    let what = format!("{} {shape} attention {}x{} heads {}/{} d {} causal={} scales {scales:?}", gpu.precision().name(), c.q_len, c.kv_len, c.q_heads, c.kv_heads, c.head_dim, c.causal);
    assert!(got.iter().all(|v| v.is_finite()), "{what}: Inf or NaN");
    if tol > F32_TOL {
        println!("{what}: relative L2 {:.2e}", rel_l2(&got, &want));
    }
    assert_close(&what, &got, &want, tol);
}

/// The matrix tier's attention against the exact f64 attention (why and
/// what was measured: [`crate::selftest::MATRIX_ATTENTION`]).
const MATRIX_ATTENTION_TOL: f64 = crate::selftest::MATRIX_ATTENTION;

#[test]
fn attention_on_matrix_units_matches_the_oracle() {
    let Some(gpu) = matrix_gpu() else { return };
    let tol = MATRIX_ATTENTION_TOL;
    let one = [1.0; 3];
    check_attention_within(&gpu, AttnCase { q_len: 45, kv_len: 45, q_heads: 3, kv_heads: 3, head_dim: 24, causal: false, padded_keys: 0 }, 12, one, tol);
    check_attention_within(&gpu, AttnCase { q_len: 37, kv_len: 37, q_heads: 8, kv_heads: 2, head_dim: 16, causal: true, padded_keys: 9 }, 13, one, tol);
    check_attention_within(&gpu, AttnCase { q_len: 70, kv_len: 70, q_heads: 2, kv_heads: 2, head_dim: 128, causal: false, padded_keys: 0 }, 16, one, tol);
    check_attention_within(&gpu, AttnCase { q_len: 33, kv_len: 33, q_heads: 4, kv_heads: 2, head_dim: 100, causal: true, padded_keys: 3 }, 17, one, tol);
    check_attention_within(&gpu, AttnCase { q_len: 21, kv_len: 21, q_heads: 3, kv_heads: 3, head_dim: 18, causal: false, padded_keys: 0 }, 18, one, tol);
    // Wider heads than the matrix kernel takes run the f32 one, exactly as on the f32 tier.
    check_attention_within(&gpu, AttnCase { q_len: 50, kv_len: 50, q_heads: 1, kv_heads: 1, head_dim: 512, causal: false, padded_keys: 0 }, 14, one, F32_TOL);
}

#[test]
fn attention_on_matrix_units_keeps_values_beyond_f16_finite_and_close() {
    // The range rule: queries of 1e-6 (scores near zero, near-uniform
    // weights), keys of 1e3 with queries of 1e-3, values of 1e5: f32 is
    // finite, and so is the matrix tier, as close as for ordinary values.
    let Some(gpu) = matrix_gpu() else { return };
    let case = || AttnCase { q_len: 19, kv_len: 23, q_heads: 2, kv_heads: 2, head_dim: 32, causal: false, padded_keys: 2 };
    for (seed, scales) in [(61, [1e-6, 1.0, 1.0]), (62, [1e-3, 1e3, 1.0]), (63, [1.0, 1.0, 1e5]), (64, [1.0, 1.0, 1e-6])] {
        check_attention_within(&gpu, case(), seed, scales, MATRIX_ATTENTION_TOL);
    }
}

std::thread_local! {
    /// Set by the fallback's test: `check_attention_within` then runs `attention_matrix.wgsl`.
    static FALLBACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// On f16 tiles the matrix tier's attention is the flash kernel (its
/// start-up check passed on this adapter): the cases above ran it. Here
/// the fallback, `attention_matrix.wgsl`, on the same cases and bound, and
/// queries split by small bindings.
#[test]
fn the_matrix_tiers_fallback_attention_matches_the_oracle() {
    let Some(gpu) = matrix_gpu() else { return };
    let f16 = gpu.matrix().unwrap().operands == MatrixOperands::F16;
    assert_eq!(gpu.flash_attention(), crate::FlashPaths { rows: f16, pieces: f16 }, "{:?}", gpu.notice());
    FALLBACK.set(true);
    let (tol, one) = (MATRIX_ATTENTION_TOL, [1.0; 3]);
    check_attention_within(&gpu, AttnCase { q_len: 45, kv_len: 45, q_heads: 3, kv_heads: 3, head_dim: 24, causal: false, padded_keys: 0 }, 12, one, tol);
    check_attention_within(&gpu, AttnCase { q_len: 37, kv_len: 37, q_heads: 8, kv_heads: 2, head_dim: 16, causal: true, padded_keys: 9 }, 13, one, tol);
    check_attention_within(&gpu, AttnCase { q_len: 70, kv_len: 70, q_heads: 2, kv_heads: 2, head_dim: 128, causal: false, padded_keys: 0 }, 16, one, tol);
    check_attention_within(&gpu, AttnCase { q_len: 33, kv_len: 33, q_heads: 4, kv_heads: 2, head_dim: 100, causal: true, padded_keys: 3 }, 17, one, tol);
    check_attention_within(&gpu, AttnCase { q_len: 21, kv_len: 90, q_heads: 3, kv_heads: 3, head_dim: 18, causal: false, padded_keys: 0 }, 18, one, tol);
    let extremes = || AttnCase { q_len: 19, kv_len: 23, q_heads: 2, kv_heads: 2, head_dim: 32, causal: false, padded_keys: 2 };
    for (seed, scales) in [(61, [1e-6, 1.0, 1.0]), (62, [1e-3, 1e3, 1.0]), (63, [1.0, 1.0, 1e5]), (64, [1.0, 1.0, 1e-6])] {
        check_attention_within(&gpu, extremes(), seed, scales, tol);
    }
    let small = tier_gpu_with(crate::GpuOptions { precision: crate::Precision::Matrix, max_storage_binding: Some(8 << 10), ..crate::testing::options() }).unwrap();
    check_attention_within(&small, AttnCase { q_len: 60, kv_len: 60, q_heads: 2, kv_heads: 1, head_dim: 8, causal: true, padded_keys: 5 }, 15, one, tol);
    FALLBACK.set(false);
}

#[test]
fn attention_on_matrix_units_splits_queries_and_keeps_causality() {
    let Some(gpu) = tier_gpu_with(crate::GpuOptions { precision: crate::Precision::Matrix, max_storage_binding: Some(8 << 10), ..crate::testing::options() }) else { return };
    check_attention_within(&gpu, AttnCase { q_len: 60, kv_len: 60, q_heads: 2, kv_heads: 1, head_dim: 8, causal: true, padded_keys: 5 }, 15, [1.0; 3], MATRIX_ATTENTION_TOL);
}

#[test]
fn attention_joint_non_causal() {
    both_shapes(|g| check_attention(g, AttnCase { q_len: 45, kv_len: 45, q_heads: 3, kv_heads: 3, head_dim: 24, causal: false, padded_keys: 0 }, 12));
}

#[test]
fn attention_causal_grouped_query_with_padding_mask() {
    // Qwen3's shape ratio (4 query heads per kv head), right padding.
    both_shapes(|g| check_attention(g, AttnCase { q_len: 37, kv_len: 37, q_heads: 8, kv_heads: 2, head_dim: 16, causal: true, padded_keys: 9 }, 13));
}

#[test]
fn attention_head_dims_across_the_staged_chunks() {
    // Scores stage q and k 64 dims at a time, as vec4s: 128 (the models') is
    // two whole chunks, 100 ends mid-chunk; 70 queries end mid-workgroup.
    both_shapes(|g| check_attention(g, AttnCase { q_len: 70, kv_len: 70, q_heads: 2, kv_heads: 2, head_dim: 128, causal: false, padded_keys: 0 }, 16));
    both_shapes(|g| check_attention(g, AttnCase { q_len: 33, kv_len: 33, q_heads: 4, kv_heads: 2, head_dim: 100, causal: true, padded_keys: 3 }, 17));
    // 18 dims end inside a staged vec4.
    both_shapes(|g| check_attention(g, AttnCase { q_len: 21, kv_len: 21, q_heads: 3, kv_heads: 3, head_dim: 18, causal: false, padded_keys: 0 }, 18));
}

#[test]
fn attention_with_scores_spread_over_hundreds() {
    // Keys scaled by 40: scores spread over hundreds of units, so the
    // CPU kernels' running maximum is raised many times (the output
    // rows rescaled each time), and early keys' weights underflow.
    for (seed, head_dim, causal) in [(91, 16, false), (92, 64, true), (93, 256, false)] {
        let case = || AttnCase { q_len: 67, kv_len: 67, q_heads: 2, kv_heads: 2, head_dim, causal, padded_keys: 5 };
        both_shapes(|g| check_attention_within(g, case(), seed, [1.0, 40.0, 1.0], F32_TOL));
    }
}

#[test]
fn attention_single_head_wide_like_the_vae_mid_block() {
    both_shapes(|g| check_attention(g, AttnCase { q_len: 50, kv_len: 50, q_heads: 1, kv_heads: 1, head_dim: 512, causal: false, padded_keys: 0 }, 14));
}

#[test]
fn attention_wide_heads_over_every_query_of_a_workgroup() {
    // 512-wide heads (the VAE mid-block's) with 300 queries: all four of
    // the CPU kernel's queries an invocation live (256 a workgroup), and a
    // second workgroup; causal, grouped, padded keys.
    both_shapes(|g| check_attention(g, AttnCase { q_len: 300, kv_len: 300, q_heads: 2, kv_heads: 1, head_dim: 512, causal: true, padded_keys: 7 }, 19));
}

#[test]
fn attention_splits_queries_and_keeps_causality() {
    // 8 KiB bindings: each query window holds a few rows; causal positions must carry over.
    let small = crate::GpuOptions { max_storage_binding: Some(8 << 10), ..crate::testing::options() };
    each_kernel_shape(&small_binding_gpu(8 << 10), small, |g| {
        check_attention(g, AttnCase { q_len: 60, kv_len: 60, q_heads: 2, kv_heads: 1, head_dim: 8, causal: true, padded_keys: 5 }, 15)
    });
}

/// Attention carried over three chunks of the keys equals f64 attention over all of them.
#[test]
fn attention_carried_over_key_chunks_matches_the_reference() {
    held_within("attention over key chunks", crate::selftest::check_attention_key_chunks(gpu(), 2, 24), F32_TOL);
    held_within("attention over key chunks, a 512-wide head", crate::selftest::check_attention_key_chunks(gpu(), 1, 512), F32_TOL);
}

/// The carried attention over chunks of the keys, for bands of queries,
/// gives the bits of one call over every query and key: what makes the
/// banded VAE's mid-block attention its whole decode's.
#[test]
fn attention_carried_over_key_chunks_and_query_bands_equals_one_call_bit_for_bit() {
    carried_bands_equal_one_call(gpu(), 40);
}

/// On the matrix tier's units, for FLUX's head widths and the VAE's 512,
/// against f64 attention and bit for bit by bands.
#[test]
fn the_matrix_tiers_carried_attention_matches_the_reference_and_equals_one_call_by_bands() {
    let Some(gpu) = matrix_gpu() else { return };
    for (heads, d) in [(2, 24), (1, 512)] {
        let got = crate::selftest::check_attention_key_chunks(&gpu, heads, d).unwrap_or_else(|e| panic!("{e}"));
        println!("carried attention, {heads} heads × {d}: relative L2 {got:.2e}");
        assert!(got <= crate::selftest::MATRIX_ATTENTION, "{heads} × {d}: {got:e}");
    }
    carried_bands_equal_one_call(&gpu, 40);
    carried_bands_equal_one_call(&gpu, 512);
}

/// The 512-wide head's matrix attention gives the same bits whole and split
/// over its output dims (each workgroup computing the same scores and
/// softmax): in halves (the adapter's own workgroup memory: lavapipe's 32
/// KiB with its 8×8 tiles, NVIDIA's 48 KiB with 16×16) and in quarters
/// (half of it asked for) one call gives the same bits; by chunks of keys
/// and bands of queries, whose middle chunks (which read and keep the
/// carried state) run the whole head in one workgroup, the bits of one
/// call; and within the bound against f64.
#[test]
fn the_wide_matrix_attention_gives_the_same_bits_whole_and_split_over_its_dims() {
    let (d, q_len, kv_len) = (512usize, 45usize, 70usize);
    let mut rng = Rng::new(73);
    let (q, k, v) = (rng.normals(q_len * d, 2.0), rng.normals(kv_len * d, 2.0), rng.normals(kv_len * d, 1.0));
    let call = Attention { q_len: q_len as u64, kv_len: kv_len as u64, q_heads: 1, kv_heads: 1, head_dim: d as u64, scale: 0.2, causal: false };
    let run = |gpu: &Gpu| {
        let (qb, kb, vb) = (gpu.upload_f32("q", &q), gpu.upload_f32("k", &k), gpu.upload_f32("v", &v));
        let out = poisoned(gpu, q_len * d);
        let m = |b| Mat::new(b, d as u64);
        gpu.submit(|enc| attention_carried(gpu, enc, Qkv { q: m(&qb), k: m(&kb), v: m(&vb) }, m(&out), None, call)).unwrap();
        gpu.read_f32(&out, 0, q_len * d).unwrap().iter().map(|f| f.to_bits()).collect::<Vec<_>>()
    };
    let mut first: Option<Vec<u32>> = None;
    let mut splits = Vec::new();
    let tier = |memory| tier_gpu_with(crate::GpuOptions { precision: crate::Precision::Matrix, max_workgroup_memory: memory, ..crate::testing::options() });
    let Some(adapters) = tier(None) else { return };
    let half_of_it = adapters.limits.max_compute_workgroup_storage_size / 2;
    drop(adapters);
    for memory in [None, Some(half_of_it)] {
        let Some(gpu) = tier(memory) else { return };
        let o_dims = matrix_attention_output_dims(gpu.matrix().unwrap(), 512, gpu.limits.max_compute_workgroup_storage_size, None);
        println!("{} bytes a workgroup: {o_dims} output dims a workgroup", gpu.limits.max_compute_workgroup_storage_size);
        splits.push(o_dims);
        let bits = run(&gpu);
        match &first {
            None => first = Some(bits),
            Some(first) => assert_eq!(&bits, first, "{o_dims} dims a workgroup against {}", splits[0]),
        }
        let got = crate::selftest::check_attention_key_chunks(&gpu, 1, d).unwrap_or_else(|e| panic!("{e}"));
        assert!(got <= crate::selftest::MATRIX_ATTENTION, "{o_dims} dims a workgroup: {got:e} against f64");
        carried_bands_equal_one_call(&gpu, d);
    }
    assert!(splits[1] < splits[0] && splits[0] < 512, "the test means to cover two splits: {splits:?}");
}

/// The carried attention of `d`-wide rows over chunks of keys and bands of
/// queries against one call over all of them, bit for bit.
fn carried_bands_equal_one_call(gpu: &Gpu, d: usize) {
    let (q_len, kv_len) = (45usize, 70usize);
    let mut rng = Rng::new(72);
    let (q, k, v) = (rng.normals(q_len * d, 2.0), rng.normals(kv_len * d, 2.0), rng.normals(kv_len * d, 1.0));
    let (qb, kb, vb) = (gpu.upload_f32("q", &q), gpu.upload_f32("k", &k), gpu.upload_f32("v", &v));
    let w = d as u64;
    let call = |q_rows: (usize, usize), keys: (usize, usize)| Attention { q_len: (q_rows.1 - q_rows.0) as u64, kv_len: (keys.1 - keys.0) as u64, q_heads: 1, kv_heads: 1, head_dim: w, scale: 0.2, causal: false };
    fn rows_of(b: &crate::DeviceBuffer, r0: usize, d: usize) -> Mat<'_> {
        Mat { buf: b, offset: (r0 * d) as u64, stride: d as u64 }
    }
    let whole = poisoned(gpu, q_len * d);
    gpu.submit(|enc| attention_carried(gpu, enc, Qkv { q: rows_of(&qb, 0, d), k: rows_of(&kb, 0, d), v: rows_of(&vb, 0, d) }, rows_of(&whole, 0, d), None, call((0, q_len), (0, kv_len)))).unwrap();
    let (banded, state) = (poisoned(gpu, q_len * d), poisoned(gpu, 2 * q_len));
    let chunks = [(0usize, 32usize), (32, 48), (48, 70)];
    for (q0, q1) in [(0usize, 7usize), (7, 30), (30, 45)] {
        for (i, &(k0, k1)) in chunks.iter().enumerate() {
            let carry = Carry { state: Mat { buf: &state, offset: (2 * q0) as u64, stride: 2 }, from_state: i > 0, keep_state: i + 1 < chunks.len() };
            let qkv = Qkv { q: rows_of(&qb, q0, d), k: rows_of(&kb, k0, d), v: rows_of(&vb, k0, d) };
            gpu.submit(|enc| attention_carried(gpu, enc, qkv, rows_of(&banded, q0, d), Some(carry), call((q0, q1), (k0, k1)))).unwrap();
        }
    }
    let bits = |b: &crate::DeviceBuffer| gpu.read_f32(b, 0, q_len * d).unwrap().iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&banded), bits(&whole));
}

/// `x` (`rows` rows of `heads · head_dim`) through [`half_pack`] on
/// `gpu`: the f16 pairs' values times their row's scale, and the scales.
fn packed_on(gpu: &Gpu, x: &[f32], rows: usize, heads: usize, head_dim: usize) -> (Vec<f32>, Vec<f32>) {
    let width = heads * head_dim;
    let src = gpu.upload_f32("rows", x);
    let (dst, scales) = (poisoned(gpu, rows * width / 2), poisoned(gpu, rows * heads));
    gpu.submit(|enc| half_pack(gpu, enc, Mat::new(&src, width as u64), Mat::new(&dst, width as u64 / 2), Mat::new(&scales, heads as u64), HeadRows { tokens: rows as u64, heads: heads as u64, head_dim: head_dim as u64 })).unwrap();
    let words = gpu.read_f32(&dst, 0, rows * width / 2).unwrap();
    let scales = gpu.read_f32(&scales, 0, rows * heads).unwrap();
    let values = words
        .iter()
        .flat_map(|w| [w.to_bits() as u16, (w.to_bits() >> 16) as u16])
        .enumerate()
        .map(|(i, h)| half::f16::from_bits(h).to_f32() * scales[i / head_dim])
        .collect();
    (values, scales)
}

/// Each (row, head)'s scale is the power of two that brings its largest
/// magnitude into [2¹³, 2¹⁴) (1 for a zero row, at least 2⁻¹²⁶), and each
/// value is `x / scale` rounded to one of its two f16 neighbours: no
/// overflow for values past f16's range, f16's precision for tiny ones.
#[test]
fn half_pack_rounds_each_head_row_under_its_range_scale() {
    let gpu = gpu();
    let (rows, heads, hd) = (7usize, 3usize, 10usize);
    let mut rng = Rng::new(71);
    let magnitudes = [1.0f32, 1e5, 3e-7, 0.0, 1e30, 2.0e-38, 65504.0];
    let x: Vec<f32> = (0..rows * heads * hd).map(|i| rng.normals(1, 1.0)[0] * magnitudes[(i / hd) % magnitudes.len()]).collect();
    let (values, scales) = packed_on(gpu, &x, rows, heads, hd);
    for (r, row) in x.chunks(hd).enumerate() {
        let largest = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let want = if largest == 0.0 { 1.0 } else { 2f64.powi((largest.log2().floor() as i32 + 1 - 14).max(-126)) };
        assert_eq!(scales[r] as f64, want, "row {r}: scale for largest {largest:e}");
        for (i, &v) in row.iter().enumerate() {
            let t = v as f64 / want;
            let got = values[r * hd + i] as f64 / want;
            // f16's spacing at |t| (subnormal spacing below 2⁻¹⁴).
            let spacing = 2f64.powi((t.abs().log2().floor() as i32).max(-14) - 10);
            // A device may flush an f32 subnormal input to zero (WGSL allows it).
            let flushed = got == 0.0 && v.abs() < f32::MIN_POSITIVE;
            assert!((got - t).abs() < spacing || (t == 0.0 && got == 0.0) || flushed, "row {r}[{i}]: {v:e} packed as {got:e}·{want:e}");
        }
    }
}

/// Attention over half-K/V operands (packed on the device) equals the
/// f64 attention over the values the layout holds, on both kernel shapes;
/// against the exact keys and values it is within the half bound.
#[test]
fn attention_over_half_keys_and_values_matches_the_oracle() {
    let case = |gpu: &Gpu, (q_len, kv_len, q_heads, kv_heads, hd): (usize, usize, usize, usize, usize), seed: u64, scales: [f32; 3]| {
        let mut rng = Rng::new(seed);
        let q = rng.normals(q_len * q_heads * hd, scales[0]);
        let k = rng.normals(kv_len * kv_heads * hd, scales[1]);
        let v = rng.normals(kv_len * kv_heads * hd, scales[2]);
        let (k_held, _) = packed_on(gpu, &k, kv_len, kv_heads, hd);
        let (v_held, _) = packed_on(gpu, &v, kv_len, kv_heads, hd);
        let scale = (1.0 / (hd as f64).sqrt()) as f32;
        let shape = r::AttentionShape { q_len, kv_len, q_heads, kv_heads, head_dim: hd, scale: scale as f64, causal: false };
        let (mut want, mut exact) = (vec![0.0; q.len()], vec![0.0; q.len()]);
        r::attention(&q, &k_held, &v_held, None, shape, &mut vec![0.0; kv_len], &mut want);
        r::attention(&q, &k, &v, None, shape, &mut vec![0.0; kv_len], &mut exact);
        let kw = (kv_heads * hd) as u64;
        let (kb, vb) = (gpu.upload_f32("k", &k), gpu.upload_f32("v", &v));
        let (kh, vh, ks, vs) = (poisoned(gpu, k.len() / 2), poisoned(gpu, v.len() / 2), poisoned(gpu, kv_len * kv_heads), poisoned(gpu, kv_len * kv_heads));
        let qb = gpu.upload_f32("q", &q);
        let ob = poisoned(gpu, q.len());
        let s = Attention { q_len: q_len as u64, kv_len: kv_len as u64, q_heads: q_heads as u64, kv_heads: kv_heads as u64, head_dim: hd as u64, scale, causal: false };
        let kv_rows = HeadRows { tokens: kv_len as u64, heads: kv_heads as u64, head_dim: hd as u64 };
        let got = run_and_read(gpu, &ob, q.len(), |enc| {
            half_pack(gpu, enc, Mat::new(&kb, kw), Mat::new(&kh, kw / 2), Mat::new(&ks, kv_heads as u64), kv_rows)?;
            half_pack(gpu, enc, Mat::new(&vb, kw), Mat::new(&vh, kw / 2), Mat::new(&vs, kv_heads as u64), kv_rows)?;
            let qkv = Qkv { q: Mat::new(&qb, (q_heads * hd) as u64), k: Mat::new(&kh, kw / 2), v: Mat::new(&vh, kw / 2) };
            attention_half_kv(gpu, enc, qkv, HalfKvScales { k: Mat::new(&ks, kv_heads as u64), v: Mat::new(&vs, kv_heads as u64) }, Mat::new(&ob, (q_heads * hd) as u64), s)
        });
        let shaped = if gpu.cpu_shaped_kernels() { "CPU-shaped" } else { "GPU-shaped" };
        let what = format!("{shaped} half-K/V attention {q_len}x{kv_len} heads {q_heads}/{kv_heads} d {hd} scales {scales:?}");
        assert_close(&what, &got, &want, F32_TOL);
        println!("{what}: relative L2 {:.2e} from the exact keys and values", rel_l2(&got, &exact));
        assert_close(&format!("{what}, exact operands"), &got, &exact, HALF_KV_ATTENTION);
    };
    both_shapes(|g| {
        let one = [1.0; 3];
        case(g, (45, 45, 3, 3, 24), 81, one);
        case(g, (21, 90, 8, 2, 16), 82, one);
        case(g, (70, 33, 2, 2, 128), 83, one);
        // 18 dims: not a multiple of 4, the tiled kernel on every adapter.
        case(g, (21, 21, 3, 3, 18), 84, one);
        case(g, (30, 40, 1, 1, 512), 85, one);
        // Values past f16's range and tiny ones keep their precision.
        case(g, (19, 23, 2, 2, 32), 86, [1e-3, 1e3, 1e5]);
        case(g, (19, 23, 2, 2, 32), 87, [1.0, 1e-6, 1e-7]);
    });
    // Small bindings: the queries split into windows.
    let small = crate::GpuOptions { max_storage_binding: Some(8 << 10), ..crate::testing::options() };
    each_kernel_shape(&small_binding_gpu(8 << 10), small, |g| case(g, (60, 20, 2, 1, 8), 88, [1.0; 3]));
}

/// Half-K/V attention against the exact attention (why and what was measured there).
const HALF_KV_ATTENTION: f64 = flux_lite_core::tolerance::kernels::HALF_KV_ATTENTION;

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
    r::group_norm(&x, Weights::Bf16(&gamma), Weights::Bf16(&beta), [c, p, groups], 1e-6, false, &mut gn);
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
    let lb: Vec<(crate::DeviceBuffer, crate::DeviceBuffer)> = lin.iter().map(|(w, b)| (gpu.upload_bf16("w", w), gpu.upload_bf16("b", b))).collect();
    let bufs: Vec<crate::DeviceBuffer> = (0..7).map(|_| poisoned(gpu, c * p)).collect();
    let [gnb, tok, qb, kb, vb, ab, ob] = [0, 1, 2, 3, 4, 5, 6].map(|i| &bufs[i]);
    let result = poisoned(gpu, c * p);
    let got = run_and_read(gpu, &xb, c * p, |enc| {
        let (cu, pu) = (c as u64, p as u64);
        let shape = GroupShape { channels: cu, pixels: pu, width: ww as u64, groups: groups as u64, channels_last: false };
        let stats = GroupStats { moments: Mat::new(ab, 0), stats: Mat::new(ob, 0), eps: 1e-6 };
        group_norm(gpu, enc, Mat::new(&xb, 0), stats, GroupAffine { gamma: Weight::bf16(&gb), beta: Weight::bf16(&bb), silu: false }, Mat::new(gnb, 0), shape)?;
        transpose(gpu, enc, Mat::new(gnb, pu), Mat::new(tok, cu), cu, pu)?;
        for (i, dst) in [qb, kb, vb].into_iter().enumerate() {
            linear(gpu, enc, Mat::new(tok, cu), Weight::bf16(&lb[i].0), Some(Weight::bf16(&lb[i].1)), Mat::new(dst, cu), Gemm { m: pu, n: cu, k: cu })?;
        }
        let s = Attention { q_len: pu, kv_len: pu, q_heads: 1, kv_heads: 1, head_dim: cu, scale, causal: false };
        attention(gpu, enc, Qkv { q: Mat::new(qb, cu), k: Mat::new(kb, cu), v: Mat::new(vb, cu) }, None, Mat::new(ab, cu), s)?;
        linear(gpu, enc, Mat::new(ab, cu), Weight::bf16(&lb[3].0), Some(Weight::bf16(&lb[3].1)), Mat::new(ob, cu), Gemm { m: pu, n: cu, k: cu })?;
        transpose(gpu, enc, Mat::new(ob, cu), Mat::new(&result, pu), pu, cu)?;
        elementwise(gpu, enc, Elementwise::AddInPlace, Mat::new(&result, pu), None, Mat::new(&xb, pu), [cu, pu])
    });
    assert_close("vae mid attention", &got, &want, F32_TOL);
}
