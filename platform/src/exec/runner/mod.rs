//! Runs core's block programs: one f32 activation arena on the device, the
//! weights the programs name, and the RoPE tables.

use crate::exec::device_weights::DeviceWeights;
use crate::error::{GpuError, RunError};
use crate::model::safetensors_store::WeightStore;
use flux_lite_kernels::{DeviceBuffer, Gpu};
use flux_lite_kernels::kernels::{self, Attention, Elementwise, RopeStyle, RowNorm};
use flux_lite_kernels::{HalfMat, Mat, Weight};
use crate::model::lora::LoraSet;
use std::collections::HashMap;
mod products;
use products::{Epilogue, Product};
use flux_lite_core::ir::{HeadNorm, Op, Operand, Span};

/// The activation arena and the tables a program reads.
#[derive(Debug)]
pub struct Runner {
    pub arena: DeviceBuffer,
    pub rope_cos: DeviceBuffer,
    pub rope_sin: DeviceBuffer,
    /// One u32 per key (0 = padding) for `CausalAttention`; `None` attends to every key.
    pub key_keep: Option<DeviceBuffer>,
    /// LoRA adapters added to the linears they adapt; `None`: no adapter.
    pub lora: Option<DeviceLora>,
    /// The chunked attention's right operands (`ChunkedOperands`), a
    /// buffer apart from the arena: a product reads its right operand
    /// through a read-only binding, which no writable binding of the same
    /// buffer may share. `None` where the program has no chunked attention.
    pub operands: Option<DeviceBuffer>,
    /// The working values of an attention that runs as products on the
    /// GEMM core (`HeadsOnProducts`); `None` where none does.
    pub products_scratch: Option<DeviceBuffer>,
}

/// LoRA adapters on the device: per adapted linear (by its weight's name)
/// the combined down matrix `A` `[rank, in]` and scaled up matrix `B`
/// `[out, rank]` (f32), and one scratch `[rows, max rank]` for `x·Aᵀ`.
#[derive(Debug)]
pub struct DeviceLora {
    modules: HashMap<String, (DeviceBuffer, DeviceBuffer, u64)>,
    scratch: DeviceBuffer,
    bytes: u64,
}

impl DeviceLora {
    /// Uploads `set`'s combined matrices, with scratch for linears over up
    /// to `rows` token rows. `None` when the set adapts nothing.
    pub fn upload(gpu: &Gpu, set: &LoraSet, rows: u64) -> Option<Self> {
        if set.is_empty() {
            return None;
        }
        // One module's combined matrices at a time on the host: read from the mapped files, uploaded, dropped.
        let modules: HashMap<_, _> = set
            .modules()
            .filter_map(|weight| set.combined(weight).map(|c| (weight, c)))
            .map(|(weight, c)| (weight.to_string(), (gpu.upload_f32("lora down", &c.down), gpu.upload_f32("lora up", &c.up), c.rank as u64)))
            .collect();
        let scratch = gpu.storage("lora scratch", 4 * rows.max(1) * set.max_rank() as u64);
        let bytes = modules.values().map(|(a, b, _)| a.size() + b.size()).sum::<u64>() + scratch.size();
        Some(Self { modules, scratch, bytes })
    }

    /// Device bytes held: matrices and scratch.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether an adapter adds to the products over weight `w`.
    fn adapts(&self, w: &str) -> bool {
        self.modules.contains_key(w)
    }

    /// `y += (x·Aᵀ)·Bᵀ` for the linear `Op::Linear { x, w, w_row, y, .. }`
    /// describes, when `w` is adapted: the rows `w_row .. w_row + cols` of
    /// `B` serve a linear over part of `W`'s rows.
    #[allow(clippy::too_many_arguments)] // the linear's operands
    fn record(&self, gpu: &Gpu, sink: &mut dyn flux_lite_kernels::Sink, w: &str, x: kernels::Input<'_>, y: Mat<'_>, w_row: u64, s: kernels::Gemm) -> Result<(), GpuError> {
        let Some((down, up, rank)) = self.modules.get(w) else { return Ok(()) };
        let t = Mat { buf: &self.scratch, offset: 0, stride: *rank };
        kernels::linear_from(gpu, sink, x, Weight::f32(down), None, t, kernels::Gemm { m: s.m, n: *rank, k: s.k })?;
        let up = Weight::f32(up).rows_from(w_row, *rank);
        kernels::linear_add(gpu, sink, t, up, y, kernels::Gemm { m: s.m, n: s.n, k: *rank })
    }
}

/// The buffers `program`'s attentions on products take beside the arena
/// ([`Runner::operands`], [`Runner::products_scratch`]), where it has any
/// on `gpu`: as `ProductBuffers` sizes them, which the planner counts.
pub fn attention_buffers(gpu: &Gpu, program: &[Op]) -> (Option<DeviceBuffer>, Option<DeviceBuffer>) {
    let limits = gpu.plan_limits();
    let mut buffers = flux_lite_core::ir::ProductBuffers::default();
    program.iter().for_each(|op| buffers.add(op, limits.attention_products, limits.max_buffer));
    let flux_lite_core::ir::ProductBuffers { operands, scratch } = buffers;
    (operands.map(|bytes| gpu.storage("attention operands", bytes)), scratch.map(|elements| gpu.storage("attention on products", 4 * elements)))
}

/// `[len, q_heads, kv_heads, head_dim]` of `op` where it is an attention
/// that runs as products on the GEMM core on `gpu`
/// (`kernels::attention_on_products`; `AttentionProducts::shape_of`).
fn on_products(gpu: &Gpu, op: &Op) -> Option<[u64; 4]> {
    gpu.plan_limits().attention_products.shape_of(op)
}

/// Attention of `q_len` queries over `kv_len` keys, every head its own
/// keys, `scale = 1/√head_dim`, no mask.
fn non_causal(q_len: u64, kv_len: u64, heads: u64, head_dim: u64) -> Attention {
    Attention { q_len, kv_len, q_heads: heads, kv_heads: heads, head_dim, scale: (1.0 / (head_dim as f64).sqrt()) as f32, causal: false }
}

impl Runner {
    fn mat(&self, s: Span) -> Mat<'_> {
        Mat { buf: &self.arena, offset: s.offset, stride: s.stride }
    }

    /// A product's input: f32 rows, or f16 rows and their range scales.
    fn input(&self, x: Operand) -> kernels::Input<'_> {
        match self.half(x) {
            Some(h) => kernels::Input::Half(h),
            None => kernels::Input::F32(self.mat(x.data)),
        }
    }

    /// f16 rows and their range scales (one a row, or one a piece), where `x` is half.
    fn half(&self, x: Operand) -> Option<HalfMat<'_>> {
        x.scales.map(|scales| HalfMat { data: self.mat(x.data), scales: self.mat(scales), piece: x.piece })
    }

    /// Records one program step.
    pub fn record(&self, gpu: &Gpu, sink: &mut dyn flux_lite_kernels::Sink, weights: &DeviceWeights, op: &Op) -> Result<(), GpuError> {
        match op {
            Op::Linear { x, w, w_row, bias, y, rows, cols, inner, gate: Some(g) } => {
                let p = Product { w, w_row: *w_row, bias: bias.as_ref(), s: kernels::Gemm { m: *rows, n: *cols, k: *inner } };
                let gated = Epilogue::Gated { stream: self.mat(*y), gate: self.mat(g.vector) };
                if self.takes_epilogue(gpu, weights, p, &gated) {
                    return self.record_product(gpu, sink, weights, self.input(*x), p, gated);
                }
                // The product and its adapter into the scratch, then the gated residual.
                let product = Op::Linear { x: *x, w: w.clone(), w_row: *w_row, bias: bias.clone(), y: g.scratch, rows: *rows, cols: *cols, inner: *inner, gate: None };
                self.record(gpu, sink, weights, &product)?;
                kernels::elementwise(gpu, sink, Elementwise::GatedResidual, self.mat(g.scratch), Some(self.mat(g.vector)), self.mat(*y), [*rows, *cols])
            }
            Op::Linear { .. } => self.record_linear(gpu, sink, weights, op),
            Op::LinearHalf { x, w, w_row, y, rows, cols, inner, scratch, head_norm } => {
                let p = Product { w, w_row: *w_row, bias: None, s: kernels::Gemm { m: *rows, n: *cols, k: *inner } };
                let (Some(half), Some(piece)) = (self.half(*y), y.piece) else {
                    return Err(GpuError::UnsupportedShape("a product into f16 rows writes them in pieces".into()));
                };
                // The heads' norms in the epilogue where it can take them, else after it as passes.
                let normed = Epilogue::Half { y: half, piece, norm: self.epilogue_head_norm(gpu, weights, head_norm.as_ref(), piece)? };
                let plain = Epilogue::Half { y: half, piece, norm: None };
                if let Some(out) = [normed, plain].into_iter().find(|out| self.takes_epilogue(gpu, weights, p, out)) {
                    self.record_product(gpu, sink, weights, self.input(*x), p, out)?;
                    if matches!(out, Epilogue::Half { norm: Some(_), .. }) {
                        return Ok(());
                    }
                } else {
                    // The product and its adapter's into the scratch, then packed piece by piece.
                    let product = Op::Linear { x: *x, w: w.clone(), w_row: *w_row, bias: None, y: *scratch, rows: *rows, cols: *cols, inner: *inner, gate: None };
                    self.record(gpu, sink, weights, &product)?;
                    let pieces = kernels::HeadRows { tokens: *rows, heads: cols / piece, head_dim: piece };
                    kernels::half_pack(gpu, sink, self.mat(*scratch), half.data, half.scales, pieces)?;
                }
                // The heads' norms the epilogue did not take, as passes.
                for op in head_norm.iter().flat_map(|n| n.passes(*y, *rows)) {
                    self.record(gpu, sink, weights, &op)?;
                }
                Ok(())
            }
            Op::LinearSwiGlu { x, w, w_row, y, rows, cols, inner, scratch } => {
                let p = Product { w, w_row: *w_row, bias: None, s: kernels::Gemm { m: *rows, n: *cols, k: *inner } };
                let out = match (self.half(*y), y.piece) {
                    (None, _) => Some(Epilogue::SwiGlu(self.mat(y.data))),
                    (Some(y), Some(piece)) => Some(Epilogue::SwiGluHalf { y, piece }),
                    (Some(_), None) => None,
                };
                if let Some(out) = out.filter(|out| self.takes_epilogue(gpu, weights, p, out)) {
                    return self.record_product(gpu, sink, weights, self.input(*x), p, out);
                }
                // The two products and the adapter's into the scratch, then
                // the SwiGLU: into y, or (y f16 rows in pieces) into the
                // scratch's gate half and packed into y piece by piece.
                let product = Op::Linear { x: *x, w: w.clone(), w_row: *w_row, bias: None, y: *scratch, rows: *rows, cols: 2 * cols, inner: *inner, gate: None };
                self.record(gpu, sink, weights, &product)?;
                let (gate, up) = (self.mat(*scratch), Some(self.mat(scratch.cols_from(*cols))));
                match (y.scales, y.piece) {
                    (None, _) => kernels::elementwise(gpu, sink, Elementwise::SwiGlu, gate, up, self.mat(y.data), [*rows, *cols]),
                    (Some(scales), Some(piece)) => {
                        kernels::elementwise(gpu, sink, Elementwise::SwiGlu, gate, up, gate, [*rows, *cols])?;
                        let pieces = kernels::HeadRows { tokens: *rows, heads: cols / piece, head_dim: piece };
                        kernels::half_pack(gpu, sink, gate, self.mat(y.data), self.mat(scales), pieces)
                    }
                    (Some(_), None) => Err(GpuError::UnsupportedShape("a SwiGLU product into f16 rows under one scale a row".into())),
                }
            }
            Op::RmsNormHeads { data, w, tokens, heads, head_dim, eps } => {
                let s = RowNorm { tokens: *tokens, heads: *heads, d: *head_dim, eps: *eps };
                kernels::rms_norm_inplace(gpu, sink, self.mat(*data), weights.get(w)?.view(), s)
            }
            Op::LayerNormModulate { src, dst, shift, scale, later, tokens, d, eps } => {
                let s = RowNorm { tokens: *tokens, heads: 1, d: *d, eps: *eps };
                let later = later.map(|l| kernels::LaterModulation { row: l.row, shift: self.mat(l.shift), scale: self.mat(l.scale) });
                let modulation = kernels::Modulation { shift: self.mat(*shift), scale: self.mat(*scale), later };
                let src = self.mat(*src);
                match self.input(*dst) {
                    kernels::Input::Half(dst) => kernels::layer_norm_modulate_half(gpu, sink, src, modulation, dst, s),
                    kernels::Input::F32(dst) => kernels::layer_norm_modulate(gpu, sink, src, modulation, dst, s),
                }
            }
            Op::RmsNormRope { data, w, table_row, tokens, heads, head_dim, eps, pairs } => {
                let s = RowNorm { tokens: *tokens, heads: *heads, d: *head_dim, eps: *eps };
                let tables = kernels::RopeTables { cos: &self.rope_cos, sin: &self.rope_sin, first_row: *table_row };
                match (self.half(*data), pairs) {
                    (Some(half), _) => kernels::rms_norm_rope_half(gpu, sink, half, weights.get(w)?.view(), tables, *pairs, s),
                    (None, RopeStyle::Interleaved) => kernels::rms_norm_rope(gpu, sink, self.mat(data.data), weights.get(w)?.view(), tables, s),
                    (None, RopeStyle::RotateHalf) => Err(GpuError::UnsupportedShape("an RMSNorm + rotate-half RoPE in one pass over f32 rows".into())),
                }
            }
            Op::RopeInterleaved { data, table_row, tokens, heads, head_dim } => kernels::rope(gpu, sink, RopeStyle::Interleaved, self.mat(*data), kernels::RopeTables { cos: &self.rope_cos, sin: &self.rope_sin, first_row: *table_row }, kernels::HeadRows { tokens: *tokens, heads: *heads, head_dim: *head_dim }),
            Op::Attention { q, k, v, o, len, heads, head_dim } => {
                let s = non_causal(*len, *len, *heads, *head_dim);
                match on_products(gpu, op) {
                    Some(_) => self.attend_on_products(gpu, sink, [*q, *k, *v, *o], None, s),
                    None => self.attend(gpu, sink, [*q, *k, *v, *o], None, s),
                }
            }
            Op::CrossAttention { q, k, v, o, q_len, kv_len, heads, head_dim } => {
                let s = non_causal(*q_len, *kv_len, *heads, *head_dim);
                kernels::attention(gpu, sink, kernels::Qkv { q: self.mat(*q), k: self.mat(*k), v: self.mat(*v) }, None, self.mat(*o), s)
            }
            Op::HalfKvAttention { q, k, v, k_scales, v_scales, o, q_len, kv_len, heads, head_dim } => {
                let s = non_causal(*q_len, *kv_len, *heads, *head_dim);
                let scales = kernels::HalfKvScales { k: self.mat(*k_scales), v: self.mat(*v_scales) };
                kernels::attention_half_kv(gpu, sink, kernels::Qkv { q: self.mat(*q), k: self.mat(*k), v: self.mat(*v) }, scales, self.mat(*o), s)
            }
            Op::HalfPack { src, dst, scales, tokens, heads, head_dim } => kernels::half_pack(gpu, sink, self.mat(*src), self.mat(*dst), self.mat(*scales), kernels::HeadRows { tokens: *tokens, heads: *heads, head_dim: *head_dim }),
            Op::CarriedAttention { q, k, v, o, q_len, kv_len, heads, head_dim, carry } => {
                let s = non_causal(*q_len, *kv_len, *heads, *head_dim);
                let carry = carry.map(|c| kernels::Carry { state: self.mat(c.state), from_state: c.from_state, keep_state: c.keep_state });
                kernels::attention_carried(gpu, sink, kernels::Qkv { q: self.mat(*q), k: self.mat(*k), v: self.mat(*v) }, self.mat(*o), carry, s)
            }
            Op::ChunkedAttention { q, k, v, o, scratch, q_len, kv_len, head_dim, carry } => {
                let operands = self.operands.as_ref().ok_or_else(|| GpuError::UnsupportedShape("a chunked attention on a runner without a buffer for its right operands".into()))?;
                let s = non_causal(*q_len, *kv_len, 1, *head_dim);
                let carry = carry.map(|c| kernels::Carry { state: self.mat(c.state), from_state: c.from_state, keep_state: c.keep_state });
                let qkv = kernels::Qkv { q: self.mat(*q), k: self.mat(*k), v: self.mat(*v) };
                kernels::attention_chunked(gpu, sink, qkv, self.mat(*o), carry, self.mat(*scratch), operands, s)
            }
            Op::SwiGlu { gate, up, dst, rows, cols } => match self.half(*dst).map(|h| (h, dst.piece)) {
                None => kernels::elementwise(gpu, sink, Elementwise::SwiGlu, self.mat(*gate), Some(self.mat(*up)), self.mat(dst.data), [*rows, *cols]),
                Some((half, Some(piece))) => {
                    let pieces = kernels::HeadRows { tokens: *rows, heads: cols / piece, head_dim: piece };
                    kernels::swiglu_half_pack(gpu, sink, self.mat(*gate), self.mat(*up), half.data, half.scales, pieces)
                }
                Some((_, None)) => Err(GpuError::UnsupportedShape("a SwiGLU into f16 rows under one scale a row".into())),
            },
            Op::GatedResidual { dst, gate, y, rows, cols } => kernels::elementwise(gpu, sink, Elementwise::GatedResidual, self.mat(*y), Some(self.mat(*gate)), self.mat(*dst), [*rows, *cols]),
            Op::Silu { src, dst, rows, cols } => {
                kernels::elementwise(gpu, sink, Elementwise::Silu, self.mat(*src), None, self.mat(*dst), [*rows, *cols])
            }
            Op::RmsNorm { src, dst, w, tokens, d, eps } => {
                let s = RowNorm { tokens: *tokens, heads: 1, d: *d, eps: *eps };
                match self.half(*dst) {
                    Some(half) => kernels::rms_norm_half(gpu, sink, self.mat(*src), weights.get(w)?.view(), half, s),
                    None => kernels::rms_norm(gpu, sink, self.mat(*src), weights.get(w)?.view(), self.mat(dst.data), s),
                }
            }
            Op::RopeRotateHalf { data, table_row, tokens, heads, head_dim } => kernels::rope(gpu, sink, RopeStyle::RotateHalf, self.mat(*data), kernels::RopeTables { cos: &self.rope_cos, sin: &self.rope_sin, first_row: *table_row }, kernels::HeadRows { tokens: *tokens, heads: *heads, head_dim: *head_dim }),
            Op::CausalAttention { q, k, v, o, len, q_heads, kv_heads, head_dim } => {
                let s = Attention {
                    q_len: *len,
                    kv_len: *len,
                    q_heads: *q_heads,
                    kv_heads: *kv_heads,
                    head_dim: *head_dim,
                    scale: (1.0 / (*head_dim as f64).sqrt()) as f32,
                    causal: true,
                };
                match on_products(gpu, op) {
                    Some(_) => self.attend_on_products(gpu, sink, [*q, *k, *v, *o], self.key_keep.as_deref(), s),
                    None => self.attend(gpu, sink, [*q, *k, *v, *o], self.key_keep.as_deref(), s),
                }
            }
            Op::Residual { dst, y, rows, cols } => {
                kernels::elementwise(gpu, sink, Elementwise::AddInPlace, self.mat(*y), None, self.mat(*dst), [*rows, *cols])
            }
            Op::Copy { src, dst, rows, cols } => {
                kernels::elementwise(gpu, sink, Elementwise::Copy, self.mat(*src), None, self.mat(*dst), [*rows, *cols])
            }
            Op::Conv2d { x, w, bias, y, shape, residual, relu } => {
                let (w, bias) = (weights.get(w)?.view(), weights.get(bias)?.view());
                let then = kernels::ConvEpilogue { residual: *residual, relu: *relu };
                kernels::conv2d_then(gpu, sink, self.mat(*x), w, bias, self.mat(*y), *shape, then)
            }
            Op::ConvNhwc { x, w, bias, y, shape, upsample, residual, norm, relu } => {
                let Some(rows) = self.half(*x) else {
                    return Err(GpuError::UnsupportedShape("a channels-last convolution reads f16 rows".into()));
                };
                let norm = match norm {
                    Some(n) => Some(kernels::NhwcNorm { stats: self.mat(n.stats), gamma: weights.get(&n.gamma)?.view(), beta: weights.get(&n.beta)?.view(), groups: n.groups, activation: n.activation }),
                    None => None,
                };
                let w = weights.get(w)?;
                let order = if w.taps_last { kernels::TapOrder::ChannelsLast } else { kernels::TapOrder::Torch };
                let weights = kernels::NhwcWeights { w: w.view(), bias: weights.get(bias)?.view(), order };
                let input = if *upsample { kernels::NhwcInput::Upsampled } else { kernels::NhwcInput::Plain };
                let out = match (self.half(*y), residual.map(|r| (r, self.half(r)))) {
                    (Some(y), None) => kernels::NhwcOutput::Half { y, residual: None, relu: *relu },
                    (Some(y), Some((_, Some(r)))) => kernels::NhwcOutput::Half { y, residual: Some(r), relu: *relu },
                    (Some(_), Some((_, None))) => return Err(GpuError::UnsupportedShape("a channels-last convolution into f16 rows adds f16 rows".into())),
                    (None, None) => kernels::NhwcOutput::F32 { y: self.mat(y.data), residual: false, relu: *relu },
                    (None, Some((r, _))) if r == *y => kernels::NhwcOutput::F32 { y: self.mat(y.data), residual: true, relu: *relu },
                    (None, Some(_)) => return Err(GpuError::UnsupportedShape("a channels-last convolution into f32 rows adds only onto them".into())),
                };
                kernels::conv2d_matrix_nhwc(gpu, sink, kernels::NhwcSource { rows, norm }, weights, out, *shape, input)
            }
            Op::GroupMoments { src, moments, shape } => kernels::group_moments(gpu, sink, self.input(*src), self.mat(*moments), *shape),
            Op::GroupMerge { moments, stats, of, eps } => {
                kernels::group_merge(gpu, sink, kernels::GroupStats { moments: self.mat(*moments), stats: self.mat(*stats), eps: *eps }, *of)
            }
            Op::GroupNormApply { src, stats, dst, gamma, beta, shape, silu } => {
                let affine = kernels::GroupAffine { gamma: weights.get(gamma)?.view(), beta: weights.get(beta)?.view(), silu: *silu };
                match self.half(*dst) {
                    Some(half) => kernels::group_norm_nhwc_half(gpu, sink, self.input(*src), self.mat(*stats), affine, half, *shape),
                    None if src.is_half() => Err(GpuError::UnsupportedShape("a channel-major group norm reads f32 rows".into())),
                    None => kernels::group_norm_apply(gpu, sink, self.mat(src.data), self.mat(*stats), affine, self.mat(dst.data), *shape),
                }
            }
            Op::UpsampleNearest2x { x, y, channels, height, width } => {
                kernels::upsample_nearest2x(gpu, sink, self.mat(*x), self.mat(*y), *channels, *height, *width)
            }
            Op::Transpose { src, dst, rows, cols } => kernels::transpose(gpu, sink, self.mat(*src), self.mat(*dst), *rows, *cols),
            Op::Add { a, b, dst, rows, cols, relu } => {
                let op = if *relu { Elementwise::AddRelu } else { Elementwise::Add };
                kernels::elementwise(gpu, sink, op, self.mat(*a), Some(self.mat(*b)), self.mat(*dst), [*rows, *cols])
            }
            Op::DenormUnpatchify { packed, latent, mean, var, channels, height, width, eps } => {
                let stats = kernels::LatentStats { mean: weights.get(mean)?.view(), var: weights.get(var)?.view(), eps: *eps };
                kernels::denorm_unpatchify(gpu, sink, self.mat(*packed), stats, self.mat(*latent), [*channels, *height, *width])
            }
            Op::PixelLevels { src, dst, count } => kernels::pixel_levels(gpu, sink, self.mat(*src), self.mat(*dst), *count),
            Op::Relu { src, dst, count } => self.contiguous(gpu, sink, Elementwise::Relu, *src, *dst, *count),
            Op::TanhClamp { src, dst, count, limit } => self.contiguous(gpu, sink, Elementwise::TanhClamp(*limit), *src, *dst, *count),
            Op::ScaleShift { src, dst, count, scale, shift } => self.contiguous(gpu, sink, Elementwise::ScaleShift(*scale, *shift), *src, *dst, *count),
        }
    }

    /// Attention `s` of `q`, `k` and `v` into `o` (each f32 rows, or f16
    /// rows in pieces: all four, or `o` alone), keys masked by `key_keep`.
    fn attend(&self, gpu: &Gpu, sink: &mut dyn flux_lite_kernels::Sink, [q, k, v, o]: [Operand; 4], key_keep: Option<&wgpu::Buffer>, s: Attention) -> Result<(), GpuError> {
        let qkv = kernels::Qkv { q: self.mat(q.data), k: self.mat(k.data), v: self.mat(v.data) };
        match (self.half(q), self.half(k), self.half(v), self.half(o)) {
            (Some(q), Some(k), Some(v), Some(o)) => kernels::attention_half_into_half(gpu, sink, kernels::HalfQkv { q, k, v }, key_keep, o, s),
            (None, None, None, Some(o)) => kernels::attention_into_half(gpu, sink, qkv, key_keep, o, s),
            (None, None, None, None) => kernels::attention(gpu, sink, qkv, key_keep, self.mat(o.data), s),
            _ => Err(GpuError::UnsupportedShape("attention over f16 queries, keys and values writes f16 rows in pieces, and reads all three so".into())),
        }
    }

    /// An attention [`on_products`] takes: f16 pieces or f32 rows in, f16
    /// pieces out, on the runner's buffers for it.
    fn attend_on_products(&self, gpu: &Gpu, sink: &mut dyn flux_lite_kernels::Sink, [q, k, v, o]: [Operand; 4], key_keep: Option<&wgpu::Buffer>, s: Attention) -> Result<(), GpuError> {
        let missing = || GpuError::UnsupportedShape("an attention on products on a runner without its buffers, or not into f16 pieces".into());
        let (scratch, operands, out) = (self.products_scratch.as_ref().ok_or_else(missing)?, self.operands.as_ref().ok_or_else(missing)?, self.half(o).ok_or_else(missing)?);
        let inputs = match (self.half(q), self.half(k), self.half(v)) {
            (Some(q), Some(k), Some(v)) => kernels::HeadInputs::Pieces(kernels::HalfQkv { q, k, v }),
            _ => kernels::HeadInputs::Rows(kernels::Qkv { q: self.mat(q.data), k: self.mat(k.data), v: self.mat(v.data) }),
        };
        kernels::attention_on_products(gpu, sink, inputs, key_keep, out, Mat::new(scratch, 0), operands, s)
    }

    /// The head norm a projection into f16 pieces of `piece` takes in its
    /// epilogue on `gpu`, or `None` where it leaves it to the passes: heads
    /// the kernel's blocks do not hold, or norm weights of two types.
    fn epilogue_head_norm<'w>(&'w self, gpu: &Gpu, weights: &'w DeviceWeights, norm: Option<&HeadNorm>, piece: u64) -> Result<Option<kernels::HeadNorm<'w>>, GpuError> {
        let Some(n) = norm.filter(|n| kernels::product_norms_heads(gpu, piece, n.head_dim)) else { return Ok(None) };
        let (first, second) = (weights.get(&n.first)?.view(), weights.get(&n.second)?.view());
        if first.dtype != second.dtype {
            return Ok(None);
        }
        let tables = kernels::RopeTables { cos: &self.rope_cos, sin: &self.rope_sin, first_row: n.table_row };
        Ok(Some(kernels::HeadNorm { first, second, first_cols: n.first_cols, cols: n.cols, head_dim: n.head_dim, eps: n.eps, tables }))
    }

    /// A linear (`op`, ungated), its weight resident or in GGML blocks, and
    /// its adapter's side product where one adapts it.
    fn record_linear(&self, gpu: &Gpu, sink: &mut dyn flux_lite_kernels::Sink, weights: &DeviceWeights, op: &Op) -> Result<(), GpuError> {
        let Op::Linear { x, w, w_row, bias, y, rows, cols, inner, .. } = op else { return Ok(()) };
        let p = Product { w, w_row: *w_row, bias: bias.as_ref(), s: kernels::Gemm { m: *rows, n: *cols, k: *inner } };
        self.record_product(gpu, sink, weights, self.input(*x), p, Epilogue::Set(self.mat(*y)))?;
        match &self.lora {
            Some(lora) => lora.record(gpu, sink, w, self.input(*x), self.mat(*y), *w_row, p.s),
            None => Ok(()),
        }
    }

    /// A one-input element-wise op over `count` contiguous values, as rows
    /// of at most 65,536 (a row is one dispatch's unit when it is split).
    fn contiguous(&self, gpu: &Gpu, sink: &mut dyn flux_lite_kernels::Sink, op: Elementwise, src: Span, dst: Span, count: u64) -> Result<(), GpuError> {
        const ROW: u64 = 1 << 16;
        let (rows, last) = (count / ROW, count % ROW);
        let row_view = |s: Span| Mat { buf: &self.arena, offset: s.offset, stride: ROW };
        kernels::elementwise(gpu, sink, op, row_view(src), None, row_view(dst), [rows, ROW])?;
        let tail = |s: Span| Mat { buf: &self.arena, offset: s.offset + rows * ROW, stride: last };
        kernels::elementwise(gpu, sink, op, tail(src), None, tail(dst), [1, last])
    }

    /// Builds the dispatches of each block once (pipelines, bindings,
    /// parameters): the expansions of the weights the block keeps compressed,
    /// then its own steps.
    pub fn prepare(&self, gpu: &Gpu, weights: &DeviceWeights, blocks: &[Vec<Op>]) -> Result<Vec<Vec<flux_lite_kernels::Dispatch>>, GpuError> {
        (0..blocks.len()).map(|b| self.prepare_block(gpu, weights, b, &blocks[b])).collect()
    }

    /// The dispatches of block `index` of the blocks `weights` were placed
    /// for, running `steps` (the block's program, or a part of it).
    pub fn prepare_block(&self, gpu: &Gpu, weights: &DeviceWeights, index: usize, steps: &[Op]) -> Result<Vec<flux_lite_kernels::Dispatch>, GpuError> {
        let mut dispatches = Vec::new();
        weights.record_fills(gpu, index, &mut dispatches)?;
        steps.iter().try_for_each(|op| self.record(gpu, &mut dispatches, weights, op))?;
        Ok(dispatches)
    }

    /// Writes rows of f32 data into a contiguous span of the arena.
    pub fn write(&self, gpu: &Gpu, span: Span, data: &[f32]) {
        gpu.queue.write_buffer(&self.arena, span.offset * 4, bytemuck::cast_slice(data));
    }

    /// Reads the first `count` 8-bit levels of a span back (four to a word,
    /// as [`Op::PixelLevels`] writes them).
    pub fn read_levels(&self, gpu: &Gpu, span: Span, count: u64) -> Result<Vec<u8>, GpuError> {
        gpu.read_bytes(&self.arena, 4 * span.offset, count)
    }

    /// Reads `rows × cols` values of a span back (rows `stride` apart).
    pub fn read(&self, gpu: &Gpu, span: Span, rows: u64, cols: u64) -> Result<Vec<f32>, GpuError> {
        let stride = span.stride.max(cols);
        let all = gpu.read_f32(&self.arena, span.offset, ((rows.max(1) - 1) * stride + cols) as usize)?;
        Ok((0..rows).flat_map(|r| all[(r * stride) as usize..(r * stride + cols) as usize].to_vec()).collect())
    }
}

/// Where a pass over a model's blocks is, for progress reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockProgress {
    /// Blocks finished in this pass (a prologue and an epilogue count as blocks).
    pub done: usize,
    pub total: usize,
}

/// Dispatches one command buffer holds at most on an integrated or
/// unknown GPU: a block of a large image runs for seconds on a laptop GPU,
/// and a driver may time out or fail one long command buffer where shorter
/// ones finish (Metal reports such a failure nowhere wgpu passes on). A
/// single dispatch is not split.
pub const DISPATCHES_PER_SUBMISSION: usize = 8;

/// The dispatches a submission holds on an adapter of `device_type`: a
/// whole block on a discrete GPU (each submission costs the driver and the
/// queue a round trip, and a block runs there in milliseconds), else
/// [`DISPATCHES_PER_SUBMISSION`].
pub fn dispatches_per_submission(device_type: wgpu::DeviceType) -> usize {
    match device_type {
        wgpu::DeviceType::DiscreteGpu => usize::MAX,
        _ => DISPATCHES_PER_SUBMISSION,
    }
}

/// Runs prepared blocks in order, each in submissions of at most
/// [`dispatches_per_submission`] dispatches. A block whose weights stream
/// from `store` has them queued first. At most two blocks are queued on the
/// GPU at once: after submitting block i the host waits for block i − 1 and
/// reports it done, so progress and step times follow the GPU's completion
/// (not the submissions), and an interrupt (checked at each submission)
/// stops the work within a block.
pub fn run_prepared(
    gpu: &Gpu,
    weights: &DeviceWeights,
    store: &WeightStore,
    blocks: &[Vec<flux_lite_kernels::Dispatch>],
    progress: &mut dyn FnMut(BlockProgress),
) -> Result<(), RunError> {
    let total = blocks.len();
    let mut in_flight = None;
    for (i, block) in blocks.iter().enumerate() {
        weights.stream_in(gpu, store, i)?;
        let per_submission = dispatches_per_submission(gpu.info.device_type);
        let pieces: Vec<&[flux_lite_kernels::Dispatch]> = if block.is_empty() { vec![&[]] } else { block.chunks(per_submission).collect() };
        let mut submitted = None;
        for piece in pieces {
            submitted = Some(gpu.submit_tracked(|enc| {
                flux_lite_kernels::encode(enc, piece);
                Ok(())
            })?);
        }
        let Some(submitted) = submitted else { continue };
        if let Some((before, submission)) = in_flight.replace((i, submitted)) {
            gpu.wait_for(submission)?;
            progress(BlockProgress { done: before + 1, total });
        }
    }
    if let Some((last, submission)) = in_flight {
        gpu.wait_for(submission)?;
        progress(BlockProgress { done: last + 1, total });
    }
    Ok(())
}

/// The steps a block program emits, in order.
pub fn collect_ops(program: impl FnOnce(&mut dyn FnMut(Op))) -> Vec<Op> {
    let mut ops = Vec::new();
    program(&mut |op| ops.push(op));
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_discrete_gpu_takes_a_block_in_one_submission_and_every_other_adapter_in_eights() {
        let block = 23usize;
        let submissions = |t: wgpu::DeviceType| block.div_ceil(dispatches_per_submission(t));
        assert_eq!(submissions(wgpu::DeviceType::DiscreteGpu), 1);
        for other in [wgpu::DeviceType::IntegratedGpu, wgpu::DeviceType::VirtualGpu, wgpu::DeviceType::Cpu, wgpu::DeviceType::Other] {
            assert_eq!(submissions(other), 3, "{other:?}");
        }
    }
}
