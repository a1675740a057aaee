//! `AutoencoderKLFlux2`'s encoder as one program over an activation arena:
//! an image `[3, H, W]` in [-1, 1] to the posterior mean `[latent_channels,
//! H/s, W/s]`, the mirror of the decoder (`vae.rs`), whose block helpers it
//! shares; channels-last on the matrix tier's f16 data path
//! ([`crate::models::vae_encoder_nhwc`], laid out here alike). Then, on the
//! host, the reference tokens the transformer reads: the mean patchified
//! 2×2, BatchNorm-normalised and packed `[tokens, 4·C]`.

use crate::arena::{ArenaError, BumpArena};
use crate::config::{VaeConfig, MAX_LIST};
use crate::ir::{Op, Span, ALIGN, F32};
use crate::oracle::ConvShape;
use crate::models::group_norm::NormScratch;
use crate::models::vae::{attention_buffers, conv, group_norm, half_elements, mid, prefix, resnet, same, Stream, VaePlanError};

/// Name prefixes of the tensors encoding reads.
pub const WEIGHTS: [&str; 2] = ["encoder.", "quant_conv."];

/// Where each tensor of one encode lives (element offsets into the f32
/// arena), and the encoder dimensions the program needs.
#[derive(Debug, Clone, PartialEq)]
pub struct VaeEncoderLayout {
    /// The image in pixels; multiples of twice the scale factor, so the
    /// latent packs into whole 2×2 tokens.
    pub height: u64,
    pub width: u64,
    pub in_channels: u64,
    pub latent_channels: u64,
    /// Encoder widths by level, finest first (`block_out_channels`).
    pub channels: heapless::Vec<u64, MAX_LIST>,
    pub layers_per_block: u64,
    pub attention: bool,
    pub quant_conv: bool,
    /// The channels-last program's layout ([`Self::image_row`]; f16
    /// activations in the buffers).
    pub channels_last: bool,
    /// Input written by the host: the image `[in_channels, H·W]`, or
    /// channels-last `[H·W, image_row]`.
    pub image: Span,
    /// The three activation buffers, each holding the largest `[C, pixels]`
    /// of the encode, and the mid-block attention's projections `[latent pixels, C_top]`.
    pub stream: Stream,
    /// The posterior's moments `[2·latent_channels, h·w]`: the mean is the
    /// first `latent_channels` rows (the log-variance, unused, the rest).
    pub moments: Span,
}

impl VaeEncoderLayout {
    /// Lays out the encode of a `height × width` image in `arena`,
    /// channel-major f32, or for the channels-last program where
    /// `channels_last` (f16 activations: the buffers about half the size).
    pub fn new(cfg: &VaeConfig, height: u64, width: u64, channels_last: bool, arena: &mut BumpArena) -> Result<Self, VaePlanError> {
        let mut channels = heapless::Vec::new();
        for &c in cfg.block_out_channels.iter() {
            channels.push(c as u64).map_err(|_| VaePlanError::Size("too many VAE levels"))?;
        }
        let unit = 2u64 << (channels.len() - 1);
        if height == 0 || width == 0 || !height.is_multiple_of(unit) || !width.is_multiple_of(unit) {
            return Err(VaePlanError::Size("the image's height and width must be positive multiples of twice the VAE scale factor"));
        }
        let top = *channels.last().ok_or(VaePlanError::Size("the VAE has no levels"))?;
        let levels = channels.len() as u32;
        let latent_pixels = (height >> (levels - 1)) * (width >> (levels - 1));
        let lc = cfg.latent_channels as u64;
        let largest = largest_on_path(&channels, [height * width, latent_pixels], lc, channels_last);
        let mut take = |elems: u64| -> Result<Span, ArenaError> {
            let s = arena.alloc(elems * F32, ALIGN)?;
            Ok(Span::new(s.offset / F32, 0))
        };
        let image = take(image_row(cfg.in_channels as u64, channels_last) * height * width)?;
        let (a, b, c) = (take(largest)?, take(largest)?, take(largest)?);
        let (q, k, v, attend) = attention_buffers(&mut take, cfg.mid_block_add_attention.then_some((latent_pixels, top)), channels_last, (largest, a))?;
        let moments = take(2 * lc * latent_pixels)?;
        let groups = cfg.norm_num_groups as u64;
        let norm = NormScratch::at(take(NormScratch::elements(groups, height))?, groups);
        Ok(Self {
            height,
            width,
            in_channels: cfg.in_channels as u64,
            latent_channels: lc,
            channels,
            layers_per_block: cfg.layers_per_block as u64,
            attention: cfg.mid_block_add_attention,
            quant_conv: cfg.use_quant_conv,
            channels_last,
            image,
            stream: Stream { a, b, c, q, k, v, attend, groups, norm },
            moments,
        })
    }

    /// Values of a pixel of the image as the host writes it: its channels,
    /// channels-last as many as make whole f16 words (the last zero).
    pub fn image_row(&self) -> u64 {
        image_row(self.in_channels, self.channels_last)
    }

    /// Pixels per latent cell.
    pub fn scale(&self) -> u64 {
        1 << (self.channels.len() - 1)
    }

    /// The latent grid (height, width) in cells.
    pub fn latent_size(&self) -> (u64, u64) {
        (self.height / self.scale(), self.width / self.scale())
    }

    /// Elements of the posterior mean `[latent_channels, h·w]` at the start of `moments`.
    pub fn mean_len(&self) -> u64 {
        let (h, w) = self.latent_size();
        self.latent_channels * h * w
    }
}

/// A pixel's values of the image as the host writes it ([`VaeEncoderLayout::image_row`]).
pub fn image_row(in_channels: u64, channels_last: bool) -> u64 {
    if channels_last { in_channels.next_multiple_of(2) } else { in_channels }
}

/// Each level's widest activation `(pixels, channels)` for an image of
/// `pixels` pixels: its widest resnet at its resolution.
fn each_level(channels: &[u64], pixels: u64, mut f: impl FnMut(u64, u64)) {
    let (mut cin, mut level_pixels) = (channels[0], pixels);
    for (i, &cout) in channels.iter().enumerate() {
        f(level_pixels, cin.max(cout));
        if i + 1 < channels.len() {
            level_pixels /= 4;
        }
        cin = cout;
    }
}

/// The most elements any `[C, pixels]` activation of the encode holds, for
/// an image of `pixels` pixels.
fn largest_activation(channels: &[u64], pixels: u64) -> u64 {
    let mut most = 0;
    each_level(channels, pixels, |p, c| most = most.max(p * c));
    most
}

/// The most elements any activation of the channels-last encode holds: a
/// level's f16 rows (words and scales) at its resolution, and beside them,
/// `f32_beside` (the attention's output and the moments' f32 rows).
fn largest_channels_last(channels: &[u64], pixels: u64, f32_beside: u64) -> u64 {
    let mut most = f32_beside;
    each_level(channels, pixels, |p, c| most = most.max(half_elements(p, c)));
    most
}

/// The most elements one of the encode's activation buffers holds for an
/// image of `pixels` pixels and its latent of `latent_pixels`: channel-major
/// f32, or channels-last where `channels_last` (beside the f16 levels, the
/// attention's f32 output and the moments' f32 rows at the latent's size).
fn largest_on_path(channels: &[u64], [pixels, latent_pixels]: [u64; 2], latent_channels: u64, channels_last: bool) -> u64 {
    let top = channels[channels.len() - 1];
    match channels_last {
        true => largest_channels_last(channels, pixels, latent_pixels * top.max(2 * latent_channels)),
        false => largest_activation(channels, pixels),
    }
}

/// Bytes of the largest single tensor of the encode of a `height × width`
/// image (what one storage binding must hold), channels-last where `channels_last`.
pub fn largest_binding(cfg: &VaeConfig, height: u64, width: u64, channels_last: bool) -> u64 {
    let channels: heapless::Vec<u64, MAX_LIST> = cfg.block_out_channels.iter().map(|&c| c as u64).collect();
    if channels.is_empty() {
        return 0;
    }
    let scale = 1u64 << (channels.len() - 1);
    let latent_pixels = (height / scale) * (width / scale);
    let top = channels[channels.len() - 1];
    let image = image_row(cfg.in_channels as u64, channels_last) * height * width;
    let activations = largest_on_path(&channels, [height * width, latent_pixels], cfg.latent_channels as u64, channels_last);
    F32 * activations.max(image).max(latent_pixels * top)
}

/// Bytes of the arena that encodes a `height × width` image in one pass
/// (channels-last where `channels_last`).
pub fn arena_bytes(cfg: &VaeConfig, height: u64, width: u64, channels_last: bool) -> Result<u64, VaePlanError> {
    let mut arena = BumpArena::new(u64::MAX);
    VaeEncoderLayout::new(cfg, height, width, channels_last, &mut arena)?;
    Ok(arena.high_water())
}

/// f32 elements of band operands when the encoder has the device memory of
/// an untiled `tile × tile`-pixel image, within one binding of `max_binding` bytes.
pub fn band_capacity(cfg: &VaeConfig, tile: u64, max_binding: u64, channels_last: bool) -> Result<u64, VaePlanError> {
    Ok(arena_bytes(cfg, tile, tile, channels_last)?.min(max_binding) / 4)
}

/// The whole encode, channel-major: the image in `image` to the posterior's moments in `moments`.
pub fn encode(l: &VaeEncoderLayout, mut emit: impl FnMut(Op)) {
    let s = &l.stream;
    let (mut h, mut w) = (l.height, l.width);
    emit(conv(l.image, "encoder.conv_in", s.a, same(l.in_channels, l.channels[0], h, w, 3)));
    let mut cin = l.channels[0];
    for (i, &cout) in l.channels.iter().enumerate() {
        for j in 0..l.layers_per_block {
            let p = prefix(format_args!("encoder.down_blocks.{i}.resnets.{j}"));
            resnet(s, &p, if j == 0 { cin } else { cout }, cout, h, w, &mut emit);
        }
        if i + 1 < l.channels.len() {
            let p = prefix(format_args!("encoder.down_blocks.{i}.downsamplers.0.conv"));
            emit(conv(s.a, &p, s.b, downsample(cout, h, w)));
            (h, w) = (h / 2, w / 2);
            emit(Op::Copy { src: Span::new(s.b.offset, h * w), dst: Span::new(s.a.offset, h * w), rows: cout, cols: h * w });
        }
        cin = cout;
    }
    let top = l.channels[l.channels.len() - 1];
    mid(s, "encoder", l.attention, top, h, w, &mut emit);
    group_norm(s, [s.a, s.b], "encoder.conv_norm_out", s.norm_shape(top, h, w), true, &mut emit);
    let moments = 2 * l.latent_channels;
    if l.quant_conv {
        emit(conv(s.b, "encoder.conv_out", s.c, same(top, moments, h, w, 3)));
        emit(conv(s.c, "quant_conv", l.moments, same(moments, moments, h, w, 1)));
    } else {
        emit(conv(s.b, "encoder.conv_out", l.moments, same(top, moments, h, w, 3)));
    }
}

/// `Downsample2D` with `padding=0`: zero-pad one row below and one column
/// right, then a 3×3 convolution of stride 2, halving an even `h × w`.
pub(crate) fn downsample(channels: u64, h: u64, w: u64) -> ConvShape {
    ConvShape {
        in_channels: channels as usize,
        out_channels: channels as usize,
        height: h as usize,
        width: w as usize,
        kernel: 3,
        stride: 2,
        pad_top: 0,
        pad_left: 0,
        out_height: (h / 2) as usize,
        out_width: (w / 2) as usize,
    }
}

/// The reference tokens of a posterior mean `[channels, h, w]` (h, w even),
/// as the pipeline makes them: patchify 2×2 (channel `c·4 + py·2 + px` of
/// token `(y, x)` is `mean[c, 2y + py, 2x + px]`), normalise each of the
/// `4·channels` with the VAE's BatchNorm statistics, `(x − μ) / √(σ² + eps)`
/// in f32, and pack into `out` `[(h/2)·(w/2), 4·channels]`.
pub fn reference_tokens(mean: &[f32], bn_mean: &[f32], bn_var: &[f32], [channels, h, w]: [usize; 3], eps: f32, out: &mut [f32]) {
    let features = 4 * channels;
    let (th, tw) = (h / 2, w / 2);
    assert!(mean.len() == channels * h * w && out.len() == th * tw * features, "reference_tokens: sizes disagree");
    assert!(bn_mean.len() == features && bn_var.len() == features, "reference_tokens: BatchNorm has {} channels, not {features}", bn_mean.len());
    for y in 0..th {
        for x in 0..tw {
            let token = &mut out[(y * tw + x) * features..][..features];
            for c in 0..channels {
                for (py, px) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    let f = c * 4 + py * 2 + px;
                    let v = mean[(c * h + 2 * y + py) * w + 2 * x + px];
                    token[f] = (v - bn_mean[f]) / libm::sqrtf(bn_var[f] + eps);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::klein_4b;

    fn assert_reads_every_encoder_tensor(cfg: &VaeConfig) {
        let unit = 2 << (cfg.block_out_channels.len() - 1);
        let l = VaeEncoderLayout::new(cfg, 2 * unit, 3 * unit, false, &mut BumpArena::new(u64::MAX / 2)).unwrap();
        let model_has = |n: &str| n.starts_with("encoder.") || n.starts_with("quant_conv.");
        crate::models::vae::assert_program_reads_exactly(cfg, |emit| encode(&l, emit), model_has);
    }

    #[test]
    fn the_program_reads_every_encoder_tensor_and_nothing_else() {
        assert_reads_every_encoder_tensor(&klein_4b::vae());
        let mut small = klein_4b::vae();
        small.block_out_channels = heapless::Vec::from_slice(&[16, 32, 32]).unwrap();
        small.decoder_block_out_channels = None;
        small.layers_per_block = 1;
        small.mid_block_add_attention = false;
        small.use_quant_conv = false;
        assert_reads_every_encoder_tensor(&small);
    }

    #[test]
    fn sizes_that_do_not_pack_into_tokens_are_refused() {
        let cfg = klein_4b::vae();
        for (h, w) in [(0, 16), (16, 8), (24, 16), (16, 1000)] {
            assert!(VaeEncoderLayout::new(&cfg, h, w, false, &mut BumpArena::new(u64::MAX / 2)).is_err(), "{h}×{w}");
        }
        assert!(VaeEncoderLayout::new(&cfg, 16, 32, false, &mut BumpArena::new(u64::MAX / 2)).is_ok());
    }

    #[test]
    fn the_arena_holds_three_of_the_largest_activation_and_grows_with_the_image() {
        let cfg = klein_4b::vae();
        let small = arena_bytes(&cfg, 64, 64, false).unwrap();
        let large = arena_bytes(&cfg, 128, 128, false).unwrap();
        // conv_in's 128 channels at full resolution dominate: 3 × 128 × pixels f32, plus the image.
        assert!(small >= 3 * 128 * 64 * 64 * 4 + 3 * 64 * 64 * 4);
        assert!(large > 3 * small, "{large} vs {small}");
    }

    #[test]
    fn reference_tokens_patchify_then_normalise() {
        // channels 1, 2×4 latent: two tokens of four features.
        let mean = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0];
        let bn_mean = [1.0, 0.0, 0.0, 0.0];
        let bn_var = [3.0, 0.0, 0.0, 0.0];
        let mut out = [0.0; 8];
        reference_tokens(&mean, &bn_mean, &bn_var, [1, 2, 4], 1.0, &mut out);
        // Token (0, 0) holds (y, x) = (0,0), (0,1), (1,0), (1,1); token (0, 1) the next two columns.
        assert_eq!(out, [-0.5, 1.0, 4.0, 5.0, 0.5, 3.0, 6.0, 7.0]);
    }
}
