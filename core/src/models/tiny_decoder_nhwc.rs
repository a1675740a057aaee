//! A tiny preview decoder on the matrix tier's half-precision data path,
//! as the VAE decodes there ([`super::vae_nhwc`]): activations
//! channels-last and f16 under the range rule's power-of-two scales, the
//! stream (each block's output) in pieces of the VAE's
//! [`stream_piece`](super::vae::stream_piece) channels, each under its own
//! scale, as the convolution that writes it holds them.
//!
//! Every ReLU runs in a convolution's epilogue (after its bias, and after
//! the block's sum where its last convolution adds the stream), the ×2
//! upsamplings are read through by the convolution after them, and a
//! global-norm block's GroupNorm + ReLU is read by its second 1×1
//! convolution as it reads its input (the GroupNorm is its statistics
//! alone). So a block is three convolutions (five with a global norm, six
//! with a skip convolution), and no pass packs, adds or activates.
//!
//! The stream moves among the layout's `x`, `t1` and `t2`, a convolution
//! never writing what it reads; the decoded image lands as `[pixels, 3]`
//! f32 rows in [`TinyDecoderLayout::decoded`], its 8-bit levels
//! interleaved RGB in [`TinyDecoderLayout::levels`].

use crate::ir::{name, GroupShape, NormActivation, Op, Operand, Span};
use crate::models::group_norm::group_norm_read;
use crate::arena::BumpArena;
use crate::models::tiny_decoder::{decode as decode_channel_major, latent_in, Stage, TinyDecoderConfig, TinyDecoderError, TinyDecoderLayout, POOL_EPS, POOL_GROUPS};
use crate::models::vae::{prefix, rows, same};
use crate::models::vae_nhwc::{half_rows, pack, stream_rows, Stream};
use crate::oracle::ConvShape;

/// The decode of a whole image to its 8-bit levels on the layout's data
/// path: this module's where it is channels-last, else
/// [`decode_channel_major`].
pub fn decode_whole(l: &TinyDecoderLayout, emit: impl FnMut(Op)) {
    match l.channels_last {
        true => decode(l, emit),
        false => decode_channel_major(l, emit),
    }
}

/// Steps of the decode program on a data path (the same at every size).
pub fn steps(config: &TinyDecoderConfig, channels_last: bool) -> u64 {
    let mut steps = 0;
    if let Ok(layout) = TinyDecoderLayout::new(config, 2, 2, 0.0, channels_last, &mut BumpArena::new(u64::MAX)) {
        decode_whole(&layout, |_| steps += 1);
    }
    steps
}

/// The fewest f32 elements a band must hold for a banded decode of a
/// `latent_h × latent_w` latent on a data path: one output row of its widest convolution.
pub fn band_minimum(config: &TinyDecoderConfig, latent_h: u64, latent_w: u64, channels_last: bool) -> Result<u64, TinyDecoderError> {
    let layout = TinyDecoderLayout::new(config, latent_h, latent_w, 0.0, channels_last, &mut BumpArena::new(u64::MAX))?;
    Ok(crate::models::vae::band_minimum(|emit| decode_whole(&layout, emit)))
}

/// A convolution over channels-last f16 rows: module tensors `{p}.weight`
/// and `{p}.bias` (zeros the runner supplies where the module has none).
struct Conv<'a> {
    p: &'a str,
    shape: ConvShape,
    upsample: bool,
    relu: bool,
}

impl Conv<'_> {
    fn op(&self, x: Operand, y: Operand, residual: Option<Operand>, norm: Option<crate::ir::InputNorm>) -> Op {
        let (w, bias) = (name(format_args!("{}.weight", self.p)), name(format_args!("{}.bias", self.p)));
        Op::ConvNhwc { x, w, bias, y, shape: self.shape, upsample: self.upsample, residual, norm, relu: self.relu }
    }
}

/// The channels-last decode: packed latents to the image's levels.
pub fn decode(l: &TinyDecoderLayout, mut emit: impl FnMut(Op)) {
    let cfg = &l.config;
    let pre = cfg.layout.prefix();
    let (mut h, mut w) = (l.latent_h, l.latent_w);
    let lc = cfg.latent_channels;
    // The latent as the channel-major program takes it, then its rows packed as f16.
    latent_in(l, &mut emit);
    emit(Op::Transpose { src: rows(l.latent, h * w), dst: rows(l.t2, lc), rows: lc, cols: h * w });
    let latent = half_rows(l.t1, h * w, lc);
    emit(pack(l.t2, latent, h * w, lc));
    let mut x = Stream { at: l.x, free: [l.t1, l.t2] };
    for stage in &cfg.stages {
        let pixels = h * w;
        match *stage {
            Stage::ConvIn { module: m, out } => {
                let p = prefix(format_args!("{pre}{m}"));
                emit(Conv { p: &p, shape: same(lc, out, h, w, 3), upsample: false, relu: true }.op(latent, stream_rows(l.x, pixels, out), None, None));
            }
            Stage::Block { module: m, channels_in: i, out: o, skip, pool } => {
                if let Some(pc) = pool {
                    x = global_norm(l, &prefix(format_args!("{pre}{m}.pool")), (i, pc), (h, w), x, &mut emit);
                }
                let [a, b] = x.free;
                let rows_of = |at: Span, channels: u64| stream_rows(at, pixels, channels);
                // Its three 3×3 convolutions, each ReLU'd.
                let conv = |k: u32, cin: u64, from: Span, to: Span, onto: Option<Span>| {
                    let p = prefix(format_args!("{pre}{m}.conv.{k}"));
                    Conv { p: &p, shape: same(cin, o, h, w, 3), upsample: false, relu: true }.op(rows_of(from, cin), rows_of(to, o), onto.map(|r| rows_of(r, o)), None)
                };
                emit(conv(0, i, x.at, a, None));
                emit(conv(2, o, a, b, None));
                // relu(conv(…) + skip(x)): the last convolution adds the stream, or the skip convolution's output, and ReLUs the sum.
                x = if skip {
                    let p = prefix(format_args!("{pre}{m}.skip"));
                    emit(Conv { p: &p, shape: same(i, o, h, w, 1), upsample: false, relu: false }.op(rows_of(x.at, i), rows_of(a, o), None, None));
                    emit(conv(4, o, b, x.at, Some(a)));
                    Stream { at: x.at, free: [a, b] }
                } else {
                    emit(conv(4, o, b, a, Some(x.at)));
                    Stream { at: a, free: [x.at, b] }
                };
            }
            Stage::Upsample { module: m, channels_in: i, out: o } => {
                let p = prefix(format_args!("{pre}{m}"));
                let shape = ConvShape { out_height: 2 * h as usize, out_width: 2 * w as usize, ..same(i, o, h, w, 3) };
                let [a, b] = x.free;
                emit(Conv { p: &p, shape, upsample: true, relu: false }.op(stream_rows(x.at, pixels, i), stream_rows(a, 4 * pixels, o), None, None));
                (h, w) = (2 * h, 2 * w);
                x = Stream { at: a, free: [x.at, b] };
            }
            Stage::ConvOut { module: m, channels_in: i } => {
                let p = prefix(format_args!("{pre}{m}"));
                let decoded = l.decoded();
                emit(Conv { p: &p, shape: same(i, 3, h, w, 3), upsample: false, relu: false }.op(stream_rows(x.at, pixels, i), rows(decoded, 3).into(), None, None));
                // The decoder's [0, 1] to the VAE's [-1, 1], as `DecoderTiny` returns `x.mul(2).sub(1)`.
                emit(Op::ScaleShift { src: decoded, dst: decoded, count: 3 * pixels, scale: 2.0, shift: -1.0 });
                emit(Op::PixelLevels { src: decoded, dst: l.levels(), count: 3 * pixels });
            }
        }
    }
}

/// A global-norm block's first half, `x += conv(relu(GN(conv(x))))` (1×1
/// convolutions without bias around a 4-group GroupNorm, `{p}.0`, `{p}.1`,
/// `{p}.3`): the pool's rows into a free buffer, their statistics, then the
/// second convolution reading them normalised and ReLU'd, onto the stream.
fn global_norm(l: &TinyDecoderLayout, p: &str, (channels, pool): (u64, u64), (h, w): (u64, u64), x: Stream, emit: &mut impl FnMut(Op)) -> Stream {
    let pixels = h * w;
    let [a, b] = x.free;
    let (stream, pooled) = (stream_rows(x.at, pixels, channels), stream_rows(a, pixels, pool));
    let (first, last) = (prefix(format_args!("{p}.0")), prefix(format_args!("{p}.3")));
    emit(Conv { p: &first, shape: same(channels, pool, h, w, 1), upsample: false, relu: false }.op(stream, pooled, None, None));
    let shape = GroupShape { channels: pool, pixels, width: w, groups: POOL_GROUPS, channels_last: true };
    let norm = group_norm_read(l.norm, pooled, &prefix(format_args!("{p}.1")), shape, POOL_EPS, NormActivation::Relu, emit);
    emit(Conv { p: &last, shape: same(pool, channels, h, w, 1), upsample: false, relu: false }.op(pooled, stream_rows(b, pixels, channels), Some(stream), Some(norm)));
    Stream { at: b, free: [x.at, a] }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TAEF2's shape (`taesd.py`'s decoder for FLUX.2's 32 latent channels).
    fn taef2() -> TinyDecoderConfig {
        TinyDecoderConfig::taef2_shape(32, 8).unwrap()
    }

    #[test]
    fn the_channels_last_program_reads_every_tensor_the_decoder_names_and_takes_no_pass_but_the_norms_and_the_ends() {
        let cfg = taef2();
        let l = TinyDecoderLayout::new(&cfg, 4, 6, 1e-4, true, &mut BumpArena::new(u64::MAX)).unwrap();
        let mut named = Vec::new();
        cfg.tensors(|t| named.push(t.name.to_string()));
        let (mut read, mut kinds) = (Vec::new(), Vec::<Op>::new());
        decode(&l, |op| {
            if let Op::ConvNhwc { w, bias, norm, .. } = &op {
                read.extend([w.to_string(), bias.to_string()]);
                read.extend(norm.iter().flat_map(|n| [n.gamma.to_string(), n.beta.to_string()]));
            }
            kinds.push(op);
        });
        named.sort();
        read.sort();
        assert_eq!(read, named);
        let count = |f: fn(&Op) -> bool| kinds.iter().filter(|op| f(op)).count();
        // 1 + 10 blocks × 3 + 3 global norms × 2 + 3 upsamplings + 1 to RGB.
        assert_eq!(count(|op| matches!(op, Op::ConvNhwc { .. })), 41);
        assert_eq!(count(|op| matches!(op, Op::ConvNhwc { norm: Some(_), .. })), 3);
        // No pass activates, adds, upsamples or packs the stream.
        assert_eq!(count(|op| matches!(op, Op::Relu { .. } | Op::Add { .. } | Op::UpsampleNearest2x { .. } | Op::Conv2d { .. })), 0);
        // The latent's four ops in, three GroupNorms' two, the image's two out.
        assert_eq!(kinds.len(), 41 + 4 + 6 + 2);
    }

    #[test]
    fn the_stream_never_lands_where_a_convolution_reads() {
        // With a skip convolution, a global norm and an upsampling.
        let mut cfg = taef2();
        if let Stage::Block { skip, .. } = &mut cfg.stages[2] {
            *skip = true;
        }
        let l = TinyDecoderLayout::new(&cfg, 4, 4, 1e-4, true, &mut BumpArena::new(u64::MAX)).unwrap();
        let buffer = |o: &Operand| [l.x, l.t1, l.t2, l.decoded()].into_iter().position(|s| s.offset <= o.data.offset && o.data.offset < s.offset + (l.t1.offset - l.x.offset));
        decode(&l, |op| {
            if let Op::ConvNhwc { x, y, residual, .. } = op {
                let out = buffer(&y);
                assert!(out != buffer(&x) && residual.is_none_or(|r| out != buffer(&r)), "{x:?} → {y:?} onto {residual:?}");
            }
        });
    }
}
