//! Elementwise ops over `[rows, cols]` views (SiLU, SwiGLU, gated
//! residual, add, scale, axpy, copy, ReLU, the tanh soft clamp, scale and shift) and the transpose between tokens and channels.
//! Shader: `elementwise.wgsl` beside this file.

use crate::kernel::{kernel, Access::ReadWrite as RW, Kernel, Module};
use crate::device::Gpu;
use crate::dispatch::{dispatch, grid64, row_chunks, to_u32, window, Launch, Rows, Sink};
use crate::error::GpuError;
use crate::view::Mat;
use bytemuck::{Pod, Zeroable};

/// `elementwise.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct ElementwiseParams {
    pub rows: u32,
    pub cols: u32,
    pub a_offset: u32,
    pub a_stride: u32,
    pub b_offset: u32,
    pub b_stride: u32,
    pub dst_offset: u32,
    pub dst_stride: u32,
    pub scalar: f32,
    pub gate_offset: u32,
    /// The added constant of `ScaleShift`.
    pub shift: f32,
    pub _pad: u32,
}

const fn unary(entry: &'static str) -> Kernel {
    kernel(Module::Elementwise, entry, [64, 1, 1], &[(1, RW), (3, RW)], size_of::<ElementwiseParams>(), false)
}
const fn binary(entry: &'static str) -> Kernel {
    kernel(Module::Elementwise, entry, [64, 1, 1], &[(1, RW), (2, RW), (3, RW)], size_of::<ElementwiseParams>(), false)
}
pub const SILU: Kernel = unary("silu_op");
pub const SWIGLU: Kernel = binary("swiglu");
pub const GATED_RESIDUAL: Kernel = binary("gated_residual");
pub const ADD: Kernel = binary("add");
pub const ADD_RELU: Kernel = binary("add_relu");
pub const ADD_INPLACE: Kernel = unary("add_inplace");
pub const SCALE: Kernel = unary("scale");
pub const AXPY: Kernel = unary("axpy");
pub const COPY: Kernel = unary("copy");
pub const TRANSPOSE: Kernel = unary("transpose");
pub const RELU: Kernel = unary("relu");
pub const TANH_CLAMP: Kernel = unary("tanh_clamp");
pub const SCALE_SHIFT: Kernel = unary("scale_shift");

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
    /// dst = max(a + b, 0)
    AddRelu,
    /// dst += a
    AddInPlace,
    /// dst = a·s
    Scale(f32),
    /// dst += s·a
    Axpy(f32),
    /// dst = a (concatenation and split along features)
    Copy,
    /// dst = max(a, 0)
    Relu,
    /// dst = tanh(a/s)·s, a soft clamp to (−s, s)
    TanhClamp(f32),
    /// dst = a·s + shift
    ScaleShift(f32, f32),
}

/// Runs `op` over `[rows, cols]`; `b` is the second operand (or the gate row for `GatedResidual`).
pub fn elementwise(
    gpu: &Gpu,
    sink: &mut dyn Sink,
    op: Elementwise,
    a: Mat<'_>,
    b: Option<Mat<'_>>,
    dst: Mat<'_>,
    [rows, cols]: [u64; 2],
) -> Result<(), GpuError> {
    let kernel = match op {
        Elementwise::Silu => &SILU,
        Elementwise::SwiGlu => &SWIGLU,
        Elementwise::GatedResidual => &GATED_RESIDUAL,
        Elementwise::Add => &ADD,
        Elementwise::AddRelu => &ADD_RELU,
        Elementwise::AddInPlace => &ADD_INPLACE,
        Elementwise::Scale(_) => &SCALE,
        Elementwise::Axpy(_) => &AXPY,
        Elementwise::Copy => &COPY,
        Elementwise::Relu => &RELU,
        Elementwise::TanhClamp(_) => &TANH_CLAMP,
        Elementwise::ScaleShift(..) => &SCALE_SHIFT,
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
    for chunk in row_chunks(gpu, rows, &operands, 1)? {
        let aw = a_rows.window(gpu, &chunk)?;
        let dw = d_rows.window(gpu, &chunk)?;
        let bw = match (b, b_rows) {
            (Some(g), None) => Some(window(gpu, g.buf, 4, g.offset..g.offset + cols, "gate")?),
            (_, Some(br)) => Some(br.window(gpu, &chunk)?),
            (None, None) => None,
        };
        let params = ElementwiseParams {
            rows: to_u32(chunk.end - chunk.start, "elementwise rows")?,
            cols: to_u32(cols, "elementwise cols")?,
            a_offset: aw.local,
            a_stride: to_u32(a.stride, "elementwise stride")?,
            b_offset: if gate { 0 } else { bw.as_ref().map_or(0, |w| w.local) },
            b_stride: to_u32(b.map_or(0, |b| b.stride), "elementwise stride")?,
            dst_offset: dw.local,
            dst_stride: to_u32(dst.stride, "elementwise stride")?,
            scalar: match op {
                Elementwise::Scale(s) | Elementwise::Axpy(s) | Elementwise::TanhClamp(s) | Elementwise::ScaleShift(s, _) => s,
                _ => 0.0,
            },
            gate_offset: if gate { bw.as_ref().map_or(0, |w| w.local) } else { 0 },
            shift: match op {
                Elementwise::ScaleShift(_, shift) => shift,
                _ => 0.0,
            },
            _pad: 0,
        };
        let mut storage = vec![(1, &aw)];
        if let Some(w) = &bw {
            storage.push((2, w));
        }
        storage.push((3, &dw));
        dispatch(gpu, sink, Launch { kernel, constants: &[], params, grid: grid64((chunk.end - chunk.start) * cols) }, &storage);
    }
    Ok(())
}

/// `dst[c, r] = a[r, c]`: between `[tokens, features]` and `[channels, pixels]`.
pub fn transpose(gpu: &Gpu, sink: &mut dyn Sink, a: Mat<'_>, dst: Mat<'_>, rows: u64, cols: u64) -> Result<(), GpuError> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let aw = Rows::mat(a, cols, "transpose input").window(gpu, &(0..rows))?;
    let dw = Rows::mat(dst, rows, "transpose output").window(gpu, &(0..cols))?;
    let params = ElementwiseParams {
        rows: to_u32(rows, "transpose rows")?,
        cols: to_u32(cols, "transpose cols")?,
        a_offset: aw.local,
        a_stride: to_u32(a.stride, "transpose stride")?,
        dst_offset: dw.local,
        dst_stride: to_u32(dst.stride, "transpose stride")?,
        ..Default::default()
    };
    dispatch(gpu, sink, Launch { kernel: &TRANSPOSE, constants: &[], params, grid: grid64(rows * cols) }, &[(1, &aw), (3, &dw)]);
    Ok(())
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use flux_lite_core::oracle as r;

    /// The selftest's element-wise check (a strided input, NaN-poisoned output where the op does not read it), held to the f32 bound.
    fn check_elementwise(op: Elementwise, seed: u64) {
        let worst = crate::selftest::check_elementwise(gpu(), op, seed).unwrap_or_else(|e| panic!("{op:?}: {e}"));
        assert!(worst <= F32_TOL, "{op:?}: relative L2 {worst:.3e} > {F32_TOL:.0e}");
    }

    #[test]
    fn elementwise_ops() {
        for (i, op) in crate::selftest::ELEMENTWISE_OPS.into_iter().enumerate() {
            check_elementwise(op, 20 + i as u64);
        }
    }

    /// Arguments far outside tanh's curve clamp to ±s, never NaN (a tanh
    /// computed from exponentials would give inf/inf there).
    #[test]
    fn the_tanh_clamp_saturates_without_nan() {
        let gpu = gpu();
        let x = [1e30f32, -1e30, 3.0e4, -3.0e4, 90.0, -90.0, 0.0];
        let xb = gpu.upload_f32("x", &x);
        let out = poisoned(gpu, x.len());
        let got = run_and_read(gpu, &out, x.len(), |enc| elementwise(gpu, enc, Elementwise::TanhClamp(3.0), Mat::new(&xb, 7), None, Mat::new(&out, 7), [1, 7]));
        assert_eq!(got, [3.0, -3.0, 3.0, -3.0, 3.0, -3.0, 0.0]);
    }

    #[test]
    fn concatenate_and_split_along_features() {
        // [txt ; img] joint attention inputs become one [rows, 2·cols] tensor and back.
        let gpu = gpu();
        let (rows, c1, c2) = (9usize, 21usize, 34usize);
        let mut rng = Rng::new(30);
        let (p1, p2) = (rng.normals(rows * c1, 1.0), rng.normals(rows * c2, 1.0));
        let (b1, b2) = (gpu.upload_f32("p1", &p1), gpu.upload_f32("p2", &p2));
        let cat = poisoned(gpu, rows * (c1 + c2));
        let w = (c1 + c2) as u64;
        let got = run_and_read(gpu, &cat, rows * (c1 + c2), |enc| {
            elementwise(gpu, enc, Elementwise::Copy, Mat::new(&b1, c1 as u64), None, Mat::new(&cat, w), [rows as u64, c1 as u64])?;
            elementwise(gpu, enc, Elementwise::Copy, Mat::new(&b2, c2 as u64), None, Mat::new(&cat, w).cols_from(c1 as u64), [rows as u64, c2 as u64])
        });
        let want: Vec<f64> = (0..rows).flat_map(|i| p1[i * c1..(i + 1) * c1].iter().chain(&p2[i * c2..(i + 1) * c2]).map(|&v| v as f64).collect::<Vec<_>>()).collect();
        assert_close("concat", &got, &want, 0.0);
        let back = poisoned(gpu, rows * c2);
        let split = run_and_read(gpu, &back, rows * c2, |enc| {
            elementwise(gpu, enc, Elementwise::Copy, Mat::new(&cat, w).cols_from(c1 as u64), None, Mat::new(&back, c2 as u64), [rows as u64, c2 as u64])
        });
        assert_eq!(split, p2);
    }

    #[test]
    fn elementwise_splits_rows_under_a_small_binding() {
        let gpu = small_binding_gpu(4 << 10);
        let (rows, cols) = (300usize, 50usize); // 60 KB per operand
        let mut rng = Rng::new(31);
        let (a, b) = (rng.normals(rows * cols, 1.0), rng.normals(rows * cols, 1.0));
        let want: Vec<f64> = a.iter().zip(&b).map(|(&x, &y)| r::silu(x as f64) * y as f64).collect();
        let (ab, bb, db) = (gpu.upload_f32("a", &a), gpu.upload_f32("b", &b), poisoned(&gpu, rows * cols));
        let got = run_and_read(&gpu, &db, rows * cols, |enc| {
            let m = |buf| Mat::new(buf, cols as u64);
            elementwise(&gpu, enc, Elementwise::SwiGlu, m(&ab), Some(m(&bb)), m(&db), [rows as u64, cols as u64])
        });
        assert_close("split swiglu", &got, &want, F32_TOL);
    }

    #[test]
    fn transpose_between_channels_and_tokens() {
        assert_eq!(crate::selftest::check_transpose(gpu()).unwrap_or_else(|e| panic!("{e}")), 0.0, "transpose is not exact");
    }
}
