//! The queries' and keys' per-head RMSNorm and interleaved RoPE in their
//! projection's epilogue on the matrix tier (`linear_head_norm.wgsl` on
//! `matrix_gemm.wgsl`): each head's outputs normed and rotated before they
//! are rounded to f16 pieces, so no pass reads and writes them again.

use super::{product_writes_pieces, Gemm, LinearParams, MATRIX_BLOCK_TILES};
use crate::device::Gpu;
use crate::dispatch::{to_u32, window, Rows, Window};
use crate::error::GpuError;
use crate::kernels::rope::RopeTables;
use crate::view::Weight;
use std::ops::Range;

/// What a product's epilogue norms: outputs `[0, first_cols)` of the
/// product by `first`'s per-head weight, `[first_cols, cols)` by
/// `second`'s (the single block's fused projection: queries, then keys; a
/// projection of one kind gives the same weight twice), the rest as they
/// are (the values); heads of `head_dim`, each RMS-normed with `eps` and
/// rotated in interleaved pairs, output row `t` by table row
/// `tables.first_row + t` (norm.wgsl's `rms_norm_rope`).
#[derive(Debug, Clone, Copy)]
pub struct HeadNorm<'a> {
    pub first: Weight<'a>,
    pub second: Weight<'a>,
    pub first_cols: u64,
    pub cols: u64,
    pub head_dim: u64,
    pub eps: f32,
    pub tables: RopeTables<'a>,
}

/// Whether a product into f16 pieces of `piece` norms heads of `head_dim`
/// in its epilogue on `gpu` ([`product_writes_pieces`]): a head is a
/// block's outputs a row (8 tiles) or one subgroup column's half of them
/// (4 tiles), whose sums of squares the block holds in place of its k
/// steps' inverse scales.
pub fn product_norms_heads(gpu: &Gpu, piece: u64, head_dim: u64) -> bool {
    #[cfg(any(test, feature = "test-support"))]
    if gpu.faults().head_norm_passes {
        return false;
    }
    let block = |c: crate::precision::MatrixConfig| c.size as u64 * MATRIX_BLOCK_TILES;
    product_writes_pieces(gpu, piece, false) && gpu.matrix().is_some_and(|c| head_dim == block(c) || 2 * head_dim == block(c))
}

impl<'a> HeadNorm<'a> {
    /// Refuses what the epilogue cannot norm, naming it.
    pub(super) fn check(&self, gpu: &Gpu, piece: u64, s: Gemm) -> Result<(), GpuError> {
        let d = self.head_dim;
        if !product_norms_heads(gpu, piece, d) {
            return Err(GpuError::UnsupportedShape(format!("a product norming heads of {d} in pieces of {piece} needs the matrix tier's f16 operands with heads of a block's or half a block's outputs")));
        }
        if !self.first_cols.is_multiple_of(d) || !self.cols.is_multiple_of(d) || self.first_cols > self.cols || self.cols > s.n {
            return Err(GpuError::UnsupportedShape(format!("heads of {d} normed over outputs [0, {}) and [{}, {}) of {}", self.first_cols, self.first_cols, self.cols, s.n)));
        }
        if self.first.dtype != self.second.dtype {
            return Err(GpuError::UnsupportedShape("two head norms' weights of different types in one product".into()));
        }
        Ok(())
    }

    /// The RoPE tables' rows, one an output row.
    pub(super) fn table_rows(&self) -> [Rows<'a>; 2] {
        let d = self.head_dim;
        [self.tables.cos, self.tables.sin].map(|buf| Rows::packed(buf, 4, self.tables.first_row * d, d, "rope table"))
    }

    /// `params` with the norm's fields for output rows `rows` and columns
    /// `cols` of the product, and its bindings 16–19: the two weights' head
    /// rows, the cos and the sin rows.
    pub(super) fn bind(&self, gpu: &Gpu, params: LinearParams, rows: &Range<u64>, cols: &Range<u64>) -> Result<(LinearParams, Vec<Window<'a>>), GpuError> {
        let d = self.head_dim;
        let weight = |w: Weight<'a>| window(gpu, w.buf, w.dtype.bytes(), w.offset..w.offset + d, "norm weight");
        let (first, second) = (weight(self.first)?, weight(self.second)?);
        let [cos, sin] = self.table_rows();
        let (cos, sin) = (cos.window(gpu, rows)?, sin.window(gpu, rows)?);
        if cos.local != sin.local {
            return Err(GpuError::UnsupportedShape("rope cos and sin tables must be equally aligned".into()));
        }
        let params = LinearParams {
            head_col0: to_u32(cols.start, "normed columns")?,
            head_first: to_u32(self.first_cols, "normed columns")?,
            head_cols: to_u32(self.cols, "normed columns")?,
            norm_first: first.local,
            norm_second: second.local,
            table_offset: cos.local,
            head_eps: self.eps,
            ..params
        };
        Ok((params, vec![first, second, cos, sin]))
    }
}

#[cfg(test)]
mod tests;
