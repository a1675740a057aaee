//! Latent previews: the latents of a run in progress as an RGB image, by a
//! fixed linear map from the VAE's latent channels to RGB (a bias plus one
//! `[r, g, b]` row per channel), at the latent grid's resolution and
//! enlarged to the image's by repeating pixels. Cheap enough to run after
//! every step; not the decoder's image, a view of where it is going.

/// A latent-to-RGB map: one row per latent channel, and a bias. Its output
/// is in [-1, 1] (as the decoder's), shown as `(v + 1) / 2` in 8 bits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatentRgb<'a> {
    pub factors: &'a [[f32; 3]],
    pub bias: [f32; 3],
}

/// FLUX.2's VAE (32 latent channels), on the transformer's normalised
/// latents: the factors ComfyUI uses for its FLUX.2 previews
/// (`comfy/latent_formats.py`, class `Flux2`, `latent_rgb_factors` and
/// `latent_rgb_factors_bias`), cited as published.
pub const FLUX2: LatentRgb<'static> = LatentRgb {
    factors: &[
        [0.0058, 0.0113, 0.0073],
        [0.0495, 0.0443, 0.0836],
        [-0.0099, 0.0096, 0.0644],
        [0.2144, 0.3009, 0.3652],
        [0.0166, -0.0039, -0.0054],
        [0.0157, 0.0103, -0.0160],
        [-0.0398, 0.0902, -0.0235],
        [-0.0052, 0.0095, 0.0109],
        [-0.3527, -0.2712, -0.1666],
        [-0.0301, -0.0356, -0.0180],
        [-0.0107, 0.0078, 0.0013],
        [0.0746, 0.0090, -0.0941],
        [0.0156, 0.0169, 0.0070],
        [-0.0034, -0.0040, -0.0114],
        [0.0032, 0.0181, 0.0080],
        [-0.0939, -0.0008, 0.0186],
        [0.0018, 0.0043, 0.0104],
        [0.0284, 0.0056, -0.0127],
        [-0.0024, -0.0022, -0.0030],
        [0.1207, -0.0026, 0.0065],
        [0.0128, 0.0101, 0.0142],
        [0.0137, -0.0072, -0.0007],
        [0.0095, 0.0092, -0.0059],
        [0.0000, -0.0077, -0.0049],
        [-0.0465, -0.0204, -0.0312],
        [0.0095, 0.0012, -0.0066],
        [0.0290, -0.0034, 0.0025],
        [0.0220, 0.0169, -0.0048],
        [-0.0332, -0.0457, -0.0468],
        [-0.0085, 0.0389, 0.0609],
        [-0.0076, 0.0003, -0.0043],
        [-0.0111, -0.0460, -0.0614],
    ],
    bias: [-0.0329, -0.0718, -0.0851],
};

/// Why a preview cannot be drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreviewError {
    /// The packed latents are not `grid_h · grid_w` tokens of `4 · channels`.
    Shape { values: usize, expected: usize },
    /// `out` is not `(2·grid_h·enlarge) × (2·grid_w·enlarge) × 3` bytes.
    Output { bytes: usize, expected: usize },
}

/// The preview of packed latents `[grid_h · grid_w, 4 · C]` (each token's
/// channels in diffusers' order: channel c's 2×2 patch at `4c + 2·dy + dx`)
/// under `map` (C rows), each latent pixel repeated `enlarge` times in both
/// directions, into `out` (RGB, row-major).
pub fn draw(packed: &[f32], (grid_h, grid_w): (usize, usize), map: &LatentRgb<'_>, enlarge: usize, out: &mut [u8]) -> Result<(), PreviewError> {
    check_packed(packed, (grid_h, grid_w), map)?;
    let (height, width) = (2 * grid_h * enlarge, 2 * grid_w * enlarge);
    if out.len() != height * width * 3 {
        return Err(PreviewError::Output { bytes: out.len(), expected: height * width * 3 });
    }
    for y in 0..2 * grid_h {
        for x in 0..2 * grid_w {
            let level = pixel(packed, grid_w, map, y, x);
            for dy in 0..enlarge {
                let line = (y * enlarge + dy) * width;
                for dx in 0..enlarge {
                    let at = 3 * (line + x * enlarge + dx);
                    out[at..at + 3].copy_from_slice(&level);
                }
            }
        }
    }
    Ok(())
}

/// The preview at the latent's own resolution, `2·grid_h × 2·grid_w` RGB
/// levels, row-major, into `out`: what a GPU computes (`latent_preview`)
/// before the host enlarges it.
pub fn levels_into(packed: &[f32], (grid_h, grid_w): (usize, usize), map: &LatentRgb<'_>, out: &mut [u8]) -> Result<(), PreviewError> {
    check_packed(packed, (grid_h, grid_w), map)?;
    let expected = 12 * grid_h * grid_w;
    if out.len() != expected {
        return Err(PreviewError::Output { bytes: out.len(), expected });
    }
    for y in 0..2 * grid_h {
        for x in 0..2 * grid_w {
            out[3 * (y * 2 * grid_w + x)..][..3].copy_from_slice(&pixel(packed, grid_w, map, y, x));
        }
    }
    Ok(())
}

fn check_packed(packed: &[f32], (grid_h, grid_w): (usize, usize), map: &LatentRgb<'_>) -> Result<(), PreviewError> {
    let expected = grid_h * grid_w * 4 * map.factors.len();
    match packed.len() == expected {
        true => Ok(()),
        false => Err(PreviewError::Shape { values: packed.len(), expected }),
    }
}

/// Latent pixel `(y, x)`'s levels: the bias, then each channel's row times
/// its value, summed in channel order.
fn pixel(packed: &[f32], grid_w: usize, map: &LatentRgb<'_>, y: usize, x: usize) -> [u8; 3] {
    let channels = map.factors.len();
    let token = &packed[((y / 2) * grid_w + x / 2) * 4 * channels..][..4 * channels];
    let patch = 2 * (y % 2) + x % 2;
    let mut rgb = map.bias;
    for (c, row) in map.factors.iter().enumerate() {
        let z = token[4 * c + patch];
        for (v, f) in rgb.iter_mut().zip(row) {
            *v += f * z;
        }
    }
    rgb.map(to_level)
}

/// Latent-resolution levels (`height × width` RGB) with each pixel repeated
/// `enlarge` times in both directions, into `out`.
pub fn enlarge_into(small: &[u8], (height, width): (usize, usize), enlarge: usize, out: &mut [u8]) -> Result<(), PreviewError> {
    let expected = height * enlarge * width * enlarge * 3;
    if out.len() != expected || small.len() != height * width * 3 {
        return Err(PreviewError::Output { bytes: out.len(), expected });
    }
    let row_bytes = width * enlarge * 3;
    for y in 0..height {
        let first = y * enlarge * row_bytes;
        for x in 0..width {
            for dx in 0..enlarge {
                out[first + 3 * (x * enlarge + dx)..][..3].copy_from_slice(&small[3 * (y * width + x)..][..3]);
            }
        }
        for dy in 1..enlarge {
            out.copy_within(first..first + row_bytes, first + dy * row_bytes);
        }
    }
    Ok(())
}

/// A value in [-1, 1] as an 8-bit level, as the decoder's output is shown.
fn to_level(v: f32) -> u8 {
    let unit = ((v + 1.0) * 0.5).clamp(0.0, 1.0);
    (unit * 255.0 + 0.5) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_patch_position_lands_on_its_pixel_and_is_enlarged() {
        // Two channels, one token: channel 0 drives red, channel 1 green.
        let map = LatentRgb { factors: &[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], bias: [0.0, 0.0, -1.0] };
        // Channel c's patch (dy, dx) at 4c + 2dy + dx: red -1, 0, 1, 0.5 over the patch; green 1 at (1, 0).
        let packed = [-1.0, 0.0, 1.0, 0.5, 0.0, 0.0, 1.0, 0.0];
        let mut out = [0u8; 4 * 4 * 3];
        draw(&packed, (1, 1), &map, 2, &mut out).unwrap();
        let pixel = |y: usize, x: usize| [out[3 * (y * 4 + x)], out[3 * (y * 4 + x) + 1], out[3 * (y * 4 + x) + 2]];
        // (v + 1) / 2 in 8 bits: -1 → 0, 0 → 128, 1 → 255, 0.5 → 191.
        assert_eq!(pixel(0, 0), [0, 128, 0]);
        assert_eq!(pixel(1, 1), [0, 128, 0]);
        assert_eq!(pixel(0, 2), [128, 128, 0]);
        assert_eq!(pixel(2, 0), [255, 255, 0]);
        assert_eq!(pixel(3, 3), [191, 128, 0]);
    }

    #[test]
    fn wrong_sizes_are_errors() {
        let mut out = [0u8; 12];
        assert_eq!(draw(&[0.0; 7], (1, 1), &FLUX2, 1, &mut out), Err(PreviewError::Shape { values: 7, expected: 128 }));
        assert_eq!(draw(&[0.0; 128], (1, 1), &FLUX2, 2, &mut out), Err(PreviewError::Output { bytes: 12, expected: 48 }));
        assert_eq!(FLUX2.factors.len(), 32);
    }
}
