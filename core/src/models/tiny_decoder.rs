//! A tiny decoder for previews, as a block program: diffusers'
//! `AutoencoderTiny` decoder (tensors `decoder.layers.N.*`), or TAESD's
//! own layout (`N.*`, as `taesd.py` saves its decoders), TAEF2's blocks
//! with a global norm (`N.pool.*`) included.
//!
//! Both are one `nn.Sequential`: a soft clamp of the latent (`tanh(x/3)·3`),
//! a 3×3 convolution and ReLU, then levels of residual blocks, each level
//! but the last ending in ×2 nearest upsampling and a 3×3 convolution
//! without bias, and a last 3×3 convolution to RGB. The structure is read
//! from the tensors' names and shapes ([`TinyDecoderConfig::from_tensors`]);
//! parameter-free modules (the clamp, ReLUs, upsamplings) hold no tensors, so
//! they are placed by the grammar and checked by the gaps in the module
//! numbering they leave.
//!
//! The input is the latent the VAE decoder takes: the transformer's packed
//! latents de-normalised with the VAE's BatchNorm statistics and
//! unpatchified. Activations are channel-major `[C, H·W]` in three equal
//! buffers, as in the VAE decoder.

use crate::arena::{ArenaError, BumpArena};
use crate::ir::{level_words, name, GroupShape, Op, Span, ALIGN, F32};
use crate::models::group_norm::{group_norm, NormScratch};
use crate::models::tensors::TensorName;
use crate::models::vae::{denorm_unpatchify, half_elements, prefix, rows, same, whole_tokens};
use core::fmt;

/// Modules a decoder's `nn.Sequential` may number (TAESD's largest has 26).
const MAX_MODULES: usize = 64;
/// Groups of the GroupNorm in TAEF2's global-norm blocks (`taesd.py` builds
/// them with `nn.GroupNorm(4, …)`: a count the weights do not record).
pub const POOL_GROUPS: u64 = 4;
/// Epsilon of that GroupNorm (PyTorch's default).
pub const POOL_EPS: f32 = 1e-5;
/// The soft clamp's bound on the latent (`tanh(x / 3) · 3`).
pub const LATENT_CLAMP: f32 = 3.0;

/// How the decoder's tensors are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyLayout {
    /// diffusers' `AutoencoderTiny`: `decoder.layers.N.*`, the clamp outside the list.
    Diffusers,
    /// `taesd.py`'s decoder state dict: `N.*`, module 0 the clamp.
    Taesd,
}

impl KeyLayout {
    pub fn prefix(self) -> &'static str {
        match self {
            KeyLayout::Diffusers => "decoder.layers.",
            KeyLayout::Taesd => "",
        }
    }
}

/// One parametered module of the decoder, by its index in the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The first 3×3 convolution (latent channels → `out`), with bias; ReLU after.
    ConvIn { module: u16, out: u64 },
    /// `relu(conv(relu(conv(relu(conv(x))))) + skip(x))`, three 3×3
    /// convolutions with bias and a 1×1 skip without bias when the widths
    /// differ; with `pool` (its width), first `x += conv(relu(GN(conv(x))))`
    /// by 1×1 convolutions without bias around a 4-group GroupNorm.
    Block { module: u16, channels_in: u64, out: u64, skip: bool, pool: Option<u64> },
    /// ×2 nearest upsampling, then a 3×3 convolution without bias.
    Upsample { module: u16, channels_in: u64, out: u64 },
    /// The last 3×3 convolution, to RGB, with bias.
    ConvOut { module: u16, channels_in: u64 },
}

/// A tiny decoder's structure.
#[derive(Debug, Clone, PartialEq)]
pub struct TinyDecoderConfig {
    pub layout: KeyLayout,
    pub latent_channels: u64,
    pub stages: heapless::Vec<Stage, MAX_MODULES>,
}

/// Why tensors are not a tiny decoder, or a size it cannot take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TinyDecoderError {
    /// The file holds no tensor under either layout's names.
    NoDecoder,
    /// A module numbered beyond the decoders this reads.
    TooManyModules(u64),
    /// A tensor name this layout does not have.
    UnknownTensor(ShortName),
    /// A tensor of the wrong rank or width: its name and what was expected.
    Shape(ShortName, &'static str),
    /// The modules do not follow the decoder's grammar: why, at which module.
    Structure(u64, &'static str),
    Size(&'static str),
    Arena(ArenaError),
}

impl fmt::Display for TinyDecoderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TinyDecoderError::NoDecoder => f.write_str("no decoder tensors: expected diffusers' AutoencoderTiny names (`decoder.layers.N.…`) or a TAESD decoder's (`N.…`)"),
            TinyDecoderError::TooManyModules(m) => write!(f, "module {m} is beyond the {MAX_MODULES} modules a tiny decoder may have"),
            TinyDecoderError::UnknownTensor(n) => write!(f, "`{n}` is not a tensor of a tiny decoder"),
            TinyDecoderError::Shape(n, want) => write!(f, "`{n}` should be {want}"),
            TinyDecoderError::Structure(m, why) => write!(f, "module {m}: {why}"),
            TinyDecoderError::Size(why) => f.write_str(why),
            TinyDecoderError::Arena(e) => e.fmt(f),
        }
    }
}

/// A tensor's name in an error, its first 60 bytes (a decoder's names are half that).
pub type ShortName = heapless::String<60>;

fn short(name: &str) -> ShortName {
    let mut s = ShortName::new();
    for c in name.chars() {
        if s.push(c).is_err() {
            break;
        }
    }
    s
}

impl From<ArenaError> for TinyDecoderError {
    fn from(e: ArenaError) -> Self {
        TinyDecoderError::Arena(e)
    }
}

/// The tensors one module holds, as found.
#[derive(Debug, Clone, Copy, Default)]
struct Found {
    /// `N.weight` `[out, in, 3, 3]` and whether `N.bias` is there.
    conv: Option<[usize; 2]>,
    bias: bool,
    /// `N.conv.{0,2,4}.weight` `[out, in]` (their biases are checked by shape).
    block: [Option<[usize; 2]>; 3],
    skip: bool,
    /// `N.pool.0.weight` `[pool, in]`.
    pool: Option<usize>,
    any: bool,
}

impl TinyDecoderConfig {
    /// The structure of the decoder whose tensors are `tensors` (name,
    /// shape); other components' tensors in the same file (`encoder.*`)
    /// are passed over. Every shape is checked here.
    pub fn from_tensors<'a>(tensors: impl Iterator<Item = (&'a str, &'a [usize])> + Clone) -> Result<Self, TinyDecoderError> {
        let layout = if tensors.clone().any(|(n, _)| n.starts_with(KeyLayout::Diffusers.prefix())) {
            KeyLayout::Diffusers
        } else if tensors.clone().any(|(n, _)| n.starts_with(|c: char| c.is_ascii_digit())) {
            KeyLayout::Taesd
        } else {
            return Err(TinyDecoderError::NoDecoder);
        };
        let mut found = [Found::default(); MAX_MODULES];
        for (full, shape) in tensors.clone() {
            let Some(rest) = full.strip_prefix(layout.prefix()) else { continue };
            let tensor = || short(full);
            let (index, field) = rest.split_once('.').ok_or_else(|| TinyDecoderError::UnknownTensor(tensor()))?;
            let module: u64 = index.parse().map_err(|_| TinyDecoderError::UnknownTensor(tensor()))?;
            let f = found.get_mut(module as usize).ok_or(TinyDecoderError::TooManyModules(module))?;
            f.any = true;
            let conv = |kernel: usize| match shape {
                [o, i, k1, k2] if *k1 == kernel && *k2 == kernel => Ok([*o, *i]),
                _ => Err(TinyDecoderError::Shape(tensor(), if kernel == 3 { "a 3×3 convolution's weight" } else { "a 1×1 convolution's weight" })),
            };
            match field {
                "weight" => f.conv = Some(conv(3)?),
                "bias" => f.bias = true,
                "conv.0.weight" => f.block[0] = Some(conv(3)?),
                "conv.2.weight" => f.block[1] = Some(conv(3)?),
                "conv.4.weight" => f.block[2] = Some(conv(3)?),
                "skip.weight" => {
                    conv(1)?;
                    f.skip = true;
                }
                "pool.0.weight" => f.pool = Some(conv(1)?[0]),
                "conv.0.bias" | "conv.2.bias" | "conv.4.bias" | "pool.1.weight" | "pool.1.bias" | "pool.3.weight" => {}
                _ => return Err(TinyDecoderError::UnknownTensor(tensor())),
            }
        }
        let mut cfg = Self { layout, latent_channels: 0, stages: heapless::Vec::new() };
        // Module indices of the parametered modules, in order.
        let first = match layout {
            KeyLayout::Diffusers => 0,
            KeyLayout::Taesd => 1,
        };
        let mut width = 0u64;
        let mut last: Option<(u64, Stage)> = None;
        for (m, f) in found.iter().enumerate().filter(|(_, f)| f.any) {
            let m = m as u64;
            let bad = |why| TinyDecoderError::Structure(m, why);
            let gap = last.map(|(at, _)| m - at);
            let stage = match (f.conv, f.block[0], last.map(|(_, s)| s)) {
                (Some([out, lc]), None, None) => {
                    if m != first || !f.bias {
                        return Err(bad("the first convolution should come first, with a bias"));
                    }
                    cfg.latent_channels = lc as u64;
                    Stage::ConvIn { module: m as u16, out: out as u64 }
                }
                (_, _, None) => return Err(bad("the decoder should start with a convolution")),
                (_, _, Some(Stage::ConvOut { .. })) => return Err(bad("nothing may follow the convolution to RGB")),
                (None, Some([out, cin]), Some(prev)) => {
                    let want_gap = if matches!(prev, Stage::ConvIn { .. }) { 2 } else { 1 };
                    if gap != Some(want_gap) {
                        return Err(bad("a block should follow the first convolution's ReLU, a block or an upsampling's convolution"));
                    }
                    let [Some([o2, i2]), Some([o4, i4])] = [f.block[1], f.block[2]] else {
                        return Err(bad("a block needs conv.0, conv.2 and conv.4"));
                    };
                    if cin as u64 != width || [o2, i2, o4, i4] != [out; 4] || f.skip != (cin != out) {
                        return Err(bad("a block's convolutions do not chain (or its skip is missing or extra)"));
                    }
                    Stage::Block { module: m as u16, channels_in: cin as u64, out: out as u64, skip: f.skip, pool: f.pool.map(|p| p as u64) }
                }
                (Some([out, cin]), None, Some(prev)) => {
                    if cin as u64 != width {
                        return Err(bad("the convolution's input width is not the previous output's"));
                    }
                    if !matches!(prev, Stage::Block { .. }) {
                        return Err(bad("a convolution should follow a block"));
                    }
                    match (f.bias, gap) {
                        (false, Some(2)) => Stage::Upsample { module: m as u16, channels_in: cin as u64, out: out as u64 },
                        (true, Some(1)) if out == 3 => Stage::ConvOut { module: m as u16, channels_in: cin as u64 },
                        (true, _) => return Err(bad("the last convolution should follow a block directly and give 3 channels")),
                        (false, _) => return Err(bad("an upsampling (a module without tensors) should come before a convolution without bias")),
                    }
                }
                (Some(_), Some(_), _) => return Err(bad("a module holds both a convolution and a block")),
                (None, None, _) => return Err(bad("a module without a convolution or a block")),
            };
            width = match stage {
                Stage::ConvIn { out, .. } | Stage::Block { out, .. } | Stage::Upsample { out, .. } => out,
                Stage::ConvOut { .. } => 3,
            };
            cfg.stages.push(stage).map_err(|_| TinyDecoderError::TooManyModules(m))?;
            last = Some((m, stage));
        }
        if !matches!(last, Some((_, Stage::ConvOut { .. }))) {
            return Err(TinyDecoderError::Structure(last.map_or(0, |(m, _)| m), "the decoder should end with a convolution to 3 channels"));
        }
        // Every tensor each stage reads, with its shape: the biases checked here.
        let mut wrong = None;
        cfg.tensors(|t| {
            if t.zero || wrong.is_some() {
                return;
            }
            match tensors.clone().find(|(n, _)| *n == t.name.as_str()) {
                Some((_, shape)) if shape.iter().map(|&d| d as u64).eq(t.shape.iter().copied()) => {}
                _ => wrong = Some(TinyDecoderError::Shape(short(&t.name), t.what)),
            }
        });
        wrong.map_or(Ok(cfg), Err)
    }

    /// A decoder of `taesd.py`'s shape in TAESD's layout: `blocks[i]` blocks
    /// of `width` channels at level `i` (coarsest first), an upsampling
    /// between levels, global-norm blocks (4·`width` wide) in the first
    /// level when `pool`. TAEF2 is `(32, 64, [3, 3, 3, 1], true)`.
    pub fn taesd_shape(latent_channels: u64, width: u64, blocks: &[u64], pool: bool) -> Result<Self, TinyDecoderError> {
        let mut stages = heapless::Vec::new();
        let mut module = 1u16;
        let mut push = |stage: Stage, next: u16| -> Result<u16, TinyDecoderError> {
            stages.push(stage).map_err(|_| TinyDecoderError::TooManyModules(MAX_MODULES as u64))?;
            Ok(next)
        };
        // Module 0 is the clamp; the first convolution's ReLU follows it.
        module = push(Stage::ConvIn { module, out: width }, module + 2)?;
        for (level, &count) in blocks.iter().enumerate() {
            let pool = (pool && level == 0).then_some(4 * width);
            for _ in 0..count {
                module = push(Stage::Block { module, channels_in: width, out: width, skip: false, pool }, module + 1)?;
            }
            if level + 1 < blocks.len() {
                // The upsampling holds no tensors: the convolution after it is one module on.
                module = push(Stage::Upsample { module: module + 1, channels_in: width, out: width }, module + 2)?;
            }
        }
        push(Stage::ConvOut { module, channels_in: width }, module + 1)?;
        Ok(Self { layout: KeyLayout::Taesd, latent_channels, stages })
    }

    /// TAEF2's shape for a VAE of `latent_channels` and `scale` pixels a
    /// latent cell (a power of two): three blocks a level and one at full
    /// size, 64 channels, global norms in the first level (`taesd.py`'s
    /// decoder; FLUX.2's VAE: 32 channels at 8×).
    pub fn taef2_shape(latent_channels: u64, scale: u64) -> Result<Self, TinyDecoderError> {
        let mut blocks: heapless::Vec<u64, 16> = core::iter::repeat_n(3, scale.trailing_zeros().min(15) as usize).collect();
        let _ = blocks.push(1);
        Self::taesd_shape(latent_channels, 64, &blocks, true)
    }

    /// Pixels per latent cell: 2 to the number of upsamplings.
    pub fn scale(&self) -> u64 {
        1 << self.stages.iter().filter(|s| matches!(s, Stage::Upsample { .. })).count()
    }

    /// Every tensor the program names, with its shape; `zero` for the biases
    /// of the convolutions that have none, which the runner supplies as zeros.
    pub fn tensors(&self, mut emit: impl FnMut(TinyTensor)) {
        let p = self.layout.prefix();
        let mut t = |args: fmt::Arguments<'_>, shape: &[u64], zero: bool, what: &'static str| {
            emit(TinyTensor { name: name(args), shape: heapless::Vec::from_slice(shape).unwrap_or_default(), zero, what })
        };
        const W3: &str = "a 3×3 convolution's weight";
        const W1: &str = "a 1×1 convolution's weight";
        const B: &str = "a bias as wide as its convolution's output";
        for stage in &self.stages {
            match *stage {
                Stage::ConvIn { module: m, out } => {
                    t(format_args!("{p}{m}.weight"), &[out, self.latent_channels, 3, 3], false, W3);
                    t(format_args!("{p}{m}.bias"), &[out], false, B);
                }
                Stage::Block { module: m, channels_in: i, out: o, skip, pool } => {
                    for (k, cin) in [(0, i), (2, o), (4, o)] {
                        t(format_args!("{p}{m}.conv.{k}.weight"), &[o, cin, 3, 3], false, W3);
                        t(format_args!("{p}{m}.conv.{k}.bias"), &[o], false, B);
                    }
                    if skip {
                        t(format_args!("{p}{m}.skip.weight"), &[o, i, 1, 1], false, W1);
                        t(format_args!("{p}{m}.skip.bias"), &[o], true, B);
                    }
                    if let Some(pc) = pool {
                        t(format_args!("{p}{m}.pool.0.weight"), &[pc, i, 1, 1], false, W1);
                        t(format_args!("{p}{m}.pool.0.bias"), &[pc], true, B);
                        t(format_args!("{p}{m}.pool.1.weight"), &[pc], false, "a GroupNorm weight as wide as the pool");
                        t(format_args!("{p}{m}.pool.1.bias"), &[pc], false, "a GroupNorm bias as wide as the pool");
                        t(format_args!("{p}{m}.pool.3.weight"), &[i, pc, 1, 1], false, W1);
                        t(format_args!("{p}{m}.pool.3.bias"), &[i], true, B);
                    }
                }
                Stage::Upsample { module: m, channels_in: i, out: o } => {
                    t(format_args!("{p}{m}.weight"), &[o, i, 3, 3], false, W3);
                    t(format_args!("{p}{m}.bias"), &[o], true, B);
                }
                Stage::ConvOut { module: m, channels_in: i } => {
                    t(format_args!("{p}{m}.weight"), &[3, i, 3, 3], false, W3);
                    t(format_args!("{p}{m}.bias"), &[3], false, B);
                }
            }
        }
    }

    /// The most elements any `[C, pixels]` activation of a decode of a
    /// latent of `p0` cells holds (the latent, every stage's output and
    /// intermediates, the RGB output).
    pub fn largest_activation(&self, p0: u64) -> u64 {
        let mut most = self.latent_channels * p0;
        self.each_activation(p0, |pixels, channels| most = most.max(channels * pixels));
        most
    }

    /// The same on the channels-last path ([`super::tiny_decoder_nhwc`]):
    /// the latent's f32 rows, or an activation's f16 rows with their scales.
    pub fn largest_channels_last(&self, p0: u64) -> u64 {
        let mut most = (self.latent_channels * p0).max(half_elements(p0, self.latent_channels));
        self.each_activation(p0, |pixels, channels| most = most.max(half_elements(pixels, channels)));
        most
    }

    /// Bytes of the largest binding of a decode of `p0` latent cells: one activation buffer.
    pub fn largest_binding(&self, p0: u64, channels_last: bool) -> u64 {
        F32 * if channels_last { self.largest_channels_last(p0) } else { self.largest_activation(p0) }
    }

    /// Each activation's pixels and its widest channels, stage by stage.
    fn each_activation(&self, p0: u64, mut visit: impl FnMut(u64, u64)) {
        let mut pixels = p0;
        for stage in &self.stages {
            let widest = match *stage {
                Stage::ConvIn { out, .. } => out,
                Stage::Block { channels_in, out, pool, .. } => channels_in.max(out).max(pool.unwrap_or(0)),
                Stage::Upsample { channels_in, out, .. } => {
                    pixels *= 4;
                    channels_in.max(out)
                }
                Stage::ConvOut { channels_in, .. } => channels_in.max(3),
            };
            visit(pixels, widest);
        }
    }
}

/// A tensor the tiny decoder's program reads.
#[derive(Debug, Clone, PartialEq)]
pub struct TinyTensor {
    pub name: TensorName,
    pub shape: heapless::Vec<u64, 4>,
    /// A bias the file does not hold (the convolution has none): zeros.
    pub zero: bool,
    /// What it should be, for an error naming it.
    pub what: &'static str,
}

impl TinyTensor {
    /// As the model's tensor lists give a tensor.
    pub fn spec(&self) -> crate::models::tensors::TensorSpec {
        let shape = self.shape.iter().map(|&d| d as usize).collect();
        crate::models::tensors::TensorSpec { name: self.name.clone(), shape, kind: crate::models::tensors::Kind::Float }
    }
}

/// Where each activation of one tiny decode lives (element offsets into the f32 arena).
#[derive(Debug, Clone, PartialEq)]
pub struct TinyDecoderLayout {
    pub config: TinyDecoderConfig,
    /// The latent in VAE cells; both even.
    pub latent_h: u64,
    pub latent_w: u64,
    pub bn_eps: f32,
    /// Activations channels-last and f16 ([`super::tiny_decoder_nhwc`]: the
    /// matrix tier's data path), else channel-major f32 ([`decode`]).
    pub channels_last: bool,
    /// Input written by the host: packed latents `[tokens, 4·latent_channels]`.
    pub packed: Span,
    /// The de-normalised, unpatchified latent `[latent_channels, h·w]`.
    pub latent: Span,
    /// The residual stream and a block's two intermediates, each the largest activation.
    pub x: Span,
    pub t1: Span,
    pub t2: Span,
    /// The GroupNorms' statistics.
    pub norm: NormScratch,
    /// The decoded image and its levels (channel-major: `t1` and `t2`).
    out: [Span; 2],
}

impl TinyDecoderLayout {
    /// Lays out the decode of a `latent_h × latent_w` latent in `arena`,
    /// channels-last where `channels_last`; `bn_eps` is the VAE's BatchNorm
    /// epsilon (its statistics de-normalise the latents).
    pub fn new(config: &TinyDecoderConfig, latent_h: u64, latent_w: u64, bn_eps: f32, channels_last: bool, arena: &mut BumpArena) -> Result<Self, TinyDecoderError> {
        if !whole_tokens(latent_h, latent_w) {
            return Err(TinyDecoderError::Size("the latent must have an even, non-zero height and width"));
        }
        let p0 = latent_h.checked_mul(latent_w).ok_or(TinyDecoderError::Size("the latent is too large"))?;
        let largest = config.largest_binding(p0, channels_last) / F32;
        let mut take = |elems: u64| -> Result<Span, TinyDecoderError> {
            let bytes = elems.checked_mul(F32).ok_or(TinyDecoderError::Size("the image is too large"))?;
            Ok(Span::new(arena.alloc(bytes, ALIGN)?.offset / F32, 0))
        };
        let lc = config.latent_channels;
        let packed = take(p0 * lc)?;
        let latent = take(p0 * lc)?;
        let (x, t1, t2) = (take(largest)?, take(largest)?, take(largest)?);
        let norm = NormScratch::at(take(NormScratch::elements(POOL_GROUPS, latent_h * config.scale()))?, POOL_GROUPS);
        // Channels-last, the stream ends where its last stage leaves it: the image and its levels take their own.
        let image = 3 * p0 * config.scale() * config.scale();
        let out = if channels_last { [take(image)?, take(level_words(image))?] } else { [t1, t2] };
        Ok(Self { config: config.clone(), latent_h, latent_w, bn_eps, channels_last, packed: Span::new(packed.offset, 4 * lc), latent, x, t1, t2, norm, out })
    }

    /// Output size in pixels (height, width).
    pub fn image_size(&self) -> (u64, u64) {
        let s = self.config.scale();
        (self.latent_h * s, self.latent_w * s)
    }

    /// Where the decoded image (in [-1, 1], as the VAE's) lands: `[3, H·W]`,
    /// or `[H·W, 3]` rows channels-last.
    pub fn decoded(&self) -> Span {
        self.out[0]
    }

    /// Its 8-bit levels, four to a word ([`Op::PixelLevels`]): planar, or
    /// interleaved RGB channels-last.
    pub fn levels(&self) -> Span {
        self.out[1]
    }

    /// Elements of the decoded image.
    pub fn decoded_len(&self) -> u64 {
        let (h, w) = self.image_size();
        3 * h * w
    }
}

/// Bytes of the arena that decodes a `latent_h × latent_w` latent in one
/// pass (channels-last where `channels_last`).
pub fn arena_bytes(config: &TinyDecoderConfig, latent_h: u64, latent_w: u64, channels_last: bool) -> Result<u64, TinyDecoderError> {
    let mut arena = BumpArena::new(u64::MAX);
    TinyDecoderLayout::new(config, latent_h, latent_w, 0.0, channels_last, &mut arena)?;
    Ok(arena.high_water())
}

/// f32 elements of band operands when the decoder has the device memory
/// of a one-pass decode of a `tile × tile`-cell latent, within one binding
/// of `max_binding` bytes (as the VAE's bands, [`crate::models::vae::band_capacity`]).
pub fn band_capacity(config: &TinyDecoderConfig, tile: u64, max_binding: u64, channels_last: bool) -> Result<u64, TinyDecoderError> {
    Ok(arena_bytes(config, tile, tile, channels_last)?.min(max_binding) / 4)
}

/// The latent the decoder takes into `l.latent` (`[latent_channels, h·w]`):
/// the packed latents de-normalised and unpatchified as for the VAE, then
/// soft-clamped (`tanh(x/3)·3`).
pub(crate) fn latent_in(l: &TinyDecoderLayout, emit: &mut impl FnMut(Op)) {
    let lc = l.config.latent_channels;
    emit(denorm_unpatchify(l.packed, l.latent, lc, (l.latent_h, l.latent_w), l.bn_eps));
    emit(Op::TanhClamp { src: l.latent, dst: l.latent, count: lc * l.latent_h * l.latent_w, limit: LATENT_CLAMP });
}

/// The channel-major decode: packed latents to the image's 8-bit levels, as the VAE's
/// decode ends. The BatchNorm statistics are named as the VAE's
/// (`bn.running_mean`, `bn.running_var`): the runner supplies them.
pub fn decode(l: &TinyDecoderLayout, mut emit: impl FnMut(Op)) {
    let cfg = &l.config;
    let p = cfg.layout.prefix();
    let (mut h, mut w) = (l.latent_h, l.latent_w);
    let lc = cfg.latent_channels;
    latent_in(l, &mut emit);
    // The ReLU after a convolution runs in its epilogue, and the one after a
    // block's sum in the sum's: the same values, three passes fewer a block.
    let conv = |x: Span, weight: TensorName, bias: TensorName, y: Span, shape| Op::Conv2d { x, w: weight, bias, y, shape, residual: false, relu: false };
    let conv_relu = |x: Span, weight: TensorName, bias: TensorName, y: Span, shape| Op::Conv2d { x, w: weight, bias, y, shape, residual: false, relu: true };
    // A block's sum and its ReLU in its last convolution's epilogue, where the block has no skip convolution.
    let conv_onto_relu = |x: Span, weight: TensorName, bias: TensorName, y: Span, shape| Op::Conv2d { x, w: weight, bias, y, shape, residual: true, relu: true };
    let (x, t1, t2) = (l.x, l.t1, l.t2);
    for stage in &cfg.stages {
        let pixels = h * w;
        match *stage {
            Stage::ConvIn { module: m, out } => {
                emit(conv_relu(l.latent, name(format_args!("{p}{m}.weight")), name(format_args!("{p}{m}.bias")), x, same(lc, out, h, w, 3)));
            }
            Stage::Block { module: m, channels_in: i, out: o, skip, pool } => {
                if let Some(pc) = pool {
                    emit(conv(x, name(format_args!("{p}{m}.pool.0.weight")), name(format_args!("{p}{m}.pool.0.bias")), t1, same(i, pc, h, w, 1)));
                    let shape = GroupShape { channels: pc, pixels, width: w, groups: POOL_GROUPS, channels_last: false };
                    group_norm(l.norm, (t1.into(), t2.into()), &prefix(format_args!("{p}{m}.pool.1")), shape, POOL_EPS, false, &mut emit);
                    emit(Op::Relu { src: t2, dst: t2, count: pc * pixels });
                    emit(conv(t2, name(format_args!("{p}{m}.pool.3.weight")), name(format_args!("{p}{m}.pool.3.bias")), t1, same(pc, i, h, w, 1)));
                    emit(Op::Add { a: rows(x, pixels), b: rows(t1, pixels), dst: rows(x, pixels), rows: i, cols: pixels, relu: false });
                }
                emit(conv_relu(x, name(format_args!("{p}{m}.conv.0.weight")), name(format_args!("{p}{m}.conv.0.bias")), t1, same(i, o, h, w, 3)));
                emit(conv_relu(t1, name(format_args!("{p}{m}.conv.2.weight")), name(format_args!("{p}{m}.conv.2.bias")), t2, same(o, o, h, w, 3)));
                let (w4, b4) = (name(format_args!("{p}{m}.conv.4.weight")), name(format_args!("{p}{m}.conv.4.bias")));
                if !skip {
                    emit(conv_onto_relu(t2, w4, b4, x, same(o, o, h, w, 3)));
                    continue;
                }
                emit(conv(t2, w4, b4, t1, same(o, o, h, w, 3)));
                emit(conv(x, name(format_args!("{p}{m}.skip.weight")), name(format_args!("{p}{m}.skip.bias")), t2, same(i, o, h, w, 1)));
                emit(Op::Add { a: rows(t1, pixels), b: rows(t2, pixels), dst: rows(x, pixels), rows: o, cols: pixels, relu: true });
            }
            Stage::Upsample { module: m, channels_in: i, out: o } => {
                emit(Op::UpsampleNearest2x { x, y: t1, channels: i, height: h, width: w });
                (h, w) = (2 * h, 2 * w);
                emit(conv(t1, name(format_args!("{p}{m}.weight")), name(format_args!("{p}{m}.bias")), x, same(i, o, h, w, 3)));
            }
            Stage::ConvOut { module: m, channels_in: i } => {
                emit(conv(x, name(format_args!("{p}{m}.weight")), name(format_args!("{p}{m}.bias")), t1, same(i, 3, h, w, 3)));
                // The decoder's [0, 1] to the VAE's [-1, 1], as `DecoderTiny` returns `x.mul(2).sub(1)`.
                emit(Op::ScaleShift { src: t1, dst: t1, count: 3 * pixels, scale: 2.0, shift: -1.0 });
                emit(Op::PixelLevels { src: t1, dst: t2, count: 3 * pixels });
            }
        }
    }
}

#[cfg(test)]
#[path = "tiny_decoder_tests.rs"]
mod tests;
