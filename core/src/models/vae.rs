//! `AutoencoderKLFlux2`'s decoder as block programs over one activation arena.
//!
//! Activations are channel-major `[C, H·W]`, the layout the convolutions and
//! GroupNorm read. Three equal buffers sized for the largest activation take
//! turns: the residual stream stays in `a` from block to block, and each
//! block's intermediates go through `b` and `c`, so the arena holds about
//! three full-resolution activations whatever the depth. Every dimension
//! comes from the config.

use crate::arena::{ArenaError, BumpArena};
use crate::config::{VaeConfig, MAX_LIST};
use crate::ir::{chunked_attention_scratch, name, ChunkedOperands, ATTENTION_KEY_CHUNK, GroupShape, Op, Operand, Span, ALIGN, F32};
use crate::models::group_norm::{self, NormScratch};
use crate::oracle::ConvShape;
use core::fmt::{self, Write};

/// Name prefixes of the tensors decoding reads (the BatchNorm statistics de-normalise the latent).
pub const DECODER_WEIGHTS: [&str; 3] = ["decoder.", "post_quant_conv.", "bn.running_"];

/// Epsilon of every decoder GroupNorm (diffusers builds the decoder with `resnet_eps = 1e-6`).
pub(crate) const NORM_EPS: f32 = 1e-6;

/// A latent size the decoder cannot take, or an arena too small for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VaePlanError {
    Size(&'static str),
    Arena(ArenaError),
}

impl fmt::Display for VaePlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VaePlanError::Size(s) => f.write_str(s),
            VaePlanError::Arena(e) => e.fmt(f),
        }
    }
}

impl From<ArenaError> for VaePlanError {
    fn from(e: ArenaError) -> Self {
        VaePlanError::Arena(e)
    }
}

/// Where each activation of one decode lives (element offsets into
/// the f32 arena), and the decoder dimensions the programs need.
#[derive(Debug, Clone, PartialEq)]
pub struct VaeLayout {
    /// The latent in VAE cells (the decoder's input grid); both even.
    pub latent_h: u64,
    pub latent_w: u64,
    pub latent_channels: u64,
    /// Decoder widths by level, finest first (`decoder_block_out_channels`).
    pub channels: heapless::Vec<u64, MAX_LIST>,
    pub layers_per_block: u64,
    pub out_channels: u64,
    pub attention: bool,
    pub post_quant_conv: bool,
    pub bn_eps: f32,
    /// Input written by the host: packed latents `[tokens, 4·latent_channels]`, token = y·(w/2) + x.
    pub packed: Span,
    /// The de-normalised, unpatchified latent `[latent_channels, h·w]`.
    pub latent: Span,
    /// The three activation buffers, each holding the largest `[C, pixels]`
    /// of the decode, and the mid-block attention's projections `[h·w, C_top]`.
    pub stream: Stream,
    /// Where the decoder's output `[out_channels, H·W]` lands, and its 8-bit levels.
    pub decoded: Span,
    pub levels: Span,
}

impl VaeLayout {
    /// Lays out the decode of a `latent_h × latent_w` latent in `arena`,
    /// channel-major f32, or for the channels-last program where
    /// `channels_last` ([`crate::models::vae_nhwc`]: f16 activations, the
    /// buffers half the size, the decoded image in its own span).
    pub fn new(cfg: &VaeConfig, latent_h: u64, latent_w: u64, channels_last: bool, arena: &mut BumpArena) -> Result<Self, VaePlanError> {
        if !whole_tokens(latent_h, latent_w) {
            return Err(VaePlanError::Size("the latent must have an even, non-zero height and width"));
        }
        let mut channels = heapless::Vec::new();
        for &c in cfg.decoder_channels() {
            channels.push(c as u64).map_err(|_| VaePlanError::Size("too many VAE levels"))?;
        }
        let top = *channels.last().ok_or(VaePlanError::Size("the VAE has no levels"))?;
        let p0 = latent_h * latent_w;
        let lc = cfg.latent_channels as u64;
        let largest = if channels_last { largest_channels_last(cfg, p0) } else { largest_activation(cfg, p0) };
        // Spans of channel-major tensors carry no row width: each op views them
        // with its own (`rows`), since one buffer holds tensors of many widths.
        let mut take = |elems: u64| -> Result<Span, ArenaError> {
            let s = arena.alloc(elems * F32, ALIGN)?;
            Ok(Span::new(s.offset / F32, 0))
        };
        let packed = take(p0 * lc)?;
        let latent = take(p0 * lc)?;
        let (a, b, c) = (take(largest)?, take(largest)?, take(largest)?);
        let (q, k, v, attend) = attention_buffers(&mut take, cfg.mid_block_add_attention.then_some((p0, top)), channels_last, (largest, a))?;
        let groups = cfg.norm_num_groups as u64;
        let norm = NormScratch::at(take(NormScratch::elements(groups, latent_h << (channels.len() - 1)))?, groups);
        // Channels-last, the stream may end in any of the three buffers.
        let scale = 1 << (channels.len() - 1);
        let decoded = if channels_last { take(cfg.out_channels as u64 * p0 * scale * scale)? } else { c };
        Ok(Self {
            latent_h,
            latent_w,
            latent_channels: lc,
            layers_per_block: cfg.layers_per_block as u64,
            out_channels: cfg.out_channels as u64,
            attention: cfg.mid_block_add_attention,
            post_quant_conv: cfg.use_post_quant_conv,
            bn_eps: cfg.batch_norm_eps as f32,
            packed: Span::new(packed.offset, 4 * lc),
            latent,
            decoded,
            levels: b,
            channels,
            stream: Stream { a, b, c, q, k, v, attend, groups, norm },
        })
    }

    /// Pixels per latent cell.
    pub fn scale(&self) -> u64 {
        1 << (self.channels.len() - 1)
    }

    /// Output size in pixels (height, width).
    pub fn image_size(&self) -> (u64, u64) {
        (self.latent_h * self.scale(), self.latent_w * self.scale())
    }

    /// Packed latent tokens of the latent.
    pub fn tokens(&self) -> u64 {
        self.latent_h * self.latent_w / 4
    }

    /// Elements of the decoded output `[out_channels, H·W]`.
    pub fn decoded_len(&self) -> u64 {
        let (h, w) = self.image_size();
        self.out_channels * h * w
    }

    /// `decoder.up_blocks.{i}`'s input and output channels and its size in pixels (before its upsampling).
    pub(crate) fn up_block(&self, i: usize) -> UpBlock {
        let levels = self.channels.len();
        let cin = if i == 0 { self.top() } else { self.channels[levels - i] };
        UpBlock { cin, cout: self.channels[levels - 1 - i], h: self.latent_h << i, w: self.latent_w << i }
    }

    pub(crate) fn top(&self) -> u64 {
        self.channels[self.channels.len() - 1]
    }
}

/// One up block's shape ([`VaeLayout::up_block`]).
pub(crate) struct UpBlock {
    pub cin: u64,
    pub cout: u64,
    pub h: u64,
    pub w: u64,
}

/// Whether a latent of `h × w` cells is a whole, non-empty grid of 2×2-cell packed tokens.
pub(crate) fn whole_tokens(h: u64, w: u64) -> bool {
    h > 0 && w > 0 && h.is_multiple_of(2) && w.is_multiple_of(2)
}

/// Bytes of the arena that decodes a `latent_h × latent_w` latent in one
/// pass (channels-last where `channels_last`).
pub fn arena_bytes(cfg: &VaeConfig, latent_h: u64, latent_w: u64, channels_last: bool) -> Result<u64, VaePlanError> {
    let mut arena = BumpArena::new(u64::MAX);
    VaeLayout::new(cfg, latent_h, latent_w, channels_last, &mut arena)?;
    Ok(arena.high_water())
}

/// Bytes of the largest binding of that decode: one activation buffer.
pub fn largest_binding(cfg: &VaeConfig, p0: u64, channels_last: bool) -> u64 {
    F32 * if channels_last { largest_channels_last(cfg, p0) } else { largest_activation(cfg, p0) }
}

/// Device operands one op of a banded decode uses at most (attention: q, k, v, o, lse).
pub const BAND_OPERANDS: u64 = 5;
/// Storage-binding offset alignment in bytes; each band operand may lose this much to it.
pub const BAND_ALIGN: u64 = 256;

/// f32 elements of band operands when the VAE has the device memory of an
/// untiled `tile × tile`-cell latent, within one binding of `max_binding` bytes.
pub fn band_capacity(cfg: &VaeConfig, tile: u64, max_binding: u64, channels_last: bool) -> Result<u64, VaePlanError> {
    Ok(arena_bytes(cfg, tile, tile, channels_last)?.min(max_binding) / 4)
}

/// Bytes of the device arena of a banded decode whose operands take `capacity` f32.
pub fn band_arena_bytes(capacity: u64) -> u64 {
    4 * capacity + BAND_ALIGN * BAND_OPERANDS
}

/// The fewest f32 elements a band must hold for a banded run of a VAE
/// program to take one output row of its widest convolution. Every other op
/// runs by units (pixels, tokens, columns) far smaller than a convolution row.
pub fn band_minimum(program: impl FnOnce(&mut dyn FnMut(Op))) -> u64 {
    let mut most = 0;
    program(&mut |op| {
        let (fixed, per_row) = match op {
            Op::Conv2d { shape, .. } => shape.band_elements(),
            Op::ConvNhwc { x, y, shape, residual, norm, .. } => nhwc_band_elements(shape, [x, y], residual, norm.as_ref().map_or(0, |n| 2 * n.groups)),
            // One query row, and a chunk of keys and values (or all of
            // them, where fewer) in half the band.
            Op::ChunkedAttention { head_dim, kv_len, .. } => {
                let keys = kv_len.min(ATTENTION_KEY_CHUNK);
                most = most.max(4 * head_dim * keys);
                chunked_band_elements(head_dim, keys)
            }
            _ => return,
        };
        most = most.max(fixed + per_row);
    });
    most
}

/// A banded [`Op::ChunkedAttention`]'s elements over heads of `head_dim`
/// with calls over `keys` keys, as the banded run takes them: fixed (the
/// keys and the values, f32, the alignment of the scratch's six parts and
/// of the sixth operand) and per query row (its query and output rows, its
/// carried state, its share of the scratch).
pub fn chunked_band_elements(head_dim: u64, keys: u64) -> (u64, u64) {
    let fixed = 2 * keys * head_dim + 7 * 64;
    let per_query = 2 * head_dim + 2 + head_dim / 2 + ATTENTION_KEY_CHUNK + 5;
    (fixed, per_query)
}

/// Device bytes of the chunked attention's right operands that a decode
/// or an encode of `cfg` on the channels-last path keeps beside its arena
/// ([`crate::ir::ChunkedOperands`], for the wider of the two mid-blocks);
/// 0 where it runs none.
pub fn attention_operand_bytes(cfg: &VaeConfig, channels_last: bool) -> u64 {
    let top = [cfg.decoder_channels(), &cfg.block_out_channels].iter().filter_map(|c| c.last().copied()).max().unwrap_or(0) as u64;
    match channels_last && cfg.mid_block_add_attention {
        true => ChunkedOperands::bytes(top, 1, ATTENTION_KEY_CHUNK),
        false => 0,
    }
}

/// A channels-last convolution's band: the elements fixed whatever its
/// rows (two rows of input halo and the statistics it normalises with) and
/// each output row's (its input rows, one a stride, its output row and the
/// residual's where that is another tensor), as the banded run takes them.
pub fn nhwc_band_elements(s: ConvShape, [x, y]: [Operand; 2], residual: Option<Operand>, stats: u64) -> (u64, u64) {
    let input_row = s.width as u64 * x.elements(s.in_channels as u64);
    let output_row = s.out_width as u64 * y.elements(s.out_channels as u64) * if residual.is_some_and(|r| r != y) { 2 } else { 1 };
    (2 * input_row + stats, s.stride as u64 * input_row + output_row)
}


/// Each `(pixels, channels)` tensor the decoder's levels make, for a latent
/// of `p0` cells: every level's input and output, every upsampled output.
fn each_activation(cfg: &VaeConfig, p0: u64, mut f: impl FnMut(u64, u64)) {
    let dec = cfg.decoder_channels();
    let levels = dec.len();
    let (mut cin, mut pixels) = (dec[levels - 1] as u64, p0);
    for i in 0..levels {
        let cout = dec[levels - 1 - i] as u64;
        f(pixels, cin);
        f(pixels, cout);
        if i + 1 < levels {
            pixels *= 4;
            f(pixels, cout);
        }
        cin = cout;
    }
}

/// The most elements of the f32 tensors beside the levels' activations:
/// the top level's and the latent's rows at the latent's size, and the
/// decoded image.
fn largest_f32_beside(cfg: &VaeConfig, p0: u64) -> u64 {
    let top = cfg.decoder_channels()[cfg.decoder_channels().len() - 1] as u64;
    let image = p0 << (2 * (cfg.decoder_channels().len() - 1));
    (top * p0).max(cfg.latent_channels as u64 * p0).max(cfg.out_channels as u64 * image)
}

/// The most elements any `[C, pixels]` activation of the decode holds,
/// for a latent of `p0` latent cells.
pub fn largest_activation(cfg: &VaeConfig, p0: u64) -> u64 {
    let mut most = largest_f32_beside(cfg, p0);
    each_activation(cfg, p0, |pixels, channels| most = most.max(pixels * channels));
    most
}

/// The most elements any activation of the channels-last decode holds for
/// a latent of `p0` cells: a level's stream or f16 rows (words and
/// scales), the attention's f32 output, the latent's f32 rows.
pub fn largest_channels_last(cfg: &VaeConfig, p0: u64) -> u64 {
    let mut most = largest_f32_beside(cfg, p0);
    each_activation(cfg, p0, |pixels, channels| most = most.max(half_elements(pixels, channels)));
    most
}

/// Channels of the stream under one range scale: a block of a
/// convolution's output channels holds whole pieces (at most four).
pub const STREAM_PIECE: u64 = 32;

/// The stream's piece for `channels`: [`STREAM_PIECE`], or a whole pixel
/// where the channels are fewer or not a multiple of it (small models).
pub fn stream_piece(channels: u64) -> u64 {
    if channels.is_multiple_of(STREAM_PIECE) { STREAM_PIECE } else { channels }
}

/// Elements (f32 words) of `pixels` rows of `channels` as the stream holds
/// them, or as f16 rows under a scale a pixel (an odd count's rows whole
/// words): the larger.
pub fn half_elements(pixels: u64, channels: u64) -> u64 {
    pixels * (channels.div_ceil(2) + (channels / stream_piece(channels)).max(1))
}

/// A contiguous `[rows, cols]` view of a span.
pub(crate) fn rows(s: Span, cols: u64) -> Span {
    Span::new(s.offset, cols)
}

pub(crate) fn conv(x: Span, prefix: &str, y: Span, shape: ConvShape) -> Op {
    conv_op(x, prefix, y, shape, false)
}

/// [`conv`], its output added onto `y`'s values (a residual sum in its epilogue).
pub(crate) fn conv_onto(x: Span, prefix: &str, y: Span, shape: ConvShape) -> Op {
    conv_op(x, prefix, y, shape, true)
}

fn conv_op(x: Span, prefix: &str, y: Span, shape: ConvShape, residual: bool) -> Op {
    Op::Conv2d { x, w: name(format_args!("{prefix}.weight")), bias: name(format_args!("{prefix}.bias")), y, shape, residual, relu: false }
}

/// A "same" convolution at `h × w` (3×3 with padding 1, or 1×1).
pub(crate) fn same(cin: u64, cout: u64, h: u64, w: u64, kernel: usize) -> ConvShape {
    ConvShape::same(cin as usize, cout as usize, h as usize, w as usize, kernel)
}

/// The buffers the blocks of a decode or an encode share: the residual
/// stream stays in `a`; `b` and `c` hold a block's intermediates; `q`, `k`,
/// `v` the mid-block attention's projections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stream {
    pub a: Span,
    pub b: Span,
    pub c: Span,
    pub q: Span,
    pub k: Span,
    pub v: Span,
    /// The channels-last program's chunked attention's scratch where the
    /// buffer its attention leaves free (one of `a`, `b`, `c`) is too small
    /// for it; `None` where that buffer holds it (or nothing attends).
    pub attend: Option<Span>,
    pub groups: u64,
    /// The GroupNorms' statistics.
    pub norm: NormScratch,
}

/// The mid-block attention's projections `q`, `k`, `v` (`[pixels, top]`
/// f32 each, where `attention` has its `(pixels, top)`) and on the
/// channels-last path its chunked attention's scratch ([`Stream::attend`]:
/// its own span only where the activation buffers, `largest` elements,
/// cannot hold it). Without attention nothing reads them: `fallback`, no space.
pub(crate) fn attention_buffers(
    take: &mut impl FnMut(u64) -> Result<Span, ArenaError>,
    attention: Option<(u64, u64)>,
    channels_last: bool,
    (largest, fallback): (u64, Span),
) -> Result<(Span, Span, Span, Option<Span>), ArenaError> {
    let Some((pixels, top)) = attention else { return Ok((fallback, fallback, fallback, None)) };
    let (q, k, v) = (take(pixels * top)?, take(pixels * top)?, take(pixels * top)?);
    let scratch = chunked_attention_scratch(pixels, top);
    let attend = if channels_last && scratch > largest { Some(take(scratch)?) } else { None };
    Ok((q, k, v, attend))
}

impl Stream {
    /// `channels` at `h × w`, channel-major, as its GroupNorm takes it.
    pub(crate) fn norm_shape(&self, channels: u64, h: u64, w: u64) -> GroupShape {
        GroupShape { channels, pixels: h * w, width: w, groups: self.groups, channels_last: false }
    }
}

/// GroupNorm `prefix` of the channel-major `src` into `dst`, SiLU after where `silu`.
pub(crate) fn group_norm(l: &Stream, [src, dst]: [Span; 2], prefix: &str, shape: GroupShape, silu: bool, emit: &mut impl FnMut(Op)) {
    group_norm::group_norm(l.norm, (src.into(), dst.into()), prefix, shape, NORM_EPS, silu, emit);
}

pub(crate) type Prefix = heapless::String<96>;

pub(crate) fn prefix(args: fmt::Arguments<'_>) -> Prefix {
    let mut p = Prefix::new();
    p.write_fmt(args).expect("VAE module paths fit in 96 bytes");
    p
}

/// Packed latents `[tokens, 4·channels]` to the latent `[channels, h·w]` the
/// decoder takes: the VAE's BatchNorm statistics de-normalise, then unpatchify.
pub(crate) fn denorm_unpatchify(packed: Span, latent: Span, channels: u64, (h, w): (u64, u64), eps: f32) -> Op {
    Op::DenormUnpatchify {
        packed,
        latent,
        mean: name(format_args!("bn.running_mean")),
        var: name(format_args!("bn.running_var")),
        channels,
        height: h / 2,
        width: w / 2,
        eps,
    }
}

/// Packed latents to the decoder's first activation (in `a`): de-normalise
/// and unpatchify, `post_quant_conv` when the model has it, `conv_in`.
pub fn input(l: &VaeLayout, mut emit: impl FnMut(Op)) {
    let (h, w, lc) = (l.latent_h, l.latent_w, l.latent_channels);
    emit(denorm_unpatchify(l.packed, l.latent, lc, (h, w), l.bn_eps));
    let s = &l.stream;
    let mut x = l.latent;
    if l.post_quant_conv {
        emit(conv(x, "post_quant_conv", s.b, same(lc, lc, h, w, 1)));
        x = s.b;
    }
    emit(conv(x, "decoder.conv_in", s.a, same(lc, l.top(), h, w, 3)));
}

/// `ResnetBlock2D` on the stream in `a`: `a = shortcut(a) + conv2(SiLU(GN2(conv1(SiLU(GN1(a))))))`.
/// Without a shortcut convolution, conv2 adds onto `a` in its epilogue.
pub(crate) fn resnet(l: &Stream, p: &str, cin: u64, cout: u64, h: u64, w: u64, emit: &mut impl FnMut(Op)) {
    let pixels = h * w;
    group_norm(l, [l.a, l.b], &prefix(format_args!("{p}.norm1")), l.norm_shape(cin, h, w), true, emit);
    emit(conv(l.b, &prefix(format_args!("{p}.conv1")), l.c, same(cin, cout, h, w, 3)));
    group_norm(l, [l.c, l.b], &prefix(format_args!("{p}.norm2")), l.norm_shape(cout, h, w), true, emit);
    if cin == cout {
        emit(conv_onto(l.b, &prefix(format_args!("{p}.conv2")), l.a, same(cout, cout, h, w, 3)));
        return;
    }
    emit(conv(l.b, &prefix(format_args!("{p}.conv2")), l.c, same(cout, cout, h, w, 3)));
    emit(conv(l.a, &prefix(format_args!("{p}.conv_shortcut")), l.b, same(cin, cout, h, w, 1)));
    emit(Op::Add { a: rows(l.b, pixels), b: rows(l.c, pixels), dst: rows(l.a, pixels), rows: cout, cols: pixels, relu: false });
}

/// The mid-block attention `p` on the stream in `a`: one head as wide as
/// the `c` channels over every one of `pixels`, with its own GroupNorm and a residual.
pub(crate) fn attention(l: &Stream, p: &str, c: u64, (h, w): (u64, u64), emit: &mut impl FnMut(Op)) {
    let pixels = h * w;
    group_norm(l, [l.a, l.b], &prefix(format_args!("{p}.group_norm")), l.norm_shape(c, h, w), false, emit);
    // Tokens `[pixels, C]` in `c` for the projections.
    emit(Op::Transpose { src: rows(l.b, pixels), dst: rows(l.c, c), rows: c, cols: pixels });
    for (proj, dst) in [("to_q", l.q), ("to_k", l.k), ("to_v", l.v)] {
        emit(attention_projection(rows(l.c, c).into(), p, proj, dst, pixels, c));
    }
    let (q, k, v) = (rows(l.q, c), rows(l.k, c), rows(l.v, c));
    emit(carried_attention([q, k, v, rows(l.b, c)], pixels, c));
    emit(attention_projection(rows(l.b, c).into(), p, "to_out.0", l.c, pixels, c));
    emit(Op::Transpose { src: rows(l.c, c), dst: rows(l.b, pixels), rows: pixels, cols: c });
    emit(Op::Add { a: rows(l.a, pixels), b: rows(l.b, pixels), dst: rows(l.a, pixels), rows: c, cols: pixels, relu: false });
}

/// The mid-block's attention core over `pixels` tokens of one `c`-wide head (rows `[pixels, c]`).
pub(crate) fn carried_attention([q, k, v, o]: [Span; 4], pixels: u64, c: u64) -> Op {
    Op::CarriedAttention { q, k, v, o, q_len: pixels, kv_len: pixels, heads: 1, head_dim: c, carry: None }
}

/// The mid-block attention `p`'s projection `proj` (its weight and bias)
/// of `pixels` token rows `x` of `c` channels into `y`.
pub(crate) fn attention_projection(x: Operand, p: &str, proj: &str, y: Span, pixels: u64, c: u64) -> Op {
    let (w, bias) = (name(format_args!("{p}.{proj}.weight")), Some(name(format_args!("{p}.{proj}.bias"))));
    Op::Linear { x, w, w_row: 0, bias, y: rows(y, c), rows: pixels, cols: c, inner: c, gate: None }
}

/// `decoder.mid_block`: resnet, attention (when the model has it), resnet.
pub fn mid_block(l: &VaeLayout, mut emit: impl FnMut(Op)) {
    mid(&l.stream, "decoder", l.attention, l.top(), l.latent_h, l.latent_w, &mut emit);
}

/// `{side}.mid_block` over a `c × h × w` stream.
pub(crate) fn mid(s: &Stream, side: &str, attend: bool, c: u64, h: u64, w: u64, emit: &mut impl FnMut(Op)) {
    resnet(s, &prefix(format_args!("{side}.mid_block.resnets.0")), c, c, h, w, emit);
    if attend {
        attention(s, &prefix(format_args!("{side}.mid_block.attentions.0")), c, (h, w), emit);
    }
    resnet(s, &prefix(format_args!("{side}.mid_block.resnets.1")), c, c, h, w, emit);
}

/// Number of `decoder.up_blocks`.
pub fn up_block_count(l: &VaeLayout) -> usize {
    l.channels.len()
}

/// `decoder.up_blocks.{i}`: `layers_per_block + 1` resnets, then nearest ×2
/// and a 3×3 convolution on every block but the last.
pub fn up_block(l: &VaeLayout, i: usize, mut emit: impl FnMut(Op)) {
    let UpBlock { cin, cout, h, w } = l.up_block(i);
    for j in 0..=l.layers_per_block {
        let p = prefix(format_args!("decoder.up_blocks.{i}.resnets.{j}"));
        resnet(&l.stream, &p, if j == 0 { cin } else { cout }, cout, h, w, &mut emit);
    }
    if i + 1 < l.channels.len() {
        let s = &l.stream;
        emit(Op::UpsampleNearest2x { x: s.a, y: s.b, channels: cout, height: h, width: w });
        let p = prefix(format_args!("decoder.up_blocks.{i}.upsamplers.0.conv"));
        emit(conv(s.b, &p, s.a, same(cout, cout, 2 * h, 2 * w, 3)));
    }
}

/// `conv_norm_out` → SiLU → `conv_out`, into `decoded`.
pub fn output(l: &VaeLayout, mut emit: impl FnMut(Op)) {
    let (h, w) = l.image_size();
    let c0 = l.channels[0];
    let s = &l.stream;
    group_norm(s, [s.a, s.b], "decoder.conv_norm_out", s.norm_shape(c0, h, w), true, &mut emit);
    emit(conv(s.b, "decoder.conv_out", l.decoded, same(c0, l.out_channels, h, w, 3)));
}

/// The whole decode: packed latents in `packed` to the decoder's output in `decoded`.
pub fn decode(l: &VaeLayout, mut emit: impl FnMut(Op)) {
    input(l, &mut emit);
    mid_block(l, &mut emit);
    for i in 0..up_block_count(l) {
        up_block(l, i, &mut emit);
    }
    output(l, &mut emit);
}

/// [`decode`], then the output's 8-bit levels into `levels`: the image as
/// one readback takes it, when the whole image is laid out at once.
pub fn decode_to_levels(l: &VaeLayout, mut emit: impl FnMut(Op)) {
    decode(l, &mut emit);
    emit(Op::PixelLevels { src: l.decoded, dst: l.levels, count: l.decoded_len() });
}

/// Test helper for a VAE program (decode or encode): it must read every
/// tensor of the model that `wanted` selects, and nothing else.
#[cfg(test)]
pub(crate) fn assert_program_reads_exactly(cfg: &VaeConfig, program: impl FnOnce(&mut dyn FnMut(Op)), wanted: impl Fn(&str) -> bool) {
    type Names = heapless::Vec<crate::models::tensors::TensorName, 256>;
    let mut got = Names::new();
    program(&mut |op: Op| {
        for n in op.weights() {
            if !got.contains(n) {
                got.push(n.clone()).expect("at most 256 VAE tensors");
            }
        }
    });
    let mut want = Names::new();
    crate::models::tensors::vae(cfg, |s| {
        if wanted(&s.name) {
            want.push(s.name.clone()).expect("at most 256 VAE tensors");
        }
    });
    for n in &want {
        assert!(got.contains(n), "the program never reads {n}");
    }
    for n in &got {
        assert!(want.contains(n), "the program reads {n}, which the model does not have");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::klein_4b;

    fn assert_same_names(cfg: &VaeConfig) {
        let l = VaeLayout::new(cfg, 8, 6, false, &mut BumpArena::new(u64::MAX / 2)).unwrap();
        let model_has = |n: &str| n.starts_with("decoder.") || n.starts_with("post_quant_conv.") || n.starts_with("bn.running_");
        assert_program_reads_exactly(cfg, |emit| decode(&l, emit), model_has);
    }

    #[test]
    fn the_program_reads_every_decoder_tensor_and_nothing_else() {
        assert_same_names(&klein_4b::vae());
        let mut small = klein_4b::vae();
        small.block_out_channels = heapless::Vec::from_slice(&[16, 32, 32]).unwrap();
        small.layers_per_block = 1;
        small.norm_num_groups = 8;
        small.mid_block_add_attention = false;
        small.use_post_quant_conv = false;
        assert_same_names(&small);
    }

    #[test]
    fn the_4b_layout_holds_three_full_resolution_activations() {
        let cfg = klein_4b::vae();
        let mut arena = BumpArena::new(u64::MAX / 2);
        let l = VaeLayout::new(&cfg, 16, 12, false, &mut arena).unwrap();
        // The largest activation: the third up block's output, 256 channels
        // upsampled to full resolution (128 × 96 pixels).
        let full = 256 * (16 * 8) * (12 * 8);
        assert_eq!(l.stream.b.offset - l.stream.a.offset, full);
        assert_eq!(l.image_size(), (128, 96));
        assert_eq!(l.decoded_len(), 3 * 128 * 96);
        assert!(l.stream.v.offset * 4 + 16 * 12 * 512 * 4 <= arena.used());
        assert!(VaeLayout::new(&cfg, 15, 12, false, &mut arena).is_err());
    }

    #[test]
    fn the_channels_last_layout_takes_about_half_the_f32_one() {
        // The 4B at 1024²: each buffer holds the largest activation as f16
        // words and a scale every 32 channels (256 channels at full
        // resolution: 136 words a pixel against 256 values).
        let cfg = klein_4b::vae();
        let (f32, half) = (arena_bytes(&cfg, 128, 128, false).unwrap(), arena_bytes(&cfg, 128, 128, true).unwrap());
        let l = VaeLayout::new(&cfg, 128, 128, true, &mut BumpArena::new(u64::MAX / 2)).unwrap();
        assert_eq!(l.stream.b.offset - l.stream.a.offset, 1024 * 1024 * (128 + 8));
        assert!(half * 100 <= 56 * f32 && half * 100 >= 50 * f32, "{half} against {f32} bytes");
        // The decoded image has its own span: the stream may end in any buffer.
        assert!([l.stream.a, l.stream.b, l.stream.c].iter().all(|s| s.offset != l.decoded.offset));
    }

    #[test]
    fn the_chunked_attentions_scratch_fits_where_the_band_counts_it() {
        // The 4B's free activation buffer holds the whole decode's and the
        // whole encode's scratch: no span of its own.
        let l = VaeLayout::new(&klein_4b::vae(), 128, 128, true, &mut BumpArena::new(u64::MAX / 2)).unwrap();
        assert_eq!(l.stream.attend, None);
        let e = crate::models::vae_encoder::VaeEncoderLayout::new(&klein_4b::vae(), 1024, 1024, true, &mut BumpArena::new(u64::MAX / 2)).unwrap();
        assert_eq!(e.stream.attend, None);
        for (rows, d) in [(1, 512), (145, 512), (4000, 512), (37, 32), (1, 2)] {
            let (fixed, per_query) = chunked_band_elements(d, ATTENTION_KEY_CHUNK);
            let scratch = chunked_attention_scratch(rows, d);
            assert!(2 * ATTENTION_KEY_CHUNK * d + scratch + 64 <= fixed + rows * (per_query - 2 * d - 2), "{rows} × {d}: {scratch}");
        }
    }
}
