//! Launchers: core's ops as WGSL dispatches over views of device buffers.
//!
//! Every storage binding covers only the window of a buffer that the
//! dispatch touches. When a window would exceed the device's largest storage
//! binding, the op is split into row chunks (tokens, channels) and, for
//! linear layers, output-column chunks, each with its own windows; the
//! kernels receive element offsets relative to their window.

use crate::error::GpuError;
use crate::gpu::{DeviceBuffer, Gpu};
use bytemuck::Pod;
use flux_lite_kernels as k;

/// An f32 tensor viewed as rows: row `r` starts at element `offset + r·stride`.
#[derive(Debug, Clone, Copy)]
pub struct Mat<'a> {
    pub buf: &'a wgpu::Buffer,
    pub offset: u64,
    pub stride: u64,
}

impl<'a> Mat<'a> {
    /// A contiguous `[rows, width]` tensor at the start of `buf`.
    pub fn new(buf: &'a wgpu::Buffer, width: u64) -> Self {
        Self { buf, offset: 0, stride: width }
    }

    /// The same rows starting `cols` elements further right (a column slice).
    pub fn cols_from(self, cols: u64) -> Self {
        Self { offset: self.offset + cols, ..self }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    Bf16,
    F32,
}

impl WeightDtype {
    pub(crate) fn bytes(self) -> u64 {
        match self {
            WeightDtype::Bf16 => 2,
            WeightDtype::F32 => 4,
        }
    }

    fn constant(self) -> u32 {
        (self == WeightDtype::Bf16) as u32
    }
}

/// A weight tensor (bf16 or f32) starting at element `offset` of `buf`.
#[derive(Debug, Clone, Copy)]
pub struct Weight<'a> {
    pub buf: &'a wgpu::Buffer,
    pub offset: u64,
    pub dtype: WeightDtype,
}

impl<'a> Weight<'a> {
    pub fn bf16(buf: &'a wgpu::Buffer) -> Self {
        Self { buf, offset: 0, dtype: WeightDtype::Bf16 }
    }

    /// The weight from row `row` on, rows being `width` elements.
    pub fn rows_from(self, row: u64, width: u64) -> Self {
        Self { offset: self.offset + row * width, ..self }
    }

    pub fn f32(buf: &'a wgpu::Buffer) -> Self {
        Self { buf, offset: 0, dtype: WeightDtype::F32 }
    }
}

/// A bound window of a buffer and where the addressed data starts inside it.
struct Window<'a> {
    binding: wgpu::BufferBinding<'a>,
    /// Element index of the first addressed element, relative to the window.
    local: u32,
}

/// Binds elements `[first, end)` (of `elem_bytes` each) of `buf`.
fn window<'a>(
    gpu: &Gpu,
    buf: &'a wgpu::Buffer,
    elem_bytes: u64,
    first: u64,
    end: u64,
    what: &'static str,
) -> Result<Window<'a>, GpuError> {
    let start = first * elem_bytes;
    let stop = (end.max(first + 1)) * elem_bytes;
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

fn to_u32(v: u64, what: &'static str) -> Result<u32, GpuError> {
    u32::try_from(v).map_err(|_| GpuError::UnsupportedShape(format!("{what}: {v} exceeds 32-bit indexing")))
}

/// A row-major operand split along rows: `width` elements of row `r` start at `offset + r·stride`.
#[derive(Clone, Copy)]
struct Rows<'a> {
    buf: &'a wgpu::Buffer,
    elem_bytes: u64,
    offset: u64,
    stride: u64,
    width: u64,
    what: &'static str,
}

impl<'a> Rows<'a> {
    fn mat(m: Mat<'a>, width: u64, what: &'static str) -> Self {
        Self { buf: m.buf, elem_bytes: 4, offset: m.offset, stride: m.stride, width, what }
    }

    fn window(&self, gpu: &Gpu, r0: u64, r1: u64) -> Result<Window<'a>, GpuError> {
        let first = self.offset + r0 * self.stride;
        let end = self.offset + (r1 - 1) * self.stride + self.width;
        window(gpu, self.buf, self.elem_bytes, first, end, self.what)
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
fn rows_per_chunk(gpu: &Gpu, rows: u64, operands: &[Rows<'_>], granule: u64) -> Result<u64, GpuError> {
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

/// Builds one dispatch of `kernel` with `params` and the given storage windows.
fn dispatch<P: Pod>(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    kernel: &k::Kernel,
    constants: &[(&'static str, u32)],
    params: &P,
    storage: &[(u32, &Window<'_>)],
    grid: [u32; 3],
) {
    debug_assert_eq!(size_of::<P>(), kernel.params_size);
    debug_assert_eq!(storage.len(), kernel.storage.len());
    let pipeline = gpu.pipeline(kernel, constants);
    let uniform = gpu.uniform(kernel.entry, bytemuck::bytes_of(params));
    let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: uniform.as_entire_binding() }];
    entries.extend(
        storage
            .iter()
            .map(|(slot, w)| wgpu::BindGroupEntry { binding: *slot, resource: wgpu::BindingResource::Buffer(w.binding.clone()) }),
    );
    let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(kernel.entry),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    });
    sink.put(Dispatch { label: kernel.entry, pipeline, bind_group, params: uniform, grid });
}

/// Grid for `invocations` one-dimensional invocations of a 64-wide kernel.
fn grid64(invocations: u64) -> [u32; 3] {
    k::wrapped_grid(invocations.div_ceil(64))
}

/// `y[m, n] = x[m, k]·W[n, k]ᵀ (+ b[n])`, W contiguous `[n, k]`.
#[allow(clippy::too_many_arguments)]
pub fn linear(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    x: Mat<'_>,
    w: Weight<'_>,
    bias: Option<Weight<'_>>,
    y: Mat<'_>,
    m: u64,
    n: u64,
    kdim: u64,
) -> Result<(), GpuError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    let [tile_m, tile_n] = k::GEMM_TILE.map(u64::from);
    let eb = w.dtype.bytes();
    let w_rows = Rows { buf: w.buf, elem_bytes: eb, offset: w.offset, stride: kdim, width: kdim, what: "linear weight" };
    let n_chunk = rows_per_chunk(gpu, n, &[w_rows], tile_n)?;
    let x_rows = Rows::mat(x, kdim, "linear input");
    let y_rows = Rows::mat(y, n_chunk.min(n), "linear output");
    let m_chunk = rows_per_chunk(gpu, m, &[x_rows, y_rows], tile_m)?;
    for m0 in (0..m).step_by(m_chunk as usize) {
        let m1 = (m0 + m_chunk).min(m);
        let xw = x_rows.window(gpu, m0, m1)?;
        for n0 in (0..n).step_by(n_chunk as usize) {
            let n1 = (n0 + n_chunk).min(n);
            let ww = w_rows.window(gpu, n0, n1)?;
            // bf16 rows starting on even elements load as whole u32 pairs.
            let paired = ww.local.is_multiple_of(2) && kdim.is_multiple_of(2);
            let constants = [("WEIGHT_BF16", w.dtype.constant()), ("HAS_BIAS", bias.is_some() as u32), ("W_PAIRED", paired as u32)];
            let bw = match bias {
                Some(b) => window(gpu, b.buf, eb, b.offset + n0, b.offset + n1, "linear bias")?,
                None => window(gpu, gpu.placeholder(), 4, 0, 1, "placeholder")?,
            };
            let yw = Rows { offset: y.offset + n0, width: n1 - n0, ..y_rows }.window(gpu, m0, m1)?;
            let params = k::LinearParams {
                m: to_u32(m1 - m0, "linear rows")?,
                n: to_u32(n1 - n0, "linear cols")?,
                k: to_u32(kdim, "linear k")?,
                x_offset: xw.local,
                x_stride: to_u32(x.stride, "linear input stride")?,
                w_offset: ww.local,
                b_offset: bw.local,
                y_offset: yw.local,
                y_stride: to_u32(y.stride, "linear output stride")?,
                _pad: [0; 3],
            };
            let grid = [(n1 - n0).div_ceil(tile_n) as u32, (m1 - m0).div_ceil(tile_m) as u32, 1];
            dispatch(gpu, sink, &k::LINEAR, &constants, &params, &[(1, &xw), (2, &ww), (3, &bw), (4, &yw)], grid);
        }
    }
    Ok(())
}

/// Shape of a row normalisation over `[tokens, heads·d]` views.
#[derive(Debug, Clone, Copy)]
pub struct RowNorm {
    pub tokens: u64,
    /// Rows per token (1 for whole-row norms, the head count for per-head norms).
    pub heads: u64,
    pub d: u64,
    pub eps: f32,
}

/// RMSNorm with weight: `dst = w·src/√(mean(src²)+eps)` per (token, head) row.
pub fn rms_norm(gpu: &Gpu, sink: &mut dyn Sink, src: Mat<'_>, w: Weight<'_>, dst: Mat<'_>, s: RowNorm) -> Result<(), GpuError> {
    row_norm(gpu, sink, &k::RMS_NORM, Some(src), dst, NormExtra::Weight(w), s)
}

/// RMSNorm in place (per-head q/k norms).
pub fn rms_norm_inplace(gpu: &Gpu, sink: &mut dyn Sink, data: Mat<'_>, w: Weight<'_>, s: RowNorm) -> Result<(), GpuError> {
    row_norm(gpu, sink, &k::RMS_NORM_INPLACE, None, data, NormExtra::Weight(w), s)
}

/// `dst = LN(src)·(1 + scale) + shift`; `shift` and `scale` are `d`-wide rows of the modulation buffer.
pub fn layer_norm_modulate(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    src: Mat<'_>,
    shift: Mat<'_>,
    scale: Mat<'_>,
    dst: Mat<'_>,
    s: RowNorm,
) -> Result<(), GpuError> {
    if !std::ptr::eq(shift.buf, scale.buf) {
        return Err(GpuError::UnsupportedShape("shift and scale must live in one modulation buffer".into()));
    }
    row_norm(gpu, sink, &k::LAYER_NORM_MODULATE, Some(src), dst, NormExtra::Modulation(shift, scale), s)
}

/// What a row norm reads besides its input: a weight, or modulation rows (shift, scale).
enum NormExtra<'a> {
    Weight(Weight<'a>),
    Modulation(Mat<'a>, Mat<'a>),
}

fn row_norm(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    kernel: &k::Kernel,
    src: Option<Mat<'_>>,
    dst: Mat<'_>,
    extra: NormExtra<'_>,
    s: RowNorm,
) -> Result<(), GpuError> {
    if s.tokens == 0 {
        return Ok(());
    }
    let width = s.heads * s.d;
    let src_rows = src.map(|m| Rows::mat(m, width, "norm input"));
    let dst_rows = Rows::mat(dst, width, "norm output");
    let operands: Vec<Rows<'_>> = src_rows.iter().copied().chain([dst_rows]).collect();
    let chunk = rows_per_chunk(gpu, s.tokens, &operands, 1)?;
    for t0 in (0..s.tokens).step_by(chunk as usize) {
        let t1 = (t0 + chunk).min(s.tokens);
        let dw = dst_rows.window(gpu, t0, t1)?;
        let sw = match src_rows {
            Some(r) => Some(r.window(gpu, t0, t1)?),
            None => None,
        };
        let mut params = k::NormParams {
            rows: to_u32((t1 - t0) * s.heads, "norm rows")?,
            d: to_u32(s.d, "norm width")?,
            heads: to_u32(s.heads, "norm heads")?,
            src_offset: sw.as_ref().map_or(0, |w| w.local),
            src_stride: to_u32(src.map_or(0, |m| m.stride), "norm input stride")?,
            dst_offset: dw.local,
            dst_stride: to_u32(dst.stride, "norm output stride")?,
            eps: s.eps,
            ..Default::default()
        };
        let (constants, extra_window) = match &extra {
            NormExtra::Weight(w) => {
                let ww = window(gpu, w.buf, w.dtype.bytes(), w.offset, w.offset + s.d, "norm weight")?;
                params.w_offset = ww.local;
                ([("WEIGHT_BF16", w.dtype.constant())].to_vec(), ww)
            }
            NormExtra::Modulation(shift, scale) => {
                let lo = shift.offset.min(scale.offset);
                let hi = shift.offset.max(scale.offset) + s.d;
                let mw = window(gpu, shift.buf, 4, lo, hi, "modulation")?;
                params.shift_offset = mw.local + (shift.offset - lo) as u32;
                params.scale_offset = mw.local + (scale.offset - lo) as u32;
                (Vec::new(), mw)
            }
        };
        let grid = k::wrapped_grid((t1 - t0) * s.heads);
        let extra_slot = if matches!(extra, NormExtra::Weight(_)) { 3 } else { 5 };
        let mut storage: Vec<(u32, &Window<'_>)> = Vec::new();
        if let Some(w) = &sw {
            storage.push((1, w));
        }
        storage.push((2, &dw));
        storage.push((extra_slot, &extra_window));
        dispatch(gpu, sink, kernel, &constants, &params, &storage, grid);
    }
    Ok(())
}

/// The GroupNorm of a contiguous `[channels, pixels]` tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Groups {
    pub channels: u64,
    pub pixels: u64,
    pub groups: u64,
}

impl Groups {
    /// The parameters every GroupNorm kernel shares.
    fn params(self, src: &Window<'_>, dst: u32) -> Result<k::NormParams, GpuError> {
        if self.groups == 0 || !self.channels.is_multiple_of(self.groups) {
            return Err(GpuError::UnsupportedShape(format!("group norm: {} channels in {} groups", self.channels, self.groups)));
        }
        Ok(k::NormParams {
            rows: to_u32(self.channels, "group norm channels")?,
            d: to_u32(self.pixels, "group norm pixels")?,
            heads: 1,
            src_offset: src.local,
            dst_offset: dst,
            groups: to_u32(self.groups, "groups")?,
            ..Default::default()
        })
    }

    fn input<'a>(self, gpu: &Gpu, src: Mat<'a>) -> Result<Window<'a>, GpuError> {
        window(gpu, src.buf, 4, src.offset, src.offset + self.channels * self.pixels, "group norm input")
    }

    fn output<'a>(self, gpu: &Gpu, dst: Mat<'a>) -> Result<Window<'a>, GpuError> {
        window(gpu, dst.buf, 4, dst.offset, dst.offset + self.channels * self.pixels, "group norm output")
    }

    /// Each group's two statistics `[groups, 2]`.
    fn stats<'a>(self, gpu: &Gpu, stats: Mat<'a>) -> Result<Window<'a>, GpuError> {
        window(gpu, stats.buf, 4, stats.offset, stats.offset + 2 * self.groups, "group norm statistics")
    }

    /// Windows of the affine weight and bias; the kernels index both with one offset.
    fn affine<'a>(self, gpu: &Gpu, gamma: Weight<'a>, beta: Weight<'a>) -> Result<(Window<'a>, Window<'a>), GpuError> {
        if gamma.dtype != beta.dtype {
            return Err(GpuError::UnsupportedShape("group norm weight and bias must share a dtype".into()));
        }
        let c = self.channels;
        let gw = window(gpu, gamma.buf, gamma.dtype.bytes(), gamma.offset, gamma.offset + c, "group norm weight")?;
        let bw = window(gpu, beta.buf, beta.dtype.bytes(), beta.offset, beta.offset + c, "group norm bias")?;
        if gw.local != bw.local {
            return Err(GpuError::UnsupportedShape("group norm weight and bias must be equally aligned".into()));
        }
        Ok((gw, bw))
    }
}

/// GroupNorm with affine, SiLU after when `silu`.
#[allow(clippy::too_many_arguments)]
pub fn group_norm(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    src: Mat<'_>,
    gamma: Weight<'_>,
    beta: Weight<'_>,
    dst: Mat<'_>,
    g: Groups,
    eps: f32,
    silu: bool,
) -> Result<(), GpuError> {
    let (sw, dw) = (g.input(gpu, src)?, g.output(gpu, dst)?);
    let (gw, bw) = g.affine(gpu, gamma, beta)?;
    let params = k::NormParams { w_offset: gw.local, eps, silu: silu as u32, ..g.params(&sw, dw.local)? };
    let constants = [("WEIGHT_BF16", gamma.dtype.constant())];
    dispatch(gpu, sink, &k::GROUP_NORM, &constants, &params, &[(1, &sw), (2, &dw), (3, &gw), (4, &bw)], [g.groups as u32, 1, 1]);
    Ok(())
}

/// Per group of a band: `(mean, Σ(x − mean)²)` into `stats` `[groups, 2]`,
/// the part of a GroupNorm's statistics that one band of a larger image contributes.
pub fn group_stats(gpu: &Gpu, sink: &mut dyn Sink, src: Mat<'_>, stats: Mat<'_>, g: Groups) -> Result<(), GpuError> {
    let (sw, tw) = (g.input(gpu, src)?, g.stats(gpu, stats)?);
    let params = k::NormParams { shift_offset: tw.local, ..g.params(&sw, 0)? };
    dispatch(gpu, sink, &k::GROUP_STATS, &[], &params, &[(1, &sw), (5, &tw)], [g.groups as u32, 1, 1]);
    Ok(())
}

/// GroupNorm with given statistics: `stats` `[groups, 2]` holds each group's
/// `(mean, 1/√(var + eps))`; affine, SiLU after when `silu`.
#[allow(clippy::too_many_arguments)]
pub fn group_norm_apply(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    src: Mat<'_>,
    stats: Mat<'_>,
    gamma: Weight<'_>,
    beta: Weight<'_>,
    dst: Mat<'_>,
    g: Groups,
    silu: bool,
) -> Result<(), GpuError> {
    let (sw, dw, tw) = (g.input(gpu, src)?, g.output(gpu, dst)?, g.stats(gpu, stats)?);
    let (gw, bw) = g.affine(gpu, gamma, beta)?;
    let params = k::NormParams { w_offset: gw.local, silu: silu as u32, shift_offset: tw.local, ..g.params(&sw, dw.local)? };
    let constants = [("WEIGHT_BF16", gamma.dtype.constant())];
    let bindings = [(1, &sw), (2, &dw), (3, &gw), (4, &bw), (5, &tw)];
    dispatch(gpu, sink, &k::GROUP_NORM_APPLY, &constants, &params, &bindings, [g.groups as u32, 1, 1]);
    Ok(())
}

/// A DF11 group's arrays on the device (byte arrays padded to whole words
/// plus look-ahead) and, on the host, its block output positions.
#[derive(Debug, Clone, Copy)]
pub struct Df11Arrays<'a> {
    pub luts: &'a wgpu::Buffer,
    pub n_luts: u32,
    pub stream: &'a wgpu::Buffer,
    pub n_bytes: u64,
    pub sign_mantissa: &'a wgpu::Buffer,
    pub n_elements: u64,
    pub gaps: &'a wgpu::Buffer,
    pub positions: &'a wgpu::Buffer,
    /// `n_blocks + 1` entries: the first element of each 4096-byte block, then `n_elements`.
    pub host_positions: &'a [u32],
}

/// Expands a DF11 group into bf16 elements `[out_base, out_base + n_elements)`
/// of `slot` (`out_base` a multiple of 128, so the group starts on a binding
/// boundary): the group's words are zeroed, then decoded block by block, in
/// as few dispatches as the binding limit allows.
pub fn df11_decode(gpu: &Gpu, sink: &mut dyn Sink, g: Df11Arrays<'_>, slot: &wgpu::Buffer, out_base: u64) -> Result<(), GpuError> {
    let block_bytes = k::DF11_BLOCK_BYTES;
    let n_blocks = g.n_bytes.div_ceil(block_bytes);
    if !out_base.is_multiple_of(128) || g.host_positions.len() as u64 != n_blocks + 1 || g.n_luts < 2 {
        return Err(GpuError::UnsupportedShape(format!(
            "DF11 group: {} positions for {n_blocks} blocks, {} tables, slot offset {out_base}",
            g.host_positions.len(),
            g.n_luts
        )));
    }
    if g.n_elements == 0 {
        return Ok(());
    }
    let pos = |b: u64| g.host_positions[b as usize] as u64;
    // Look-ahead past a chunk's last byte: one code of up to 32 bits plus the byte it starts in.
    const LOOK_AHEAD: u64 = 16;
    let budget = gpu.max_binding().saturating_sub(gpu.binding_alignment());
    let fits = |b0: u64, b1: u64| {
        let elements = pos(b1) - pos(b0);
        (b1 - b0) * block_bytes + LOOK_AHEAD <= budget && 2 * elements + 4 <= budget && elements <= budget
    };
    let mut chunks = Vec::new();
    let mut b0 = 0;
    while b0 < n_blocks {
        if !fits(b0, b0 + 1) {
            return Err(GpuError::BindingTooLarge { what: "DF11 block", bytes: 2 * (pos(b0 + 1) - pos(b0)), limit: gpu.max_binding() });
        }
        let mut b1 = b0 + 1;
        while b1 < n_blocks && fits(b0, b1 + 1) {
            b1 += 1;
        }
        chunks.push((b0, b1));
        b0 = b1;
    }
    let base = to_u32(out_base, "DF11 slot offset")?;
    let out_window = |first: u64, end: u64| window(gpu, slot, 2, out_base + first, out_base + end, "DF11 output");
    // Every word is zeroed before any chunk ORs a half into a word it shares with the previous chunk.
    for &(b0, b1) in &chunks {
        let (first, end) = (pos(b0), pos(b1).min(g.n_elements));
        if first >= end {
            continue;
        }
        let ow = out_window(first, end)?;
        let params = k::Df11Params {
            out_base: base,
            out_shift: to_u32(out_base + first - ow.local as u64, "DF11 output window")?,
            clear_first: to_u32(first, "DF11 elements")?,
            clear_end: to_u32(end, "DF11 elements")?,
            ..Default::default()
        };
        let words = (end - first).div_ceil(2) + 1;
        dispatch(gpu, sink, &k::DF11_CLEAR, &[], &params, &[(6, &ow)], k::wrapped_grid(words.div_ceil(256)));
    }
    let lw = window(gpu, g.luts, 4, 0, g.n_luts as u64 * 64, "DF11 tables")?;
    for &(b0, b1) in &chunks {
        let (first, end) = (pos(b0), pos(b1).min(g.n_elements));
        let sw = window(gpu, g.stream, 1, b0 * block_bytes, (b1 * block_bytes + LOOK_AHEAD).min(g.stream.size()), "DF11 exponents")?;
        let mw = window(gpu, g.sign_mantissa, 1, first, end.max(first + 1), "DF11 signs and mantissas")?;
        let gw = window(gpu, g.gaps, 1, b0 * 320, (b1 * 320 + 2).min(g.gaps.size()), "DF11 gaps")?;
        let pw = window(gpu, g.positions, 4, b0, b1 + 1, "DF11 positions")?;
        let ow = out_window(first, end.max(first + 1))?;
        let shift = |start: u64, w: &Window<'_>, what| to_u32(start - w.local as u64, what);
        let params = k::Df11Params {
            n_luts: g.n_luts,
            n_bytes: to_u32(g.n_bytes, "DF11 exponent bytes")?,
            n_elements: to_u32(g.n_elements, "DF11 elements")?,
            block0: to_u32(b0, "DF11 blocks")?,
            stream_shift: shift(b0 * block_bytes, &sw, "DF11 exponents")?,
            sign_shift: shift(first, &mw, "DF11 signs")?,
            gaps_shift: shift(b0 * 320, &gw, "DF11 gaps")?,
            positions_shift: shift(b0, &pw, "DF11 positions")?,
            out_base: base,
            out_shift: shift(out_base + first, &ow, "DF11 output")?,
            clear_first: 0,
            clear_end: 0,
        };
        let bindings = [(1, &lw), (2, &sw), (3, &mw), (4, &gw), (5, &pw), (6, &ow)];
        dispatch(gpu, sink, &k::DF11_DECODE, &[], &params, &bindings, k::wrapped_grid(b1 - b0));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// FLUX.2: pairs (x[2i], x[2i+1]).
    Interleaved,
    /// Qwen3: pairs (x[i], x[i + d/2]).
    RotateHalf,
}

/// RoPE in place on `[tokens, heads, head_dim]` rows of `data`; token `t`
/// reads row `table_row + t` of the `[rows, head_dim]` cos/sin tables.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    style: RopeStyle,
    data: Mat<'_>,
    cos: &wgpu::Buffer,
    sin: &wgpu::Buffer,
    table_row: u64,
    tokens: u64,
    heads: u64,
    head_dim: u64,
) -> Result<(), GpuError> {
    if tokens == 0 {
        return Ok(());
    }
    let data_rows = Rows::mat(data, heads * head_dim, "rope data");
    let table = |buf| Rows { buf, elem_bytes: 4, offset: table_row * head_dim, stride: head_dim, width: head_dim, what: "rope table" };
    let (cos_rows, sin_rows) = (table(cos), table(sin));
    let chunk = rows_per_chunk(gpu, tokens, &[data_rows, cos_rows, sin_rows], 1)?;
    let kernel = match style {
        RopeStyle::Interleaved => &k::ROPE_INTERLEAVED,
        RopeStyle::RotateHalf => &k::ROPE_HALF,
    };
    for t0 in (0..tokens).step_by(chunk as usize) {
        let t1 = (t0 + chunk).min(tokens);
        let dw = data_rows.window(gpu, t0, t1)?;
        let cw = cos_rows.window(gpu, t0, t1)?;
        let sw = sin_rows.window(gpu, t0, t1)?;
        if cw.local != sw.local {
            return Err(GpuError::UnsupportedShape("rope cos and sin tables must be equally aligned".into()));
        }
        let params = k::RopeParams {
            tokens: to_u32(t1 - t0, "rope tokens")?,
            heads: to_u32(heads, "rope heads")?,
            head_dim: to_u32(head_dim, "rope head dim")?,
            offset: dw.local,
            token_stride: to_u32(data.stride, "rope stride")?,
            table_row: cw.local / head_dim as u32,
            _pad: [0; 2],
        };
        let grid = grid64((t1 - t0) * heads * (head_dim / 2));
        dispatch(gpu, sink, kernel, &[], &params, &[(1, &dw), (2, &cw), (3, &sw)], grid);
    }
    Ok(())
}

/// Shape and masking of one attention call over `[len, heads, head_dim]` views.
#[derive(Debug, Clone, Copy)]
pub struct Attention {
    pub q_len: u64,
    pub kv_len: u64,
    pub q_heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub scale: f32,
    pub causal: bool,
}

/// `o = softmax(q·kᵀ·scale + mask)·v`; `key_keep[j] == 0` masks key `j`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    q: Mat<'_>,
    kmat: Mat<'_>,
    v: Mat<'_>,
    key_keep: Option<&wgpu::Buffer>,
    o: Mat<'_>,
    lse: Option<Mat<'_>>,
    s: Attention,
) -> Result<(), GpuError> {
    if s.head_dim > k::ATTENTION_MAX_HEAD_DIM as u64 || s.kv_heads == 0 || !s.q_heads.is_multiple_of(s.kv_heads) {
        return Err(GpuError::UnsupportedShape(format!(
            "attention with {} query heads, {} kv heads, head dim {} (max {})",
            s.q_heads,
            s.kv_heads,
            s.head_dim,
            k::ATTENTION_MAX_HEAD_DIM
        )));
    }
    if s.q_len == 0 || s.kv_len == 0 {
        return Ok(());
    }
    let kw = Rows::mat(kmat, s.kv_heads * s.head_dim, "attention keys").window(gpu, 0, s.kv_len)?;
    let vw = Rows::mat(v, s.kv_heads * s.head_dim, "attention values").window(gpu, 0, s.kv_len)?;
    let mw = match key_keep {
        Some(m) => window(gpu, m, 4, 0, s.kv_len, "attention mask")?,
        None => window(gpu, gpu.placeholder(), 4, 0, 1, "placeholder")?,
    };
    let q_rows = Rows::mat(q, s.q_heads * s.head_dim, "attention queries");
    let o_rows = Rows::mat(o, s.q_heads * s.head_dim, "attention output");
    let lse_rows = lse.map(|l| Rows { buf: l.buf, elem_bytes: 4, offset: l.offset, stride: s.q_heads, width: s.q_heads, what: "attention log-sum-exp" });
    let per_group = k::ATTENTION_QUERIES_PER_GROUP as u64;
    let chunk = match &lse_rows {
        Some(l) => rows_per_chunk(gpu, s.q_len, &[q_rows, o_rows, *l], per_group)?,
        None => rows_per_chunk(gpu, s.q_len, &[q_rows, o_rows], per_group)?,
    };
    for q0 in (0..s.q_len).step_by(chunk as usize) {
        let q1 = (q0 + chunk).min(s.q_len);
        let qw = q_rows.window(gpu, q0, q1)?;
        let ow = o_rows.window(gpu, q0, q1)?;
        // Without a log-sum-exp output the binding takes the output's window, unwritten.
        let lw = match &lse_rows {
            Some(l) => l.window(gpu, q0, q1)?,
            None => o_rows.window(gpu, q0, q1)?,
        };
        let params = k::AttentionParams {
            q_len: to_u32(q1 - q0, "attention queries")?,
            kv_len: to_u32(s.kv_len, "attention keys")?,
            q_heads: to_u32(s.q_heads, "attention heads")?,
            kv_heads: to_u32(s.kv_heads, "attention kv heads")?,
            head_dim: s.head_dim as u32,
            q_offset: qw.local,
            q_stride: to_u32(q.stride, "attention q stride")?,
            k_offset: kw.local,
            k_stride: to_u32(kmat.stride, "attention k stride")?,
            v_offset: vw.local,
            v_stride: to_u32(v.stride, "attention v stride")?,
            o_offset: ow.local,
            o_stride: to_u32(o.stride, "attention o stride")?,
            scale: s.scale,
            causal: s.causal as u32,
            use_mask: key_keep.is_some() as u32,
            mask_offset: mw.local,
            q_position: to_u32(q0, "attention query position")?,
            lse_offset: lw.local,
            write_lse: lse_rows.is_some() as u32,
        };
        let grid = [to_u32((q1 - q0).div_ceil(per_group), "attention query blocks")?, s.q_heads as u32, 1];
        let bindings = [(1, &qw), (2, &kw), (3, &vw), (4, &mw), (5, &ow), (6, &lw)];
        let slots = s.head_dim.div_ceil(64).max(1) as u32;
        dispatch(gpu, sink, &k::ATTENTION, &[("SLOTS", slots)], &params, &bindings, grid);
    }
    Ok(())
}

/// The elementwise ops over `[rows, cols]` views.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Elementwise {
    /// dst = silu(a)
    Silu,
    /// dst = silu(a)·b
    SwiGlu,
    /// dst += gate ⊙ a (gate: one cols-wide row, broadcast)
    GatedResidual,
    /// dst = a + b
    Add,
    /// dst += a
    AddInPlace,
    /// dst = a·s
    Scale(f32),
    /// dst += s·a
    Axpy(f32),
    /// dst = a (concatenation and split along features)
    Copy,
}

/// Runs `op` over `rows × cols`; `b` is the second operand (or the gate row for `GatedResidual`).
#[allow(clippy::too_many_arguments)]
pub fn elementwise(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    op: Elementwise,
    a: Mat<'_>,
    b: Option<Mat<'_>>,
    dst: Mat<'_>,
    rows: u64,
    cols: u64,
) -> Result<(), GpuError> {
    let kernel = match op {
        Elementwise::Silu => &k::SILU,
        Elementwise::SwiGlu => &k::SWIGLU,
        Elementwise::GatedResidual => &k::GATED_RESIDUAL,
        Elementwise::Add => &k::ADD,
        Elementwise::AddInPlace => &k::ADD_INPLACE,
        Elementwise::Scale(_) => &k::SCALE,
        Elementwise::Axpy(_) => &k::AXPY,
        Elementwise::Copy => &k::COPY,
    };
    let needs_b = kernel.storage.len() == 3;
    let b = match (needs_b, b) {
        (true, Some(b)) => Some(b),
        (false, None) => None,
        _ => return Err(GpuError::UnsupportedShape(format!("{op:?} takes {} inputs", 1 + needs_b as u32))),
    };
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let a_rows = Rows::mat(a, cols, "elementwise input");
    let d_rows = Rows::mat(dst, cols, "elementwise output");
    let gate = op == Elementwise::GatedResidual;
    let b_rows = b.filter(|_| !gate).map(|b| Rows::mat(b, cols, "elementwise input"));
    let operands: Vec<Rows<'_>> = [a_rows, d_rows].into_iter().chain(b_rows).collect();
    let chunk = rows_per_chunk(gpu, rows, &operands, 1)?;
    for r0 in (0..rows).step_by(chunk as usize) {
        let r1 = (r0 + chunk).min(rows);
        let aw = a_rows.window(gpu, r0, r1)?;
        let dw = d_rows.window(gpu, r0, r1)?;
        let bw = match (b, b_rows) {
            (Some(g), None) => Some(window(gpu, g.buf, 4, g.offset, g.offset + cols, "gate")?),
            (_, Some(br)) => Some(br.window(gpu, r0, r1)?),
            (None, None) => None,
        };
        let params = k::ElementwiseParams {
            rows: to_u32(r1 - r0, "elementwise rows")?,
            cols: to_u32(cols, "elementwise cols")?,
            a_offset: aw.local,
            a_stride: to_u32(a.stride, "elementwise stride")?,
            b_offset: if gate { 0 } else { bw.as_ref().map_or(0, |w| w.local) },
            b_stride: to_u32(b.map_or(0, |b| b.stride), "elementwise stride")?,
            dst_offset: dw.local,
            dst_stride: to_u32(dst.stride, "elementwise stride")?,
            scalar: match op {
                Elementwise::Scale(s) | Elementwise::Axpy(s) => s,
                _ => 0.0,
            },
            gate_offset: if gate { bw.as_ref().map_or(0, |w| w.local) } else { 0 },
            _pad: [0; 2],
        };
        let mut storage = vec![(1, &aw)];
        if let Some(w) = &bw {
            storage.push((2, w));
        }
        storage.push((3, &dw));
        dispatch(gpu, sink, kernel, &[], &params, &storage, grid64((r1 - r0) * cols));
    }
    Ok(())
}

/// `dst[c, r] = a[r, c]`: between `[tokens, features]` and `[channels, pixels]`.
pub fn transpose(gpu: &Gpu, sink: &mut dyn Sink, a: Mat<'_>, dst: Mat<'_>, rows: u64, cols: u64) -> Result<(), GpuError> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let aw = Rows::mat(a, cols, "transpose input").window(gpu, 0, rows)?;
    let dw = Rows::mat(dst, rows, "transpose output").window(gpu, 0, cols)?;
    let params = k::ElementwiseParams {
        rows: to_u32(rows, "transpose rows")?,
        cols: to_u32(cols, "transpose cols")?,
        a_offset: aw.local,
        a_stride: to_u32(a.stride, "transpose stride")?,
        dst_offset: dw.local,
        dst_stride: to_u32(dst.stride, "transpose stride")?,
        ..Default::default()
    };
    dispatch(gpu, sink, &k::TRANSPOSE, &[], &params, &[(1, &aw), (3, &dw)], grid64(rows * cols));
    Ok(())
}

pub use flux_lite_core::reference::ConvShape;

/// 2-D convolution with bias over contiguous `[channels, height, width]`
/// tensors, split over output channels when the output or weights are large.
pub fn conv2d(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    x: Mat<'_>,
    w: Weight<'_>,
    bias: Weight<'_>,
    y: Mat<'_>,
    s: ConvShape,
) -> Result<(), GpuError> {
    if w.dtype != bias.dtype {
        return Err(GpuError::UnsupportedShape("conv weight and bias must share a dtype".into()));
    }
    let in_elems = (s.in_channels * s.height * s.width) as u64;
    let xw = window(gpu, x.buf, 4, x.offset, x.offset + in_elems, "conv input")?;
    let plane = (s.out_height * s.out_width) as u64;
    let per_out = (s.in_channels * s.kernel * s.kernel) as u64;
    let eb = w.dtype.bytes();
    let y_rows = Rows { buf: y.buf, elem_bytes: 4, offset: y.offset, stride: plane, width: plane, what: "conv output" };
    let w_rows = Rows { buf: w.buf, elem_bytes: eb, offset: w.offset, stride: per_out, width: per_out, what: "conv weight" };
    let b_rows = Rows { buf: bias.buf, elem_bytes: eb, offset: bias.offset, stride: 1, width: 1, what: "conv bias" };
    let cout = s.out_channels as u64;
    let chunk = rows_per_chunk(gpu, cout, &[y_rows, w_rows, b_rows], 1)?;
    let [tile_co, tile_px] = k::GEMM_TILE.map(u64::from);
    for c0 in (0..cout).step_by(chunk as usize) {
        let c1 = (c0 + chunk).min(cout);
        let (yw, ww, bw) = (y_rows.window(gpu, c0, c1)?, w_rows.window(gpu, c0, c1)?, b_rows.window(gpu, c0, c1)?);
        let paired = ww.local.is_multiple_of(2) && per_out.is_multiple_of(2);
        let constants = [("WEIGHT_BF16", w.dtype.constant()), ("W_PAIRED", paired as u32)];
        let params = k::ConvParams {
            in_channels: s.in_channels as u32,
            height: s.height as u32,
            width: s.width as u32,
            out_channels: (c1 - c0) as u32,
            out_height: s.out_height as u32,
            out_width: s.out_width as u32,
            kernel: s.kernel as u32,
            stride: s.stride as u32,
            pad_top: s.pad_top as u32,
            pad_left: s.pad_left as u32,
            x_offset: xw.local,
            w_offset: ww.local,
            b_offset: bw.local,
            y_offset: yw.local,
            _pad: [0; 2],
        };
        let tiles = (c1 - c0).div_ceil(tile_co) * plane.div_ceil(tile_px);
        dispatch(gpu, sink, &k::CONV2D, &constants, &params, &[(1, &xw), (2, &ww), (3, &bw), (4, &yw)], k::wrapped_grid(tiles));
    }
    Ok(())
}

/// Nearest-neighbour ×2 upsampling of a contiguous `[channels, height, width]` tensor.
#[allow(clippy::too_many_arguments)]
pub fn upsample_nearest2x(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    x: Mat<'_>,
    y: Mat<'_>,
    channels: u64,
    height: u64,
    width: u64,
) -> Result<(), GpuError> {
    let plane = height * width;
    let x_rows = Rows { buf: x.buf, elem_bytes: 4, offset: x.offset, stride: plane, width: plane, what: "upsample input" };
    let y_rows = Rows { buf: y.buf, elem_bytes: 4, offset: y.offset, stride: 4 * plane, width: 4 * plane, what: "upsample output" };
    let chunk = rows_per_chunk(gpu, channels, &[x_rows, y_rows], 1)?;
    for c0 in (0..channels).step_by(chunk as usize) {
        let c1 = (c0 + chunk).min(channels);
        let (xw, yw) = (x_rows.window(gpu, c0, c1)?, y_rows.window(gpu, c0, c1)?);
        let params = k::ConvParams {
            in_channels: (c1 - c0) as u32,
            height: height as u32,
            width: width as u32,
            x_offset: xw.local,
            y_offset: yw.local,
            ..Default::default()
        };
        dispatch(gpu, sink, &k::UPSAMPLE_NEAREST2X, &[], &params, &[(1, &xw), (4, &yw)], grid64((c1 - c0) * 4 * plane));
    }
    Ok(())
}

/// The BatchNorm statistics of the patchified latent (`bn.running_mean`, `bn.running_var`).
#[derive(Debug, Clone, Copy)]
pub struct LatentStats<'a> {
    pub mean: Weight<'a>,
    pub var: Weight<'a>,
    pub eps: f32,
}

/// Packed latents `[height·width tokens, 4·channels]` to the VAE latent
/// `[channels, 2·height, 2·width]`: `x·√(var + eps) + mean` per patchified
/// channel, then unpatchify.
#[allow(clippy::too_many_arguments)]
pub fn denorm_unpatchify(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    packed: Mat<'_>,
    stats: LatentStats<'_>,
    latent: Mat<'_>,
    channels: u64,
    height: u64,
    width: u64,
) -> Result<(), GpuError> {
    if stats.mean.dtype != stats.var.dtype {
        return Err(GpuError::UnsupportedShape("the latent BatchNorm mean and variance must share a dtype".into()));
    }
    let n = 4 * channels * height * width;
    if n == 0 {
        return Ok(());
    }
    let sw = window(gpu, packed.buf, 4, packed.offset, packed.offset + n, "packed latents")?;
    let dw = window(gpu, latent.buf, 4, latent.offset, latent.offset + n, "unpatchified latent")?;
    let eb = stats.mean.dtype.bytes();
    let (m, v) = (stats.mean, stats.var);
    let mw = window(gpu, m.buf, eb, m.offset, m.offset + 4 * channels, "latent BatchNorm mean")?;
    let vw = window(gpu, v.buf, eb, v.offset, v.offset + 4 * channels, "latent BatchNorm variance")?;
    if mw.local != vw.local {
        // The kernel indexes both statistics with one offset.
        return Err(GpuError::UnsupportedShape("the latent BatchNorm mean and variance must be equally aligned".into()));
    }
    let params = k::VaeParams {
        channels: to_u32(channels, "latent channels")?,
        height: to_u32(height, "latent token rows")?,
        width: to_u32(width, "latent token columns")?,
        src_offset: sw.local,
        dst_offset: dw.local,
        stats_offset: mw.local,
        count: 0,
        eps: stats.eps,
    };
    let constants = [("WEIGHT_BF16", m.dtype.constant())];
    dispatch(gpu, sink, &k::DENORM_UNPATCHIFY, &constants, &params, &[(1, &sw), (2, &mw), (3, &vw), (4, &dw)], grid64(n));
    Ok(())
}

/// `dst = round(clamp(src/2 + 1/2, 0, 1)·255)` over `count` contiguous values.
pub fn pixel_levels(gpu: &Gpu, sink: &mut dyn Sink, src: Mat<'_>, dst: Mat<'_>, count: u64) -> Result<(), GpuError> {
    if count == 0 {
        return Ok(());
    }
    let sw = window(gpu, src.buf, 4, src.offset, src.offset + count, "decoded image")?;
    let dw = window(gpu, dst.buf, 4, dst.offset, dst.offset + count, "pixel levels")?;
    let params = k::VaeParams {
        src_offset: sw.local,
        dst_offset: dw.local,
        count: to_u32(count, "pixel values")?,
        ..Default::default()
    };
    dispatch(gpu, sink, &k::PIXEL_LEVELS, &[], &params, &[(1, &sw), (4, &dw)], grid64(count));
    Ok(())
}

/// The arithmetic ceiling: `workgroups` of 256 invocations, each running
/// `iterations` of [`k::FMA_PEAK_FMAS_PER_ITERATION`] FMAs; one f32 per
/// invocation lands in `sink` (at least `256·workgroups` values).
pub fn fma_peak(gpu: &Gpu, out: &mut dyn Sink, sink: &wgpu::Buffer, workgroups: u64, iterations: u32) -> Result<(), GpuError> {
    let count = to_u32(workgroups * 256, "fma_peak invocations")?;
    let sw = window(gpu, sink, 4, 0, count as u64, "fma_peak output")?;
    let params = k::PeakParams { iterations, count, _pad: [0; 2] };
    dispatch(gpu, out, &k::FMA_PEAK, &[], &params, &[(1, &sw)], k::wrapped_grid(workgroups));
    Ok(())
}

/// The memory ceiling: `vec4s` four-float values copied from `src` to `dst`
/// (both at least that long, within one binding).
pub fn copy_peak(gpu: &Gpu, out: &mut dyn Sink, src: &wgpu::Buffer, dst: &wgpu::Buffer, vec4s: u64) -> Result<(), GpuError> {
    let count = to_u32(vec4s, "copy_peak values")?;
    let sw = window(gpu, src, 16, 0, vec4s, "copy_peak source")?;
    let dw = window(gpu, dst, 16, 0, vec4s, "copy_peak destination")?;
    let params = k::PeakParams { iterations: 0, count, _pad: [0; 2] };
    dispatch(gpu, out, &k::COPY_PEAK, &[], &params, &[(2, &sw), (3, &dw)], k::wrapped_grid(vec4s.div_ceil(256)));
    Ok(())
}
