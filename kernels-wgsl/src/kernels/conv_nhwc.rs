//! The matrix tier's convolution over channels-last f16 activations
//! (`conv_matrix_nhwc.wgsl` on `matrix_gemm.wgsl`): the VAE's data path on
//! cooperative-matrix units, where every activation is f16 rows, a pixel a
//! row, under a range scale a pixel or a piece of its channels; the
//! convolution may normalise its input as it reads it and writes the stream
//! in f16 pieces.

use crate::device::Gpu;
use crate::dispatch::{chunks, dispatch, rows_per_chunk, to_u32, window, Launch, Rows, Sink, Window};
use crate::error::GpuError;
use crate::kernel::{kernel, wrapped_grid, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::precision::{MatrixConfig, MatrixOperands};
use crate::view::{HalfMat, Mat, Weight, WeightDtype};
pub use flux_lite_core::ir::NormActivation;
use flux_lite_core::oracle::ConvShape;
use super::conv::{ConvBlock, ConvParams};
use super::linear::{kept_scales_window, matrix_b_paired, measure_rows, stores_vec4s, RangeScalesParams, MATRIX_BLOCK_TILES};

/// `conv_matrix_nhwc.wgsl`, one module per tile size; its workgroup is
/// [`super::linear::MATRIX_SUBGROUPS`] subgroups (the `WG` override), two in narrow blocks.
pub const CONV2D_MATRIX_NHWC_8: Kernel = kernel(
    Module::ConvMatrixNhwc8,
    "conv2d_matrix_nhwc",
    [0, 1, 1],
    &[(2, R), (3, R), (4, RW), (8, RW), (9, RW), (10, RW), (12, RW), (13, RW), (14, RW), (15, RW), (16, RW), (17, R), (18, R), (19, RW), (20, RW)],
    size_of::<ConvParams>(),
    true,
);
pub const CONV2D_MATRIX_NHWC_16: Kernel = Kernel { module: Module::ConvMatrixNhwc16, ..CONV2D_MATRIX_NHWC_8 };
/// The same fetching its k steps four taps at a time, W read at bindings
/// 7 (as bf16 pairs) and 21 (as f16s) in place of 2 (`conv_nhwc_vec4.wgsl`).
pub const CONV2D_MATRIX_NHWC_8_VEC4: Kernel = kernel(
    Module::ConvMatrixNhwc8Vec4,
    "conv2d_matrix_nhwc",
    [0, 1, 1],
    &[(3, R), (4, RW), (7, R), (8, RW), (9, RW), (10, RW), (12, RW), (13, RW), (14, RW), (15, RW), (16, RW), (17, R), (18, R), (19, RW), (20, RW), (21, R)],
    size_of::<ConvParams>(),
    true,
);
pub const CONV2D_MATRIX_NHWC_16_VEC4: Kernel = Kernel { module: Module::ConvMatrixNhwc16Vec4, ..CONV2D_MATRIX_NHWC_8_VEC4 };
/// All four in narrow blocks ([`ConvBlock::Narrow`]: 8T pixels × 4T output
/// channels on two subgroups), where a square block would pad more output channels.
pub const CONV2D_MATRIX_NHWC_8_NARROW: Kernel = Kernel { module: Module::ConvMatrixNhwc8Narrow, ..CONV2D_MATRIX_NHWC_8 };
pub const CONV2D_MATRIX_NHWC_16_NARROW: Kernel = Kernel { module: Module::ConvMatrixNhwc16Narrow, ..CONV2D_MATRIX_NHWC_8 };
pub const CONV2D_MATRIX_NHWC_8_VEC4_NARROW: Kernel = Kernel { module: Module::ConvMatrixNhwc8Vec4Narrow, ..CONV2D_MATRIX_NHWC_8_VEC4 };
pub const CONV2D_MATRIX_NHWC_16_VEC4_NARROW: Kernel = Kernel { module: Module::ConvMatrixNhwc16Vec4Narrow, ..CONV2D_MATRIX_NHWC_8_VEC4 };
/// All four in thin blocks ([`ConvBlock::Thin`]: 8T pixels × T output
/// channels on two subgroups of 4 × 1 tiles), for an RGB output.
pub const CONV2D_MATRIX_NHWC_8_THIN: Kernel = Kernel { module: Module::ConvMatrixNhwc8Thin, ..CONV2D_MATRIX_NHWC_8 };
pub const CONV2D_MATRIX_NHWC_16_THIN: Kernel = Kernel { module: Module::ConvMatrixNhwc16Thin, ..CONV2D_MATRIX_NHWC_8 };
pub const CONV2D_MATRIX_NHWC_8_VEC4_THIN: Kernel = Kernel { module: Module::ConvMatrixNhwc8Vec4Thin, ..CONV2D_MATRIX_NHWC_8_VEC4 };
pub const CONV2D_MATRIX_NHWC_16_VEC4_THIN: Kernel = Kernel { module: Module::ConvMatrixNhwc16Vec4Thin, ..CONV2D_MATRIX_NHWC_8_VEC4 };

/// How a channels-last convolution reads its input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NhwcInput {
    /// As stored.
    #[default]
    Plain,
    /// Through a nearest-neighbour ×2 upsampling (the VAE's up blocks):
    /// the shape's `height × width` is the stored input's, its output twice
    /// each.
    Upsampled,
}

/// The order of the taps in each row of a channels-last convolution's W.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TapOrder {
    /// `[co, ky, kx, ci]`, A's order: B's columns load as bf16 pairs.
    #[default]
    ChannelsLast,
    /// PyTorch's `[co, ci, ky, kx]`, as the model's files hold it: each value read on its own.
    Torch,
}

/// A GroupNorm (+ SiLU or ReLU) a channels-last convolution applies to its
/// input as it reads it, in place of a pass writing the normalised rows:
/// each group's `(mean, 1/√(var + eps))` in `stats` (`[groups, 2]`, from
/// [`group_merge`](super::group_norm::group_merge)), the affine weight and
/// bias (W's dtype).
#[derive(Debug, Clone, Copy)]
pub struct NhwcNorm<'a> {
    pub stats: Mat<'a>,
    pub gamma: Weight<'a>,
    pub beta: Weight<'a>,
    pub groups: u64,
    pub activation: NormActivation,
}

/// A channels-last convolution's input: f16 rows (a scale a pixel, or one
/// a piece), normalised as read where `norm` says so.
#[derive(Debug, Clone, Copy)]
pub struct NhwcSource<'a> {
    pub rows: HalfMat<'a>,
    pub norm: Option<NhwcNorm<'a>>,
}

impl<'a> From<HalfMat<'a>> for NhwcSource<'a> {
    fn from(rows: HalfMat<'a>) -> Self {
        Self { rows, norm: None }
    }
}

/// Where a channels-last convolution's outputs go, `[out pixels, out
/// channels]` rows, each ReLU'd after its bias and residual where `relu`.
#[derive(Debug, Clone, Copy)]
pub enum NhwcOutput<'a> {
    /// f32 rows (`y.stride` = out channels), y's own values added where `residual`.
    F32 { y: Mat<'a>, residual: bool, relu: bool },
    /// f16 rows in pieces ([`HalfMat::pieces`]: the next ops' input, the
    /// VAE's stream), the values of `residual` (f16 rows in the same
    /// pieces, another tensor) added where given.
    Half { y: HalfMat<'a>, residual: Option<HalfMat<'a>>, relu: bool },
}

/// A channels-last convolution's W (packed as f16 under its rows' kept
/// range scales where they say so: [`crate::RowScales::packed`]) and bias,
/// and how W's taps are ordered.
#[derive(Debug, Clone, Copy)]
pub struct NhwcWeights<'a> {
    pub w: Weight<'a>,
    pub bias: Weight<'a>,
    pub order: TapOrder,
}

/// A convolution of `s` over `x`, `[height·width, in_channels]` f16 rows
/// (a pixel's row whole words: an odd count's last half zero) under one
/// range scale a pixel ([`HalfMat::rows`]) or in pieces
/// (`x.rows.data.stride` words a pixel), normalised as read where
/// `x.norm` says so, into `out`. W's taps in
/// `weights.order`, its rows' range scales kept ([`Weight::scales`]) or
/// measured here. Runs in chunks of output pixels, each binding its own
/// window of the input rows. Needs the matrix tier's f16 operands, taps
/// that reach at most `kernel / 2` zeros past each side of the input (a
/// stride only where the input is read as stored), and W and the bias in
/// one binding; f16 outputs, pieces that divide the output channels, at
/// most four a block of them.
pub fn conv2d_matrix_nhwc(gpu: &Gpu, sink: &mut dyn Sink, source: NhwcSource<'_>, weights: NhwcWeights<'_>, out: NhwcOutput<'_>, s: ConvShape, input: NhwcInput) -> Result<(), GpuError> {
    let NhwcWeights { w, bias, order } = weights;
    let NhwcSource { rows: x, norm } = source;
    let Some(c) = gpu.matrix().filter(|c| c.operands == MatrixOperands::F16) else {
        return Err(GpuError::UnsupportedShape("a channels-last f16 convolution needs the matrix tier's f16 operands".into()));
    };
    let up = if input == NhwcInput::Upsampled { 2 } else { 1 };
    let (cin, out_channels) = (s.in_channels as u64, s.out_channels as u64);
    let x_pieces = match x.piece {
        None => 1,
        Some(piece) if piece > 0 && piece.is_multiple_of(2) && cin.is_multiple_of(piece) && x.scales.stride == cin / piece => cin / piece,
        Some(piece) => return Err(GpuError::UnsupportedShape(format!("a channels-last convolution's input in pieces of {piece} of {cin} channels"))),
    };
    if !s.taps_fit(up) || s.stride == 0 || (up == 2 && s.stride != 1) {
        return Err(GpuError::UnsupportedShape(format!("a channels-last convolution {s:?} ({input:?}; its taps within the input and at most kernel / 2 zeros each side, no stride upsampled)")));
    }
    // The bias and a norm's gamma and beta are read as `WEIGHT_BF16` says;
    // W too, unless it is packed (its words f16, whatever it was before).
    let packed = w.scales.is_some_and(|r| r.packed);
    if !packed && w.dtype != bias.dtype {
        return Err(GpuError::UnsupportedShape(format!("a convolution's W ({:?}) and bias ({:?}) share a dtype unless W is packed", w.dtype, bias.dtype)));
    }
    // A block of 8T output pixels (BM) × `shape`'s columns of output channels (BN).
    let (block, shape) = (c.size as u64 * MATRIX_BLOCK_TILES, ConvBlock::for_channels_last(c, out_channels));
    let rows = OutputRows::of(out, out_channels, shape.columns(c))?;
    let norm = norm.map(|n| NormWindows::of(gpu, n, cin, bias.dtype)).transpose()?;
    if x.data.stride != cin.div_ceil(2) {
        return Err(GpuError::UnsupportedShape("channels-last rows are whole pixels: x a pixel's words apart".into()));
    }
    let (plane, taps) = ((s.out_height * s.out_width) as u64, cin * (s.kernel * s.kernel) as u64);
    let ww = window(gpu, w.buf, w.dtype.bytes(), w.offset..w.offset + out_channels * taps, "conv weight")?;
    let bw = window(gpu, bias.buf, bias.dtype.bytes(), bias.offset..bias.offset + out_channels, "conv bias")?;
    // W's row scales: as kept, or measured now into the range scales (a
    // packed W's are kept: its words are no longer bf16).
    let kept = w.scales.filter(|r| r.k == taps);
    if packed && kept.is_none() {
        return Err(GpuError::UnsupportedShape("a convolution's packed W comes with its kept row scales".into()));
    }
    let measured = match kept {
        Some(_) => None,
        None => Some(gpu.range_scales(out_channels)?),
    };
    let stored = match (kept, &measured) {
        (Some(kept), _) => kept_scales_window(gpu, kept, &(0..out_channels))?,
        (None, buffer) => {
            let buffer = buffer.as_ref().ok_or_else(|| GpuError::UnsupportedShape("W's row scales neither kept nor measured".into()))?;
            let measure = RangeScalesParams { rows: to_u32(out_channels, "conv output channels")?, k: to_u32(taps, "conv taps")?, src_offset: ww.local, src_stride: to_u32(taps, "conv taps")?, dst_offset: 0, t_stride: 1, _pad: [0; 2] };
            measure_rows(gpu, sink, &ww, buffer, measure, w.dtype.constant() == 1)?;
            window(gpu, buffer, 4, 0..out_channels, "range scales")?
        }
    };
    let x_rows = Rows::mat(x.data, cin.div_ceil(2), "conv input");
    let x_scale_rows = Rows::mat(x.scales, x_pieces, "conv input scales");
    // Chunks of whole blocks of output pixels whose output rows, and the
    // input rows under them, each fit one binding.
    let mut piece = rows_per_chunk(gpu, plane, &rows.all(), block)?;
    while piece > block && !input_fits(gpu, &s, up, piece, &[x_rows, x_scale_rows]) {
        piece = (piece / 2).div_ceil(block) * block;
    }
    let taps_last = order == TapOrder::ChannelsLast || s.kernel == 1;
    let paired = taps_last && matrix_b_paired(c, w.dtype, ww.local, taps);
    let quads = fetches_quads(c, shape, &s, taps_last, ww.local, w.dtype, x.piece, norm.as_ref().map(|n| n.groups));
    let kernel = match (quads, c.size == 16, shape) {
        (true, true, ConvBlock::Square) => CONV2D_MATRIX_NHWC_16_VEC4,
        (true, false, ConvBlock::Square) => CONV2D_MATRIX_NHWC_8_VEC4,
        (false, true, ConvBlock::Square) => CONV2D_MATRIX_NHWC_16,
        (false, false, ConvBlock::Square) => CONV2D_MATRIX_NHWC_8,
        (true, true, ConvBlock::Narrow) => CONV2D_MATRIX_NHWC_16_VEC4_NARROW,
        (true, false, ConvBlock::Narrow) => CONV2D_MATRIX_NHWC_8_VEC4_NARROW,
        (false, true, ConvBlock::Narrow) => CONV2D_MATRIX_NHWC_16_NARROW,
        (false, false, ConvBlock::Narrow) => CONV2D_MATRIX_NHWC_8_NARROW,
        (true, true, ConvBlock::Thin) => CONV2D_MATRIX_NHWC_16_VEC4_THIN,
        (true, false, ConvBlock::Thin) => CONV2D_MATRIX_NHWC_8_VEC4_THIN,
        (false, true, ConvBlock::Thin) => CONV2D_MATRIX_NHWC_16_THIN,
        (false, false, ConvBlock::Thin) => CONV2D_MATRIX_NHWC_8_THIN,
    };
    let [kt, stages, out_slots] = c.staging.constants(c.size);
    // y's pixels as vec4s of outputs (bindings 19 and 20; values counted as
    // f32 or f16): every chunk's window keeps y's offset within a vec4, its
    // pixels being whole ones.
    let per_word = if rows.half { 2 } else { 1 };
    let y_vec4 = stores_vec4s(rows.y.offset * per_word, rows.y.stride * per_word, out_channels);
    let constants = [
        ("WEIGHT_BF16", bias.dtype.constant()),
        ("WG", c.subgroup * shape.subgroups()),
        ("B_PAIRED", paired as u32),
        ("KERNEL", to_u32(s.kernel as u64, "conv kernel")?),
        ("IN_CHANNELS", to_u32(s.in_channels as u64, "conv input channels")?),
        ("OUT_WIDTH", to_u32(s.out_width as u64, "conv output width")?),
        ("UPSAMPLE", (up == 2) as u32),
        ("W_TAPS_LAST", taps_last as u32),
        ("W_HALF", packed as u32),
        ("X_PIECE", to_u32(x.piece.unwrap_or(0), "conv input piece")?),
        ("RESIDUAL", rows.f32_residual as u32),
        ("RELU", rows.relu as u32),
        ("Y_HALF", rows.half as u32),
        ("Y_PIECE", to_u32(rows.piece, "conv output piece")?),
        ("RESIDUAL_HALF", rows.residual.is_some() as u32),
        ("NORM_IN", norm.is_some() as u32),
        ("NORM_ACT", norm.as_ref().map_or(0, |n| activation_constant(n.activation))),
        ("NORM_GROUPS", to_u32(norm.as_ref().map_or(1, |n| n.groups), "group norm groups")?),
        ("Y_VEC4", y_vec4 as u32),
        kt,
        stages,
        out_slots,
    ];
    for px in chunks(plane, piece) {
        let source = input_pixels(&s, up, &px);
        let (xw, xsw) = (x_rows.window(gpu, &source)?, x_scale_rows.window(gpu, &source)?);
        let yw = rows.y.window(gpu, &px)?;
        let y_vec4 = if y_vec4 { yw.clone() } else { window(gpu, gpu.unused_writable(), 4, 0..4, "unused output")? };
        // The f16 output's scales and the residual's rows, or y's window where there are none.
        let [ysw, rw, rsw] = [rows.y_scales, rows.residual.map(|r| r[0]), rows.residual.map(|r| r[1])].map(|r| window_or(gpu, r, &px, &yw));
        let (ysw, rw, rsw) = (ysw?, rw?, rsw?);
        let params = ConvParams {
            px_first: to_u32(px.start, "conv output pixels")?,
            px_count: to_u32(px.end - px.start, "conv output pixels")?,
            x_scales: xsw.local,
            w_scales: stored.local,
            x_first: to_u32(source.start, "conv input pixels")?,
            y_scales: ysw.local,
            r_offset: rw.local,
            r_scales: rsw.local,
            n_stats: norm.as_ref().map_or(0, |n| n.stats.local),
            n_affine: norm.as_ref().map_or(0, |n| n.gamma.local),
            ..ConvParams::of(&s, out_channels, [xw.local, ww.local, bw.local, yw.local])
        };
        let grid = wrapped_grid((px.end - px.start).div_ceil(block) * out_channels.div_ceil(shape.columns(c)));
        let launch = Launch { kernel: &kernel, constants: &constants, params, grid };
        // Without a norm its bindings take y's window, and W's for the read-only ones.
        let (nsw, ngw, nbw) = match &norm {
            Some(n) => (&n.stats, &n.gamma, &n.beta),
            None => (&yw, &ww, &ww),
        };
        let shared = [(3, &bw), (4, &yw), (8, &stored), (9, &xw), (10, &xsw), (12, &yw), (13, &ysw), (14, &rw), (15, &rsw), (16, nsw), (17, ngw), (18, nbw), (19, &y_vec4), (20, &y_vec4)];
        let w_bindings = if quads { vec![(7, &ww), (21, &ww)] } else { vec![(2, &ww)] };
        let bindings = [&shared[..], &w_bindings].concat();
        dispatch(gpu, sink, launch, &bindings);
    }
    Ok(())
}

/// Whether the channels-last convolution fetches its k steps four taps at
/// a time (`conv_nhwc_vec4.wgsl`): W bf16 (or packed f16) with its taps
/// last, its window (from element `w_local`) and the taps whole runs of 8;
/// the input's channels, its pieces and a norm group's channels whole runs
/// of 4; and each invocation's share of a step whole vec4s.
#[allow(clippy::too_many_arguments)] // the tiles and block, the shape, and what A and W are
fn fetches_quads(c: MatrixConfig, block: ConvBlock, s: &ConvShape, taps_last: bool, w_local: u32, dtype: WeightDtype, x_piece: Option<u64>, norm_groups: Option<u64>) -> bool {
    #[cfg(test)]
    if tests::ELEMENT_FETCH.get() {
        return false;
    }
    let (cin, taps) = (s.in_channels as u64, (s.in_channels * s.kernel * s.kernel) as u64);
    dtype == WeightDtype::Bf16
        && taps_last
        && c.fetches_vec4_steps_on(block.subgroups(), block.columns(c))
        && w_local.is_multiple_of(8)
        && taps.is_multiple_of(8)
        && cin.is_multiple_of(4)
        && x_piece.is_none_or(|p| p.is_multiple_of(4))
        && norm_groups.is_none_or(|g| (cin / g).is_multiple_of(4))
}

/// `conv_matrix_nhwc.wgsl`'s `NORM_ACT` for an activation.
fn activation_constant(a: NormActivation) -> u32 {
    match a {
        NormActivation::None => 0,
        NormActivation::Silu => 1,
        NormActivation::Relu => 2,
    }
}

/// The windows of an [`NhwcNorm`] over `channels` input channels.
struct NormWindows<'a> {
    stats: Window<'a>,
    gamma: Window<'a>,
    beta: Window<'a>,
    groups: u64,
    activation: NormActivation,
}

impl<'a> NormWindows<'a> {
    /// Checked: groups that divide the channels, gamma and beta in the bias's dtype, equally aligned.
    fn of(gpu: &Gpu, n: NhwcNorm<'a>, channels: u64, dtype: crate::view::WeightDtype) -> Result<Self, GpuError> {
        if n.groups == 0 || !channels.is_multiple_of(n.groups) || n.gamma.dtype != dtype || n.beta.dtype != dtype {
            return Err(GpuError::UnsupportedShape(format!("a convolution's input normalised in {} groups of {channels} channels (gamma and beta in W's dtype)", n.groups)));
        }
        let stats = window(gpu, n.stats.buf, 4, n.stats.offset..n.stats.offset + 2 * n.groups, "group norm statistics")?;
        let (gamma, beta) = super::group_norm::affine_windows(gpu, [n.gamma, n.beta], channels)?;
        Ok(Self { stats, gamma, beta, groups: n.groups, activation: n.activation })
    }
}

/// `rows`' window over `px`, or `or` where there are none.
fn window_or<'b>(gpu: &Gpu, rows: Option<Rows<'b>>, px: &std::ops::Range<u64>, or: &Window<'b>) -> Result<Window<'b>, GpuError> {
    match rows {
        Some(r) => r.window(gpu, px),
        None => Ok(or.clone()),
    }
}

/// A channels-last convolution's output operands as rows of output pixels.
struct OutputRows<'a> {
    /// f32 values, or f16 words.
    y: Rows<'a>,
    y_scales: Option<Rows<'a>>,
    /// The residual's words and scales (f16 outputs).
    residual: Option<[Rows<'a>; 2]>,
    f32_residual: bool,
    half: bool,
    relu: bool,
    /// Output channels a scale (f16 outputs).
    piece: u64,
}

impl<'a> OutputRows<'a> {
    /// `out`'s rows of `channels`, checked: whole pixels a row, f16 pieces
    /// that divide the channels, at most [`MAX_BLOCK_PIECES`] in a block of
    /// `block` outputs, the residual in y's pieces.
    fn of(out: NhwcOutput<'a>, channels: u64, block: u64) -> Result<Self, GpuError> {
        match out {
            NhwcOutput::F32 { y, residual, relu } => {
                if y.stride != channels {
                    return Err(GpuError::UnsupportedShape("channels-last rows are whole pixels: y a pixel's channels apart".into()));
                }
                Ok(Self { y: Rows::mat(y, channels, "conv output"), y_scales: None, residual: None, f32_residual: residual, half: false, relu, piece: 1 })
            }
            NhwcOutput::Half { y, residual, relu } => {
                let piece = y.piece.unwrap_or(channels);
                // A block's columns start on a piece, and hold at most four.
                let pieces_fit = piece > 0 && channels.is_multiple_of(piece) && piece.is_multiple_of(2) && (channels <= block || block.is_multiple_of(piece)) && block.min(channels) / piece <= MAX_BLOCK_PIECES;
                let whole_pixels = |h: &HalfMat<'_>| h.data.stride == channels / 2 && h.scales.stride.max(1) == channels / piece && h.piece.unwrap_or(channels) == piece;
                if !pieces_fit || !whole_pixels(&y) || residual.as_ref().is_some_and(|r| !whole_pixels(r)) {
                    return Err(GpuError::UnsupportedShape(format!("a channels-last convolution's f16 output of {channels} channels in pieces of {piece} (whole pixels a row, the residual in the same pieces, at most {MAX_BLOCK_PIECES} a block of {block})")));
                }
                let rows = |h: HalfMat<'a>| [Rows::mat(h.data, channels / 2, "conv f16 output"), Rows::mat(h.scales, channels / piece, "conv output scales")];
                let [yr, ys] = rows(y);
                Ok(Self { y: yr, y_scales: Some(ys), residual: residual.map(rows), f32_residual: false, half: true, relu, piece })
            }
        }
    }

    /// Every operand's rows, for the chunks' binding limits.
    fn all(&self) -> Vec<Rows<'a>> {
        let mut all = vec![self.y];
        all.extend(self.y_scales);
        all.extend(self.residual.into_iter().flatten());
        all
    }
}

/// The most f16 pieces a block of a product's outputs may write
/// (`matrix_gemm.wgsl`'s `MAX_BLOCK_PIECES`).
const MAX_BLOCK_PIECES: u64 = 4;

/// The stored input pixels the output pixels `px` read: whole input rows
/// from the one under their first row's top tap to the one under their
/// last row's bottom tap, inside the image.
fn input_pixels(s: &ConvShape, up: usize, px: &std::ops::Range<u64>) -> std::ops::Range<u64> {
    let (out_w, k, pad, stride) = (s.out_width as u64, s.kernel as u64, s.pad_top as u64, s.stride as u64);
    let first_row = (px.start / out_w * stride).saturating_sub(pad) / up as u64;
    let last_row = (((px.end - 1) / out_w * stride + k - 1).saturating_sub(pad) / up as u64).min(s.height as u64 - 1);
    first_row * s.width as u64..(last_row + 1) * s.width as u64
}

/// Whether a piece of `piece` output pixels' input rows fit every operand's binding.
fn input_fits(gpu: &Gpu, s: &ConvShape, up: usize, piece: u64, operands: &[Rows<'_>]) -> bool {
    // The widest input a piece of this size can read: its output rows plus the kernel's.
    let rows = ((piece.div_ceil(s.out_width as u64) + 1) * s.stride as u64 + s.kernel as u64).div_ceil(up as u64) + 1;
    let pixels = rows * s.width as u64;
    operands.iter().all(|o| rows_per_chunk(gpu, pixels, &[*o], 1).is_ok_and(|n| n >= pixels))
}

#[cfg(test)]
#[path = "conv_nhwc_tests.rs"]
mod tests;
