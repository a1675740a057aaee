//! `Flux2Transformer2DModel` as block programs over one activation arena.
//!
//! The residual stream is one `[text + image, D]` tensor with the text rows
//! first: the double blocks update its two parts with their own weights,
//! joint attention runs over it directly, and the single blocks need no
//! concatenation. Every dimension comes from the config.
//!
//! The image rows are the noise tokens, then the tokens of any reference
//! images: every block runs over both, and only the noise tokens' velocity
//! is computed (diffusers slices the prediction to them).

use crate::arena::{ArenaError, BumpArena};
use crate::config::TransformerConfig;
use crate::ir::{linear, name, Op, Span, ALIGN, F32};
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
}

impl Tokens {
    /// A pass without reference images.
    pub fn plain(text: u64, noise: u64) -> Self {
        Self { text, noise, references: 0 }
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
    /// The residual stream `[text + image, D]` and its normalised copy.
    pub stream: Span,
    pub normed: Span,
    /// Double-block attention tensors, `[text + image, D]` each.
    pub q: Span,
    pub k: Span,
    pub v: Span,
    pub attn: Span,
    /// A projection's output before its gated residual, `[text + image, D]`.
    pub proj: Span,
    /// Feed-forward input projection `[min(max(text, image), chunk), 2F]` and activation `[.., F]`.
    pub ff_in: Span,
    pub ff_act: Span,
    /// Single block: fused projection `[text + image, 3D + 2F]` and
    /// `[attention ; mlp]` `[.., D + F]`; chunked, the MLP half of the
    /// projection `[chunk, 2F]` and `[attention ; mlp]` `[chunk, D + F]`.
    pub fused: Span,
    pub joined: Span,
    /// The velocity of the noise tokens, `[noise, out]`.
    pub velocity: Span,
    /// Token rows per pass of the feed-forward and single-block MLP
    /// projections: `text + image` (one pass) unless chunked.
    pub chunk: u64,
}


impl TransformerLayout {
    /// Lays out every activation of one forward pass without reference images in `arena`.
    pub fn new(cfg: &TransformerConfig, text: u64, image: u64, arena: &mut BumpArena) -> Result<Self, ArenaError> {
        Self::chunked(cfg, Tokens::plain(text, image), text + image, arena)
    }

    /// Lays out one forward pass whose feed-forward and single-block MLP
    /// projections run over at most `chunk` token rows at a time, so their
    /// scratch holds `chunk` rows, not all. A `chunk` of `text + image` or
    /// more is the unchunked layout; chunked, a single block projects q, k
    /// and v into the double blocks' spans and its MLP half chunk by chunk.
    pub fn chunked(cfg: &TransformerConfig, tokens: Tokens, chunk: u64, arena: &mut BumpArena) -> Result<Self, ArenaError> {
        let (text, image, noise) = (tokens.text, tokens.image(), tokens.noise);
        let dim = cfg.inner_dim() as u64;
        let mlp = cfg.mlp_hidden_dim() as u64;
        let rows = text + image;
        let chunk = chunk.clamp(1, rows.max(1));
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
        let (fused, joined) = if chunk < rows {
            (take(arena, chunk, 2 * mlp)?, take(arena, chunk, dim + mlp)?)
        } else {
            (take(arena, rows, 3 * dim + 2 * mlp)?, take(arena, rows, dim + mlp)?)
        };
        arena.reserve_to(double_end)?;
        let mut take = |r: u64, width: u64| take(arena, r, width);
        Ok(Self {
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
            normed: take(rows, dim)?,
            q: take(rows, dim)?,
            k: take(rows, dim)?,
            v: take(rows, dim)?,
            attn: take(rows, dim)?,
            proj: take(rows, dim)?,
            ff_in,
            ff_act,
            fused,
            joined,
            velocity: take(noise, cfg.out_channels as u64)?,
            chunk,
        })
    }

    fn rows(&self) -> u64 {
        self.text + self.image
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

/// Timestep MLP, the shared modulations, and the two input embedders.
pub fn prologue(l: &TransformerLayout, mut emit: impl FnMut(Op)) {
    let d = l.dim;
    let one = |s: Span| Span::new(s.offset, 0);
    emit(linear(l.sinusoid, name(format_args!("time_guidance_embed.timestep_embedder.linear_1.weight")), l.t_hidden, 1, d, l.sinusoid_dim));
    emit(Op::Silu { src: l.t_hidden, dst: l.t_act, rows: 1, cols: d });
    emit(linear(l.t_act, name(format_args!("time_guidance_embed.timestep_embedder.linear_2.weight")), l.temb, 1, d, d));
    emit(Op::Silu { src: l.temb, dst: l.temb_silu, rows: 1, cols: d });
    emit(linear(one(l.temb_silu), name(format_args!("double_stream_modulation_img.linear.weight")), l.mod_img, 1, 6 * d, d));
    emit(linear(one(l.temb_silu), name(format_args!("double_stream_modulation_txt.linear.weight")), l.mod_txt, 1, 6 * d, d));
    emit(linear(one(l.temb_silu), name(format_args!("single_stream_modulation.linear.weight")), l.mod_single, 1, 3 * d, d));
    emit(linear(one(l.temb_silu), name(format_args!("norm_out.linear.weight")), l.mod_out, 1, 2 * d, d));
    emit(linear(l.prompt, name(format_args!("context_embedder.weight")), l.stream, l.text, d, l.joint_dim));
    emit(linear(l.latents, name(format_args!("x_embedder.weight")), l.stream.rows_from(l.text), l.image, d, l.in_channels));
}

/// One stream (text or image) of a double block: which rows, which weights.
struct Stream<'a> {
    first_row: u64,
    rows: u64,
    modulation: Span,
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
        modulation: l.mod_txt,
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
        rows: l.image,
        modulation: l.mod_img,
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
    for s in [&txt, &img] {
        let rows = |span: Span| span.rows_from(s.first_row);
        emit(Op::LayerNormModulate {
            src: rows(l.stream),
            dst: rows(l.normed),
            shift: l.chunk(s.modulation, 0),
            scale: l.chunk(s.modulation, 1),
            tokens: s.rows,
            d,
            eps: l.eps,
        });
        for (proj, dst) in [(s.q, l.q), (s.k, l.k), (s.v, l.v)] {
            emit(linear(rows(l.normed), attn_w(proj), rows(dst), s.rows, d, d));
        }
        for (norm, dst) in [(s.q_norm, l.q), (s.k_norm, l.k)] {
            emit(Op::RmsNormHeads { data: rows(dst), w: attn_w(norm), tokens: s.rows, heads, head_dim: hd, eps: l.eps });
        }
    }
    for data in [l.q, l.k] {
        emit(Op::RopeInterleaved { data, table_row: 0, tokens: l.rows(), heads, head_dim: hd });
    }
    emit(Op::Attention { q: l.q, k: l.k, v: l.v, o: l.attn, len: l.rows(), heads, head_dim: hd });
    for s in [&txt, &img] {
        let rows = |span: Span| span.rows_from(s.first_row);
        emit(linear(rows(l.attn), attn_w(s.out), rows(l.proj), s.rows, d, d));
        emit(Op::GatedResidual { dst: rows(l.stream), gate: l.chunk(s.modulation, 2), y: rows(l.proj), rows: s.rows, cols: d });
        emit(Op::LayerNormModulate {
            src: rows(l.stream),
            dst: rows(l.normed),
            shift: l.chunk(s.modulation, 3),
            scale: l.chunk(s.modulation, 4),
            tokens: s.rows,
            d,
            eps: l.eps,
        });
        for (r0, n) in l.chunks(s.rows) {
            emit(linear(rows(l.normed).rows_from(r0), w(&format_str(s.ff, "linear_in")), l.ff_in, n, 2 * f, d));
            emit(Op::SwiGlu { gate: l.ff_in, up: l.ff_in.cols_from(f), dst: l.ff_act, rows: n, cols: f });
            emit(linear(l.ff_act, w(&format_str(s.ff, "linear_out")), rows(l.proj).rows_from(r0), n, d, f));
        }
        emit(Op::GatedResidual { dst: rows(l.stream), gate: l.chunk(s.modulation, 5), y: rows(l.proj), rows: s.rows, cols: d });
    }
}

fn format_str(a: &str, b: &str) -> heapless::String<64> {
    let mut s = heapless::String::new();
    s.write_fmt(format_args!("{a}.{b}")).expect("short part names");
    s
}

/// Single-stream block `b` over the whole `[text ; image]` stream: one fused
/// projection to q, k, v and the SwiGLU halves, attention, one output
/// projection of `[attention ; mlp]`, one gated residual.
pub fn single_block(l: &TransformerLayout, b: usize, mut emit: impl FnMut(Op)) {
    let (d, f, hd, heads, rows) = (l.dim, l.mlp, l.head_dim, l.heads, l.rows());
    let w = |part: &str| name(format_args!("single_transformer_blocks.{b}.attn.{part}.weight"));
    emit(Op::LayerNormModulate {
        src: l.stream,
        dst: l.normed,
        shift: l.chunk(l.mod_single, 0),
        scale: l.chunk(l.mod_single, 1),
        tokens: rows,
        d,
        eps: l.eps,
    });
    let chunked = l.chunk < rows;
    let (q, k, v) = if chunked {
        // q, k and v (rows 0, D, 2D of the fused weight) for every token, the MLP half later by chunks.
        for (i, dst) in [l.q, l.k, l.v].into_iter().enumerate() {
            let w_row = i as u64 * d;
            emit(Op::Linear { x: l.normed, w: w("to_qkv_mlp_proj"), w_row, bias: None, y: dst, rows, cols: d, inner: d });
        }
        (l.q, l.k, l.v)
    } else {
        emit(linear(l.normed, w("to_qkv_mlp_proj"), l.fused, rows, 3 * d + 2 * f, d));
        (l.fused, l.fused.cols_from(d), l.fused.cols_from(2 * d))
    };
    emit(Op::RmsNormHeads { data: q, w: w("norm_q"), tokens: rows, heads, head_dim: hd, eps: l.eps });
    emit(Op::RmsNormHeads { data: k, w: w("norm_k"), tokens: rows, heads, head_dim: hd, eps: l.eps });
    for data in [q, k] {
        emit(Op::RopeInterleaved { data, table_row: 0, tokens: rows, heads, head_dim: hd });
    }
    if chunked {
        emit(Op::Attention { q, k, v, o: l.attn, len: rows, heads, head_dim: hd });
        for (r0, n) in l.chunks(rows) {
            let mlp = Op::Linear { x: l.normed.rows_from(r0), w: w("to_qkv_mlp_proj"), w_row: 3 * d, bias: None, y: l.fused, rows: n, cols: 2 * f, inner: d };
            emit(mlp);
            emit(Op::SwiGlu { gate: l.fused, up: l.fused.cols_from(f), dst: l.joined.cols_from(d), rows: n, cols: f });
            emit(Op::Copy { src: l.attn.rows_from(r0), dst: l.joined, rows: n, cols: d });
            emit(linear(l.joined, w("to_out"), l.proj.rows_from(r0), n, d, d + f));
        }
    } else {
        emit(Op::Attention { q, k, v, o: l.joined, len: rows, heads, head_dim: hd });
        emit(Op::SwiGlu { gate: l.fused.cols_from(3 * d), up: l.fused.cols_from(3 * d + f), dst: l.joined.cols_from(d), rows, cols: f });
        emit(linear(l.joined, w("to_out"), l.proj, rows, d, d + f));
    }
    emit(Op::GatedResidual { dst: l.stream, gate: l.chunk(l.mod_single, 2), y: l.proj, rows, cols: d });
}

/// Final AdaLN (scale first, then shift) on the noise rows and the output
/// projection; reference rows get no velocity.
pub fn epilogue(l: &TransformerLayout, mut emit: impl FnMut(Op)) {
    let noise = |s: Span| s.rows_from(l.text);
    emit(Op::LayerNormModulate {
        src: noise(l.stream),
        dst: noise(l.normed),
        shift: l.chunk(l.mod_out, 1),
        scale: l.chunk(l.mod_out, 0),
        tokens: l.noise,
        d: l.dim,
        eps: l.eps,
    });
    emit(linear(noise(l.normed), name(format_args!("proj_out.weight")), l.velocity, l.noise, l.out_channels, l.dim));
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

    #[test]
    fn reference_tokens_run_through_every_block_but_get_no_velocity() {
        let cfg = klein_4b::transformer();
        let mut arena = BumpArena::new(u64::MAX / 2);
        let tokens = Tokens { text: 512, noise: 1024, references: 3072 };
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

    #[test]
    fn double_block_reads_its_own_weights() {
        let cfg = klein_4b::transformer();
        let mut arena = BumpArena::new(u64::MAX / 2);
        let l = TransformerLayout::new(&cfg, 512, 64, &mut arena).unwrap();
        let mut names = heapless::Vec::<crate::models::tensors::TensorName, 32>::new();
        double_block(&l, 3, |op| {
            if let Op::Linear { w, .. } | Op::RmsNormHeads { w, .. } = op {
                names.push(w).unwrap();
            }
        });
        // 8 attention projections, 4 norms, 2 × 2 feed-forward linears.
        assert_eq!(names.len(), 16);
        assert!(names.iter().all(|n| n.starts_with("transformer_blocks.3.")));
        assert!(names.iter().any(|n| n.as_str() == "transformer_blocks.3.ff_context.linear_out.weight"));
    }
}
