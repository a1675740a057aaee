//! Reference images for editing, prepared as `Flux2KleinPipeline` prepares
//! them with PIL: the file decoded, checked (sides ≥ 64 px, aspect ≤ 8:1),
//! scaled to about one megapixel with LANCZOS when larger, centre-cropped
//! to multiples of twice the VAE scale factor, converted to RGB (alpha
//! dropped, grey repeated), then scaled to [-1, 1].

use crate::error::{one_line, RunError};
use crate::request::RequestError;
use crate::pipeline::resample::{self, Pixels};
use std::path::{Path, PathBuf};

/// diffusers' `check_image_input` limits.
pub const MIN_SIDE: usize = 64;
pub const MAX_ASPECT: usize = 8;
/// References above this many pixels are scaled down to about it (`_resize_to_target_area`).
pub const TARGET_AREA: usize = 1024 * 1024;
/// At most this many references, as other FLUX.2 tools allow.
pub const MAX_REFERENCES: usize = 16;
/// Files above this size are refused before decoding.
const MAX_FILE_BYTES: u64 = 256 << 20;
/// Decoded images above this many pixels are refused (a 16k × 16k photo).
const MAX_PIXELS: u64 = 1 << 28;

/// How PIL would hold the decoded file, which decides how it is resized
/// and converted to RGB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceMode {
    Rgb,
    Rgba,
    Gray,
    GrayAlpha,
    /// Palette or 1-bit images: PIL resizes them with NEAREST whatever filter is asked for.
    Indexed,
}

/// A reference image ready for the VAE encoder.
#[derive(Debug, Clone)]
pub struct ReferenceImage {
    pub path: PathBuf,
    /// The file's size, before any resize or crop.
    pub original: (usize, usize),
    pub width: usize,
    pub height: usize,
    /// `[3, height, width]` in [-1, 1].
    pub pixels: Vec<f32>,
}

/// How an image is brought to whole latent cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// The centre window (references: `resize_mode="crop"`).
    Crop,
    /// Resized to the cells' size (an init image: the processor's default mode).
    Resize,
}

/// Loads and prepares one reference image; `unit` is twice the VAE scale factor.
pub fn load(path: &Path, unit: usize) -> Result<ReferenceImage, RunError> {
    load_fitted(path, unit, Fit::Crop)
}

/// Loads and prepares an image for `unit`-pixel cells, brought to them by `fit`.
pub fn load_fitted(path: &Path, unit: usize, fit: Fit) -> Result<ReferenceImage, RunError> {
    let (mode, decoded) = decode(path)?;
    prepare(&path.display().to_string(), path, mode, decoded, unit, fit)
}

/// Prepares a reference image sent as bytes (a server request), named
/// `label` in errors (e.g. `init_images[0]`) and in its `path`.
pub fn from_bytes(label: &str, bytes: &[u8], unit: usize) -> Result<ReferenceImage, RunError> {
    from_bytes_fitted(label, bytes, unit, Fit::Crop)
}

/// [`from_bytes`], brought to whole cells by `fit`.
pub fn from_bytes_fitted(label: &str, bytes: &[u8], unit: usize, fit: Fit) -> Result<ReferenceImage, RunError> {
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(reference_error(label, format!("{} bytes is above the {MAX_FILE_BYTES}-byte limit for an image", bytes.len())));
    }
    let (mode, decoded) = decode_bytes(label, bytes)?;
    prepare(label, Path::new(label), mode, decoded, unit, fit)
}

fn prepare(label: &str, path: &Path, mode: SourceMode, decoded: Pixels, unit: usize, fit: Fit) -> Result<ReferenceImage, RunError> {
    let fail = |why: String| reference_error(label, why);
    let original = (decoded.width, decoded.height);
    // References go through `check_image_input`; the inpainting pipeline's init image does not.
    if fit == Fit::Crop {
        check_size(original.0, original.1).map_err(fail)?;
    }
    let (sized, width, height) = sized_to_cells(label, mode, decoded, unit)?;
    let fitted = match fit {
        Fit::Crop => super::resample::center_crop(&sized, width, height),
        // PIL returns the image itself when the size is already the one asked for.
        Fit::Resize if (sized.width, sized.height) == (width, height) => sized,
        Fit::Resize => resize(sized, mode, width, height),
    };
    Ok(ReferenceImage { path: path.to_path_buf(), original, width, height, pixels: to_model_range(&fitted) })
}

/// The decoded image brought under [`TARGET_AREA`] pixels where it is
/// larger, and the size a run on it takes: its sides floored to whole
/// `unit`-pixel cells (an image smaller than one cell is an error naming `label`).
pub fn sized_to_cells(label: &str, mode: SourceMode, decoded: Pixels, unit: usize) -> Result<(Pixels, usize, usize), RunError> {
    let sized = match target_size(decoded.width, decoded.height) {
        Some((w, h)) => resize(decoded, mode, w, h),
        None => decoded,
    };
    let (width, height) = (sized.width / unit * unit, sized.height / unit * unit);
    if width == 0 || height == 0 {
        return Err(reference_error(label, format!("{}×{} is smaller than one {unit}-pixel latent cell", sized.width, sized.height)));
    }
    Ok((sized, width, height))
}

/// An image already brought to its size (RGB), as the model takes it.
pub fn from_rgb(path: &Path, original: (usize, usize), rgb: &Pixels) -> ReferenceImage {
    ReferenceImage { path: path.to_path_buf(), original, width: rgb.width, height: rgb.height, pixels: to_model_range(rgb) }
}

/// A reference image that cannot be used, named by its file or field.
fn reference_error(name: &str, why: String) -> RunError {
    RunError::Request(RequestError::Reference { name: name.to_string(), why })
}

/// `check_image_input`: both sides at least 64 pixels, aspect ratio at most 8:1.
pub fn check_size(width: usize, height: usize) -> Result<(), String> {
    if width < MIN_SIDE || height < MIN_SIDE {
        return Err(format!("image too small: {width}×{height}; both sides must be at least {MIN_SIDE} pixels"));
    }
    if width.max(height) > MAX_ASPECT * width.min(height) {
        return Err(format!("aspect ratio of {width}×{height} is above {MAX_ASPECT}:1"));
    }
    Ok(())
}

/// `_resize_to_target_area`'s size for images above [`TARGET_AREA`] pixels:
/// both sides times `√(TARGET_AREA / area)`, truncated; `None` below it.
pub fn target_size(width: usize, height: usize) -> Option<(usize, usize)> {
    let area = width as u64 * height as u64;
    if area <= TARGET_AREA as u64 {
        return None;
    }
    let scale = (TARGET_AREA as f64 / area as f64).sqrt();
    Some(((width as f64 * scale) as usize, (height as f64 * scale) as usize))
}

/// Resizes in the file's own mode, as `Image.resize(…, LANCZOS)` does:
/// alpha premultiplied around the filter, indexed images by NEAREST.
pub fn resize(mut p: Pixels, mode: SourceMode, width: usize, height: usize) -> Pixels {
    match mode {
        SourceMode::Rgb | SourceMode::Gray => resample::lanczos(&p, width, height),
        SourceMode::Rgba | SourceMode::GrayAlpha => {
            resample::premultiply(&mut p);
            let mut out = resample::lanczos(&p, width, height);
            resample::unpremultiply(&mut out);
            out
        }
        SourceMode::Indexed => resample::nearest(&p, width, height),
    }
}

/// `convert("RGB")`: alpha dropped, grey repeated; interleaved RGB bytes.
pub fn rgb8(p: &Pixels) -> Vec<u8> {
    p.data.chunks(p.channels).flat_map(|px| if p.channels >= 3 { [px[0], px[1], px[2]] } else { [px[0]; 3] }).collect()
}

/// `convert("RGB")`, then `x/255·2 − 1` in f32, planar `[3, H, W]`.
fn to_model_range(p: &Pixels) -> Vec<f32> {
    let plane = p.width * p.height;
    let mut out = vec![0f32; 3 * plane];
    for (i, rgb) in rgb8(p).chunks(3).enumerate() {
        for (ch, &v) in rgb.iter().enumerate() {
            out[ch * plane + i] = 2.0 * (v as f32 / 255.0) - 1.0;
        }
    }
    out
}

/// The decoded file as PIL would hold it: its mode and 8-bit samples
/// (RGB, RGBA, L or LA interleaved; indexed images expanded to their colours).
pub fn decode(path: &Path) -> Result<(SourceMode, Pixels), RunError> {
    let fail = |why: String| reference_error(&path.display().to_string(), why);
    let meta = std::fs::metadata(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    if !meta.is_file() {
        return Err(fail("not a file".into()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(fail(format!("{} bytes is above the {MAX_FILE_BYTES}-byte limit for an image file", meta.len())));
    }
    let bytes = std::fs::read(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    decode_bytes(&path.display().to_string(), &bytes)
}

/// [`decode`] of an image file's bytes, errors named by `label`.
pub fn decode_bytes(label: &str, bytes: &[u8]) -> Result<(SourceMode, Pixels), RunError> {
    let fail = |why: String| reference_error(label, why);
    let format = image::guess_format(bytes).map_err(|_| fail("not a PNG or JPEG image".into()))?;
    if !matches!(format, image::ImageFormat::Png | image::ImageFormat::Jpeg) {
        return Err(fail(format!("{format:?} images are not supported; give a PNG or JPEG")));
    }
    let png = (format == image::ImageFormat::Png).then(|| png_header(bytes)).flatten();
    let mut reader = image::ImageReader::with_format(std::io::Cursor::new(bytes), format);
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(4 * MAX_PIXELS);
    reader.limits(limits);
    let img = reader.decode().map_err(|e| fail(format!("cannot decode: {}", one_line(&e.to_string()))))?;
    let (width, height) = (img.width() as usize, img.height() as usize);
    if width == 0 || height == 0 {
        return Err(fail(format!("the image is empty ({width}×{height})")));
    }
    if (width as u64) * (height as u64) > MAX_PIXELS {
        return Err(fail(format!("{width}×{height} pixels is above the {MAX_PIXELS}-pixel limit")));
    }
    use image::DynamicImage as D;
    let indexed = png.is_some_and(|h| h.color_type == PNG_PALETTE || (h.color_type == PNG_GRAY && h.depth == 1));
    let high_byte = |v: &[u16]| v.iter().map(|&s| (s >> 8) as u8).collect::<Vec<u8>>();
    let (mode, channels, data) = match img {
        D::ImageRgb8(b) => (SourceMode::Rgb, 3, b.into_raw()),
        D::ImageRgba8(b) => (SourceMode::Rgba, 4, b.into_raw()),
        D::ImageLuma8(b) => (SourceMode::Gray, 1, b.into_raw()),
        D::ImageLumaA8(b) => (SourceMode::GrayAlpha, 2, b.into_raw()),
        // PIL keeps the high byte of 16-bit colour samples.
        D::ImageRgb16(b) => (SourceMode::Rgb, 3, high_byte(b.as_raw())),
        D::ImageRgba16(b) => (SourceMode::Rgba, 4, high_byte(b.as_raw())),
        // PIL opens 16-bit grey with alpha as RGBA (high bytes).
        D::ImageLumaA16(b) => {
            let rgba = b.as_raw().chunks(2).flat_map(|la| [la[0], la[0], la[0], la[1]]).collect::<Vec<u16>>();
            (SourceMode::Rgba, 4, high_byte(&rgba))
        }
        D::ImageLuma16(_) => {
            return Err(fail(
                "16-bit greyscale is not supported (diffusers would clip every level above 255 to white); save it as 8-bit".into(),
            ))
        }
        other => return Err(fail(format!("unsupported pixel format {:?}", other.color()))),
    };
    let mode = if indexed { SourceMode::Indexed } else { mode };
    Ok((mode, Pixels::new(width, height, channels, data)))
}

const PNG_GRAY: u8 = 0;
const PNG_PALETTE: u8 = 3;

#[derive(Debug, Clone, Copy)]
struct PngHeader {
    depth: u8,
    color_type: u8,
}

/// The bit depth and colour type in a PNG's IHDR (the first chunk).
fn png_header(bytes: &[u8]) -> Option<PngHeader> {
    let ihdr = bytes.get(8..8 + 8 + 13)?;
    (&ihdr[4..8] == b"IHDR").then(|| PngHeader { depth: ihdr[16], color_type: ihdr[17] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_checks_follow_diffusers() {
        assert!(check_size(64, 64).is_ok());
        assert!(check_size(63, 1000).unwrap_err().contains("63×1000"));
        assert!(check_size(512, 64).is_ok());
        assert!(check_size(520, 64).unwrap_err().contains("8:1"));
        assert_eq!(target_size(1024, 1024), None);
        assert_eq!(target_size(3000, 3000), Some((1024, 1024)));
    }

    #[test]
    fn model_range_is_two_x_over_255_minus_one() {
        // Grey is repeated into the three planes.
        let p = Pixels::new(3, 1, 1, vec![0, 255, 128]);
        let half = 2.0 * (128f32 / 255.0) - 1.0;
        assert_eq!(to_model_range(&p), [-1.0, 1.0, half, -1.0, 1.0, half, -1.0, 1.0, half]);
    }
}
