//! f32 rows written as a product's f16 operand: each (row, piece) divided
//! by its range scale, the scales beside (`half_pack.wgsl`; the SwiGLU's
//! `swiglu_half.wgsl`). The transformer's half-K/V layout, the text
//! encoder's feed-forward input, the VAE's convolution inputs on the matrix tier.

use crate::device::Gpu;
use crate::dispatch::{dispatch, grid64, row_chunks, to_u32, Launch, Rows, Sink, Window};
use crate::error::GpuError;
use crate::kernel::{kernel, Access::ReadWrite as RW, Kernel, Module};
use crate::view::{HeadRows, Mat, Weight, WeightDtype};
use bytemuck::{Pod, Zeroable};

/// `half_pack.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct HalfPackParams {
    pub rows: u32,
    pub heads: u32,
    pub head_dim: u32,
    pub src_offset: u32,
    pub src_stride: u32,
    pub dst_offset: u32,
    pub dst_stride: u32,
    pub scale_offset: u32,
    pub scale_stride: u32,
    /// `swiglu_half.wgsl`'s: the up rows (the gate rows are the source's).
    pub up_offset: u32,
    pub up_stride: u32,
    pub _pad: u32,
}

/// f32 rows into the half-K/V layout, one invocation a (token, head) row.
pub const HALF_PACK: Kernel = kernel(Module::HalfPack, "half_pack", [64, 1, 1], &[(1, RW), (2, RW), (3, RW)], size_of::<HalfPackParams>(), false);
/// A bf16 weight's rows packed in place into f16 under their kept range scales.
pub const PACK_WEIGHT_HALF: Kernel = kernel(Module::HalfPack, "pack_weight_half", [64, 1, 1], &[(2, RW), (3, RW)], size_of::<HalfPackParams>(), false);
/// An f32 weight's rows (binding 1) packed the same way into a buffer of their own (2).
pub const PACK_WEIGHT_HALF_F32: Kernel = kernel(Module::HalfPack, "pack_weight_half_f32", [64, 1, 1], &[(1, RW), (2, RW), (3, RW)], size_of::<HalfPackParams>(), false);
/// A SwiGLU (gate rows at binding 1, up rows at 4) packed the same way.
pub const SWIGLU_HALF_PACK: Kernel =
    kernel(Module::SwigluHalf, "swiglu_half_pack", [64, 1, 1], &[(1, RW), (2, RW), (3, RW), (4, RW)], size_of::<HalfPackParams>(), false);


/// The `[tokens, heads, head_dim]` f32 rows of `src` into the
/// half-K/V layout: `dst` `[rows, heads·head_dim / 2]` words of f16 pairs,
/// each (row, head) divided by its range scale (the power of two bringing
/// its largest magnitude into [2¹³, 2¹⁴)), the scales into `scales`
/// `[rows, heads]` (a row's `scales.stride` ≥ `heads` apart: also a
/// product's operand in pieces of `head_dim`, [`crate::view::HalfMat::pieces`]).
pub fn half_pack(gpu: &Gpu, sink: &mut dyn Sink, src: Mat<'_>, dst: Mat<'_>, scales: Mat<'_>, shape: HeadRows) -> Result<(), GpuError> {
    pack_rows(gpu, sink, src, None, dst, scales, shape)
}

/// `silu(gate)·up` (as [`crate::kernels::Elementwise::SwiGlu`] computes it)
/// written as the next product's f16 operand in pieces: `dst` `[tokens,
/// pieces·piece/2]` words, each piece of a row rounded under its range
/// scale, the scales into `scales` `[tokens, pieces]`, one pass.
pub fn swiglu_half_pack(gpu: &Gpu, sink: &mut dyn Sink, gate: Mat<'_>, up: Mat<'_>, dst: Mat<'_>, scales: Mat<'_>, shape: HeadRows) -> Result<(), GpuError> {
    pack_rows(gpu, sink, gate, Some(up), dst, scales, shape)
}

/// [`half_pack`] of `src`, or with `up` of [`swiglu_half_pack`]'s SwiGLU of `src` and `up`.
fn pack_rows(gpu: &Gpu, sink: &mut dyn Sink, src: Mat<'_>, up: Option<Mat<'_>>, dst: Mat<'_>, scales: Mat<'_>, shape: HeadRows) -> Result<(), GpuError> {
    let HeadRows { tokens: rows, heads, head_dim } = shape;
    if !head_dim.is_multiple_of(2) || scales.stride < heads {
        return Err(GpuError::UnsupportedShape(format!("half-precision rows of {heads} heads of {head_dim} (even) with scales {} a row", scales.stride)));
    }
    if rows == 0 {
        return Ok(());
    }
    let src_rows = Rows::mat(src, heads * head_dim, "half pack input");
    let up_rows = up.map(|u| Rows::mat(u, heads * head_dim, "half pack up rows"));
    let dst_rows = Rows::mat(dst, heads * head_dim / 2, "half pack output");
    let scale_rows = Rows::mat(scales, heads, "half pack scales");
    let operands: Vec<Rows<'_>> = [src_rows, dst_rows, scale_rows].into_iter().chain(up_rows).collect();
    for chunk in row_chunks(gpu, rows, &operands, 1)? {
        let (sw, dw, cw) = (src_rows.window(gpu, &chunk)?, dst_rows.window(gpu, &chunk)?, scale_rows.window(gpu, &chunk)?);
        let uw = match up_rows {
            Some(r) => Some(r.window(gpu, &chunk)?),
            None => None,
        };
        let n = chunk.end - chunk.start;
        let params = HalfPackParams {
            rows: to_u32(n, "half pack rows")?,
            heads: to_u32(heads, "half pack heads")?,
            head_dim: to_u32(head_dim, "half pack head dim")?,
            src_offset: sw.local,
            src_stride: to_u32(src.stride, "half pack input stride")?,
            dst_offset: dw.local,
            dst_stride: to_u32(dst.stride, "half pack output stride")?,
            scale_offset: cw.local,
            scale_stride: to_u32(scales.stride, "half pack scales' stride")?,
            up_offset: uw.as_ref().map_or(0, |w| w.local),
            up_stride: to_u32(up.map_or(0, |u| u.stride), "half pack up stride")?,
            _pad: 0,
        };
        let kernel = if up.is_some() { &SWIGLU_HALF_PACK } else { &HALF_PACK };
        let launch = Launch { kernel, constants: &[], params, grid: grid64(n * heads) };
        let bindings: Vec<(u32, &Window<'_>)> = [(1, &sw), (2, &dw), (3, &cw)].into_iter().chain(uw.as_ref().map(|w| (4, w))).collect();
        dispatch(gpu, sink, launch, &bindings);
    }
    Ok(())
}

/// A bf16 weight `w` of `rows` rows of `k` values packed in place into the
/// matrix tier's f16 operand under its rows' range scales `scales` (one a
/// row, as [`measure_weight_rows`](super::linear::measure_weight_rows)
/// keeps them): each value divided by its row's scale and rounded to f16,
/// two a word. A product then stages its words as they are. Split over
/// rows where one binding cannot hold the weight (a product splits over
/// W's rows the same way).
pub fn pack_weight_half(gpu: &Gpu, sink: &mut dyn Sink, w: Weight<'_>, scales: Mat<'_>, [rows, k]: [u64; 2]) -> Result<(), GpuError> {
    if !k.is_multiple_of(2) || !w.offset.is_multiple_of(2) || w.dtype != WeightDtype::Bf16 {
        return Err(GpuError::UnsupportedShape(format!("a weight packed as f16 pairs is bf16 from an even element, its rows of an even length ({k}; {:?} from {})", w.dtype, w.offset)));
    }
    if rows * k == 0 {
        return Ok(());
    }
    // Each row is k/2 words, two bf16 values a word.
    let word_rows = Rows::packed(w.buf, 4, w.offset / 2, k / 2, "packed weight");
    let scale_rows = Rows::packed(scales.buf, 4, scales.offset, 1, "weight row scales");
    for chunk in row_chunks(gpu, rows, &[word_rows, scale_rows], 1)? {
        let (ww, sw) = (word_rows.window(gpu, &chunk)?, scale_rows.window(gpu, &chunk)?);
        let words = (chunk.end - chunk.start) * k / 2;
        let params = HalfPackParams { rows: to_u32(words, "weight words")?, head_dim: to_u32(k, "weight row")?, dst_offset: ww.local, scale_offset: sw.local, ..Default::default() };
        dispatch(gpu, sink, Launch { kernel: &PACK_WEIGHT_HALF, constants: &[], params, grid: grid64(words) }, &[(2, &ww), (3, &sw)]);
    }
    Ok(())
}

/// An f32 weight `[rows, k]` (`w`, k even) packed as [`pack_weight_half`]
/// packs a bf16 one, into `dst` (f16 pairs, `rows · k / 2` words from word
/// 0, half its bytes) rather than in place: each value divided by its row's
/// kept range scale (`scales`, one f32 a row) and rounded to f16, as a
/// product's staging rounds it every tile. Split over rows where one
/// binding cannot hold the weight.
pub fn pack_weight_half_f32(gpu: &Gpu, sink: &mut dyn Sink, w: Weight<'_>, dst: &wgpu::Buffer, scales: Mat<'_>, [rows, k]: [u64; 2]) -> Result<(), GpuError> {
    if !k.is_multiple_of(2) || w.dtype != WeightDtype::F32 {
        return Err(GpuError::UnsupportedShape(format!("an f32 weight packed as f16 pairs has rows of an even length ({k}; {:?})", w.dtype)));
    }
    if rows * k == 0 {
        return Ok(());
    }
    let value_rows = Rows::packed(w.buf, 4, w.offset, k, "f32 weight");
    let word_rows = Rows::packed(dst, 4, 0, k / 2, "packed weight");
    let scale_rows = Rows::packed(scales.buf, 4, scales.offset, 1, "weight row scales");
    for chunk in row_chunks(gpu, rows, &[value_rows, word_rows, scale_rows], 1)? {
        let (vw, ww, sw) = (value_rows.window(gpu, &chunk)?, word_rows.window(gpu, &chunk)?, scale_rows.window(gpu, &chunk)?);
        let words = (chunk.end - chunk.start) * k / 2;
        let params = HalfPackParams { rows: to_u32(words, "weight words")?, head_dim: to_u32(k, "weight row")?, src_offset: vw.local, dst_offset: ww.local, scale_offset: sw.local, ..Default::default() };
        dispatch(gpu, sink, Launch { kernel: &PACK_WEIGHT_HALF_F32, constants: &[], params, grid: grid64(words) }, &[(1, &vw), (2, &ww), (3, &sw)]);
    }
    Ok(())
}
