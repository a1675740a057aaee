//! Normalisations: RMSNorm (whole rows and per head), LayerNorm with
//! modulation (GroupNorm's launchers: `group_norm.rs`).
//! Shader: `norm.wgsl` beside this file.

use crate::kernel::{kernel, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::device::Gpu;
use crate::dispatch::{dispatch, row_chunks, to_u32, window, Launch, Rows, Sink, Window};
use crate::error::GpuError;
use crate::view::{HalfMat, Mat, Weight};
use crate::kernels::rope::{RopeStyle, RopeTables};
use bytemuck::{Pod, Zeroable};

/// `norm.wgsl` — every normalisation. Rows are (token, head) pairs for
/// RMSNorm and LayerNorm; for GroupNorm `rows` = channels and `d` = pixels.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct NormParams {
    pub rows: u32,
    pub d: u32,
    pub heads: u32,
    pub src_offset: u32,
    pub src_stride: u32,
    pub dst_offset: u32,
    pub dst_stride: u32,
    pub w_offset: u32,
    pub eps: f32,
    pub shift_offset: u32,
    pub scale_offset: u32,
    pub groups: u32,
    pub silu: u32,
    /// The f16-output LayerNorm's: where its rows' range scales start.
    pub scales_offset: u32,
    /// The RMSNorm + RoPE's: the tables' row of the first token.
    pub table_row: u32,
    /// The LayerNorm + modulation's: rows from `later_row` on (of the
    /// dispatch) take the shift and scale at the later offsets instead.
    pub later_row: u32,
    pub later_shift_offset: u32,
    pub later_scale_offset: u32,
    /// The f16 RMSNorm + RoPE's: values a scale covers, and a token's scales' stride.
    pub piece: u32,
    pub scales_stride: u32,
    /// The GroupNorm's: pixels an image row (the merge's: values a row's moments cover).
    pub width: u32,
    /// Where an f16 source's piece scales start (the GroupNorm's).
    pub src_scales: u32,
    pub _pad: [u32; 2],
}

pub const RMS_NORM: Kernel =
    kernel(Module::Norm, "rms_norm", [128, 1, 1], &[(1, RW), (2, RW), (3, R)], size_of::<NormParams>(), true);
pub const RMS_NORM_INPLACE: Kernel =
    kernel(Module::Norm, "rms_norm_inplace", [128, 1, 1], &[(2, RW), (3, R)], size_of::<NormParams>(), true);
pub const LAYER_NORM_MODULATE: Kernel =
    kernel(Module::Norm, "layer_norm_modulate", [128, 1, 1], &[(1, RW), (2, RW), (5, RW)], size_of::<NormParams>(), false);
/// The row norms for CPU adapters (`*_lanes` in norm.wgsl): one row per
/// invocation, [`LANE_ROWS`] rows a workgroup, no barriers.
pub const RMS_NORM_LANES: Kernel = Kernel { entry: "rms_norm_lanes", workgroup_size: [64, 1, 1], ..RMS_NORM };
pub const RMS_NORM_INPLACE_LANES: Kernel = Kernel { entry: "rms_norm_inplace_lanes", workgroup_size: [64, 1, 1], ..RMS_NORM_INPLACE };
pub const LAYER_NORM_MODULATE_LANES: Kernel = Kernel { entry: "layer_norm_modulate_lanes", workgroup_size: [64, 1, 1], ..LAYER_NORM_MODULATE };
const LANE_ROWS: u64 = 64;

/// The per-head RMSNorm then FLUX.2's interleaved RoPE, in place, one pass
/// (norm.wgsl's `rms_norm_rope`; the tables at bindings 8 and 9).
pub const RMS_NORM_ROPE: Kernel = kernel(Module::Norm, "rms_norm_rope", [128, 1, 1], &[(2, RW), (3, R), (8, R), (9, R)], size_of::<NormParams>(), true);
pub const RMS_NORM_ROPE_LANES: Kernel = Kernel { entry: "rms_norm_rope_lanes", workgroup_size: [64, 1, 1], ..RMS_NORM_ROPE };
/// The same in place on f16 rows in pieces (`norm_half.wgsl`'s
/// `rms_norm_rope_half`: the words and scales at bindings 6 and 7).
pub const RMS_NORM_ROPE_HALF: Kernel =
    kernel(Module::NormHalf, "rms_norm_rope_half", [128, 1, 1], &[(3, R), (6, RW), (7, RW), (8, R), (9, R)], size_of::<NormParams>(), true);

/// The matrix tier's RMSNorm writing f16 rows under their range scales
/// (`norm_half.wgsl`) at bindings 6 and 7, and the same for CPU adapters.
pub const RMS_NORM_HALF: Kernel =
    kernel(Module::NormHalf, "rms_norm_half", [128, 1, 1], &[(1, RW), (3, R), (6, RW), (7, RW)], size_of::<NormParams>(), true);
pub const RMS_NORM_HALF_LANES: Kernel = Kernel { entry: "rms_norm_half_lanes", workgroup_size: [64, 1, 1], ..RMS_NORM_HALF };

/// The matrix tier's LayerNorm + modulation writing f16 rows under their
/// range scales (`norm_half.wgsl`) at bindings 6 and 7, and the same for CPU adapters.
pub const LAYER_NORM_MODULATE_HALF: Kernel =
    kernel(Module::NormHalf, "layer_norm_modulate_half", [128, 1, 1], &[(1, RW), (5, RW), (6, RW), (7, RW)], size_of::<NormParams>(), false);
pub const LAYER_NORM_MODULATE_HALF_LANES: Kernel =
    Kernel { entry: "layer_norm_modulate_half_lanes", workgroup_size: [64, 1, 1], ..LAYER_NORM_MODULATE_HALF };

/// [`rms_norm`] writing f16 rows under their range scales into `dst`
/// ([`HalfMat`], one scale a row): the input of a product on the matrix
/// tier, as the product would round [`rms_norm`]'s output. Whole rows
/// (`s.heads` 1) of an even width.
pub fn rms_norm_half(gpu: &Gpu, sink: &mut dyn Sink, src: Mat<'_>, w: Weight<'_>, dst: HalfMat<'_>, s: RowNorm) -> Result<(), GpuError> {
    if s.heads != 1 || !s.d.is_multiple_of(2) || dst.piece.is_some() {
        return Err(GpuError::UnsupportedShape(format!("f16 rows of {} heads of {} values (whole rows of an even width, one scale a row)", s.heads, s.d)));
    }
    row_norm(gpu, sink, [&RMS_NORM_HALF, &RMS_NORM_HALF_LANES], Some(src), NormOut::Half(dst), NormExtra::Weight(w), s)
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
    row_norm(gpu, sink, [&RMS_NORM, &RMS_NORM_LANES], Some(src), NormOut::F32(dst), NormExtra::Weight(w), s)
}

/// RMSNorm in place (per-head q/k norms).
pub fn rms_norm_inplace(gpu: &Gpu, sink: &mut dyn Sink, data: Mat<'_>, w: Weight<'_>, s: RowNorm) -> Result<(), GpuError> {
    row_norm(gpu, sink, [&RMS_NORM_INPLACE, &RMS_NORM_INPLACE_LANES], None, NormOut::F32(data), NormExtra::Weight(w), s)
}

/// `dst = LN(src)·(1 + scale) + shift`; `shift` and `scale` are `d`-wide rows of the modulation buffer.
pub fn layer_norm_modulate(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    src: Mat<'_>,
    modulation: Modulation<'_>,
    dst: Mat<'_>,
    s: RowNorm,
) -> Result<(), GpuError> {
    modulated(gpu, sink, src, modulation, NormOut::F32(dst), s)
}

/// A LayerNorm's modulation: `shift` and `scale` rows (one broadcast row
/// each, in one buffer), and where `later` says, from a row on another pair
/// (a second stream's rows normalised in the same pass).
#[derive(Debug, Clone, Copy)]
pub struct Modulation<'a> {
    pub shift: Mat<'a>,
    pub scale: Mat<'a>,
    pub later: Option<LaterModulation<'a>>,
}

/// The shift and scale that rows `row ..` of a [`Modulation`] take.
#[derive(Debug, Clone, Copy)]
pub struct LaterModulation<'a> {
    pub row: u64,
    pub shift: Mat<'a>,
    pub scale: Mat<'a>,
}

impl<'a> Modulation<'a> {
    /// One shift and scale for every row.
    pub fn of(shift: Mat<'a>, scale: Mat<'a>) -> Self {
        Self { shift, scale, later: None }
    }
}

/// [`layer_norm_modulate`] writing f16 rows under their range scales into
/// `dst` ([`HalfMat`]): the input of a product on the matrix tier, as the
/// product would round it. Whole rows (`s.heads` 1) of an even width.
pub fn layer_norm_modulate_half(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    src: Mat<'_>,
    modulation: Modulation<'_>,
    dst: HalfMat<'_>,
    s: RowNorm,
) -> Result<(), GpuError> {
    if s.heads != 1 || !s.d.is_multiple_of(2) || dst.piece.is_some() {
        return Err(GpuError::UnsupportedShape(format!("f16 rows of {} heads of {} values (whole rows of an even width, one scale a row)", s.heads, s.d)));
    }
    modulated(gpu, sink, src, modulation, NormOut::Half(dst), s)
}

/// The LayerNorm + modulation into `out` on its kernel for the output.
fn modulated(gpu: &Gpu, sink: &mut dyn Sink, src: Mat<'_>, modulation: Modulation<'_>, out: NormOut<'_>, s: RowNorm) -> Result<(), GpuError> {
    let one_buffer = |m: &Mat<'_>| std::ptr::eq(m.buf, modulation.shift.buf);
    if !one_buffer(&modulation.scale) || modulation.later.is_some_and(|l| !one_buffer(&l.shift) || !one_buffer(&l.scale)) {
        return Err(GpuError::UnsupportedShape("shifts and scales must live in one modulation buffer".into()));
    }
    let kernels = match out {
        NormOut::F32(_) => [&LAYER_NORM_MODULATE, &LAYER_NORM_MODULATE_LANES],
        NormOut::Half(_) => [&LAYER_NORM_MODULATE_HALF, &LAYER_NORM_MODULATE_HALF_LANES],
    };
    row_norm(gpu, sink, kernels, Some(src), out, NormExtra::Modulation(modulation), s)
}

/// Where a row norm writes: f32 rows (binding 2), or f16 rows and their
/// range scales (bindings 6 and 7).
enum NormOut<'a> {
    F32(Mat<'a>),
    Half(HalfMat<'a>),
}

/// [`rms_norm_inplace`] over `[tokens, heads, d]` rows of `data`, then
/// interleaved-pair RoPE ([`crate::kernels::rope`]'s `RopeStyle::Interleaved`),
/// token `t` reading row `first_row + t` of the tables: the same bits as
/// the two, in one pass over the rows.
pub fn rms_norm_rope(gpu: &Gpu, sink: &mut dyn Sink, data: Mat<'_>, w: Weight<'_>, tables: RopeTables<'_>, s: RowNorm) -> Result<(), GpuError> {
    let (tokens, heads, d) = (s.tokens, s.heads, s.d);
    if tokens == 0 {
        return Ok(());
    }
    if !d.is_multiple_of(2) {
        return Err(GpuError::UnsupportedShape(format!("RoPE over heads of {d} values (even)")));
    }
    let kernel = if gpu.cpu_shaped_kernels() { &RMS_NORM_ROPE_LANES } else { &RMS_NORM_ROPE };
    let data_rows = Rows::mat(data, heads * d, "norm output");
    let table = |buf| Rows::packed(buf, 4, tables.first_row * d, d, "rope table");
    let (cos_rows, sin_rows) = (table(tables.cos), table(tables.sin));
    let ww = window(gpu, w.buf, w.dtype.bytes(), w.offset..w.offset + d, "norm weight")?;
    for rows in row_chunks(gpu, tokens, &[data_rows, cos_rows, sin_rows], 1)? {
        let (dw, cw, sw) = (data_rows.window(gpu, &rows)?, cos_rows.window(gpu, &rows)?, sin_rows.window(gpu, &rows)?);
        if cw.local != sw.local || !cw.local.is_multiple_of(d as u32) {
            return Err(GpuError::UnsupportedShape("rope cos and sin tables must be equally aligned on whole rows".into()));
        }
        let norm_rows = (rows.end - rows.start) * heads;
        let params = NormParams {
            rows: to_u32(norm_rows, "norm rows")?,
            d: to_u32(d, "norm width")?,
            heads: to_u32(heads, "norm heads")?,
            dst_offset: dw.local,
            dst_stride: to_u32(data.stride, "norm output stride")?,
            w_offset: ww.local,
            eps: s.eps,
            table_row: cw.local / d as u32,
            ..Default::default()
        };
        let grid = crate::kernel::wrapped_grid(if gpu.cpu_shaped_kernels() { norm_rows.div_ceil(LANE_ROWS) } else { norm_rows });
        let launch = Launch { kernel, constants: &[("WEIGHT_BF16", w.dtype.constant())], params, grid };
        dispatch(gpu, sink, launch, &[(2, &dw), (3, &ww), (8, &cw), (9, &sw)]);
    }
    Ok(())
}

/// [`rms_norm_rope`] in place on f16 rows in pieces ([`HalfMat::pieces`],
/// the queries' and keys' as their projections wrote them): each value
/// widened and scaled back, the row normed and rotated as [`rms_norm_rope`]
/// computes it (or, `RopeStyle::RotateHalf`, as [`rms_norm_inplace`] then
/// [`crate::kernels::rope`]'s rotate-half pairs compute it), and each piece
/// rounded again under its new range scale. A head's values whole pieces,
/// its pairs at most one a workgroup's invocation.
pub fn rms_norm_rope_half(gpu: &Gpu, sink: &mut dyn Sink, data: HalfMat<'_>, w: Weight<'_>, tables: RopeTables<'_>, style: RopeStyle, s: RowNorm) -> Result<(), GpuError> {
    let (tokens, heads, d) = (s.tokens, s.heads, s.d);
    let piece = data.piece.unwrap_or(0);
    if piece == 0 || !piece.is_multiple_of(2) || !d.is_multiple_of(piece) || d > 256 {
        return Err(GpuError::UnsupportedShape(format!("an f16 RMSNorm + RoPE over heads of {d} values in pieces of {piece} (whole even pieces, heads of at most 256)")));
    }
    if tokens == 0 {
        return Ok(());
    }
    let data_rows = Rows::mat(data.data, heads * d / 2, "norm output");
    let scale_rows = Rows::mat(data.scales, heads * d / piece, "norm output scales");
    let table = |buf| Rows::packed(buf, 4, tables.first_row * d, d, "rope table");
    let (cos_rows, sin_rows) = (table(tables.cos), table(tables.sin));
    let ww = window(gpu, w.buf, w.dtype.bytes(), w.offset..w.offset + d, "norm weight")?;
    for rows in row_chunks(gpu, tokens, &[data_rows, scale_rows, cos_rows, sin_rows], 1)? {
        let (dw, scw) = (data_rows.window(gpu, &rows)?, scale_rows.window(gpu, &rows)?);
        let (cw, sw) = (cos_rows.window(gpu, &rows)?, sin_rows.window(gpu, &rows)?);
        if cw.local != sw.local || !cw.local.is_multiple_of(d as u32) {
            return Err(GpuError::UnsupportedShape("rope cos and sin tables must be equally aligned on whole rows".into()));
        }
        let params = NormParams {
            rows: to_u32((rows.end - rows.start) * heads, "norm rows")?,
            d: to_u32(d, "norm width")?,
            heads: to_u32(heads, "norm heads")?,
            dst_offset: dw.local,
            dst_stride: to_u32(data.data.stride, "norm output stride")?,
            w_offset: ww.local,
            eps: s.eps,
            scales_offset: scw.local,
            table_row: cw.local / d as u32,
            piece: to_u32(piece, "norm piece")?,
            scales_stride: to_u32(data.scales.stride, "norm scales' stride")?,
            ..Default::default()
        };
        let constants = [("WEIGHT_BF16", w.dtype.constant()), ("ROTATE_HALF", (style == RopeStyle::RotateHalf) as u32)];
        let launch = Launch { kernel: &RMS_NORM_ROPE_HALF, constants: &constants, params, grid: crate::kernel::wrapped_grid((rows.end - rows.start) * heads) };
        dispatch(gpu, sink, launch, &[(3, &ww), (6, &dw), (7, &scw), (8, &cw), (9, &sw)]);
    }
    Ok(())
}

/// What a row norm reads besides its input: a weight, or modulation rows (shift, scale).
enum NormExtra<'a> {
    Weight(Weight<'a>),
    Modulation(Modulation<'a>),
}

/// One row norm: `[gpu_shaped, cpu_shaped]` are its two kernels, taken as
/// [`Gpu::cpu_shaped_kernels`] says.
fn row_norm(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    [gpu_shaped, cpu_shaped]: [&Kernel; 2],
    src: Option<Mat<'_>>,
    out: NormOut<'_>,
    extra: NormExtra<'_>,
    s: RowNorm,
) -> Result<(), GpuError> {
    if s.tokens == 0 {
        return Ok(());
    }
    let lanes = gpu.cpu_shaped_kernels();
    let kernel = if lanes { cpu_shaped } else { gpu_shaped };
    let width = s.heads * s.d;
    let src_rows = src.map(|m| Rows::mat(m, width, "norm input"));
    // f16 rows are half as many words; their scales one f32 a row.
    let (dst, dst_rows, scale_rows) = match out {
        NormOut::F32(m) => (m, Rows::mat(m, width, "norm output"), None),
        NormOut::Half(h) => (h.data, Rows::mat(h.data, width / 2, "norm output"), Some(Rows::mat(h.scales, 1, "norm output scales"))),
    };
    let operands: Vec<Rows<'_>> = src_rows.iter().copied().chain([dst_rows]).chain(scale_rows).collect();
    for rows in row_chunks(gpu, s.tokens, &operands, 1)? {
        let dw = dst_rows.window(gpu, &rows)?;
        let cw = match scale_rows {
            Some(r) => Some(r.window(gpu, &rows)?),
            None => None,
        };
        let sw = match src_rows {
            Some(r) => Some(r.window(gpu, &rows)?),
            None => None,
        };
        let mut params = NormParams {
            rows: to_u32((rows.end - rows.start) * s.heads, "norm rows")?,
            d: to_u32(s.d, "norm width")?,
            heads: to_u32(s.heads, "norm heads")?,
            src_offset: sw.as_ref().map_or(0, |w| w.local),
            src_stride: to_u32(src.map_or(0, |m| m.stride), "norm input stride")?,
            dst_offset: dw.local,
            dst_stride: to_u32(dst.stride, "norm output stride")?,
            eps: s.eps,
            scales_offset: cw.as_ref().map_or(0, |w| w.local),
            ..Default::default()
        };
        let (constants, extra_window) = match &extra {
            NormExtra::Weight(w) => {
                let ww = window(gpu, w.buf, w.dtype.bytes(), w.offset..w.offset + s.d, "norm weight")?;
                params.w_offset = ww.local;
                ([("WEIGHT_BF16", w.dtype.constant())].to_vec(), ww)
            }
            NormExtra::Modulation(m) => {
                let later = m.later.map_or([m.shift.offset, m.scale.offset], |l| [l.shift.offset, l.scale.offset]);
                let offsets = [m.shift.offset, m.scale.offset, later[0], later[1]];
                let lo = offsets.into_iter().min().unwrap_or(0);
                let hi = offsets.into_iter().max().unwrap_or(0) + s.d;
                let mw = window(gpu, m.shift.buf, 4, lo..hi, "modulation")?;
                let at = |offset: u64| mw.local + (offset - lo) as u32;
                params.shift_offset = at(m.shift.offset);
                params.scale_offset = at(m.scale.offset);
                // The later rows' place within this piece of rows (none: past every row).
                params.later_row = match m.later {
                    Some(l) => to_u32(l.row.saturating_sub(rows.start), "norm rows")?,
                    None => u32::MAX,
                };
                params.later_shift_offset = at(later[0]);
                params.later_scale_offset = at(later[1]);
                (Vec::new(), mw)
            }
        };
        let norm_rows = (rows.end - rows.start) * s.heads;
        let grid = crate::kernel::wrapped_grid(if lanes { norm_rows.div_ceil(LANE_ROWS) } else { norm_rows });
        let extra_slot = if matches!(extra, NormExtra::Weight(_)) { 3 } else { 5 };
        let mut storage: Vec<(u32, &Window<'_>)> = Vec::new();
        if let Some(w) = &sw {
            storage.push((1, w));
        }
        match &cw {
            Some(cw) => storage.extend([(6, &dw), (7, cw)]),
            None => storage.push((2, &dw)),
        }
        storage.push((extra_slot, &extra_window));
        dispatch(gpu, sink, Launch { kernel, constants: &constants, params, grid }, &storage);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::testing::*;

    fn both_shapes(check: impl Fn(&crate::Gpu)) {
        each_kernel_shape(gpu(), crate::testing::options(), check);
    }

    /// The RMSNorm + RoPE in one pass gives the bits of the per-head norm
    /// and the interleaved RoPE run one after the other, on rows from a
    /// column window of a wider tensor, tables from a later row, both shapes.
    #[test]
    fn rms_norm_rope_equals_the_norm_then_the_rope_bit_for_bit() {
        use crate::kernels::rope::{rope, RopeStyle, RopeTables};
        use crate::view::{HeadRows, Mat, Weight};
        both_shapes(|gpu| {
            let (tokens, heads, d, wide, from, first_row) = (37usize, 3usize, 32usize, 101usize, 6usize, 5usize);
            let mut rng = Rng::new(9);
            let mut x = rng.normals(tokens * wide, 2.0);
            x[4 * wide..5 * wide].iter_mut().for_each(|v| *v *= 1e4);
            let w = rng.bf16s(d, 1.0);
            let table_rows = first_row + tokens;
            let angles: Vec<f64> = (0..table_rows * d).map(|i| (i as f64 * 0.37).sin() * 3.0).collect();
            let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
            let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
            let (wb, cb, sb) = (gpu.upload_bf16("w", &w), gpu.upload_f32("cos", &cos), gpu.upload_f32("sin", &sin));
            let tables = RopeTables { cos: &cb, sin: &sb, first_row: first_row as u64 };
            let shape = super::RowNorm { tokens: tokens as u64, heads: heads as u64, d: d as u64, eps: 1e-6 };
            let run = |fused: bool| {
                let xb = gpu.upload_f32("x", &x);
                let data = Mat::new(&xb, wide as u64).cols_from(from as u64);
                run_and_read(gpu, &xb, tokens * wide, |enc| {
                    if fused {
                        return super::rms_norm_rope(gpu, enc, data, Weight::bf16(&wb), tables, shape);
                    }
                    super::rms_norm_inplace(gpu, enc, data, Weight::bf16(&wb), shape)?;
                    rope(gpu, enc, RopeStyle::Interleaved, data, tables, HeadRows { tokens: tokens as u64, heads: heads as u64, head_dim: d as u64 })
                })
            };
            let (fused, apart) = (run(true), run(false));
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fused), bits(&apart));
            // Columns outside the rows' heads are untouched.
            assert_eq!(fused[..from], x[..from]);
        });
    }

    #[test]
    fn rms_norm_rows_with_bf16_weight() {
        both_shapes(|g| held("rms_norm", crate::selftest::check_rms_norm(g, 37, 300, 6)));
        // More rows than one CPU-shaped workgroup takes, with a partial last one.
        both_shapes(|g| held("rms_norm, 150 rows", crate::selftest::check_rms_norm(g, 150, 16, 7)));
    }

    #[test]
    fn rms_norm_per_head_in_place_on_a_strided_view() {
        both_shapes(|g| held("per-head rms_norm in place", crate::selftest::check_rms_norm_per_head_in_place(g)));
    }

    #[test]
    fn layer_norm_with_modulation() {
        both_shapes(|g| held("layer_norm_modulate", crate::selftest::check_layer_norm(g, 41, 333, 8)));
        both_shapes(|g| held("layer_norm_modulate, 130 rows", crate::selftest::check_layer_norm(g, 130, 24, 9)));
    }
}
