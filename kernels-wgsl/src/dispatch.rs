//! From launcher to GPU: windows of buffers bound as storage, the split of an
//! op into row chunks when a window would exceed the device's largest
//! storage binding, and the dispatch itself (pipeline, bind group, grid).
//!
//! Every storage binding covers only the window of a buffer that the
//! dispatch touches; kernels receive element offsets relative to their
//! window. The chunk loop lives here once ([`row_chunks`]); a launcher says
//! which operands are split along rows and what one chunk dispatches.

use crate::kernel::{wrapped_grid, Kernel};
use crate::device::{DeviceBuffer, Gpu};
use crate::error::GpuError;
use crate::view::Mat;
use bytemuck::Pod;
use std::ops::Range;

/// A bound window of a buffer and where the addressed data starts inside it.
#[derive(Clone)]
pub(crate) struct Window<'a> {
    binding: wgpu::BufferBinding<'a>,
    /// Element index of the first addressed element, relative to the window.
    pub(crate) local: u32,
}

/// Binds elements `[first, end)` (of `elem_bytes` each) of `buf`.
pub(crate) fn window<'a>(
    gpu: &Gpu,
    buf: &'a wgpu::Buffer,
    elem_bytes: u64,
    elements: Range<u64>,
    what: &'static str,
) -> Result<Window<'a>, GpuError> {
    let start = elements.start * elem_bytes;
    let stop = (elements.end.max(elements.start + 1)) * elem_bytes;
    let aligned = start / gpu.binding_alignment() * gpu.binding_alignment();
    let size = ((stop - aligned).div_ceil(4) * 4).min(buf.size() - aligned);
    if size > gpu.max_binding() {
        return Err(GpuError::BindingTooLarge { what, bytes: size, limit: gpu.max_binding() });
    }
    Ok(Window {
        binding: wgpu::BufferBinding { buffer: buf, offset: aligned, size: wgpu::BufferSize::new(size) },
        local: to_u32((start - aligned) / elem_bytes, what)?,
    })
}

/// The placeholder bound where a kernel's optional input is absent.
pub(crate) fn placeholder_window(gpu: &Gpu) -> Result<Window<'_>, GpuError> {
    window(gpu, gpu.placeholder(), 4, 0..1, "placeholder")
}

/// A size or offset as the kernels' 32-bit index, or an error naming it.
pub(crate) fn to_u32(v: u64, what: &'static str) -> Result<u32, GpuError> {
    u32::try_from(v).map_err(|_| GpuError::UnsupportedShape(format!("{what}: {v} exceeds 32-bit indexing")))
}

/// A row-major operand split along rows: `width` elements of row `r` start at `offset + r·stride`.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a> {
    pub(crate) buf: &'a wgpu::Buffer,
    pub(crate) elem_bytes: u64,
    pub(crate) offset: u64,
    pub(crate) stride: u64,
    pub(crate) width: u64,
    pub(crate) what: &'static str,
}

impl<'a> Rows<'a> {
    /// `width` f32 elements of each row of `m`.
    pub(crate) fn mat(m: Mat<'a>, width: u64, what: &'static str) -> Self {
        Self { buf: m.buf, elem_bytes: 4, offset: m.offset, stride: m.stride, width, what }
    }

    /// Rows of `width` elements laid end to end (channel planes, weight rows).
    pub(crate) fn packed(buf: &'a wgpu::Buffer, elem_bytes: u64, offset: u64, width: u64, what: &'static str) -> Self {
        Self { buf, elem_bytes, offset, stride: width, width, what }
    }

    pub(crate) fn window(&self, gpu: &Gpu, rows: &Range<u64>) -> Result<Window<'a>, GpuError> {
        let first = self.offset + rows.start * self.stride;
        let end = self.offset + (rows.end - 1) * self.stride + self.width;
        window(gpu, self.buf, self.elem_bytes, first..end, self.what)
    }

    /// Most rows whose window fits in `budget` bytes (0 if not even one).
    fn max_rows(&self, budget: u64) -> u64 {
        let words = budget / self.elem_bytes;
        if words < self.width {
            return 0;
        }
        // A stride of 0 repeats one row: any number of rows fits.
        (words - self.width).checked_div(self.stride).map_or(u64::MAX, |r| r + 1)
    }
}

/// Rows per chunk so every operand's window fits; `granule` rounds chunks down
/// to whole kernel tiles when there is room.
pub(crate) fn rows_per_chunk(gpu: &Gpu, rows: u64, operands: &[Rows<'_>], granule: u64) -> Result<u64, GpuError> {
    // A window may start up to one alignment unit before its data.
    let budget = gpu.max_binding().saturating_sub(gpu.binding_alignment());
    let mut chunk = rows.max(1);
    for op in operands {
        let fit = op.max_rows(budget);
        if fit == 0 {
            return Err(GpuError::BindingTooLarge {
                what: op.what,
                bytes: op.width * op.elem_bytes + gpu.binding_alignment(),
                limit: gpu.max_binding(),
            });
        }
        chunk = chunk.min(fit);
    }
    if chunk < rows && chunk >= granule {
        chunk -= chunk % granule;
    }
    Ok(chunk)
}

/// `0..total` in consecutive ranges of `chunk` (the last one shorter).
pub(crate) fn chunks(total: u64, chunk: u64) -> impl Iterator<Item = Range<u64>> {
    let chunk = chunk.max(1);
    (0..total.div_ceil(chunk)).map(move |i| i * chunk..((i + 1) * chunk).min(total))
}

/// The row ranges an op over `rows` rows runs in: as many rows per dispatch
/// as every operand's window allows (see [`rows_per_chunk`]).
pub(crate) fn row_chunks(
    gpu: &Gpu,
    rows: u64,
    operands: &[Rows<'_>],
    granule: u64,
) -> Result<impl Iterator<Item = Range<u64>>, GpuError> {
    Ok(chunks(rows, rows_per_chunk(gpu, rows, operands, granule)?))
}

/// One prepared dispatch: pipeline, bindings and grid, ready to encode any
/// number of times. Its parameters live in `params`, which a caller may
/// rewrite between runs (the Euler step's scalar).
#[derive(Debug)]
pub struct Dispatch {
    pub label: &'static str,
    pub pipeline: std::sync::Arc<wgpu::ComputePipeline>,
    pub bind_group: wgpu::BindGroup,
    pub params: DeviceBuffer,
    pub grid: [u32; 3],
}

/// Where launchers put their dispatches: straight into a command encoder,
/// or into a list prepared once and encoded every step.
pub trait Sink {
    fn put(&mut self, dispatch: Dispatch);
}

impl Sink for wgpu::CommandEncoder {
    fn put(&mut self, dispatch: Dispatch) {
        encode(self, std::slice::from_ref(&dispatch));
    }
}

impl Sink for Vec<Dispatch> {
    fn put(&mut self, dispatch: Dispatch) {
        self.push(dispatch);
    }
}

/// Encodes prepared dispatches in order, in one compute pass.
pub fn encode(enc: &mut wgpu::CommandEncoder, dispatches: &[Dispatch]) {
    encode_timed(enc, dispatches, None);
}

/// [`encode`], with the pass's start and end written to a timestamp query set.
pub fn encode_timed(enc: &mut wgpu::CommandEncoder, dispatches: &[Dispatch], timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>) {
    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: timestamps });
    for d in dispatches {
        pass.set_pipeline(&d.pipeline);
        pass.set_bind_group(0, &d.bind_group, &[]);
        pass.dispatch_workgroups(d.grid[0], d.grid[1], d.grid[2]);
    }
}

/// One launch of a kernel: which entry point, its override constants, its
/// parameter block and grid. Storage windows are passed to [`dispatch`].
pub(crate) struct Launch<'k, P> {
    pub(crate) kernel: &'k Kernel,
    pub(crate) constants: &'k [(&'static str, u32)],
    pub(crate) params: P,
    pub(crate) grid: [u32; 3],
}

/// Builds one dispatch of `launch` over the given storage windows into `sink`.
pub(crate) fn dispatch<P: Pod>(gpu: &Gpu, sink: &mut dyn Sink, launch: Launch<'_, P>, storage: &[(u32, &Window<'_>)]) {
    let Launch { kernel, constants, params, grid } = launch;
    debug_assert_eq!(size_of::<P>(), kernel.params_size);
    debug_assert_eq!(storage.len(), kernel.storage.len());
    let pipeline = gpu.pipeline(kernel, constants);
    let uniform = gpu.uniform(kernel.entry, bytemuck::bytes_of(&params));
    let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: uniform.as_entire_binding() }];
    entries.extend(
        storage
            .iter()
            .map(|(slot, w)| wgpu::BindGroupEntry { binding: *slot, resource: wgpu::BindingResource::Buffer(w.binding.clone()) }),
    );
    #[cfg(any(test, feature = "test-support"))]
    let emulated = gpu.emulated_tiles(kernel.module, grid);
    #[cfg(any(test, feature = "test-support"))]
    if let Some(tiles) = &emulated {
        entries.push(wgpu::BindGroupEntry { binding: crate::emulated_matrix::EMULATED_BINDING, resource: tiles.as_entire_binding() });
    }
    let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(kernel.entry),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    });
    sink.put(Dispatch { label: kernel.entry, pipeline, bind_group, params: uniform, grid });
}

/// Grid for `invocations` one-dimensional invocations of a 64-wide kernel.
pub(crate) fn grid64(invocations: u64) -> [u32; 3] {
    wrapped_grid(invocations.div_ceil(64))
}

#[cfg(test)]
mod tests {
    use super::chunks;

    #[test]
    fn chunks_cover_the_range_once_in_order() {
        let got: Vec<_> = chunks(10, 4).collect();
        assert_eq!(got, vec![0..4, 4..8, 8..10]);
        assert_eq!(chunks(0, 4).count(), 0);
        assert_eq!(chunks(3, 8).collect::<Vec<_>>(), vec![0..3]);
    }
}
