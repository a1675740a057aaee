//! Inpainting and image-to-image as `Flux2KleinInpaintPipeline` runs them:
//! the init image is encoded (it is also the first reference), the schedule
//! starts `strength` of the way from its end (`get_timesteps`), the start is
//! the init latents noised to that point (`scale_noise`), and after each step
//! the latents outside the mask are put back to the init latents noised to
//! the next step's level (to the init latents themselves after the last).
//! The mask is the file in grey, binarized, bilinearly interpolated to the
//! token grid; white repaints. Without a mask every token is repainted:
//! image-to-image.

use super::reference_image::{self, SourceMode};
use super::resample::Pixels;
use crate::error::RunError;
use crate::request::RequestError;
use std::path::Path;

/// A mask at the init image's size: 1 where the image is repainted, else 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Mask {
    /// Its file or field, for errors.
    pub name: String,
    pub width: usize,
    pub height: usize,
    pub values: Vec<f32>,
}

/// Loads a mask file for a `width × height` init image.
pub fn load_mask(path: &Path, width: usize, height: usize) -> Result<Mask, RunError> {
    let (mode, pixels) = reference_image::decode(path)?;
    Ok(prepare_mask(&path.display().to_string(), mode, pixels, width, height))
}

/// A mask sent as file bytes, named `label` in errors.
pub fn mask_from_bytes(label: &str, bytes: &[u8], width: usize, height: usize) -> Result<Mask, RunError> {
    let (mode, pixels) = reference_image::decode_bytes(label, bytes)?;
    Ok(prepare_mask(label, mode, pixels, width, height))
}

/// A mask as OpenAI's image edits send it: a PNG whose transparent pixels
/// are repainted (grey `255 − alpha`, then as [`prepare_mask`]).
pub fn mask_from_alpha(label: &str, bytes: &[u8], width: usize, height: usize) -> Result<Mask, RunError> {
    let (mode, pixels) = reference_image::decode_bytes(label, bytes)?;
    if !matches!(mode, SourceMode::Rgba | SourceMode::GrayAlpha) {
        let why = "has no alpha channel; its transparent pixels are what is repainted".to_string();
        return Err(RunError::Request(RequestError::Mask { name: label.to_string(), why }));
    }
    let alpha = pixels.channels - 1;
    let grey: Vec<u8> = pixels.data.chunks(pixels.channels).map(|px| 255 - px[alpha]).collect();
    Ok(prepare_mask(label, SourceMode::Gray, Pixels::new(pixels.width, pixels.height, 1, grey), width, height))
}

/// The mask processor: resized in the file's own mode (LANCZOS) when its
/// size differs, converted to grey (`convert("L")`), divided by 255 and
/// binarized at 0.5.
fn prepare_mask(name: &str, mode: SourceMode, pixels: Pixels, width: usize, height: usize) -> Mask {
    let sized = match (pixels.width, pixels.height) == (width, height) {
        true => pixels,
        false => reference_image::resize(pixels, mode, width, height),
    };
    binarized(name, &sized)
}

/// A mask at its size: grey (`convert("L")`), divided by 255, binarized at 0.5.
pub(crate) fn binarized(name: &str, sized: &Pixels) -> Mask {
    let values = sized.data.chunks(sized.channels).map(|px| if luma(px) as f32 / 255.0 >= 0.5 { 1.0 } else { 0.0 }).collect();
    Mask { name: name.to_string(), width: sized.width, height: sized.height, values }
}

/// `convert("L")` of a whole image.
pub(crate) fn grey(p: &Pixels) -> Pixels {
    Pixels::new(p.width, p.height, 1, p.data.chunks(p.channels).map(luma).collect())
}

/// PIL's `convert("L")` of one pixel: ITU-R 601-2 luma in 16-bit fixed
/// point, rounded; grey stays grey, alpha is dropped.
fn luma(px: &[u8]) -> u8 {
    match px.len() {
        1 | 2 => px[0],
        _ => ((px[0] as u32 * 19595 + px[1] as u32 * 38470 + px[2] as u32 * 7471 + 0x8000) >> 16) as u8,
    }
}

/// The mask on the `rows × cols` token grid: `F.interpolate(mode="bilinear")`
/// (half-pixel centres, no antialiasing), as `prepare_mask_latents` takes it.
pub fn token_mask(mask: &Mask, rows: usize, cols: usize) -> Vec<f32> {
    let (h, w) = (mask.height, mask.width);
    let ys: Vec<(usize, usize, f32)> = (0..rows).map(|r| source(r, h, rows)).collect();
    let xs: Vec<(usize, usize, f32)> = (0..cols).map(|c| source(c, w, cols)).collect();
    let at = |y: usize, x: usize| mask.values[y * w + x];
    let mut out = Vec::with_capacity(rows * cols);
    for &(y0, y1, ly) in &ys {
        for &(x0, x1, lx) in &xs {
            let top = (1.0 - lx) * at(y0, x0) + lx * at(y0, x1);
            let bottom = (1.0 - lx) * at(y1, x0) + lx * at(y1, x1);
            out.push((1.0 - ly) * top + ly * bottom);
        }
    }
    out
}

/// Torch's source index for output `i` of `output` over `input` samples
/// (align_corners=False): `(i + 0.5)·input/output − 0.5`, clamped at 0;
/// the two neighbours and the weight of the second.
fn source(i: usize, input: usize, output: usize) -> (usize, usize, f32) {
    let scale = input as f32 / output as f32;
    let real = (scale * (i as f32 + 0.5) - 0.5).max(0.0);
    let i0 = (real as usize).min(input - 1);
    let i1 = (i0 + 1).min(input - 1);
    (i0, i1, real - i0 as f32)
}

/// The step the schedule starts from: `int(max(steps − min(steps·strength, steps), 0))`.
pub fn first_step(steps: usize, strength: f64) -> usize {
    let init = (steps as f64 * strength).min(steps as f64);
    (steps as f64 - init).max(0.0) as usize
}

/// `scale_noise`: `σ·noise + (1 − σ)·x0`, in f32 as torch computes it.
pub fn noised(sigma: f32, noise: &[f32], x0: &[f32]) -> Vec<f32> {
    noise.iter().zip(x0).map(|(&n, &x)| sigma * n + (1.0 - sigma) * x).collect()
}

/// After a step: `(1 − m)·init + m·latents` per token, where `init` is `x0`
/// noised to `sigma_next` (`None` after the last step: `x0` itself).
pub fn keep_unmasked(latents: &mut [f32], x0: &[f32], noise: &[f32], mask: &[f32], sigma_next: Option<f32>) {
    let channels = latents.len() / mask.len().max(1);
    let init = match sigma_next {
        Some(sigma) => noised(sigma, noise, x0),
        None => x0.to_vec(),
    };
    for (t, &m) in mask.iter().enumerate() {
        let row = t * channels..(t + 1) * channels;
        for (l, &i) in latents[row.clone()].iter_mut().zip(&init[row]) {
            *l = (1.0 - m) * i + m * *l;
        }
    }
}

/// A mask that does not fit its init image is refused, naming it.
pub(crate) fn check_mask(mask: &Mask, width: usize, height: usize) -> Result<(), RequestError> {
    if (mask.width, mask.height) != (width, height) || mask.values.len() != width * height {
        return Err(RequestError::Mask { name: mask.name.clone(), why: format!("{}×{}, but the init image is {width}×{height}", mask.width, mask.height) });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_starts_where_diffusers_starts_it() {
        // get_timesteps: int(max(N − min(N·s, N), 0)).
        assert_eq!(first_step(4, 0.5), 2);
        assert_eq!(first_step(3, 0.6), 1);
        assert_eq!(first_step(2, 0.75), 0);
        assert_eq!(first_step(10, 1.0), 0);
        assert_eq!(first_step(10, 0.05), 9);
        assert_eq!(first_step(4, 0.1), 3);
    }

    #[test]
    fn grey_is_pils_luma() {
        assert_eq!(luma(&[255, 255, 255]), 255);
        assert_eq!(luma(&[0, 0, 0, 255]), 0);
        // 0.299·200 + 0.587·100 + 0.114·50 = 124.2
        assert_eq!(luma(&[200, 100, 50]), 124);
        assert_eq!(luma(&[77, 9]), 77);
    }
}
