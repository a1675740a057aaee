//! The known-answer product `auto` runs before it takes a half tier: some
//! drivers advertise cooperative matrices (or f16) and compute them wrongly,
//! so a tier is trusted only after it reproduces an exact answer on the
//! device itself.
//!
//! The product is `linear` on small integers, with one row of x scaled far
//! above f16's range and one far below its normal range (both by powers of
//! two), at sizes off every tile edge and past a GEMM block in both
//! dimensions (a block is 128 × 128 with 16×16 tiles): every operand and every partial sum
//! is exact in f16 and f32 under the range rule, so the answer is known to
//! the last bit and any difference is the driver's.

use crate::device::Gpu;
use crate::error::GpuError;
use crate::kernels::linear::{linear, Gemm};
use crate::view::{Mat, Weight};

/// Why a probe did not pass.
#[derive(Debug)]
pub enum ProbeError {
    /// The device failed to run it at all.
    Gpu(GpuError),
    /// It ran and gave a wrong answer (which element, got, want).
    Wrong(String),
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeError::Gpu(e) => write!(f, "it could not run: {e}"),
            ProbeError::Wrong(why) => f.write_str(why),
        }
    }
}

/// More rows and columns than a block of 16×16 tiles holds (two blocks
/// each way, the second ragged; three with 8×8 tiles), so a driver wrong
/// past the first workgroup fails here, not only in `selftest`.
const M: usize = 141;
const N: usize = 150;
const K: usize = 40;
/// Row 1 of x is scaled by 2²⁰ (past f16's 65504), row 2 by 2⁻²⁰ (below its smallest normal).
const ROW_SCALES: [(usize, f32); 2] = [(1, 1048576.0), (2, 1.0 / 1048576.0)];

fn small_int(i: usize, mul: usize) -> f32 {
    ((i * mul + i / 7) % 7) as f32 - 3.0
}

/// The probe's inputs: x `[M, K]` f32, W `[N, K]` as bf16 bits.
fn inputs() -> (Vec<f32>, Vec<u16>) {
    let mut x: Vec<f32> = (0..M * K).map(|i| small_int(i, 5)).collect();
    for (row, scale) in ROW_SCALES {
        x[row * K..][..K].iter_mut().for_each(|v| *v *= scale);
    }
    // Small integers are exact in bf16: the top half of their f32 bits.
    let w = (0..N * K).map(|i| (small_int(i, 3).to_bits() >> 16) as u16).collect();
    (x, w)
}

/// The exact answer, summed in f64 (every value is exact in f32).
fn answer(x: &[f32], w: &[u16]) -> Vec<f32> {
    let wv = |i: usize| f32::from_bits((w[i] as u32) << 16) as f64;
    (0..M * N).map(|e| (0..K).map(|t| x[(e / N) * K + t] as f64 * wv((e % N) * K + t)).sum::<f64>() as f32).collect()
}

/// Runs the probe on `gpu`'s current tier.
pub fn known_answer(gpu: &Gpu) -> Result<(), ProbeError> {
    let (x, w) = inputs();
    let want = answer(&x, &w);
    let (xb, wb, yb) = (gpu.upload_f32("probe x", &x), gpu.upload_bf16("probe w", &w), gpu.storage("probe y", (M * N * 4) as u64));
    let gemm = Gemm { m: M as u64, n: N as u64, k: K as u64 };
    gpu.submit(|enc| linear(gpu, enc, Mat::new(&xb, K as u64), Weight::bf16(&wb), None, Mat::new(&yb, N as u64), gemm)).map_err(ProbeError::Gpu)?;
    let got = gpu.read_f32(&yb, 0, M * N).map_err(ProbeError::Gpu)?;
    #[cfg(any(test, feature = "test-support"))]
    if gpu.faults().failing_probe == Some(gpu.precision()) {
        return Err(ProbeError::Wrong("the options inject a failing probe on this tier".into()));
    }
    check(&got, &want)
}

/// The first element of `got` that is not exactly `want`'s.
fn check(got: &[f32], want: &[f32]) -> Result<(), ProbeError> {
    match got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits()) {
        None => Ok(()),
        Some(i) => Err(ProbeError::Wrong(format!("y[{}, {}] = {}, the exact answer is {}", i / N, i % N, got[i], want[i]))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inputs_need_the_range_rule_and_stay_exact() {
        let (x, w) = inputs();
        let largest = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let smallest = x.iter().filter(|v| **v != 0.0).fold(f32::MAX, |a, v| a.min(v.abs()));
        assert!(largest > 65504.0 && smallest < 6.1e-5, "{largest} {smallest}");
        let want = answer(&x, &w);
        assert!(want.iter().all(|v| v.is_finite()) && want.iter().any(|v| v.abs() > 65504.0));
        // Every output is a multiple of its row's scale below 2²⁴ of it: exact in f32.
        for (e, v) in want.iter().enumerate() {
            let scale = ROW_SCALES.iter().find(|(r, _)| *r == e / N).map_or(1.0, |(_, s)| *s);
            let units = v / scale;
            assert!(units.fract() == 0.0 && units.abs() < (1 << 24) as f32);
        }
    }

    #[test]
    fn one_wrong_bit_fails_the_check() {
        let want = vec![1.0f32, -2.0, 3.0];
        assert!(check(&want, &want).is_ok());
        let mut got = want.clone();
        got[2] = f32::from_bits(got[2].to_bits() + 1);
        match check(&got, &want) {
            Err(ProbeError::Wrong(why)) => assert!(why.contains("y[0, 2]"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_tier_this_adapter_offers_passes_the_probe() {
        let (half, matrix) = (crate::testing::half_gpu(), crate::testing::matrix_gpu());
        for gpu in [Some(crate::testing::gpu()), half.as_ref(), matrix.as_ref()].into_iter().flatten() {
            known_answer(gpu).unwrap_or_else(|e| panic!("{} tier: {e:?}", gpu.precision().name()));
            println!("{} tier: the probe passes on {}", gpu.precision().name(), gpu.describe());
        }
    }
}
