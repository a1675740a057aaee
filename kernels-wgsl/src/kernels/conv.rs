//! The VAE's convolutions as implicit matrix products on the GEMM tiling,
//! and nearest-neighbour ×2 upsampling.
//! Shader: `conv.wgsl` beside this file.

use crate::kernel::{kernel, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::device::Gpu;
use crate::dispatch::{chunks, dispatch, grid64, row_chunks, rows_per_chunk, window, Launch, Rows, Sink, Window};
use crate::error::GpuError;
use crate::view::{Mat, Weight};
use bytemuck::{Pod, Zeroable};
use flux_lite_core::oracle::ConvShape;
use super::linear::{kept_scales_window, matrix_b_paired, measure_rows, RangeScalesParams, GEMM_TILE, MATRIX_BLOCK_TILES, MATRIX_SUBGROUPS, RANGE_SCALES_ROWS};
use crate::dispatch::to_u32;
use crate::precision::{MatrixConfig, MatrixOperands};
use crate::kernel::wrapped_grid;
use crate::precision::Precision;
use super::conv_lanes;

/// `conv.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct ConvParams {
    pub in_channels: u32,
    pub height: u32,
    pub width: u32,
    pub out_channels: u32,
    pub out_height: u32,
    pub out_width: u32,
    pub kernel: u32,
    pub stride: u32,
    pub pad_top: u32,
    pub pad_left: u32,
    pub x_offset: u32,
    pub w_offset: u32,
    pub b_offset: u32,
    pub y_offset: u32,
    /// The matrix tier's: the output pixels this call takes (all of them
    /// on the other tiers, which read neither), and where the scales of
    /// A's runs of pixels and of W's rows start in the range scales.
    pub px_first: u32,
    pub px_count: u32,
    pub x_scales: u32,
    pub w_scales: u32,
    /// The channels-last kernel's: the input pixel its window starts at,
    /// and where its f16 output's scales and its residual's words and
    /// scales start in their windows.
    pub x_first: u32,
    pub y_scales: u32,
    pub r_offset: u32,
    pub r_scales: u32,
    /// Its input normalised as read: where the GroupNorm's statistics, and
    /// its gamma and beta, start in their windows.
    pub n_stats: u32,
    pub n_affine: u32,
    pub _pad: [u32; 2],
}

impl ConvParams {
    /// `s` over `out_channels` output channels, with x, W, bias and y at
    /// these offsets in their windows; every output pixel, no scales.
    pub(crate) fn of(s: &ConvShape, out_channels: u64, [x_offset, w_offset, b_offset, y_offset]: [u32; 4]) -> Self {
        ConvParams {
            in_channels: s.in_channels as u32,
            height: s.height as u32,
            width: s.width as u32,
            out_channels: out_channels as u32,
            out_height: s.out_height as u32,
            out_width: s.out_width as u32,
            kernel: s.kernel as u32,
            stride: s.stride as u32,
            pad_top: s.pad_top as u32,
            pad_left: s.pad_left as u32,
            x_offset,
            w_offset,
            b_offset,
            y_offset,
            px_first: 0,
            px_count: (s.out_height * s.out_width) as u32,
            x_scales: 0,
            w_scales: 0,
            x_first: 0,
            y_scales: 0,
            r_offset: 0,
            r_scales: 0,
            n_stats: 0,
            n_affine: 0,
            _pad: [0; 2],
        }
    }
}

pub const CONV2D: Kernel =
    kernel(Module::Conv, "conv2d", [16, 16, 1], &[(1, RW), (2, R), (3, R), (4, RW)], size_of::<ConvParams>(), true);
/// The f16 tier's conv2d: `conv.wgsl` on f16-staged tiles.
pub const CONV2D_HALF: Kernel = Kernel { module: Module::ConvHalf, ..CONV2D };
/// The f16 tier's conv2d on the wide tiles (at most [`WIDE_MAX`] output channels).
pub const CONV2D_HALF_WIDE: Kernel = Kernel { module: Module::ConvHalfWide, ..CONV2D };
/// The f32 tier's conv2d on 64×256 tiles, for at most [`WIDE_MAX`] output
/// channels (a tiny decoder's 64, a small VAE's 32): 128-row tiles would
/// spend half or more of their rows on zeros.
pub const CONV2D_WIDE: Kernel = Kernel { module: Module::ConvWide, ..CONV2D };
pub const WIDE_MAX: u64 = 64;
/// The wide tiles' shape, output channels × pixels.
const WIDE_TILE: [u64; 2] = [64, 256];
/// The matrix tier's conv2d (`conv_matrix.wgsl` on the linear's
/// `matrix_gemm.wgsl`), one module per tile size; its workgroup is
/// [`MATRIX_SUBGROUPS`] subgroups (the `WG` override).
pub const CONV2D_MATRIX_8: Kernel =
    kernel(Module::ConvMatrix8, "conv2d_matrix", [0, 1, 1], &[(1, RW), (2, R), (3, R), (4, RW), (5, RW), (8, RW)], size_of::<ConvParams>(), true);
pub const CONV2D_MATRIX_16: Kernel = Kernel { module: Module::ConvMatrix16, ..CONV2D_MATRIX_8 };
pub const CONV2D_MATRIX_8_F32: Kernel = Kernel { module: Module::ConvMatrix8F32, ..CONV2D_MATRIX_8 };
/// The same in narrow blocks ([`ConvBlock::Narrow`]).
pub const CONV2D_MATRIX_8_NARROW: Kernel = Kernel { module: Module::ConvMatrix8Narrow, ..CONV2D_MATRIX_8 };
pub const CONV2D_MATRIX_16_NARROW: Kernel = Kernel { module: Module::ConvMatrix16Narrow, ..CONV2D_MATRIX_8 };
pub const CONV2D_MATRIX_8_F32_NARROW: Kernel = Kernel { module: Module::ConvMatrix8F32Narrow, ..CONV2D_MATRIX_8 };

/// Whether a test asked for square tiles and blocks only (never outside tests).
fn square_tiles_only() -> bool {
    #[cfg(test)]
    return tests::SQUARE_TILES.get();
    #[cfg(not(test))]
    false
}

/// The matrix conv2d's block of the output, pixels × output channels: a
/// square one of 8T × 8T on [`MATRIX_SUBGROUPS`] subgroups (the linear's),
/// or a narrow one of 8T × 4T on two, taken where it pads fewer output
/// channels (at most 4T, a 64-channel convolution with 16×16 tiles, or just
/// past a multiple of 8T): a square block over 64 channels would multiply
/// zeros in half its columns. Its rows, and so the runs the range rule
/// scales, are the same 8T pixels: both give the same bits. The
/// channels-last convolution has a thin one too, 8T × T on two subgroups
/// of 4 × 1 tiles, for at most T output channels (an RGB output, whose 3
/// channels would leave 61 of a narrow block's 64 columns idle on 16×16
/// tiles), with the same rows and bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvBlock {
    Square,
    Narrow,
    Thin,
}

impl ConvBlock {
    /// The block for `out_channels` with `c`'s tiles: narrow where it pads fewer columns.
    pub fn for_channels(c: MatrixConfig, out_channels: u64) -> Self {
        if square_tiles_only() {
            return ConvBlock::Square;
        }
        let padded = |columns: u64| out_channels.div_ceil(columns) * columns;
        if padded(ConvBlock::Narrow.columns(c)) < padded(ConvBlock::Square.columns(c)) { ConvBlock::Narrow } else { ConvBlock::Square }
    }

    /// The channels-last convolution's block: [`ConvBlock::for_channels`]'s,
    /// or thin for at most T output channels (one block's columns: a thin
    /// block over more would stage the pixels again for each).
    pub fn for_channels_last(c: MatrixConfig, out_channels: u64) -> Self {
        match ConvBlock::for_channels(c, out_channels) {
            ConvBlock::Narrow if out_channels <= ConvBlock::Thin.columns(c) => ConvBlock::Thin,
            block => block,
        }
    }

    /// Output channels a block takes (BN).
    pub fn columns(self, c: MatrixConfig) -> u64 {
        let tiles = match self {
            ConvBlock::Square => MATRIX_BLOCK_TILES,
            ConvBlock::Narrow => MATRIX_BLOCK_TILES / 2,
            ConvBlock::Thin => 1,
        };
        c.size as u64 * tiles
    }

    /// Subgroups a workgroup (the `WG` override is this many subgroups' invocations).
    pub fn subgroups(self) -> u32 {
        match self {
            ConvBlock::Square => MATRIX_SUBGROUPS,
            ConvBlock::Narrow | ConvBlock::Thin => MATRIX_SUBGROUPS / 2,
        }
    }

    fn kernel(self, c: MatrixConfig) -> Result<Kernel, GpuError> {
        match self {
            ConvBlock::Square => Ok(*c.pick([&CONV2D_MATRIX_8, &CONV2D_MATRIX_16, &CONV2D_MATRIX_8_F32])),
            ConvBlock::Narrow => Ok(*c.pick([&CONV2D_MATRIX_8_NARROW, &CONV2D_MATRIX_16_NARROW, &CONV2D_MATRIX_8_F32_NARROW])),
            ConvBlock::Thin => Err(GpuError::UnsupportedShape("a channel-major convolution in thin blocks".into())),
        }
    }
}
/// Its range rule's scale for each run of a block's rows of output pixels
/// (`conv_run_scales` in `conv_matrix.wgsl`), measured before the product.
pub const CONV_RUN_SCALES_8: Kernel =
    kernel(Module::ConvMatrix8, "conv_run_scales", [0, 1, 1], &[(1, RW), (5, RW)], size_of::<ConvParams>(), true);
pub const CONV_RUN_SCALES_16: Kernel = Kernel { module: Module::ConvMatrix16, ..CONV_RUN_SCALES_8 };
/// Convolutions of at most [`THIN_MAX`] output channels on the f32 tier:
/// one invocation per output pixel (`conv.wgsl`'s `conv2d_thin`).
pub const CONV2D_THIN: Kernel =
    kernel(Module::Conv, "conv2d_thin", [64, 1, 1], &[(1, RW), (2, R), (3, R), (4, RW)], size_of::<ConvParams>(), true);
/// `conv2d_thin`'s most output channels (`THIN_MAX` in the shader).
pub const THIN_MAX: u64 = 16;
/// CPU adapters' conv2d on the f32 tier (`conv_lanes.rs`; 3×3 and 1×1,
/// stride 1, same width, all rows or a band), written for subgroups of 8 and 3×3 here and for
/// [`Gpu::cpu_lanes`] and the call's kernel where launched: x and W read
/// as vec4s at bindings 6 and 7.
pub const CONV2D_LANES: Kernel =
    kernel(Module::ConvLanes { lanes: 8, kernel: 3, thin: false, long: false }, "conv2d_lanes", [64, 1, 1], &[(3, R), (4, RW), (6, RW), (7, R)], size_of::<ConvParams>(), true);

/// [`CONV2D_LANES`]'s module and grid for this convolution on `gpu`, where
/// it takes it: a CPU adapter with fixed subgroups, on the f32 tier
/// (`f32_tier`; at most [`THIN_MAX`] output channels, an RGB conv_out,
/// in the thin shape, one channel a lane), a 3×3 (padding 1) or 1×1 kernel at stride 1
/// keeping the width, over all rows or a band of them (a banded decode's:
/// its top padding 0 or the kernel's), input channels in whole steps, rows and planes on
/// whole vec4s (x from `x_local`, W's rows from `w_local`), and a grid
/// that fits.
fn lanes_launch(gpu: &Gpu, s: &ConvShape, f32_tier: bool, out_channels: u64, x_local: u32, w_local: u32, bf16: bool) -> Option<(Module, [u32; 3])> {
    let lanes = gpu.cpu_lanes()?;
    let pad = (s.kernel - 1) / 2;
    let same = s.stride == 1 && s.out_width == s.width && s.pad_left == pad && s.pad_top <= pad;
    let aligned = x_local.is_multiple_of(4) && s.width.is_multiple_of(4) && w_local.is_multiple_of(if bf16 { 8 } else { 4 });
    let thin = out_channels <= THIN_MAX;
    let long = !thin && s.out_height * s.width >= conv_lanes::LONG_MIN_PIXELS;
    let shape = conv_lanes::shape(thin, long);
    let groups = ((s.out_height * s.width.div_ceil(shape.pixels as usize)) as u64).div_ceil(64 / lanes as u64);
    let shaped = matches!(s.kernel, 1 | 3) && s.in_channels.is_multiple_of(conv_lanes::CHANNELS as usize);
    let taken = f32_tier && same && aligned && shaped && groups <= crate::kernel::MAX_GRID_DIM as u64;
    let grid = [groups as u32, out_channels.div_ceil((lanes * shape.cols) as u64) as u32, 1];
    taken.then_some((Module::ConvLanes { lanes: lanes as u8, kernel: s.kernel as u8, thin, long }, grid))
}

pub const UPSAMPLE_NEAREST2X: Kernel =
    kernel(Module::Conv, "upsample_nearest2x", [64, 1, 1], &[(1, RW), (4, RW)], size_of::<ConvParams>(), false);


/// 2-D convolution with bias over contiguous `[channels, height, width]`
/// tensors, split over output channels when the output or weights are large.
/// On the matrix tier it runs on cooperative-matrix tiles.
pub fn conv2d(gpu: &Gpu, sink: &mut dyn Sink, x: Mat<'_>, w: Weight<'_>, bias: Weight<'_>, y: Mat<'_>, s: ConvShape) -> Result<(), GpuError> {
    conv2d_then(gpu, sink, x, w, bias, y, s, ConvEpilogue::default())
}

/// What a convolution's epilogue does to each sum after its bias, in the
/// order of the passes it replaces: y's value added (`residual`: the bits
/// of an add pass after it), then a ReLU (`relu`: those of a ReLU pass).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConvEpilogue {
    pub residual: bool,
    pub relu: bool,
}

impl ConvEpilogue {
    /// The kernels' override constants for it.
    pub(crate) fn constants(self) -> [(&'static str, u32); 2] {
        [("RESIDUAL", self.residual as u32), ("RELU", self.relu as u32)]
    }
}

/// [`conv2d`], with its epilogue `then` (y's values added, a ReLU).
#[allow(clippy::too_many_arguments)] // conv2d's operands and the epilogue
pub fn conv2d_then(gpu: &Gpu, sink: &mut dyn Sink, x: Mat<'_>, w: Weight<'_>, bias: Weight<'_>, y: Mat<'_>, s: ConvShape, then: ConvEpilogue) -> Result<(), GpuError> {
    if w.dtype != bias.dtype {
        return Err(GpuError::UnsupportedShape("conv weight and bias must share a dtype".into()));
    }
    let in_elems = (s.in_channels * s.height * s.width) as u64;
    let xw = window(gpu, x.buf, 4, x.offset..x.offset + in_elems, "conv input")?;
    if let Some(c) = gpu.matrix() {
        return conv2d_matrix(gpu, sink, &xw, w, bias, y, s, c, RANGE_SCALES_ROWS, then);
    }
    let plane = (s.out_height * s.out_width) as u64;
    let per_out = (s.in_channels * s.kernel * s.kernel) as u64;
    let [y_rows, w_rows, b_rows] = output_rows(&s, w, bias, y);
    for rows in row_chunks(gpu, s.out_channels as u64, &[y_rows, w_rows, b_rows], 1)? {
        let (yw, ww, bw) = (y_rows.window(gpu, &rows)?, w_rows.window(gpu, &rows)?, b_rows.window(gpu, &rows)?);
        let paired = ww.local.is_multiple_of(2) && per_out.is_multiple_of(2);
        let out_channels = rows.end - rows.start;
        // A thin output (an RGB conv_out) would leave most of a 128-row tile
        // idle; a few more output channels take the wide tiles, on either
        // tier (the f16 tier's scales are its rows' over all k, whatever
        // the tile: the same bits).
        let f32_tier = gpu.precision() == Precision::F32;
        let thin = f32_tier && out_channels <= THIN_MAX;
        let wide = out_channels <= WIDE_MAX && !square_tiles_only();
        let [tile_co, tile_px] = if wide { WIDE_TILE } else { GEMM_TILE.map(u64::from) };
        let (kernel, shaped) = match gpu.precision() {
            _ if thin => (&CONV2D_THIN, ("THIN_OC", out_channels as u32)),
            Precision::F16 if wide => (&CONV2D_HALF_WIDE, ("W_PAIRED", paired as u32)),
            Precision::F16 => (&CONV2D_HALF, ("W_PAIRED", paired as u32)),
            _ if wide => (&CONV2D_WIDE, ("W_PAIRED", paired as u32)),
            _ => (&CONV2D, ("W_PAIRED", paired as u32)),
        };
        let [residual, relu] = then.constants();
        let constants = [("WEIGHT_BF16", w.dtype.constant()), shaped, residual, relu];
        let params = ConvParams::of(&s, out_channels, [xw.local, ww.local, bw.local, yw.local]);
        let grid = match thin {
            true => grid64(plane),
            false => wrapped_grid((rows.end - rows.start).div_ceil(tile_co) * plane.div_ceil(tile_px)),
        };
        if let Some((module, grid)) = lanes_launch(gpu, &s, f32_tier, out_channels, xw.local, ww.local, w.dtype.constant() == 1) {
            let kernel = Kernel { module, ..CONV2D_LANES };
            let launch = Launch { kernel: &kernel, constants: &[("WEIGHT_BF16", w.dtype.constant()), residual, relu], params, grid };
            dispatch(gpu, sink, launch, &[(3, &bw), (4, &yw), (6, &xw), (7, &ww)]);
            continue;
        }
        let launch = Launch { kernel, constants: &constants, params, grid };
        dispatch(gpu, sink, launch, &[(1, &xw), (2, &ww), (3, &bw), (4, &yw)]);
    }
    Ok(())
}

/// The output's, W's and the bias's rows, one an output channel.
fn output_rows<'a>(s: &ConvShape, w: Weight<'a>, bias: Weight<'a>, y: Mat<'a>) -> [Rows<'a>; 3] {
    let (plane, taps, eb) = ((s.out_height * s.out_width) as u64, (s.in_channels * s.kernel * s.kernel) as u64, w.dtype.bytes());
    [
        Rows::packed(y.buf, 4, y.offset, plane, "conv output"),
        Rows::packed(w.buf, eb, w.offset, taps, "conv weight"),
        Rows::packed(bias.buf, eb, bias.offset, 1, "conv bias"),
    ]
}

/// The matrix tier's conv2d on `matrix_gemm.wgsl`, in pieces of output
/// channels (as one binding and the range scales allow) and of output
/// pixels (at most `runs_cap` runs of a block's rows, the scales they need):
/// W's row scales measured once per piece of channels, each piece of
/// pixels' run scales before its product. W's row scales are those it
/// keeps ([`Weight::scales`]) where it has them for these taps.
#[allow(clippy::too_many_arguments)] // conv2d's operands, the tier's tiles, the pieces' cap and the ReLU
fn conv2d_matrix(gpu: &Gpu, sink: &mut dyn Sink, xw: &Window<'_>, w: Weight<'_>, bias: Weight<'_>, y: Mat<'_>, s: ConvShape, c: MatrixConfig, runs_cap: u64, then: ConvEpilogue) -> Result<(), GpuError> {
    let plane = (s.out_height * s.out_width) as u64;
    let taps = (s.in_channels * s.kernel * s.kernel) as u64;
    let [y_rows, w_rows, b_rows] = output_rows(&s, w, bias, y);
    let (kernel_size, out_width) = (to_u32(s.kernel as u64, "conv kernel")?, to_u32(s.out_width as u64, "conv output width")?);
    // Output pixels a block takes (BM), square or narrow; the runs the range rule scales.
    let block = c.size as u64 * MATRIX_BLOCK_TILES;
    let half = c.operands == MatrixOperands::F16;
    let run_scales = if c.size == 16 { CONV_RUN_SCALES_16 } else { CONV_RUN_SCALES_8 };
    let wg = c.subgroup * MATRIX_SUBGROUPS;
    let channels_cap = rows_per_chunk(gpu, s.out_channels as u64, &[y_rows, w_rows, b_rows], 1)?.min(RANGE_SCALES_ROWS);
    for rows in chunks(s.out_channels as u64, channels_cap) {
        let (yw, ww, bw) = (y_rows.window(gpu, &rows)?, w_rows.window(gpu, &rows)?, b_rows.window(gpu, &rows)?);
        let out_channels = rows.end - rows.start;
        let shape = ConvBlock::for_channels(c, out_channels);
        let kernel = shape.kernel(c)?;
        let paired = matrix_b_paired(c, w.dtype, ww.local, taps);
        let [residual, relu] = then.constants();
        let [kt, stages, out_slots] = c.staging.constants(c.size);
        let constants = [("WEIGHT_BF16", w.dtype.constant()), ("WG", c.subgroup * shape.subgroups()), ("B_PAIRED", paired as u32), ("KERNEL", kernel_size), ("OUT_WIDTH", out_width), residual, relu, kt, stages, out_slots];
        let most_runs = plane.div_ceil(block).min(runs_cap);
        let scales = gpu.range_scales(out_channels + most_runs)?;
        let stored = w.scales.filter(|s| s.k == taps);
        let stored_window = match stored {
            Some(s) => Some(kept_scales_window(gpu, s, &rows)?),
            None => None,
        };
        if half && stored.is_none() {
            let measure = RangeScalesParams { rows: to_u32(out_channels, "conv output channels")?, k: to_u32(taps, "conv taps")?, src_offset: ww.local, src_stride: to_u32(taps, "conv taps")?, dst_offset: 0, t_stride: 1, _pad: [0; 2] };
            measure_rows(gpu, sink, &ww, &scales, measure, w.dtype.constant() == 1)?;
        }
        for px in chunks(plane, runs_cap * block) {
            let runs = (px.end - px.start).div_ceil(block);
            let sw = window(gpu, &scales, 4, 0..out_channels + runs, "range scales")?;
            // W's scales: as kept, or at the start of the call's own.
            let ws = stored_window.clone().unwrap_or_else(|| sw.clone());
            let params = ConvParams {
                px_first: to_u32(px.start, "conv output pixels")?,
                px_count: to_u32(px.end - px.start, "conv output pixels")?,
                x_scales: sw.local + to_u32(out_channels, "conv output channels")?,
                w_scales: ws.local,
                ..ConvParams::of(&s, out_channels, [xw.local, ww.local, bw.local, yw.local])
            };
            if half {
                let launch = Launch { kernel: &run_scales, constants: &[("WG", wg), ("KERNEL", kernel_size), ("OUT_WIDTH", out_width)], params, grid: wrapped_grid(runs) };
                dispatch(gpu, sink, launch, &[(1, xw), (5, &sw)]);
            }
            let launch = Launch { kernel: &kernel, constants: &constants, params, grid: wrapped_grid(runs * out_channels.div_ceil(shape.columns(c))) };
            dispatch(gpu, sink, launch, &[(1, xw), (2, &ww), (3, &bw), (4, &yw), (5, &sw), (8, &ws)]);
        }
    }
    Ok(())
}

/// Nearest-neighbour ×2 upsampling of a contiguous `[channels, height, width]` tensor.
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
    let x_rows = Rows::packed(x.buf, 4, x.offset, plane, "upsample input");
    let y_rows = Rows::packed(y.buf, 4, y.offset, 4 * plane, "upsample output");
    for rows in row_chunks(gpu, channels, &[x_rows, y_rows], 1)? {
        let (xw, yw) = (x_rows.window(gpu, &rows)?, y_rows.window(gpu, &rows)?);
        let params = ConvParams {
            in_channels: (rows.end - rows.start) as u32,
            height: height as u32,
            width: width as u32,
            x_offset: xw.local,
            y_offset: yw.local,
            ..Default::default()
        };
        let launch = Launch { kernel: &UPSAMPLE_NEAREST2X, constants: &[], params, grid: grid64((rows.end - rows.start) * 4 * plane) };
        dispatch(gpu, sink, launch, &[(1, &xw), (4, &yw)]);
    }
    Ok(())
}


#[cfg(test)]
pub(crate) mod tests;
