//! The VAE decoder on the matrix tier's half-precision data path: activations
//! channels-last (`[pixels, channels]` rows, a pixel's channels side by side),
//! the residual stream f32, and every convolution's input f16 rows under one
//! range scale a pixel, written by the op before it (a GroupNorm + SiLU, or a
//! pack of the stream), so no pass measures a convolution's input. The ×2
//! upsampling is read through by the convolution after it, and the mid-block
//! attention's tokens are the stream's rows (no transposes).
//!
//! Laid out in [`VaeLayout`]'s buffers: the stream in `a`, the next
//! convolution's f16 input (words, then a scale a pixel) in `b`, a block's
//! f32 intermediate in `c`, the attention's projections in `q`, `k`, `v`,
//! and the GroupNorms' statistics in the stream's `norm`. The decoded image lands channels-last in `decoded`, its
//! 8-bit levels interleaved RGB in `levels`.

use crate::ir::{name, GroupShape, Op, Operand, Span};
use crate::models::group_norm;
use crate::models::vae::{attention_projection, carried_attention, denorm_unpatchify, prefix, rows, same, Stream, UpBlock, VaeLayout, NORM_EPS};
use crate::oracle::ConvShape;

/// `buf` holding `pixels` f16 rows of `channels` (words, then the scales).
pub fn half_rows(buf: Span, pixels: u64, channels: u64) -> Operand {
    Operand::half_rows(Span::new(buf.offset, channels / 2), Span::new(buf.offset + pixels * channels / 2, 1))
}

fn conv(x: Operand, p: &str, y: Span, shape: ConvShape, residual: bool) -> Op {
    conv_read(x, p, y, shape, false, residual)
}

/// [`conv`] with its input read through the ×2 upsampling where `upsample`.
fn conv_read(x: Operand, p: &str, y: Span, shape: ConvShape, upsample: bool, residual: bool) -> Op {
    Op::ConvNhwc { x, w: name(format_args!("{p}.weight")), bias: name(format_args!("{p}.bias")), y, shape, upsample, residual }
}

/// The f32 rows of `src` packed as the next convolution's f16 input in `b`.
fn pack(src: Span, dst: Operand, pixels: u64, channels: u64) -> Op {
    let scales = dst.scales.unwrap_or(dst.data);
    Op::HalfPack { src: rows(src, channels), dst: dst.data, scales, tokens: pixels, heads: 1, head_dim: channels }
}

/// GroupNorm `p` of the stream's rows `src` (`channels` at `h × w`) into
/// the next convolution's f16 input in `b`, SiLU after where `silu`.
fn group_norm(l: &VaeLayout, src: Span, p: &str, channels: u64, (h, w): (u64, u64), silu: bool, emit: &mut impl FnMut(Op)) {
    let s = &l.stream;
    let shape = GroupShape { channels, pixels: h * w, width: w, groups: s.groups, channels_last: true };
    group_norm::group_norm(s.norm, (rows(src, channels), half_rows(s.b, h * w, channels)), p, shape, NORM_EPS, silu, emit);
}

/// Packed latents to the decoder's first activation (in `a`): de-normalise
/// and unpatchify, the latent's rows channels-last and packed as f16,
/// `post_quant_conv` when the model has it, `conv_in`.
pub fn input(l: &VaeLayout, mut emit: impl FnMut(Op)) {
    let (h, w, lc) = (l.latent_h, l.latent_w, l.latent_channels);
    let (s, pixels) = (&l.stream, h * w);
    emit(denorm_unpatchify(l.packed, l.latent, lc, (h, w), l.bn_eps));
    emit(Op::Transpose { src: rows(l.latent, pixels), dst: rows(s.c, lc), rows: lc, cols: pixels });
    let x = half_rows(s.b, pixels, lc);
    emit(pack(s.c, x, pixels, lc));
    if l.post_quant_conv {
        emit(conv(x, "post_quant_conv", rows(s.c, lc), same(lc, lc, h, w, 1), false));
        emit(pack(s.c, x, pixels, lc));
    }
    emit(conv(x, "decoder.conv_in", rows(s.a, l.top()), same(lc, l.top(), h, w, 3), false));
}

/// `ResnetBlock2D` on the stream in `a`. Without a shortcut convolution,
/// conv2 adds onto `a`; with one, conv2 goes to `c`, the shortcut (over the
/// stream packed as f16) adds onto it, and the sum becomes the stream.
fn resnet(l: &VaeLayout, p: &str, cin: u64, cout: u64, h: u64, w: u64, emit: &mut impl FnMut(Op)) {
    let (s, pixels) = (&l.stream, h * w);
    let x = |c| half_rows(s.b, pixels, c);
    group_norm(l, s.a, &prefix(format_args!("{p}.norm1")), cin, (h, w), true, emit);
    emit(conv(x(cin), &prefix(format_args!("{p}.conv1")), rows(s.c, cout), same(cin, cout, h, w, 3), false));
    group_norm(l, s.c, &prefix(format_args!("{p}.norm2")), cout, (h, w), true, emit);
    if cin == cout {
        emit(conv(x(cout), &prefix(format_args!("{p}.conv2")), rows(s.a, cout), same(cout, cout, h, w, 3), true));
        return;
    }
    emit(conv(x(cout), &prefix(format_args!("{p}.conv2")), rows(s.c, cout), same(cout, cout, h, w, 3), false));
    emit(pack(s.a, x(cin), pixels, cin));
    emit(conv(x(cin), &prefix(format_args!("{p}.conv_shortcut")), rows(s.c, cout), same(cin, cout, h, w, 1), true));
    emit(Op::Copy { src: rows(s.c, cout), dst: rows(s.a, cout), rows: pixels, cols: cout });
}

/// The mid-block attention `p` on the stream in `a`: one head as wide as
/// the `c` channels over every pixel, its tokens the stream's rows; the
/// projections read the GroupNorm's f16 rows.
fn attention(l: &VaeLayout, p: &str, c: u64, (h, w): (u64, u64), emit: &mut impl FnMut(Op)) {
    let (s, pixels): (&Stream, u64) = (&l.stream, h * w);
    group_norm(l, s.a, &prefix(format_args!("{p}.group_norm")), c, (h, w), false, emit);
    for (proj, dst) in [("to_q", s.q), ("to_k", s.k), ("to_v", s.v)] {
        emit(attention_projection(half_rows(s.b, pixels, c), p, proj, dst, pixels, c));
    }
    let (q, k, v) = (rows(s.q, c), rows(s.k, c), rows(s.v, c));
    emit(carried_attention([q, k, v, rows(s.c, c)], pixels, c));
    emit(attention_projection(rows(s.c, c).into(), p, "to_out.0", s.b, pixels, c));
    emit(Op::Residual { dst: rows(s.a, c), y: rows(s.b, c), rows: pixels, cols: c });
}

/// `decoder.mid_block`: resnet, attention (when the model has it), resnet.
pub fn mid_block(l: &VaeLayout, mut emit: impl FnMut(Op)) {
    let (c, h, w) = (l.top(), l.latent_h, l.latent_w);
    resnet(l, "decoder.mid_block.resnets.0", c, c, h, w, &mut emit);
    if l.attention {
        attention(l, "decoder.mid_block.attentions.0", c, (h, w), &mut emit);
    }
    resnet(l, "decoder.mid_block.resnets.1", c, c, h, w, &mut emit);
}

/// `decoder.up_blocks.{i}`: `layers_per_block + 1` resnets, then (on every
/// block but the last) the stream packed at its own size and convolved 3×3
/// through the ×2 upsampling.
pub fn up_block(l: &VaeLayout, i: usize, mut emit: impl FnMut(Op)) {
    let UpBlock { cin, cout, h, w } = l.up_block(i);
    for j in 0..=l.layers_per_block {
        let p = prefix(format_args!("decoder.up_blocks.{i}.resnets.{j}"));
        resnet(l, &p, if j == 0 { cin } else { cout }, cout, h, w, &mut emit);
    }
    if i + 1 < l.channels.len() {
        let s = &l.stream;
        let x = half_rows(s.b, h * w, cout);
        emit(pack(s.a, x, h * w, cout));
        let p = prefix(format_args!("decoder.up_blocks.{i}.upsamplers.0.conv"));
        let shape = ConvShape { out_height: 2 * h as usize, out_width: 2 * w as usize, ..same(cout, cout, h, w, 3) };
        emit(conv_read(x, &p, rows(s.a, cout), shape, true, false));
    }
}

/// `conv_norm_out` → SiLU → `conv_out`, into `decoded` (channels-last).
pub fn output(l: &VaeLayout, mut emit: impl FnMut(Op)) {
    let (h, w) = l.image_size();
    let c0 = l.channels[0];
    group_norm(l, l.stream.a, "decoder.conv_norm_out", c0, (h, w), true, &mut emit);
    emit(conv(half_rows(l.stream.b, h * w, c0), "decoder.conv_out", rows(l.decoded, l.out_channels), same(c0, l.out_channels, h, w, 3), false));
}

/// The whole decode, then the output's 8-bit levels into `levels`, interleaved RGB.
pub fn decode_to_levels(l: &VaeLayout, mut emit: impl FnMut(Op)) {
    input(l, &mut emit);
    mid_block(l, &mut emit);
    for i in 0..l.channels.len() {
        up_block(l, i, &mut emit);
    }
    output(l, &mut emit);
    emit(Op::PixelLevels { src: l.decoded, dst: l.levels, count: l.decoded_len() });
}

/// The decode of a whole image to its 8-bit levels on a data path: where
/// the device's products take f16 inputs (`channels_last`), this module's
/// (levels interleaved RGB); else the channel-major program of
/// [`crate::models::vae`] (levels planar, `[3, pixels]`).
pub fn decode_whole(l: &VaeLayout, channels_last: bool, emit: impl FnMut(Op)) {
    match channels_last {
        true => decode_to_levels(l, emit),
        false => crate::models::vae::decode_to_levels(l, emit),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::BumpArena;
    use crate::config::klein_4b;
    use crate::models::vae::assert_program_reads_exactly;

    #[test]
    fn the_channels_last_program_reads_every_decoder_tensor_and_nothing_else() {
        for cfg in [klein_4b::vae(), {
            let mut small = klein_4b::vae();
            small.block_out_channels = heapless::Vec::from_slice(&[16, 32, 32]).unwrap();
            small.layers_per_block = 1;
            small.norm_num_groups = 8;
            small.mid_block_add_attention = false;
            small.use_post_quant_conv = false;
            small
        }] {
            let l = VaeLayout::new(&cfg, 8, 6, &mut BumpArena::new(u64::MAX / 2)).unwrap();
            let model_has = |n: &str| n.starts_with("decoder.") || n.starts_with("post_quant_conv.") || n.starts_with("bn.running_");
            assert_program_reads_exactly(&cfg, |emit| decode_to_levels(&l, emit), model_has);
        }
    }

    #[test]
    fn every_operand_fits_the_buffer_it_is_laid_out_in() {
        let cfg = klein_4b::vae();
        let l = VaeLayout::new(&cfg, 16, 12, &mut BumpArena::new(u64::MAX / 2)).unwrap();
        let buffer = l.stream.b.offset - l.stream.a.offset;
        let (mut transposes, mut nchw) = (0, 0);
        decode_to_levels(&l, |op| {
            transposes += matches!(op, Op::Transpose { .. }) as u32;
            nchw += matches!(op, Op::Conv2d { .. } | Op::UpsampleNearest2x { .. }) as u32;
            nchw += matches!(op, Op::GroupMoments { shape, .. } | Op::GroupNormApply { shape, .. } if !shape.channels_last) as u32;
            if let Op::ConvNhwc { x, shape, .. } = op {
                // Words and a scale a pixel, within `b`.
                let pixels = (shape.height * shape.width) as u64;
                let scales = x.scales.unwrap();
                assert!(scales.offset + pixels <= l.stream.b.offset + buffer, "{shape:?}");
            }
        });
        // The latent's rows are the one transpose; no channel-major op is left.
        assert_eq!((transposes, nchw), (1, 0));
    }
}
