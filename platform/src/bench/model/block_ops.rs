//! The first double and single block, op by op: each op of the block's
//! program timed alone, as the step records it (the tier's data path, its
//! epilogues and pieces, the weights laid out as the engine lays them out),
//! so that a block's time can be read as the sum of its parts and the part
//! that bounds it named. On the matrix tier with f16 tiles the products'
//! rows are the half-precision data path's: f16 inputs in memory, W packed
//! into f16 at load, the epilogues writing the next op's operand.

use super::synthetic::block_local;
use super::{Figure, ShapeBench};
use crate::exec::device_weights::DeviceWeights;
use crate::exec::runner::Runner;
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
        let first = self.first_blocks(cfg, tokens)?;
        let mut figures = Vec::new();
        for (what, block) in &first.blocks {
            let placed = first.weights.place(self.gpu, block)?;
            let timed = self.each_op(block, &first.runner, &placed)?;
            for (_, figure) in &timed {
                figures.push(Figure { what: format!("{what}: {}", figure.what), ..figure.clone() });
            }
            let sum = summed(format!("{what}, the sum of its ops timed alone"), first.shape.clone(), timed.iter().map(|(_, f)| f));
            figures.push(sum);
        }
        Ok(figures)
    }

    /// Each op of `ops` that prepares dispatches, timed alone in
    /// `runner`'s arena over `placed` weights, with its kind: named as
    /// [`describe`] names it, its bytes as `bench traffic` counts them
    /// (split as this adapter's bindings split them), its share of the
    /// matrix units' ceiling where a product, an attention or a
    /// convolution runs on them.
    pub(super) fn each_op(&self, ops: &[Op], runner: &Runner, placed: &DeviceWeights) -> Result<Vec<(&'static str, Figure)>, RunError> {
        let gpu = self.gpu;
        let machine = Machine { max_binding: gpu.max_binding(), ..H200 };
        let mut timed = Vec::new();
        for op in ops {
            let d = runner.prepare_block(gpu, placed, 0, std::slice::from_ref(op))?;
            if d.is_empty() {
                continue;
            }
            let figure = Figure {
                what: describe(op),
                shape: shape(op),
                seconds: self.timer.median(&d, self.repeats)?,
                flops: op.flops(),
                bytes: op_traffic(op, gpu.precision(), &machine).bytes,
                matrix: gpu.matrix().is_some() && matches!(kind(op), "linear" | "attention" | "convolution"),
                dispatches: Some(d.len() as u64),
            };
            timed.push((kind(op), figure));
        }
        Ok(timed)
    }
}

/// One figure for `figures` together: their times, FLOPs, bytes and
/// dispatches summed; on matrix units where all of them are.
pub(super) fn summed<'f>(what: String, shape: String, figures: impl Iterator<Item = &'f Figure>) -> Figure {
    let mut sum = Figure { what, shape, seconds: 0.0, flops: 0, bytes: 0, matrix: true, dispatches: Some(0) };
    for f in figures {
        sum.seconds += f.seconds;
        sum.flops += f.flops;
        sum.bytes += f.bytes;
        sum.matrix &= f.matrix;
        sum.dispatches = sum.dispatches.zip(f.dispatches).map(|(a, b)| a + b);
    }
    sum
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
