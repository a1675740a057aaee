//! What a program moves through memory, how many dispatches it takes and
//! the shortest time a machine's ceilings allow for it, per precision tier,
//! from core's programs alone: no device is opened (`flux-lite bench traffic`).
//!
//! Each op is lowered as the runner and the kernels' launchers lower it
//! today: a linear on the matrix tier measures its input's range scales in
//! a pass of its own before its product, a convolution measures its runs'
//! scales before each piece of pixels, the element-wise ops over contiguous
//! values run as rows of 65,536 and a tail; linears and convolutions split
//! where one binding of the machine cannot hold an operand, or where the
//! range scales' buffer cannot hold a piece's scales. `bench kernels` prints
//! the dispatches it really prepared beside its rows, and a test holds the
//! two equal (docs/performance.md, "What a step moves").
//!
//! Bytes are each dispatch's compulsory traffic: every tensor it reads or
//! writes counted once, at the width the tier stores it in. What a dispatch
//! reads again from its caches (a tile staged once per column block, a key
//! read by every block of queries) is not counted: that is the kernel's
//! efficiency, which only a GPU measures; this figure moves with the widths
//! the data path stores and the passes it makes.

use crate::components::transformer::programs;
use crate::pipeline::job::generation_passes;
use crate::error::RunError;
use flux_lite_core::arena::BumpArena;
use flux_lite_core::config::{Qwen3Config, TransformerConfig, VaeConfig};
use flux_lite_core::ir::{level_words, Op};
use flux_lite_core::models::transformer::Tokens;
use flux_lite_core::models::vae;
use flux_lite_kernels::Precision;
mod machine;
mod products;
pub use machine::{Machine, Traffic, H200};
use machine::{is_matrix, operand_rows, pieces, rows_per_piece, DataPath, Rows, CONTIGUOUS_ROW};
use products::{attention, attention_on_products, chunked_attention, conv, conv_nhwc, linear, norms_heads, pass_on, swiglu_fits, writes_pieces, AttentionIo, Out};

/// The traffic of one program step on `tier` on machine `m`.
pub fn op_traffic(op: &Op, tier: Precision, m: &Machine) -> Traffic {
    let p = DataPath::of(tier);
    let (a, wb) = (p.activation, p.weight);
    let pass = |bytes: u64, flops: u64, matrix: bool| pass_on(m, bytes, flops, matrix);
    // An op over `rows` rows split as its operands' windows require, each
    // piece of `r` rows moving `bytes(r)`.
    let by_rows = |rows: u64, operands: &[Rows], bytes: &dyn Fn(u64) -> u64| -> Traffic {
        pieces(rows, rows_per_piece(m, rows, operands, 1)).map(|r| pass(bytes(r), 0, false)).sum()
    };
    match *op {
        Op::Linear { x, y, rows, cols, inner, ref bias, gate, .. } => {
            let out = if gate.is_some() { Out::Gated } else { Out::Set };
            linear(m, p, (x, y.into()), [rows, cols, inner], bias.is_some(), out)
        }
        Op::LinearSwiGlu { x, y, rows, cols, inner, scratch, .. } => match swiglu_fits(m, p, cols, inner) && (!y.is_half() || writes_pieces(m, y.piece, true)) {
            true => linear(m, p, (x, y), [rows, cols, inner], false, Out::SwiGlu),
            // As the runner falls back: both products into the scratch, then
            // the SwiGLU (into the scratch and packed, for f16 pieces).
            false => {
                let dst = if y.is_half() { scratch } else { y.data };
                let swiglu = Op::SwiGlu { gate: scratch, up: scratch.cols_from(cols), dst: dst.into(), rows, cols };
                let pack = y.scales.zip(y.piece).map(|(scales, piece)| Op::HalfPack { src: scratch, dst: y.data, scales, tokens: rows, heads: cols / piece, head_dim: piece });
                let packed = pack.map_or(Traffic::default(), |op| op_traffic(&op, tier, m));
                linear(m, p, (x, scratch.into()), [rows, 2 * cols, inner], false, Out::Set) + op_traffic(&swiglu, tier, m) + packed
            }
        },
        Op::Attention { len, heads, head_dim, q, o, .. } => {
            attention(m, p, [len, len, heads, heads, head_dim], AttentionIo { o_pieces: o.piece, qkv_pieces: q.piece, ..AttentionIo::default() })
        }
        Op::LinearHalf { x, y, rows, cols, inner, scratch, ref head_norm, .. } => {
            if let Some(n) = head_norm.as_ref().filter(|n| norms_heads(m, y.piece, n.head_dim)) {
                return linear(m, p, (x, y), [rows, cols, inner], false, Out::HeadNormed(n.head_dim));
            }
            let product = match writes_pieces(m, y.piece, false) {
                true => linear(m, p, (x, y), [rows, cols, inner], false, Out::Set),
                // As the runner falls back: the product into the scratch, then packed.
                false => {
                    let piece = y.piece.unwrap_or(cols);
                    let pack = Op::HalfPack { src: scratch, dst: y.data, scales: y.scales.unwrap_or(y.data), tokens: rows, heads: cols / piece, head_dim: piece };
                    linear(m, p, (x, scratch.into()), [rows, cols, inner], false, Out::Set) + op_traffic(&pack, tier, m)
                }
            };
            // The norms the epilogue leaves, as passes.
            product + program_traffic(&head_norm.iter().flat_map(|n| n.passes(y, rows)).collect::<Vec<_>>(), tier, m)
        }
        Op::CrossAttention { q_len, kv_len, heads, head_dim, .. } => attention(m, p, [q_len, kv_len, heads, heads, head_dim], AttentionIo::default()),
        Op::CarriedAttention { q_len, kv_len, heads, head_dim, carry, .. } => {
            attention(m, p, [q_len, kv_len, heads, heads, head_dim], AttentionIo { wide: true, carried: carry.is_some(), ..AttentionIo::default() })
        }
        Op::ChunkedAttention { q_len, kv_len, head_dim, carry, .. } => {
            let carried = carry.map_or([false; 2], |c| [c.from_state, c.keep_state]);
            chunked_attention(m, p, [q_len, kv_len, head_dim], carried)
        }
        Op::HalfKvAttention { q_len, kv_len, heads, head_dim, .. } => {
            attention(m, p, [q_len, kv_len, heads, heads, head_dim], AttentionIo { half_kv: true, ..AttentionIo::default() })
        }
        Op::CausalAttention { len, q_heads, kv_heads, head_dim, q, o, .. } => {
            attention(m, p, [len, len, q_heads, kv_heads, head_dim], AttentionIo { mask: true, o_pieces: o.piece, qkv_pieces: q.piece, ..AttentionIo::default() })
        }
        Op::RmsNormHeads { data, tokens, heads, head_dim, .. } => {
            let w = heads * head_dim;
            by_rows(tokens, &[Rows::of(data, w, a)], &|r| 2 * r * w * a + head_dim * wb)
        }
        Op::RmsNorm { src, dst, tokens, d, .. } => {
            by_rows(tokens, &[Rows::of(src, d, a), operand_rows(&dst, d, p)], &|r| r * d * a + r * p.row_bytes(&dst, d) + d * wb)
        }
        Op::LayerNormModulate { src, dst, later, tokens, d, .. } => {
            // Rows in and out, and one or two shift and scale rows.
            let modulations = 1 + later.is_some() as u64;
            by_rows(tokens, &[Rows::of(src, d, a), operand_rows(&dst, d, p)], &|r| r * d * a + r * p.row_bytes(&dst, d) + modulations * 2 * d * a)
        }
        Op::RmsNormRope { data, tokens, heads, head_dim, .. } => {
            // Data in place (f32, or f16 with its scales), the norm's weight, a cos and a sin table row per token.
            let w = heads * head_dim;
            by_rows(tokens, &[operand_rows(&data, w, p), Rows::packed(head_dim, 4)], &|r| 2 * r * p.row_bytes(&data, w) + head_dim * wb + 2 * r * head_dim * 4)
        }
        Op::RopeInterleaved { data, tokens, heads, head_dim, .. } | Op::RopeRotateHalf { data, tokens, heads, head_dim, .. } => {
            // Data in place; a cos and a sin table row (f32) per token.
            let w = heads * head_dim;
            by_rows(tokens, &[Rows::of(data, w, a), Rows::packed(head_dim, 4)], &|r| 2 * r * w * a + 2 * r * head_dim * 4)
        }
        Op::HalfPack { src, dst, scales, tokens, heads, head_dim } => {
            let w = heads * head_dim;
            by_rows(tokens, &[Rows::of(src, w, a), Rows::of(dst, w / 2, 4), Rows::of(scales, heads, 4)], &|r| r * w * a + r * w * 2 + r * heads * 4)
        }
        Op::SwiGlu { gate, up, dst, rows, cols } => {
            by_rows(rows, &[Rows::of(gate, cols, a), Rows::of(up, cols, a), operand_rows(&dst, cols, p)], &|r| 2 * r * cols * a + r * p.row_bytes(&dst, cols))
        }
        Op::GatedResidual { dst, y, rows, cols, .. } => {
            by_rows(rows, &[Rows::of(y, cols, a), Rows::of(dst, cols, a)], &|r| 3 * r * cols * a + cols * a)
        }
        Op::Residual { dst, y, rows, cols } => by_rows(rows, &[Rows::of(y, cols, a), Rows::of(dst, cols, a)], &|r| 3 * r * cols * a),
        Op::Add { a: x, b, dst, rows, cols, .. } => {
            by_rows(rows, &[Rows::of(x, cols, a), Rows::of(b, cols, a), Rows::of(dst, cols, a)], &|r| 3 * r * cols * a)
        }
        Op::Silu { src, dst, rows, cols } | Op::Copy { src, dst, rows, cols } => {
            by_rows(rows, &[Rows::of(src, cols, a), Rows::of(dst, cols, a)], &|r| 2 * r * cols * a)
        }
        Op::Relu { count, .. } | Op::TanhClamp { count, .. } | Op::ScaleShift { count, .. } => {
            let (rows, tail) = (count / CONTIGUOUS_ROW, count % CONTIGUOUS_ROW);
            let row = Rows::packed(CONTIGUOUS_ROW, a);
            let full = if rows > 0 { by_rows(rows, &[row], &|r| 2 * r * CONTIGUOUS_ROW * a) } else { Traffic::default() };
            let last = if tail > 0 { pass(2 * tail * a, 0, false) } else { Traffic::default() };
            full + last
        }
        Op::Transpose { rows, cols, .. } => pass(2 * rows * cols * a, 0, false),
        Op::Conv2d { shape: s, residual, .. } => conv(m, p, s, residual),
        Op::ConvNhwc { x, y, shape: s, residual, ref norm, .. } => {
            // A norm read with the input: its statistics, gamma and beta, once a call.
            let norm_bytes = norm.as_ref().map_or(0, |n| 2 * n.groups * 4 + 2 * s.in_channels as u64 * wb);
            conv_nhwc(m, p, s, [x, y], residual, norm_bytes)
        }
        Op::GroupMoments { src, shape: g, .. } => pass(g.pixels * p.row_bytes(&src, g.channels) + 2 * g.groups * g.rows() * 4, 0, false),
        Op::GroupMerge { of, .. } => pass(2 * of.groups * of.rows * 4 + 2 * of.groups * 4, 0, false),
        Op::GroupNormApply { src, shape: g, dst, .. } if dst.is_half() => {
            // The rows (f32, or f16 in pieces) into f16 (words and a scale a pixel), in pieces of pixels.
            let (channels, half_row) = (g.channels, g.channels * 2 + 4);
            let src_row = p.row_bytes(&src, channels);
            by_rows(g.pixels, &[Rows::packed(channels, 4), Rows::packed(channels / 2, 4)], &|r| r * src_row + r * half_row + 2 * channels * wb + 2 * g.groups * 4)
        }
        Op::GroupNormApply { shape: g, .. } => pass(2 * g.channels * g.pixels * a + 2 * g.groups * 4 + 2 * g.channels * wb, 0, false),
        Op::UpsampleNearest2x { channels, height, width, .. } => {
            let plane = height * width;
            by_rows(channels, &[Rows::packed(plane, a), Rows::packed(4 * plane, a)], &|r| 5 * r * plane * a)
        }
        Op::DenormUnpatchify { channels, height, width, .. } => {
            let values = 4 * channels * height * width;
            pass(2 * values * a + 2 * 4 * channels * wb, 0, false)
        }
        Op::PixelLevels { count, .. } => pass(count * a + 4 * level_words(count), 0, false),
    }
}

/// A program's traffic.
pub fn program_traffic<'o>(ops: impl IntoIterator<Item = &'o Op>, tier: Precision, m: &Machine) -> Traffic {
    ops.into_iter().map(|op| op_traffic(op, tier, m)).sum()
}

/// [`op_traffic`] with the transformer's attention over every row and the
/// text encoder's causal one into f16 pieces as products on the GEMM core,
/// as the matrix tier runs them where the flash kernel's check of their
/// path failed.
fn op_traffic_on_products(op: &Op, tier: Precision, m: &Machine) -> Traffic {
    let piece = |x: flux_lite_core::ir::Operand| x.piece.filter(|_| x.is_half()).unwrap_or(0);
    match *op {
        Op::Attention { len, heads, head_dim, q, o, .. } if is_matrix(tier) && o.is_half() => attention_on_products(m, DataPath::of(tier), [len, heads, heads, head_dim], [piece(q), piece(o)]),
        Op::CausalAttention { len, q_heads, kv_heads, head_dim, q, o, .. } if is_matrix(tier) && o.is_half() => {
            attention_on_products(m, DataPath::of(tier), [len, q_heads, kv_heads, head_dim], [piece(q), piece(o)])
        }
        _ => op_traffic(op, tier, m),
    }
}

/// `ops` with their attention on products ([`op_traffic_on_products`]), on
/// the matrix tier: the whole, and its attention.
fn on_products<'o>(ops: impl IntoIterator<Item = &'o Op>, tier: Precision, m: &Machine) -> Option<[Traffic; 2]> {
    is_matrix(tier).then(|| {
        let [mut whole, mut attention] = [Traffic::default(); 2];
        for op in ops {
            let t = op_traffic_on_products(op, tier, m);
            whole += t;
            if matches!(op, Op::Attention { .. } | Op::CausalAttention { .. }) {
                attention += t;
            }
        }
        [whole, attention]
    })
}

/// The most dispatches a klein double block may take at 1024² on any tier
/// (held by `every_tiers_klein_4b_blocks_keep_their_dispatch_budgets`).
pub const DOUBLE_BLOCK_DISPATCHES: u64 = 24;
/// The same for a single block.
pub const SINGLE_BLOCK_DISPATCHES: u64 = 10;

/// One denoising pass of the transformer at a `width × height` image with
/// `text` prompt tokens: the whole pass, its first double and first single
/// block, and the pass's traffic by kind of op.
#[derive(Debug, Clone, PartialEq)]
pub struct StepTraffic {
    pub image_tokens: u64,
    pub step: Traffic,
    pub double_block: Option<Traffic>,
    pub single_block: Option<Traffic>,
    /// `(kind, traffic)` in the order kinds first appear.
    pub by_kind: Vec<(&'static str, Traffic)>,
    /// The pass with its attention as products on the GEMM core (the
    /// matrix tier where the flash kernel's check fails), and that
    /// attention's part of it.
    pub on_products: Option<[Traffic; 2]>,
}

/// The transformer pass over `text` prompt tokens and the image tokens of a
/// `width × height` image (one per `cell`² pixels), laid out whole, as the
/// plan lays it where the machine's bindings hold the fused projection's
/// rows, else by the chunks `bench kernels` takes.
pub fn step(cfg: &TransformerConfig, [width, height]: [u64; 2], cell: u64, text: u64, tier: Precision, m: &Machine) -> Result<StepTraffic, RunError> {
    let image = (width / cell) * (height / cell);
    let tokens = text + image;
    let fused = 3 * cfg.inner_dim() as u64 + 2 * cfg.mlp_hidden_dim() as u64;
    let chunk = (4 * tokens * fused > m.max_binding).then_some(super::model::KEY_CHUNK_ROWS.min(tokens as usize / 2).max(1));
    let tokens = Tokens { half_operands: is_matrix(tier), ..Tokens::plain(text, image) };
    let (_, blocks, _) = programs(cfg, tokens, chunk)?;
    let block = |index: usize, present: bool| present.then(|| program_traffic(&blocks[index], tier, m));
    Ok(StepTraffic {
        on_products: on_products(blocks.iter().flatten(), tier, m),
        image_tokens: image,
        step: program_traffic(blocks.iter().flatten(), tier, m),
        double_block: block(1, cfg.num_layers > 0),
        single_block: block(1 + cfg.num_layers, cfg.num_single_layers > 0),
        by_kind: by_kind(blocks.iter().flatten(), tier, m),
    })
}

/// The traffic of `ops` by [`kind`], kinds in the order they first appear.
fn by_kind<'o>(ops: impl IntoIterator<Item = &'o Op>, tier: Precision, m: &Machine) -> Vec<(&'static str, Traffic)> {
    let mut sums: Vec<(&'static str, Traffic)> = Vec::new();
    for op in ops {
        let t = op_traffic(op, tier, m);
        match sums.iter_mut().find(|(k, _)| *k == kind(op)) {
            Some((_, sum)) => *sum += t,
            None => sums.push((kind(op), t)),
        }
    }
    sums
}

/// A whole program's traffic ([`text_encoder`], [`vae_decode`],
/// [`vae_encode`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramTraffic {
    pub total: Traffic,
    /// `(kind, traffic)` in the order kinds first appear.
    pub by_kind: Vec<(&'static str, Traffic)>,
    /// Whether the machine's bindings hold its largest activation (else
    /// `gen` runs the VAE by bands, whose copies are not counted).
    pub whole: bool,
}

impl ProgramTraffic {
    fn of<'o>(program: impl IntoIterator<Item = &'o Op> + Clone, tier: Precision, m: &Machine, largest_binding: u64) -> Self {
        Self { total: program_traffic(program.clone(), tier, m), by_kind: by_kind(program, tier, m), whole: largest_binding <= m.max_binding }
    }
}

/// The text encoder over `tokens` prompt tokens, up to its deepest picked
/// layer, as `gen` runs it on `tier` (the matrix tier's half-precision data
/// path included), by kind of op; and on the matrix tier the same with its
/// attention as products on the GEMM core (where the flash kernel's check
/// fails): the whole and its attention.
pub fn text_encoder(cfg: &Qwen3Config, tokens: u64, tier: Precision, m: &Machine) -> Result<(ProgramTraffic, Option<[Traffic; 2]>), RunError> {
    let (_, blocks, _) = crate::components::text_encoder::programs(cfg, tokens as usize, cfg.output_layers(), is_matrix(tier))?;
    Ok((ProgramTraffic::of(blocks.iter().flatten(), tier, m, 0), on_products(blocks.iter().flatten(), tier, m)))
}

/// A whole generation from its phases' traffic: the prompts' encodes, the
/// transformer passes of `steps` steps and the VAE decode.
pub fn end_to_end(encode: &Traffic, step: &Traffic, steps: u64, guided: bool, decode: &Traffic) -> Traffic {
    let p = generation_passes(steps, guided);
    let times = |t: &Traffic, n: u64| (0..n).map(|_| *t).sum::<Traffic>();
    times(encode, p.encodes) + times(step, p.transformer) + *decode
}

/// The VAE decode of a `width × height` image laid out whole (to its 8-bit
/// levels, as `gen` runs it), by kind of op, and whether the machine's
/// bindings hold its largest activation.
pub fn vae_decode(cfg: &VaeConfig, [width, height]: [u64; 2], tier: Precision, m: &Machine) -> Result<ProgramTraffic, RunError> {
    let scale = cfg.scale_factor() as u64;
    let (latent_h, latent_w) = (height / scale, width / scale);
    let mut arena = BumpArena::new(u64::MAX);
    let channels_last = is_matrix(tier);
    let layout = vae::VaeLayout::new(cfg, latent_h, latent_w, channels_last, &mut arena).map_err(|e| RunError::layout("VAE")(&e))?;
    let program = crate::exec::runner::collect_ops(|emit| flux_lite_core::models::vae_nhwc::decode_whole(&layout, channels_last, emit));
    Ok(ProgramTraffic::of(&program, tier, m, vae::largest_binding(cfg, latent_h * latent_w, channels_last)))
}

/// The VAE encode of a `width × height` image (an init image or a
/// reference) laid out whole, to its posterior's moments, as [`vae_decode`].
pub fn vae_encode(cfg: &VaeConfig, [width, height]: [u64; 2], tier: Precision, m: &Machine) -> Result<ProgramTraffic, RunError> {
    use flux_lite_core::models::{vae_encoder, vae_encoder_nhwc};
    let channels_last = is_matrix(tier);
    let layout = vae_encoder::VaeEncoderLayout::new(cfg, height, width, channels_last, &mut BumpArena::new(u64::MAX)).map_err(|e| RunError::layout("VAE encoder")(&e))?;
    let program = crate::exec::runner::collect_ops(|emit| vae_encoder_nhwc::encode_whole(&layout, emit));
    Ok(ProgramTraffic::of(&program, tier, m, vae_encoder::largest_binding(cfg, height, width, channels_last)))
}

/// A tiny preview decoder of TAEF2's shape for the VAE `cfg` decoding a
/// `width × height` image from packed latents to its 8-bit levels, laid out
/// whole, as `--preview-decoder` runs it after a step (channels-last on the
/// matrix tier), by kind of op.
pub fn preview_decode(cfg: &VaeConfig, [width, height]: [u64; 2], tier: Precision, m: &Machine) -> Result<ProgramTraffic, RunError> {
    let channels_last = is_matrix(tier);
    let tiny = super::TinyDecode::taef2(cfg, [width, height], channels_last)?;
    let scale = cfg.scale_factor() as u64;
    Ok(ProgramTraffic::of(&tiny.program, tier, m, tiny.shape.largest_binding((height / scale) * (width / scale), channels_last)))
}

/// The kind of an op, as the traffic table names it.
pub fn kind(op: &Op) -> &'static str {
    match op {
        Op::Linear { .. } | Op::LinearSwiGlu { .. } | Op::LinearHalf { .. } => "linear",
        Op::Attention { .. } | Op::CrossAttention { .. } | Op::CarriedAttention { .. } | Op::ChunkedAttention { .. } | Op::HalfKvAttention { .. } | Op::CausalAttention { .. } => "attention",
        Op::RmsNormHeads { .. } | Op::RmsNorm { .. } => "RMS norm",
        Op::RmsNormRope { .. } => "RMS norm + RoPE",
        Op::LayerNormModulate { .. } => "layer norm + modulation",
        Op::RopeInterleaved { .. } | Op::RopeRotateHalf { .. } => "RoPE",
        Op::HalfPack { .. } => "half pack",
        Op::SwiGlu { .. } => "SwiGLU",
        Op::GatedResidual { .. } | Op::Residual { .. } => "residual",
        Op::Conv2d { .. } | Op::ConvNhwc { .. } => "convolution",
        Op::GroupMoments { .. } | Op::GroupMerge { .. } | Op::GroupNormApply { .. } => "group norm",
        Op::UpsampleNearest2x { .. } => "upsampling",
        Op::Transpose { .. } => "transpose",
        _ => "element-wise",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::job::GenerationPasses;
    use flux_lite_core::ir::{Operand, Span};
    use flux_lite_core::config::klein_4b;

    #[test]
    fn a_linear_on_the_matrix_tier_measures_its_input_first() {
        let x = Operand::f32(Span::new(0, 64));
        let y = Span::new(0, 32).into();
        let f32 = linear(&H200, DataPath::of(Precision::F32), (x, y), [10, 32, 64], false, Out::Set);
        let matrix = linear(&H200, DataPath::of(Precision::Matrix), (x, y), [10, 32, 64], false, Out::Set);
        assert_eq!((f32.dispatches, matrix.dispatches), (1, 2));
        // x, W and y once; the matrix tier reads x again to measure it and writes and reads the scales.
        assert_eq!(f32.bytes, 10 * 64 * 4 + 32 * 64 * 2 + 10 * 32 * 4);
        assert_eq!(matrix.bytes, f32.bytes + 10 * 64 * 4 + 10 * 4 + (10 + 32) * 4);
        assert_eq!(matrix.flops, 2 * 10 * 32 * 64);
    }

    #[test]
    fn a_linear_over_half_rows_reads_them_and_their_scales_without_measuring() {
        let x = Operand::half_rows(Span::new(0, 32), Span::new(1000, 1));
        let t = linear(&H200, DataPath::of(Precision::Matrix), (x, Span::new(0, 32).into()), [10, 32, 64], false, Out::Set);
        assert_eq!(t.dispatches, 1);
        // x in f16, W, x's and W's scales, y.
        assert_eq!(t.bytes, 10 * 64 * 2 + 32 * 64 * 2 + (10 + 32) * 4 + 10 * 32 * 4);
    }

    #[test]
    fn a_linear_splits_where_one_binding_cannot_hold_its_weight() {
        // 1 MiB bindings: 2048 rows of 256 bf16 weights less the alignment's
        // worth, so 2047, rounded down to 1920 (whole 128-column blocks).
        let m = Machine { max_binding: 1 << 20, ..H200 };
        let t = linear(&m, DataPath::of(Precision::F32), (Span::new(0, 256).into(), Span::new(0, 4096).into()), [8, 4096, 256], false, Out::Set);
        assert_eq!(t.dispatches, 3, "4096 columns in pieces of 1920");
    }

    #[test]
    fn a_swiglu_product_reads_both_halves_of_w_and_writes_its_outputs_once() {
        let op = Op::LinearSwiGlu { x: Span::new(0, 64).into(), w: "w".try_into().unwrap(), w_row: 0, y: Span::new(0, 32).into(), rows: 10, cols: 32, inner: 64, scratch: Span::new(0, 64) };
        let t = op_traffic(&op, Precision::F32, &H200);
        assert_eq!(t.dispatches, 1);
        assert_eq!(t.bytes, 10 * 64 * 4 + 2 * 32 * 64 * 2 + 10 * 32 * 4);
        assert_eq!(t.flops, 2 * 10 * 64 * 64);
        // Where one binding cannot hold W's gate and up rows: both products, then the SwiGLU.
        let small = Machine { max_binding: 6 << 10, ..H200 };
        let apart = op_traffic(&op, Precision::F32, &small);
        assert_eq!(apart.dispatches, 3, "two pieces of W's 64 rows, then the SwiGLU");
        assert_eq!(apart.flops, t.flops);
    }

    #[test]
    fn a_projection_norms_its_heads_in_its_epilogue_where_a_block_holds_them_else_in_passes() {
        use flux_lite_core::ir::HeadNorm;
        // The single block's fused projection of 2 heads of 128 a kind: queries, keys, values.
        let y = Operand::half_pieces(Span::new(0, 384), Span::new(100_000, 12), 64);
        let norm = HeadNorm { first: "norm_q".try_into().unwrap(), second: "norm_k".try_into().unwrap(), first_cols: 256, cols: 512, head_dim: 128, eps: 1e-6, table_row: 0 };
        let x = Operand::half_rows(Span::new(0, 128), Span::new(1000, 1));
        let op = |head_norm| Op::LinearHalf { x, w: "w".try_into().unwrap(), w_row: 0, y, rows: 10, cols: 768, inner: 256, scratch: Span::new(0, 768), head_norm };
        let plain = op_traffic(&op(None), Precision::Matrix, &H200);
        let fused = op_traffic(&op(Some(norm.clone())), Precision::Matrix, &H200);
        assert_eq!((plain.dispatches, fused.dispatches), (1, 1));
        // The two weights' heads (bf16) and a cos and a sin row of 128 f32 a row.
        assert_eq!(fused.bytes, plain.bytes + 2 * 128 * 2 + 2 * 10 * 128 * 4);
        // Blocks of 64 outputs (8×8 tiles) hold half a head: the two norms run as passes.
        let lavapipe = Machine { product_block: 64, ..H200 };
        let apart = op_traffic(&op(Some(norm.clone())), Precision::Matrix, &lavapipe);
        let passes: Traffic = norm.passes(y, 10).map(|p| op_traffic(&p, Precision::Matrix, &lavapipe)).sum();
        assert_eq!(passes.dispatches, 2);
        assert_eq!(apart, op_traffic(&op(None), Precision::Matrix, &lavapipe) + passes);
    }

    #[test]
    fn a_guided_generation_encodes_the_negative_prompt_too_and_runs_two_passes_a_step() {
        assert_eq!(generation_passes(4, false), GenerationPasses { encodes: 1, transformer: 4 });
        assert_eq!(generation_passes(50, true), GenerationPasses { encodes: 2, transformer: 100 });
        let t = |dispatches: u64| Traffic { dispatches, bytes: 10 * dispatches, flops: 0, seconds: dispatches as f64, filled: 2.0 * dispatches as f64 };
        let e2e = end_to_end(&t(3), &t(5), 4, true, &t(7));
        assert_eq!((e2e.dispatches, e2e.bytes, e2e.seconds, e2e.filled), (2 * 3 + 8 * 5 + 7, 10 * (2 * 3 + 8 * 5 + 7), 53.0, 106.0));
    }

    /// A product on the matrix units in fewer workgroups than the machine
    /// holds at once computes at their share of the ceiling; in more, in
    /// whole waves; its bytes bound it as before; and a pass not on the
    /// matrix units takes its roofline as it is.
    #[test]
    fn a_products_workgroups_run_in_whole_waves_of_the_machines_slots() {
        let m = H200;
        let flops = 1_000_000_000_000;
        let at_ceiling = flops as f64 / m.matrix_flops;
        let filled = |workgroups: u64| products::product_on(&m, 0, flops, true, workgroups).filled / at_ceiling;
        assert_eq!([filled(264), filled(528)], [1.0, 1.0]);
        assert!((filled(36) - 264.0 / 36.0).abs() < 1e-9 && (filled(265) - 528.0 / 265.0).abs() < 1e-9);
        let bound_by_bytes = products::product_on(&m, 64_000_000_000, flops, true, 36);
        assert_eq!(bound_by_bytes.filled, (64e9 / m.bytes_per_second).max(at_ceiling * 264.0 / 36.0));
        let fma = products::product_on(&m, 0, flops, false, 36);
        assert_eq!(fma.filled, fma.seconds);
    }

    #[test]
    fn klein_4b_text_encoder_runs_27_layers_and_its_half_path_moves_less() {
        use flux_lite_core::config::klein_4b;
        let [f32, matrix] = [Precision::F32, Precision::Matrix].map(|tier| text_encoder(&klein_4b::text_encoder(), 512, tier, &H200).unwrap().0);
        // 27 layers of 7 products; on f32 the norms and the RoPE a pass each
        // for the queries and for the keys, on the matrix tier one each.
        let count = |t: &ProgramTraffic, kind: &str| t.by_kind.iter().find(|(k, _)| *k == kind).map_or(0, |(_, t)| t.dispatches);
        assert_eq!([count(&f32, "linear"), count(&matrix, "linear")], [27 * 7; 2]);
        assert_eq!([count(&f32, "RoPE"), count(&matrix, "RMS norm + RoPE")], [27 * 2; 2]);
        assert!(matrix.total.bytes < f32.total.bytes && matrix.total.flops == f32.total.flops);
    }

    #[test]
    fn every_tiers_klein_4b_blocks_keep_their_dispatch_budgets() {
        for tier in [Precision::F32, Precision::F16, Precision::Matrix] {
            let s = step(&klein_4b::transformer(), [1024, 1024], 16, 512, tier, &H200).unwrap();
            let (double, single) = (s.double_block.unwrap().dispatches, s.single_block.unwrap().dispatches);
            assert!(double <= DOUBLE_BLOCK_DISPATCHES, "{}: double block {double} dispatches", tier.name());
            assert!(single <= SINGLE_BLOCK_DISPATCHES, "{}: single block {single} dispatches", tier.name());
        }
    }

    #[test]
    fn klein_4b_step_at_1024_has_its_published_token_count_and_every_block_op() {
        let s = step(&klein_4b::transformer(), [1024, 1024], 16, 512, Precision::Matrix, &H200).unwrap();
        assert_eq!(s.image_tokens, 4096);
        let linears: u64 = s.by_kind.iter().filter(|(k, _)| *k == "linear").map(|(_, t)| t.dispatches).sum();
        assert!(linears > 0 && s.by_kind.iter().map(|(_, t)| t.dispatches).sum::<u64>() == s.step.dispatches);
        assert!(s.step.seconds > 0.0 && s.step.flops > 0);
    }
}
