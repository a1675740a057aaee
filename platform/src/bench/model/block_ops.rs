//! The first double and single block, op by op: each op of the block's
//! program timed alone, as the step records it (the tier's data path, its
//! epilogues and pieces, the weights laid out as the engine lays them out),
//! so that a block's time can be read as the sum of its parts and the part
//! that bounds it named. On the matrix tier with f16 tiles the products'
//! rows are the half-precision data path's: f16 inputs in memory, W packed
//! into f16 at load, the epilogues writing the next op's operand.

use super::synthetic::block_local;
use super::{Figure, ShapeBench};
use crate::bench::traffic::{kind, op_traffic, Machine, H200};
use crate::error::RunError;
use flux_lite_core::config::TransformerConfig;
use flux_lite_core::ir::Op;

impl ShapeBench<'_> {
    /// Every op of the first double and the first single block over
    /// `tokens` tokens (laid out as [`ShapeBench::blocks`] lays them out),
    /// each timed alone, then each block's sum: one figure an op, in the
    /// program's order, and one a block.
    pub fn block_ops(&self, cfg: &TransformerConfig, tokens: u64) -> Result<Vec<Figure>, RunError> {
        let gpu = self.gpu;
        let first = self.first_blocks(cfg, tokens)?;
        // Bytes as `bench traffic` counts them, split as this adapter's bindings split them.
        let machine = Machine { max_binding: gpu.max_binding(), ..H200 };
        let mut figures = Vec::new();
        for (what, block) in &first.blocks {
            let placed = first.weights.place(gpu, block)?;
            let mut sum = Figure {
                what: format!("{what}, the sum of its ops timed alone"),
                shape: first.shape.clone(),
                seconds: 0.0,
                flops: 0,
                bytes: 0,
                matrix: false,
                dispatches: Some(0),
            };
            for op in block {
                let d = first.runner.prepare_block(gpu, &placed, 0, std::slice::from_ref(op))?;
                if d.is_empty() {
                    continue;
                }
                let traffic = op_traffic(op, gpu.precision(), &machine);
                let figure = Figure {
                    what: format!("{what}: {}", describe(op)),
                    shape: shape(op),
                    seconds: self.timer.median(&d, self.repeats)?,
                    flops: op.flops(),
                    bytes: traffic.bytes,
                    matrix: gpu.matrix().is_some() && matches!(kind(op), "linear" | "attention"),
                    dispatches: Some(d.len() as u64),
                };
                sum.seconds += figure.seconds;
                sum.flops += figure.flops;
                sum.bytes += figure.bytes;
                sum.dispatches = sum.dispatches.zip(figure.dispatches).map(|(a, b)| a + b);
                figures.push(figure);
            }
            figures.push(sum);
        }
        Ok(figures)
    }
}

/// The op's kind and, where it reads a weight, that weight's name inside
/// its block; a product says what its input and output are on this path.
fn describe(op: &Op) -> String {
    let weight = op.weights().next().map(|w| format!(" {}", block_local(w.as_ref()).trim_end_matches(".weight"))).unwrap_or_default();
    let path = match op {
        Op::Linear { x, gate, .. } => format!(" ({} in, {})", operand(x.is_half(), x.piece), if gate.is_some() { "gated onto the f32 stream" } else { "f32 out" }),
        Op::LinearHalf { x, y, head_norm, .. } => {
            format!(" ({} in, {} out{})", operand(x.is_half(), x.piece), operand(true, y.piece), if head_norm.is_some() { ", heads normed" } else { "" })
        }
        Op::LinearSwiGlu { x, y, .. } => format!(" ({} in, SwiGLU {} out)", operand(x.is_half(), x.piece), operand(y.is_half(), y.piece)),
        Op::Attention { q, o, .. } => format!(" ({} in, {} out)", operand(q.is_half(), q.piece), operand(o.is_half(), o.piece)),
        _ => String::new(),
    };
    format!("{}{weight}{path}", kind(op))
}

/// How an operand is stored: f32, or f16 under a range scale a row or a piece.
fn operand(half: bool, piece: Option<u64>) -> String {
    match (half, piece) {
        (false, _) => "f32".into(),
        (true, None) => "f16 rows".into(),
        (true, Some(p)) => format!("f16 pieces of {p}"),
    }
}

/// A product's `[rows, inner]·[inner, cols]`, attention's tokens and heads.
fn shape(op: &Op) -> String {
    match *op {
        Op::Linear { rows, cols, inner, .. } | Op::LinearHalf { rows, cols, inner, .. } => format!("{rows}×{inner} · {inner}×{cols}"),
        Op::LinearSwiGlu { rows, cols, inner, .. } => format!("{rows}×{inner} · {inner}×{}", 2 * cols),
        Op::Attention { len, heads, head_dim, .. } => format!("{len} tokens, {heads}×{head_dim}"),
        _ => String::new(),
    }
}
