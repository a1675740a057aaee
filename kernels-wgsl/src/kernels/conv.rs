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
}

impl ConvParams {
    /// `s` over `out_channels` output channels, with x, W, bias and y at
    /// these offsets in their windows; every output pixel, no scales.
    fn of(s: &ConvShape, out_channels: u64, [x_offset, w_offset, b_offset, y_offset]: [u32; 4]) -> Self {
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
/// scales, are the same 8T pixels: both give the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvBlock {
    Square,
    Narrow,
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

    /// Output channels a block takes (BN).
    pub fn columns(self, c: MatrixConfig) -> u64 {
        let tiles = match self {
            ConvBlock::Square => MATRIX_BLOCK_TILES,
            ConvBlock::Narrow => MATRIX_BLOCK_TILES / 2,
        };
        c.size as u64 * tiles
    }

    /// Subgroups a workgroup (the `WG` override is this many subgroups' invocations).
    pub fn subgroups(self) -> u32 {
        match self {
            ConvBlock::Square => MATRIX_SUBGROUPS,
            ConvBlock::Narrow => MATRIX_SUBGROUPS / 2,
        }
    }

    fn kernel(self, c: MatrixConfig) -> Kernel {
        match self {
            ConvBlock::Square => *c.pick([&CONV2D_MATRIX_8, &CONV2D_MATRIX_16, &CONV2D_MATRIX_8_F32]),
            ConvBlock::Narrow => *c.pick([&CONV2D_MATRIX_8_NARROW, &CONV2D_MATRIX_16_NARROW, &CONV2D_MATRIX_8_F32_NARROW]),
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
    fn constants(self) -> [(&'static str, u32); 2] {
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
        let kernel = shape.kernel(c);
        let paired = matrix_b_paired(c, w.dtype, ww.local, taps);
        let [residual, relu] = then.constants();
        let constants = [("WEIGHT_BF16", w.dtype.constant()), ("WG", c.subgroup * shape.subgroups()), ("B_PAIRED", paired as u32), ("KERNEL", kernel_size), ("OUT_WIDTH", out_width), residual, relu];
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
mod tests {
    use super::*;
    use crate::testing::*;
    use flux_lite_core::oracle::{self as r, Weights};

    /// The selftest's convolution check (random bf16 weights and bias, NaN-poisoned output), held to the f32 bound.
    fn check_conv(s: ConvShape, seed: u64) {
        let worst = crate::selftest::check_conv(gpu(), s, seed).unwrap_or_else(|e| panic!("conv {s:?}: {e}"));
        assert!(worst <= F32_TOL, "conv {s:?}: relative L2 {worst:.3e} > {F32_TOL:.0e}");
    }

    /// `y`'s bits after [`conv2d`] of seeded x, W (bf16 or f32) and bias on `gpu`.
    fn conv_bits(gpu: &Gpu, s: ConvShape, seed: u64, bf16: bool) -> Vec<u32> {
        conv_bits_then(gpu, s, seed, bf16, ConvEpilogue::default())
    }

    /// The values a residual convolution of `s` finds in its output ([`conv_bits_then`]).
    fn residual_values(s: ConvShape, seed: u64) -> Vec<f32> {
        Rng::new(seed + 1000).normals(s.out_channels * s.out_height * s.out_width, 1.0)
    }

    /// [`conv_bits`] with the epilogue `then` in the kernel; a residual one
    /// adds onto [`residual_values`].
    fn conv_bits_then(gpu: &Gpu, s: ConvShape, seed: u64, bf16: bool, then: ConvEpilogue) -> Vec<u32> {
        let mut rng = Rng::new(seed);
        let x = rng.normals(s.in_channels * s.height * s.width, 1.0);
        let taps = s.out_channels * s.in_channels * s.kernel * s.kernel;
        let (wbits, wf, bbits, bf) = (rng.bf16s(taps, 0.2), rng.normals(taps, 0.2), rng.bf16s(s.out_channels, 0.5), rng.normals(s.out_channels, 0.5));
        let xb = gpu.upload_f32("x", &x);
        let (wb, bb) = if bf16 { (gpu.upload_bf16("w", &wbits), gpu.upload_bf16("b", &bbits)) } else { (gpu.upload_f32("w", &wf), gpu.upload_f32("b", &bf)) };
        let weight = |buf| if bf16 { Weight::bf16(buf) } else { Weight::f32(buf) };
        let out = s.out_channels * s.out_height * s.out_width;
        let yb = if then.residual { gpu.upload_f32("y", &residual_values(s, seed)) } else { poisoned(gpu, out) };
        let got = run_and_read(gpu, &yb, out, |enc| {
            conv2d_then(gpu, enc, Mat::new(&xb, (s.height * s.width) as u64), weight(&wb), weight(&bb), Mat::new(&yb, (s.out_height * s.out_width) as u64), s, then)
        });
        got.iter().map(|v| v.to_bits()).collect()
    }

    /// Shapes the lanes kernel takes: 3×3 and 1×1, input channels in steps
    /// of 8, widths of whole vec4s. The wide shape (more than 16 output
    /// channels): widths ending inside a block of 8 pixels (20, 36),
    /// output channels past a workgroup's 32 (40, 72) and below it (17,
    /// 33); the long one (16 pixels a block, from 128² output pixels): a
    /// width of one block and a half (24), 3×3 and 1×1, and a band. The
    /// thin one (3, 16): rows wider than its 32 pixels, ending inside a block.
    /// Bands of a banded decode (`ConvShape::input_rows`): the first (the
    /// top row padding), a middle one (a halo row either side) and the last
    /// (the rows past the input zero), wide and thin.
    fn lanes_shapes() -> [ConvShape; 15] {
        let band = |s: ConvShape, height: usize, out_height: usize, pad_top: usize| ConvShape { height, out_height, pad_top, ..s };
        [
            band(ConvShape::same(16, 40, 0, 16, 3), 6, 5, 1),
            band(ConvShape::same(32, 72, 0, 20, 3), 7, 5, 0),
            band(ConvShape::same(16, 40, 0, 12, 3), 4, 3, 0),
            band(ConvShape::same(16, 3, 0, 36, 3), 5, 3, 0),
            ConvShape::same(16, 40, 12, 16, 3),
            ConvShape::same(32, 72, 7, 20, 3),
            ConvShape::same(16, 40, 3, 36, 3),
            ConvShape::same(8, 17, 5, 8, 1),
            ConvShape::same(24, 33, 9, 12, 1),
            ConvShape::same(16, 3, 9, 36, 3),
            ConvShape::same(64, 16, 6, 40, 3),
            ConvShape::same(8, 3, 5, 44, 1),
            ConvShape::same(8, 40, 683, 24, 3),
            ConvShape::same(8, 20, 683, 24, 1),
            band(ConvShape::same(8, 36, 0, 24, 3), 700, 683, 1),
        ]
    }

    #[test]
    fn the_lanes_conv_matches_the_oracle_and_the_tiled_kernels_bits() {
        let Some((lanes, tiled)) = lanes_and_per_lane("the lanes conv2d", "patches") else { return };
        for (i, s) in lanes_shapes().into_iter().enumerate() {
            // The lanes kernel takes each of them (a band too), not the tiled one.
            let taken = lanes_launch(lanes, &s, true, s.out_channels as u64, 0, 0, true);
            let Some((Module::ConvLanes { long, .. }, _)) = taken else { panic!("conv {s:?} is not taken by the lanes kernel") };
            assert_eq!(long, i >= 12, "conv {s:?}: the long shape is for 128² output pixels and more");
            check_conv(s, 60 + i as u64);
            for bf16 in [true, false] {
                let (a, b) = (conv_bits(lanes, s, 70 + i as u64, bf16), conv_bits(&tiled, s, 70 + i as u64, bf16));
                let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
                assert_eq!(differ, 0, "conv {s:?} bf16={bf16}: {differ} of {} outputs differ in their bits", a.len());
            }
        }
    }

    #[test]
    fn conv3x3_same_padding() {
        check_conv(ConvShape::same(5, 7, 13, 9, 3), 40);
    }

    #[test]
    fn conv3x3_over_several_output_tiles() {
        // 140 output channels and 17·19 pixels span 2×3 tiles of 128, with 180
        // taps (even: weights load as u32 pairs) ending in half a k-step.
        check_conv(ConvShape::same(20, 140, 17, 19, 3), 43);
    }

    /// At most 16 output channels run on the thin kernel (f32 tier), 17 on the tiles.
    #[test]
    fn thin_convolutions_on_both_sides_of_the_threshold() {
        check_conv(ConvShape::same(8, 16, 9, 10, 3), 44);
        check_conv(ConvShape::same(8, 17, 9, 10, 3), 45);
        check_conv(ConvShape::same(128, 3, 6, 5, 3), 46);
    }

    #[test]
    fn wide_tiles_on_both_sides_of_their_threshold() {
        // 33 and 64 output channels take the 64×256 tiles, 65 the 128×128
        // ones; 23×29 pixels span three 256-pixel tiles, the last one short;
        // 45 taps end inside a step of 8.
        check_conv(ConvShape::same(5, 33, 23, 29, 3), 47);
        check_conv(ConvShape::same(5, 64, 23, 29, 3), 48);
        check_conv(ConvShape::same(5, 65, 23, 29, 3), 49);
    }

    /// The wide tiles give the 128×128 tiles' bits (each output's sum in
    /// the same order; on the f16 tier the same row scales), on the f32 tier
    /// and, where the adapter has it, the f16 tier; past one wide tile of
    /// pixels, with the residual and ReLU epilogue.
    #[test]
    fn wide_tiles_give_the_square_tiles_bits_on_both_tiers() {
        // 5 input channels: not the lanes kernel's shape, so the tiled kernels run on a CPU adapter too.
        let shapes = [ConvShape::same(5, 33, 23, 29, 3), ConvShape::same(5, 64, 9, 40, 3), ConvShape::same(6, 20, 11, 13, 1)];
        let check = |g: &Gpu| {
            for (i, s) in shapes.into_iter().enumerate() {
                for then in [ConvEpilogue::default(), ConvEpilogue { residual: true, relu: true }] {
                    let seed = 140 + i as u64;
                    let wide = conv_bits_then(g, s, seed, true, then);
                    let square = with_square_tiles(|| conv_bits_then(g, s, seed, true, then));
                    assert!(wide.iter().all(|&b| f32::from_bits(b).is_finite()), "{s:?}: values left unwritten");
                    assert_eq!(wide, square, "{s:?} on {}, {then:?}: wide tiles differ from square ones", g.describe());
                }
            }
        };
        check(gpu());
        if let Some(half) = half_gpu() {
            check(&half);
        }
    }

    #[test]
    fn conv1x1() {
        check_conv(ConvShape::same(6, 11, 7, 5, 1), 41);
    }

    #[test]
    fn conv3x3_stride2_with_asymmetric_padding() {
        // The VAE encoder's downsampler: pad (0, 1, 0, 1), then a stride-2 3×3 convolution.
        check_conv(crate::selftest::downsampler(4, 3, 9, 8), 42);
    }

    #[test]
    fn upsample_nearest() {
        assert_eq!(crate::selftest::check_upsample(gpu()).unwrap_or_else(|e| panic!("{e}")), 0.0, "upsample is not exact");
    }

    /// A half tier's conv2d against the oracle on its f16-rounded operands
    /// (f32 sums: the f32 kernels' bound) and on the exact ones (f16 rounding
    /// of both: measured 1.59e-4 – 1.96e-4 relative L2 on Mesa 26's lavapipe,
    /// matrix tier, 2026-11-25; bound 5e-4 as for the half tiers' linear).
    fn check_half_conv(gpu: &Gpu, s: ConvShape, seed: u64) {
        let mut rng = Rng::new(seed);
        let x = rng.normals(s.in_channels * s.height * s.width, 1.0);
        let w = rng.bf16s(s.out_channels * s.in_channels * s.kernel * s.kernel, 0.3);
        let b = rng.bf16s(s.out_channels, 1.0);
        let widen = |v: &[u16]| -> Vec<f32> { v.iter().map(|&h| flux_lite_core::numerics::bf16::to_f32(h)).collect() };
        let (wf, bf) = (widen(&w), widen(&b));
        let n_out = s.out_channels * s.out_height * s.out_width;
        let mut exact = vec![0.0; n_out];
        r::conv2d(&x, Weights::F32(&wf), Weights::F32(&bf), s, &mut exact);
        let round = operand_rounding(gpu);
        let (x16, w16): (Vec<f32>, Vec<f32>) = (x.iter().map(|&v| round(v)).collect(), wf.iter().map(|&v| round(v)).collect());
        let mut rounded = vec![0.0; n_out];
        r::conv2d(&x16, Weights::F32(&w16), Weights::F32(&bf), s, &mut rounded);
        let (xb, wb, bb, yb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b), poisoned(gpu, n_out));
        let got = run_and_read(gpu, &yb, n_out, |enc| conv2d(gpu, enc, Mat::new(&xb, 0), Weight::bf16(&wb), Weight::bf16(&bb), Mat::new(&yb, 0), s));
        let tier = gpu.precision().name();
        assert_close(&format!("{tier} conv {s:?}, vs the operands as the tier rounds them"), &got, &rounded, F32_TOL);
        println!("{tier} conv {s:?}: relative L2 {:.2e} against the exact operands", rel_l2(&got, &exact));
        assert_close(&format!("{tier} conv {s:?}, vs exact operands"), &got, &exact, crate::selftest::HALF_PRODUCT);
    }

    fn check_half_tier(gpu: &Gpu) {
        check_half_conv(gpu, ConvShape::same(5, 7, 13, 9, 3), 50);
        check_half_conv(gpu, ConvShape::same(16, 20, 33, 17, 1), 51);
        // Stride 2 with asymmetric padding (the VAE encoder's downsampling).
        let down = ConvShape { in_channels: 6, height: 13, width: 11, out_channels: 9, out_height: 6, out_width: 5, kernel: 3, stride: 2, pad_top: 0, pad_left: 0 };
        check_half_conv(gpu, down, 52);
        // More than one 128×128 tile of output channels and of pixels.
        check_half_conv(gpu, ConvShape::same(4, 130, 12, 13, 3), 53);
        // Narrow blocks on the matrix tier (4T output channels or fewer; 8×8 tiles: 32).
        check_half_conv(gpu, ConvShape::same(8, 32, 20, 11, 3), 56);
    }

    #[test]
    fn conv_on_matrix_units_matches_the_oracle() {
        let Some(gpu) = matrix_gpu() else { return };
        check_half_tier(&gpu);
    }

    /// The matrix conv2d in pieces of one run of a block's pixels gives the
    /// bits of one call: the runs, and so their scales, are the same.
    #[test]
    fn the_matrix_conv_in_pieces_of_pixels_gives_one_calls_bits() {
        let Some(gpu) = matrix_gpu() else { return };
        let c = gpu.matrix().unwrap_or_else(|| panic!("a matrix-tier device without its matrix configuration"));
        let s = ConvShape::same(6, 20, 17, 17, 3);
        let mut rng = Rng::new(54);
        let x = rng.normals(s.in_channels * s.height * s.width, 1.0);
        let (w, b) = (rng.bf16s(s.out_channels * s.in_channels * 9, 0.3), rng.bf16s(s.out_channels, 1.0));
        let (xb, wb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
        let n_out = s.out_channels * s.out_height * s.out_width;
        let block = c.size as usize * MATRIX_BLOCK_TILES as usize;
        assert!(s.out_height * s.out_width > 2 * block, "the shape must span three runs or more");
        let run = |cap: u64| {
            let yb = poisoned(&gpu, n_out);
            run_and_read(&gpu, &yb, n_out, |enc| {
                let xw = window(&gpu, &xb, 4, 0..x.len() as u64, "x")?;
                conv2d_matrix(&gpu, enc, &xw, Weight::bf16(&wb), Weight::bf16(&bb), Mat::new(&yb, 0), s, c, cap, ConvEpilogue::default())
            })
        };
        let (whole, pieces) = (run(RANGE_SCALES_ROWS), run(1));
        assert!(whole.iter().all(|v| v.is_finite()), "the whole call left values unwritten");
        assert_eq!(whole.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), pieces.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "pieces of one run differ from one call");
    }

    /// The matrix conv2d over a weight whose rows' scales were measured
    /// once (`measure_weight_rows` over its taps, as a weight reaching the
    /// device has them) gives the bits of one that measures W itself, in
    /// pieces of pixels too; and it records one pass fewer.
    #[test]
    fn the_matrix_conv_reads_a_weights_stored_scales_with_the_bits_it_would_measure() {
        let Some(gpu) = matrix_gpu() else { return };
        let c = gpu.matrix().unwrap_or_else(|| panic!("a matrix-tier device without its matrix configuration"));
        let s = ConvShape::same(6, 20, 17, 17, 3);
        let taps = (s.in_channels * 9) as u64;
        let mut rng = Rng::new(55);
        let x = rng.normals(s.in_channels * s.height * s.width, 1.0);
        let mut w = rng.bf16s(s.out_channels * taps as usize, 0.3);
        // A row far above f16's range: its scale must be its own.
        let far = 5 * taps as usize..6 * taps as usize;
        w[far].iter_mut().for_each(|v| *v = half::bf16::from_f32(half::bf16::from_bits(*v).to_f32() * 1e6).to_bits());
        let b = rng.bf16s(s.out_channels, 1.0);
        let (xb, wb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
        let scales = gpu.storage("weight row scales", 4 * (s.out_channels as u64 + 3));
        let mut measure: Vec<crate::Dispatch> = Vec::new();
        super::super::linear::measure_weight_rows(&gpu, &mut measure, Weight::bf16(&wb), s.out_channels as u64, taps, &scales, 3).unwrap();
        gpu.submit(|enc| {
            crate::encode(enc, &measure);
            Ok(())
        })
        .unwrap();
        let stored = Weight { scales: Some(crate::RowScales { buf: &scales, offset: 3, k: taps }), ..Weight::bf16(&wb) };
        let n_out = s.out_channels * s.out_height * s.out_width;
        let run = |weight: Weight<'_>, cap: u64| {
            let yb = poisoned(&gpu, n_out);
            let xw = window(&gpu, &xb, 4, 0..x.len() as u64, "x").unwrap();
            let mut recorded: Vec<crate::Dispatch> = Vec::new();
            conv2d_matrix(&gpu, &mut recorded, &xw, weight, Weight::bf16(&bb), Mat::new(&yb, 0), s, c, cap, ConvEpilogue::default()).unwrap();
            let got = run_and_read(&gpu, &yb, n_out, |enc| {
                crate::encode(enc, &recorded);
                Ok(())
            });
            (got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), recorded.len())
        };
        let ((with, with_passes), (without, without_passes)) = (run(stored, RANGE_SCALES_ROWS), run(Weight::bf16(&wb), RANGE_SCALES_ROWS));
        assert!(with.iter().all(|v| f32::from_bits(*v).is_finite()), "values left unwritten or not finite");
        assert_eq!(with, without, "stored and measured scales differ");
        assert_eq!(with_passes + 1, without_passes, "the stored scales' call still measures W");
        assert_eq!(run(stored, 1).0, without, "in pieces of pixels, stored and measured scales differ");
    }

    /// A convolution with its ReLU in the kernel's epilogue stores relu's
    /// values of the plain convolution's output, bit for bit (relu's own
    /// `max`), on every kernel: the tiled one (wide and 128-row tiles), the
    /// thin one, the CPU lanes ones where the adapter takes them, and the
    /// half tiers' where it has them.
    #[test]
    fn a_convolution_with_its_relu_stores_the_relu_of_its_output() {
        // Wide and thin lanes shapes, 128-row tiles past one tile, a 1×1.
        let shapes = [ConvShape::same(16, 40, 12, 16, 3), ConvShape::same(16, 3, 9, 36, 3), ConvShape::same(8, 130, 5, 7, 3), ConvShape::same(8, 20, 9, 12, 1)];
        let check = |g: &Gpu| {
            for (i, s) in shapes.into_iter().enumerate() {
                let plain = conv_bits(g, s, 90 + i as u64, true);
                let fused = conv_bits_then(g, s, 90 + i as u64, true, ConvEpilogue { residual: false, relu: true });
                let want: Vec<u32> = plain.iter().map(|&b| f32::from_bits(b).max(0.0).to_bits()).collect();
                assert!(plain.iter().any(|&b| f32::from_bits(b) < 0.0), "{s:?}: no negative output to clip");
                assert_eq!(fused, want, "{s:?} on {}: the fused ReLU differs from relu of the output", g.describe());
            }
        };
        each_kernel_shape(gpu(), crate::testing::options(), check);
        for tier in [half_gpu(), matrix_gpu()].into_iter().flatten() {
            check(&tier);
        }
    }

    /// A convolution with a residual in its epilogue stores its plain
    /// output plus the values it found in y (one f32 addition, as an add
    /// pass after it), then the ReLU where asked, bit for bit, on every
    /// kernel as above.
    #[test]
    fn a_residual_convolution_adds_its_output_onto_ys_values() {
        let shapes = [ConvShape::same(16, 40, 12, 16, 3), ConvShape::same(16, 3, 9, 36, 3), ConvShape::same(8, 130, 5, 7, 3), ConvShape::same(8, 20, 9, 12, 1)];
        let check = |g: &Gpu| {
            for (i, s) in shapes.into_iter().enumerate() {
                let seed = 95 + i as u64;
                let plain = conv_bits(g, s, seed, true);
                let sums: Vec<f32> = plain.iter().zip(residual_values(s, seed)).map(|(&b, r)| f32::from_bits(b) + r).collect();
                for relu in [false, true] {
                    let fused = conv_bits_then(g, s, seed, true, ConvEpilogue { residual: true, relu });
                    let want: Vec<u32> = sums.iter().map(|&v| if relu { v.max(0.0) } else { v }.to_bits()).collect();
                    assert_eq!(fused, want, "{s:?} on {}, relu {relu}: the fused sum differs from the output plus y", g.describe());
                }
            }
        };
        each_kernel_shape(gpu(), crate::testing::options(), check);
        for tier in [half_gpu(), matrix_gpu()].into_iter().flatten() {
            check(&tier);
        }
    }

    thread_local! {
        /// Set by [`with_square_tiles`]: the tiled conv2d takes 128×128 tiles
        /// and the matrix one square blocks, where they would take wide tiles
        /// or narrow blocks.
        pub(super) static SQUARE_TILES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// `run` with the convolutions on square tiles and blocks only.
    fn with_square_tiles<T>(run: impl FnOnce() -> T) -> T {
        with_switch(&SQUARE_TILES, run)
    }

    /// Narrow blocks are taken where they pad fewer output channels (at
    /// most 4T, and just past a multiple of 8T), square ones elsewhere.
    #[test]
    fn narrow_blocks_take_the_convolutions_square_ones_half_fill() {
        use crate::precision::MatrixConfig;
        let c16 = MatrixConfig { size: 16, subgroup: 32, operands: MatrixOperands::F16 };
        let pick = |n| ConvBlock::for_channels(c16, n);
        for n in [3, 16, 64, 129, 192] {
            assert_eq!(pick(n), ConvBlock::Narrow, "{n} output channels with 16×16 tiles");
        }
        for n in [65, 128, 256, 512, 200] {
            assert_eq!(pick(n), ConvBlock::Square, "{n} output channels with 16×16 tiles");
        }
        assert_eq!((ConvBlock::Narrow.columns(c16), ConvBlock::Square.columns(c16)), (64, 128));
    }

    /// The matrix conv2d in narrow blocks gives the bits of square ones (the
    /// same rows, runs and scales, each output's products in the same
    /// order), with bf16 and f32 weights, its ReLU and residual epilogue,
    /// several blocks of pixels, and past a square block's channels.
    #[test]
    fn narrow_matrix_blocks_give_the_square_blocks_bits() {
        let Some(gpu) = matrix_gpu() else { return };
        let c = gpu.matrix().unwrap_or_else(|| panic!("a matrix-tier device without its matrix configuration"));
        let t = c.size as usize;
        // Channels of one narrow block, of less than one, and just past a square block (8T + 3).
        let shapes = [ConvShape::same(8, 4 * t, 21, 13, 3), ConvShape::same(5, 3, 9, 36, 3), ConvShape::same(16, 8 * t + 3, 7, 9, 1)];
        for (i, s) in shapes.into_iter().enumerate() {
            assert_eq!(ConvBlock::for_channels(c, s.out_channels as u64), ConvBlock::Narrow, "{s:?}");
            for (bf16, then) in [(true, ConvEpilogue::default()), (false, ConvEpilogue { residual: true, relu: true })] {
                let seed = 130 + i as u64;
                let narrow = conv_bits_then(&gpu, s, seed, bf16, then);
                let square = with_square_tiles(|| conv_bits_then(&gpu, s, seed, bf16, then));
                assert!(narrow.iter().all(|&b| f32::from_bits(b).is_finite()), "{s:?}: values left unwritten");
                assert_eq!(narrow, square, "{s:?}, bf16 {bf16}, {then:?}: narrow blocks differ from square ones");
            }
        }
    }

    #[test]
    fn conv_on_f16_tiles_matches_the_oracle() {
        let Some(gpu) = half_gpu() else { return };
        check_half_tier(&gpu);
    }
}
