//! Every tolerance the kernel tests, the end-to-end suite and `flux-lite
//! selftest` hold the engine to, in one place.
//!
//! Each f32 bound is about 2–3× what the f32 path measured against its
//! golden, with the measured value and the date in its comment (lavapipe,
//! Mesa 22.3.6, the tiny models), so a regression of a few times fails
//! instead of hiding under a loose bound. The f32 goldens never move; a
//! new precision tier (f16, matrix units) states its own bounds in
//! [`other_tiers`], which keeps the project-wide image bar (max 3, mean 0.2).

/// Each kernel against the f64 oracle (`kernels-wgsl`'s tests and selftest).
pub mod kernels {
    /// The f32 tier's bound for every kernel: relative L2 ≤ 1e-5 of the f64 reference.
    pub const F32_KERNEL: f64 = 1e-5;
    /// A linear or convolution on a half tier against the exact product: both
    /// operands rounded to f16 (2⁻¹¹ relative each) move random products by
    /// 1.35e-4 – 1.99e-4 relative L2 (lavapipe, 2026-11-25).
    pub const HALF_PRODUCT: f64 = 5e-4;
    /// Attention on matrix units against the exact attention: q, k, the
    /// probabilities and v rounded to f16, 2.0e-4 – 4.0e-4 measured (Mesa 26's
    /// lavapipe, 8×8 tiles, 2026-11-25).
    pub const MATRIX_ATTENTION: f64 = 1e-3;
    /// Attention over keys and values in the half-K/V layout against the
    /// exact attention: k and v rounded to f16 (2⁻¹¹ relative each) under
    /// their range scales, 2.4e-4 – 3.0e-4 measured (lavapipe, both kernel
    /// shapes, 2026-11-27).
    pub const HALF_KV_ATTENTION: f64 = 5e-4;
}

/// The f32 path (the reference tier).
pub mod f32 {
    /// Text encoder vs transformers, prompt embedding and each picked hidden
    /// state: measured 1.6e-7 – 7.3e-7 relative L2 (2026-11-25).
    pub const TEXT_ENCODER: f64 = 2e-6;
    /// Each denoising step's velocity and latents vs diffusers, relative L2:
    /// measured up to 3.81e-6 (with reference images 2.98e-6) on lavapipe,
    /// and 3.12e-6 for selftest's step on an H200 (2026-11-26).
    pub const STEP: f64 = 1e-5;
    /// Each transformer block's output (and the time and context embeddings)
    /// vs diffusers: measured up to 4.84e-6 (2026-11-26).
    pub const BLOCK: f64 = 1e-5;
    /// The latents after the VAE's batch-norm de-normalisation (one
    /// multiply-add an element) vs diffusers: measured 2.1e-8 – 3.4e-8 (2026-11-26).
    pub const DENORM_LATENT: f64 = 1e-7;
    /// VAE encoder posterior mean vs diffusers, whole or by bands: measured
    /// 1.09e-6 – 1.19e-6 (2026-11-25).
    pub const VAE_ENCODER_MEAN: f64 = 3e-6;
    /// The reference tokens (patchified, BatchNorm-normalised mean) vs
    /// diffusers: measured 5.0e-7 – 5.5e-7 (2026-11-25).
    pub const REFERENCE_TOKENS: f64 = 1.5e-6;
    /// The VAE decoder's output vs diffusers before 8-bit levels: measured
    /// 1.29e-6 – 1.35e-6 (2026-11-25).
    pub const VAE_DECODED: f64 = 4e-6;
    /// A tiny preview decoder's output vs diffusers' `AutoencoderTiny` and
    /// `taesd.py`'s modules before 8-bit levels: measured 8.5e-8 (diffusers
    /// layout) and 1.1e-7 (TAESD layout with global-norm blocks) (2026-11-27).
    pub const TINY_DECODED: f64 = 5e-7;
    /// Largest difference of one 8-bit value from the diffusers PNG (or
    /// between two of our decodes): measured 1, in at most 2 bytes of an
    /// image; 0 in the other cases (2026-11-25).
    pub const PNG_MAX_LEVELS: u8 = 1;
    /// Mean difference over all values of an image: measured at most 2.2e-4
    /// (one byte of 4608 off by one level) (2026-11-25).
    pub const PNG_MEAN_LEVELS: f64 = 6e-4;
}

/// The bars other precision tiers are held to, the project-wide image bar:
/// within 3 levels everywhere and 0.2 on average of the diffusers PNG.
pub mod other_tiers {
    pub const PNG_MAX_LEVELS: u8 = 3;
    pub const PNG_MEAN_LEVELS: f64 = 0.2;
    // The stages on the half tiers (f16 and matrix; tests/tests/half_tiers.rs).
    // Each linear or convolution rounds both operands to f16 (2⁻¹¹ relative
    // each, ~1.5e-4 relative L2 per product on random data); a stage chains
    // several, so its error is a few of those. About 2.5× the worst measured.
    /// Text encoder vs transformers: measured 3.9e-4 – 8.7e-4 on both tiers
    /// (Mesa 22.3.6 f16, Mesa 26.2.6 f16 and matrix 8×8 with attention on
    /// matrix units, 2026-11-25).
    pub const TEXT_ENCODER: f64 = 2e-3;
    /// Each step's velocity vs diffusers, from diffusers' latents: measured
    /// 3.8e-4 – 6.6e-4 (the same runs).
    pub const VELOCITY: f64 = 1.5e-3;
    /// The VAE decoder's output vs diffusers: measured 6.7e-4 – 8.9e-4 (the
    /// same runs); 1.1e-3 – 1.44e-3 on the matrix tier since its stream is
    /// f16 between blocks (2026-12-02).
    pub const VAE_DECODED: f64 = 2e-3;
    /// The VAE encoder's posterior mean and reference tokens vs diffusers,
    /// whole and by bands: measured 5.4e-4 – 7.4e-4 (mean) and 2.5e-4 –
    /// 3.4e-4 (tokens) on f16 (Mesa 26), 8.7e-4 – 1.1e-3 and 4.0e-4 –
    /// 5.1e-4 on the matrix tier's channels-last encoder (2026-12-02).
    pub const VAE_ENCODER_MEAN: f64 = 2e-3;
    /// A tiny preview decoder's output vs diffusers' `AutoencoderTiny` and
    /// `taesd.py`'s modules, whole and by bands: measured 1.34e-4 – 1.53e-4
    /// on f16 and 1.52e-4 – 1.95e-4 on the matrix tier's channels-last
    /// decoder (Mesa 26.2.6, 2026-12-04).
    pub const TINY_DECODED: f64 = 5e-4;
    /// Its 8-bit levels against the reference's rounded: measured at most 1
    /// off on both (the same runs), as the f32 tier's test holds them.
    pub const TINY_LEVELS: u8 = 1;
}

/// The half-K/V layout (the transformer's keys and values kept in f16
/// under their range scales, every other tensor f32; the planner takes it
/// only where no layout with f32 keys and values fits): its own bounds.
pub mod half_kv {
    /// Each step's velocity vs diffusers, from diffusers' latents: measured
    /// 8.1e-6 – 1.95e-5 on the golden cases of tiny-a, tiny-b and tiny-9b
    /// (the f32 layout's 3.8e-6 at most: f16 keys and values add about
    /// 1e-5), by chunks of 64 rows and of all rows (lavapipe, 2026-11-27).
    pub const VELOCITY: f64 = 5e-5;
    /// The velocity against the f32 layout's on the suite's synthetic
    /// prompt and latents (larger than on the goldens' inputs): measured
    /// 7.5e-5 (tiny-b) – 1.1e-4 (tiny-a; 8.6e-5 with two references
    /// recomputed each step) (lavapipe, 2026-11-27).
    pub const VS_F32_LAYOUT: f64 = 3e-4;
    /// A whole run's final latents against the f32 layout's (tiny-a at its
    /// minimum budget, 2 steps, `cli/tests/budget.rs`): measured 8.7e-6
    /// (lavapipe, 2026-11-27); its PNG within 1 level, mean 3e-4.
    pub const LATENTS: f64 = 3e-5;
}

/// The largest and the mean difference of two 8-bit images, in levels
/// (`(255, ∞)` when their sizes differ).
pub fn png_gap(got: &[u8], want: &[u8]) -> (u8, f64) {
    if got.len() != want.len() {
        return (u8::MAX, f64::INFINITY);
    }
    let max = got.iter().zip(want).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
    let mean = got.iter().zip(want).map(|(a, b)| a.abs_diff(*b) as f64).sum::<f64>() / want.len().max(1) as f64;
    (max, mean)
}

