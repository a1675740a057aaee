//! Kernel checks a user can run on their own adapter (`flux-lite
//! selftest`): the product kernels, which every precision tier replaces,
//! and the norms and RoPE, which every tier shares, on random inputs whose
//! sizes fall off every workgroup and tile edge, each output buffer filled
//! with NaN first so that an element the kernel forgets to write fails the
//! check, against core's f64 reference. The kernels' own tests call the
//! same checks.

use crate::kernels::attention::{attention, attention_carried, Attention, Carry, Qkv};
use crate::kernels::conv::{conv2d, upsample_nearest2x};
use crate::kernels::elementwise::{elementwise, transpose, Elementwise};
use crate::kernels::linear::{linear, linear_add, Gemm};
use crate::kernels::group_norm::{group_merge, group_moments, group_norm, group_norm_apply, GroupAffine, GroupShape, GroupStats};
use crate::kernels::norm::{layer_norm_modulate, rms_norm, rms_norm_inplace, RowNorm};
use crate::kernels::rope::{rope, RopeStyle, RopeTables};
use crate::view::HeadRows;
use crate::{DeviceBuffer, Gpu, GpuError, Mat, Precision, Weight};
use flux_lite_core::oracle::{self as r, ConvShape, Weights};

mod channels_last;
mod chunked_attention;
mod half_path;
mod vae_ends;
pub use channels_last::channels_last_checks;
pub use chunked_attention::{chunked_attention_checks, OneHead};
pub use half_path::half_path_checks;
pub use vae_ends::{check_denorm_unpatchify, check_pixel_levels};

/// One check's outcome: its worst error against its tolerance.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub name: String,
    /// What `worst` measures (e.g. "relative L2").
    pub measure: &'static str,
    pub worst: f64,
    pub tolerance: f64,
    /// Why the check could not run or what failed beyond the figure.
    pub failure: Option<String>,
}

impl Check {
    /// A measured check: passes when `worst` is a number within `tolerance`.
    pub fn measured(name: impl Into<String>, measure: &'static str, worst: f64, tolerance: f64) -> Self {
        Self { name: name.into(), measure, worst, tolerance, failure: None }
    }

    /// A check that could not be completed.
    pub fn failed(name: impl Into<String>, measure: &'static str, tolerance: f64, why: impl Into<String>) -> Self {
        Self { name: name.into(), measure, worst: f64::NAN, tolerance, failure: Some(why.into()) }
    }

    pub fn passed(&self) -> bool {
        self.failure.is_none() && self.worst <= self.tolerance
    }
}

/// The kernels' bounds, from the one place every tolerance lives.
pub use flux_lite_core::tolerance::kernels::{F32_KERNEL, HALF_PRODUCT, MATRIX_ATTENTION};

/// SplitMix64: small, seedable, good enough for check data.
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }

    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }

    pub fn bf16s(&mut self, n: usize, scale: f32) -> Vec<u16> {
        (0..n).map(|_| flux_lite_core::numerics::bf16::from_f32(self.normal() * scale)).collect()
    }
}

/// Relative L2 error of `got` against `want`; NaN when any element is NaN.
pub fn rel_l2(got: &[f32], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::NAN;
    }
    let diff2: f64 = got.iter().zip(want).map(|(&g, &w)| (g as f64 - w) * (g as f64 - w)).sum();
    let ref2: f64 = want.iter().map(|w| w * w).sum();
    (diff2 / ref2.max(f64::MIN_POSITIVE)).sqrt()
}

/// What [`worst_rel_l2`] measures.
pub const WORST_ROW: &str = "relative L2, worst row";

/// The largest [`rel_l2`] of `got`'s rows of `width` against `want`'s:
/// rows far apart in range each held to the bound, not the largest alone.
pub fn worst_rel_l2(got: &[f32], want: &[f64], width: usize) -> f64 {
    if got.len() != want.len() || width == 0 || !got.len().is_multiple_of(width) {
        return f64::NAN;
    }
    got.chunks(width).zip(want.chunks(width)).map(|(g, w)| rel_l2(g, w)).fold(0.0, |worst, e| if e.is_nan() || worst.is_nan() { f64::NAN } else { worst.max(e) })
}

/// A fresh output buffer of NaN.
pub fn poisoned(gpu: &Gpu, n: usize) -> DeviceBuffer {
    gpu.upload_f32("poisoned", &vec![f32::NAN; n])
}

/// Records and submits work, then reads `count` floats of `buf` back.
fn run_and_read(gpu: &Gpu, buf: &wgpu::Buffer, count: usize, record: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<(), GpuError>) -> Result<Vec<f32>, GpuError> {
    gpu.submit(record)?;
    gpu.read_f32(buf, 0, count)
}

/// The bound a product kernel is held to on `gpu`'s tier.
fn product_bound(gpu: &Gpu) -> f64 {
    match gpu.precision() {
        Precision::F16 | Precision::Matrix => HALF_PRODUCT,
        _ => F32_KERNEL,
    }
}

/// The product kernels on `gpu`'s tier: linear (bf16 weights with bias),
/// a 3×3 convolution and the VAE encoder's stride-2 one, and attention (the
/// transformer's, the text encoder's causal grouped-query one, and the VAE's
/// carried over chunks of keys as its banded attention runs it), each
/// at sizes off every tile edge; on the matrix tier's f16 tiles, the
/// half-precision data path's fused products and attention too
/// ([`half_path_checks`], [`channels_last_checks`]).
pub fn product_checks(gpu: &Gpu) -> Vec<Check> {
    let tier = gpu.precision().name();
    let outcome = |name: String, tolerance: f64, got: Result<f64, GpuError>| match got {
        Ok(worst) => Check::measured(name, "relative L2", worst, tolerance),
        Err(e) => Check::failed(name, "relative L2", tolerance, e.to_string()),
    };
    let (m, n, k) = (70, 131, 77);
    let conv = ConvShape::same(5, 7, 13, 11, 3);
    let attn = Attention { q_len: 37, kv_len: 37, q_heads: 3, kv_heads: 3, head_dim: 24, scale: 1.0 / 24f32.sqrt(), causal: false };
    // The text encoder's: causal, grouped-query (two query heads per kv head).
    let causal = Attention { q_len: 29, kv_len: 29, q_heads: 4, kv_heads: 2, head_dim: 16, scale: 0.25, causal: true };
    // FLUX's own head width, where a kernel's output tiles span the whole head.
    let wide = Attention { q_len: 70, kv_len: 70, q_heads: 2, kv_heads: 2, head_dim: 128, scale: 1.0 / 128f32.sqrt(), causal: false };
    let attention_bound = if gpu.matrix().is_some() { MATRIX_ATTENTION } else { F32_KERNEL };
    // The carried attention runs on matrix units where the tier's tiles are f16.
    let carried_bound = if gpu.matrix().is_some_and(|c| c.operands == crate::precision::MatrixOperands::F16) { MATRIX_ATTENTION } else { F32_KERNEL };
    vec![
        outcome(format!("{tier} linear {m}×{n}×{k}, bf16 weights and bias"), product_bound(gpu), check_linear(gpu, m, n, k, 1)),
        outcome(format!("{tier} linear adding onto its output (LoRA), 45×70×12 in a wider row, f32 weights"), product_bound(gpu), check_linear_add(gpu, 45, 70, 12, 9)),
        outcome(format!("{tier} conv2d 3×3, 5→7 channels, 13×11"), product_bound(gpu), check_conv(gpu, conv, 2)),
        outcome(format!("{tier} attention 37 tokens, 3 heads × 24"), attention_bound, check_attention(gpu, attn, 3)),
        outcome(format!("{tier} attention causal, 29 tokens, 4 query / 2 kv heads × 16"), attention_bound, check_attention(gpu, causal, 4)),
        outcome(format!("{tier} attention 70 tokens, 2 heads × 128"), attention_bound, check_attention(gpu, wide, 5)),
        outcome(format!("{tier} conv2d 3×3 stride 2, padded right and below, 4→3 channels, 9×8"), product_bound(gpu), check_conv(gpu, downsampler(4, 3, 9, 8), 42)),
        outcome(format!("{tier} attention carried over 3 key chunks (the VAE's), 21 queries, 40 keys, 2 heads × 24"), carried_bound, check_attention_key_chunks(gpu, 2, 24)),
        outcome(format!("{tier} attention carried over 3 key chunks, one head × 512 (the VAE mid-block's width)"), carried_bound, check_attention_key_chunks(gpu, 1, 512)),
    ]
    .into_iter()
    .chain(half_path_checks(gpu))
    .chain(channels_last_checks(gpu))
    .chain(chunked_attention_checks(gpu))
    .collect()
}

/// The kernels every tier shares (f32 on all of them): RMSNorm, the
/// modulated LayerNorm, GroupNorm with SiLU, and both RoPE layouts.
pub fn shared_checks(gpu: &Gpu) -> Vec<Check> {
    let within = |name: &str, tolerance: f64, got: Result<f64, GpuError>| match got {
        Ok(worst) => Check::measured(name, "relative L2", worst, tolerance),
        Err(e) => Check::failed(name, "relative L2", tolerance, e.to_string()),
    };
    let outcome = |name: &str, got| within(name, F32_KERNEL, got);
    vec![
        outcome("rms_norm 37 rows × 300, bf16 weight", check_rms_norm(gpu, 37, 300, 6)),
        outcome("rms_norm per head in place, 19 tokens, 3 heads × 24 inside a fused row", check_rms_norm_per_head_in_place(gpu)),
        outcome("layer_norm_modulate 41 rows × 333, offset 20", check_layer_norm(gpu, 41, 333, 8)),
        outcome("group_norm + SiLU, 24 channels in 8 groups, 13×11", check_group_norm(gpu, true, 10)),
        outcome("group_moments, group_merge and group_norm_apply over 3 bands of rows (the banded VAE)", check_group_norm_by_bands(gpu)),
        outcome("rope interleaved (FLUX.2), 23 tokens, 3 heads × 16", check_rope(gpu, RopeStyle::Interleaved, [23, 3, 16], 10)),
        outcome("rope rotate-half (Qwen3), 17 tokens, 4 heads × 8", check_rope(gpu, RopeStyle::RotateHalf, [17, 4, 8], 11)),
        outcome("element-wise SiLU, SwiGLU, gated residual, add, scale, axpy, copy, ReLU, tanh clamp, scale-shift; 13×77 strided", check_elementwise_ops(gpu)),
        within("transpose 23×37, exact", 0.0, check_transpose(gpu)),
        within("upsample nearest ×2, 3×5×7, exact", 0.0, check_upsample(gpu)),
        outcome("VAE de-normalise and unpatchify, bf16 statistics, 3×5×7", check_denorm_unpatchify(gpu, [3, 5, 7], true, 60)),
        within("VAE 8-bit levels, clamps and ties to even, exact", 0.0, check_pixel_levels(gpu)),
    ]
}

/// `[23, 37]` to `[37, 23]`, moved exactly.
pub fn check_transpose(gpu: &Gpu) -> Result<f64, GpuError> {
    let (rows, cols) = (23usize, 37usize);
    let a = Rng::new(32).normals(rows * cols, 1.0);
    let want: Vec<f64> = (0..cols).flat_map(|c| (0..rows).map(move |r| (r, c))).map(|(r, c)| a[r * cols + c] as f64).collect();
    let (ab, db) = (gpu.upload_f32("a", &a), poisoned(gpu, rows * cols));
    let got = run_and_read(gpu, &db, rows * cols, |enc| transpose(gpu, enc, Mat::new(&ab, cols as u64), Mat::new(&db, rows as u64), rows as u64, cols as u64))?;
    Ok(rel_l2(&got, &want))
}

/// Nearest-neighbour ×2 of `[3, 5, 7]`, exact.
pub fn check_upsample(gpu: &Gpu) -> Result<f64, GpuError> {
    let (c, h, w) = (3usize, 5usize, 7usize);
    let x = Rng::new(43).normals(c * h * w, 1.0);
    let mut want = vec![0.0; 4 * x.len()];
    r::upsample_nearest2x(&x, c, h, w, &mut want);
    let (xb, yb) = (gpu.upload_f32("x", &x), poisoned(gpu, 4 * x.len()));
    let got = run_and_read(gpu, &yb, 4 * x.len(), |enc| upsample_nearest2x(gpu, enc, Mat::new(&xb, 0), Mat::new(&yb, 0), c as u64, h as u64, w as u64))?;
    Ok(rel_l2(&got, &want))
}

/// Every element-wise op, as the checks run them.
pub const ELEMENTWISE_OPS: [Elementwise; 12] = [
    Elementwise::Silu,
    Elementwise::SwiGlu,
    Elementwise::GatedResidual,
    Elementwise::Add,
    Elementwise::AddRelu,
    Elementwise::AddInPlace,
    Elementwise::Scale(-0.37),
    Elementwise::Axpy(-0.0625),
    Elementwise::Copy,
    Elementwise::Relu,
    Elementwise::TanhClamp(3.0),
    Elementwise::ScaleShift(2.0, -1.0),
];

/// Every element-wise op; the worst of them.
pub fn check_elementwise_ops(gpu: &Gpu) -> Result<f64, GpuError> {
    let mut worst = 0f64;
    for (i, op) in ELEMENTWISE_OPS.into_iter().enumerate() {
        // NaN stays the worst: `max` would drop it.
        let e = check_elementwise(gpu, op, 20 + i as u64)?;
        worst = if e.is_nan() || worst.is_nan() { f64::NAN } else { worst.max(e) };
    }
    Ok(worst)
}

/// One element-wise op over `[13, 77]`: `a` a column window of a wider
/// buffer, `b` plain, the gate one broadcast row; the output poisoned with
/// NaN unless the op reads it.
pub fn check_elementwise(gpu: &Gpu, op: Elementwise, seed: u64) -> Result<f64, GpuError> {
    let (rows, cols) = (13usize, 77usize);
    let mut rng = Rng::new(seed);
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
                Elementwise::AddRelu => (x + y).max(0.0),
                Elementwise::AddInPlace => d + x,
                Elementwise::Scale(s) => x * s as f64,
                Elementwise::Axpy(s) => d + (x as f32 * s) as f64,
                Elementwise::Copy => x,
                Elementwise::Relu => x.max(0.0),
                Elementwise::TanhClamp(s) => (x / s as f64).tanh() * s as f64,
                Elementwise::ScaleShift(s, shift) => x * s as f64 + shift as f64,
            }
        })
        .collect();
    let ab = gpu.upload_f32("a", &a_wide);
    let bb = gpu.upload_f32("b", if op == Elementwise::GatedResidual { &gate } else { &b });
    let reads_dst = matches!(op, Elementwise::GatedResidual | Elementwise::AddInPlace | Elementwise::Axpy(_));
    let db = if reads_dst { gpu.upload_f32("dst", &dst0) } else { poisoned(gpu, rows * cols) };
    let second = match op {
        Elementwise::SwiGlu | Elementwise::Add | Elementwise::AddRelu => Some(Mat::new(&bb, cols as u64)),
        Elementwise::GatedResidual => Some(Mat { buf: &bb, offset: 0, stride: 0 }),
        _ => None,
    };
    let got = run_and_read(gpu, &db, rows * cols, |enc| {
        let a = Mat { buf: &ab, offset: 4, stride: (cols + 9) as u64 };
        elementwise(gpu, enc, op, a, second, Mat::new(&db, cols as u64), [rows as u64, cols as u64])
    })?;
    Ok(rel_l2(&got, &want))
}

/// RMSNorm over `rows × d` with a bf16 weight.
pub fn check_rms_norm(gpu: &Gpu, rows: usize, d: usize, seed: u64) -> Result<f64, GpuError> {
    let mut rng = Rng::new(seed);
    let x = rng.normals(rows * d, 3.0);
    let w = rng.bf16s(d, 1.0);
    let mut want = vec![0.0; rows * d];
    r::rms_norm(&x, Weights::Bf16(&w), rows, d, 1e-6, &mut want);
    let (xb, wb, yb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), poisoned(gpu, rows * d));
    let s = RowNorm { tokens: rows as u64, heads: 1, d: d as u64, eps: 1e-6 };
    let got = run_and_read(gpu, &yb, rows * d, |enc| rms_norm(gpu, enc, Mat::new(&xb, d as u64), Weight::bf16(&wb), Mat::new(&yb, d as u64), s))?;
    Ok(rel_l2(&got, &want))
}

/// RMSNorm per head in place on q inside a fused `[tokens, 3·heads·d + 10]`
/// projection (heads at columns `[7, 7 + heads·d)`); a touched column
/// outside the heads fails the check.
pub fn check_rms_norm_per_head_in_place(gpu: &Gpu) -> Result<f64, GpuError> {
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
    let got = run_and_read(gpu, &fb, tokens * stride, |enc| rms_norm_inplace(gpu, enc, Mat { buf: &fb, offset: 7, stride: stride as u64 }, Weight::bf16(&wb), s))?;
    let untouched = (0..tokens).all(|t| (0..7).chain(7 + heads * d..stride).all(|c| got[t * stride + c].to_bits() == fused[t * stride + c].to_bits()));
    if !untouched {
        return Ok(f64::INFINITY);
    }
    let window: Vec<f32> = (0..tokens).flat_map(|t| got[t * stride + 7..t * stride + 7 + heads * d].to_vec()).collect();
    Ok(rel_l2(&window, &want))
}

/// GroupNorm by three bands of rows as the banded VAE runs it: each band's
/// moments from `group_moments` (against f64) into its rows of the whole
/// moments, `group_merge`, then `group_norm_apply` (with SiLU) on every band
/// against the reference GroupNorm of the whole tensor. The worst of all those.
pub fn check_group_norm_by_bands(gpu: &Gpu) -> Result<f64, GpuError> {
    let (channels, groups, width, rows) = (12usize, 4usize, 5usize, 8usize);
    let (per, pixels) = (channels / groups, width * rows);
    let mut rng = Rng::new(70);
    let x: Vec<f32> = rng.normals(channels * pixels, 1.5).into_iter().map(|v| v + 2.0).collect();
    let (gamma, beta) = (rng.bf16s(channels, 1.0), rng.bf16s(channels, 1.0));
    let eps = 1e-6;
    let mut want = vec![0.0; channels * pixels];
    r::group_norm(&x, Weights::Bf16(&gamma), Weights::Bf16(&beta), [channels, pixels, groups], eps, true, &mut want);
    let shape = GroupShape { channels: channels as u64, pixels: pixels as u64, width: width as u64, groups: groups as u64, channels_last: false };
    let band = |r0: usize, r1: usize| -> Vec<f32> { (0..channels).flat_map(|c| x[c * pixels + r0 * width..c * pixels + r1 * width].to_vec()).collect() };
    let bands = [(0, 2), (2, 7), (7, 8)];
    let mut worst = 0f64;
    let (mb, sb) = (poisoned(gpu, 2 * groups * rows), poisoned(gpu, 2 * groups));
    for &(r0, r1) in &bands {
        let xs = band(r0, r1);
        let xb = gpu.upload_f32("x", &xs);
        let at = Mat { buf: &mb, offset: (2 * groups * r0) as u64, stride: 0 };
        gpu.submit(|enc| group_moments(gpu, enc, crate::kernels::Input::F32(Mat::new(&xb, 0)), at, shape.band((r1 - r0) as u64)))?;
        let got = gpu.read_f32(&mb, (2 * groups * r0) as u64, 2 * groups * (r1 - r0))?;
        let n = per * width;
        let exact: Vec<f64> = (r0..r1)
            .flat_map(|r| (0..groups).map(move |g| (r, g)))
            .flat_map(|(r, g)| {
                let values: Vec<f64> = (g * per..(g + 1) * per).flat_map(|c| x[c * pixels + r * width..c * pixels + (r + 1) * width].iter().map(|&v| v as f64)).collect();
                let mean = values.iter().sum::<f64>() / n as f64;
                [mean, values.iter().map(|v| (v - mean).powi(2)).sum::<f64>()]
            })
            .collect();
        worst = worst.max(rel_l2(&got, &exact));
    }
    let stats = GroupStats { moments: Mat::new(&mb, 0), stats: Mat::new(&sb, 0), eps: eps as f32 };
    gpu.submit(|enc| group_merge(gpu, enc, stats, shape.moments()))?;
    let (gb, bb) = (gpu.upload_bf16("gamma", &gamma), gpu.upload_bf16("beta", &beta));
    for &(r0, r1) in &bands {
        let xb = gpu.upload_f32("x", &band(r0, r1));
        let n = channels * (r1 - r0) * width;
        let yb = poisoned(gpu, n);
        let affine = GroupAffine { gamma: Weight::bf16(&gb), beta: Weight::bf16(&bb), silu: true };
        let got = run_and_read(gpu, &yb, n, |enc| group_norm_apply(gpu, enc, Mat::new(&xb, 0), Mat::new(&sb, 0), affine, Mat::new(&yb, 0), shape.band((r1 - r0) as u64)))?;
        let want_band: Vec<f64> = (0..channels).flat_map(|c| want[c * pixels + r0 * width..c * pixels + r1 * width].to_vec()).collect();
        worst = worst.max(rel_l2(&got, &want_band));
    }
    Ok(worst)
}

/// LayerNorm with shift and scale rows of a modulation vector; a common
/// offset of 20 checks that the variance is taken around the mean.
pub fn check_layer_norm(gpu: &Gpu, rows: usize, d: usize, seed: u64) -> Result<f64, GpuError> {
    let mut rng = Rng::new(seed);
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
        layer_norm_modulate(gpu, enc, Mat::new(&xb, d as u64), crate::kernels::Modulation::of(shift, scale), Mat::new(&yb, d as u64), s)
    })?;
    Ok(rel_l2(&got, &want))
}

/// GroupNorm with a bf16 affine over 24 channels of 13×11 pixels in 8 groups, then SiLU when `silu`.
pub fn check_group_norm(gpu: &Gpu, silu: bool, seed: u64) -> Result<f64, GpuError> {
    let (channels, groups, pixels) = (24usize, 8usize, 13 * 11);
    let mut rng = Rng::new(seed);
    let x: Vec<f32> = rng.normals(channels * pixels, 2.0).into_iter().map(|v| v - 3.0).collect();
    let (gamma, beta) = (rng.bf16s(channels, 1.0), rng.bf16s(channels, 1.0));
    let mut want = vec![0.0; channels * pixels];
    r::group_norm(&x, Weights::Bf16(&gamma), Weights::Bf16(&beta), [channels, pixels, groups], 1e-6, silu, &mut want);
    let (xb, gb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("gamma", &gamma), gpu.upload_bf16("beta", &beta));
    let yb = poisoned(gpu, channels * pixels);
    let scratch = poisoned(gpu, 2 * groups + 2 * groups * 11);
    let got = run_and_read(gpu, &yb, channels * pixels, |enc| {
        let shape = GroupShape { channels: channels as u64, pixels: pixels as u64, width: 13, groups: groups as u64, channels_last: false };
        let stats = GroupStats { moments: Mat { buf: &scratch, offset: 2 * groups as u64, stride: 0 }, stats: Mat::new(&scratch, 0), eps: 1e-6 };
        group_norm(gpu, enc, Mat::new(&xb, 0), stats, GroupAffine { gamma: Weight::bf16(&gb), beta: Weight::bf16(&bb), silu }, Mat::new(&yb, 0), shape)
    })?;
    Ok(rel_l2(&got, &want))
}

/// RoPE in place on a strided view (as q inside a fused projection), with
/// the model's own tables (FLUX.2's four axes, Qwen3's positions) and two
/// leading rows of NaN in the tables that the kernel must skip.
pub fn check_rope(gpu: &Gpu, style: RopeStyle, [tokens, heads, head_dim]: [usize; 3], seed: u64) -> Result<f64, GpuError> {
    use flux_lite_core::numerics::rope as tables;
    let (mut cos, mut sin) = (vec![0f32; tokens * head_dim], vec![0f32; tokens * head_dim]);
    for t in 0..tokens {
        let row = t * head_dim..(t + 1) * head_dim;
        match style {
            RopeStyle::Interleaved => {
                let pos = if t < 5 { tables::text_position(t) } else { tables::image_position(0, (t - 5) / 6, (t - 5) % 6) };
                let axes = [head_dim / 4; 4];
                tables::flux_row(pos, &axes, 2000.0, &mut cos[row.clone()], &mut sin[row]);
            }
            RopeStyle::RotateHalf => tables::qwen_row(t * 31, head_dim, 1e6, &mut cos[row.clone()], &mut sin[row]),
        }
    }
    let mut rng = Rng::new(seed);
    let stride = heads * head_dim + 6;
    let data = rng.normals(tokens * stride, 1.0);
    let x: Vec<f32> = (0..tokens).flat_map(|t| data[t * stride + 2..t * stride + 2 + heads * head_dim].to_vec()).collect();
    let mut want = vec![0.0; x.len()];
    match style {
        RopeStyle::Interleaved => r::rope_interleaved(&x, &cos, &sin, tokens, heads, head_dim, &mut want),
        RopeStyle::RotateHalf => r::rope_rotate_half(&x, &cos, &sin, tokens, heads, head_dim, &mut want),
    }
    let pad = vec![f32::NAN; 2 * head_dim];
    let cos_b = gpu.upload_f32("cos", &[pad.clone(), cos].concat());
    let sin_b = gpu.upload_f32("sin", &[pad, sin].concat());
    let db = gpu.upload_f32("data", &data);
    let got = run_and_read(gpu, &db, data.len(), |enc| {
        let view = Mat { buf: &db, offset: 2, stride: stride as u64 };
        let s = HeadRows { tokens: tokens as u64, heads: heads as u64, head_dim: head_dim as u64 };
        rope(gpu, enc, style, view, RopeTables { cos: &cos_b, sin: &sin_b, first_row: 2 }, s)
    })?;
    // Every column outside the rotated window must come back untouched.
    let untouched = (0..tokens).all(|t| (0..2).chain(2 + heads * head_dim..stride).all(|c| got[t * stride + c].to_bits() == data[t * stride + c].to_bits()));
    if !untouched {
        return Ok(f64::INFINITY);
    }
    let window: Vec<f32> = (0..tokens).flat_map(|t| got[t * stride + 2..t * stride + 2 + heads * head_dim].to_vec()).collect();
    Ok(rel_l2(&window, &want))
}

/// `y = x·Wᵀ + b` with bf16 weights, against the reference.
pub fn check_linear(gpu: &Gpu, m: usize, n: usize, k: usize, seed: u64) -> Result<f64, GpuError> {
    let mut rng = Rng::new(seed);
    let x = rng.normals(m * k, 1.0);
    let (w, b) = (rng.bf16s(n * k, 0.1), rng.bf16s(n, 1.0));
    let mut want = vec![0.0; m * n];
    r::linear(&x, Weights::Bf16(&w), Some(Weights::Bf16(&b)), m, n, k, &mut want);
    let (xb, wb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
    let yb = poisoned(gpu, m * n);
    let s = Gemm { m: m as u64, n: n as u64, k: k as u64 };
    let got = run_and_read(gpu, &yb, m * n, |enc| linear(gpu, enc, Mat::new(&xb, k as u64), Weight::bf16(&wb), Some(Weight::bf16(&bb)), Mat::new(&yb, n as u64), s))?;
    Ok(rel_l2(&got, &want))
}

/// `y += x·Wᵀ` with f32 weights onto a `y` of random values, against the
/// reference's product added to them (how a LoRA adapter's up product lands
/// on the base linear's output), `y` read and written through a window of a
/// wider row, as the transformer's fused projections are.
pub fn check_linear_add(gpu: &Gpu, m: usize, n: usize, k: usize, seed: u64) -> Result<f64, GpuError> {
    let mut rng = Rng::new(seed);
    let (x, w) = (rng.normals(m * k, 1.0), rng.normals(n * k, 0.3));
    let (stride, first) = (n + 5, 3);
    let before = rng.normals(m * stride, 1.0);
    let mut product = vec![0.0; m * n];
    r::linear(&x, Weights::F32(&w), None, m, n, k, &mut product);
    let want: Vec<f64> = (0..m).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| f64::from(before[i * stride + first + j]) + product[i * n + j]).collect();
    let (xb, wb, yb) = (gpu.upload_f32("x", &x), gpu.upload_f32("w", &w), gpu.upload_f32("y", &before));
    let s = Gemm { m: m as u64, n: n as u64, k: k as u64 };
    let y = Mat { buf: &yb, offset: first as u64, stride: stride as u64 };
    let got = run_and_read(gpu, &yb, m * stride, |enc| linear_add(gpu, enc, Mat::new(&xb, k as u64), Weight::f32(&wb), y, s))?;
    // The columns outside the window stay as they were.
    let untouched = (0..m).all(|i| (0..stride).filter(|c| !(first..first + n).contains(c)).all(|c| got[i * stride + c].to_bits() == before[i * stride + c].to_bits()));
    if !untouched {
        return Ok(f64::INFINITY);
    }
    let window: Vec<f32> = (0..m).flat_map(|i| got[i * stride + first..i * stride + first + n].to_vec()).collect();
    Ok(rel_l2(&window, &want))
}

/// A bf16 convolution with bias, against the reference.
pub fn check_conv(gpu: &Gpu, s: ConvShape, seed: u64) -> Result<f64, GpuError> {
    let mut rng = Rng::new(seed);
    let x = rng.normals(s.in_channels * s.height * s.width, 1.0);
    let w = rng.bf16s(s.out_channels * s.in_channels * s.kernel * s.kernel, 0.2);
    let b = rng.bf16s(s.out_channels, 0.5);
    let out = s.out_channels * s.out_height * s.out_width;
    let mut want = vec![0.0; out];
    r::conv2d(&x, Weights::Bf16(&w), Weights::Bf16(&b), s, &mut want);
    let (xb, wb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
    let yb = poisoned(gpu, out);
    let got = run_and_read(gpu, &yb, out, |enc| {
        conv2d(gpu, enc, Mat::new(&xb, (s.height * s.width) as u64), Weight::bf16(&wb), Weight::bf16(&bb), Mat::new(&yb, (s.out_height * s.out_width) as u64), s)
    })?;
    Ok(rel_l2(&got, &want))
}

/// The VAE encoder's downsampler: pad (0, 1, 0, 1), then a stride-2 3×3 convolution.
pub fn downsampler(in_channels: usize, out_channels: usize, height: usize, width: usize) -> ConvShape {
    ConvShape {
        in_channels,
        out_channels,
        height,
        width,
        kernel: 3,
        stride: 2,
        pad_top: 0,
        pad_left: 0,
        out_height: (height + 1 - 3) / 2 + 1,
        out_width: (width + 1 - 3) / 2 + 1,
    }
}

/// Attention carried over three chunks of the keys (16, 16 and 8), as the
/// banded VAE's mid-block attention runs, against f64 attention over all
/// keys, with `heads` heads of `d`.
pub fn check_attention_key_chunks(gpu: &Gpu, heads: usize, d: usize) -> Result<f64, GpuError> {
    let (q_len, kv_len) = (21usize, 40usize);
    let mut rng = Rng::new(71);
    let (q, k, v) = (rng.normals(q_len * heads * d, 1.0), rng.normals(kv_len * heads * d, 1.0), rng.normals(kv_len * heads * d, 1.0));
    let scale = (1.0 / (d as f64).sqrt()) as f32;
    let shape = r::AttentionShape { q_len, kv_len, q_heads: heads, kv_heads: heads, head_dim: d, scale: scale as f64, causal: false };
    let mut want = vec![0.0; q.len()];
    r::attention(&q, &k, &v, None, shape, &mut vec![0.0; kv_len], &mut want);
    let (qb, ob, sb) = (gpu.upload_f32("q", &q), poisoned(gpu, q.len()), poisoned(gpu, 2 * q_len * heads));
    let w = (heads * d) as u64;
    let chunks = [(0usize, 16usize), (16, 32), (32, 40)];
    for (i, &(k0, k1)) in chunks.iter().enumerate() {
        let (kb, vb) = (gpu.upload_f32("k", &k[k0 * heads * d..k1 * heads * d]), gpu.upload_f32("v", &v[k0 * heads * d..k1 * heads * d]));
        let s = Attention { q_len: q_len as u64, kv_len: (k1 - k0) as u64, q_heads: heads as u64, kv_heads: heads as u64, head_dim: d as u64, scale, causal: false };
        let carry = Carry { state: Mat::new(&sb, 0), from_state: i > 0, keep_state: i + 1 < chunks.len() };
        gpu.submit(|enc| attention_carried(gpu, enc, Qkv { q: Mat::new(&qb, w), k: Mat::new(&kb, w), v: Mat::new(&vb, w) }, Mat::new(&ob, w), Some(carry), s))?;
    }
    Ok(rel_l2(&gpu.read_f32(&ob, 0, q.len())?, &want))
}

/// Attention over `[len, heads, head_dim]` rows, against the reference.
pub fn check_attention(gpu: &Gpu, s: Attention, seed: u64) -> Result<f64, GpuError> {
    let mut rng = Rng::new(seed);
    let (qw, kw) = ((s.q_heads * s.head_dim) as usize, (s.kv_heads * s.head_dim) as usize);
    let q = rng.normals(s.q_len as usize * qw, 1.0);
    let k = rng.normals(s.kv_len as usize * kw, 1.0);
    let v = rng.normals(s.kv_len as usize * kw, 1.0);
    let shape = r::AttentionShape::from(s);
    let mut want = vec![0.0; q.len()];
    let mut scratch = vec![0.0; s.kv_len as usize];
    r::attention(&q, &k, &v, None, shape, &mut scratch, &mut want);
    let (qb, kb, vb) = (gpu.upload_f32("q", &q), gpu.upload_f32("k", &k), gpu.upload_f32("v", &v));
    let ob = poisoned(gpu, q.len());
    let got = run_and_read(gpu, &ob, q.len(), |enc| {
        let qkv = Qkv { q: Mat::new(&qb, qw as u64), k: Mat::new(&kb, kw as u64), v: Mat::new(&vb, kw as u64) };
        attention(gpu, enc, qkv, None, Mat::new(&ob, qw as u64), s)
    })?;
    Ok(rel_l2(&got, &want))
}

/// Prints `checks` and holds that there are `count` of them, all passing
/// (the tests of the tier-specific checks, on the adapter at hand).
#[cfg(test)]
fn assert_checks_pass(checks: &[Check], count: usize) {
    for c in checks {
        eprintln!("{}: {:.2e} (tolerance {:.0e})", c.name, c.worst, c.tolerance);
    }
    assert_eq!(checks.len(), count, "{checks:?}");
    assert!(checks.iter().all(Check::passed), "{checks:?}");
}

#[cfg(test)]
mod tests {
    use super::{rel_l2, worst_rel_l2};

    #[test]
    fn the_worst_row_is_measured_on_its_own_scale() {
        // A small row wholly wrong hides under a large one in the whole
        // tensor's relative L2, not in its own.
        let (got, want) = ([1e4f32, 1e4, 1.0, -1.0], [1e4f64, 1e4, 1.0, 1.0]);
        assert!(rel_l2(&got, &want) < 2e-4);
        assert!((worst_rel_l2(&got, &want, 2) - 2f64.sqrt()).abs() < 1e-12);
        assert!(worst_rel_l2(&[f32::NAN, 1.0], &[1.0, 1.0], 1).is_nan());
        assert!(worst_rel_l2(&got, &want, 3).is_nan(), "rows of 3 do not tile 4 values");
    }
}
