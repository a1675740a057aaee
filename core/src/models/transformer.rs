//! `Flux2Transformer2DModel` as block programs over one activation arena.
//!
//! The residual stream is one `[text + image, D]` tensor with the text rows
//! first: the double blocks update its two parts with their own weights,
//! joint attention runs over it directly, and the single blocks need no
//! concatenation. Every dimension comes from the config.
//!
//! By chunks of tokens (a layout whose `chunk` is below the row count), a
//! block runs twice over its rows a chunk at a time: first every row's keys
//! and values (kept whole), then each chunk's queries, its attention over
//! every key, and the rest of the block, updating the stream's rows in
//! place. Only the stream, the keys and the values are as long as the
//! sequence; each row's arithmetic is the unchunked pass's.
//!
//! In the half-K/V layout (by chunks) the keys and values are kept as f16
//! pairs, each (token, head) row under its range scale: a chunk's keys and
//! values are projected into chunk scratch, normed and roped there, and
//! packed (`Op::HalfPack`); attention reads them packed
//! (`Op::HalfKvAttention`). That halves the floor's keys and values at the
//! cost of rounding them to f16.
//!
//! The image rows are the noise tokens, then the tokens of any reference
//! images: every block runs over both, and only the noise tokens' velocity
//! is computed (diffusers slices the prediction to them).
//!
//! With the klein KV cache (`Flux2KleinKVPipeline`), the first step's
//! pass extracts (`KvPass::Extract`): the reference rows are modulated from
//! a fixed timestep 0 and attend to themselves only, while the text and
//! noise rows attend to every row, and each block's reference keys and
//! values (after RoPE) are kept in the cache. Later steps' passes
//! (`KvPass::Cached`) run the text and noise rows alone, their attention
//! reading the cached reference keys and values in the reference rows of
//! `k` and `v`. diffusers orders the sequence `[text, references, noise]`
//! there; attention does not depend on the order of its keys, so the rows
//! keep this layout's `[text, noise, references]`.

use crate::arena::{ArenaError, BumpArena};
use crate::config::TransformerConfig;
use crate::ir::{linear, linear_swiglu, name, Gate, LaterModulation, Op, Operand, Span, ALIGN, F32};
use crate::models::tensors::TensorName;
use core::fmt::Write;

/// Token counts of one forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    /// Prompt tokens.
    pub text: u64,
    /// Latent tokens being denoised.
    pub noise: u64,
    /// Tokens of the reference images, after the noise tokens.
    pub references: u64,
    /// The klein KV pipeline's handling of the references (meaningful with references).
    pub kv_cache: KvMode,
    /// Keys and values kept in half precision (the half-K/V layout, whose
    /// blocks run by chunks); not with a kept KV cache, whose copies move f32 rows.
    pub half_kv: bool,
    /// The products' inputs written as f16 rows under their range scales
    /// ([`Operand`]): the matrix tier's half-precision data path, whose
    /// products would round them so anyway.
    pub half_operands: bool,
}

/// How a pass treats the reference tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum KvMode {
    /// As `Flux2KleinPipeline`: every row alike in every pass.
    #[default]
    Off,
    /// The KV pipeline: the first pass extracts the references' keys and
    /// values into the cache, later passes read it.
    Keep,
    /// The KV pipeline's numbers without the cache's memory: every pass
    /// extracts (the references' rows are recomputed each step).
    Recompute,
}

impl Tokens {
    /// A pass without reference images.
    pub fn plain(text: u64, noise: u64) -> Self {
        Self { text, noise, references: 0, kv_cache: KvMode::Off, half_kv: false, half_operands: false }
    }

    /// Every image token: noise, then references.
    pub fn image(&self) -> u64 {
        self.noise + self.references
    }
}

/// Where each activation lives (element offsets into the f32 arena) for
/// `text` prompt tokens and `image` latent tokens (`noise` of them denoised,
/// the rest reference tokens).
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerLayout {
    pub text: u64,
    pub image: u64,
    pub noise: u64,
    pub dim: u64,
    pub mlp: u64,
    pub heads: u64,
    pub head_dim: u64,
    pub in_channels: u64,
    pub out_channels: u64,
    pub joint_dim: u64,
    pub sinusoid_dim: u64,
    pub eps: f32,
    /// Inputs written by the host: packed latents `[image, in]` (noise rows,
    /// then reference rows), prompt `[text, joint]`, sinusoid `[256]`.
    pub latents: Span,
    pub prompt: Span,
    pub sinusoid: Span,
    /// Timestep MLP and the shared modulation vectors.
    pub t_hidden: Span,
    pub t_act: Span,
    pub temb: Span,
    pub temb_silu: Span,
    pub mod_img: Span,
    pub mod_txt: Span,
    pub mod_single: Span,
    pub mod_out: Span,
    /// The residual stream `[text + image, D]` and its normalised copy
    /// (`[chunk, D]` by chunks), every product's input after a norm: f32, or
    /// f16 rows under range scales with [`Tokens::half_operands`].
    pub stream: Span,
    pub normed: Operand,
    /// Double-block attention tensors: queries and attention output
    /// `[text + image, D]` (`[chunk, D]` by chunks), keys and values
    /// `[text + image, D]` always (every query reads every key); in the
    /// half-K/V layout `[text + image, D/2]` words of f16 pairs.
    pub q: Span,
    pub k: Span,
    pub v: Span,
    /// The half-K/V layout's range scales of the keys and of the values,
    /// `[text + image, heads]` each.
    pub kv_scales: Option<[Span; 2]>,
    pub attn: Span,
    /// A projection's output before its gated residual, `[text + image, D]` (`[chunk, D]` by chunks).
    pub proj: Span,
    /// Feed-forward input projection `[min(max(text, image), chunk), 2F]` and activation `[.., F]`.
    pub ff_in: Span,
    pub ff_act: Span,
    /// Single block: fused projection `[text + image, 3D + 2F]` and
    /// `[attention ; mlp]` `[.., D + F]`; by chunks, the MLP half of the
    /// projection `[chunk, 2F]` and `[attention ; mlp]` `[chunk, D + F]`
    /// (q, k and v then in the double blocks' spans).
    pub fused: Span,
    pub joined: Span,
    /// The velocity of the noise tokens, `[noise, out]`.
    pub velocity: Span,
    /// Token rows per pass of every per-token stage: `text + image` (one
    /// pass) unless chunked.
    pub chunk: u64,
    /// The reference KV cache and the pass these programs run, with the KV pipeline.
    pub kv: Option<KvCache>,
}

/// Bytes of the KV pipeline's cache of `references` reference tokens: every
/// block's keys and values, f32 `[2 · references, D]` a block.
pub fn kv_cache_bytes(cfg: &TransformerConfig, references: u64) -> u64 {
    2 * (cfg.num_layers + cfg.num_single_layers) as u64 * references * cfg.inner_dim() as u64 * F32
}

/// Which pass of the KV pipeline a program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvPass {
    /// Every row; the reference rows modulated from timestep 0, attending to
    /// themselves only; their keys and values kept in the cache.
    Extract,
    /// The text and noise rows, attending also to the cached reference keys and values.
    Cached,
}

/// The reference tokens' keys and values of every block, and the reference
/// rows' own modulations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvCache {
    pub pass: KvPass,
    pub references: u64,
    /// Double blocks come first in the cache, then single blocks.
    pub double_blocks: u64,
    /// `[blocks · 2 · references, D]`: block `i`'s keys, then its values;
    /// `None` when every pass recomputes them ([`KvMode::Recompute`]).
    pub cache: Option<Span>,
    /// The sinusoid of timestep 0 (written by the host), its embedding, and
    /// the double-block image and single-block modulations from it.
    pub sinusoid: Span,
    pub temb: Span,
    pub temb_silu: Span,
    pub mod_img: Span,
    pub mod_single: Span,
}

impl KvCache {
    /// The cached keys (`1`: values) of cache block `i`, where the cache is kept.
    fn slot(&self, i: u64, part: u64) -> Option<Span> {
        self.cache.map(|c| c.rows_from((2 * i + part) * self.references))
    }
}


impl TransformerLayout {
    /// Lays out every activation of one forward pass without reference images in `arena`.
    pub fn new(cfg: &TransformerConfig, text: u64, image: u64, arena: &mut BumpArena) -> Result<Self, ArenaError> {
        Self::chunked(cfg, Tokens::plain(text, image), text + image, arena)
    }

    /// Lays out one forward pass whose per-token stages (modulation and
    /// norms, projections, RoPE, the queries' attention, the feed-forward
    /// and MLP, residuals) run over at most `chunk` token rows at a time, so
    /// their scratch holds `chunk` rows; the residual stream, keys and values
    /// stay whole. A `chunk` of `text + image` or more is the unchunked layout.
    pub fn chunked(cfg: &TransformerConfig, tokens: Tokens, chunk: u64, arena: &mut BumpArena) -> Result<Self, ArenaError> {
        let (text, image, noise) = (tokens.text, tokens.image(), tokens.noise);
        let dim = cfg.inner_dim() as u64;
        let mlp = cfg.mlp_hidden_dim() as u64;
        let rows = text + image;
        let chunk = chunk.clamp(1, rows.max(1));
        let half_kv = tokens.half_kv && tokens.kv_cache != KvMode::Keep;
        let by_chunks = chunk < rows || half_kv;
        let kv_width = if half_kv { dim / 2 } else { dim };
        let take = |arena: &mut BumpArena, r: u64, width: u64| -> Result<Span, ArenaError> {
            let s = arena.alloc(r * width * F32, ALIGN)?;
            Ok(Span::new(s.offset / F32, width))
        };
        // The feed-forward scratch of double blocks and the projections of
        // single blocks are never live together: they share bytes.
        let scratch = arena.used();
        let ff_rows = text.max(image).min(chunk);
        let ff_in = take(arena, ff_rows, 2 * mlp)?;
        let ff_act = take(arena, ff_rows, mlp)?;
        let double_end = arena.used();
        arena.rewind(scratch);
        let (fused, joined) = if by_chunks {
            (take(arena, chunk, 2 * mlp)?, take(arena, chunk, dim + mlp)?)
        } else {
            (take(arena, rows, 3 * dim + 2 * mlp)?, take(arena, rows, dim + mlp)?)
        };
        arena.reserve_to(double_end)?;
        let mut take = |r: u64, width: u64| take(arena, r, width);
        // By chunks, the per-token scratch holds one chunk; keys, values and the stream stay whole.
        let scratch_rows = chunk.min(rows);
        let mut l = Self {
            text,
            image,
            noise,
            dim,
            mlp,
            heads: cfg.num_attention_heads as u64,
            head_dim: cfg.attention_head_dim as u64,
            in_channels: cfg.in_channels as u64,
            out_channels: cfg.out_channels as u64,
            joint_dim: cfg.joint_attention_dim as u64,
            sinusoid_dim: cfg.timestep_guidance_channels as u64,
            eps: cfg.eps as f32,
            latents: take(image, cfg.in_channels as u64)?,
            prompt: take(text, cfg.joint_attention_dim as u64)?,
            sinusoid: take(1, cfg.timestep_guidance_channels as u64)?,
            t_hidden: take(1, dim)?,
            t_act: take(1, dim)?,
            temb: take(1, dim)?,
            temb_silu: take(1, dim)?,
            mod_img: take(1, 6 * dim)?,
            mod_txt: take(1, 6 * dim)?,
            mod_single: take(1, 3 * dim)?,
            mod_out: take(1, 2 * dim)?,
            stream: take(rows, dim)?,
            // f16 pairs on the half-precision path: half the words, and a scale a row.
            normed: match tokens.half_operands {
                true => Operand { data: take(scratch_rows, dim / 2)?, scales: Some(take(scratch_rows, 1)?) },
                false => Operand::f32(take(scratch_rows, dim)?),
            },
            q: take(scratch_rows, dim)?,
            k: take(rows, kv_width)?,
            v: take(rows, kv_width)?,
            kv_scales: None,
            attn: take(scratch_rows, dim)?,
            proj: take(scratch_rows, dim)?,
            ff_in,
            ff_act,
            fused,
            joined,
            velocity: take(noise, cfg.out_channels as u64)?,
            chunk,
            kv: None,
        };
        if half_kv {
            let heads = cfg.num_attention_heads as u64;
            l.kv_scales = Some([take(rows, heads)?, take(rows, heads)?]);
        }
        let references = image - noise;
        if tokens.kv_cache != KvMode::Off && references > 0 {
            let blocks = (cfg.num_layers + cfg.num_single_layers) as u64;
            l.kv = Some(KvCache {
                pass: KvPass::Extract,
                references,
                double_blocks: cfg.num_layers as u64,
                cache: if tokens.kv_cache == KvMode::Keep { Some(take(2 * blocks * references, dim)?) } else { None },
                sinusoid: take(1, cfg.timestep_guidance_channels as u64)?,
                temb: take(1, dim)?,
                temb_silu: take(1, dim)?,
                mod_img: take(1, 6 * dim)?,
                mod_single: take(1, 3 * dim)?,
            });
        }
        Ok(l)
    }

    /// The same layout running `pass` of the KV pipeline (unchanged without
    /// the KV pipeline; always extracting without a kept cache).
    pub fn with_pass(&self, pass: KvPass) -> Self {
        let mut l = self.clone();
        if let Some(kv) = l.kv.as_mut().filter(|kv| kv.cache.is_some()) {
            kv.pass = pass;
        }
        l
    }

    /// The pass these programs run, when the KV cache is in use.
    pub fn kv_pass(&self) -> Option<KvPass> {
        self.kv.map(|kv| kv.pass)
    }

    /// Image rows a pass runs through its blocks: the noise rows alone in a
    /// cached pass, else every image row.
    pub fn active_image(&self) -> u64 {
        match self.kv_pass() {
            Some(KvPass::Cached) => self.noise,
            _ => self.image,
        }
    }

    /// Text and image rows a pass runs through its blocks.
    pub fn active_rows(&self) -> u64 {
        self.text + self.active_image()
    }

    /// Whether the blocks run by chunks of token rows (every per-token
    /// stage; the keys, values and residual stream whole): below the row
    /// count, and always in the half-K/V layout.
    pub fn by_chunks(&self) -> bool {
        self.chunk < self.text + self.image || self.kv_scales.is_some()
    }

    /// `(first row, rows)` of each chunk of `rows` rows.
    fn chunks(&self, rows: u64) -> impl Iterator<Item = (u64, u64)> {
        let chunk = self.chunk;
        (0..rows).step_by(chunk as usize).map(move |r0| (r0, chunk.min(rows - r0)))
    }

    /// Chunk `i` (width D) of a modulation vector, as a broadcast row.
    fn chunk(&self, m: Span, i: u64) -> Span {
        Span::new(m.offset + i * self.dim, 0)
    }
}

/// The timestep MLP on `sinusoid` into `temb`, and `silu(temb)` into
/// `temb_silu`, which the modulations read (its scratch: `t_hidden`, `t_act`).
fn timestep_embedding(l: &TransformerLayout, sinusoid: Span, [temb, temb_silu]: [Span; 2], emit: &mut impl FnMut(Op)) {
    let d = l.dim;
    emit(linear(sinusoid, name(format_args!("time_guidance_embed.timestep_embedder.linear_1.weight")), l.t_hidden, 1, d, l.sinusoid_dim));
    emit(Op::Silu { src: l.t_hidden, dst: l.t_act, rows: 1, cols: d });
    emit(linear(l.t_act, name(format_args!("time_guidance_embed.timestep_embedder.linear_2.weight")), temb, 1, d, d));
    emit(Op::Silu { src: temb, dst: temb_silu, rows: 1, cols: d });
}

/// Timestep MLP, the shared modulations, and the two input embedders.
pub fn prologue(l: &TransformerLayout, mut emit: impl FnMut(Op)) {
    let d = l.dim;
    let one = |s: Span| Span::new(s.offset, 0);
    timestep_embedding(l, l.sinusoid, [l.temb, l.temb_silu], &mut emit);
    emit(linear(one(l.temb_silu), name(format_args!("double_stream_modulation_img.linear.weight")), l.mod_img, 1, 6 * d, d));
    emit(linear(one(l.temb_silu), name(format_args!("double_stream_modulation_txt.linear.weight")), l.mod_txt, 1, 6 * d, d));
    emit(linear(one(l.temb_silu), name(format_args!("single_stream_modulation.linear.weight")), l.mod_single, 1, 3 * d, d));
    emit(linear(one(l.temb_silu), name(format_args!("norm_out.linear.weight")), l.mod_out, 1, 2 * d, d));
    if let Some(kv) = l.kv.filter(|kv| kv.pass == KvPass::Extract) {
        // The reference rows' modulations, from the sinusoid of timestep 0.
        timestep_embedding(l, kv.sinusoid, [kv.temb, kv.temb_silu], &mut emit);
        emit(linear(one(kv.temb_silu), name(format_args!("double_stream_modulation_img.linear.weight")), kv.mod_img, 1, 6 * d, d));
        emit(linear(one(kv.temb_silu), name(format_args!("single_stream_modulation.linear.weight")), kv.mod_single, 1, 3 * d, d));
    }
    emit(linear(l.prompt, name(format_args!("context_embedder.weight")), l.stream, l.text, d, l.joint_dim));
    emit(linear(l.latents, name(format_args!("x_embedder.weight")), l.stream.rows_from(l.text), l.active_image(), d, l.in_channels));
}

/// A modulation vector, and where an extracting pass's reference rows find theirs.
#[derive(Clone, Copy)]
struct Modulation {
    vector: Span,
    reference: fn(&KvCache) -> Span,
}

/// Rows that share one modulation: `(first row, rows, modulation vector)`.
type Segment = (u64, u64, Span);

/// The modulation segments of rows `first .. first + rows` under `m`: in an
/// extracting pass the reference rows among them take `m`'s reference vector.
fn segments(l: &TransformerLayout, first: u64, rows: u64, m: Modulation) -> heapless::Vec<Segment, 2> {
    let mut out = heapless::Vec::new();
    let (end, ref_start) = (first + rows, l.text + l.noise);
    match l.kv.filter(|kv| kv.pass == KvPass::Extract && end > ref_start) {
        Some(kv) => {
            if first < ref_start {
                let _ = out.push((first, ref_start - first, m.vector));
            }
            let start = first.max(ref_start);
            let _ = out.push((start, end - start, (m.reference)(&kv)));
        }
        None => {
            let _ = out.push((first, rows, m.vector));
        }
    }
    out
}

/// The stream's rows `first .. first + n` normalised and modulated (chunks
/// `shift`, `scale` of `m`) into `normed`, whose rows start at the stream's
/// row `base`: 0 unchunked, the chunk's first row by chunks.
fn modulate(l: &TransformerLayout, (first, n, base): (u64, u64, u64), m: Modulation, chunks: [u64; 2], emit: &mut impl FnMut(Op)) {
    modulate_segments(l, &segments(l, first, n, m), base, chunks, emit);
}

/// [`modulate`] over every row of `streams` (consecutive rows, unchunked).
fn modulate_streams(l: &TransformerLayout, streams: &[&Stream<'_>], chunks: [u64; 2], emit: &mut impl FnMut(Op)) {
    let segments: heapless::Vec<Segment, 4> = streams.iter().flat_map(|s| segments(l, s.first_row, s.rows, s.modulation)).collect();
    modulate_segments(l, &segments, 0, chunks, emit);
}

/// Segments of the stream's rows normalised and modulated (chunks `shift`,
/// `scale` of each segment's vector) into `normed` (rows from the stream's
/// row `base`): two consecutive segments in one pass, the second's rows
/// under its own modulation ([`LaterModulation`]).
fn modulate_segments(l: &TransformerLayout, segments: &[Segment], base: u64, [shift, scale]: [u64; 2], emit: &mut impl FnMut(Op)) {
    let mut i = 0;
    while i < segments.len() {
        let (r, count, v) = segments[i];
        let next = segments.get(i + 1).filter(|&&(r2, ..)| r2 == r + count);
        let later = next.map(|&(_, _, v2)| LaterModulation { row: count, shift: l.chunk(v2, shift), scale: l.chunk(v2, scale) });
        let tokens = count + next.map_or(0, |&(_, n, _)| n);
        emit(Op::LayerNormModulate { src: l.stream.rows_from(r), dst: l.normed.rows_from(r - base), shift: l.chunk(v, shift), scale: l.chunk(v, scale), later, tokens, d: l.dim, eps: l.eps });
        i += 1 + next.is_some() as usize;
    }
}

/// The gated residual (chunk `gate` of `m`) of `proj` into the stream's rows
/// `first .. first + n`, `proj`'s rows starting at the stream's row `base`.
fn gated_residual(l: &TransformerLayout, (first, n, base): (u64, u64, u64), m: Modulation, gate: u64, emit: &mut impl FnMut(Op)) {
    for (r, count, v) in segments(l, first, n, m) {
        emit(Op::GatedResidual { dst: l.stream.rows_from(r), gate: l.chunk(v, gate), y: l.proj.rows_from(r - base), rows: count, cols: l.dim });
    }
}

/// `x·Wᵀ` (W `w`, rows of `inner` terms) added into the stream's rows
/// `first .. first + n` under chunk `gate` of `m`, in the product's
/// epilogue ([`Gate`], `proj`'s rows from the stream's row `base` its
/// scratch) where one modulation vector covers the rows; else into `proj`
/// and the gated residual of each segment after it.
#[allow(clippy::too_many_arguments)] // the product, the rows, and their gate
fn project_into_stream(l: &TransformerLayout, x: Operand, w: TensorName, inner: u64, (first, n, base): (u64, u64, u64), m: Modulation, gate: u64, emit: &mut impl FnMut(Op)) {
    let proj = l.proj.rows_from(first - base);
    match segments(l, first, n, m).as_slice() {
        &[(r, count, v)] => emit(Op::Linear {
            x,
            w,
            w_row: 0,
            bias: None,
            y: l.stream.rows_from(r),
            rows: count,
            cols: l.dim,
            inner,
            gate: Some(Gate { vector: l.chunk(v, gate), scratch: proj }),
        }),
        _ => {
            emit(linear(x, w, proj, n, l.dim, inner));
            gated_residual(l, (first, n, base), m, gate, emit);
        }
    }
}

/// Attention over every row in `q`, `k`, `v` into `o`, as the pass has
/// it: the cache's copies ([`kv_copies`]), then [`attend`] for every row.
fn attention(l: &TransformerLayout, block: u64, [q, k, v, o]: [Span; 4], emit: &mut impl FnMut(Op)) {
    kv_copies(l, block, k, v, emit);
    attend(l, [q, k, v, o], 0, l.active_rows(), emit);
}

/// The KV pipeline's copies between the reference rows of `k`, `v` and
/// cache block `block`: extracting, the rows into the cache (once every
/// row's keys are roped); cached, the cache into the rows (before any
/// query attends).
fn kv_copies(l: &TransformerLayout, block: u64, k: Span, v: Span, emit: &mut impl FnMut(Op)) {
    let Some(kv) = l.kv else { return };
    let refs = |s: Span| s.rows_from(l.text + l.noise);
    for (part, data) in [(0, k), (1, v)] {
        let Some(slot) = kv.slot(block, part) else { continue };
        let (src, dst) = match kv.pass {
            KvPass::Extract => (refs(data), slot),
            KvPass::Cached => (slot, refs(data)),
        };
        emit(Op::Copy { src, dst, rows: kv.references, cols: l.dim });
    }
}

/// Attention of the query rows `first .. first + rows` (`q` and `o` start at
/// row `first`) over the keys of every row: all rows over all rows;
/// extracting, the reference rows over the reference rows only.
fn attend(l: &TransformerLayout, [q, k, v, o]: [Span; 4], first: u64, rows: u64, emit: &mut impl FnMut(Op)) {
    let (heads, hd) = (l.heads, l.head_dim);
    let (all, own) = (l.text + l.image, l.text + l.noise);
    // `q_len` queries over the `kv_len` keys from row `kv_first`, f32 or half.
    let mut cross = |q: Span, o: Span, q_len: u64, kv_first: u64, kv_len: u64| {
        let (k, v) = (k.rows_from(kv_first), v.rows_from(kv_first));
        emit(match l.kv_scales {
            None => Op::CrossAttention { q, k, v, o, q_len, kv_len, heads, head_dim: hd },
            Some([ks, vs]) => Op::HalfKvAttention { q, k, v, k_scales: ks.rows_from(kv_first), v_scales: vs.rows_from(kv_first), o, q_len, kv_len, heads, head_dim: hd },
        })
    };
    match l.kv_pass() {
        None if first == 0 && rows == all && l.kv_scales.is_none() => emit(Op::Attention { q, k, v, o, len: all, heads, head_dim: hd }),
        Some(KvPass::Extract) => {
            let end = first + rows;
            if first < own {
                cross(q, o, end.min(own) - first, 0, all);
            }
            if end > own {
                let start = first.max(own);
                cross(q.rows_from(start - first), o.rows_from(start - first), end - start, own, all - own);
            }
        }
        _ => cross(q, o, rows, 0, all),
    }
}

/// Where a chunk of rows from `first` gets its keys and values projected:
/// straight into the whole `k` and `v`, or in the half-K/V layout into
/// chunk scratch (`q` and `attn`, free until the chunk's queries), for
/// [`keep_keys_values`] to rope and pack.
fn key_value_targets(l: &TransformerLayout, first: u64) -> [Span; 2] {
    match l.kv_scales {
        None => [l.k.rows_from(first), l.v.rows_from(first)],
        Some(_) => [l.q, l.attn],
    }
}

/// After a chunk's keys (normed) and values are in [`key_value_targets`]:
/// in the half-K/V layout, RoPE on the chunk's keys and both packed into
/// rows `first .. first + n` (f32 keys are roped all at once by [`rope_keys`]).
fn keep_keys_values(l: &TransformerLayout, first: u64, n: u64, emit: &mut impl FnMut(Op)) {
    let Some([ks, vs]) = l.kv_scales else { return };
    let (heads, head_dim) = (l.heads, l.head_dim);
    emit(Op::RopeInterleaved { data: l.q, table_row: first, tokens: n, heads, head_dim });
    emit(Op::HalfPack { src: l.q, dst: l.k.rows_from(first), scales: ks.rows_from(first), tokens: n, heads, head_dim });
    emit(Op::HalfPack { src: l.attn, dst: l.v.rows_from(first), scales: vs.rows_from(first), tokens: n, heads, head_dim });
}

/// RoPE on every row's f32 keys, once all are projected (the half-K/V
/// layout ropes each chunk's before packing).
fn rope_keys(l: &TransformerLayout, emit: &mut impl FnMut(Op)) {
    if l.kv_scales.is_none() {
        emit(Op::RopeInterleaved { data: l.k, table_row: 0, tokens: l.active_rows(), heads: l.heads, head_dim: l.head_dim });
    }
}

/// One stream (text or image) of a double block: which rows, which weights.
struct Stream<'a> {
    first_row: u64,
    rows: u64,
    modulation: Modulation,
    q: &'a str,
    k: &'a str,
    v: &'a str,
    out: &'a str,
    q_norm: &'a str,
    k_norm: &'a str,
    ff: &'a str,
}

/// Double-stream block `b`: each stream modulated and projected with its
/// own weights, joint attention over `[text ; image]`, gated residuals,
/// SwiGLU feed-forward.
pub fn double_block(l: &TransformerLayout, b: usize, mut emit: impl FnMut(Op)) {
    let (d, f, hd, heads) = (l.dim, l.mlp, l.head_dim, l.heads);
    let txt = Stream {
        first_row: 0,
        rows: l.text,
        // The text rows are never reference rows.
        modulation: Modulation { vector: l.mod_txt, reference: |kv| kv.mod_img },
        q: "add_q_proj",
        k: "add_k_proj",
        v: "add_v_proj",
        out: "to_add_out",
        q_norm: "norm_added_q",
        k_norm: "norm_added_k",
        ff: "ff_context",
    };
    let img = Stream {
        first_row: l.text,
        rows: l.active_image(),
        modulation: Modulation { vector: l.mod_img, reference: |kv| kv.mod_img },
        q: "to_q",
        k: "to_k",
        v: "to_v",
        out: "to_out.0",
        q_norm: "norm_q",
        k_norm: "norm_k",
        ff: "ff",
    };
    let w = |part: &str| name(format_args!("transformer_blocks.{b}.{part}.weight"));
    let attn_w = |part: &str| name(format_args!("transformer_blocks.{b}.attn.{part}.weight"));
    // The feed-forward of rows `first .. first + n` (from the stream's row
    // `base` in the per-token scratch), added into the stream under gate 5.
    let feed_forward = |s: &Stream<'_>, (first, n, base): (u64, u64, u64), emit: &mut dyn FnMut(Op)| {
        emit(linear_swiglu(l.normed.rows_from(first - base), w(&format_str(s.ff, "linear_in")), 0, l.ff_act, n, f, d, l.ff_in));
        project_into_stream(l, l.ff_act.into(), w(&format_str(s.ff, "linear_out")), f, (first, n, base), s.modulation, 5, &mut { emit });
    };
    if l.by_chunks() {
        // Every row's keys and values first, a chunk at a time; then each
        // chunk's queries, attention over every key, and the rest of the block.
        for s in [&txt, &img] {
            for (r0, n) in l.chunks(s.rows) {
                let g = s.first_row + r0;
                modulate(l, (g, n, g), s.modulation, [0, 1], &mut emit);
                let [k, v] = key_value_targets(l, g);
                for (proj, dst) in [(s.k, k), (s.v, v)] {
                    emit(linear(l.normed, attn_w(proj), dst, n, d, d));
                }
                emit(Op::RmsNormHeads { data: k, w: attn_w(s.k_norm), tokens: n, heads, head_dim: hd, eps: l.eps });
                keep_keys_values(l, g, n, &mut emit);
            }
        }
        rope_keys(l, &mut emit);
        kv_copies(l, b as u64, l.k, l.v, &mut emit);
        for s in [&txt, &img] {
            for (r0, n) in l.chunks(s.rows) {
                let g = s.first_row + r0;
                modulate(l, (g, n, g), s.modulation, [0, 1], &mut emit);
                emit(linear(l.normed, attn_w(s.q), l.q, n, d, d));
                emit(Op::RmsNormRope { data: l.q, w: attn_w(s.q_norm), table_row: g, tokens: n, heads, head_dim: hd, eps: l.eps });
                attend(l, [l.q, l.k, l.v, l.attn], g, n, &mut emit);
                project_into_stream(l, l.attn.into(), attn_w(s.out), d, (g, n, g), s.modulation, 2, &mut emit);
                modulate(l, (g, n, g), s.modulation, [3, 4], &mut emit);
                feed_forward(s, (g, n, g), &mut emit);
            }
        }
        return;
    }
    // Both streams' rows are normalised in one pass each time, each under its own modulation.
    modulate_streams(l, &[&txt, &img], [0, 1], &mut emit);
    for s in [&txt, &img] {
        let rows = |span: Span| span.rows_from(s.first_row);
        for (proj, dst) in [(s.q, l.q), (s.k, l.k), (s.v, l.v)] {
            emit(linear(l.normed.rows_from(s.first_row), attn_w(proj), rows(dst), s.rows, d, d));
        }
        // Each stream's rows are rotated by the table rows of their place in the pass.
        for (norm, dst) in [(s.q_norm, l.q), (s.k_norm, l.k)] {
            emit(Op::RmsNormRope { data: rows(dst), w: attn_w(norm), table_row: s.first_row, tokens: s.rows, heads, head_dim: hd, eps: l.eps });
        }
    }
    attention(l, b as u64, [l.q, l.k, l.v, l.attn], &mut emit);
    for s in [&txt, &img] {
        project_into_stream(l, l.attn.rows_from(s.first_row).into(), attn_w(s.out), d, (s.first_row, s.rows, 0), s.modulation, 2, &mut emit);
    }
    modulate_streams(l, &[&txt, &img], [3, 4], &mut emit);
    for s in [&txt, &img] {
        feed_forward(s, (s.first_row, s.rows, 0), &mut emit);
    }
}

fn format_str(a: &str, b: &str) -> heapless::String<64> {
    let mut s = heapless::String::new();
    s.write_fmt(format_args!("{a}.{b}")).expect("short part names");
    s
}

/// Single-stream block `b` over the whole `[text ; image]` stream: one fused
/// projection to q, k, v and the SwiGLU halves, attention, one output
/// projection of `[attention ; mlp]`, one gated residual. By chunks of
/// tokens: every row's keys and values first, then each chunk's queries,
/// attention over every key, MLP half and output projection.
pub fn single_block(l: &TransformerLayout, b: usize, mut emit: impl FnMut(Op)) {
    let (d, f, hd, heads, rows) = (l.dim, l.mlp, l.head_dim, l.heads, l.active_rows());
    let w = |part: &str| name(format_args!("single_transformer_blocks.{b}.attn.{part}.weight"));
    let block = l.kv.map_or(0, |kv| kv.double_blocks) + b as u64;
    let m = Modulation { vector: l.mod_single, reference: |kv| kv.mod_single };
    // Rows `w_row ..` of the fused weight (0: q, D: k, 2D: v, 3D: the MLP halves).
    let part = |x: Operand, w_row: u64, y: Span, n: u64, cols: u64| Op::Linear { x, w: w("to_qkv_mlp_proj"), w_row, bias: None, y, rows: n, cols, inner: d, gate: None };
    if l.by_chunks() {
        for (r0, n) in l.chunks(rows) {
            modulate(l, (r0, n, r0), m, [0, 1], &mut emit);
            let [k, v] = key_value_targets(l, r0);
            emit(part(l.normed, d, k, n, d));
            emit(part(l.normed, 2 * d, v, n, d));
            emit(Op::RmsNormHeads { data: k, w: w("norm_k"), tokens: n, heads, head_dim: hd, eps: l.eps });
            keep_keys_values(l, r0, n, &mut emit);
        }
        rope_keys(l, &mut emit);
        kv_copies(l, block, l.k, l.v, &mut emit);
        for (r0, n) in l.chunks(rows) {
            modulate(l, (r0, n, r0), m, [0, 1], &mut emit);
            emit(part(l.normed, 0, l.q, n, d));
            emit(Op::RmsNormRope { data: l.q, w: w("norm_q"), table_row: r0, tokens: n, heads, head_dim: hd, eps: l.eps });
            attend(l, [l.q, l.k, l.v, l.joined], r0, n, &mut emit);
            emit(linear_swiglu(l.normed, w("to_qkv_mlp_proj"), 3 * d, l.joined.cols_from(d), n, f, d, l.fused));
            project_into_stream(l, l.joined.into(), w("to_out"), d + f, (r0, n, r0), m, 2, &mut emit);
        }
        return;
    }
    modulate(l, (0, rows, 0), m, [0, 1], &mut emit);
    // q, k and v; then the MLP halves' product and SwiGLU into the joined rows.
    emit(part(l.normed, 0, l.fused, rows, 3 * d));
    emit(linear_swiglu(l.normed, w("to_qkv_mlp_proj"), 3 * d, l.joined.cols_from(d), rows, f, d, l.fused.cols_from(3 * d)));
    let (q, k, v) = (l.fused, l.fused.cols_from(d), l.fused.cols_from(2 * d));
    emit(Op::RmsNormRope { data: q, w: w("norm_q"), table_row: 0, tokens: rows, heads, head_dim: hd, eps: l.eps });
    emit(Op::RmsNormRope { data: k, w: w("norm_k"), table_row: 0, tokens: rows, heads, head_dim: hd, eps: l.eps });
    attention(l, block, [q, k, v, l.joined], &mut emit);
    project_into_stream(l, l.joined.into(), w("to_out"), d + f, (0, rows, 0), m, 2, &mut emit);
}

/// Final AdaLN (scale first, then shift) on the noise rows and the output
/// projection; reference rows get no velocity.
pub fn epilogue(l: &TransformerLayout, mut emit: impl FnMut(Op)) {
    // `normed` holds a chunk of rows when the layout is chunked.
    for (r0, n) in l.chunks(l.noise) {
        let row = l.text + r0;
        let normed = if l.by_chunks() { l.normed } else { l.normed.rows_from(row) };
        emit(Op::LayerNormModulate { src: l.stream.rows_from(row), dst: normed, shift: l.chunk(l.mod_out, 1), scale: l.chunk(l.mod_out, 0), later: None, tokens: n, d: l.dim, eps: l.eps });
        emit(linear(normed, name(format_args!("proj_out.weight")), l.velocity.rows_from(r0), n, l.out_channels, l.dim));
    }
}

/// The timestep the model's sinusoid sees for scheduler timestep `t`: the
/// pipeline passes `t / 1000` and the model multiplies by 1000 again, both in f32.
pub fn model_timestep(t: f32) -> f32 {
    (t / 1000.0) * 1000.0
}

/// The `[cos, sin]` timestep sinusoid of `Flux2` for timestep `t` (see [`model_timestep`]),
/// as diffusers computes it in float32: the exponent `−ln(10⁴)·j/half`, the
/// frequency and the angle `t·f` are rounded to f32 step by step as torch
/// rounds them, then the cos/sin of that f32 angle are taken in f64. (The
/// angle's rounding is the table's real error; torch's own float32 `exp` is
/// off by an ulp for a few `j`, which moves those angles by an ulp.)
pub fn timestep_sinusoid(t: f32, out: &mut [f32]) {
    let half = out.len() / 2;
    for j in 0..half {
        let exponent = (-(libm::log(10000.0) as f32) * j as f32) / half as f32;
        let freq = libm::exp(exponent as f64) as f32;
        let angle = (t * freq) as f64;
        out[j] = libm::cos(angle) as f32;
        out[half + j] = libm::sin(angle) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::klein_4b;

    /// Parameters of the 2-D (linear) weights of block 0 under `prefix`.
    fn linear_params(cfg: &TransformerConfig, prefix: &str) -> u64 {
        let mut total = 0;
        crate::models::tensors::transformer(cfg, |s| {
            if s.name.starts_with(prefix) && s.shape.len() == 2 {
                total += (s.shape[0] * s.shape[1]) as u64;
            }
        });
        total
    }

    #[test]
    fn block_flops_are_every_weight_once_per_token_plus_attention() {
        // Each linear weight multiplies every token of its stream once (2 FLOPs a
        // parameter): the double block's image and text streams have equal
        // weights, so together they cost tokens × params; attention adds
        // 4·S²·D (scores and the weighted sum) over the joint sequence.
        let cfg = klein_4b::transformer();
        let (text, image) = (512u64, 4096u64);
        let s = text + image;
        let mut arena = BumpArena::new(u64::MAX / 2);
        let l = TransformerLayout::new(&cfg, text, image, &mut arena).unwrap();
        let mut double = 0;
        double_block(&l, 0, |op| double += op.flops());
        let attention = 4 * s * s * 3072;
        assert_eq!(double, s * linear_params(&cfg, "transformer_blocks.0.") + attention);
        let mut single = 0;
        single_block(&l, 0, |op| single += op.flops());
        assert_eq!(single, 2 * s * linear_params(&cfg, "single_transformer_blocks.0.") + attention);
    }

    #[test]
    fn layout_fits_the_4b_model_at_1024px() {
        let cfg = klein_4b::transformer();
        let mut arena = BumpArena::new(u64::MAX / 2);
        let l = TransformerLayout::new(&cfg, 512, 4096, &mut arena).unwrap();
        assert_eq!(l.fused.stride, 3 * 3072 + 2 * 9216);
        assert_eq!(l.joined.stride, 3072 + 9216);
        assert!(l.velocity.offset * 4 + 4096 * 128 * 4 <= arena.used());
        // Double-block feed-forward scratch shares bytes with single-block projections.
        let (rows, d, f) = (4608u64, 3072u64, 9216u64);
        assert_eq!(l.ff_in.offset, l.fused.offset);
        let single_scratch = rows * (3 * d + 2 * f) * 4 + rows * (d + f) * 4;
        let others = 7 * rows * d * 4 + 4096 * 128 * 4 * 2 + 512 * 7680 * 4;
        let small = arena.used() - single_scratch - others;
        assert!(small < 1 << 20, "beyond the big spans: {small} bytes");
    }

    /// The half-K/V layout: keys and values `D/2` words a row with a scale
    /// per head, projected into chunk scratch and packed a chunk at a time
    /// (each chunk's keys roped before), attention reading them packed; the
    /// same FLOPs as the f32 layout, in fewer bytes; never with a kept cache.
    #[test]
    fn the_half_kv_layout_packs_every_chunk_and_attends_over_the_packed_rows() {
        let cfg = klein_4b::transformer();
        let (text, image, chunk) = (512u64, 4096u64, 1024u64);
        let laid_out = |half_kv: bool, kv_cache: KvMode, references: u64| {
            let mut arena = BumpArena::new(u64::MAX / 2);
            let tokens = Tokens { text, noise: image, references, kv_cache, half_kv, half_operands: false };
            let l = TransformerLayout::chunked(&cfg, tokens, chunk, &mut arena).unwrap();
            (l, arena.high_water())
        };
        let (f32_kv, f32_bytes) = laid_out(false, KvMode::Off, 0);
        let (l, bytes) = laid_out(true, KvMode::Off, 0);
        let rows = text + image;
        assert_eq!((l.k.stride, l.v.stride), (1536, 1536));
        assert_eq!(l.kv_scales.map(|s| s.map(|s| s.stride)), Some([24, 24]));
        // The keys and values take half their f32 bytes, plus a scale a head row.
        assert_eq!(f32_bytes - bytes, 2 * rows * 1536 * 4 - 2 * rows * 24 * 4);
        for block in [true, false] {
            let (mut ops, mut f32_ops) = (Vec::new(), Vec::new());
            let mut flops = [0, 0];
            let program = |l: &TransformerLayout, out: &mut Vec<Op>, flops: &mut u64| {
                let mut emit = |op: Op| {
                    *flops += op.flops();
                    out.push(op)
                };
                if block { double_block(l, 0, &mut emit) } else { single_block(l, 0, &mut emit) }
            };
            program(&l, &mut ops, &mut flops[0]);
            program(&f32_kv, &mut f32_ops, &mut flops[1]);
            assert_eq!(flops[0], flops[1]);
            let packs: Vec<(Span, u64)> = ops.iter().filter_map(|op| if let Op::HalfPack { dst, tokens, .. } = op { Some((*dst, *tokens)) } else { None }).collect();
            // Keys and values of every chunk: the text rows and each image chunk (double blocks), or the joint rows' chunks.
            let chunks = if block { 1 + image.div_ceil(chunk) } else { rows.div_ceil(chunk) };
            assert_eq!(packs.len() as u64, 2 * chunks);
            assert_eq!(packs.iter().map(|p| p.1).sum::<u64>(), 2 * rows);
            assert!(!ops.iter().any(|op| matches!(op, Op::CrossAttention { .. } | Op::Attention { .. })));
            let attends = ops.iter().filter(|op| matches!(op, Op::HalfKvAttention { k, kv_len, .. } if *k == l.k && *kv_len == rows)).count() as u64;
            assert_eq!(attends, chunks);
            // Each chunk's keys roped (at its own table row) before they are packed; none over the whole keys.
            assert!(!ops.iter().any(|op| matches!(op, Op::RopeInterleaved { data, .. } if *data == l.k)));
        }
        // A kept KV cache copies f32 rows: that layout keeps f32 keys and values.
        let (kept, _) = laid_out(true, KvMode::Keep, 256);
        assert!(kept.kv_scales.is_none() && kept.k.stride == 3072);
        let (recomputed, _) = laid_out(true, KvMode::Recompute, 256);
        assert!(recomputed.kv_scales.is_some());
    }

    #[test]
    fn reference_tokens_run_through_every_block_but_get_no_velocity() {
        let cfg = klein_4b::transformer();
        let mut arena = BumpArena::new(u64::MAX / 2);
        let tokens = Tokens { text: 512, noise: 1024, references: 3072, kv_cache: KvMode::Off, half_kv: false, half_operands: false };
        let l = TransformerLayout::chunked(&cfg, tokens, u64::MAX, &mut arena).unwrap();
        assert_eq!((l.image, l.noise), (4096, 1024));
        let mut embedded_rows = 0;
        prologue(&l, |op| {
            if let Op::Linear { rows, cols: 3072, inner: 128, .. } = op {
                embedded_rows = rows;
            }
        });
        assert_eq!(embedded_rows, 4096, "x_embedder reads noise and reference rows");
        let mut attention_len = 0;
        single_block(&l, 0, |op| {
            if let Op::Attention { len, .. } = op {
                attention_len = len;
            }
        });
        assert_eq!(attention_len, 512 + 4096);
        let mut epilogue_rows = Vec::new();
        epilogue(&l, |op| match op {
            Op::LayerNormModulate { tokens, .. } => epilogue_rows.push(tokens),
            Op::Linear { rows, y, .. } => {
                assert_eq!(y, l.velocity);
                epilogue_rows.push(rows)
            }
            _ => {}
        });
        assert_eq!(epilogue_rows, [1024, 1024], "only the noise tokens get a velocity");
        // The velocity holds the noise rows only; it ends the arena.
        assert_eq!(l.velocity.offset * 4 + 1024 * 128 * 4, arena.used());
    }

    /// The KV pipeline's passes over one layout: extracting, the reference
    /// rows attend to themselves and their keys and values go to the cache;
    /// cached, only text and noise rows run, reading the cache back.
    #[test]
    fn the_kv_passes_split_attention_and_share_the_cache() {
        let cfg = klein_4b::transformer();
        let mut arena = BumpArena::new(u64::MAX / 2);
        let tokens = Tokens { text: 512, noise: 1024, references: 256, kv_cache: KvMode::Keep, half_kv: false, half_operands: false };
        let l = TransformerLayout::chunked(&cfg, tokens, u64::MAX, &mut arena).unwrap();
        let kv = l.kv.unwrap();
        assert_eq!((kv.pass, kv.references, kv.double_blocks), (KvPass::Extract, 256, 5));
        let cached = l.with_pass(KvPass::Cached);
        // Single block 2 is cache block 5 + 2; unchunked, its keys and values are columns of the fused projection.
        let (k, v) = (l.fused.cols_from(3072).rows_from(1536), l.fused.cols_from(2 * 3072).rows_from(1536));
        let (slot_k, slot_v) = (kv.slot(7, 0).unwrap(), kv.slot(7, 1).unwrap());
        for (pass, embedded_rows, copies_want, attentions) in [(&l, 1024 + 256, [(k, slot_k), (v, slot_v)], 2), (&cached, 1024, [(slot_k, k), (slot_v, v)], 1)] {
            let mut embedded = 0;
            prologue(pass, |op| {
                if let Op::Linear { rows, cols: 3072, inner: 128, .. } = op {
                    embedded = rows;
                }
            });
            assert_eq!(embedded, embedded_rows);
            let (mut copies, mut attention, mut modulated) = (heapless::Vec::<(Span, Span), 4>::new(), 0, 0);
            single_block(pass, 2, |op| match op {
                Op::Copy { src, dst, rows, cols } => {
                    assert_eq!((rows, cols), (256, 3072));
                    copies.push((src, dst)).unwrap();
                }
                Op::CrossAttention { q_len, kv_len, .. } => {
                    // The references attend to themselves only.
                    assert!([(512 + 1024, 512 + 1024 + 256), (256, 256)].contains(&(q_len, kv_len)), "{q_len} over {kv_len}");
                    attention += 1;
                }
                Op::LayerNormModulate { tokens, .. } => modulated += tokens,
                _ => {}
            });
            assert_eq!(copies.as_slice(), &copies_want);
            assert_eq!(attention, attentions);
            assert_eq!(modulated, pass.active_rows(), "every active row modulated once");
        }
        // Extracting, the reference rows take the modulation of timestep 0.
        // Each pass's rows by the shift they take (a pass's later rows their own).
        let mut shifts = heapless::Vec::<(u64, Span), 8>::new();
        double_block(&l, 0, |op| {
            if let Op::LayerNormModulate { tokens, shift, later, .. } = op {
                let first = later.map_or(tokens, |m| m.row);
                let _ = shifts.push((first, shift));
                if let Some(m) = later {
                    let _ = shifts.push((tokens - m.row, m.shift));
                }
            }
        });
        assert_eq!(&shifts[..3], &[(512, l.chunk(l.mod_txt, 0)), (1024, l.chunk(l.mod_img, 0)), (256, l.chunk(kv.mod_img, 0))]);
        // Recomputing: no cache, every pass extracts, the same ops but the copies.
        let mut arena = BumpArena::new(u64::MAX / 2);
        let r = TransformerLayout::chunked(&cfg, Tokens { kv_cache: KvMode::Recompute, ..tokens }, u64::MAX, &mut arena).unwrap();
        assert_eq!(r.kv.unwrap().cache, None);
        assert_eq!(r.with_pass(KvPass::Cached).kv_pass(), Some(KvPass::Extract));
        let (mut kept, mut recomputed) = (0, 0);
        single_block(&l, 2, |op| kept += !matches!(op, Op::Copy { rows: 256, .. }) as u32);
        single_block(&r, 2, |_| recomputed += 1);
        assert_eq!(kept, recomputed);
    }

    #[test]
    fn double_block_reads_its_own_weights() {
        let cfg = klein_4b::transformer();
        let mut arena = BumpArena::new(u64::MAX / 2);
        let l = TransformerLayout::new(&cfg, 512, 64, &mut arena).unwrap();
        let mut names = heapless::Vec::<crate::models::tensors::TensorName, 32>::new();
        double_block(&l, 3, |op| {
            if let Op::Linear { w, .. } | Op::LinearSwiGlu { w, .. } | Op::RmsNormHeads { w, .. } | Op::RmsNormRope { w, .. } = op {
                names.push(w).unwrap();
            }
        });
        // 8 attention projections, 4 norms, 2 × 2 feed-forward linears.
        assert_eq!(names.len(), 16);
        assert!(names.iter().all(|n| n.starts_with("transformer_blocks.3.")));
        assert!(names.iter().any(|n| n.as_str() == "transformer_blocks.3.ff_context.linear_out.weight"));
    }
}
