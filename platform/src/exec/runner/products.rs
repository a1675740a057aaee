//! A linear's product with what its epilogue makes of the outputs, over a
//! resident weight in one call of the kernel, or over a weight held in GGML
//! blocks run by run: the weight's rows expanded into the weights' scratch
//! as many as it holds at a time (on the matrix tier's f16 operands straight
//! into f16 under their range scales: twice the rows a run, staged as they
//! are, with no pass measuring them), each run making its own columns of
//! the output through the same epilogue. A run holds whole units of the
//! output (an f16 piece, a normed head), so every run's epilogue sees whole
//! ones, and the outputs are the resident weight's bit for bit.

use super::Runner;
use crate::exec::device_weights::DeviceWeights;
use crate::error::GpuError;
use flux_lite_core::models::tensors::TensorName;
use flux_lite_kernels::kernels::{self, Gemm, HeadNorm, Input};
use flux_lite_core::ggml::GgmlType;
use flux_lite_kernels::{Gpu, HalfMat, Mat, RowScales, Sink, Weight};

/// What a product's epilogue writes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Epilogue<'a> {
    /// `y = x·Wᵀ (+ b)`.
    Set(Mat<'a>),
    /// `stream += gate ⊙ (x·Wᵀ (+ b))`.
    Gated { stream: Mat<'a>, gate: Mat<'a> },
    /// `x·Wᵀ` as f16 rows in pieces, the heads normed and rotated where
    /// `norm` says.
    Half { y: HalfMat<'a>, piece: u64, norm: Option<HeadNorm<'a>> },
    /// `SwiGLU(x·W_gateᵀ, x·W_upᵀ)`, W's up rows `n` after its gate rows,
    /// into f32 rows.
    SwiGlu(Mat<'a>),
    /// The same into f16 rows in pieces.
    SwiGluHalf { y: HalfMat<'a>, piece: u64 },
}

impl<'a> Epilogue<'a> {
    /// The outputs a run of the product must hold whole.
    fn unit(&self) -> u64 {
        match self {
            Self::Half { piece, norm: Some(n), .. } => lcm(*piece, n.head_dim),
            Self::Half { piece, .. } | Self::SwiGluHalf { piece, .. } => *piece,
            _ => 1,
        }
    }

    /// Whether each output reads two of W's rows (a gate and an up row).
    fn swiglu(&self) -> bool {
        matches!(self, Self::SwiGlu(_) | Self::SwiGluHalf { .. })
    }

    /// This epilogue for the product's outputs `[start, start + n)`, as a
    /// product of its own (`start` a whole number of [`Self::unit`]s).
    fn columns(self, start: u64, n: u64) -> Result<Self, GpuError> {
        let half = |y: HalfMat<'a>| y.cols_from(start).ok_or_else(|| GpuError::UnsupportedShape(format!("f16 outputs from column {start}, not a piece's first")));
        Ok(match self {
            Self::Set(y) => Self::Set(y.cols_from(start)),
            Self::Gated { stream, gate } => Self::Gated { stream: stream.cols_from(start), gate: gate.cols_from(start) },
            Self::Half { y, piece, norm } => {
                // The heads each weight norms, counted from the run's first output.
                let within = |cols: u64| cols.saturating_sub(start).min(n);
                let norm = norm.map(|h| HeadNorm { first_cols: within(h.first_cols), cols: within(h.cols), ..h }).filter(|h| h.cols > 0);
                Self::Half { y: half(y)?, piece, norm }
            }
            Self::SwiGlu(y) => Self::SwiGlu(y.cols_from(start)),
            Self::SwiGluHalf { y, piece } => Self::SwiGluHalf { y: half(y)?, piece },
        })
    }

    /// The kernel's call for `s` over `w`.
    fn record(self, gpu: &Gpu, sink: &mut dyn Sink, x: Input<'_>, w: Weight<'_>, bias: Option<Weight<'_>>, s: Gemm) -> Result<(), GpuError> {
        match self {
            Self::Set(y) => kernels::linear_from(gpu, sink, x, w, bias, y, s),
            Self::Gated { stream, gate } => kernels::linear_gated(gpu, sink, x, w, bias, stream, gate, s),
            Self::Half { y, norm: Some(n), .. } => kernels::linear_into_half_normed(gpu, sink, x, w, y, n, s),
            Self::Half { y, norm: None, .. } => kernels::linear_into_half(gpu, sink, x, w, y, s),
            Self::SwiGlu(y) => kernels::linear_swiglu(gpu, sink, x, w, y, s),
            Self::SwiGluHalf { y, .. } => kernels::linear_swiglu_half(gpu, sink, x, w, y, s),
        }
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    a / gcd(a, b).max(1) * b
}

/// Where a product over `w` reads its rows: the product `s` over `w`'s rows
/// from `w_row`, and the bias's from the same row.
#[derive(Debug, Clone, Copy)]
pub(super) struct Product<'o> {
    pub w: &'o str,
    pub w_row: u64,
    pub bias: Option<&'o TensorName>,
    pub s: Gemm,
}

impl Runner {
    /// Records `p` with epilogue `out`: over a resident weight in one call,
    /// over GGML blocks run by run ([`Self::run_outputs`]).
    pub(super) fn record_product(&self, gpu: &Gpu, sink: &mut dyn Sink, weights: &DeviceWeights, x: Input<'_>, p: Product<'_>, out: Epilogue<'_>) -> Result<(), GpuError> {
        if weights.packed(p.w).is_some() {
            return self.record_runs(gpu, sink, weights, x, p, out);
        }
        let bias = match p.bias {
            Some(b) => Some(weights.get(b)?.view().rows_from(p.w_row, 1)),
            None => None,
        };
        out.record(gpu, sink, x, weights.get(p.w)?.view().rows_from(p.w_row, p.s.k), bias, p.s)
    }

    /// Whether product `p` can take epilogue `out`: the kernel writes its
    /// f16 pieces where it has them, no adapter adds to the product, and the
    /// weight's rows fit one call: a resident SwiGLU weight's gate and up
    /// rows in one binding, or the GGML scratch a run of whole units.
    pub(super) fn takes_epilogue(&self, gpu: &Gpu, weights: &DeviceWeights, p: Product<'_>, out: &Epilogue<'_>) -> bool {
        let writes = match out {
            Epilogue::Half { piece, .. } => kernels::product_writes_pieces(gpu, *piece, false),
            Epilogue::SwiGluHalf { piece, .. } => kernels::swiglu_writes_pieces(gpu, *piece),
            _ => true,
        };
        let adapted = self.lora.as_ref().is_some_and(|l| l.adapts(p.w));
        let fits = || match weights.packed(p.w) {
            Some(_) => self.run_outputs(gpu, weights, p.w, p.s, out).is_some(),
            None => !out.swiglu() || weights.get(p.w).is_ok_and(|r| kernels::swiglu_fits(gpu, r.view().rows_from(p.w_row, p.s.k), p.s)),
        };
        writes && !adapted && fits()
    }

    /// The outputs a run of a product over `w`'s GGML blocks makes: as many
    /// as the scratch holds rows for (two rows an output with SwiGLU), whole
    /// units of `out`, at most all of them; `None` where not one unit fits.
    fn run_outputs(&self, gpu: &Gpu, weights: &DeviceWeights, w: &str, s: Gemm, out: &Epilogue<'_>) -> Option<u64> {
        let (p, scratch) = (weights.packed(w)?, weights.packed_scratch()?);
        let rows = scratch.size() / expanded_row_bytes(gpu, p.ggml, p.width);
        let unit = out.unit();
        if !out.swiglu() {
            let outputs = (rows / unit * unit).min(s.n);
            return (outputs > 0).then_some(outputs);
        }
        // A SwiGLU run's gate and up rows in one binding (and on the matrix
        // tier within the range scales' share): whole units, fewer where the
        // binding's alignment leaves less than the scratch.
        let weight = scratch_weight(gpu, p.ggml, p.width, scratch);
        let mut outputs = (rows / 2 / unit * unit).min(s.n.next_multiple_of(unit));
        while outputs > 0 && !kernels::swiglu_fits(gpu, weight, Gemm { n: outputs, ..s }) {
            outputs -= unit;
        }
        (outputs > 0).then_some(outputs.min(s.n))
    }

    /// [`Self::record_product`] over a weight in GGML blocks: per run, its
    /// rows (with SwiGLU the gate rows, then the up rows `n` further on)
    /// expanded into the scratch one after the other, then the product of
    /// the run's columns.
    fn record_runs(&self, gpu: &Gpu, sink: &mut dyn Sink, weights: &DeviceWeights, x: Input<'_>, p: Product<'_>, out: Epilogue<'_>) -> Result<(), GpuError> {
        let Product { w, w_row, bias, s } = p;
        let (Some(packed), Some(scratch)) = (weights.packed(w), weights.packed_scratch()) else {
            return Err(GpuError::UnsupportedShape(format!("`{w}` is held in GGML blocks without a scratch to expand them into")));
        };
        if packed.width != s.k {
            return Err(GpuError::UnsupportedShape(format!("`{w}`: rows of {} elements, the linear sums over {}", packed.width, s.k)));
        }
        let Some(run) = self.run_outputs(gpu, weights, w, s, &out) else {
            return Err(GpuError::UnsupportedShape(format!("`{w}`: the GGML scratch of {} bytes holds no run of {} outputs", scratch.size(), out.unit())));
        };
        let width = packed.width;
        let row_bytes = packed.width / packed.ggml.block_elements() as u64 * packed.ggml.block_bytes() as u64;
        let half = expands_half(gpu, packed.ggml, width);
        let scales_at = scales_at(gpu, packed.ggml, width, scratch);
        let weight = scratch_weight(gpu, packed.ggml, width, scratch);
        let mut done = 0;
        while done < s.n {
            let n = run.min(s.n - done);
            let firsts = [w_row + done, w_row + s.n + done];
            for (i, first) in firsts.into_iter().take(if out.swiglu() { 2 } else { 1 }).enumerate() {
                let blocks = kernels::GgmlBlocks { ggml: packed.ggml, scale: packed.scale, buf: &packed.buffer, at: packed.at + first * row_bytes };
                let at = i as u64 * n;
                match half {
                    true => kernels::ggml_expand_half(gpu, sink, blocks, [n, width], (scratch, at * width / 2), (scratch, scales_at + at))?,
                    false => kernels::ggml_expand(gpu, sink, blocks, n * width / packed.ggml.block_elements() as u64, scratch, at * width)?,
                }
            }
            let bias = match bias {
                Some(b) => Some(weights.get(b)?.view().rows_from(w_row + done, 1)),
                None => None,
            };
            out.columns(done, n)?.record(gpu, sink, x, weight, bias, Gemm { n, ..s })?;
            done += n;
        }
        Ok(())
    }
}

/// Whether rows of `width` in `ggml`'s blocks expand into f16 under their
/// range scales on `gpu` (the matrix tier's f16 operands), else into f32.
fn expands_half(gpu: &Gpu, ggml: GgmlType, width: u64) -> bool {
    gpu.plan_limits().half_operands && kernels::expands_half(ggml, width)
}

/// A row's bytes in the GGML scratch: f32 values, or f16 pairs and a scale.
fn expanded_row_bytes(gpu: &Gpu, ggml: GgmlType, width: u64) -> u64 {
    match expands_half(gpu, ggml, width) {
        true => 2 * width + 4,
        false => 4 * width,
    }
}

/// Where the f16 rows' scales start in the scratch (in 4-byte words): after
/// as many rows' words as it holds.
fn scales_at(gpu: &Gpu, ggml: GgmlType, width: u64, scratch: &wgpu::Buffer) -> u64 {
    scratch.size() / expanded_row_bytes(gpu, ggml, width) * width / 2
}

/// The rows expanded into the scratch as a product reads them: f16 under
/// their scales, or f32.
fn scratch_weight<'s>(gpu: &Gpu, ggml: GgmlType, width: u64, scratch: &'s wgpu::Buffer) -> Weight<'s> {
    match expands_half(gpu, ggml, width) {
        true => Weight { scales: Some(RowScales { buf: scratch, offset: scales_at(gpu, ggml, width, scratch), k: width, packed: true }), ..Weight::bf16(scratch) },
        false => Weight::f32(scratch),
    }
}
