//! What the traffic is drawn against and summed in: the machine's
//! ceilings and limits, a dispatch's traffic, the widths a tier stores
//! values at, and the rows and pieces a launcher binds.

use flux_lite_core::ir::{Operand, Span};
use flux_lite_kernels::Precision;
use std::iter::Sum;
use std::ops::{Add, AddAssign};

/// The ceilings and limits a roofline is drawn against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Machine {
    pub name: &'static str,
    /// FLOP/s of the matrix units (f16 operands, f32 sums).
    pub matrix_flops: f64,
    /// FLOP/s of f32 fused multiply-adds.
    pub fma_flops: f64,
    /// Bytes read plus written per second.
    pub bytes_per_second: f64,
    /// Largest byte range one storage binding covers.
    pub max_binding: u64,
    /// Largest buffer.
    pub max_buffer: u64,
    /// Output rows (and columns) of one workgroup's block of a product: where
    /// a product splits, its pieces are whole blocks.
    pub product_block: u64,
    /// Workgroups of a product on matrix units resident at once: a
    /// dispatch of fewer leaves multiprocessors idle, and one of more runs
    /// in waves of this many.
    pub workgroup_slots: u64,
}

/// NVIDIA H200 through Vulkan, as our own kernels measured it (the ceilings
/// of docs/performance.md's H200 section: matrix units 575 TFLOP/s, FMA
/// 60.1 TFLOP/s, copy 3.2 TB/s; 2 GiB storage bindings, 4 GiB buffers
/// (`flux-lite gpu` there); 16×16 matrix tiles,
/// 128-row blocks; two workgroups of the matrix linear on each of its 132
/// multiprocessors, as its 197 registers a lane allow).
pub const H200: Machine = Machine {
    name: "H200",
    matrix_flops: 575e12,
    fma_flops: 60.1e12,
    bytes_per_second: 3.2e12,
    max_binding: 2 << 30,
    max_buffer: 4 << 30,
    product_block: 128,
    workgroup_slots: 264,
};

/// Offsets of a storage binding are aligned to this many bytes (wgpu's
/// default limit): a window may start this much before its data.
pub(super) const BINDING_ALIGNMENT: u64 = 256;

/// Values per row of a contiguous element-wise op (the runner's `contiguous`).
pub(super) const CONTIGUOUS_ROW: u64 = 1 << 16;

/// Rows of either operand one matrix-tier product measures at once (the
/// kernels' `RANGE_SCALES_ROWS`: the range scales' buffer, two floats a row).
pub(super) const RANGE_SCALES_ROWS: u64 = flux_lite_core::plan::RANGE_SCALES_BYTES / 8;

/// Dispatches, bytes and FLOPs of some work, and the shortest time a
/// machine's ceilings allow for it (each dispatch bounded by the slower of
/// its compute and its bytes, the dispatches one after another); and the
/// same with each product on matrix units running its workgroups in whole
/// waves of the machine's [`Machine::workgroup_slots`] (`filled`: a
/// product of fewer workgroups computes at their share of the ceiling).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Traffic {
    pub dispatches: u64,
    pub bytes: u64,
    pub flops: u64,
    pub seconds: f64,
    pub filled: f64,
}

impl Add for Traffic {
    type Output = Traffic;
    fn add(self, o: Traffic) -> Traffic {
        Traffic { dispatches: self.dispatches + o.dispatches, bytes: self.bytes + o.bytes, flops: self.flops + o.flops, seconds: self.seconds + o.seconds, filled: self.filled + o.filled }
    }
}

impl AddAssign for Traffic {
    fn add_assign(&mut self, o: Traffic) {
        *self = *self + o;
    }
}

impl Sum for Traffic {
    fn sum<I: Iterator<Item = Traffic>>(iter: I) -> Traffic {
        iter.fold(Traffic::default(), Add::add)
    }
}

/// How wide a tier stores each kind of value, and whether its products
/// measure their operands' range scales in passes of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DataPath {
    /// Bytes of an activation in the arena.
    pub(super) activation: u64,
    /// Bytes of a weight as the model folder holds it (bf16).
    pub(super) weight: u64,
    /// Bytes of a range scale.
    pub(super) scale: u64,
    /// Products on cooperative matrices with f16 operands, their inputs' scales measured first.
    pub(super) matrix: bool,
}

impl DataPath {
    /// The data path of `tier`: f32 activations, except the products'
    /// inputs an op writes as f16 rows on the matrix tier ([`Operand`],
    /// counted where the program has them); bf16 weights. `auto` is taken as
    /// the matrix tier, as on the H200.
    pub(super) fn of(tier: Precision) -> Self {
        DataPath { activation: 4, weight: 2, scale: 4, matrix: is_matrix(tier) }
    }

    /// Bytes of `width` values of a row of `x`, and of its scales where it
    /// has them (one a row, or one a piece).
    pub(super) fn row_bytes(&self, x: &Operand, width: u64) -> u64 {
        match (x.scales, x.piece) {
            (Some(_), Some(piece)) => width * 2 + width.div_ceil(piece) * self.scale,
            (Some(_), None) => width * 2 + self.scale,
            (None, _) => width * self.activation,
        }
    }
}

/// Whether `tier` is (or, as `auto` on the H200, becomes) the matrix tier.
pub(super) fn is_matrix(tier: Precision) -> bool {
    matches!(tier, Precision::Matrix | Precision::Auto)
}

/// An operand's rows as a launcher binds them: words of f16 pairs for half rows.
pub(super) fn operand_rows(x: &Operand, width: u64, p: DataPath) -> Rows {
    match x.scales {
        Some(_) => Rows::of(x.data, width / 2, 4),
        None => Rows::of(x.data, width, p.activation),
    }
}

/// One operand's rows as a launcher binds them: row `r` at `r·stride`,
/// `width` elements of `bytes` each.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rows {
    pub(super) stride: u64,
    pub(super) width: u64,
    pub(super) bytes: u64,
}

impl Rows {
    pub(super) fn of(s: Span, width: u64, bytes: u64) -> Self {
        Rows { stride: s.stride, width, bytes }
    }

    pub(super) fn packed(width: u64, bytes: u64) -> Self {
        Rows { stride: width, width, bytes }
    }

    /// Most rows whose window fits in `budget` bytes (at least 1: where not
    /// even one fits, a run refuses the op; the model counts it whole).
    pub(super) fn fitting(self, budget: u64) -> u64 {
        let words = budget / self.bytes;
        if words < self.width {
            return 1;
        }
        (words - self.width).checked_div(self.stride).map_or(u64::MAX, |r| r + 1)
    }
}

/// Rows a launcher puts in one dispatch so that every operand's window fits
/// one binding, rounded down to whole `granule`s where there is room.
pub(super) fn rows_per_piece(m: &Machine, rows: u64, operands: &[Rows], granule: u64) -> u64 {
    let budget = m.max_binding.saturating_sub(BINDING_ALIGNMENT);
    let mut piece = operands.iter().map(|o| o.fitting(budget)).fold(rows.max(1), u64::min);
    if piece < rows && piece >= granule {
        piece -= piece % granule;
    }
    piece
}

/// The sizes of `total` split into pieces of at most `piece`.
pub(super) fn pieces(total: u64, piece: u64) -> impl Iterator<Item = u64> {
    let piece = piece.max(1);
    (0..total.div_ceil(piece)).map(move |i| piece.min(total - i * piece))
}
