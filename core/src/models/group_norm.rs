//! A GroupNorm in a VAE program: the rows' moments, their merge, then the
//! normalisation ([`GroupShape`] says why in three steps), and the scratch
//! the steps share.

use crate::ir::{name, GroupShape, InputNorm, NormActivation, Op, Operand, Span};

/// Elements before the moments, so that they start on a binding's alignment.
const STATS_ELEMENTS: u64 = 64;

/// Where a program's GroupNorms keep their statistics: each group's `(mean,
/// 1/√(var + eps))` in `stats`, then the rows' moments `[rows, groups, 2]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NormScratch {
    pub stats: Span,
    pub moments: Span,
}

impl NormScratch {
    /// f32 elements of the scratch of GroupNorms of `groups` over images of at most `rows` rows.
    pub fn elements(groups: u64, rows: u64) -> u64 {
        STATS_ELEMENTS.max(2 * groups).next_multiple_of(STATS_ELEMENTS) + 2 * groups * rows
    }

    /// The scratch at `at` ([`NormScratch::elements`] long).
    pub fn at(at: Span, groups: u64) -> Self {
        let stats_len = STATS_ELEMENTS.max(2 * groups).next_multiple_of(STATS_ELEMENTS);
        Self { stats: Span::new(at.offset, 2), moments: Span::new(at.offset + stats_len, 2 * groups) }
    }
}

/// GroupNorm `p` (its `weight` and `bias`) of `src` into `dst`, SiLU after
/// where `silu`: the three ops.
pub(crate) fn group_norm(scratch: NormScratch, (src, dst): (Operand, Operand), p: &str, shape: GroupShape, eps: f32, silu: bool, emit: &mut impl FnMut(Op)) {
    let stats = group_stats(scratch, src, shape, eps, emit);
    let (gamma, beta) = (name(format_args!("{p}.weight")), name(format_args!("{p}.bias")));
    emit(Op::GroupNormApply { src, stats, dst, gamma, beta, shape, silu });
}

/// GroupNorm `p`'s statistics of `src` (its first two ops), for a
/// convolution that normalises its input as it reads it, `activation` after.
pub(crate) fn group_norm_read(scratch: NormScratch, src: Operand, p: &str, shape: GroupShape, eps: f32, activation: NormActivation, emit: &mut impl FnMut(Op)) -> InputNorm {
    let stats = group_stats(scratch, src, shape, eps, emit);
    InputNorm { stats, gamma: name(format_args!("{p}.weight")), beta: name(format_args!("{p}.bias")), groups: shape.groups, activation }
}

/// The rows' moments and their merge into each group's statistics (in `scratch.stats`).
fn group_stats(scratch: NormScratch, src: Operand, shape: GroupShape, eps: f32, emit: &mut impl FnMut(Op)) -> Span {
    let NormScratch { stats, moments } = scratch;
    emit(Op::GroupMoments { src, moments, shape });
    emit(Op::GroupMerge { moments, stats, of: shape.moments(), eps });
    stats
}
