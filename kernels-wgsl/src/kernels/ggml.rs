//! GGUF weights expanded on the device: a tensor's GGML blocks (Q4_0 …
//! Q8_0, Q2_K … Q6_K) into f32 elements of a weight slot, bit for bit as
//! gguf-py dequantizes them; scaled FP8 (E4M3 bytes times the tensor's
//! scale) the same way. Shader: `ggml.wgsl` beside this file.

use crate::device::Gpu;
use crate::dispatch::{dispatch, to_u32, window, Launch, Sink};
use crate::error::GpuError;
use crate::kernel::{kernel, wrapped_grid, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use bytemuck::{Pod, Zeroable};
use flux_lite_core::ggml::GgmlType;

/// `ggml.wgsl`'s parameter block.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct GgmlParams {
    pub kind: u32,
    /// Runs of 32 elements the dispatch writes.
    pub runs: u32,
    /// Byte of the bound source where the dispatch's first block starts.
    pub src_shift: u32,
    /// Element of the bound output where its first element lands.
    pub out_shift: u32,
    /// FP8's per-tensor scale.
    pub scale: f32,
    /// Elements the dispatch writes.
    pub count: u32,
    /// [`ggml_expand_half`]'s: elements a row, and the element of the bound
    /// scales where the dispatch's first row's scale lands.
    pub row_elements: u32,
    pub scales_shift: u32,
}

pub const GGML_EXPAND: Kernel = kernel(Module::Ggml, "ggml_expand", [64, 1, 1], &[(1, R), (2, RW)], size_of::<GgmlParams>(), false);
/// The same rows into the matrix tier's f16 operand (`ggml_half.wgsl`).
pub const GGML_EXPAND_HALF: Kernel = kernel(Module::Ggml, "ggml_expand_half", [64, 1, 1], &[(1, R), (3, RW), (4, RW)], size_of::<GgmlParams>(), false);

/// Elements one invocation writes.
const RUN: u64 = 32;

/// Blocks of one GGML type (or FP8 bytes) on the device: from byte `at` of
/// `buf` (any byte: blocks of odd sizes follow each other); `scale`
/// multiplies FP8 (a block of one weight), GGML's blocks carry their own.
#[derive(Debug, Clone, Copy)]
pub struct GgmlBlocks<'a> {
    pub ggml: GgmlType,
    pub scale: f32,
    pub buf: &'a wgpu::Buffer,
    pub at: u64,
}

/// Expands `blocks` of `src`'s blocks into f32 elements `[out_base,
/// out_base + blocks·block_elements)` of `out`, in as many dispatches as the
/// binding limit asks for.
pub fn ggml_expand(gpu: &Gpu, sink: &mut dyn Sink, src: GgmlBlocks<'_>, blocks: u64, out: &wgpu::Buffer, out_base: u64) -> Result<(), GpuError> {
    let GgmlBlocks { ggml, scale, buf: src, at: src_at } = src;
    if !ggml.is_quantized() {
        return Err(GpuError::UnsupportedShape(format!("GGML expansion of {}, which is not in blocks", ggml.name())));
    }
    let (block_bytes, block_elements) = (ggml.block_bytes() as u64, ggml.block_elements() as u64);
    // Blocks per dispatch: both windows within a binding (less the alignment slack).
    let budget = gpu.max_binding().saturating_sub(gpu.binding_alignment());
    // Whole runs of 32 elements a dispatch, but the last.
    let granule = (RUN / block_elements).max(1);
    let per = ((budget / block_bytes).min(budget / (4 * block_elements)) / granule * granule).max(granule);
    let mut b0 = 0;
    while b0 < blocks {
        let b1 = (b0 + per).min(blocks);
        let sw = window(gpu, src, 1, src_at + b0 * block_bytes..src_at + b1 * block_bytes, "GGML blocks")?;
        let ow = window(gpu, out, 4, out_base + b0 * block_elements..out_base + b1 * block_elements, "GGML output")?;
        let count = (b1 - b0) * block_elements;
        let runs = count.div_ceil(RUN);
        let params = GgmlParams {
            kind: ggml.id(),
            runs: to_u32(runs, "GGML runs")?,
            src_shift: sw.local,
            out_shift: ow.local,
            scale,
            count: to_u32(count, "GGML elements")?,
            row_elements: 0,
            scales_shift: 0,
        };
        dispatch(gpu, sink, Launch { kernel: &GGML_EXPAND, constants: &[], params, grid: wrapped_grid(runs.div_ceil(64)) }, &[(1, &sw), (2, &ow)]);
        b0 = b1;
    }
    Ok(())
}

/// Whether rows of `k` elements in blocks of type `ggml` expand straight
/// into f16 ([`ggml_expand_half`]): whole blocks and runs of 32 a row.
pub fn expands_half(ggml: GgmlType, k: u64) -> bool {
    ggml.is_quantized() && k.is_multiple_of(RUN) && k.is_multiple_of(ggml.block_elements() as u64)
}

/// Expands `rows` rows of `k` elements of `src`'s blocks straight into the
/// matrix tier's f16 operand: each row divided by its range scale (that of
/// its largest magnitude) and rounded to f16, two a word, into `words` from
/// word `words_at`, the scales into `scales` (f32) from its element given
/// beside it: the words and scales [`pack_weight_half`](super::pack_weight_half)
/// makes of a weight, so a product reads them as a packed weight (`W_HALF`)
/// whose rows are the f32 expansion's ([`ggml_expand`]) as its staging
/// would round them.
pub fn ggml_expand_half(gpu: &Gpu, sink: &mut dyn Sink, src: GgmlBlocks<'_>, [rows, k]: [u64; 2], words: (&wgpu::Buffer, u64), scales: (&wgpu::Buffer, u64)) -> Result<(), GpuError> {
    let GgmlBlocks { ggml, scale, buf: src, at: src_at } = src;
    let (words, words_at) = words;
    if !expands_half(ggml, k) {
        return Err(GpuError::UnsupportedShape(format!("f16 expansion of {} rows of {k} elements (whole blocks and runs of {RUN} a row)", ggml.name())));
    }
    let (scales, scales_at) = scales;
    let row_bytes = k / ggml.block_elements() as u64 * ggml.block_bytes() as u64;
    let budget = gpu.max_binding().saturating_sub(gpu.binding_alignment());
    let per = (budget / row_bytes).min(budget / (2 * k)).max(1);
    let mut r0 = 0;
    while r0 < rows {
        let r1 = (r0 + per).min(rows);
        let sw = window(gpu, src, 1, src_at + r0 * row_bytes..src_at + r1 * row_bytes, "GGML blocks")?;
        let ww = window(gpu, words, 4, words_at + r0 * k / 2..words_at + r1 * k / 2, "GGML f16 rows")?;
        let scw = window(gpu, scales, 4, scales_at + r0..scales_at + r1, "GGML rows' scales")?;
        let runs = (r1 - r0) * k / RUN;
        let params = GgmlParams {
            kind: ggml.id(),
            runs: to_u32(runs, "GGML runs")?,
            src_shift: sw.local,
            out_shift: ww.local,
            scale,
            count: to_u32((r1 - r0) * k, "GGML elements")?,
            row_elements: to_u32(k, "GGML row")?,
            scales_shift: scw.local,
        };
        dispatch(gpu, sink, Launch { kernel: &GGML_EXPAND_HALF, constants: &[], params, grid: wrapped_grid(r1 - r0) }, &[(1, &sw), (3, &ww), (4, &scw)]);
        r0 = r1;
    }
    Ok(())
}
