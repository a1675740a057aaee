//! The blocks of the matrix tier's attention kernels: how many subgroups,
//! queries and output dims a workgroup of the flash kernel and of
//! `attention_matrix.wgsl` takes, and the workgroup memory each declares
//! (counted as the shaders lay it out; the catalogue's tests hold the two
//! equal).

use super::ATTENTION_MATRIX_MAX_HEAD_DIM;
use crate::precision::{MatrixConfig, MatrixOperands};

/// Subgroups in one flash-attention workgroup (`SG` in attention_flash.wgsl): 4 with 16×16 tiles, 2 with 8×8.
pub(super) fn flash_subgroups(c: MatrixConfig) -> u64 {
    if c.size == 16 { 4 } else { 2 }
}

/// Output dims one flash-attention workgroup takes (`ODIMS`: 8 tiles).
pub(super) fn flash_output_dims(c: MatrixConfig) -> u64 {
    8 * c.size as u64
}

/// The workgroup memory `attention_flash.wgsl` declares on `c`, counted as
/// it lays it out (a test holds the two equal): one key tile's keys (2T
/// rows of the widest head and 8 more), where its values then go, the
/// queries' staging before them; the scores and probabilities; the rows'
/// softmax state. 24,324 bytes with 16×16 tiles, 6,788 with 8×8.
pub(crate) fn flash_workgroup_bytes(c: MatrixConfig) -> u32 {
    let t = c.size;
    let (sg, max_dim, max_segs) = (flash_subgroups(c) as u32, ATTENTION_MATRIX_MAX_HEAD_DIM as u32, 2);
    let (qb, kb) = (sg * t, 2 * t);
    let (half, float) = (2, 4);
    let staged = kb * (max_dim + 8) * half;
    let scores = qb * kb * float + qb * kb * half + t * t * float;
    let rows = qb * float + 2 * kb * float + 3 * qb * float + 2 * qb * max_segs * float;
    staged + scores + rows + float
}

/// The workgroup memory `attention_matrix.wgsl` declares on `c` for heads
/// up to `max_dim` with `o_dims` output dims a workgroup, counted as it
/// lays it out (a test holds the two equal): a T×T tile of each operand,
/// three f32 tiles (scores, P·V, zeros), T rows of `o_dims` f32 outputs and
/// seven f32 values a row. 37,312 bytes for the 512-wide head in 16×16
/// tiles, 20,928 at 256 dims a workgroup.
pub fn matrix_attention_workgroup_bytes(c: MatrixConfig, o_dims: u32) -> u32 {
    let t = c.size;
    let operand = if c.operands == MatrixOperands::F16 { 2 } else { 4 };
    2 * t * t * operand + 3 * t * t * 4 + t * o_dims * 4 + 7 * t * 4
}

/// Output dims one workgroup of the matrix attention takes (`O_DIMS`), of
/// a module whose widest head is `max_dim`: all of them, or the most of a
/// half and a quarter of which two workgroups fit in `workgroup_memory`
/// (each then computing the scores over the whole head: a 512-wide head
/// in 16×16 tiles is 37,312 bytes whole, 20,928 in halves), the quarter
/// where none does. An output in f16 pieces of `piece` is cut only at
/// whole pieces.
pub fn matrix_attention_output_dims(c: MatrixConfig, max_dim: u32, workgroup_memory: u32, piece: Option<u32>) -> u32 {
    let candidates = [max_dim, max_dim / 2, max_dim / 4];
    let whole = |o: &u32| o.is_multiple_of(c.size) && piece.is_none_or(|p| o.is_multiple_of(p));
    let fitting = candidates.into_iter().filter(whole).find(|&o| 2 * matrix_attention_workgroup_bytes(c, o) <= workgroup_memory);
    fitting.unwrap_or_else(|| candidates.into_iter().rev().find(whole).unwrap_or(max_dim))
}

/// Output pieces one flash-attention workgroup's dims may hold (`OUT_PIECES`).
const FLASH_OUT_PIECES: u64 = 8;

/// Whether the flash kernel takes a call on `c`: f16 tiles, a head of at
/// most [`ATTENTION_MATRIX_MAX_HEAD_DIM`], and for an output in pieces of
/// `piece`, pieces that no workgroup's dims cut and at most
/// [`FLASH_OUT_PIECES`] of them in one.
pub(super) fn flash_takes(c: MatrixConfig, head_dim: u64, piece: Option<u64>) -> bool {
    let dims = flash_output_dims(c);
    let pieces_fit = match piece {
        None => true,
        Some(piece) => (head_dim <= dims || dims.is_multiple_of(piece)) && head_dim.min(dims).div_ceil(piece) <= FLASH_OUT_PIECES,
    };
    c.operands == MatrixOperands::F16 && head_dim <= ATTENTION_MATRIX_MAX_HEAD_DIM && pieces_fit
}
