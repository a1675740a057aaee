//! Linear layers: `y = x·Wᵀ (+ b)` on the shared 128×128 GEMM tiling
//! (`gemm_tiles.wgsl`, also used by `conv`).
//! Shader: `linear.wgsl` beside this file.

use crate::kernel::{kernel, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::device::Gpu;
use crate::dispatch::{chunks, dispatch, placeholder_window, rows_per_chunk, to_u32, window, Launch, Rows, Sink, Window};
use crate::error::GpuError;
use crate::view::{HalfMat, Mat, RowScales, Weight, WeightDtype};
use bytemuck::{Pod, Zeroable};
use crate::kernel::{wrapped_grid, MAX_GRID_DIM};
use crate::precision::{MatrixConfig, MatrixOperands, Precision};
use crate::kernels::linear_lanes::{COLS_PER_GROUP, ROWS as LANES_ROWS};

/// `linear.wgsl` — y[m, n] = x[m, k]·W[n, k]ᵀ (+ b).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct LinearParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub x_offset: u32,
    pub x_stride: u32,
    pub w_offset: u32,
    pub b_offset: u32,
    pub y_offset: u32,
    pub y_stride: u32,
    /// The matrix tier's: where x's and W's row scales start in its scales buffer.
    pub x_scales: u32,
    pub w_scales: u32,
    /// A gated product's: where its gate's first column is.
    pub gate_offset: u32,
    /// A SwiGLU product's: W's rows from an output's gate row to its up row.
    pub up_row: u32,
    pub _pad: [u32; 3],
}

/// `range_scales.wgsl` — the range rule's scale of each of `rows` rows of `k` values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct RangeScalesParams {
    pub rows: u32,
    pub k: u32,
    pub src_offset: u32,
    /// Elements from one row to the next, and from one of a row's k values to the next.
    pub src_stride: u32,
    pub dst_offset: u32,
    pub t_stride: u32,
    pub _pad: [u32; 2],
}

/// Output tile (rows × cols) of one `linear` or `conv2d` workgroup (gemm_tiles.wgsl).
pub const GEMM_TILE: [u32; 2] = [128, 128];

pub const LINEAR: Kernel =
    kernel(Module::Linear, "linear", [16, 16, 1], &[(1, RW), (2, R), (3, R), (4, RW), (11, RW)], size_of::<LinearParams>(), true);
/// The matrix tier's linear (`linear_matrix.wgsl`), one module per tile size;
/// its workgroup is one subgroup, set by the `WG` override (hence size 0 here).
/// The f16 tier's linear: `linear.wgsl` on f16-staged tiles.
pub const LINEAR_HALF: Kernel = Kernel { module: Module::LinearHalf, ..LINEAR };
pub const LINEAR_MATRIX_8: Kernel = kernel(
    Module::LinearMatrix8,
    "linear_matrix",
    [0, 1, 1],
    &[(1, RW), (2, R), (3, R), (4, RW), (5, R), (8, R), (9, RW), (10, RW), (11, RW)],
    size_of::<LinearParams>(),
    true,
);
pub const LINEAR_MATRIX_16: Kernel = Kernel { module: Module::LinearMatrix16, ..LINEAR_MATRIX_8 };
pub const LINEAR_MATRIX_8_F32: Kernel = Kernel { module: Module::LinearMatrix8F32, ..LINEAR_MATRIX_8 };
/// The same reading x and bf16 W as vec4s at bindings 6 and 7
/// (`linear_matrix_vec4.wgsl`), where their windows are whole vec4s.
pub const LINEAR_MATRIX_8_VEC4: Kernel = kernel(
    Module::LinearMatrix8Vec4,
    "linear_matrix",
    [0, 1, 1],
    &[(3, R), (4, RW), (5, R), (6, RW), (7, R), (8, R), (9, RW), (10, RW), (11, RW)],
    size_of::<LinearParams>(),
    true,
);
pub const LINEAR_MATRIX_16_VEC4: Kernel = Kernel { module: Module::LinearMatrix16Vec4, ..LINEAR_MATRIX_8_VEC4 };
pub const LINEAR_MATRIX_8_F32_VEC4: Kernel = Kernel { module: Module::LinearMatrix8F32Vec4, ..LINEAR_MATRIX_8_VEC4 };

/// CPU adapters' linear on the f32 tier (`linear_lanes.rs`), written for
/// subgroups of 8 here and of [`Gpu::cpu_lanes`] where launched: x and W
/// read as vec4s at bindings 6 and 7.
pub const LINEAR_LANES: Kernel =
    kernel(Module::LinearLanes { lanes: 8 }, "linear_lanes", [64, 1, 1], &[(3, R), (4, RW), (6, RW), (7, R), (11, RW)], size_of::<LinearParams>(), true);

/// The range rule's row scales of a matrix-tier product's operands (`range_scales.wgsl`).
pub const RANGE_SCALES: Kernel =
    kernel(Module::RangeScales, "range_scales", [64, 1, 1], &[(1, R), (2, RW)], size_of::<RangeScalesParams>(), false);

/// Most rows of either operand one matrix-tier product measures at once:
/// the range scales it writes take at most 2 × 4 bytes × this
/// (`flux_lite_core::plan::RANGE_SCALES_BYTES`).
pub const RANGE_SCALES_ROWS: u64 = flux_lite_core::plan::RANGE_SCALES_BYTES / 8;

/// Tiles per side of the matrix linear's block (matrix_gemm.wgsl: 2 × 2
/// subgroups of 4 × 4 tiles): a workgroup computes 8T × 8T outputs.
pub const MATRIX_BLOCK_TILES: u64 = 8;
/// Subgroups in one workgroup of the matrix linear (`SUBGROUPS` in matrix_gemm.wgsl).
pub const MATRIX_SUBGROUPS: u32 = 4;

/// The sizes of one matrix product `[m, k]·[k, n]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    pub m: u64,
    pub n: u64,
    pub k: u64,
}

/// Terms of each output's sum: `k`, or one fewer where the device's options
/// inject a short linear ([`crate::FaultInjection::short_linear`]).
fn terms(gpu: &Gpu, k: u64) -> u64 {
    #[cfg(any(test, feature = "test-support"))]
    if gpu.faults().short_linear {
        return k.saturating_sub(1);
    }
    let _ = gpu;
    k
}

/// `y[m, n] = x[m, k]·W[n, k]ᵀ (+ b[n])`, W contiguous `[n, k]`; split over
/// rows of x and rows of W where one binding cannot hold them. On the matrix
/// tier it runs on cooperative-matrix tiles ([`LINEAR_MATRIX_8`], [`LINEAR_MATRIX_16`]).
pub fn linear(gpu: &Gpu, sink: &mut dyn Sink, x: Mat<'_>, w: Weight<'_>, bias: Option<Weight<'_>>, y: Mat<'_>, s: Gemm) -> Result<(), GpuError> {
    product(gpu, sink, Input::F32(x), w, bias, y, s, Out::Set)
}

/// What a product does with each output.
#[derive(Debug, Clone, Copy)]
enum Out<'a> {
    /// `y = value`.
    Set,
    /// `y += value`.
    Accumulate,
    /// `y += gate[c]·value`, the gate one row.
    Gated(Mat<'a>),
    /// `y[c] = silu(value of W's row c)·(value of W's row n + c)`.
    SwiGlu,
}

/// `stream[m, n] += gate[n] ⊙ (x[m, k]·W[n, k]ᵀ (+ b[n]))`: a linear whose
/// gated residual runs in its epilogue, the same bits as [`linear_from`]
/// into a scratch and the element-wise gated residual after it, without
/// the scratch's write and read.
#[allow(clippy::too_many_arguments)] // the linear's operands, the stream and its gate
pub fn linear_gated(gpu: &Gpu, sink: &mut dyn Sink, x: Input<'_>, w: Weight<'_>, bias: Option<Weight<'_>>, stream: Mat<'_>, gate: Mat<'_>, s: Gemm) -> Result<(), GpuError> {
    product(gpu, sink, x, w, bias, stream, s, Out::Gated(gate))
}

/// `y[m, n] = silu(x·W[0 .. n]ᵀ) ⊙ (x·W[n .. 2n]ᵀ)`, W `[2n, k]`: the
/// feed-forward's gate and up projections and its SwiGLU in one product,
/// each output's two sums held by one invocation (or one workgroup) and
/// combined in the epilogue with the element-wise SwiGLU's arithmetic, so
/// the same bits as [`linear_from`] into a `[m, 2n]` scratch and
/// `Elementwise::SwiGlu` after it, without the scratch. Needs W's `2n` rows
/// in one binding ([`swiglu_fits`]).
pub fn linear_swiglu(gpu: &Gpu, sink: &mut dyn Sink, x: Input<'_>, w: Weight<'_>, y: Mat<'_>, s: Gemm) -> Result<(), GpuError> {
    product(gpu, sink, x, w, None, y, s, Out::SwiGlu)
}

/// Whether [`linear_swiglu`] can run over `w` on `gpu`: its `2n` rows in one
/// binding, and on the matrix tier their scales within the range scales'
/// share for a product's weight rows.
pub fn swiglu_fits(gpu: &Gpu, w: Weight<'_>, s: Gemm) -> bool {
    let w_rows = Rows::packed(w.buf, w.dtype.bytes(), w.offset, s.k, "linear weight");
    let fits = rows_per_chunk(gpu, 2 * s.n, &[w_rows], 1).is_ok_and(|rows| rows >= 2 * s.n);
    fits && (gpu.matrix().is_none() || 2 * s.n <= RANGE_SCALES_ROWS)
}

/// A product's input rows: f32, or f16 under their range scales as the op
/// before wrote them (the matrix tier's half-precision data path, with f16
/// operands only).
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    F32(Mat<'a>),
    Half(HalfMat<'a>),
}

/// [`linear`] over an [`Input`]: on [`Input::Half`] the product reads the
/// rows and their scales as they are (no pass measures x); the same sums as
/// [`linear`] over the f32 values they stand for, where those would take
/// those scales.
pub fn linear_from(gpu: &Gpu, sink: &mut dyn Sink, x: Input<'_>, w: Weight<'_>, bias: Option<Weight<'_>>, y: Mat<'_>, s: Gemm) -> Result<(), GpuError> {
    product(gpu, sink, x, w, bias, y, s, Out::Set)
}

/// `y[m, n] += x[m, k]·W[n, k]ᵀ`: [`linear`] adding onto what `y` holds (a
/// LoRA adapter's up product onto the base linear's output, as PEFT adds it).
pub fn linear_add(gpu: &Gpu, sink: &mut dyn Sink, x: Mat<'_>, w: Weight<'_>, y: Mat<'_>, s: Gemm) -> Result<(), GpuError> {
    product(gpu, sink, Input::F32(x), w, None, y, s, Out::Accumulate)
}

#[allow(clippy::too_many_arguments)] // linear's operands, and what each output does to y
fn product(gpu: &Gpu, sink: &mut dyn Sink, input: Input<'_>, w: Weight<'_>, bias: Option<Weight<'_>>, y: Mat<'_>, s: Gemm, out: Out<'_>) -> Result<(), GpuError> {
    let accumulate = matches!(out, Out::Accumulate);
    let swiglu = matches!(out, Out::SwiGlu);
    let gate = match out {
        Out::Gated(g) => Some(g),
        _ => None,
    };
    let Gemm { m, n, k: kdim } = s;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let matrix = gpu.matrix();
    // f16 rows: words of two values, x's offset and stride counted in values by the kernel.
    let (x, half) = match input {
        Input::F32(x) => (x, None),
        Input::Half(h) => {
            if !matrix.is_some_and(|c| c.operands == MatrixOperands::F16) || !kdim.is_multiple_of(2) {
                return Err(GpuError::UnsupportedShape(format!("a product over f16 rows of {kdim} values needs the matrix tier's f16 operands and an even k")));
            }
            (h.data, Some(Rows::mat(h.scales, 1, "linear input scales")))
        }
    };
    let per_word = if half.is_some() { 2 } else { 1 };
    let [tile_m, tile_n] = match matrix {
        Some(c) => [c.size as u64 * MATRIX_BLOCK_TILES; 2],
        None => GEMM_TILE.map(u64::from),
    };
    let eb = w.dtype.bytes();
    let w_rows = Rows::packed(w.buf, eb, w.offset, kdim, "linear weight");
    // The matrix tier measures each piece's rows into the range scales,
    // whose size the planner allows for (RANGE_SCALES_ROWS per operand).
    let cap = if matrix.is_some() { RANGE_SCALES_ROWS } else { u64::MAX };
    let n_chunk = match swiglu {
        // One piece: each output needs W's rows n apart.
        true if swiglu_fits(gpu, w, s) => n,
        true => return Err(GpuError::UnsupportedShape(format!("a SwiGLU product over {} rows of {kdim} needs them in one binding", 2 * n))),
        false => rows_per_chunk(gpu, n, &[w_rows], tile_n)?.min(cap),
    };
    // The kernel's columns: with SwiGLU each output's gate and up sums.
    let spans = if swiglu { 2 } else { 1 };
    let x_rows = Rows::mat(x, kdim / per_word, "linear input");
    let operands: Vec<Rows<'_>> = [x_rows].into_iter().chain(half).collect();
    let y_rows = Rows::mat(y, n_chunk.min(n), "linear output");
    let row_operands: Vec<Rows<'_>> = operands.iter().copied().chain([y_rows]).collect();
    for rows in chunks(m, rows_per_chunk(gpu, m, &row_operands, tile_m)?.min(cap)) {
        let xw = x_rows.window(gpu, &rows)?;
        let x_scales = match half {
            Some(h) => Some(h.window(gpu, &rows)?),
            None => None,
        };
        // x's offset and row stride in values, as the kernel counts them.
        let (x_at, x_stride) = (xw.local as u64 * per_word, x.stride * per_word);
        for cols in chunks(n, n_chunk) {
            // With SwiGLU, W's rows from the piece's first gate row to its last up row.
            let ww = w_rows.window(gpu, &(cols.start..cols.end + if swiglu { n } else { 0 }))?;
            // bf16 rows starting on even elements load as whole u32 pairs.
            let paired = ww.local.is_multiple_of(2) && kdim.is_multiple_of(2);
            let (rows_n, cols_n) = (rows.end - rows.start, cols.end - cols.start);
            // The W rows the kernel's columns read, measured where W keeps no scales.
            let w_read = (cols.end + if swiglu { n } else { 0 }) - cols.start;
            // On a CPU adapter whose subgroups can share x's rows, where the
            // operands' rows start on whole vec4s: the lanes kernel.
            let vec4s = |elems: u64| (xw.local as u64).is_multiple_of(4) && x.stride.is_multiple_of(4) && (ww.local as u64).is_multiple_of(elems) && kdim.is_multiple_of(8);
            let row_groups = rows_n.div_ceil(LANES_ROWS as u64);
            let lanes = gpu
                .cpu_lanes()
                .filter(|_| matrix.is_none() && gpu.precision() == Precision::F32 && vec4s(if eb == 2 { 8 } else { 4 }) && row_groups <= MAX_GRID_DIM as u64);
            let (kernel, constants, grid) = match (matrix, lanes) {
                (None, Some(l)) => {
                    let constants = vec![("WEIGHT_BF16", w.dtype.constant()), ("HAS_BIAS", bias.is_some() as u32), ("ACCUMULATE", accumulate as u32), ("GATED", gate.is_some() as u32), ("SWIGLU", swiglu as u32)];
                    let lanes_kernel = Kernel { module: Module::LinearLanes { lanes: l as u8 }, ..LINEAR_LANES };
                    (lanes_kernel, constants, [row_groups as u32, (spans * cols_n).div_ceil(COLS_PER_GROUP as u64) as u32, 1])
                }
                (None, None) => {
                    let constants = vec![("WEIGHT_BF16", w.dtype.constant()), ("HAS_BIAS", bias.is_some() as u32), ("ACCUMULATE", accumulate as u32), ("GATED", gate.is_some() as u32), ("SWIGLU", swiglu as u32), ("W_PAIRED", paired as u32)];
                    let kernel = if gpu.precision() == Precision::F16 { LINEAR_HALF } else { LINEAR };
                    (kernel, constants, [(spans * cols_n).div_ceil(tile_n) as u32, rows_n.div_ceil(tile_m) as u32, 1])
                }
                (Some(c), _) => {
                    let constants = vec![
                        ("WEIGHT_BF16", w.dtype.constant()),
                        ("HAS_BIAS", bias.is_some() as u32),
                        ("ACCUMULATE", accumulate as u32),
                        ("GATED", gate.is_some() as u32),
                        ("SWIGLU", swiglu as u32),
                        ("WG", c.subgroup * MATRIX_SUBGROUPS),
                        ("B_PAIRED", matrix_b_paired(c, w.dtype, ww.local, kdim) as u32),
                        ("X_HALF", half.is_some() as u32),
                    ];
                    let kernel = match matrix_vec4s(c, [x_at, x_stride], &ww, w.dtype, terms(gpu, kdim)) {
                        true => *c.pick([&LINEAR_MATRIX_8_VEC4, &LINEAR_MATRIX_16_VEC4, &LINEAR_MATRIX_8_F32_VEC4]),
                        false => *c.pick([&LINEAR_MATRIX_8, &LINEAR_MATRIX_16, &LINEAR_MATRIX_8_F32]),
                    };
                    (kernel, constants, wrapped_grid(rows_n.div_ceil(tile_m) * (spans * cols_n).div_ceil(tile_n)))
                }
            };
            let bw = match bias {
                Some(b) => window(gpu, b.buf, eb, b.offset + cols.start..b.offset + cols.end, "linear bias")?,
                None => placeholder_window(gpu)?,
            };
            let yw = Rows { offset: y.offset + cols.start, width: cols.end - cols.start, ..y_rows }.window(gpu, &rows)?;
            // f16 operands: x's rows' range scales measured first, and W's
            // where they were not measured when W reached the device.
            let stored = w.scales.filter(|s| s.k == kdim);
            let scales = match matrix {
                Some(c) if c.operands == MatrixOperands::F16 => {
                    let scales = gpu.range_scales(rows_n + w_read)?;
                    // f16 rows come with their scales.
                    if half.is_none() {
                        measure_rows(gpu, sink, &xw, &scales, RangeScalesParams { rows: to_u32(rows_n, "linear rows")?, k: to_u32(terms(gpu, kdim), "linear k")?, src_offset: xw.local, src_stride: to_u32(x.stride, "linear input stride")?, dst_offset: 0, t_stride: 1, _pad: [0; 2] }, false)?;
                    }
                    if stored.is_none() {
                        measure_rows(gpu, sink, &ww, &scales, RangeScalesParams { rows: to_u32(w_read, "linear cols")?, k: to_u32(terms(gpu, kdim), "linear k")?, src_offset: ww.local, src_stride: to_u32(kdim, "linear k")?, dst_offset: to_u32(rows_n, "linear rows")?, t_stride: 1, _pad: [0; 2] }, w.dtype.constant() == 1)?;
                    }
                    Some(scales)
                }
                _ => None,
            };
            let sw = match &scales {
                Some(b) => window(gpu, b, 4, 0..rows_n + w_read, "range scales")?,
                None => placeholder_window(gpu)?,
            };
            // W's scales (binding 8): as kept, or after x's in the product's own.
            let (w_scales, w_scales_at) = match stored.filter(|_| scales.is_some()) {
                Some(s) => {
                    let kept = kept_scales_window(gpu, s, &(cols.start..cols.start + w_read))?;
                    let at = kept.local;
                    (kept, at)
                }
                None => (sw.clone(), sw.local + to_u32(rows_n, "linear rows")?),
            };
            // The gate's columns of this piece (binding 11), or y's window where ungated.
            let gw = match gate {
                Some(g) => window(gpu, g.buf, 4, g.offset + cols.start..g.offset + cols.end, "linear gate")?,
                None => yw.clone(),
            };
            let params = LinearParams {
                m: to_u32(rows.end - rows.start, "linear rows")?,
                n: to_u32(cols.end - cols.start, "linear cols")?,
                k: to_u32(terms(gpu, kdim), "linear k")?,
                x_offset: to_u32(x_at, "linear input offset")?,
                x_stride: to_u32(x_stride, "linear input stride")?,
                w_offset: ww.local,
                b_offset: bw.local,
                y_offset: yw.local,
                y_stride: to_u32(y.stride, "linear output stride")?,
                x_scales: x_scales.as_ref().map_or(sw.local, |w| w.local),
                w_scales: w_scales_at,
                gate_offset: gw.local,
                up_row: if swiglu { to_u32(n, "linear cols")? } else { 0 },
                _pad: [0; 3],
            };
            let launch = Launch { kernel: &kernel, constants: &constants, params, grid };
            // x at 1 or 6, or f16 rows at 9 and their scales at 10; the
            // bindings the kernel does not read take x's window too, whose
            // writable use a second buffer there could conflict with.
            let x_half_scales = x_scales.as_ref().unwrap_or(&xw);
            let (x_f32, x_half) = (&xw, &xw);
            if kernel.module.reads_vec4s() {
                dispatch(gpu, sink, launch, &[(3, &bw), (4, &yw), (5, &sw), (6, x_f32), (7, &ww), (8, &w_scales), (9, x_half), (10, x_half_scales), (11, &gw)]);
            } else if matrix.is_some() {
                dispatch(gpu, sink, launch, &[(1, x_f32), (2, &ww), (3, &bw), (4, &yw), (5, &sw), (8, &w_scales), (9, x_half), (10, x_half_scales), (11, &gw)]);
            } else if lanes.is_some() {
                dispatch(gpu, sink, launch, &[(3, &bw), (4, &yw), (6, &xw), (7, &ww), (11, &gw)]);
            } else {
                dispatch(gpu, sink, launch, &[(1, &xw), (2, &ww), (3, &bw), (4, &yw), (11, &gw)]);
            }
        }
    }
    Ok(())
}

/// `matrix_fetch.wgsl`'s `B_PAIRED` for a matrix product (linear or conv)
/// whose W window starts at element `w_local`, rows of `k`: each
/// invocation fetches a k step of W's rows as whole bf16 pairs into
/// registers during the products (else it stages them element by element).
pub(crate) fn matrix_b_paired(c: MatrixConfig, dtype: WeightDtype, w_local: u32, k: u64) -> bool {
    dtype == WeightDtype::Bf16 && w_local.is_multiple_of(2) && k.is_multiple_of(2) && c.fetches_whole_steps()
}

/// Whether the matrix linear reads x and W as vec4s
/// (`linear_matrix_vec4.wgsl`): bf16 W, x's window, its row stride, the
/// terms and W's window on whole vec4s, and each invocation's share of a
/// step whole vec4s.
fn matrix_vec4s(c: MatrixConfig, [x_at, x_stride]: [u64; 2], ww: &Window<'_>, dtype: WeightDtype, k: u64) -> bool {
    #[cfg(test)]
    if tests::ELEMENT_FETCH.get() {
        return false;
    }
    dtype == WeightDtype::Bf16 && c.fetches_vec4_steps() && x_at.is_multiple_of(4) && x_stride.is_multiple_of(4) && k.is_multiple_of(8) && ww.local.is_multiple_of(8)
}

/// The range scales of rows `0 .. rows` of `w` (rows of `k` values) into
/// f32 elements `at ..` of `dst`, as a matrix-tier product over `w` would
/// measure them itself: run once where the weight reaches the device, so
/// that every product over it reads them ([`Weight::scales`]) instead.
pub fn measure_weight_rows(gpu: &Gpu, sink: &mut dyn Sink, w: Weight<'_>, rows: u64, k: u64, dst: &wgpu::Buffer, at: u64) -> Result<(), GpuError> {
    let w_rows = Rows::packed(w.buf, w.dtype.bytes(), w.offset, k, "weight");
    for piece in chunks(rows, rows_per_chunk(gpu, rows, &[w_rows], 1)?) {
        let ww = w_rows.window(gpu, &piece)?;
        let params = RangeScalesParams { rows: to_u32(piece.end - piece.start, "weight rows")?, k: to_u32(terms(gpu, k), "weight k")?, src_offset: ww.local, src_stride: to_u32(k, "weight k")?, dst_offset: to_u32(at + piece.start, "weight row scales")?, t_stride: 1, _pad: [0; 2] };
        measure_rows(gpu, sink, &ww, dst, params, w.dtype.constant() == 1)?;
    }
    Ok(())
}

/// The window of a weight's kept row scales over its rows `rows`.
pub(crate) fn kept_scales_window<'a>(gpu: &Gpu, s: RowScales<'a>, rows: &std::ops::Range<u64>) -> Result<Window<'a>, GpuError> {
    window(gpu, s.buf, 4, s.offset + rows.start..s.offset + rows.end, "weight row scales")
}

/// One [`RANGE_SCALES`] pass: the scale of each row of `src` (f32, or bf16
/// where `bf16`) into `scales` from `params.dst_offset` on.
pub(crate) fn measure_rows(gpu: &Gpu, sink: &mut dyn Sink, src: &Window<'_>, scales: &wgpu::Buffer, params: RangeScalesParams, bf16: bool) -> Result<(), GpuError> {
    let dst = window(gpu, scales, 4, 0..(params.dst_offset + params.rows) as u64, "range scales")?;
    let launch = Launch { kernel: &RANGE_SCALES, constants: &[("SOURCE_BF16", bf16 as u32)], params, grid: wrapped_grid(params.rows as u64) };
    dispatch(gpu, sink, launch, &[(1, src), (2, &dst)]);
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testing::*;
    use flux_lite_core::oracle::{self as r, Weights};
    use crate::device::GpuOptions;

    /// [`check_linear_on`] on every kernel shape lavapipe has: the lanes
    /// kernel where k allows it, the tiled one everywhere.
    fn check_linear(seed: u64, m: usize, n: usize, k: usize, bf16: bool, with_bias: bool) {
        each_kernel_shape(gpu(), crate::testing::options(), |g| check_linear_on(g, seed, m, n, k, bf16, with_bias));
    }

    fn check_linear_on(gpu: &Gpu, seed: u64, m: usize, n: usize, k: usize, bf16: bool, with_bias: bool) {
        let mut rng = Rng::new(seed);
        let x = rng.normals(m * k, 1.0);
        let (wbits, wf) = (rng.bf16s(n * k, 0.1), rng.normals(n * k, 0.1));
        let (bbits, bf) = (rng.bf16s(n, 1.0), rng.normals(n, 1.0));
        let (w_ref, b_ref) = if bf16 { (Weights::Bf16(&wbits), Weights::Bf16(&bbits)) } else { (Weights::F32(&wf), Weights::F32(&bf)) };
        let mut want = vec![0.0; m * n];
        r::linear(&x, w_ref, with_bias.then_some(b_ref), m, n, k, &mut want);

        let xb = gpu.upload_f32("x", &x);
        let (wb, bb) = if bf16 {
            (gpu.upload_bf16("w", &wbits), gpu.upload_bf16("b", &bbits))
        } else {
            (gpu.upload_f32("w", &wf), gpu.upload_f32("b", &bf))
        };
        let weight = |buf| if bf16 { Weight::bf16(buf) } else { Weight::f32(buf) };
        let yb = poisoned(gpu, m * n);
        let got = run_and_read(gpu, &yb, m * n, |enc| {
            let bias = with_bias.then(|| weight(&bb));
            linear(gpu, enc, Mat::new(&xb, k as u64), weight(&wb), bias, Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
        });
        assert_close(&format!("linear {m}x{n}x{k} bf16={bf16} bias={with_bias}"), &got, &want, F32_TOL);
    }

    #[test]
    fn linear_bf16_with_bias() {
        check_linear(1, 70, 131, 77, true, true);
    }

    #[test]
    fn linear_in_runs_of_four_past_every_block_edge() {
        check_linear(7, 13, 70, 36, true, true);
        check_linear(8, 9, 129, 4, true, false);
    }

    #[test]
    fn linear_bf16_odd_k_no_bias() {
        // Odd k puts weight rows across u32 halves.
        check_linear(2, 1, 65, 33, true, false);
    }

    #[test]
    fn linear_bf16_pairs_over_several_tiles() {
        // Even k at an even offset: weights load as u32 pairs; 300×260 spans
        // 3×3 output tiles with partial ones, and k = 100 ends in half a k-step.
        check_linear(5, 300, 260, 100, true, true);
    }

    #[test]
    fn linear_bf16_even_k_at_an_odd_weight_offset() {
        // Rows of even length that start on the high half of a word cannot load as pairs.
        let gpu = gpu();
        let (m, n, k) = (131usize, 133usize, 64usize);
        let mut rng = Rng::new(6);
        let x = rng.normals(m * k, 1.0);
        let w = rng.bf16s(n * k + 1, 0.1);
        let mut want = vec![0.0; m * n];
        r::linear(&x, Weights::Bf16(&w[1..]), None, m, n, k, &mut want);
        let (xb, wb, yb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), poisoned(gpu, m * n));
        let got = run_and_read(gpu, &yb, m * n, |enc| {
            let w = Weight { offset: 1, ..Weight::bf16(&wb) };
            linear(gpu, enc, Mat::new(&xb, k as u64), w, None, Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
        });
        assert_close("linear at an odd weight offset", &got, &want, F32_TOL);
    }

    /// `y` (first holding `y0`) after [`linear`], or [`linear_add`] where
    /// `add`, of random x and W of these sizes, on `gpu`.
    #[allow(clippy::too_many_arguments)] // the product's sizes and options
    fn product_bits(gpu: &Gpu, seed: u64, m: usize, n: usize, k: usize, bf16: bool, with_bias: bool, add: bool) -> Vec<u32> {
        let mut rng = Rng::new(seed);
        let x = rng.normals(m * k, 1.0);
        let (wbits, wf, bbits) = (rng.bf16s(n * k, 0.1), rng.normals(n * k, 0.1), rng.bf16s(n, 1.0));
        let y0 = rng.normals(m * n, 1.0);
        let xb = gpu.upload_f32("x", &x);
        let (wb, bb) = (if bf16 { gpu.upload_bf16("w", &wbits) } else { gpu.upload_f32("w", &wf) }, gpu.upload_bf16("b", &bbits));
        let weight = if bf16 { Weight::bf16(&wb) } else { Weight::f32(&wb) };
        let yb = gpu.upload_f32("y", &y0);
        let (xm, ym, s) = (Mat::new(&xb, k as u64), Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 });
        let got = run_and_read(gpu, &yb, m * n, |enc| {
            if add {
                linear_add(gpu, enc, xm, weight, ym, s)
            } else {
                linear(gpu, enc, xm, weight, with_bias.then(|| Weight::bf16(&bb)), ym, s)
            }
        });
        got.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn the_lanes_linear_gives_the_tiled_kernels_bits() {
        // Sizes past every edge of the lanes kernel (8 rows, 256 columns a
        // workgroup, 32 terms a step), k a multiple of 8 so that it runs.
        let Some((lanes, tiled)) = lanes_and_per_lane("the lanes linear", "rows") else { return };
        for (seed, m, n, k, bf16, bias, add) in [
            (21, 70, 300, 64, true, true, false),
            (22, 9, 131, 40, true, false, false),
            (23, 129, 260, 200, false, true, false),
            (24, 17, 513, 96, true, false, true),
            (25, 3, 7, 8, false, false, false),
        ] {
            let (a, b) = (product_bits(lanes, seed, m, n, k, bf16, bias, add), product_bits(&tiled, seed, m, n, k, bf16, bias, add));
            let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
            assert_eq!(differ, 0, "{m}×{k}·{k}×{n} bf16={bf16} bias={bias} add={add}: {differ} of {} outputs differ in their bits", a.len());
        }
    }

    #[test]
    fn linear_f32() {
        check_linear(3, 129, 64, 200, false, true);
        check_linear(6, 70, 300, 64, true, true);
    }

    #[test]
    fn linear_reads_and_writes_column_windows() {
        // x is columns [5, 5+k) of a 40-wide buffer; y goes to columns [3, 3+n) of a 50-wide one.
        let gpu = gpu();
        let (m, n, k) = (37usize, 29usize, 31usize);
        let mut rng = Rng::new(4);
        let wide_x = rng.normals(m * 40, 1.0);
        let x: Vec<f32> = (0..m).flat_map(|i| wide_x[i * 40 + 5..i * 40 + 5 + k].to_vec()).collect();
        let w = rng.bf16s(n * k, 0.2);
        let mut want = vec![0.0; m * n];
        r::linear(&x, Weights::Bf16(&w), None, m, n, k, &mut want);

        let xb = gpu.upload_f32("x", &wide_x);
        let wb = gpu.upload_bf16("w", &w);
        let yb = poisoned(gpu, m * 50);
        let got = run_and_read(gpu, &yb, m * 50, |enc| {
            let x = Mat { buf: &xb, offset: 5, stride: 40 };
            let y = Mat { buf: &yb, offset: 3, stride: 50 };
            linear(gpu, enc, x, Weight::bf16(&wb), None, y, Gemm { m: m as u64, n: n as u64, k: k as u64 })
        });
        let window: Vec<f32> = (0..m).flat_map(|i| got[i * 50 + 3..i * 50 + 3 + n].to_vec()).collect();
        assert_close("linear into a column window", &window, &want, F32_TOL);
        let outside = (0..m).flat_map(|i| (0..50).filter(|c| !(3..3 + n).contains(c)).map(move |c| i * 50 + c));
        assert!(outside.into_iter().all(|i| got[i].is_nan()), "linear wrote outside its window");
    }

    #[test]
    fn linear_splits_tensors_larger_than_a_storage_binding() {
        // Cap bindings at 64 KiB: the 100 KiB bf16 weight, 140 KiB input and
        // 180 KiB output can each be bound only in pieces.
        let gpu = small_binding_gpu(64 << 10);
        assert_eq!(gpu.max_binding(), 64 << 10);
        let (m, n, k) = (180usize, 250usize, 200usize);
        assert!((n * k * 2) as u64 > gpu.max_binding() && (m * k * 4) as u64 > gpu.max_binding());
        let mut rng = Rng::new(5);
        let x = rng.normals(m * k, 1.0);
        let w = rng.bf16s(n * k, 0.1);
        let b = rng.bf16s(n, 1.0);
        let mut want = vec![0.0; m * n];
        r::linear(&x, Weights::Bf16(&w), Some(Weights::Bf16(&b)), m, n, k, &mut want);
        let (xb, wb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
        let yb = poisoned(&gpu, m * n);
        let got = run_and_read(&gpu, &yb, m * n, |enc| {
            linear(&gpu, enc, Mat::new(&xb, k as u64), Weight::bf16(&wb), Some(Weight::bf16(&bb)), Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
        });
        assert_close("split linear", &got, &want, F32_TOL);
    }

    #[test]
    fn linear_refuses_a_single_row_larger_than_a_binding() {
        let gpu = small_binding_gpu(4 << 10);
        // One f32 input row is 6000 bytes; one bf16 weight row (3000) would fit.
        let k = 1500usize;
        let xb = gpu.storage("x", (k * 4) as u64);
        let wb = gpu.storage("w", (k * 2) as u64);
        let yb = gpu.storage("y", 4);
        let err = gpu
            .submit(|enc| linear(&gpu, enc, Mat::new(&xb, k as u64), Weight::bf16(&wb), None, Mat::new(&yb, 1), Gemm { m: 1, n: 1, k: k as u64 }))
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("linear input") && msg.contains("4096 bytes"), "{msg}");
    }

    /// The half tiers' bound against the exact f32 product (why and what
    /// was measured: [`crate::selftest::HALF_PRODUCT`]).
    const HALF_TOL: f64 = crate::selftest::HALF_PRODUCT;

    /// A half tier's linear against the oracle twice: on the operands
    /// rounded to f16 as the tier sees them (the f32 kernels' 1e-5: only the
    /// order of the f32 sums differs), and on the exact operands ([`HALF_TOL`]).
    fn check_half_linear(gpu: &Gpu, seed: u64, [m, n, k]: [usize; 3], bf16: bool, with_bias: bool) {
        let mut rng = Rng::new(seed);
        let x = rng.normals(m * k, 1.0);
        let (wbits, wf) = (rng.bf16s(n * k, 0.1), rng.normals(n * k, 0.1));
        let (bbits, bf) = (rng.bf16s(n, 1.0), rng.normals(n, 1.0));
        let w_values: Vec<f32> = if bf16 { wbits.iter().map(|&b| flux_lite_core::numerics::bf16::to_f32(b)).collect() } else { wf.clone() };
        let bias_values: Vec<f32> = if bf16 { bbits.iter().map(|&b| flux_lite_core::numerics::bf16::to_f32(b)).collect() } else { bf.clone() };
        let bias_ref = with_bias.then_some(Weights::F32(&bias_values));
        let mut exact = vec![0.0; m * n];
        r::linear(&x, Weights::F32(&w_values), bias_ref, m, n, k, &mut exact);
        let round = operand_rounding(gpu);
        let (x16, w16): (Vec<f32>, Vec<f32>) = (x.iter().map(|&v| round(v)).collect(), w_values.iter().map(|&v| round(v)).collect());
        let mut rounded = vec![0.0; m * n];
        r::linear(&x16, Weights::F32(&w16), bias_ref, m, n, k, &mut rounded);

        let xb = gpu.upload_f32("x", &x);
        let (wb, bb) = if bf16 { (gpu.upload_bf16("w", &wbits), gpu.upload_bf16("b", &bbits)) } else { (gpu.upload_f32("w", &wf), gpu.upload_f32("b", &bf)) };
        let weight = |buf| if bf16 { Weight::bf16(buf) } else { Weight::f32(buf) };
        let yb = poisoned(gpu, m * n);
        let got = run_and_read(gpu, &yb, m * n, |enc| {
            let bias = with_bias.then(|| weight(&bb));
            linear(gpu, enc, Mat::new(&xb, k as u64), weight(&wb), bias, Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
        });
        let what = format!("{} linear {m}x{n}x{k} bf16={bf16} bias={with_bias}", gpu.precision().name());
        assert_close(&format!("{what}, vs the operands as the tier rounds them"), &got, &rounded, F32_TOL);
        let err = rel_l2(&got, &exact);
        println!("{what}: relative L2 {err:.2e} against the exact product");
        assert_close(&format!("{what}, vs exact operands"), &got, &exact, HALF_TOL);
    }

    /// Sizes off every tile edge (8, 16 and 128), bf16 and f32 weights, with and without bias.
    fn check_half_tier(gpu: &Gpu) {
        check_half_linear(gpu, 21, [70, 131, 77], true, true);
        check_half_linear(gpu, 22, [1, 65, 33], true, false);
        check_half_linear(gpu, 23, [33, 20, 100], false, true);
        check_half_linear(gpu, 24, [128, 96, 64], true, true);
        check_half_linear(gpu, 25, [300, 260, 100], true, true);
        // k on whole vec4s: the matrix tier reads x and W as vec4s.
        check_half_linear(gpu, 26, [300, 260, 136], true, true);
        held_within("half-tier linear adding onto its output", crate::selftest::check_linear_add(gpu, 45, 70, 12, 9), HALF_TOL);
    }

    #[test]
    fn linear_add_sums_onto_its_output_window_and_leaves_the_rest() {
        held("linear adding onto its output", crate::selftest::check_linear_add(gpu(), 45, 70, 12, 9));
        // Past one 128×128 tile both ways, with an odd rank.
        held("linear adding onto its output, several tiles", crate::selftest::check_linear_add(gpu(), 150, 260, 7, 10));
    }

    #[test]
    fn linear_on_matrix_units_matches_the_oracle() {
        let Some(gpu) = matrix_gpu() else { return };
        let c = gpu.matrix().unwrap();
        println!("matrix tier on {}: {}×{} tiles, subgroup {}", gpu.describe(), c.size, c.size, c.subgroup);
        check_half_tier(&gpu);
    }

    /// The matrix linear where bindings split x, W and y into pieces and x
    /// is a column window of a wider tensor: each piece measures its own
    /// rows' range scales into the shared scales buffer before its tiles.
    #[test]
    fn linear_on_matrix_units_splits_and_reads_a_window() {
        // From column 5 of 207 (x read element by element), and from column
        // 4 of 212 (each piece's window on whole vec4s: read as vec4s).
        for (wide, from) in [(207usize, 5usize), (212, 4)] {
            let got = split_window_case(wide, from);
            if wide == 212 {
                let by_elements = with_element_fetch(|| split_window_case(wide, from));
                assert_eq!(bits(&got), bits(&by_elements), "vec4 and element fetching differ");
            }
        }
    }

    /// [`linear_on_matrix_units_splits_and_reads_a_window`]'s product from
    /// column `from` of a `wide` x, checked against the oracle; its output.
    fn split_window_case(wide: usize, from: usize) -> Vec<f32> {
        let Some(gpu) = tier_gpu_with(GpuOptions { precision: Precision::Matrix, max_storage_binding: Some(64 << 10), ..crate::testing::options() }) else { return Vec::new() };
        let (m, n, k) = (180usize, 250usize, 200usize);
        let mut rng = Rng::new(41);
        let mut xs = rng.normals(m * wide, 1.0);
        // A row of 1e5s in a later piece: its scale must be its own, or f16 overflows.
        xs[170 * wide..171 * wide].iter_mut().for_each(|v| *v *= 1e5);
        let x: Vec<f32> = (0..m).flat_map(|i| xs[i * wide + from..i * wide + from + k].to_vec()).collect();
        let w = rng.bf16s(n * k, 0.1);
        let b = rng.bf16s(n, 1.0);
        let mut want = vec![0.0; m * n];
        r::linear(&x, Weights::Bf16(&w), Some(Weights::Bf16(&b)), m, n, k, &mut want);
        let (xb, wb, bb) = (gpu.upload_f32("x", &xs), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
        let yb = poisoned(&gpu, m * n);
        let got = run_and_read(&gpu, &yb, m * n, |enc| {
            let x = Mat::new(&xb, wide as u64).cols_from(from as u64);
            linear(&gpu, enc, x, Weight::bf16(&wb), Some(Weight::bf16(&bb)), Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
        });
        assert_close(&format!("matrix linear, split, from column {from} of {wide}"), &got, &want, HALF_TOL);
        got
    }

    thread_local! {
        /// Set by [`with_element_fetch`]: the matrix linear reads x and W element by element.
        pub(crate) static ELEMENT_FETCH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// `run` with the matrix linear reading element by element where it would read vec4s.
    pub(crate) fn with_element_fetch<T>(run: impl FnOnce() -> T) -> T {
        with_switch(&ELEMENT_FETCH, run)
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The matrix linear reading x and W as vec4s gives the bits of reading
    /// them element by element (the same values rounded the same way, the
    /// same products in the same order), with and without bias, off every
    /// tile edge, over several k steps.
    #[test]
    fn the_matrix_linears_vec4_fetching_gives_the_element_fetchings_bits() {
        let Some(gpu) = matrix_gpu() else { return };
        for (seed, [m, n, k], with_bias) in [(60, [300usize, 260usize, 136usize], true), (61, [7, 33, 64], false), (62, [129, 129, 8], true)] {
            let mut rng = Rng::new(seed);
            let x = rng.normals(m * k, 1.0);
            let (w, b) = (rng.bf16s(n * k, 0.1), rng.bf16s(n, 1.0));
            let (xb, wb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
            let run = || {
                let yb = poisoned(&gpu, m * n);
                run_and_read(&gpu, &yb, m * n, |enc| {
                    let bias = with_bias.then(|| Weight::bf16(&bb));
                    linear(&gpu, enc, Mat::new(&xb, k as u64), Weight::bf16(&wb), bias, Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
                })
            };
            let (vec4s, elements) = (run(), with_element_fetch(run));
            assert!(vec4s.iter().all(|v| v.is_finite()), "{m}×{n}×{k}: values left unwritten");
            assert_eq!(bits(&vec4s), bits(&elements), "{m}×{n}×{k}: vec4 and element fetching differ");
        }
    }


    /// A matrix linear over a weight whose rows' scales were measured once
    /// (`measure_weight_rows`, as a weight reaching the device has them)
    /// gives the bits of one that measures W itself, over a part of the
    /// weight's rows, in pieces (bindings of 64 KiB) and whole, read as
    /// vec4s (k = 136) and element by element (k = 131); and it records
    /// one pass fewer: no measure of W.
    #[test]
    fn the_matrix_linear_reads_a_weights_stored_scales_with_the_bits_it_would_measure() {
        for limit in [Some(64u64 << 10), None] {
            let Some(gpu) = tier_gpu_with(GpuOptions { precision: Precision::Matrix, max_storage_binding: limit, ..crate::testing::options() }) else { return };
            for (seed, [m, n, k]) in [(70u64, [180usize, 250usize, 136usize]), (71, [33, 70, 131])] {
                let (first, rows) = (40usize, n + 45);
                let mut rng = Rng::new(seed);
                let x = rng.normals(m * k, 1.0);
                let mut w = rng.bf16s(rows * k, 0.1);
                // A row far above f16's range: its scale must be its own.
                w[(first + 3) * k..(first + 4) * k].iter_mut().for_each(|v| *v = half::bf16::from_f32(half::bf16::from_bits(*v).to_f32() * 1e6).to_bits());
                let b = rng.bf16s(rows, 1.0);
                let (xb, wb, bb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b));
                let scales = gpu.storage("weight row scales", 4 * (rows as u64 + 5));
                let s = Gemm { m: m as u64, n: n as u64, k: k as u64 };
                let mut measure: Vec<crate::Dispatch> = Vec::new();
                measure_weight_rows(&gpu, &mut measure, Weight::bf16(&wb), rows as u64, k as u64, &scales, 5).unwrap();
                gpu.submit(|enc| {
                    crate::encode(enc, &measure);
                    Ok(())
                })
                .unwrap();
                let stored = Weight { scales: Some(crate::RowScales { buf: &scales, offset: 5, k: k as u64 }), ..Weight::bf16(&wb) };
                let run = |weight: Weight<'_>| {
                    let yb = poisoned(&gpu, m * n);
                    let mut recorded: Vec<crate::Dispatch> = Vec::new();
                    let bias = Some(Weight::bf16(&bb).rows_from(first as u64, 1));
                    linear(&gpu, &mut recorded, Mat::new(&xb, k as u64), weight.rows_from(first as u64, k as u64), bias, Mat::new(&yb, n as u64), s).unwrap();
                    let got = run_and_read(&gpu, &yb, m * n, |enc| {
                        crate::encode(enc, &recorded);
                        Ok(())
                    });
                    (got, recorded.len())
                };
                let ((with, with_passes), (without, without_passes)) = (run(stored), run(Weight::bf16(&wb)));
                assert!(with.iter().all(|v| v.is_finite()), "{m}×{n}×{k}: values left unwritten or not finite");
                assert_eq!(bits(&with), bits(&without), "{m}×{n}×{k}, bindings {limit:?}: stored and measured scales differ");
                if limit.is_none() {
                    assert_eq!(with_passes + 1, without_passes, "{m}×{n}×{k}: the stored scales' product still measures W");
                }
            }
        }
    }

    #[test]
    fn linear_on_f16_tiles_matches_the_oracle() {
        let Some(gpu) = half_gpu() else { return };
        check_half_tier(&gpu);
    }

    #[test]
    fn linear_on_matrix_units_keeps_values_beyond_f16_finite_and_close() {
        let Some(gpu) = matrix_gpu() else { return };
        check_range_rule(&gpu);
    }

    #[test]
    fn linear_on_f16_tiles_keeps_values_beyond_f16_finite_and_close() {
        let Some(gpu) = half_gpu() else { return };
        check_range_rule(&gpu);
    }

    /// The range rule (range_rule.wgsl): rows of x and of W far above f16's
    /// 65504 or below its smallest normal (6.1e-5) give what f32 gives, row
    /// by row, and never Inf or NaN.
    fn check_range_rule(gpu: &Gpu) {
        let (m, n, k) = (24usize, 19usize, 40usize);
        let mut rng = Rng::new(31);
        let mut x = rng.normals(m * k, 1.0);
        x[..k].iter_mut().for_each(|v| *v *= 1e5); // a row of 1e5s
        x[k..2 * k].iter_mut().for_each(|v| *v *= 1e-6); // a row of 1e-6s
        x[2 * k + 3] = 1e5; // one outlier among ordinary values
        let mut w = rng.normals(n * k, 0.1);
        w[..k].iter_mut().for_each(|v| *v *= 1e6); // weights of 1e5
        w[k..2 * k].iter_mut().for_each(|v| *v *= 1e-5); // weights of 1e-6
        let mut want = vec![0.0; m * n];
        r::linear(&x, Weights::F32(&w), None, m, n, k, &mut want);
        let (xb, wb, yb) = (gpu.upload_f32("x", &x), gpu.upload_f32("w", &w), poisoned(gpu, m * n));
        let got = run_and_read(gpu, &yb, m * n, |enc| {
            linear(gpu, enc, Mat::new(&xb, k as u64), Weight::f32(&wb), None, Mat::new(&yb, n as u64), Gemm { m: m as u64, n: n as u64, k: k as u64 })
        });
        assert!(want.iter().all(|v| v.is_finite()));
        assert!(got.iter().all(|v| v.is_finite()), "Inf or NaN where f32 is finite");
        // Row by row (and for the two outlier columns), the outliers are as
        // close to f32 as the ordinary rows are: f16 rounding, nothing more.
        let row_err = |row: usize| rel_l2(&got[row * n..][..n], &want[row * n..][..n]);
        let col_err = |col: usize| {
            let g: Vec<f32> = (0..m).map(|r| got[r * n + col]).collect();
            rel_l2(&g, &(0..m).map(|r| want[r * n + col]).collect::<Vec<_>>())
        };
        let ordinary = (3..m).map(row_err).fold(0.0f64, f64::max);
        println!("{} tier, ordinary rows: worst relative L2 {ordinary:.2e}", gpu.precision().name());
        for (what, err) in [("row of 1e5", row_err(0)), ("row of 1e-6", row_err(1)), ("row with an outlier", row_err(2)), ("weights of 1e5", col_err(0)), ("weights of 1e-6", col_err(1))] {
            println!("{what}: relative L2 {err:.2e}");
            assert!(err <= 2.0 * ordinary.max(HALF_TOL / 2.0), "{what}: relative L2 {err:.2e}, ordinary rows {ordinary:.2e}");
        }
    }
}
