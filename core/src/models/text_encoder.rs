//! The Qwen3 text encoder as block programs over one activation arena.
//!
//! FLUX.2-klein reads `hidden_states[k]` of Qwen3 for three layers `k`
//! (`hidden_states[0]` is the embedding output, `hidden_states[k]` the raw
//! output of decoder layer `k − 1`, and only `hidden_states[L]` has the final
//! norm applied) and concatenates them along features, slot-major. The
//! program copies each picked state into its slot of `embeds` as soon as it
//! exists and runs no layer past the last pick.
//!
//! On the matrix tier's half-precision data path (`half_operands`) the ops
//! that feed a product write its input as f16 rows under range scales
//! ([`Operand`]): the two RMSNorms (a scale a row), the SwiGLU (a scale a
//! piece), and, where the heads split into pieces a product's block writes
//! whole, the query, key and value projections (normed and rotated in
//! place as f16) and attention. The residual stream and the picked hidden
//! states stay f32.

use crate::arena::{ArenaError, BumpArena};
use crate::config::Qwen3Config;
use crate::ir::{linear, name, operand_piece, Gate, Op, Operand, RopeStyle, Span, ALIGN, F32, MIN_PROJECTION_PIECE};
use crate::models::tensors::TensorName;

/// Where each activation lives (element offsets into the f32 arena) for a
/// prompt of `tokens` tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct TextEncoderLayout {
    pub tokens: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub intermediate: u64,
    pub eps: f32,
    /// The `hidden_states` indices that make the embedding, in slot order.
    pub picks: [usize; 3],
    /// Total decoder layers in the model (`hidden_states[layers]` is normalised).
    pub layers: usize,
    /// The residual stream `[tokens, hidden]`; the host writes the embedding rows here.
    pub stream: Span,
    /// The RMSNorm's output: f32, or on the half path f16 rows under a scale a row.
    pub normed: Operand,
    /// The queries, keys and values: f32, or on the half path (heads in
    /// pieces of at least [`MIN_PROJECTION_PIECE`]) f16 rows in pieces.
    pub q: Operand,
    pub k: Operand,
    pub v: Operand,
    /// Where a projection into f16 pieces puts its f32 product first when
    /// its epilogue cannot take it (weights in GGML blocks): the gate's rows.
    pub qkv_scratch: Span,
    /// The attention output: f32, or on the half path f16 rows in pieces of a head.
    pub attn: Operand,
    /// A projection's output before it is added to the stream.
    pub proj: Span,
    pub gate: Span,
    pub up: Span,
    /// The SwiGLU's output: f32, or on the half path f16 rows in pieces.
    pub act: Operand,
    /// The prompt embedding `[tokens, 3·hidden]`, feature = slot·hidden + d.
    pub embeds: Span,
    /// One broadcast row of `hidden` ones the host writes: the gate under
    /// which the output and down projections add onto the stream in their
    /// epilogue (`y += 1·(x·Wᵀ)`, rounded once: the bits of the add after them).
    pub ones: Span,
}


#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PickError {
    /// A picked `hidden_states` index is beyond the model's layers.
    OutOfRange { pick: usize, layers: usize },
    Arena(ArenaError),
}

impl core::fmt::Display for PickError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PickError::OutOfRange { pick, layers } => {
                write!(f, "hidden_states[{pick}] was asked for, but the text encoder has {layers} layers")
            }
            PickError::Arena(e) => write!(f, "{e}"),
        }
    }
}

impl From<ArenaError> for PickError {
    fn from(e: ArenaError) -> Self {
        PickError::Arena(e)
    }
}

impl TextEncoderLayout {
    /// Lays out one forward pass over `tokens` tokens that yields
    /// `hidden_states[k]` for each k in `picks`, on the half-precision data
    /// path where `half_operands`.
    pub fn new(cfg: &Qwen3Config, tokens: u64, picks: [usize; 3], half_operands: bool, arena: &mut BumpArena) -> Result<Self, PickError> {
        let layers = cfg.num_hidden_layers;
        if let Some(&pick) = picks.iter().find(|&&p| p > layers) {
            return Err(PickError::OutOfRange { pick, layers });
        }
        let hidden = cfg.hidden_size as u64;
        let head_dim = cfg.head_dim as u64;
        let q_dim = cfg.num_attention_heads as u64 * head_dim;
        let kv_dim = cfg.num_key_value_heads as u64 * head_dim;
        let inter = cfg.intermediate_size as u64;
        let mut take = |width: u64| -> Result<Span, ArenaError> {
            let s = arena.alloc(tokens * width * F32, ALIGN)?;
            Ok(Span::new(s.offset / F32, width))
        };
        // The half path's widths of pieces: attention's output a head's
        // (whole vec4s), the projections' only where a block writes them
        // whole, the SwiGLU's a divisor of its width.
        let attn_piece = operand_piece(head_dim, &[q_dim]).filter(|_| half_operands);
        let qkv_piece = attn_piece.filter(|p| *p >= MIN_PROJECTION_PIECE);
        let act_piece = operand_piece(inter, &[inter]).filter(|_| half_operands);
        let mut operand = |width: u64, piece: Option<u64>| -> Result<Operand, ArenaError> {
            Ok(match piece {
                Some(p) => Operand::half_pieces(take(width / 2)?, take(width / p)?, p),
                None => Operand::f32(take(width)?),
            })
        };
        let stream = operand(hidden, None)?.data;
        let normed = match half_operands && hidden.is_multiple_of(2) {
            true => {
                let words = operand(hidden / 2, None)?.data;
                Operand::half_rows(words, operand(1, None)?.data)
            }
            false => operand(hidden, None)?,
        };
        let (q, k, v) = (operand(q_dim, qkv_piece)?, operand(kv_dim, qkv_piece)?, operand(kv_dim, qkv_piece)?);
        let attn = operand(q_dim, attn_piece)?;
        let proj = operand(hidden, None)?.data;
        let gate = operand(inter, None)?.data;
        let up = operand(inter, None)?.data;
        let act = operand(inter, act_piece)?;
        // The gate's rows hold a projection's product where they are as wide; else its own.
        let qkv_scratch = match (qkv_piece, inter >= q_dim) {
            (Some(_), false) => operand(q_dim, None)?.data,
            _ => gate,
        };
        let embeds = operand(3 * hidden, None)?.data;
        let ones = Span::new(arena.alloc(hidden * F32, ALIGN)?.offset / F32, 0);
        Ok(Self {
            tokens,
            hidden,
            heads: cfg.num_attention_heads as u64,
            kv_heads: cfg.num_key_value_heads as u64,
            head_dim,
            intermediate: inter,
            eps: cfg.rms_norm_eps as f32,
            picks,
            layers,
            stream,
            normed,
            q,
            k,
            v,
            qkv_scratch,
            attn,
            proj,
            gate,
            up,
            act,
            embeds,
            ones,
        })
    }

    /// Decoder layers that must run: up to the deepest pick.
    pub fn layers_to_run(&self) -> usize {
        self.picks.iter().copied().max().unwrap_or(0).min(self.layers)
    }

    /// Slot `i` of the embedding, as a strided view.
    fn slot(&self, i: usize) -> Span {
        self.embeds.cols_from(i as u64 * self.hidden)
    }

    /// Stores `hidden_states[state]` (now in the stream) into every slot that picks it.
    fn store_picks(&self, state: usize, mut emit: impl FnMut(Op)) {
        for (i, _) in self.picks.iter().enumerate().filter(|(_, &p)| p == state) {
            let (rows, cols) = (self.tokens, self.hidden);
            if state == self.layers {
                let w = name(format_args!("model.norm.weight"));
                emit(Op::RmsNorm { src: self.stream, dst: self.slot(i).into(), w, tokens: rows, d: cols, eps: self.eps });
            } else {
                emit(Op::Copy { src: self.stream, dst: self.slot(i), rows, cols });
            }
        }
    }
}

/// Picks that read the embedding output itself (`hidden_states[0]`).
pub fn prologue(l: &TextEncoderLayout, emit: impl FnMut(Op)) {
    l.store_picks(0, emit);
}

/// Decoder layer `i` (0-based): pre-norm attention with per-head q/k RMSNorm
/// before rotate-half RoPE, causal grouped-query attention over the padding
/// mask, then the pre-norm SwiGLU MLP; each adds to the stream. Stores the
/// layer's output if it is picked.
pub fn layer(l: &TextEncoderLayout, i: usize, mut emit: impl FnMut(Op)) {
    let (t, h, hd, inter) = (l.tokens, l.hidden, l.head_dim, l.intermediate);
    let (q_dim, kv_dim) = (l.heads * hd, l.kv_heads * hd);
    let w = |part: &str| name(format_args!("model.layers.{i}.{part}.weight"));
    emit(Op::RmsNorm { src: l.stream, dst: l.normed, w: w("input_layernorm"), tokens: t, d: h, eps: l.eps });
    if l.q.is_half() {
        // Projected into f16 pieces, then normed and rotated in place, a pass each.
        for (part, y, cols) in [("self_attn.q_proj", l.q, q_dim), ("self_attn.k_proj", l.k, kv_dim), ("self_attn.v_proj", l.v, kv_dim)] {
            emit(Op::LinearHalf { x: l.normed, w: w(part), w_row: 0, y, rows: t, cols, inner: h, scratch: l.qkv_scratch, head_norm: None });
        }
        for (part, data, heads) in [("self_attn.q_norm", l.q, l.heads), ("self_attn.k_norm", l.k, l.kv_heads)] {
            emit(Op::RmsNormRope { data, w: w(part), table_row: 0, tokens: t, heads, head_dim: hd, eps: l.eps, pairs: RopeStyle::RotateHalf });
        }
    } else {
        let (q, k, v) = (l.q.f32_rows(), l.k.f32_rows(), l.v.f32_rows());
        emit(linear(l.normed, w("self_attn.q_proj"), q, t, q_dim, h));
        emit(linear(l.normed, w("self_attn.k_proj"), k, t, kv_dim, h));
        emit(linear(l.normed, w("self_attn.v_proj"), v, t, kv_dim, h));
        emit(Op::RmsNormHeads { data: q, w: w("self_attn.q_norm"), tokens: t, heads: l.heads, head_dim: hd, eps: l.eps });
        emit(Op::RmsNormHeads { data: k, w: w("self_attn.k_norm"), tokens: t, heads: l.kv_heads, head_dim: hd, eps: l.eps });
        emit(Op::RopeRotateHalf { data: q, table_row: 0, tokens: t, heads: l.heads, head_dim: hd });
        emit(Op::RopeRotateHalf { data: k, table_row: 0, tokens: t, heads: l.kv_heads, head_dim: hd });
    }
    emit(Op::CausalAttention { q: l.q, k: l.k, v: l.v, o: l.attn, len: t, q_heads: l.heads, kv_heads: l.kv_heads, head_dim: hd });
    emit(onto_stream(l, l.attn, w("self_attn.o_proj"), q_dim));
    emit(Op::RmsNorm { src: l.stream, dst: l.normed, w: w("post_attention_layernorm"), tokens: t, d: h, eps: l.eps });
    emit(linear(l.normed, w("mlp.gate_proj"), l.gate, t, inter, h));
    emit(linear(l.normed, w("mlp.up_proj"), l.up, t, inter, h));
    emit(Op::SwiGlu { gate: l.gate, up: l.up, dst: l.act, rows: t, cols: inter });
    emit(onto_stream(l, l.act, w("mlp.down_proj"), inter));
    l.store_picks(i + 1, emit);
}

/// `stream += x·Wᵀ`: a projection added onto the residual stream in its
/// epilogue, under the gate of ones (through `proj` where the epilogue
/// cannot take it).
fn onto_stream(l: &TextEncoderLayout, x: Operand, w: TensorName, inner: u64) -> Op {
    let gate = Some(Gate { vector: l.ones, scratch: l.proj });
    Op::Linear { x, w, w_row: 0, bias: None, y: l.stream, rows: l.tokens, cols: l.hidden, inner, gate }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::klein_4b;

    fn layout(picks: [usize; 3]) -> Result<TextEncoderLayout, PickError> {
        let mut arena = BumpArena::new(u64::MAX / 2);
        TextEncoderLayout::new(&klein_4b::text_encoder(), 512, picks, false, &mut arena)
    }

    #[test]
    fn klein_stops_after_layer_27_and_stacks_three_slots() {
        let cfg = klein_4b::text_encoder();
        let l = layout(cfg.output_layers()).unwrap();
        assert_eq!(l.layers_to_run(), 27);
        assert_eq!(l.embeds.stride, 3 * 2560);
        let mut copies = heapless::Vec::<Span, 4>::new();
        for i in 0..l.layers_to_run() {
            layer(&l, i, |op| {
                if let Op::Copy { dst, .. } = op {
                    copies.push(dst).unwrap();
                }
            });
        }
        // After layers 9, 18 and 27 (1-based), in slot order.
        let offsets: heapless::Vec<u64, 4> = copies.iter().map(|s| s.offset - l.embeds.offset).collect();
        assert_eq!(offsets.as_slice(), &[0, 2560, 5120]);
    }

    #[test]
    fn the_last_hidden_state_is_normalised_and_the_first_is_the_embedding() {
        let l = layout([0, 18, 36]).unwrap();
        let mut first = heapless::Vec::<Op, 2>::new();
        prologue(&l, |op| first.push(op).unwrap());
        assert!(matches!(first.as_slice(), [Op::Copy { .. }]));
        let mut last = None;
        layer(&l, 35, |op| last = Some(op));
        assert!(matches!(last, Some(Op::RmsNorm { w, .. }) if w.as_str() == "model.norm.weight"));
    }

    #[test]
    fn the_half_path_keeps_qwen3_4b_products_inputs_in_f16_pieces_of_64() {
        let cfg = klein_4b::text_encoder();
        let (mut f32_arena, mut half_arena) = (BumpArena::new(u64::MAX / 2), BumpArena::new(u64::MAX / 2));
        TextEncoderLayout::new(&cfg, 512, cfg.output_layers(), false, &mut f32_arena).unwrap();
        let l = TextEncoderLayout::new(&cfg, 512, cfg.output_layers(), true, &mut half_arena).unwrap();
        assert!(l.normed.is_half() && l.normed.piece.is_none());
        for operand in [l.q, l.k, l.v, l.attn, l.act] {
            assert_eq!((operand.is_half(), operand.piece), (true, Some(64)));
        }
        // The projections' fallback product lands in the gate's rows (9728 ≥ 4096).
        assert_eq!(l.qkv_scratch, l.gate);
        // 43,833 of 54,784 f32 a token (the stream, gate, up and embedding
        // stay f32), and the row of ones.
        let ones = 4 * 2560;
        assert_eq!(f32_arena.high_water() - ones, 512 * 4 * 54_784);
        assert!(half_arena.high_water() - ones <= 512 * 4 * 43_833 + 16 * 256, "{}", half_arena.high_water());
    }

    #[test]
    fn a_pick_past_the_last_layer_is_refused() {
        assert_eq!(layout([9, 18, 37]), Err(PickError::OutOfRange { pick: 37, layers: 36 }));
    }
}
