//! The VAE decoder on the matrix tier's half-precision data path: activations
//! channels-last (`[pixels, channels]` rows, a pixel's channels side by side)
//! and f16 under the range rule's power-of-two scales. The stream (each
//! block's output, what the next block reads and adds onto) is f16 rows in
//! pieces of [`STREAM_PIECE`] channels, each under its own scale, as the
//! convolution that writes it holds them (its epilogue adds the bias and the
//! residual and rounds). A convolution after a GroupNorm (+ SiLU) reads the
//! stream and normalises it as it reads: the GroupNorm is its statistics
//! alone (each image row's moments, their merge), and no pass writes the
//! normalised tensor. No pass measures a convolution's input or packs the
//! stream, and the ×2 upsampling is read through by the convolution after
//! it. The mid-block attention's tokens are pixels (no transposes); its
//! projections are f32 rows, its scores and weighted sum products on the
//! matrix core over fixed chunks of keys with the softmax carried between
//! them (which keeps bands exact), its output projection a 1×1 convolution
//! onto the stream.
//!
//! Laid out in [`VaeLayout`]'s buffers `a`, `b`, `c`, which the stream and
//! a block's intermediates take in turn (a convolution never writes what it
//! reads), `q`, `k`, `v` the attention's projections, the stream's `norm`
//! the GroupNorms' statistics. The decoded image lands channels-last in
//! `decoded`, its 8-bit levels interleaved RGB in `levels`.

use crate::ir::{name, GroupShape, InputNorm, NormActivation, Op, Operand, Span};
use crate::models::group_norm;
use crate::models::vae::{attention_projection, band_minimum, denorm_unpatchify, prefix, rows, same, stream_piece, Stream as Buffers, UpBlock, VaePlanError, VaeLayout, NORM_EPS};
use crate::arena::BumpArena;
use crate::config::VaeConfig;
use crate::oracle::ConvShape;

/// `buf` holding `pixels` f16 rows of `channels` (words, then the scales;
/// an odd count's row whole words, its last half zero).
pub fn half_rows(buf: Span, pixels: u64, channels: u64) -> Operand {
    let words = channels.div_ceil(2);
    Operand::half_rows(Span::new(buf.offset, words), Span::new(buf.offset + pixels * words, 1))
}

/// `buf` holding the stream: `pixels` f16 rows of `channels` in pieces
/// (words, then each pixel's pieces' scales).
pub fn stream_rows(buf: Span, pixels: u64, channels: u64) -> Operand {
    let piece = stream_piece(channels);
    Operand::half_pieces(Span::new(buf.offset, channels / 2), Span::new(buf.offset + pixels * channels / 2, channels / piece), piece)
}

/// Convolution `p` (its `weight` and `bias`) of `x` into `y`, normalised as
/// read by `norm`, the residual `onto` added, the input read through the
/// ×2 upsampling where `upsample`.
pub(crate) fn conv((x, norm): (Operand, Option<InputNorm>), p: &str, y: Operand, shape: ConvShape, upsample: bool, onto: Option<Operand>) -> Op {
    Op::ConvNhwc { x, w: name(format_args!("{p}.weight")), bias: name(format_args!("{p}.bias")), y, shape, upsample, residual: onto, norm, relu: false }
}

/// The f32 rows of `src` packed as a convolution's f16 input `dst`.
pub(crate) fn pack(src: Span, dst: Operand, pixels: u64, channels: u64) -> Op {
    let scales = dst.scales.unwrap_or(dst.data);
    Op::HalfPack { src: rows(src, channels), dst: dst.data, scales, tokens: pixels, heads: 1, head_dim: channels }
}

/// Where the stream is, and the two buffers free for a block's intermediates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stream {
    pub at: Span,
    pub free: [Span; 2],
}

/// `channels` at `h × w`, channels-last, as its GroupNorm takes it.
fn norm_shape(b: &Buffers, channels: u64, (h, w): (u64, u64)) -> GroupShape {
    GroupShape { channels, pixels: h * w, width: w, groups: b.groups, channels_last: true }
}

/// GroupNorm `p` of the stream `src` (`channels` at `h × w`) for the
/// convolution that reads it: its statistics, SiLU after where `silu`.
pub(crate) fn norm_read(b: &Buffers, src: Operand, p: &str, channels: u64, hw: (u64, u64), silu: bool, emit: &mut impl FnMut(Op)) -> (Operand, Option<InputNorm>) {
    let activation = if silu { NormActivation::Silu } else { NormActivation::None };
    let norm = group_norm::group_norm_read(b.norm, src, p, norm_shape(b, channels, hw), NORM_EPS, activation, emit);
    (src, Some(norm))
}

/// Packed latents to the decoder's first activation, the stream in `a`:
/// de-normalise and unpatchify, the latent's rows channels-last and packed
/// as f16, `post_quant_conv` when the model has it, `conv_in`.
fn input(l: &VaeLayout, emit: &mut impl FnMut(Op)) -> Stream {
    let (h, w, lc) = (l.latent_h, l.latent_w, l.latent_channels);
    let (s, pixels) = (&l.stream, h * w);
    emit(denorm_unpatchify(l.packed, l.latent, lc, (h, w), l.bn_eps));
    emit(Op::Transpose { src: rows(l.latent, pixels), dst: rows(s.c, lc), rows: lc, cols: pixels });
    let x = half_rows(s.b, pixels, lc);
    emit(pack(s.c, x, pixels, lc));
    if l.post_quant_conv {
        emit(conv((x, None), "post_quant_conv", rows(s.c, lc).into(), same(lc, lc, h, w, 1), false, None));
        emit(pack(s.c, x, pixels, lc));
    }
    emit(conv((x, None), "decoder.conv_in", stream_rows(s.a, pixels, l.top()), same(lc, l.top(), h, w, 3), false, None));
    Stream { at: s.a, free: [s.b, s.c] }
}

/// `ResnetBlock2D` on the stream `x`: conv1 over norm1 of it, conv2 over
/// norm2 of that, onto the stream (or, with a shortcut convolution, onto
/// the shortcut's output over the stream). Each convolution writes a buffer
/// no op after it reads before its output is used.
pub(crate) fn resnet(b: &Buffers, p: &str, (cin, cout): (u64, u64), hw: (u64, u64), x: Stream, emit: &mut impl FnMut(Op)) -> Stream {
    let (h, w) = hw;
    let stream = |at: Span, c: u64| stream_rows(at, h * w, c);
    let [y, z] = x.free;
    let normed = norm_read(b, stream(x.at, cin), &prefix(format_args!("{p}.norm1")), cin, hw, true, emit);
    emit(conv(normed, &prefix(format_args!("{p}.conv1")), stream(y, cout), same(cin, cout, h, w, 3), false, None));
    // conv2's output and what it adds onto: the stream, or the shortcut's output.
    let (out, onto, free) = if cin == cout {
        (z, stream(x.at, cout), [x.at, y])
    } else {
        emit(conv((stream(x.at, cin), None), &prefix(format_args!("{p}.conv_shortcut")), stream(z, cout), same(cin, cout, h, w, 1), false, None));
        (x.at, stream(z, cout), [y, z])
    };
    let normed = norm_read(b, stream(y, cout), &prefix(format_args!("{p}.norm2")), cout, hw, true, emit);
    emit(conv(normed, &prefix(format_args!("{p}.conv2")), stream(out, cout), same(cout, cout, h, w, 3), false, Some(onto)));
    Stream { at: out, free }
}

/// The mid-block attention `p` on the stream: one head as wide as the `c`
/// channels over every pixel, its tokens the pixels; the projections read
/// the GroupNorm's f16 rows, the output projection (a 1×1 convolution over
/// the attention's output packed as f16) adds the stream.
fn attention(s: &Buffers, p: &str, c: u64, (h, w): (u64, u64), x: Stream, emit: &mut impl FnMut(Op)) -> Stream {
    let pixels = h * w;
    let [y, z] = x.free;
    let normed = half_rows(y, pixels, c);
    group_norm::group_norm(s.norm, (stream_rows(x.at, pixels, c), normed), &prefix(format_args!("{p}.group_norm")), norm_shape(s, c, (h, w)), NORM_EPS, false, emit);
    for (proj, dst) in [("to_q", s.q), ("to_k", s.k), ("to_v", s.v)] {
        emit(attention_projection(normed, p, proj, dst, pixels, c));
    }
    let (q, k, v) = (rows(s.q, c), rows(s.k, c), rows(s.v, c));
    // The buffer that held the normalised rows is free until the output's pack.
    let scratch = s.attend.unwrap_or(y);
    emit(Op::ChunkedAttention { q, k, v, o: rows(z, c), scratch, q_len: pixels, kv_len: pixels, head_dim: c, carry: None });
    emit(pack(z, normed, pixels, c));
    let to_out = prefix(format_args!("{p}.to_out.0"));
    emit(conv((normed, None), &to_out, stream_rows(z, pixels, c), same(c, c, h, w, 1), false, Some(stream_rows(x.at, pixels, c))));
    Stream { at: z, free: [x.at, y] }
}

/// `{coder}.mid_block` over `c` channels at `hw`: resnet, attention (where
/// `attend`: the model has it), resnet.
pub(crate) fn mid_block(b: &Buffers, coder: &str, (c, hw): (u64, (u64, u64)), attend: bool, x: Stream, emit: &mut impl FnMut(Op)) -> Stream {
    let mut x = resnet(b, &prefix(format_args!("{coder}.mid_block.resnets.0")), (c, c), hw, x, emit);
    if attend {
        x = attention(b, &prefix(format_args!("{coder}.mid_block.attentions.0")), c, hw, x, emit);
    }
    resnet(b, &prefix(format_args!("{coder}.mid_block.resnets.1")), (c, c), hw, x, emit)
}

/// `decoder.up_blocks.{i}`: `layers_per_block + 1` resnets, then (on every
/// block but the last) the stream convolved 3×3 through the ×2 upsampling.
fn up_block(l: &VaeLayout, i: usize, mut x: Stream, emit: &mut impl FnMut(Op)) -> Stream {
    let UpBlock { cin, cout, h, w } = l.up_block(i);
    for j in 0..=l.layers_per_block {
        let p = prefix(format_args!("decoder.up_blocks.{i}.resnets.{j}"));
        x = resnet(&l.stream, &p, (if j == 0 { cin } else { cout }, cout), (h, w), x, emit);
    }
    if i + 1 < l.channels.len() {
        let p = prefix(format_args!("decoder.up_blocks.{i}.upsamplers.0.conv"));
        let shape = ConvShape { out_height: 2 * h as usize, out_width: 2 * w as usize, ..same(cout, cout, h, w, 3) };
        let [y, z] = x.free;
        emit(conv((stream_rows(x.at, h * w, cout), None), &p, stream_rows(y, 4 * h * w, cout), shape, true, None));
        x = Stream { at: y, free: [x.at, z] };
    }
    x
}

/// `conv_norm_out` → SiLU → `conv_out` over the stream, into `decoded` (channels-last f32).
fn output(l: &VaeLayout, x: Stream, emit: &mut impl FnMut(Op)) {
    let (h, w) = l.image_size();
    let c0 = l.channels[0];
    let normed = norm_read(&l.stream, stream_rows(x.at, h * w, c0), "decoder.conv_norm_out", c0, (h, w), true, emit);
    emit(conv(normed, "decoder.conv_out", rows(l.decoded, l.out_channels).into(), same(c0, l.out_channels, h, w, 3), false, None));
}

/// The whole decode, then the output's 8-bit levels into `levels`, interleaved RGB.
pub fn decode_to_levels(l: &VaeLayout, mut emit: impl FnMut(Op)) {
    let mut x = input(l, &mut emit);
    x = mid_block(&l.stream, "decoder", (l.top(), (l.latent_h, l.latent_w)), l.attention, x, &mut emit);
    for i in 0..l.channels.len() {
        x = up_block(l, i, x, &mut emit);
    }
    output(l, x, &mut emit);
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

/// [`band_minimum`] of the decode of a `latent_h × latent_w`-cell latent on a data path.
pub fn decode_band_minimum(cfg: &VaeConfig, latent_h: u64, latent_w: u64, channels_last: bool) -> Result<u64, VaePlanError> {
    let layout = VaeLayout::new(cfg, latent_h, latent_w, channels_last, &mut BumpArena::new(u64::MAX))?;
    Ok(band_minimum(|emit| decode_whole(&layout, channels_last, emit)))
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
            let l = VaeLayout::new(&cfg, 8, 6, true, &mut BumpArena::new(u64::MAX / 2)).unwrap();
            let model_has = |n: &str| n.starts_with("decoder.") || n.starts_with("post_quant_conv.") || n.starts_with("bn.running_");
            assert_program_reads_exactly(&cfg, |emit| decode_to_levels(&l, emit), model_has);
        }
    }

    #[test]
    fn every_operand_fits_the_buffer_it_is_laid_out_in() {
        let cfg = klein_4b::vae();
        let l = VaeLayout::new(&cfg, 16, 12, true, &mut BumpArena::new(u64::MAX / 2)).unwrap();
        let buffer = l.stream.b.offset - l.stream.a.offset;
        let (mut transposes, mut nchw) = (0, 0);
        decode_to_levels(&l, |op| {
            transposes += matches!(op, Op::Transpose { .. }) as u32;
            nchw += matches!(op, Op::Conv2d { .. } | Op::UpsampleNearest2x { .. }) as u32;
            nchw += matches!(op, Op::GroupMoments { shape, .. } | Op::GroupNormApply { shape, .. } if !shape.channels_last) as u32;
            if let Op::ConvNhwc { x, y, residual, shape, .. } = op {
                // Words, then a scale a pixel or a piece, within the buffer the words start in.
                let (pixels, out) = ((shape.height * shape.width) as u64, (shape.out_height * shape.out_width) as u64);
                let operands = [(x, pixels, shape.in_channels as u64), (y, out, shape.out_channels as u64)].into_iter().chain(residual.map(|r| (r, out, shape.out_channels as u64)));
                for (o, rows, width) in operands {
                    let Some(scales) = o.scales else { continue };
                    let end = scales.offset + rows * o.piece.map_or(1, |p| width / p);
                    let start = [l.stream.a, l.stream.b, l.stream.c].into_iter().map(|s| s.offset).filter(|&s| s <= o.data.offset).max().unwrap();
                    assert!(o.data.offset + rows * width / 2 <= scales.offset && end <= start + buffer, "{shape:?}: {o:?}");
                }
            }
        });
        // The latent's rows are the one transpose; no channel-major op is left.
        assert_eq!((transposes, nchw), (1, 0));
    }
}
