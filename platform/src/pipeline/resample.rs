//! Resizing 8-bit images the way PIL's `Image.resize` does, so a reference
//! image resized here gives the pixels diffusers feeds its VAE encoder.
//!
//! LANCZOS (and BICUBIC) are separable two-pass filters, each pass rounding
//! to 8 bits and skipped when its size does not change: rows first, unless
//! the height shrinks by more than twice what the width does (Pillow 13's
//! rule; the order changes the rounding, so it is kept). The
//! weights of each output pixel are the windowed sinc `sinc(x)·sinc(x/3)`
//! over `|x| < 3`, stretched by the downscale factor, normalised to sum 1
//! in f64, then quantised to 22-bit fixed point; a pixel is the fixed-point
//! sum plus one half, shifted back and clamped to 0–255. NEAREST picks the
//! source pixel under each output pixel's centre.

/// Fractional bits of the fixed-point filter weights (32 − 8 − 2: the sum of
/// 8-bit samples times weights stays inside an i32).
const PRECISION_BITS: u32 = 22;
/// Half-width of the Lanczos window, in source pixels at scale 1.
const LANCZOS_SUPPORT: f64 = 3.0;

/// An interleaved 8-bit image, `channels` samples per pixel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pixels {
    pub width: usize,
    pub height: usize,
    pub channels: usize,
    pub data: Vec<u8>,
}

impl Pixels {
    pub fn new(width: usize, height: usize, channels: usize, data: Vec<u8>) -> Self {
        debug_assert_eq!(data.len(), width * height * channels);
        Self { width, height, channels, data }
    }

    fn row(&self, y: usize) -> &[u8] {
        &self.data[y * self.width * self.channels..][..self.width * self.channels]
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    let x = x * core::f64::consts::PI;
    x.sin() / x
}

fn lanczos_window(x: f64) -> f64 {
    if (-LANCZOS_SUPPORT..LANCZOS_SUPPORT).contains(&x) {
        sinc(x) * sinc(x / LANCZOS_SUPPORT)
    } else {
        0.0
    }
}

/// PIL's BICUBIC kernel (a = −0.5, support 2): `Image.resize`'s default filter.
fn bicubic_window(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// A resampling filter of PIL's: its kernel and half-width at scale 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    Lanczos,
    Bicubic,
}

impl Filter {
    fn support(self) -> f64 {
        match self {
            Filter::Lanczos => LANCZOS_SUPPORT,
            Filter::Bicubic => 2.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            Filter::Lanczos => lanczos_window(x),
            Filter::Bicubic => bicubic_window(x),
        }
    }
}

/// The source window and fixed-point weights of each output pixel along one axis.
struct AxisWeights {
    /// `(first source index, count)` per output index.
    windows: Vec<(usize, usize)>,
    /// `stride` weights per output index (the unused tail is zero).
    weights: Vec<i32>,
    stride: usize,
}

impl AxisWeights {
    /// Output pixel `o` centred at `in0 + (o + ½)·scale` of the source
    /// span `[in0, in1)` (PIL's `box`; the whole axis without one), its
    /// window clipped to the `in_size` source pixels.
    fn new(filter: Filter, in_size: usize, span: (f64, f64), out_size: usize) -> Self {
        let (in0, in1) = span;
        let scale = (in1 - in0) / out_size as f64;
        let stretch = scale.max(1.0);
        let support = filter.support() * stretch;
        let stride = support.ceil() as usize * 2 + 1;
        let mut windows = Vec::with_capacity(out_size);
        let mut weights = vec![0i32; out_size * stride];
        let mut row = vec![0f64; stride];
        for (o, out) in weights.chunks_mut(stride).enumerate() {
            let center = in0 + (o as f64 + 0.5) * scale;
            // Truncation toward zero, as a C cast; the clamp makes the sign moot.
            let first = ((center - support + 0.5) as i64).max(0) as usize;
            let end = ((center + support + 0.5) as i64).clamp(0, in_size as i64) as usize;
            let count = end.saturating_sub(first).min(stride);
            let mut total = 0.0;
            let inverse = 1.0 / stretch;
            for (x, w) in row.iter_mut().enumerate().take(count) {
                *w = filter.weight(((x + first) as f64 - center + 0.5) * inverse);
                total += *w;
            }
            for (x, q) in out.iter_mut().enumerate().take(count) {
                let w = if total != 0.0 { row[x] / total } else { row[x] };
                let fixed = w * (1u32 << PRECISION_BITS) as f64;
                *q = if w < 0.0 { (fixed - 0.5) as i32 } else { (fixed + 0.5) as i32 };
            }
            windows.push((first, count));
        }
        Self { windows, weights, stride }
    }

    /// Output sample `o`: its window's source samples, read through `source`, times the weights.
    fn apply(&self, o: usize, source: impl Fn(usize) -> u8) -> u8 {
        let (first, count) = self.windows[o];
        let w = &self.weights[o * self.stride..][..count];
        let mut sum: i32 = 1 << (PRECISION_BITS - 1);
        for (x, &k) in w.iter().enumerate() {
            sum += source(first + x) as i32 * k;
        }
        (sum >> PRECISION_BITS).clamp(0, 255) as u8
    }
}

/// `Image.resize((width, height), LANCZOS)` of an 8-bit image with
/// independent channels (L, RGB; premultiply alpha first, as PIL does).
pub fn lanczos(src: &Pixels, width: usize, height: usize) -> Pixels {
    resize_box(src, Filter::Lanczos, width, height, [0.0, 0.0, src.width as f64, src.height as f64])
}

/// `Image.resize((width, height), filter, box=bx)` of the source region
/// `bx` = (left, top, right, bottom), in two passes as Pillow 13 runs them:
/// a pass runs where the size changes or the box does not start at 0 or end
/// at the output's size (an empty box spreads the few pixels at its edge),
/// each rounding to 8 bits, horizontal first unless the height shrinks by
/// more than twice what the width does.
pub fn resize_box(src: &Pixels, filter: Filter, width: usize, height: usize, bx: [f64; 4]) -> Pixels {
    let need_horizontal = width != src.width || bx[0] != 0.0 || bx[2] != width as f64;
    let need_vertical = height != src.height || bx[1] != 0.0 || bx[3] != height as f64;
    let shrink_y = src.height as i64 - height as i64;
    let horizontal_first = !(shrink_y > 0 && shrink_y > (src.width as i64 - width as i64) * 2);
    let horizontal = |img: Pixels| if need_horizontal { horizontal_pass(&img, filter, width, (bx[0], bx[2])) } else { img };
    let vertical = |img: Pixels| if need_vertical { vertical_pass(&img, filter, height, (bx[1], bx[3])) } else { img };
    if horizontal_first {
        vertical(horizontal(src.clone()))
    } else {
        horizontal(vertical(src.clone()))
    }
}

/// Every row of `src` resampled to `width` columns over the span `[in0, in1)`.
fn horizontal_pass(src: &Pixels, filter: Filter, width: usize, span: (f64, f64)) -> Pixels {
    let c = src.channels;
    let axis = AxisWeights::new(filter, src.width, span, width);
    let mut data = vec![0u8; width * src.height * c];
    for (y, out) in data.chunks_mut(width * c).enumerate() {
        let row = src.row(y);
        for x in 0..width {
            for ch in 0..c {
                out[x * c + ch] = axis.apply(x, |sx| row[sx * c + ch]);
            }
        }
    }
    Pixels::new(width, src.height, c, data)
}

/// Every column of `src` resampled to `height` rows over the span `[in0, in1)`.
fn vertical_pass(src: &Pixels, filter: Filter, height: usize, span: (f64, f64)) -> Pixels {
    let c = src.channels;
    let axis = AxisWeights::new(filter, src.height, span, height);
    let row_len = src.width * c;
    let mut data = vec![0u8; row_len * height];
    for (y, out) in data.chunks_mut(row_len).enumerate() {
        for (i, v) in out.iter_mut().enumerate() {
            *v = axis.apply(y, |sy| src.data[sy * row_len + i]);
        }
    }
    Pixels::new(src.width, height, c, data)
}

/// `Image.resize((width, height), NEAREST)`, as PIL resizes palette and
/// 1-bit images whatever filter is asked for: each output pixel takes the
/// source pixel under its centre, positions stepped by repeated addition.
pub fn nearest(src: &Pixels, width: usize, height: usize) -> Pixels {
    let source_index = |in_size: usize, out_size: usize| -> Vec<usize> {
        let step = in_size as f64 / out_size as f64;
        let mut at = step * 0.5;
        let mut out = Vec::with_capacity(out_size);
        for _ in 0..out_size {
            out.push((at.max(0.0) as usize).min(in_size - 1));
            at += step;
        }
        out
    };
    let (xs, ys) = (source_index(src.width, width), source_index(src.height, height));
    let c = src.channels;
    let mut data = Vec::with_capacity(width * height * c);
    for &sy in &ys {
        let row = src.row(sy);
        for &sx in &xs {
            data.extend_from_slice(&row[sx * c..][..c]);
        }
    }
    Pixels::new(width, height, c, data)
}

/// `a·b/255` rounded, as PIL's premultiplication computes it in integers.
fn mul_div_255(a: u8, b: u8) -> u8 {
    let t = a as u32 * b as u32 + 128;
    ((t + (t >> 8)) >> 8) as u8
}

/// Colour channels times alpha (the last channel), as PIL's RGBA → RGBa and LA → La.
pub fn premultiply(p: &mut Pixels) {
    let c = p.channels;
    for px in p.data.chunks_mut(c) {
        let alpha = px[c - 1];
        for v in &mut px[..c - 1] {
            *v = mul_div_255(*v, alpha);
        }
    }
}

/// The inverse of [`premultiply`], as PIL's RGBa → RGBA: colours divided by
/// alpha in integers, left as they are where alpha is 0 or 255.
pub fn unpremultiply(p: &mut Pixels) {
    let c = p.channels;
    for px in p.data.chunks_mut(c) {
        let alpha = px[c - 1] as u32;
        if alpha == 0 || alpha == 255 {
            continue;
        }
        for v in &mut px[..c - 1] {
            *v = ((255 * *v as u32) / alpha).min(255) as u8;
        }
    }
}

/// Flux2ImageProcessor's `_resize_and_crop(image, width, height)`, which
/// despite its name only crops: the centre `width × height` window (left
/// and top at `(size − side) // 2`, floored), black where the window
/// reaches past the image.
pub fn center_crop(image: &Pixels, width: usize, height: usize) -> Pixels {
    let c = image.channels;
    let left = (image.width as i64 - width as i64).div_euclid(2);
    let top = (image.height as i64 - height as i64).div_euclid(2);
    let mut res = Pixels::new(width, height, c, vec![0; width * height * c]);
    paste(&mut res, image, -left, -top);
    res
}

/// `res.paste(part, (x, y))` for a part of the same channels, clipped to `res`.
pub(crate) fn paste(res: &mut Pixels, part: &Pixels, x: i64, y: i64) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanczos_weights_sum_to_one_in_fixed_point() {
        for (input, output) in [(100, 37), (37, 100), (64, 64), (1000, 3)] {
            let axis = AxisWeights::new(Filter::Lanczos, input, (0.0, input as f64), output);
            for o in 0..output {
                let (first, count) = axis.windows[o];
                assert!(first + count <= input);
                let sum: i64 = axis.weights[o * axis.stride..][..count].iter().map(|&w| w as i64).sum();
                // Each weight rounds on its own: the sum is one within half a unit per weight.
                assert!((sum - (1 << PRECISION_BITS)).abs() <= count as i64, "{input}→{output} at {o}: {sum}");
            }
        }
    }

    #[test]
    fn a_flat_image_stays_flat_and_same_size_is_a_copy() {
        let flat = Pixels::new(50, 40, 3, vec![173; 50 * 40 * 3]);
        assert!(lanczos(&flat, 23, 61).data.iter().all(|&v| v == 173));
        assert!(nearest(&flat, 23, 61).data.iter().all(|&v| v == 173));
        let ramp = Pixels::new(5, 4, 1, (0..20).map(|v| v as u8 * 10).collect());
        assert_eq!(lanczos(&ramp, 5, 4), ramp);
    }

    #[test]
    fn premultiplication_rounds_as_pil() {
        // 200·128/255 = 100.39 → 100; 255·α/255 = α; anything · 0 = 0.
        assert_eq!(mul_div_255(200, 128), 100);
        assert_eq!(mul_div_255(255, 77), 77);
        assert_eq!(mul_div_255(99, 0), 0);
        let mut p = Pixels::new(1, 1, 4, vec![100, 50, 255, 128]);
        unpremultiply(&mut p);
        assert_eq!(p.data, [199, 99, 255, 128]);
    }
}
