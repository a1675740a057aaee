//! `padding_mask_crop` as diffusers' inpainting prepares it: the region
//! around the mask's white pixels, padded and widened to the output's
//! aspect ratio (`get_crop_region`), is what the run sees, brought to the
//! output's size by the `fill` resize (scaled to fit, the uncovered strips
//! filled by stretching the edge rows or columns, `_resize_and_fill`); the
//! decoded image goes back into that region by the `crop` resize
//! (`_resize_and_crop`). Each step PIL-exact, on 8-bit pixels.
//!
//! Not wired into `gen` or `serve` yet: these are the pieces, checked
//! against diffusers' own functions (`test_vectors/generate_mask_crop.py`).

use super::resample::{lanczos, resize_box, Filter, Pixels};

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

/// `res.paste(part, (x, y))` for a part of the same channels, clipped to `res`.
fn paste(res: &mut Pixels, part: &Pixels, x: i64, y: i64) {
    let c = res.channels;
    for py in 0..part.height as i64 {
        let ty = y + py;
        if !(0..res.height as i64).contains(&ty) {
            continue;
        }
        for px in 0..part.width as i64 {
            let tx = x + px;
            if (0..res.width as i64).contains(&tx) {
                let (from, to) = (((py as usize) * part.width + px as usize) * c, ((ty as usize) * res.width + tx as usize) * c);
                res.data[to..to + c].copy_from_slice(&part.data[from..from + c]);
            }
        }
    }
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

/// `_resize_and_crop(image, width, height)`: scaled (LANCZOS) to cover
/// `width × height` keeping its ratio, centred, the excess cut.
pub fn resize_and_crop(image: &Pixels, width: usize, height: usize) -> Pixels {
    let ratio = width as f64 / height as f64;
    let src_ratio = image.width as f64 / image.height as f64;
    let src_w = if ratio > src_ratio { width } else { image.width * height / image.height };
    let src_h = if ratio <= src_ratio { height } else { image.height * width / image.width };
    let resized = lanczos(image, src_w, src_h);
    let mut res = Pixels::new(width, height, image.channels, vec![0; width * height * image.channels]);
    paste(&mut res, &resized, (width / 2) as i64 - (src_w / 2) as i64, (height / 2) as i64 - (src_h / 2) as i64);
    res
}
