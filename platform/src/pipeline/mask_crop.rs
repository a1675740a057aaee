//! `padding_mask_crop` as diffusers' inpainting prepares it: the region
//! around the mask's white pixels, padded and widened to the output's
//! aspect ratio (`get_crop_region`), is what the run sees, brought to the
//! output's size by the `fill` resize (scaled to fit, the uncovered strips
//! filled by stretching the edge rows or columns, `_resize_and_fill`); the
//! decoded image's centre goes back into that region (Flux2's processor's
//! `_resize_and_crop`, a plain centre crop) and under the original where
//! the mask is not white (`apply_overlay`). Each step PIL-exact, on 8-bit pixels, checked against
//! diffusers' own functions (`test_vectors/generate_mask_crop.py`).

use super::inpaint;
use crate::request::RequestError;
use super::reference_image::{self, SourceMode};
use super::resample::{center_crop, lanczos, paste, resize_box, Filter, Pixels};
use crate::error::RunError;
use std::path::Path;
use std::sync::Arc;

/// A region of an image: columns `x1..x2`, rows `y1..y2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CropBox {
    pub x1: usize,
    pub y1: usize,
    pub x2: usize,
    pub y2: usize,
}

impl CropBox {
    pub fn width(&self) -> usize {
        self.x2 - self.x1
    }

    pub fn height(&self) -> usize {
        self.y2 - self.y1
    }
}

/// `get_crop_region(mask, width, height, pad)`: the smallest box holding
/// every non-black pixel of `grey` (the mask in PIL's `L`), grown by `pad`
/// inside the image, then widened (or heightened) about its centre to the
/// `width : height` ratio, shifted back inside the image where it would
/// leave it. `None` when the mask is all black (diffusers then divides by zero).
pub fn crop_region(grey: &Pixels, width: usize, height: usize, pad: usize) -> Option<CropBox> {
    debug_assert_eq!(grey.channels, 1);
    let (w, h) = (grey.width as i64, grey.height as i64);
    let column_black = |x: i64| (0..h).all(|y| grey.data[(y * w + x) as usize] == 0);
    let row_black = |y: i64| (0..w).all(|x| grey.data[(y * w + x) as usize] == 0);
    let left = (0..w).take_while(|&x| column_black(x)).count() as i64;
    let right = (0..w).rev().take_while(|&x| column_black(x)).count() as i64;
    let top = (0..h).take_while(|&y| row_black(y)).count() as i64;
    let bottom = (0..h).rev().take_while(|&y| row_black(y)).count() as i64;
    let pad = pad as i64;
    let (mut x1, mut y1) = ((left - pad).max(0), (top - pad).max(0));
    let (mut x2, mut y2) = ((w - right + pad).min(w), (h - bottom + pad).min(h));
    if x2 <= x1 || y2 <= y1 {
        return None;
    }
    let ratio_crop = (x2 - x1) as f64 / (y2 - y1) as f64;
    let ratio = width as f64 / height as f64;
    // Python's `int()` truncates; `//` floors (the differences are never negative here).
    let widen = |a1: &mut i64, a2: &mut i64, desired: f64, size: i64| {
        let diff = (desired - (*a2 - *a1) as f64) as i64;
        *a1 -= diff.div_euclid(2);
        *a2 += diff - diff.div_euclid(2);
        if *a2 >= size {
            let over = *a2 - size;
            *a2 -= over;
            *a1 -= over;
        }
        if *a1 < 0 {
            *a2 -= *a1;
            *a1 = 0;
        }
        if *a2 >= size {
            *a2 = size;
        }
    };
    if ratio_crop > ratio {
        let desired = (x2 - x1) as f64 / ratio;
        widen(&mut y1, &mut y2, desired, h);
    } else {
        let desired = (y2 - y1) as f64 * ratio;
        widen(&mut x1, &mut x2, desired, w);
    }
    Some(CropBox { x1: x1 as usize, y1: y1 as usize, x2: x2 as usize, y2: y2 as usize })
}

/// `image.crop(box)`, the box inside the image.
pub fn crop(image: &Pixels, b: CropBox) -> Pixels {
    let c = image.channels;
    let mut data = Vec::with_capacity(b.width() * b.height() * c);
    for y in b.y1..b.y2 {
        data.extend_from_slice(&image.data[(y * image.width + b.x1) * c..(y * image.width + b.x2) * c]);
    }
    Pixels::new(b.width(), b.height(), c, data)
}

/// `_resize_and_fill(image, width, height)`: scaled (LANCZOS) to fit inside
/// `width × height` keeping its ratio, centred on black, and the strips it
/// leaves filled by PIL's resize of the empty box at each edge, with
/// `Image.resize`'s default BICUBIC (every strip row a blend of the two
/// source rows nearest that edge).
pub fn resize_and_fill(image: &Pixels, width: usize, height: usize) -> Pixels {
    let ratio = width as f64 / height as f64;
    let src_ratio = image.width as f64 / image.height as f64;
    let src_w = if ratio < src_ratio { width } else { image.width * height / image.height };
    let src_h = if ratio >= src_ratio { height } else { image.height * width / image.width };
    let resized = lanczos(image, src_w, src_h);
    let mut res = Pixels::new(width, height, image.channels, vec![0; width * height * image.channels]);
    paste(&mut res, &resized, (width / 2) as i64 - (src_w / 2) as i64, (height / 2) as i64 - (src_h / 2) as i64);
    let (rw, rh) = (resized.width as f64, resized.height as f64);
    if ratio < src_ratio {
        let fill = (height / 2) as i64 - (src_h / 2) as i64;
        if fill > 0 {
            let f = fill as usize;
            paste(&mut res, &resize_box(&resized, Filter::Bicubic, width, f, [0.0, 0.0, width as f64, 0.0]), 0, 0);
            paste(&mut res, &resize_box(&resized, Filter::Bicubic, width, f, [0.0, rh, width as f64, rh]), 0, fill + src_h as i64);
        }
    } else if ratio > src_ratio {
        let fill = (width / 2) as i64 - (src_w / 2) as i64;
        if fill > 0 {
            let f = fill as usize;
            paste(&mut res, &resize_box(&resized, Filter::Bicubic, f, height, [0.0, 0.0, 0.0, height as f64]), 0, 0);
            paste(&mut res, &resize_box(&resized, Filter::Bicubic, f, height, [rw, 0.0, rw, height as f64]), fill + src_w as i64, 0);
        }
    }
    res
}

/// `(a·b + 128) / 255` in PIL's integer form (`DIV255`).
fn div255(v: u32) -> u32 {
    let t = v + 128;
    ((t >> 8) + t) >> 8
}

/// `apply_overlay(mask, original, decoded, crop)`: `decoded` (RGB) brought
/// to the crop box by [`center_crop`] (the pipeline's processor's
/// `_resize_and_crop`) and placed there on black, then
/// the original (RGBA, the mask's size) composited over it through the
/// inverted mask (grey): PIL's paste of the premultiplied original through
/// `255 − mask` onto a clear image, unpremultiplied, then `alpha_composite`.
/// Where the mask is black an opaque original comes back unchanged; where
/// white, the generated pixels.
pub fn apply_overlay(grey: &Pixels, original: &Pixels, decoded: &Pixels, b: CropBox) -> Pixels {
    debug_assert_eq!((grey.width, grey.height, grey.channels, original.channels, decoded.channels), (original.width, original.height, 1, 4, 3));
    let placed = center_crop(decoded, b.width(), b.height());
    let mut out = vec![0u8; original.width * original.height * 3];
    for y in 0..original.height {
        for x in 0..original.width {
            let i = y * original.width + x;
            let inside = (b.x1..b.x2).contains(&x) && (b.y1..b.y2).contains(&y);
            let dst = if inside { &placed.data[((y - b.y1) * b.width() + x - b.x1) * 3..][..3] } else { &[0u8; 3][..] };
            let px = &original.data[i * 4..i * 4 + 4];
            let keep = 255 - grey.data[i] as u32;
            // RGBA → RGBa, pasted through the inverted mask onto clear (every channel scaled), → RGBA.
            let alpha = div255(px[3] as u32 * keep);
            let src: [u32; 3] = std::array::from_fn(|c| {
                let premultiplied = div255(div255(px[c] as u32 * px[3] as u32) * keep);
                if alpha == 0 || alpha == 255 { premultiplied } else { (255 * premultiplied / alpha).min(255) }
            });
            if alpha == 0 {
                out[i * 3..i * 3 + 3].copy_from_slice(dst);
                continue;
            }
            // alpha_composite over an opaque destination, 7 extra bits.
            let outa255 = alpha * 255 + 255 * (255 - alpha);
            let coef1 = alpha * 255 * 255 * (1 << 7) / outa255;
            let coef2 = 255 * (1 << 7) - coef1;
            for c in 0..3 {
                let t = src[c] * coef1 + dst[c] as u32 * coef2 + (0x80 << 7);
                out[i * 3 + c] = ((((t >> 8) + t) >> 8) >> 7) as u8;
            }
        }
    }
    Pixels::new(original.width, original.height, 3, out)
}

/// What a masked crop keeps for after the decode: the region, the original
/// (RGBA) and the mask (grey) it is put back over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlay {
    pub crop: CropBox,
    pub original: Pixels,
    pub grey: Pixels,
}

impl Overlay {
    /// The decoded `width × height` RGB image put back over the original.
    pub fn apply(&self, width: usize, height: usize, rgb: Vec<u8>) -> Pixels {
        apply_overlay(&self.grey, &self.original, &Pixels::new(width, height, 3, rgb), self.crop)
    }
}

/// Every pixel as RGBA (`convert("RGBA")`: grey repeated, opaque where the
/// file has no alpha).
pub fn rgba8(p: &Pixels) -> Pixels {
    let data = p
        .data
        .chunks(p.channels)
        .flat_map(|px| match px.len() {
            1 => [px[0], px[0], px[0], 255],
            2 => [px[0], px[0], px[0], px[1]],
            3 => [px[0], px[1], px[2], 255],
            _ => [px[0], px[1], px[2], px[3]],
        })
        .collect();
    Pixels::new(p.width, p.height, 4, data)
}

/// A masked crop: the region around the mask, its mask, and how the result
/// goes back over the whole image.
#[derive(Debug, Clone)]
pub struct Cropped {
    pub image: super::reference_image::ReferenceImage,
    pub mask: inpaint::Mask,
    pub overlay: Arc<Overlay>,
}

/// The init image and mask of an inpainting run with `padding_mask_crop =
/// pad`, as `Flux2KleinInpaintPipeline` prepares them: the image brought
/// under 1024² pixels as for any init image, the run's size its sides
/// floored to `unit`; the crop region from the mask (which must have the
/// image's size, as diffusers' overlay needs); the image's crop (as RGB:
/// an image with transparency is flattened first, where diffusers resizes
/// it premultiplied) and the mask's crop brought to the run's size by the
/// `fill` resize; the decoded image later put back by [`Overlay`].
pub fn prepare(path: &Path, image: (SourceMode, Pixels), mask_name: &str, mask: Pixels, pad: usize, unit: usize) -> Result<Cropped, RunError> {
    let (mode, decoded) = image;
    let original = (decoded.width, decoded.height);
    let (sized, width, height) = reference_image::sized_to_cells(&path.display().to_string(), mode, decoded, unit)?;
    let mask_error = |why: String| RunError::Request(RequestError::Mask { name: mask_name.to_string(), why });
    if (mask.width, mask.height) != (sized.width, sized.height) {
        return Err(mask_error(format!("{}×{}; a masked crop needs the mask at the init image's size, {}×{}", mask.width, mask.height, sized.width, sized.height)));
    }
    let grey = inpaint::grey(&mask);
    let Some(region) = crop_region(&grey, width, height, pad) else {
        return Err(mask_error("is all black: there is nothing to repaint, so no region to crop".into()));
    };
    let rgb = Pixels::new(sized.width, sized.height, 3, reference_image::rgb8(&sized));
    let image = reference_image::from_rgb(path, original, &resize_and_fill(&crop(&rgb, region), width, height));
    let mask_sized = resize_and_fill(&crop(&mask, region), width, height);
    let overlay = Overlay { crop: region, original: rgba8(&sized), grey };
    Ok(Cropped { image, mask: inpaint::binarized(mask_name, &mask_sized), overlay: Arc::new(overlay) })
}
