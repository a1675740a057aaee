//! The VAE encoder on the matrix tier's half-precision data path, as the
//! decoder's ([`crate::models::vae_nhwc`], whose blocks it shares):
//! activations channels-last and f16 under the range rule's scales, the
//! stream in pieces as its convolutions write it, each GroupNorm applied by
//! the convolution that reads it. The image comes in as the host writes it,
//! `[pixels, 4]` f32 (its three channels and a zero, whole f16 words), and
//! is packed once; each downsampler is a stride-2 convolution of the stream;
//! the posterior's moments leave as f32 rows and are transposed once into
//! the layout's channel-major `moments`, where the host reads the mean.

use crate::arena::BumpArena;
use crate::config::VaeConfig;
use crate::ir::Op;
use crate::models::vae::{band_minimum, prefix, rows, same, VaePlanError};
use crate::models::vae_encoder::{self, downsample, VaeEncoderLayout};
use crate::models::vae_nhwc::{conv, half_rows, mid_block, norm_read, pack, resnet, stream_rows, Stream};

/// The whole encode, channels-last: the image's rows in `image` to the
/// posterior's moments, channel-major, in `moments`.
pub fn encode(l: &VaeEncoderLayout, mut emit: impl FnMut(Op)) {
    let b = &l.stream;
    let (mut h, mut w) = (l.height, l.width);
    let image = half_rows(b.b, h * w, l.in_channels);
    emit(pack(l.image, image, h * w, l.image_row()));
    emit(conv((image, None), "encoder.conv_in", stream_rows(b.a, h * w, l.channels[0]), same(l.in_channels, l.channels[0], h, w, 3), false, None));
    let mut x = Stream { at: b.a, free: [b.b, b.c] };
    let mut cin = l.channels[0];
    for (i, &cout) in l.channels.iter().enumerate() {
        for j in 0..l.layers_per_block {
            let p = prefix(format_args!("encoder.down_blocks.{i}.resnets.{j}"));
            x = resnet(b, &p, (if j == 0 { cin } else { cout }, cout), (h, w), x, &mut emit);
        }
        if i + 1 < l.channels.len() {
            let p = prefix(format_args!("encoder.down_blocks.{i}.downsamplers.0.conv"));
            let [y, z] = x.free;
            let out = stream_rows(y, h * w / 4, cout);
            emit(conv((stream_rows(x.at, h * w, cout), None), &p, out, downsample(cout, h, w), false, None));
            (h, w) = (h / 2, w / 2);
            x = Stream { at: y, free: [x.at, z] };
        }
        cin = cout;
    }
    let top = l.channels[l.channels.len() - 1];
    x = mid_block(b, "encoder", (top, (h, w)), l.attention, x, &mut emit);
    output(l, x, (h, w), &mut emit);
}

/// `conv_norm_out` → SiLU → `conv_out` (→ `quant_conv`) over the stream at
/// the latent's `h × w`, the moments' f32 rows transposed into `moments`.
fn output(l: &VaeEncoderLayout, x: Stream, (h, w): (u64, u64), emit: &mut impl FnMut(Op)) {
    let (top, moments, pixels) = (l.channels[l.channels.len() - 1], 2 * l.latent_channels, h * w);
    let normed = norm_read(&l.stream, stream_rows(x.at, pixels, top), "encoder.conv_norm_out", top, (h, w), true, emit);
    let [y, z] = x.free;
    let f32_rows = if l.quant_conv {
        let half = stream_rows(y, pixels, moments);
        emit(conv(normed, "encoder.conv_out", half, same(top, moments, h, w, 3), false, None));
        emit(conv((half, None), "quant_conv", rows(z, moments).into(), same(moments, moments, h, w, 1), false, None));
        z
    } else {
        emit(conv(normed, "encoder.conv_out", rows(y, moments).into(), same(top, moments, h, w, 3), false, None));
        y
    };
    emit(Op::Transpose { src: rows(f32_rows, moments), dst: rows(l.moments, pixels), rows: pixels, cols: moments });
}

/// The encode of a whole image on its layout's data path: this module's
/// program where it is channels-last, else [`vae_encoder::encode`].
pub fn encode_whole(l: &VaeEncoderLayout, emit: impl FnMut(Op)) {
    match l.channels_last {
        true => encode(l, emit),
        false => vae_encoder::encode(l, emit),
    }
}

/// [`band_minimum`] of the encode of a `height × width` image on a data path.
pub fn encode_band_minimum(cfg: &VaeConfig, height: u64, width: u64, channels_last: bool) -> Result<u64, VaePlanError> {
    let layout = VaeEncoderLayout::new(cfg, height, width, channels_last, &mut BumpArena::new(u64::MAX))?;
    Ok(band_minimum(|emit| encode_whole(&layout, emit)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::klein_4b;
    use crate::ir::Operand;
    use crate::models::vae::assert_program_reads_exactly;

    fn small() -> VaeConfig {
        let mut small = klein_4b::vae();
        small.block_out_channels = heapless::Vec::from_slice(&[16, 32, 32]).unwrap();
        small.decoder_block_out_channels = None;
        small.layers_per_block = 1;
        small.norm_num_groups = 8;
        small.mid_block_add_attention = false;
        small.use_quant_conv = false;
        small
    }

    #[test]
    fn the_channels_last_program_reads_every_encoder_tensor_and_nothing_else() {
        for cfg in [klein_4b::vae(), small()] {
            let unit = 2 << (cfg.block_out_channels.len() - 1);
            let l = VaeEncoderLayout::new(&cfg, 2 * unit, 3 * unit, true, &mut BumpArena::new(u64::MAX / 2)).unwrap();
            let model_has = |n: &str| n.starts_with("encoder.") || n.starts_with("quant_conv.");
            assert_program_reads_exactly(&cfg, |emit| encode(&l, emit), model_has);
        }
    }

    /// Every f16 operand's words and scales lie within the buffer its words
    /// start in; the one transpose is the moments'; no channel-major op is left.
    #[test]
    fn every_operand_fits_the_buffer_it_is_laid_out_in() {
        for cfg in [klein_4b::vae(), small()] {
            let unit = 2 << (cfg.block_out_channels.len() - 1);
            let l = VaeEncoderLayout::new(&cfg, 3 * unit, 2 * unit, true, &mut BumpArena::new(u64::MAX / 2)).unwrap();
            let s = &l.stream;
            let buffer = s.b.offset - s.a.offset;
            let fits = |o: Operand, rows: u64, width: u64| {
                let start = [s.a, s.b, s.c].into_iter().map(|b| b.offset).filter(|&b| b <= o.data.offset).max().unwrap();
                let end = match o.scales {
                    Some(scales) => scales.offset + rows * o.piece.map_or(1, |p| width / p),
                    None => o.data.offset + rows * width,
                };
                assert!(end <= start + buffer, "{o:?}: {rows} rows of {width}");
            };
            let (mut transposes, mut nchw, mut strided) = (0, 0, 0);
            encode(&l, |op| {
                transposes += matches!(op, Op::Transpose { .. }) as u32;
                nchw += matches!(op, Op::Conv2d { .. } | Op::Copy { .. }) as u32;
                nchw += matches!(op, Op::GroupMoments { shape, .. } | Op::GroupNormApply { shape, .. } if !shape.channels_last) as u32;
                if let Op::ConvNhwc { x, y, residual, shape, .. } = op {
                    strided += (shape.stride == 2) as u32;
                    let (pixels, out) = ((shape.height * shape.width) as u64, (shape.out_height * shape.out_width) as u64);
                    fits(x, pixels, shape.in_channels as u64);
                    fits(y, out, shape.out_channels as u64);
                    if let Some(r) = residual {
                        fits(r, out, shape.out_channels as u64);
                    }
                }
            });
            assert_eq!((transposes, nchw, strided), (1, 0, cfg.block_out_channels.len() as u32 - 1));
        }
    }

    #[test]
    fn the_channels_last_arena_is_about_half_the_channel_major_one() {
        let cfg = klein_4b::vae();
        let (f32_bytes, half) = (vae_encoder::arena_bytes(&cfg, 1024, 1024, false).unwrap(), vae_encoder::arena_bytes(&cfg, 1024, 1024, true).unwrap());
        // Three buffers of the widest level's rows (128 channels at full
        // size), f16 with a scale every 32: 68 words a pixel for 128 f32;
        // the image (4 f32 a pixel for 3) and the attention's f32 q, k, v
        // (3 × 512 at 1/64 of the pixels) beside them: 232 vs 411 a pixel.
        assert!(half * 1000 < f32_bytes * 570 && half * 1000 > f32_bytes * 560, "{half} vs {f32_bytes}");
        assert!(vae_encoder::largest_binding(&cfg, 1024, 1024, true) < vae_encoder::largest_binding(&cfg, 1024, 1024, false));
    }
}
