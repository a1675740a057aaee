//! DF11 expansion on the device: a compressed group decoded block by
//! block into bf16 words of a weight slot.
//! Shader: `df11.wgsl` beside this file.

use crate::kernel::{kernel, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::device::Gpu;
use crate::dispatch::{dispatch, to_u32, window, Launch, Sink, Window};
use crate::error::GpuError;
use bytemuck::{Pod, Zeroable};
use crate::kernel::wrapped_grid;

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

/// Where one of a group's arrays lies: `len` bytes of `buffer` from byte
/// `at`, a multiple of the adapter's binding alignment (so a window that
/// starts the array starts at it), padding included.
#[derive(Debug, Clone, Copy)]
pub struct Region<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub at: u64,
    pub len: u64,
}

impl<'a> Region<'a> {
    /// A whole buffer.
    pub fn whole(buffer: &'a wgpu::Buffer) -> Self {
        Self { buffer, at: 0, len: buffer.size() }
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

/// Binds elements `[first, end)` (of `elem` bytes) of an array, capped at its region's end.
fn region_window<'b>(gpu: &Gpu, r: Region<'b>, elem: u64, first: u64, end: u64, what: &'static str) -> Result<Window<'b>, GpuError> {
    let base = r.at / elem;
    window(gpu, r.buffer, elem, base + first..(base + end).min((r.at + r.len) / elem), what)
}

/// Expands a DF11 group into bf16 elements `[out_base, out_base + n_elements)`
/// of `slot` (`out_base` a multiple of 128, so the group starts on a binding
/// boundary): the group's words are zeroed, then decoded block by block, in
/// as few dispatches as the binding limit allows.
pub fn df11_decode(gpu: &Gpu, sink: &mut dyn Sink, g: Df11Arrays<'_>, slot: &wgpu::Buffer, out_base: u64) -> Result<(), GpuError> {
    let block_bytes = DF11_BLOCK_BYTES;
    let n_blocks = g.n_bytes.div_ceil(block_bytes);
    let aligned = [g.luts, g.stream, g.sign_mantissa, g.gaps, g.positions].iter().all(|r| r.at.is_multiple_of(gpu.binding_alignment()));
    if !out_base.is_multiple_of(128) || g.host_positions.len() as u64 != n_blocks + 1 || g.n_luts < 2 || !aligned {
        return Err(GpuError::UnsupportedShape(format!(
            "DF11 group: {} positions for {n_blocks} blocks, {} tables, slot offset {out_base}, arrays aligned to bindings: {aligned}",
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
    let out_window = |first: u64, end: u64| window(gpu, slot, 2, out_base + first..out_base + end, "DF11 output");
    // Every word is zeroed before any chunk ORs a half into a word it shares with the previous chunk.
    for &(b0, b1) in &chunks {
        let (first, end) = (pos(b0), pos(b1).min(g.n_elements));
        if first >= end {
            continue;
        }
        let ow = out_window(first, end)?;
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
    let lw = region_window(gpu, g.luts, 4, 0, g.n_luts as u64 * 64, "DF11 tables")?;
    for &(b0, b1) in &chunks {
        let (first, end) = (pos(b0), pos(b1).min(g.n_elements));
        let sw = region_window(gpu, g.stream, 1, b0 * block_bytes, b1 * block_bytes + LOOK_AHEAD, "DF11 exponents")?;
        let mw = region_window(gpu, g.sign_mantissa, 1, first, end.max(first + 1), "DF11 signs and mantissas")?;
        let gw = region_window(gpu, g.gaps, 1, b0 * 320, b1 * 320 + 2, "DF11 gaps")?;
        let pw = region_window(gpu, g.positions, 4, b0, b1 + 1, "DF11 positions")?;
        let ow = out_window(first, end.max(first + 1))?;
        let shift = |start: u64, w: &Window<'_>, what| to_u32(start - w.local as u64, what);
        let params = Df11Params {
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
        dispatch(gpu, sink, Launch { kernel: &DF11_DECODE, constants: &[], params, grid: wrapped_grid(b1 - b0) }, &bindings);
    }
    Ok(())
}

