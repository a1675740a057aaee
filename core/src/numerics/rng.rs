//! A CPU random generator that draws the same numbers as PyTorch's.
//!
//! diffusers makes the initial latent noise with
//! `torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=…)`
//! on the CPU. [`TorchGenerator`] reproduces that bit for bit, so a seed given
//! to flux-lite yields the same image as the same seed given to diffusers.
//!
//! What torch does (checked against torch 2.15.0, the x86-64 PyPI wheel):
//!
//! - **Engine**: `CPUGeneratorImpl` wraps a standard 32-bit Mersenne Twister
//!   (mt19937). `manual_seed(s)` keeps `s` as the reported seed but seeds the
//!   twister with the **low 32 bits** only, so `2**32 + 7` draws exactly what
//!   `7` draws, and `2**63 - 1` what `0xffff_ffff` draws. Seeding also drops
//!   the cached normal sample (below). A 64-bit draw (`random64`) is two
//!   32-bit draws, the first one in the high half.
//! - **Uniforms**: a float uniform in [0, 1) is `(word & 0xff_ffff) · 2⁻²⁴`
//!   from one 32-bit word; a double uniform is `(word64 & (2⁵³−1)) · 2⁻⁵³`
//!   from one 64-bit draw.
//! - **Tensors of 16 or more elements** (always contiguous here) take the
//!   vectorised kernel: uniforms are turned into normals by Box–Muller on
//!   blocks of 16, pairing element `j` with `j + 8` (`u1 = 1 − buf[j]`,
//!   `u2 = buf[j + 8]`, `buf[j] = r·cos θ`, `buf[j + 8] = r·sin θ`). When the
//!   length is not a multiple of 16, 16 *fresh* uniforms are drawn and the
//!   last 16 elements are overwritten with their block, so the tail overlaps
//!   the previous block.
//!   - **f32** first draws one uniform per element straight into the output,
//!     transforms every whole block in place, then draws the 16 tail uniforms.
//!     It therefore consumes `n` words (`n + 16` if `n % 16 != 0`); the last
//!     `n % 16` of the first `n` words are drawn and thrown away.
//!   - **bf16** draws 16 uniforms into a float buffer per block, transforms
//!     them in float and rounds each result to bf16 (ties to even). It
//!     consumes `16·⌈n/16⌉` words, so from the first partial block on it is
//!     *not* the f32 stream rounded.
//!   - The log/sin/cos are not libm's: on x86-64 torch runs the AVX2 build of
//!     its `NormalFill16<float>` (CPUs with AVX-512 use the same kernel) with
//!     the Cephes polynomials of `avx_mathfun.h`, and the compiler fused most
//!     multiply–add pairs. [`log_cephes`] and [`sincos_cephes`] repeat the
//!     instruction sequence of the shipped binary, FMA by FMA.
//! - **Tensors of fewer than 16 elements** take the scalar path: for each
//!   element, `at::normal_distribution<double>` runs Box–Muller in f64 on two
//!   double uniforms, returns `r·cos θ` and **caches `r·sin θ` in the
//!   generator**; the next scalar draw returns the cached value instead. The
//!   f64 value is rounded to f32 (and, for bf16, then to bf16). The cache
//!   survives across calls and is neither used nor cleared by the vectorised
//!   path, so `randn(5)` followed by `randn(3)` starts the second call with the
//!   value cached by the first.
//!
//! Successive calls continue the same stream, exactly as successive
//! `torch.randn` calls on one generator do.
//!
//! Caveat: on CPUs where torch does not run the AVX2 kernel (aarch64, x86
//! without AVX2) torch's own vectorised-path results differ in the last bits
//! from what this module (and torch on x86-64) produces. The scalar path uses
//! f64 `log1p`/`sin`/`cos` from `libm`, which match glibc's after the
//! rounding to f32 except in astronomically rare ties.

use core::fmt;

/// Size of the Mersenne Twister state, in 32-bit words.
const MT_N: usize = 624;
/// Offset of the word mixed into each twisted word.
const MT_M: usize = 397;

/// The 32-bit Mersenne Twister that torch's `at::mt19937` implements (the
/// standard mt19937, the same stream as C++'s `std::mt19937`).
#[derive(Clone)]
struct Mt19937 {
    state: [u32; MT_N],
    /// Index of the next word to temper; `MT_N` means "twist first".
    next: usize,
}

impl Mt19937 {
    /// The standard mt19937 initialisation from a 32-bit seed.
    fn new(seed: u32) -> Self {
        let mut state = [0u32; MT_N];
        state[0] = seed;
        for i in 1..MT_N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(i as u32);
        }
        // torch starts with `left_ = 1`: the very first draw regenerates the state.
        Self { state, next: MT_N }
    }

    /// Regenerate all 624 words (the "twist").
    fn twist(&mut self) {
        for i in 0..MT_N {
            let upper = self.state[i] & 0x8000_0000;
            let lower = self.state[(i + 1) % MT_N] & 0x7fff_ffff;
            let y = upper | lower;
            let mut word = self.state[(i + MT_M) % MT_N] ^ (y >> 1);
            if y & 1 != 0 {
                word ^= 0x9908_b0df;
            }
            self.state[i] = word;
        }
        self.next = 0;
    }

    /// One tempered 32-bit output (`engine_()` in torch).
    fn next_u32(&mut self) -> u32 {
        if self.next >= MT_N {
            self.twist();
        }
        let mut y = self.state[self.next];
        self.next += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }
}

/// A torch-compatible CPU generator: `torch.Generator().manual_seed(seed)`.
///
/// The whole state that torch's draws depend on is here: the twister and the
/// cached second sample of the scalar Box–Muller path.
#[derive(Clone)]
pub struct TorchGenerator {
    engine: Mt19937,
    seed: u64,
    /// `CPUGeneratorImpl::next_double_normal_sample_`.
    next_normal: Option<f64>,
}

impl fmt::Debug for TorchGenerator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TorchGenerator")
            .field("seed", &self.seed)
            .field("position", &self.engine.next)
            .field("next_normal", &self.next_normal)
            .finish()
    }
}

impl TorchGenerator {
    /// `torch.Generator().manual_seed(seed)`: the twister is seeded with the
    /// low 32 bits of `seed` (torch's `mt19937(uint64_t)` truncates), and no
    /// normal sample is cached.
    pub fn new(seed: u64) -> Self {
        Self { engine: Mt19937::new(seed as u32), seed, next_normal: None }
    }

    /// The seed as given (`Generator.initial_seed()`), all 64 bits of it.
    pub fn initial_seed(&self) -> u64 {
        self.seed
    }

    /// One 32-bit draw (`CPUGeneratorImpl::random()`).
    pub fn next_u32(&mut self) -> u32 {
        self.engine.next_u32()
    }

    /// One 64-bit draw (`CPUGeneratorImpl::random64()`): two 32-bit draws,
    /// the first in the high half.
    pub fn next_u64(&mut self) -> u64 {
        let hi = self.next_u32();
        let lo = self.next_u32();
        (u64::from(hi) << 32) | u64::from(lo)
    }

    /// `at::uniform_real_distribution<float>(0, 1)`: 24 random bits scaled
    /// by 2⁻²⁴ (exact), so the value lies in [0, 1).
    fn uniform_f32(&mut self) -> f32 {
        (self.next_u32() & 0x00ff_ffff) as f32 * (1.0 / 16_777_216.0)
    }

    /// `at::uniform_real_distribution<double>(0, 1)`: 53 random bits of a
    /// 64-bit draw scaled by 2⁻⁵³ (exact).
    fn uniform_f64(&mut self) -> f64 {
        (self.next_u64() & ((1u64 << 53) - 1)) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }

    /// One sample of `at::normal_distribution<double>(0, 1)`, the scalar path
    /// used for tensors of fewer than 16 elements.
    ///
    /// Box–Muller in f64 with `u1` drawn first: `r = sqrt(−2·log1p(−u2))`,
    /// `θ = 2π·u1`; returns `r·cos θ` and caches `r·sin θ` for the next call.
    /// The final `·1 + 0` is torch's `val * std + mean` (it turns −0 into +0).
    fn normal_f64(&mut self) -> f64 {
        const STD: f64 = 1.0;
        const MEAN: f64 = 0.0;
        if let Some(cached) = self.next_normal.take() {
            return cached * STD + MEAN;
        }
        let u1 = self.uniform_f64();
        let u2 = self.uniform_f64();
        let r = libm::sqrt(-2.0 * libm::log1p(-u2));
        let theta = 2.0 * core::f64::consts::PI * u1;
        self.next_normal = Some(r * libm::sin(theta));
        r * libm::cos(theta) * STD + MEAN
    }

    /// Fill `out` with `torch.randn(out.len(), generator=g, dtype=torch.float32)`
    /// (any shape with that many elements: torch fills it in memory order).
    pub fn fill_randn_f32(&mut self, out: &mut [f32]) {
        let n = out.len();
        if n < 16 {
            for v in out.iter_mut() {
                *v = self.normal_f64() as f32;
            }
            return;
        }
        // torch's float kernel: one uniform per element straight into the
        // output (including the `n % 16` that the tail block overwrites) …
        for v in out.iter_mut() {
            *v = self.uniform_f32();
        }
        // … Box–Muller on every whole block in place …
        for block in out.chunks_exact_mut(16) {
            if let Ok(block) = <&mut [f32; 16]>::try_from(block) {
                box_muller_16(block);
            }
        }
        // … and a freshly drawn block laid over the last 16 elements.
        if !n.is_multiple_of(16) {
            let mut block = [0f32; 16];
            for v in block.iter_mut() {
                *v = self.uniform_f32();
            }
            box_muller_16(&mut block);
            out[n - 16..].copy_from_slice(&block);
        }
    }

    /// Fill `out` with the bf16 bit patterns of
    /// `torch.randn(out.len(), generator=g, dtype=torch.bfloat16)`.
    pub fn fill_randn_bf16(&mut self, out: &mut [u16]) {
        let n = out.len();
        if n < 16 {
            for v in out.iter_mut() {
                // `static_cast<BFloat16>(double)`: via float, then ties-to-even.
                *v = crate::numerics::bf16::from_f32(self.normal_f64() as f32);
            }
            return;
        }
        // torch's reduced-precision kernel: 16 uniforms into a float buffer per
        // block, Box–Muller in float, round each value to bf16.
        let mut block = [0f32; 16];
        let whole = n / 16 * 16;
        let tail = if n.is_multiple_of(16) { None } else { Some(n - 16) };
        for start in (0..whole).step_by(16).chain(tail) {
            for v in block.iter_mut() {
                *v = self.uniform_f32();
            }
            box_muller_16(&mut block);
            for (dst, &src) in out[start..start + 16].iter_mut().zip(&block) {
                *dst = crate::numerics::bf16::from_f32(src);
            }
        }
    }
}

/// `2π` as torch's vector kernel holds it: `2.0f * c10::pi<double>` rounded
/// to float once (0x40c90fdb).
const TWO_PI_F32: f32 = 6.283_185_5;

/// `NormalFill16<float>` (AVX2 build): Box–Muller on 16 uniforms in place,
/// pairing `j` with `j + 8`. `u1 = 1 − buf[j]` lies in (0, 1], so the log is
/// finite. The results are `r·cos θ` and `r·sin θ`, then `fma(·, std=1,
/// mean=0)` (which only turns −0 into +0).
fn box_muller_16(buf: &mut [f32; 16]) {
    for j in 0..8 {
        let u1 = 1.0 - buf[j];
        let theta = TWO_PI_F32 * buf[j + 8];
        let radius = libm::sqrtf(log_cephes(u1) * -2.0);
        let (sin, cos) = sincos_cephes(theta);
        buf[j] = libm::fmaf(radius * cos, 1.0, 0.0);
        buf[j + 8] = libm::fmaf(radius * sin, 1.0, 0.0);
    }
}

/// Cephes `logf` coefficients as `avx_mathfun.h` declares them (`cephes_log_p0`…`p8`,
/// `q1`, `q2`); the unit tests pin their f32 bit patterns to the wheel's.
const LOG_P: [f32; 9] = [
    0.070_376_836,
    -0.115_146_1,
    0.116_769_984,
    -0.124_201_41,
    0.142_493_23,
    -0.166_680_57,
    0.200_007_14,
    -0.249_999_94,
    0.333_333_3,
];
const LOG_Q1: f32 = -2.121_944_4e-4;
const LOG_Q2: f32 = 0.693_359_4; // 0.693359375 exactly

/// Cephes `sinf`/`cosf` constants of `avx_mathfun.h`: 4/π, the three-part
/// −π/4 (`minus_cephes_DP1..3`) and the two polynomials.
const FOUR_OVER_PI: f32 = 1.273_239_5;
const MINUS_DP1: f32 = -0.785_156_25;
const MINUS_DP2: f32 = -2.418_756_5e-4;
const MINUS_DP3: f32 = -3.774_895e-8;
const COS_P0: f32 = 2.443_315_7e-5;
const COS_P1: f32 = -1.388_731_6e-3;
const COS_P2: f32 = 4.166_664_6e-2;
const SIN_P0: f32 = -1.951_529_6e-4;
const SIN_P1: f32 = 8.332_161e-3;
const SIN_P2: f32 = -1.666_665_5e-1;

/// `log256_ps` from torch's `avx_mathfun.h` (Cephes `logf`), one lane, as
/// the x86-64 wheel compiles it (the polynomial and the final sums are
/// fused multiply–adds). Valid for positive, finite `x`, which is all that
/// [`box_muller_16`] passes; `x <= 0` gives NaN as in the original.
fn log_cephes(x: f32) -> f32 {
    const SQRT_HALF: f32 = core::f32::consts::FRAC_1_SQRT_2;
    if x.is_nan() || x <= 0.0 {
        return f32::NAN;
    }
    // Denormals are cut off at the smallest normal.
    let x = x.max(f32::MIN_POSITIVE);
    let bits = x.to_bits();
    // Exponent (biased by −127, plus one) and mantissa scaled into [0.5, 1).
    let mut e = ((bits >> 23) as i32 - 127) as f32 + 1.0;
    let m = f32::from_bits((bits & !0x7f80_0000) | 0x3f00_0000);
    // Below √½ use 2m − 1 and one less in the exponent, else m − 1.
    let small = m < SQRT_HALF;
    if small {
        e -= 1.0;
    }
    let x = (m + -1.0) + if small { m } else { 0.0 };
    let z = x * x;
    let mut y = LOG_P[0];
    for &p in &LOG_P[1..] {
        y = libm::fmaf(y, x, p);
    }
    y *= x;
    y = libm::fmaf(y, z, e * LOG_Q1);
    y = libm::fmaf(-z, 0.5, y);
    libm::fmaf(e, LOG_Q2, x + y)
}

/// `sincos256_ps` from torch's `avx_mathfun.h` (Cephes `sinf`/`cosf`), one
/// lane, as the x86-64 wheel compiles it. Returns `(sin, cos)`.
///
/// The argument is reduced by the octant `j` (rounded up to even) with the
/// three-part π/4 (as FMAs), both polynomials are evaluated and the pair is
/// selected, and the signs are patched in with XOR, all in the original order.
/// Accurate for |θ| up to about 8192, far beyond the [0, 2π) it gets here.
fn sincos_cephes(theta: f32) -> (f32, f32) {
    const SIGN: u32 = 0x8000_0000;

    let mut sign_sin = theta.to_bits() & SIGN;
    let mut x = f32::from_bits(theta.to_bits() & !SIGN);
    // Octant index, truncated, then rounded up to even.
    let j = ((x * FOUR_OVER_PI) as i32).wrapping_add(1) & !1;
    let y = j as f32;
    sign_sin ^= ((j & 4) as u32) << 29;
    let sign_cos = ((!j.wrapping_sub(2) & 4) as u32) << 29;
    // In octants 0 and 3 (mod 4) `ys` is the sine and `yc` the cosine; in the
    // others they swap.
    let sine_poly_is_sine = j & 2 == 0;
    x = libm::fmaf(y, MINUS_DP1, x);
    x = libm::fmaf(MINUS_DP2, y, x);
    x = libm::fmaf(y, MINUS_DP3, x);
    let z = x * x;
    let half_z = z * 0.5;
    let mut yc = libm::fmaf(COS_P0, z, COS_P1);
    yc = libm::fmaf(yc, z, COS_P2);
    yc = libm::fmaf(z, z * yc, -half_z) + 1.0;
    let mut ys = libm::fmaf(SIN_P0, z, SIN_P1);
    ys = libm::fmaf(ys, z, SIN_P2);
    ys = libm::fmaf(x, z * ys, x);
    // The masked select, with its exact sums and differences (they only
    // matter for the sign of a zero).
    let (sin_from_c, sin_from_s) = if sine_poly_is_sine { (0.0, ys) } else { (yc, 0.0) };
    let sin = sin_from_c + sin_from_s;
    let cos = (ys - sin_from_s) + (yc - sin_from_c);
    (f32::from_bits(sin.to_bits() ^ sign_sin), f32::from_bits(cos.to_bits() ^ sign_cos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_matches_the_reference_stream() {
        // The classic checks: seed 5489 starts 3499211612, 581869302, and its
        // 10000th output is 4123659995 (C++ `std::mt19937` requirement).
        let mut mt = Mt19937::new(5489);
        assert_eq!(mt.next_u32(), 3_499_211_612);
        assert_eq!(mt.next_u32(), 581_869_302);
        for _ in 2..9999 {
            mt.next_u32();
        }
        assert_eq!(mt.next_u32(), 4_123_659_995);
    }

    #[test]
    fn seeds_use_their_low_32_bits() {
        let mut a = TorchGenerator::new((1 << 32) + 7);
        let mut b = TorchGenerator::new(7);
        assert_eq!(a.initial_seed(), (1 << 32) + 7);
        for _ in 0..100 {
            assert_eq!(a.next_u32(), b.next_u32());
        }
    }

    fn bits<const N: usize>(v: &[f32; N]) -> [u32; N] {
        v.map(f32::to_bits)
    }

    // Values printed by torch 2.15.0 (x86-64) for manual_seed(0).
    #[test]
    fn randn_f32_16_seed_0() {
        let mut out = [0f32; 16];
        TorchGenerator::new(0).fill_randn_f32(&mut out);
        let want = [
            0xbf901b85, 0xbf93808a, 0xbe804bd6, 0xbede255d, 0x3f594515, 0x3f312783, 0xbea1cc6d, 0xc0075fc1, 0x3ea50138,
            0xbfa1b4f4, 0x3eb330ff, 0x3e9dc3bb, 0x3df56f77, 0x3f9e6b93, 0x3f8ef28e, 0xbe7d367c,
        ];
        assert_eq!(bits(&out), want);
    }

    #[test]
    fn randn_f32_17_seed_0_overlaps_the_tail() {
        let mut out = [0f32; 17];
        TorchGenerator::new(0).fill_randn_f32(&mut out);
        let want = [
            0xbf901b85, 0xbfd91446, 0x3f111004, 0x3f4b235d, 0x3f194d8b, 0xbfc70d5b, 0xbeaec6ca, 0x3fed2f4e, 0x3eefaa55,
            0xbf15e32b, 0xbe318eeb, 0x3e3be1a4, 0x3fb1d6c0, 0x3fcb0d00, 0x3f72409c, 0xbf57fb33, 0x3f6e8c30,
        ];
        assert_eq!(bits(&out), want);
    }

    #[test]
    fn randn_small_uses_the_scalar_path_and_its_cache() {
        let mut g = TorchGenerator::new(0);
        let mut out = [0f32; 3];
        g.fill_randn_f32(&mut out);
        assert_eq!(bits(&out), [0x3fc53f5c, 0xbe963c50, 0xc00b7149]);
        // Three samples leave the sine of the second pair cached.
        assert!(g.next_normal.is_some());
        // A vectorised draw neither uses nor clears it.
        let mut big = [0f32; 16];
        g.fill_randn_f32(&mut big);
        assert!(g.next_normal.is_some());
    }

    #[test]
    fn randn_bf16_seed_0_and_42() {
        let mut out = [0u16; 17];
        TorchGenerator::new(0).fill_randn_bf16(&mut out);
        let want = [
            0xbf90, 0xbfad, 0xbfd9, 0x3f11, 0x3f4b, 0x3f19, 0xbfc7, 0xbeaf, 0x3fed, 0x3f40, 0xbf16, 0xbe32, 0x3e3c,
            0x3fb2, 0x3fcb, 0x3f72, 0xbf58,
        ];
        assert_eq!(out, want);
        let mut out = [0u16; 5];
        TorchGenerator::new(42).fill_randn_bf16(&mut out);
        assert_eq!(out, [0x3eac, 0x3e04, 0x3e70, 0x3e6c, 0xbf90]);
    }

    #[test]
    fn empty_output_draws_nothing() {
        let mut g = TorchGenerator::new(3);
        g.fill_randn_f32(&mut []);
        g.fill_randn_bf16(&mut []);
        assert_eq!(g.next_u32(), TorchGenerator::new(3).next_u32());
    }

    #[test]
    fn constants_have_the_bits_of_the_torch_wheel() {
        // Read from the `.rodata` of libtorch_cpu.so (torch 2.15.0, x86-64).
        let log: [u32; 9] = [
            0x3d9021bb, 0xbdebd1b8, 0x3def251a, 0xbdfe5d4f, 0x3e11e9bf, 0xbe2aae50, 0x3e4cceac, 0xbe7ffffc, 0x3eaaaaaa,
        ];
        assert_eq!(LOG_P.map(f32::to_bits), log);
        assert_eq!([LOG_Q1, LOG_Q2].map(f32::to_bits), [0xb95e8083, 0x3f318000]);
        let trig = [FOUR_OVER_PI, MINUS_DP1, MINUS_DP2, MINUS_DP3, COS_P0, COS_P1, COS_P2, SIN_P0, SIN_P1, SIN_P2];
        let want = [
            0x3fa2f983, 0xbf490000, 0xb97da000, 0xb3222169, 0x37ccf5ce, 0xbab6061a, 0x3d2aaaa5, 0xb94ca1f9, 0x3c08839e,
            0xbe2aaaa3,
        ];
        assert_eq!(trig.map(f32::to_bits), want);
        assert_eq!(TWO_PI_F32.to_bits(), 0x40c90fdb);
    }

    #[test]
    fn cephes_functions_are_close_to_libm() {
        for i in 1..=4096u32 {
            let x = i as f32 / 4096.0;
            assert!((log_cephes(x) - libm::logf(x)).abs() <= 2e-7 * libm::logf(x).abs().max(1.0));
            let t = x * TWO_PI_F32;
            let (s, c) = sincos_cephes(t);
            assert!((s - libm::sinf(t)).abs() < 3e-7 && (c - libm::cosf(t)).abs() < 3e-7, "{t}");
        }
    }
}
