//! DF11 expansion on the device: a compressed group decoded block by
//! block into bf16 words of a weight slot.
//! Shader: `df11.wgsl` beside this file.

use crate::kernel::{kernel, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::device::Gpu;
use crate::dispatch::{dispatch, to_u32, window, Launch, Sink, Window};
use crate::error::GpuError;
use bytemuck::{Pod, Zeroable};
use crate::kernel::wrapped_grid;
use std::ops::Range;

/// `df11.wgsl`: one dispatch expands blocks `block0..` of a DF11 group. Each
/// `*_shift` is the index (bytes for byte arrays, elements otherwise) of the
/// first element of the bound window in its buffer.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct Df11Params {
    pub n_luts: u32,
    pub n_bytes: u32,
    pub n_elements: u32,
    pub block0: u32,
    pub stream_shift: u32,
    pub sign_shift: u32,
    pub gaps_shift: u32,
    pub positions_shift: u32,
    /// Element of the slot buffer where the group's element 0 lands (even).
    pub out_base: u32,
    pub out_shift: u32,
    /// Elements whose words `df11_clear` zeroes.
    pub clear_first: u32,
    pub clear_end: u32,
}

pub const DF11_DECODE: Kernel = kernel(
    Module::Df11,
    "df11_decode",
    [256, 1, 1],
    &[(1, R), (2, R), (3, R), (4, R), (5, R), (6, RW)],
    size_of::<Df11Params>(),
    false,
);
pub const DF11_CLEAR: Kernel = kernel(Module::Df11, "df11_clear", [256, 1, 1], &[(6, RW)], size_of::<Df11Params>(), false);
/// Bytes of the exponent stream one DF11 workgroup decodes (the official block).
pub const DF11_BLOCK_BYTES: u64 = 4096;

/// Where (part of) one of a group's arrays lies: `len` bytes of `buffer`
/// from byte `at`, a multiple of the adapter's binding alignment, holding
/// the array from element `first` on (0 for a whole array; a streamed
/// group's pieces start further in), padding included.
#[derive(Debug, Clone, Copy)]
pub struct Region<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub at: u64,
    pub len: u64,
    pub first: u64,
}

impl<'a> Region<'a> {
    /// A whole array in a buffer of its own.
    pub fn whole(buffer: &'a wgpu::Buffer) -> Self {
        Self { buffer, at: 0, len: buffer.size(), first: 0 }
    }
}

/// A DF11 group's arrays on the device (byte arrays padded to whole words
/// plus look-ahead, each in its own buffer or at its place in a shared one)
/// and, on the host, its block output positions.
#[derive(Debug, Clone, Copy)]
pub struct Df11Arrays<'a> {
    pub luts: Region<'a>,
    pub n_luts: u32,
    pub stream: Region<'a>,
    pub n_bytes: u64,
    pub sign_mantissa: Region<'a>,
    pub n_elements: u64,
    pub gaps: Region<'a>,
    pub positions: Region<'a>,
    /// `n_blocks + 1` entries: the first element of each 4096-byte block, then `n_elements`.
    pub host_positions: &'a [u32],
}

/// Binds elements `[first, end)` (of `elem` bytes) of an array, capped at
/// its region's end; `first` must lie in the region.
fn region_window<'b>(gpu: &Gpu, r: Region<'b>, elem: u64, first: u64, end: u64, what: &'static str) -> Result<Window<'b>, GpuError> {
    if first < r.first {
        return Err(GpuError::UnsupportedShape(format!("{what}: element {first} is before the bound piece, which starts at {}", r.first)));
    }
    let base = r.at / elem;
    window(gpu, r.buffer, elem, base + first - r.first..(base + end - r.first).min((r.at + r.len) / elem), what)
}

/// Look-ahead past a run of blocks' last exponent byte: one code of up to
/// 32 bits plus the byte it starts in.
pub const DF11_LOOK_AHEAD: u64 = 16;
/// Bytes of `gaps` per 4096-byte block (a 5-bit offset per 64-bit segment, packed).
pub const DF11_GAP_BYTES_PER_BLOCK: u64 = 320;

/// Expands a DF11 group into bf16 elements `[out_base, out_base + n_elements)`
/// of `slot` (`out_base` a multiple of 128, so the group starts on a binding
/// boundary): the group's words are zeroed, then decoded block by block, in
/// as few dispatches as the binding limit allows.
pub fn df11_decode(gpu: &Gpu, sink: &mut dyn Sink, g: Df11Arrays<'_>, slot: &wgpu::Buffer, out_base: u64) -> Result<(), GpuError> {
    df11_clear(gpu, sink, g, slot, out_base)?;
    df11_decode_blocks(gpu, sink, g, slot, out_base, 0..g.n_bytes.div_ceil(DF11_BLOCK_BYTES))
}

/// The checks every DF11 launch makes; the group's block count.
fn checked_blocks(gpu: &Gpu, g: &Df11Arrays<'_>, out_base: u64) -> Result<u64, GpuError> {
    let n_blocks = g.n_bytes.div_ceil(DF11_BLOCK_BYTES);
    let aligned = [g.luts, g.stream, g.sign_mantissa, g.gaps, g.positions].iter().all(|r| r.at.is_multiple_of(gpu.binding_alignment()));
    if !out_base.is_multiple_of(128) || g.host_positions.len() as u64 != n_blocks + 1 || g.n_luts < 2 || !aligned {
        return Err(GpuError::UnsupportedShape(format!(
            "DF11 group: {} positions for {n_blocks} blocks, {} tables, slot offset {out_base}, arrays aligned to bindings: {aligned}",
            g.host_positions.len(),
            g.n_luts
        )));
    }
    Ok(n_blocks)
}

/// Blocks `blocks` of a group cut into runs whose windows fit one binding.
fn binding_runs(gpu: &Gpu, g: &Df11Arrays<'_>, blocks: Range<u64>) -> Result<Vec<(u64, u64)>, GpuError> {
    let pos = |b: u64| g.host_positions[b as usize] as u64;
    let budget = gpu.max_binding().saturating_sub(gpu.binding_alignment());
    let fits = |b0: u64, b1: u64| {
        let elements = pos(b1) - pos(b0);
        (b1 - b0) * DF11_BLOCK_BYTES + DF11_LOOK_AHEAD <= budget && 2 * elements + 4 <= budget && elements <= budget
    };
    let mut runs = Vec::new();
    let mut b0 = blocks.start;
    while b0 < blocks.end {
        if !fits(b0, b0 + 1) {
            return Err(GpuError::BindingTooLarge { what: "DF11 block", bytes: 2 * (pos(b0 + 1) - pos(b0)), limit: gpu.max_binding() });
        }
        let mut b1 = b0 + 1;
        while b1 < blocks.end && fits(b0, b1 + 1) {
            b1 += 1;
        }
        runs.push((b0, b1));
        b0 = b1;
    }
    Ok(runs)
}

/// Zeroes the slot words of a group's elements: every word must be zero
/// before any run of blocks ORs a half into a word it shares with the previous run.
pub fn df11_clear(gpu: &Gpu, sink: &mut dyn Sink, g: Df11Arrays<'_>, slot: &wgpu::Buffer, out_base: u64) -> Result<(), GpuError> {
    let n_blocks = checked_blocks(gpu, &g, out_base)?;
    if g.n_elements == 0 {
        return Ok(());
    }
    let pos = |b: u64| g.host_positions[b as usize] as u64;
    let base = to_u32(out_base, "DF11 slot offset")?;
    for (b0, b1) in binding_runs(gpu, &g, 0..n_blocks)? {
        let (first, end) = (pos(b0), pos(b1).min(g.n_elements));
        if first >= end {
            continue;
        }
        let ow = window(gpu, slot, 2, out_base + first..out_base + end, "DF11 output")?;
        let params = Df11Params {
            out_base: base,
            out_shift: to_u32(out_base + first - ow.local as u64, "DF11 output window")?,
            clear_first: to_u32(first, "DF11 elements")?,
            clear_end: to_u32(end, "DF11 elements")?,
            ..Default::default()
        };
        let words = (end - first).div_ceil(2) + 1;
        dispatch(gpu, sink, Launch { kernel: &DF11_CLEAR, constants: &[], params, grid: wrapped_grid(words.div_ceil(256)) }, &[(6, &ow)]);
    }
    Ok(())
}

/// Decodes blocks `blocks` of a group into a slot cleared by [`df11_clear`]
/// (its arrays need hold only those blocks' bytes: see [`Region::first`]).
pub fn df11_decode_blocks(gpu: &Gpu, sink: &mut dyn Sink, g: Df11Arrays<'_>, slot: &wgpu::Buffer, out_base: u64, blocks: Range<u64>) -> Result<(), GpuError> {
    let n_blocks = checked_blocks(gpu, &g, out_base)?;
    if g.n_elements == 0 || blocks.end > n_blocks {
        return if blocks.end > n_blocks { Err(GpuError::UnsupportedShape(format!("DF11 blocks {blocks:?} of {n_blocks}"))) } else { Ok(()) };
    }
    let pos = |b: u64| g.host_positions[b as usize] as u64;
    let base = to_u32(out_base, "DF11 slot offset")?;
    let block_bytes = DF11_BLOCK_BYTES;
    let gap_bytes = DF11_GAP_BYTES_PER_BLOCK;
    let lw = region_window(gpu, g.luts, 4, 0, g.n_luts as u64 * 64, "DF11 tables")?;
    for (b0, b1) in binding_runs(gpu, &g, blocks)? {
        let (first, end) = (pos(b0), pos(b1).min(g.n_elements));
        let sw = region_window(gpu, g.stream, 1, b0 * block_bytes, b1 * block_bytes + DF11_LOOK_AHEAD, "DF11 exponents")?;
        let mw = region_window(gpu, g.sign_mantissa, 1, first, end.max(first + 1), "DF11 signs and mantissas")?;
        let gw = region_window(gpu, g.gaps, 1, b0 * gap_bytes, b1 * gap_bytes + 2, "DF11 gaps")?;
        let pw = region_window(gpu, g.positions, 4, b0, b1 + 1, "DF11 positions")?;
        let ow = window(gpu, slot, 2, out_base + first..out_base + end.max(first + 1), "DF11 output")?;
        let shift = |start: u64, w: &Window<'_>, what| to_u32(start - w.local as u64, what);
        let params = Df11Params {
            n_luts: g.n_luts,
            n_bytes: to_u32(g.n_bytes, "DF11 exponent bytes")?,
            n_elements: to_u32(g.n_elements, "DF11 elements")?,
            block0: to_u32(b0, "DF11 blocks")?,
            stream_shift: shift(b0 * block_bytes, &sw, "DF11 exponents")?,
            sign_shift: shift(first, &mw, "DF11 signs")?,
            gaps_shift: shift(b0 * gap_bytes, &gw, "DF11 gaps")?,
            positions_shift: shift(b0, &pw, "DF11 positions")?,
            out_base: base,
            out_shift: shift(out_base + first, &ow, "DF11 output")?,
            clear_first: 0,
            clear_end: 0,
        };
        let bindings = [(1, &lw), (2, &sw), (3, &mw), (4, &gw), (5, &pw), (6, &ow)];
        dispatch(gpu, sink, Launch { kernel: &DF11_DECODE, constants: &[], params, grid: wrapped_grid(b1 - b0) }, &bindings);
    }
    Ok(())
}
