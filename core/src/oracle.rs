//! Scalar reference for every GPU op, written for clarity and computed in f64.
//! Activations come in as f32, weights as bf16 bits or f32, results go out as
//! f64 so tests can measure the shaders' own error. Layouts are contiguous
//! and row-major; strided views are the launchers' business.

use libm::{exp, sqrt};

/// A weight tensor as stored: bf16 bit patterns or f32 values.
#[derive(Debug, Clone, Copy)]
pub enum Weights<'a> {
    Bf16(&'a [u16]),
    F32(&'a [f32]),
}

impl Weights<'_> {
    pub fn get(&self, i: usize) -> f64 {
        match self {
            Weights::Bf16(w) => crate::numerics::bf16::to_f32(w[i]) as f64,
            Weights::F32(w) => w[i] as f64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Weights::Bf16(w) => w.len(),
            Weights::F32(w) => w.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub fn silu(x: f64) -> f64 {
    x / (1.0 + exp(-x))
}

/// `y[m, n] = Σ_k x[m, k]·w[n, k] + b[n]`.
pub fn linear(x: &[f32], w: Weights<'_>, bias: Option<Weights<'_>>, m: usize, n: usize, k: usize, y: &mut [f64]) {
    for r in 0..m {
        for c in 0..n {
            let mut acc = bias.map_or(0.0, |b| b.get(c));
            for i in 0..k {
                acc += x[r * k + i] as f64 * w.get(c * k + i);
            }
            y[r * n + c] = acc;
        }
    }
}

/// RMSNorm of each `d`-wide row: `w · x / sqrt(mean(x²) + eps)`. Per-head
/// norms are the same with one row per (token, head).
pub fn rms_norm(x: &[f32], w: Weights<'_>, rows: usize, d: usize, eps: f64, y: &mut [f64]) {
    for r in 0..rows {
        let row = &x[r * d..(r + 1) * d];
        let ms = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / d as f64;
        let inv = 1.0 / sqrt(ms + eps);
        for i in 0..d {
            y[r * d + i] = w.get(i) * row[i] as f64 * inv;
        }
    }
}

/// LayerNorm without affine, then `(1 + scale)·x̂ + shift` with per-feature
/// `scale` and `shift` shared by every row (AdaLN modulation).
pub fn layer_norm_modulate(x: &[f32], shift: &[f32], scale: &[f32], rows: usize, d: usize, eps: f64, y: &mut [f64]) {
    for r in 0..rows {
        let row = &x[r * d..(r + 1) * d];
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
        let var = row.iter().map(|&v| (v as f64 - mean) * (v as f64 - mean)).sum::<f64>() / d as f64;
        let inv = 1.0 / sqrt(var + eps);
        for i in 0..d {
            let xn = (row[i] as f64 - mean) * inv;
            y[r * d + i] = xn * (1.0 + scale[i] as f64) + shift[i] as f64;
        }
    }
}

/// GroupNorm over a `[channels, pixels]` tensor with per-channel affine,
/// optionally followed by SiLU (the VAE's usual pairing).
/// `[channels, pixels, groups]` is the tensor's shape and its channel groups.
pub fn group_norm(
    x: &[f32],
    gamma: Weights<'_>,
    beta: Weights<'_>,
    [channels, pixels, groups]: [usize; 3],
    eps: f64,
    then_silu: bool,
    y: &mut [f64],
) {
    let per = channels / groups;
    for g in 0..groups {
        let span = &x[g * per * pixels..(g + 1) * per * pixels];
        let n = span.len() as f64;
        let mean = span.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = span.iter().map(|&v| (v as f64 - mean) * (v as f64 - mean)).sum::<f64>() / n;
        let inv = 1.0 / sqrt(var + eps);
        for c in g * per..(g + 1) * per {
            for p in 0..pixels {
                let v = (x[c * pixels + p] as f64 - mean) * inv * gamma.get(c) + beta.get(c);
                y[c * pixels + p] = if then_silu { silu(v) } else { v };
            }
        }
    }
}

/// RoPE on interleaved pairs `(x_2i, x_2i+1)` of each head of `[tokens, heads, head_dim]`,
/// with `cos`/`sin` tables `[tokens, head_dim]` (pair entries repeated).
pub fn rope_interleaved(x: &[f32], cos: &[f32], sin: &[f32], tokens: usize, heads: usize, head_dim: usize, y: &mut [f64]) {
    for t in 0..tokens {
        for h in 0..heads {
            let base = (t * heads + h) * head_dim;
            for i in 0..head_dim / 2 {
                let (a, b) = (x[base + 2 * i] as f64, x[base + 2 * i + 1] as f64);
                let (c, s) = (cos[t * head_dim + 2 * i] as f64, sin[t * head_dim + 2 * i] as f64);
                y[base + 2 * i] = a * c - b * s;
                y[base + 2 * i + 1] = b * c + a * s;
            }
        }
    }
}

/// RoPE in the rotate-half convention: `y = x·cos + cat(-x2, x1)·sin` per head.
pub fn rope_rotate_half(x: &[f32], cos: &[f32], sin: &[f32], tokens: usize, heads: usize, head_dim: usize, y: &mut [f64]) {
    let half = head_dim / 2;
    for t in 0..tokens {
        for h in 0..heads {
            let base = (t * heads + h) * head_dim;
            for i in 0..head_dim {
                let rotated = if i < half { -(x[base + i + half] as f64) } else { x[base + i - half] as f64 };
                let tab = t * head_dim + i;
                y[base + i] = x[base + i] as f64 * cos[tab] as f64 + rotated * sin[tab] as f64;
            }
        }
    }
}

/// The shape and masking of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub q_len: usize,
    pub kv_len: usize,
    pub q_heads: usize,
    /// Query head `h` reads kv head `h / (q_heads / kv_heads)` (grouped-query attention).
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f64,
    /// Query `i` sees keys `j ≤ i` only.
    pub causal: bool,
}

/// `softmax(q·kᵀ·scale + mask)·v` per head over `[len, heads, head_dim]`
/// tensors. `key_keep[j] == 0` masks key `j` for every query. A query that
/// sees no key gets zeros. `scratch` holds `kv_len` scores.
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    key_keep: Option<&[u32]>,
    s: AttentionShape,
    scratch: &mut [f64],
    out: &mut [f64],
) {
    let d = s.head_dim;
    let group = s.q_heads / s.kv_heads;
    for h in 0..s.q_heads {
        let kh = h / group;
        for i in 0..s.q_len {
            let qrow = &q[(i * s.q_heads + h) * d..][..d];
            let mut max = f64::NEG_INFINITY;
            for j in 0..s.kv_len {
                let visible = !(s.causal && j > i) && key_keep.is_none_or(|m| m[j] != 0);
                scratch[j] = if visible {
                    let krow = &k[(j * s.kv_heads + kh) * d..][..d];
                    qrow.iter().zip(krow).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * s.scale
                } else {
                    f64::NEG_INFINITY
                };
                max = max.max(scratch[j]);
            }
            let orow = &mut out[(i * s.q_heads + h) * d..][..d];
            orow.fill(0.0);
            if max == f64::NEG_INFINITY {
                continue;
            }
            let mut denom = 0.0;
            for j in 0..s.kv_len {
                let p = exp(scratch[j] - max);
                denom += p;
                let vrow = &v[(j * s.kv_heads + kh) * d..][..d];
                for (o, &vv) in orow.iter_mut().zip(vrow) {
                    *o += p * vv as f64;
                }
            }
            for o in orow.iter_mut() {
                *o /= denom;
            }
        }
    }
}

/// The geometry of one 2-D convolution over `[channels, height, width]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    pub in_channels: usize,
    pub out_channels: usize,
    pub height: usize,
    pub width: usize,
    pub kernel: usize,
    pub stride: usize,
    /// Zero padding before the first row and column; the output size decides the rest.
    pub pad_top: usize,
    pub pad_left: usize,
    pub out_height: usize,
    pub out_width: usize,
}

impl ConvShape {
    /// A stride-1 "same" convolution (3×3 with padding 1, or 1×1).
    pub fn same(in_channels: usize, out_channels: usize, height: usize, width: usize, kernel: usize) -> Self {
        let pad = kernel / 2;
        Self {
            in_channels,
            out_channels,
            height,
            width,
            kernel,
            stride: 1,
            pad_top: pad,
            pad_left: pad,
            out_height: height,
            out_width: width,
        }
    }

    /// The input rows `[first, end)` that output rows `[y0, y1)` read,
    /// clipped to the image, and the zero rows above `first` that the band's
    /// own convolution pads with (non-zero only at the image's top).
    pub fn input_rows(&self, y0: usize, y1: usize) -> (usize, usize, usize) {
        let top = y0 * self.stride;
        let first = top.saturating_sub(self.pad_top);
        let end = ((y1.max(y0 + 1) - 1) * self.stride + self.kernel).saturating_sub(self.pad_top).min(self.height);
        (first, end.max(first), first + self.pad_top - top)
    }

    /// Whether every output pixel's taps stay within the input (read
    /// upsampled ×`up`) and at most `kernel / 2` zeros past each side of
    /// it, and reach its last column and (but for one of an upsampled
    /// pair) its last row: a "same" or strided convolution, or a band of
    /// one's rows as [`Self::input_rows`] cuts them.
    pub fn taps_fit(&self, up: usize) -> bool {
        let (seen_h, seen_w, half) = (self.height * up, self.width * up, self.kernel / 2);
        let reach = |out: usize| out.saturating_sub(1) * self.stride + self.kernel;
        let (down, across) = (reach(self.out_height), reach(self.out_width));
        let rows = self.pad_top <= half && down <= seen_h + self.pad_top + half && down + up > seen_h + self.pad_top;
        let cols = self.pad_left <= half && across <= seen_w + self.pad_left + half && across >= seen_w + self.pad_left;
        self.out_height > 0 && self.out_width > 0 && rows && cols
    }

    /// Elements the operands of a band of output rows take, as
    /// `(fixed, per output row)`: every input channel of the rows it reads
    /// (`(rows − 1)·stride + kernel` of them at most) and every output channel
    /// of its rows.
    pub fn band_elements(&self) -> (u64, u64) {
        let input_row = (self.in_channels * self.width) as u64;
        let fixed = self.kernel.saturating_sub(self.stride) as u64 * input_row;
        (fixed, self.stride as u64 * input_row + (self.out_channels * self.out_width) as u64)
    }
}

/// Cross-correlation with bias, weights `[out, in, k, k]`, as `torch.nn.Conv2d`.
pub fn conv2d(x: &[f32], w: Weights<'_>, bias: Weights<'_>, s: ConvShape, y: &mut [f64]) {
    let kk = s.kernel;
    for co in 0..s.out_channels {
        for oy in 0..s.out_height {
            for ox in 0..s.out_width {
                let mut acc = bias.get(co);
                for ci in 0..s.in_channels {
                    for ky in 0..kk {
                        for kx in 0..kk {
                            let iy = (oy * s.stride + ky) as isize - s.pad_top as isize;
                            let ix = (ox * s.stride + kx) as isize - s.pad_left as isize;
                            if iy < 0 || ix < 0 || iy >= s.height as isize || ix >= s.width as isize {
                                continue;
                            }
                            let xi = (ci * s.height + iy as usize) * s.width + ix as usize;
                            acc += x[xi] as f64 * w.get(((co * s.in_channels + ci) * kk + ky) * kk + kx);
                        }
                    }
                }
                y[(co * s.out_height + oy) * s.out_width + ox] = acc;
            }
        }
    }
}

/// Nearest-neighbour ×2 upsampling of `[channels, height, width]`.
pub fn upsample_nearest2x(x: &[f32], channels: usize, height: usize, width: usize, y: &mut [f64]) {
    for c in 0..channels {
        for oy in 0..2 * height {
            for ox in 0..2 * width {
                y[(c * 2 * height + oy) * 2 * width + ox] = x[(c * height + oy / 2) * width + ox / 2] as f64;
            }
        }
    }
}

/// The packed latents `[height·width, 4·channels]` as the VAE decoder's input
/// `[channels, 2·height, 2·width]`: `x·√(var + eps) + mean` per patchified
/// channel, then unpatchify (spec §1.5).
/// `[channels, height, width]` are the latent channels and the token grid.
pub fn denorm_unpatchify(
    packed: &[f32],
    mean: Weights<'_>,
    var: Weights<'_>,
    [channels, height, width]: [usize; 3],
    eps: f64,
    y: &mut [f64],
) {
    let (out_h, out_w) = (2 * height, 2 * width);
    for c in 0..channels {
        for oy in 0..out_h {
            for ox in 0..out_w {
                let pc = c * 4 + (oy % 2) * 2 + ox % 2;
                let token = (oy / 2) * width + ox / 2;
                let v = packed[token * 4 * channels + pc] as f64;
                y[(c * out_h + oy) * out_w + ox] = v * sqrt(var.get(pc) + eps) + mean.get(pc);
            }
        }
    }
}

/// The 8-bit level of a decoded value as diffusers' post-processing makes it:
/// `round(clamp(x·0.5 + 0.5, 0, 1)·255)`. Unlike the other references this one
/// rounds in f32 step by step, as torch and numpy do, because a level is an
/// integer: f64 arithmetic would move values that sit on a half level.
/// numpy's `round` sends ties to the even neighbour.
pub fn pixel_level(x: f32) -> f64 {
    let unit = (x * 0.5 + 0.5).clamp(0.0, 1.0);
    let v = unit * 255.0;
    let r = libm::roundf(v);
    // `roundf` sends ties away from zero.
    let level = if v - libm::truncf(v) == 0.5 && r % 2.0 != 0.0 { r - 1.0 } else { r };
    level as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A convolution run band by band over the input rows `input_rows`
    /// names, each band with its own height and top padding, equals the
    /// whole convolution: stride 1 "same" and the encoder's stride-2
    /// downsampling (no top padding, one zero row below), bands of 1 to 4 rows.
    #[test]
    fn a_convolution_by_bands_of_input_rows_equals_the_whole() {
        let (cin, cout, h, w) = (2, 3, 9, 5);
        let weights: alloc::vec::Vec<f32> = (0..cout * cin * 9).map(|i| ((i * 13 % 17) as f32 - 8.0) / 5.0).collect();
        let bias = [0.5f32, -0.25, 1.0];
        let down = |h: usize| ConvShape { stride: 2, pad_top: 0, pad_left: 0, out_height: h / 2, out_width: w / 2, ..ConvShape::same(cin, cout, h, w, 3) };
        for s in [ConvShape::same(cin, cout, h, w, 3), down(h - 1), ConvShape::same(cin, cout, h, w, 1)] {
            let h = s.height;
            let x: alloc::vec::Vec<f32> = (0..cin * h * w).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect();
            let mut whole = alloc::vec![0.0; cout * s.out_height * s.out_width];
            conv2d(&x, Weights::F32(&weights), Weights::F32(&bias), s, &mut whole);
            for band in 1..=4 {
                let mut y0 = 0;
                while y0 < s.out_height {
                    let y1 = (y0 + band).min(s.out_height);
                    let (first, end, pad) = s.input_rows(y0, y1);
                    let rows: alloc::vec::Vec<f32> =
                        (0..cin).flat_map(|c| x[(c * h + first) * w..(c * h + end) * w].iter().copied()).collect();
                    let shape = ConvShape { height: end - first, pad_top: pad, out_height: y1 - y0, ..s };
                    assert!(s.taps_fit(1) && shape.taps_fit(1), "{shape:?}: a band the channels-last convolution takes");
                    let (fixed, per_row) = s.band_elements();
                    assert!((rows.len() + cout * (y1 - y0) * s.out_width) as u64 <= fixed + per_row * (y1 - y0) as u64, "{s:?}");
                    let mut part = alloc::vec![0.0; cout * (y1 - y0) * s.out_width];
                    conv2d(&rows, Weights::F32(&weights), Weights::F32(&bias), shape, &mut part);
                    for co in 0..cout {
                        let got = &part[co * (y1 - y0) * s.out_width..][..(y1 - y0) * s.out_width];
                        let want = &whole[(co * s.out_height + y0) * s.out_width..][..(y1 - y0) * s.out_width];
                        assert_eq!(got, want, "{s:?}, rows {y0}..{y1}");
                    }
                    y0 = y1;
                }
            }
        }
    }

    /// What the channels-last convolution refuses: taps past `kernel / 2`
    /// zeros, an output wider than its taps make, rows the taps never reach.
    #[test]
    fn taps_that_leave_the_input_or_miss_its_end_do_not_fit() {
        let same = ConvShape::same(4, 4, 8, 8, 3);
        let upsampled = ConvShape { out_height: 16, out_width: 16, ..same };
        assert!(same.taps_fit(1) && upsampled.taps_fit(2) && !upsampled.taps_fit(1));
        assert!(!ConvShape { pad_top: 2, pad_left: 2, out_height: 10, out_width: 10, ..same }.taps_fit(1));
        assert!(!ConvShape { out_width: 9, ..same }.taps_fit(1));
        assert!(!ConvShape { out_height: 6, ..same }.taps_fit(1));
        assert!(!ConvShape { stride: 2, out_height: 8, out_width: 8, ..same }.taps_fit(1));
    }

    #[test]
    fn linear_small_case_by_hand() {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let w = [1.0f32, 0.0, 0.5, -1.0, 2.0, 2.0];
        let b = [0.25f32, 0.0, -1.0];
        let mut y = [0.0; 6];
        linear(&x, Weights::F32(&w), Some(Weights::F32(&b)), 2, 3, 2, &mut y);
        assert_eq!(y, [1.25, -1.5, 5.0, 3.25, -2.5, 13.0]);
    }

    #[test]
    fn attention_with_one_visible_key_returns_its_value() {
        let shape = AttentionShape { q_len: 2, kv_len: 2, q_heads: 1, kv_heads: 1, head_dim: 1, scale: 1.0, causal: true };
        let (q, k, v) = ([1.0f32, 1.0], [3.0f32, -2.0], [7.0f32, 9.0]);
        let mut scratch = [0.0; 2];
        let mut out = [0.0; 2];
        attention(&q, &k, &v, None, shape, &mut scratch, &mut out);
        assert_eq!(out[0], 7.0);
        let p = [exp(3.0), exp(-2.0)];
        assert!((out[1] - (p[0] * 7.0 + p[1] * 9.0) / (p[0] + p[1])).abs() < 1e-12);
        // Masking key 0 leaves query 0 with nothing to see.
        attention(&q, &k, &v, Some(&[0, 1]), shape, &mut scratch, &mut out);
        assert_eq!(out, [0.0, 9.0]);
    }

    #[test]
    fn rotate_half_matches_the_formula() {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let cos = [0.5f32; 4];
        let sin = [0.25f32; 4];
        let mut y = [0.0; 4];
        rope_rotate_half(&x, &cos, &sin, 1, 1, 4, &mut y);
        assert_eq!(y, [0.5 - 0.75, 1.0 - 1.0, 1.5 + 0.25, 2.0 + 0.5]);
    }

    #[test]
    fn pixel_levels_round_half_levels_to_even() {
        assert_eq!(pixel_level(-2.0), 0.0);
        assert_eq!(pixel_level(2.0), 255.0);
        // Inputs whose f32 level is exactly k + 0.5 (found with numpy float32).
        assert_eq!(pixel_level(0.0), 128.0); // 127.5
        assert_eq!(pixel_level(-0.494_117_65), 64.0); // 64.5
        assert_eq!(pixel_level(-0.486_274_5), 66.0); // 65.5
    }

    #[test]
    fn unpatchify_places_patch_channels_on_the_pixel_grid() {
        // One latent channel, one token: its 4 patch channels become a 2×2 block.
        let packed = [1.0f32, 2.0, 3.0, 4.0];
        let (mean, var) = ([0.5f32; 4], [3.0f32; 4]);
        let mut y = [0.0; 4];
        denorm_unpatchify(&packed, Weights::F32(&mean), Weights::F32(&var), [1, 1, 1], 1.0, &mut y);
        assert_eq!(y, [2.5, 4.5, 6.5, 8.5]);
    }

    #[test]
    fn conv_padding_sees_zeros() {
        // 1 channel 2×2 input, 3×3 all-ones kernel, padding 1: each output sums the whole input.
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let w = [1.0f32; 9];
        let mut y = [0.0; 4];
        conv2d(&x, Weights::F32(&w), Weights::F32(&[0.5]), ConvShape::same(1, 1, 2, 2, 3), &mut y);
        assert_eq!(y, [10.5; 4]);
    }
}
