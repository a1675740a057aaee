//! The picture image-to-image and inpainting start from, and its mask,
//! prepared one way for every door: `gen` gives files, `serve` the bytes a
//! request carried, each with its own way of marking what to repaint.

use super::job::InitImage;
use super::reference_image::{self, Fit, SourceMode};
use super::resample::Pixels;
use super::{inpaint, mask_crop};
use crate::error::RunError;
use std::path::Path;

/// Where an image comes from: a file, or bytes named by the field they came in.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    File(&'a Path),
    Bytes { name: &'a str, bytes: &'a [u8] },
}

impl Source<'_> {
    /// How errors name it.
    pub fn name(&self) -> String {
        match self {
            Source::File(path) => path.display().to_string(),
            Source::Bytes { name, .. } => name.to_string(),
        }
    }

    /// The file's bytes, or the ones given.
    fn bytes(&self) -> Result<std::borrow::Cow<'_, [u8]>, RunError> {
        match self {
            Source::File(path) => std::fs::read(path).map(std::borrow::Cow::Owned).map_err(|e| {
                RunError::Request(super::job::RequestError::Mask { name: self.name(), why: format!("cannot read: {e}") })
            }),
            Source::Bytes { bytes, .. } => Ok(std::borrow::Cow::Borrowed(bytes)),
        }
    }

    fn decode(&self) -> Result<(SourceMode, Pixels), RunError> {
        match self {
            Source::File(path) => reference_image::decode(path),
            Source::Bytes { name, bytes } => reference_image::decode_bytes(name, bytes),
        }
    }
}

/// How a mask marks what to repaint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marks {
    /// White (grey ≥ 128) repaints: diffusers, `gen --mask`, A1111.
    White,
    /// Black repaints: A1111's `inpainting_mask_invert`.
    Black,
    /// Transparent repaints: OpenAI's image edits.
    Transparent,
}

impl Marks {
    pub const ALL: [Marks; 3] = [Marks::White, Marks::Black, Marks::Transparent];

    pub fn name(self) -> &'static str {
        match self {
            Marks::White => "white",
            Marks::Black => "black",
            Marks::Transparent => "transparent",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// Image-to-image (no mask) or inpainting: `image` brought to whole latent
/// cells of `cell` pixels (resized, as the pipeline does), `mask` at its
/// size; with `crop`, both are the region around the mask grown by that
/// many pixels, and the result goes back over the whole image.
pub fn prepare(image: Source<'_>, mask: Option<(Source<'_>, Marks)>, strength: f64, crop: Option<usize>, cell: usize) -> Result<InitImage, RunError> {
    if let (Some(pad), Some((mask, marks))) = (crop, mask) {
        let decoded = image.decode()?;
        let path = image.name();
        let (_, pixels) = mask.decode()?;
        let pixels = marked_white(pixels, marks);
        let crop = mask_crop::prepare(Path::new(&path), decoded, &mask.name(), pixels, pad, cell)?;
        return Ok(InitImage { image: crop.image, mask: Some(crop.mask), strength, overlay: Some(crop.overlay) });
    }
    let picture = match image {
        Source::File(path) => reference_image::load_fitted(path, cell, Fit::Resize)?,
        Source::Bytes { name, bytes } => reference_image::from_bytes_fitted(name, bytes, cell, Fit::Resize)?,
    };
    let (width, height) = (picture.width, picture.height);
    let mask = match mask {
        None => None,
        Some((source, Marks::Transparent)) => Some(inpaint::mask_from_alpha(&source.name(), &source.bytes()?, width, height)?),
        Some((source, marks)) => {
            let mut mask = match source {
                Source::File(path) => inpaint::load_mask(path, width, height)?,
                Source::Bytes { name, bytes } => inpaint::mask_from_bytes(name, bytes, width, height)?,
            };
            if marks == Marks::Black {
                mask.values.iter_mut().for_each(|v| *v = 1.0 - *v);
            }
            Some(mask)
        }
    };
    Ok(InitImage { image: picture, mask, strength, overlay: None })
}

/// A mask's pixels with what repaints in white: black marks inverted in
/// every colour channel (as PIL's `ImageOps.invert`), transparent ones as
/// grey `255 − alpha`.
fn marked_white(mut pixels: Pixels, marks: Marks) -> Pixels {
    match marks {
        Marks::White => pixels,
        Marks::Black => {
            let colours = pixels.channels - usize::from(pixels.channels.is_multiple_of(2));
            pixels.data.chunks_mut(pixels.channels).for_each(|px| px[..colours].iter_mut().for_each(|v| *v = 255 - *v));
            pixels
        }
        Marks::Transparent if pixels.channels.is_multiple_of(2) => {
            let alpha = pixels.channels - 1;
            let grey = pixels.data.chunks(pixels.channels).map(|px| 255 - px[alpha]).collect();
            Pixels::new(pixels.width, pixels.height, 1, grey)
        }
        // No alpha: nothing is transparent; the crop refuses an all-black mask.
        Marks::Transparent => Pixels::new(pixels.width, pixels.height, 1, vec![0; pixels.width * pixels.height]),
    }
}
