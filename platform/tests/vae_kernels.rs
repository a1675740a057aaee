//! The VAE decoder's own kernels against core's reference, on odd sizes with
//! poisoned outputs: de-normalise + unpatchify, and the 8-bit levels.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use flux_lite_core::reference::{self as r, Weights};
use flux_lite_platform::ops::{self, LatentStats, Mat, Weight};

fn check_denorm_unpatchify(channels: usize, height: usize, width: usize, bf16: bool, seed: u64) {
    let gpu = gpu();
    let mut rng = Rng::new(seed);
    let n = 4 * channels * height * width;
    let packed = rng.normals(n, 1.0);
    let (mean_bits, var_bits) = (rng.bf16s(4 * channels, 0.5), rng.bf16s(4 * channels, 1.0));
    // Variances must be positive.
    let var_bits: Vec<u16> = var_bits.iter().map(|&b| b & 0x7fff).collect();
    let mean_f: Vec<f32> = rng.normals(4 * channels, 0.5);
    let var_f: Vec<f32> = rng.normals(4 * channels, 1.0).iter().map(|v| v.abs() + 0.5).collect();
    let (mean_ref, var_ref) =
        if bf16 { (Weights::Bf16(&mean_bits), Weights::Bf16(&var_bits)) } else { (Weights::F32(&mean_f), Weights::F32(&var_f)) };
    let eps = 1e-4f32;
    let mut want = vec![0.0; n];
    r::denorm_unpatchify(&packed, mean_ref, var_ref, channels, height, width, eps as f64, &mut want);

    let pb = gpu.upload_f32("packed", &packed);
    let (mb, vb) = if bf16 {
        (gpu.upload_bf16("mean", &mean_bits), gpu.upload_bf16("var", &var_bits))
    } else {
        (gpu.upload_f32("mean", &mean_f), gpu.upload_f32("var", &var_f))
    };
    let weight = |buf| if bf16 { Weight::bf16(buf) } else { Weight::f32(buf) };
    let out = poisoned(gpu, n);
    let got = run_and_read(gpu, &out, n, |enc| {
        let stats = LatentStats { mean: weight(&mb), var: weight(&vb), eps };
        let (c, h, w) = (channels as u64, height as u64, width as u64);
        ops::denorm_unpatchify(gpu, enc, Mat::new(&pb, 4 * c), stats, Mat::new(&out, 4 * h * w), c, h, w)
    });
    assert_close(&format!("denorm_unpatchify {channels}×{height}×{width} bf16={bf16}"), &got, &want, F32_TOL);
}

#[test]
fn denorm_unpatchify_with_bf16_statistics() {
    check_denorm_unpatchify(3, 5, 7, true, 60);
}

#[test]
fn denorm_unpatchify_with_f32_statistics() {
    check_denorm_unpatchify(5, 3, 9, false, 61);
}

#[test]
fn pixel_levels_match_diffusers_rounding_exactly() {
    let gpu = gpu();
    let mut x = Rng::new(62).normals(1001, 0.8);
    // Clamped at both ends, and values whose level lands exactly on a half (ties go to even).
    x.extend([-3.0, 3.0, -1.0, 1.0, 0.0, -0.494_117_65, -0.486_274_5]);
    let want: Vec<f64> = x.iter().map(|&v| r::pixel_level(v)).collect();
    let n = x.len();
    let (xb, out) = (gpu.upload_f32("decoded", &x), poisoned(gpu, n));
    let got = run_and_read(gpu, &out, n, |enc| ops::pixel_levels(gpu, enc, Mat::new(&xb, 0), Mat::new(&out, 0), n as u64));
    assert_close("pixel levels", &got, &want, 0.0);
    assert!(want.iter().all(|&v| (0.0..=255.0).contains(&v) && v.fract() == 0.0));
}
