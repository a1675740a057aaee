//! The transformer's activation arena: the token counts of a pass
//! ([`Tokens`]), where each tensor sits ([`TransformerLayout`]: whole, or by
//! chunks of tokens, with the half-K/V layout's keys and values), and the
//! klein KV cache's slots ([`KvCache`]).

use crate::arena::{ArenaError, BumpArena};
use crate::config::TransformerConfig;
use crate::ir::{operand_piece, Operand, Span, ALIGN, F32, MIN_PROJECTION_PIECE};

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
    /// half-K/V layout `[text + image, D/2]` words of f16 pairs. No rows where
    /// `qkv` holds the queries, keys and values.
    pub q: Span,
    pub k: Span,
    pub v: Span,
    /// With [`TransformerLayout::piece`] of at least [`MIN_PROJECTION_PIECE`]:
    /// every block's queries, keys and values `[text + image, 3D]` as f16 rows
    /// in pieces, written by their projections' epilogues, normed and roped in
    /// place, and read so by attention.
    pub qkv: Option<Operand>,
    /// The half-K/V layout's range scales of the keys and of the values,
    /// `[text + image, heads]` each.
    pub kv_scales: Option<[Span; 2]>,
    /// The attention output: f32, or with [`TransformerLayout::piece`] f16
    /// rows in pieces (the output projection's operand, written by attention).
    pub attn: Operand,
    /// A projection's output before its gated residual, `[text + image, D]` (`[chunk, D]` by chunks).
    pub proj: Span,
    /// Feed-forward input projection `[min(max(text, image), chunk), 2F]` and
    /// activation `[.., F]` (with [`TransformerLayout::piece`] f16 rows in
    /// pieces, written by the SwiGLU product's epilogue).
    pub ff_in: Span,
    pub ff_act: Operand,
    /// Single block: fused projection `[text + image, 3D + 2F]` and
    /// `[attention ; mlp]` `[.., D + F]`; by chunks, the MLP half of the
    /// projection `[chunk, 2F]` and `[attention ; mlp]` `[chunk, D + F]`
    /// (q, k and v then in the double blocks' spans).
    pub fused: Span,
    pub joined: Operand,
    /// The velocity of the noise tokens, `[noise, out]`.
    pub velocity: Span,
    /// Token rows per pass of every per-token stage: `text + image` (one
    /// pass) unless chunked.
    pub chunk: u64,
    /// The reference KV cache and the pass these programs run, with the KV pipeline.
    pub kv: Option<KvCache>,
    /// With [`Tokens::half_operands`] in a pass laid out whole without the KV
    /// cache: the width of the pieces ([`operand_piece`]) in which attention
    /// and the SwiGLU products write the output projections' inputs as f16
    /// rows ([`Operand::half_pieces`]), each piece under its own range scale.
    pub piece: Option<u64>,
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
    pub(super) fn slot(&self, i: u64, part: u64) -> Option<Span> {
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
        let head_dim = cfg.attention_head_dim as u64;
        let cached = tokens.kv_cache != KvMode::Off && tokens.references > 0;
        let piece = (tokens.half_operands && !by_chunks && !cached).then(|| operand_piece(head_dim, &[dim, mlp])).flatten();
        // An output projection's input: f16 words and a scale a piece, or f32.
        let operand = |arena: &mut BumpArena, r: u64, width: u64| -> Result<Operand, ArenaError> {
            Ok(match piece {
                Some(p) => Operand::half_pieces(take(arena, r, width / 2)?, take(arena, r, width / p)?, p),
                None => Operand::f32(take(arena, r, width)?),
            })
        };
        // The feed-forward scratch of double blocks and the projections of
        // single blocks are never live together: they share bytes.
        let scratch = arena.used();
        let ff_rows = text.max(image).min(chunk);
        let ff_in = take(arena, ff_rows, 2 * mlp)?;
        let ff_act = operand(arena, ff_rows, mlp)?;
        let double_end = arena.used();
        arena.rewind(scratch);
        let (fused, joined) = if by_chunks {
            (take(arena, chunk, 2 * mlp)?, operand(arena, chunk, dim + mlp)?)
        } else {
            (take(arena, rows, 3 * dim + 2 * mlp)?, operand(arena, rows, dim + mlp)?)
        };
        arena.reserve_to(double_end)?;
        let attn = operand(arena, chunk.min(rows), dim)?;
        let qkv_piece = piece.filter(|p| *p >= MIN_PROJECTION_PIECE);
        let qkv = match qkv_piece {
            Some(p) => Some(Operand::half_pieces(take(arena, rows, 3 * dim / 2)?, take(arena, rows, 3 * dim / p)?, p)),
            None => None,
        };
        let mut take = |r: u64, width: u64| take(arena, r, width);
        // By chunks, the per-token scratch holds one chunk; keys, values and the stream stay whole.
        let scratch_rows = chunk.min(rows);
        // Queries, keys and values in `qkv` take no f32 rows.
        let qkv_rows = |r: u64| if qkv.is_some() { 0 } else { r };
        let mut l = Self {
            text,
            image,
            noise,
            dim,
            mlp,
            heads: cfg.num_attention_heads as u64,
            head_dim,
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
                true => Operand::half_rows(take(scratch_rows, dim / 2)?, take(scratch_rows, 1)?),
                false => Operand::f32(take(scratch_rows, dim)?),
            },
            q: take(qkv_rows(scratch_rows), dim)?,
            k: take(qkv_rows(rows), kv_width)?,
            v: take(qkv_rows(rows), kv_width)?,
            qkv,
            kv_scales: None,
            attn,
            proj: take(scratch_rows, dim)?,
            ff_in,
            ff_act,
            fused,
            joined,
            velocity: take(noise, cfg.out_channels as u64)?,
            chunk,
            kv: None,
            piece,
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

    /// Every block's queries, keys and values as attention reads them:
    /// views of `qkv`, or the f32 rows of `q`, `k` and `v`.
    pub fn qkv_operands(&self) -> [Operand; 3] {
        match self.qkv {
            Some(qkv) => [qkv, qkv.cols_from(self.dim), qkv.cols_from(2 * self.dim)],
            None => [self.q, self.k, self.v].map(Operand::f32),
        }
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
    pub(super) fn chunks(&self, rows: u64) -> impl Iterator<Item = (u64, u64)> {
        let chunk = self.chunk;
        (0..rows).step_by(chunk as usize).map(move |r0| (r0, chunk.min(rows - r0)))
    }

    /// Chunk `i` (width D) of a modulation vector, as a broadcast row.
    pub(super) fn chunk(&self, m: Span, i: u64) -> Span {
        Span::new(m.offset + i * self.dim, 0)
    }
}
