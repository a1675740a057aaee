//! The VAE decoder's two ends: packed latents to its input (BatchNorm
//! de-normalisation and unpatchify), its output to the image's 8-bit
//! levels, against core's reference.

use super::{poisoned, rel_l2, run_and_read, Rng};
use crate::kernels::vae::{denorm_unpatchify, pixel_levels, LatentStats};
use crate::{Gpu, GpuError, Mat, Weight};
use flux_lite_core::ir::level_words;
use flux_lite_core::oracle::{self as r, Weights};

/// The VAE's first step: packed latents `[h·w, 4·c]` de-normalised by the
/// BatchNorm statistics (bf16 or f32) and unpatchified to `[c, 2h, 2w]`.
pub fn check_denorm_unpatchify(gpu: &Gpu, [channels, height, width]: [usize; 3], bf16: bool, seed: u64) -> Result<f64, GpuError> {
    let mut rng = Rng::new(seed);
    let n = 4 * channels * height * width;
    let packed = rng.normals(n, 1.0);
    let (mean_bits, var_bits) = (rng.bf16s(4 * channels, 0.5), rng.bf16s(4 * channels, 1.0));
    // Variances must be positive.
    let var_bits: Vec<u16> = var_bits.iter().map(|&b| b & 0x7fff).collect();
    let mean_f: Vec<f32> = rng.normals(4 * channels, 0.5);
    let var_f: Vec<f32> = rng.normals(4 * channels, 1.0).iter().map(|v| v.abs() + 0.5).collect();
    let (mean_ref, var_ref) = if bf16 { (Weights::Bf16(&mean_bits), Weights::Bf16(&var_bits)) } else { (Weights::F32(&mean_f), Weights::F32(&var_f)) };
    let eps = 1e-4f32;
    let mut want = vec![0.0; n];
    r::denorm_unpatchify(&packed, mean_ref, var_ref, [channels, height, width], eps as f64, &mut want);
    let pb = gpu.upload_f32("packed", &packed);
    let (mb, vb) = if bf16 { (gpu.upload_bf16("mean", &mean_bits), gpu.upload_bf16("var", &var_bits)) } else { (gpu.upload_f32("mean", &mean_f), gpu.upload_f32("var", &var_f)) };
    let weight = |buf| if bf16 { Weight::bf16(buf) } else { Weight::f32(buf) };
    let out = poisoned(gpu, n);
    let got = run_and_read(gpu, &out, n, |enc| {
        let stats = LatentStats { mean: weight(&mb), var: weight(&vb), eps };
        let (c, h, w) = (channels as u64, height as u64, width as u64);
        denorm_unpatchify(gpu, enc, Mat::new(&pb, 4 * c), stats, Mat::new(&out, 4 * h * w), [c, h, w])
    })?;
    Ok(rel_l2(&got, &want))
}

/// The 8-bit levels `round(clamp(x/2 + 1/2, 0, 1)·255)` of random values,
/// values beyond both ends, and values whose level lands on a half (ties to
/// even), exact: bytes four to a word, written a few words into the buffer,
/// the last word's unused bytes zero and the word after it untouched (the
/// relative L2 of every byte from the first level's word to that one).
pub fn check_pixel_levels(gpu: &Gpu) -> Result<f64, GpuError> {
    let mut x = Rng::new(62).normals(1001, 0.8);
    x.extend([-3.0, 3.0, -1.0, 1.0, 0.0, -0.494_117_65, -0.486_274_5, 0.25]);
    let (n, at) = (x.len(), 3);
    let words = level_words(n as u64) as usize;
    let poison = poisoned(gpu, at + words + 1);
    // The levels, the last word's unused bytes, then the poison's bytes.
    let mut want: Vec<f64> = x.iter().map(|&v| r::pixel_level(v)).collect();
    want.resize(4 * words, 0.0);
    want.extend(f32::NAN.to_le_bytes().map(f64::from));
    let xb = gpu.upload_f32("decoded", &x);
    gpu.submit(|enc| pixel_levels(gpu, enc, Mat::new(&xb, 0), Mat { buf: &poison, offset: at as u64, stride: 0 }, n as u64))?;
    let got: Vec<f32> = gpu.read_bytes(&poison, 4 * at as u64, 4 * (words as u64 + 1))?.into_iter().map(f32::from).collect();
    Ok(rel_l2(&got, &want))
}
