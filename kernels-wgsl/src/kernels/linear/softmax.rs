//! An attention's scores going out of their product as probabilities
//! (`matrix_gemm.wgsl`'s `tile_softmax_out`): `Q·Kᵀ` on the matrix tier
//! writes, in place of f32 scores, each score's probability in f16 pieces
//! of [`PROBABILITY_PIECE`] keys, each piece under the exponent of its own
//! largest score, with the piece's sum. A pass over the pieces' exponents
//! and sums alone (`attention_chunks.wgsl`'s `chunk_combine`) then brings
//! each row under one maximum, and `P·V` reads the probabilities as they
//! lie. The scores never reach memory as f32.

use super::{product, Gemm, Input, Out, MATRIX_BLOCK_TILES};
use crate::device::Gpu;
use crate::dispatch::Sink;
use crate::error::GpuError;
use crate::precision::MatrixOperands;
use crate::view::{HalfMat, Mat, Weight};
use flux_lite_core::ir::ATTENTION_PROBABILITY_PIECE;

/// Keys in a piece of probabilities ([`linear_softmax`]).
pub const PROBABILITY_PIECE: u64 = ATTENTION_PROBABILITY_PIECE;

/// Which scores of a [`linear_softmax`] count, and their scale: score
/// `(r, c)` is query `q_first + r`'s of key `k_first + c`; with `causal` a
/// query sees only keys up to its own, with `keep` only keys whose u32
/// there is not 0. Each score is multiplied by `scale` (1/√d).
#[derive(Debug, Clone, Copy, Default)]
pub struct Scores<'a> {
    pub scale: f32,
    pub causal: bool,
    pub keep: Option<&'a wgpu::Buffer>,
    pub q_first: u64,
    pub k_first: u64,
}

/// Where a [`linear_softmax`] writes: the probabilities as f16 pairs
/// (`words`, a row's ⌈n/2⌉ words, an odd `n`'s last pair padded with a
/// zero), and for each row's pieces their exponents (`exponents`) and sums
/// (`sums`), one f32 a piece.
#[derive(Debug, Clone, Copy)]
pub struct Probabilities<'a> {
    pub words: Mat<'a>,
    pub exponents: Mat<'a>,
    pub sums: Mat<'a>,
}

/// `x·Wᵀ` (queries · keys, both f16 under their range scales) as
/// probabilities: each score `s` that counts ([`Scores`]) has the base-2
/// exponent `t = s·scale·log₂e`; each piece of a row has the exponent `e =
/// ⌈max t⌉ − 14` (−∞ where none counts) and its values are `2^(t − e)`
/// rounded to f16 (the largest in (2¹³, 2¹⁴], as the range rule brings
/// values; 0 where the score does not count), its sum the exact sum of
/// those f16 values rounded once to f32: a value times `2^e` is
/// `exp(s·scale)`, rounded. On the matrix tier with f16
/// operands, where a block's outputs (8 tiles) are one or two pieces.
pub fn linear_softmax(gpu: &Gpu, sink: &mut dyn Sink, x: Input<'_>, w: Weight<'_>, y: Probabilities<'_>, scores: Scores<'_>, s: Gemm) -> Result<(), GpuError> {
    let block = gpu.matrix().filter(|c| c.operands == MatrixOperands::F16).map(|c| c.size as u64 * MATRIX_BLOCK_TILES);
    if !block.is_some_and(|b| b.is_multiple_of(PROBABILITY_PIECE) && b / PROBABILITY_PIECE <= 2) || !matches!(x, Input::Half(_)) {
        return Err(GpuError::UnsupportedShape(format!(
            "scores as probabilities need the matrix tier's f16 operands over f16 queries, a block of one or two pieces of {PROBABILITY_PIECE} ({block:?})"
        )));
    }
    product(gpu, sink, x, w, None, y.words, s, None, Out::Softmax { exponents: y.exponents, sums: y.sums, scores })
}

impl<'a> Probabilities<'a> {
    /// The same from row `row` on.
    pub fn rows_from(self, row: u64) -> Self {
        Self { words: self.words.rows_from(row), exponents: self.exponents.rows_from(row), sums: self.sums.rows_from(row) }
    }

    /// The probabilities as the next product reads them, once combined:
    /// f16 rows in pieces, the pieces' exponents replaced by their scales.
    pub fn pieces(self) -> HalfMat<'a> {
        HalfMat::pieces(self.words, self.exponents, PROBABILITY_PIECE)
    }
}

#[cfg(test)]
#[path = "softmax_tests.rs"]
mod tests;
