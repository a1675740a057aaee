//! The range rule's row scales of a matrix-tier product's operands
//! (`range_scales.wgsl`): measured by a pass before a product where its
//! operand does not bring them, or once where a weight reaches the device.

use super::terms;
use crate::device::Gpu;
use crate::dispatch::{chunks, dispatch, rows_per_chunk, to_u32, window, Launch, Rows, Sink, Window};
use crate::error::GpuError;
use crate::kernel::{kernel, wrapped_grid, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::view::{RowScales, Weight};
use bytemuck::{Pod, Zeroable};

/// `range_scales.wgsl` — the range rule's scale of each of `rows` rows of `k` values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct RangeScalesParams {
    pub rows: u32,
    pub k: u32,
    pub src_offset: u32,
    /// Elements from one row to the next, and from one of a row's k values to the next.
    pub src_stride: u32,
    pub dst_offset: u32,
    pub t_stride: u32,
    pub _pad: [u32; 2],
}

/// The range rule's row scales of a matrix-tier product's operands (`range_scales.wgsl`).
pub const RANGE_SCALES: Kernel =
    kernel(Module::RangeScales, "range_scales", [64, 1, 1], &[(1, R), (2, RW)], size_of::<RangeScalesParams>(), false);

/// Most rows of either operand one matrix-tier product measures at once:
/// the range scales it writes take at most 2 × 4 bytes × this
/// (`flux_lite_core::plan::RANGE_SCALES_BYTES`).
pub const RANGE_SCALES_ROWS: u64 = flux_lite_core::plan::RANGE_SCALES_BYTES / 8;

/// The range scales of rows `0 .. rows` of `w` (rows of `k` values) into
/// f32 elements `at ..` of `dst`, as a matrix-tier product over `w` would
/// measure them itself: run once where the weight reaches the device, so
/// that every product over it reads them ([`Weight::scales`]) instead.
pub fn measure_weight_rows(gpu: &Gpu, sink: &mut dyn Sink, w: Weight<'_>, rows: u64, k: u64, dst: &wgpu::Buffer, at: u64) -> Result<(), GpuError> {
    let w_rows = Rows::packed(w.buf, w.dtype.bytes(), w.offset, k, "weight");
    for piece in chunks(rows, rows_per_chunk(gpu, rows, &[w_rows], 1)?) {
        let ww = w_rows.window(gpu, &piece)?;
        let params = RangeScalesParams { rows: to_u32(piece.end - piece.start, "weight rows")?, k: to_u32(terms(gpu, k), "weight k")?, src_offset: ww.local, src_stride: to_u32(k, "weight k")?, dst_offset: to_u32(at + piece.start, "weight row scales")?, t_stride: 1, _pad: [0; 2] };
        measure_rows(gpu, sink, &ww, dst, params, w.dtype.constant() == 1)?;
    }
    Ok(())
}

/// The window of a weight's kept row scales over its rows `rows`.
pub(crate) fn kept_scales_window<'a>(gpu: &Gpu, s: RowScales<'a>, rows: &std::ops::Range<u64>) -> Result<Window<'a>, GpuError> {
    window(gpu, s.buf, 4, s.offset + rows.start..s.offset + rows.end, "weight row scales")
}

/// One [`RANGE_SCALES`] pass: the scale of each row of `src` (f32, or bf16
/// where `bf16`) into `scales` from `params.dst_offset` on.
pub(crate) fn measure_rows(gpu: &Gpu, sink: &mut dyn Sink, src: &Window<'_>, scales: &wgpu::Buffer, params: RangeScalesParams, bf16: bool) -> Result<(), GpuError> {
    let dst = window(gpu, scales, 4, 0..(params.dst_offset + params.rows) as u64, "range scales")?;
    let launch = Launch { kernel: &RANGE_SCALES, constants: &[("SOURCE_BF16", bf16 as u32)], params, grid: wrapped_grid(params.rows as u64) };
    dispatch(gpu, sink, launch, &[(1, src), (2, &dst)]);
    Ok(())
}
