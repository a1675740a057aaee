//! Kernels and blocks at a model's real shapes with random bf16 weights made
//! in memory (no model folder needed), each timed beside the adapter's own
//! ceilings measured in the same run: an FMA-bound kernel and a copy.

use super::timer::Timer;
use crate::exec::device_weights::{product_weights, DeviceWeight, DeviceWeights, StoredScales};
use crate::model::df11::Df11DeviceGroup;
use crate::error::{GpuError, RunError};
use flux_lite_kernels::{DeviceBuffer, Gpu};
use flux_lite_kernels::kernels;
use flux_lite_kernels::{Dispatch, Mat, Weight, WeightDtype};
use crate::exec::runner::{attention_buffers, collect_ops, Runner};
use crate::components::transformer::programs;
use flux_lite_core::arena::BumpArena;
use flux_lite_core::config::{Qwen3Config, TransformerConfig, VaeConfig};
use flux_lite_core::df11::Df11GroupBuf;
use flux_lite_core::ir::Op;
use flux_lite_core::models::transformer::Tokens;
use flux_lite_core::models::{tensors, vae};
use rayon::prelude::*;
use std::collections::HashMap;

mod block_ops;
mod synthetic;
mod vae_shapes;

use synthetic::*;

/// What the adapter can do at best, measured in this run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ceilings {
    /// FLOP/s of the FMA-bound kernel.
    pub flops: f64,
    /// Bytes read plus written per second by the copy kernel.
    pub bytes: f64,
    /// FLOP/s of the matrix units' kernel, on the matrix tier.
    pub matrix_flops: Option<f64>,
}

/// One linear shape's rows ([`ShapeBench::linears`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LinearFigures {
    /// Over f32 x and bf16 W, converted to the tiles' operands as staged
    /// (every tier takes these).
    pub converted: Figure,
    /// On the matrix tier's f16 operands, over what they keep in memory:
    /// x's f16 rows under their range scales, W packed as f16 at load,
    /// staged as stored.
    pub in_memory: Option<Figure>,
}

/// One timed row: what ran, its median time, and the work it did.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub what: String,
    pub shape: String,
    pub seconds: f64,
    pub flops: u64,
    /// Bytes the kernels must at least read and write (weights, inputs, outputs).
    pub bytes: u64,
    /// Whether the work ran on matrix units (then bounded by their ceiling).
    pub matrix: bool,
    /// Dispatches the row's work was prepared as; `None` where a run
    /// prepares them band by band as it goes.
    pub dispatches: Option<u64>,
}

impl Figure {
    /// The shortest time the ceilings allow: the slower of computing the
    /// FLOPs at the peak of the units they ran on and moving the bytes at the copy rate.
    pub fn bound_seconds(&self, c: &Ceilings) -> f64 {
        (self.flops as f64 / self.peak(c)).max(self.bytes as f64 / c.bytes)
    }

    /// Whether compute (rather than memory) sets the bound.
    pub fn compute_bound(&self, c: &Ceilings) -> bool {
        self.flops as f64 / self.peak(c) >= self.bytes as f64 / c.bytes
    }

    /// The compute ceiling that applies: the matrix units' for matrix work.
    pub fn peak(&self, c: &Ceilings) -> f64 {
        match (self.matrix, c.matrix_flops) {
            (true, Some(m)) => m,
            _ => c.flops,
        }
    }

    /// The fraction of the bound achieved (1 = at the ceiling).
    pub fn of_ceiling(&self, c: &Ceilings) -> f64 {
        self.bound_seconds(c) / self.seconds.max(1e-12)
    }
}

/// Runs and times work at a model's shapes on one device.
#[derive(Debug)]
pub struct ShapeBench<'g> {
    gpu: &'g Gpu,
    timer: Timer<'g>,
    repeats: usize,
}

/// Seconds the FMA kernel is sized to run for: long enough to dwarf launch
/// overhead, short enough for a software adapter.
fn ceiling_target(gpu: &Gpu) -> f64 {
    if gpu.is_software() {
        0.2
    } else {
        0.02
    }
}

impl<'g> ShapeBench<'g> {
    pub fn new(gpu: &'g Gpu, repeats: usize) -> Self {
        Self { gpu, timer: Timer::new(gpu), repeats }
    }

    pub fn timer(&self) -> &Timer<'g> {
        &self.timer
    }

    /// The FMA peak and the copy rate of this adapter, each the fastest of the runs.
    pub fn ceilings(&self) -> Result<Ceilings, GpuError> {
        let gpu = self.gpu;
        let workgroups: u64 = if gpu.is_software() { 64 } else { 16384 };
        let sink = gpu.storage("fma peak sink", 4 * 256 * workgroups);
        let fma = |iterations: u32| -> Result<Vec<Dispatch>, GpuError> {
            let mut d = Vec::new();
            kernels::fma_peak(gpu, &mut d, &sink, workgroups, iterations)?;
            Ok(d)
        };
        let (iterations, t) = self.sized_fastest(&fma)?;
        let flops = 2 * 256 * workgroups * iterations as u64 * flux_lite_kernels::kernels::FMA_PEAK_FMAS_PER_ITERATION;

        let cap = if gpu.is_software() { 64 << 20 } else { 256 << 20 };
        let bytes = (gpu.max_binding() - gpu.binding_alignment()).min(gpu.limits.max_buffer_size).min(cap) / 16 * 16;
        let (src, dst) = (gpu.storage("copy peak source", bytes), gpu.storage("copy peak destination", bytes));
        let mut copy = Vec::new();
        kernels::copy_peak(gpu, &mut copy, &src, &dst, bytes / 16)?;
        let t_copy = self.timer.fastest(&copy, self.repeats)?;
        Ok(Ceilings { flops: flops as f64 / t, bytes: 2.0 * bytes as f64 / t_copy, matrix_flops: self.matrix_peak(workgroups)? })
    }

    /// A ceiling kernel's loop count and fastest time: the count sized from
    /// short warm runs (the first run of a pipeline may include its
    /// compilation) until a run lasts at least half the target.
    fn sized_fastest(&self, run: &dyn Fn(u32) -> Result<Vec<Dispatch>, GpuError>) -> Result<(u32, f64), GpuError> {
        let target = ceiling_target(self.gpu);
        let mut iterations = 16u32;
        for _ in 0..4 {
            let t = self.timer.fastest(&run(iterations)?, 1)?;
            let scaled = (iterations as f64 * target / t.max(1e-6)).clamp(iterations as f64, (1 << 20) as f64) as u32;
            if t >= target / 2.0 || scaled == iterations {
                break;
            }
            iterations = scaled;
        }
        Ok((iterations, self.timer.fastest(&run(iterations)?, self.repeats)?))
    }

    /// The matrix units' peak on the matrix tier, sized as the FMA peak is.
    fn matrix_peak(&self, workgroups: u64) -> Result<Option<f64>, GpuError> {
        let gpu = self.gpu;
        let Some(c) = gpu.matrix() else { return Ok(None) };
        let sink = gpu.storage("matrix peak sink", 4 * c.subgroup as u64 * workgroups);
        let run = |iterations: u32| -> Result<Vec<Dispatch>, GpuError> {
            let mut d = Vec::new();
            kernels::matrix_peak(gpu, &mut d, &sink, workgroups, iterations)?;
            Ok(d)
        };
        let (iterations, t) = self.sized_fastest(&run)?;
        let size = c.size as u64;
        let flops = workgroups * iterations as u64 * kernels::MATRIX_PEAK_CHAINS * 2 * size * size * size;
        Ok(Some(flops as f64 / t))
    }

    /// Each distinct linear shape of the transformer's blocks, over `tokens`
    /// rows: over f32 x and bf16 W, converted to the tiles' operands as
    /// staged (every tier), and on the matrix tier's f16 operands again over
    /// the operands the engine keeps in memory there, from the same upload.
    pub fn linears(&self, cfg: &TransformerConfig, tokens: u64) -> Result<Vec<LinearFigures>, RunError> {
        let gpu = self.gpu;
        let mut figures = Vec::new();
        for ((n, k), name, count) in linear_shapes(cfg, tokens)? {
            let x = gpu.upload_f32("bench x", &random_f32((tokens * k) as usize, 1));
            let w = gpu.upload_bf16("bench w", &random_bf16((n * k) as usize, 2));
            let y = gpu.storage("bench y", 4 * tokens * n);
            // W's row scales measured once, as the engine measures them where W reaches the device.
            let scales = if gpu.measures_weight_rows() { Some(StoredScales::measure(gpu, Weight::bf16(&w), n, k)?) } else { None };
            let mut weight = DeviceWeight { buffer: w, offset: 0, dtype: WeightDtype::Bf16, scales, taps_last: false, half_packed: false };
            let gemm = kernels::Gemm { m: tokens, n, k };
            let many = if count > 1 { format!(" (×{count} per block)") } else { String::new() };
            let what = format!("linear {}{many}", block_local(&name).trim_end_matches(".weight"));
            let figure = |what: String, d: &[Dispatch], x_bytes: u64| -> Result<Figure, RunError> {
                Ok(Figure {
                    what,
                    shape: format!("{tokens}×{k} · {k}×{n}"),
                    seconds: self.timer.median(d, self.repeats)?,
                    flops: 2 * tokens * n * k,
                    bytes: x_bytes * tokens * k + 2 * n * k + 4 * tokens * n,
                    matrix: gpu.matrix().is_some(),
                    dispatches: Some(d.len() as u64),
                })
            };
            let mut d = Vec::new();
            kernels::linear(gpu, &mut d, Mat::new(&x, k), weight.view(), None, Mat::new(&y, n), gemm)?;
            let converted = figure(what.clone(), &d, 4)?;
            // W is packed in place after the converted row's timing.
            let in_memory = match gpu.measures_weight_rows() {
                true => Some(figure(format!("{what}, f16 x and W in memory"), &self.linear_over_half_operands(&x, &mut weight, &y, gemm)?, 2)?),
                false => None,
            };
            figures.push(LinearFigures { converted, in_memory });
        }
        Ok(figures)
    }

    /// [`LinearFigures::in_memory`]'s product, prepared: x packed once
    /// into f16 rows under one range scale a row (as a norm or modulation
    /// writes a linear's input on the matrix tier) and W packed in place
    /// under its kept scales (as at load); neither pack is timed.
    fn linear_over_half_operands(&self, x: &DeviceBuffer, weight: &mut DeviceWeight, y: &DeviceBuffer, gemm: kernels::Gemm) -> Result<Vec<Dispatch>, GpuError> {
        let gpu = self.gpu;
        let kernels::Gemm { m: tokens, n, k } = gemm;
        if !gpu.measures_weight_rows() || !k.is_multiple_of(2) {
            return Err(GpuError::UnsupportedShape(format!("f16 operands in memory (the matrix tier's f16 operands, an even k: {k})")));
        }
        let rows = gpu.storage("bench x f16", 2 * tokens * k);
        let row_scales = gpu.storage("bench x scales", 4 * tokens);
        let shape = kernels::HeadRows { tokens, heads: 1, head_dim: k };
        gpu.submit(|enc| kernels::half_pack(gpu, enc, Mat::new(x, k), Mat::new(&rows, k / 2), Mat::new(&row_scales, 1), shape))?;
        weight.pack_half(gpu)?;
        if !weight.half_packed {
            return Err(GpuError::UnsupportedShape(format!("a bench weight of rows of {k} that cannot be packed as f16")));
        }
        let half = kernels::Input::Half(flux_lite_kernels::HalfMat::rows(Mat::new(&rows, k / 2), Mat::new(&row_scales, 1)));
        let mut d = Vec::new();
        kernels::linear_from(gpu, &mut d, half, weight.view(), None, Mat::new(y, n), gemm)?;
        Ok(d)
    }

    /// A rank-`rank` LoRA side product on each distinct linear shape of the
    /// blocks, over `tokens` rows: `t = x·Aᵀ`, then `y += t·Bᵀ` (f32
    /// adapter matrices, as the engine holds them), the cost an adapter
    /// adds to its linear, to set beside that linear's row.
    pub fn lora_side_products(&self, cfg: &TransformerConfig, tokens: u64, rank: u64) -> Result<Vec<Figure>, RunError> {
        let gpu = self.gpu;
        let mut figures = Vec::new();
        for ((n, k), name, _) in linear_shapes(cfg, tokens)? {
            let x = gpu.upload_f32("bench x", &random_f32((tokens * k) as usize, 1));
            let down = gpu.upload_f32("bench lora down", &random_f32((rank * k) as usize, 3));
            let up = gpu.upload_f32("bench lora up", &random_f32((n * rank) as usize, 4));
            let t = gpu.storage("bench lora scratch", 4 * tokens * rank);
            let y = gpu.upload_f32("bench y", &random_f32((tokens * n) as usize, 5));
            let mut d = Vec::new();
            kernels::linear(gpu, &mut d, Mat::new(&x, k), flux_lite_kernels::Weight::f32(&down), None, Mat::new(&t, rank), kernels::Gemm { m: tokens, n: rank, k })?;
            kernels::linear_add(gpu, &mut d, Mat::new(&t, rank), flux_lite_kernels::Weight::f32(&up), Mat::new(&y, n), kernels::Gemm { m: tokens, n, k: rank })?;
            figures.push(Figure {
                what: format!("LoRA rank {rank} on {}", block_local(&name).trim_end_matches(".weight")),
                shape: format!("{tokens}×{k} · {k}×{rank} · {rank}×{n}"),
                seconds: self.timer.median(&d, self.repeats)?,
                flops: 2 * tokens * rank * (k + n),
                bytes: 4 * (tokens * k + rank * k + 2 * tokens * rank + rank * n + 2 * tokens * n),
                matrix: gpu.matrix().is_some(),
                dispatches: Some(d.len() as u64),
            });
        }
        Ok(figures)
    }

    /// Joint attention over `tokens` tokens with the transformer's heads:
    /// over f32 queries, keys and values (each row's scales measured from
    /// them on the matrix tier), and on f16 operands again over f16 pieces
    /// in memory into f16 pieces, as the blocks' attention runs there.
    pub fn attention(&self, cfg: &TransformerConfig, tokens: u64) -> Result<Vec<Figure>, RunError> {
        let gpu = self.gpu;
        let (heads, hd) = (cfg.num_attention_heads as u64, cfg.attention_head_dim as u64);
        let width = heads * hd;
        let qkv: Vec<DeviceBuffer> = (0..3).map(|i| gpu.upload_f32("bench qkv", &random_f32((tokens * width) as usize, 10 + i))).collect();
        let o = gpu.storage("bench attention out", 4 * tokens * width);
        let s = kernels::Attention {
            q_len: tokens,
            kv_len: tokens,
            q_heads: heads,
            kv_heads: heads,
            head_dim: hd,
            scale: (1.0 / (hd as f64).sqrt()) as f32,
            causal: false,
        };
        let m: Vec<Mat<'_>> = qkv.iter().chain([&o]).map(|b| Mat::new(b, width)).collect();
        let mut d = Vec::new();
        kernels::attention(gpu, &mut d, kernels::Qkv { q: m[0], k: m[1], v: m[2] }, None, m[3], s)?;
        let op = Op::Attention { q: span0().into(), k: span0().into(), v: span0().into(), o: span0().into(), len: tokens, heads, head_dim: hd };
        // On matrix units unless a kernel of the f32 tier is forced (FLUX_LITE_ATTENTION_KERNEL).
        let matrix = gpu.matrix().is_some()
            && hd <= kernels::ATTENTION_MATRIX_MAX_HEAD_DIM
            && !matches!(gpu.attention_choice(), flux_lite_kernels::AttentionChoice::Tiled | flux_lite_kernels::AttentionChoice::Lanes);
        let figure = |what: &str, d: &[Dispatch], value_bytes: u64| -> Result<Figure, RunError> {
            Ok(Figure {
                what: what.into(),
                shape: format!("{tokens} tokens, {heads}×{hd}"),
                seconds: self.timer.median(d, self.repeats)?,
                flops: op.flops(),
                bytes: value_bytes * 4 * tokens * width,
                matrix,
                dispatches: Some(d.len() as u64),
            })
        };
        let mut figures = vec![figure("attention", &d, 4)?];
        let piece = flux_lite_core::ir::MAX_OPERAND_PIECE.min(hd);
        if matrix && gpu.measures_weight_rows() && hd.is_multiple_of(piece) {
            let d = self.attention_over_half_pieces(&qkv, s, piece, false)?;
            figures.push(figure(&format!("attention, f16 pieces of {piece} in memory in and out"), &d, 2)?);
            // What runs the blocks' attention where the flash kernel's check fails, timed wherever it can run.
            if kernels::runs_chunked_attention(gpu) {
                let d = self.attention_over_half_pieces(&qkv, s, piece, true)?;
                figures.push(figure(&format!("attention as products on the GEMM core, f16 pieces of {piece} in and out"), &d, 2)?);
            }
        }
        Ok(figures)
    }

    /// The second row of [`Self::attention`] (the third `on_products`: as
    /// products on the GEMM core, its scratch allocated here), prepared: f32
    /// `qkv` packed once into f16 pieces under their range scales (as the
    /// projections' epilogues write them; not timed), the output into f16 pieces.
    fn attention_over_half_pieces(&self, qkv: &[DeviceBuffer], s: kernels::Attention, piece: u64, on_products: bool) -> Result<Vec<Dispatch>, GpuError> {
        let gpu = self.gpu;
        let (tokens, width) = (s.q_len, s.q_heads * s.head_dim);
        let pieces = width / piece;
        let words: Vec<DeviceBuffer> = (0..4).map(|_| gpu.storage("bench attention f16", 2 * tokens * width)).collect();
        let scales: Vec<DeviceBuffer> = (0..4).map(|_| gpu.storage("bench attention scales", 4 * tokens * pieces)).collect();
        let shape = kernels::HeadRows { tokens, heads: pieces, head_dim: piece };
        gpu.submit(|enc| (0..3).try_for_each(|i| kernels::half_pack(gpu, enc, Mat::new(&qkv[i], width), Mat::new(&words[i], width / 2), Mat::new(&scales[i], pieces), shape)))?;
        let half = |i: usize| flux_lite_kernels::HalfMat::pieces(Mat::new(&words[i], width / 2), Mat::new(&scales[i], pieces), piece);
        let mut d = Vec::new();
        let inputs = kernels::HalfQkv { q: half(0), k: half(1), v: half(2) };
        match on_products {
            true => {
                let part = flux_lite_core::ir::HeadsOnProducts::new(tokens, tokens, s.head_dim, s.q_heads, gpu.plan_limits().max_buffer);
                let scratch = gpu.storage("bench attention on products", 4 * part.end);
                let operands = gpu.storage("bench attention operands", flux_lite_core::ir::ChunkedOperands::bytes(s.head_dim, part.heads, part.chunk));
                kernels::attention_on_products(gpu, &mut d, kernels::HeadInputs::Pieces(inputs), None, half(3), Mat::new(&scratch, 0), &operands, s)?;
            }
            false => kernels::attention_half_into_half(gpu, &mut d, inputs, None, half(3), s)?,
        }
        Ok(d)
    }

    /// Whether a whole program's products (its FLOPs, all but a few) run on
    /// matrix units here: on the matrix tier, its rows' share is of their
    /// ceiling.
    pub(super) fn products_on_matrix_units(&self) -> bool {
        self.gpu.matrix().is_some()
    }

    /// The first double and the first single block over `tokens` tokens
    /// (512 of them text, or half when there are fewer than 1024).
    pub fn blocks(&self, cfg: &TransformerConfig, tokens: u64) -> Result<Vec<Figure>, RunError> {
        let first = self.first_blocks(cfg, tokens)?;
        let mut figures = Vec::new();
        for (what, block) in &first.blocks {
            let placed = first.weights.place(self.gpu, block)?;
            let d = first.runner.prepare_block(self.gpu, &placed, 0, block)?;
            figures.push(Figure {
                what: what.to_string(),
                shape: first.shape.clone(),
                seconds: self.timer.median(&d, self.repeats)?,
                flops: block.iter().map(Op::flops).sum(),
                bytes: first.weights.bytes_read(block),
                matrix: self.products_on_matrix_units(),
                dispatches: Some(d.len() as u64),
            });
        }
        Ok(figures)
    }

    /// The model's first double and single block (those it has) over
    /// `tokens` tokens, as this device's step lays them out, with what runs
    /// them: the layout [`Self::blocks`] and [`Self::block_ops`] time.
    fn first_blocks(&self, cfg: &TransformerConfig, tokens: u64) -> Result<FirstBlocks, RunError> {
        let text = if tokens >= 1024 { 512 } else { tokens / 2 };
        let chunk = self.chunk_for_keys(cfg, tokens);
        let (layout, mut blocks, arena_bytes) = programs(cfg, self.tokens(text, tokens - text), chunk)?;
        let picks = [("double block", 1, cfg.num_layers > 0), ("single block", 1 + cfg.num_layers, cfg.num_single_layers > 0)];
        let mut runner = self.runner(arena_bytes, tokens, cfg.attention_head_dim as u64, false);
        (runner.operands, runner.products_scratch) = attention_buffers(self.gpu, &blocks.concat());
        Ok(FirstBlocks {
            shape: format!("{text} text + {} image tokens, D {}{}", layout.image, layout.dim, chunked(chunk)),
            runner,
            weights: SyntheticWeights::new(|sink| tensors::transformer(cfg, sink)),
            blocks: picks.into_iter().filter(|(_, _, present)| *present).map(|(what, index, _)| (what, std::mem::take(&mut blocks[index]))).collect(),
        })
    }

    /// One whole denoising step (every block, prologue and epilogue) at a
    /// `size`² image with 512 prompt tokens, one image token per `cell`²
    /// pixels (the VAE's [`VaeConfig::latent_cell`]: 16 for the real VAE).
    /// The blocks share the first block's weights: each block still reads a
    /// full block of weights, and only one block's worth is made.
    pub fn step(&self, cfg: &TransformerConfig, size: u64, cell: u64) -> Result<Figure, RunError> {
        let image = (size / cell) * (size / cell);
        let chunk = self.chunk_for_keys(cfg, 512 + image);
        let (_, blocks, arena_bytes) = programs(cfg, self.tokens(512, image), chunk)?;
        let mut runner = self.runner(arena_bytes, 512 + image, cfg.attention_head_dim as u64, false);
        (runner.operands, runner.products_scratch) = attention_buffers(self.gpu, &blocks.concat());
        let weights = SyntheticWeights::new(|sink| tensors::transformer(cfg, sink));
        let placed = weights.place(self.gpu, blocks.iter().flatten())?;
        let d = self.prepare_all(&runner, &placed, &blocks)?;
        let per_block: u64 = blocks[1..blocks.len() - 1].iter().map(|b| weights.bytes_read(b)).sum();
        Ok(Figure {
            what: "denoising step".into(),
            shape: format!("{size}×{size}: 512 + {image} tokens{}", chunked(chunk)),
            seconds: self.timer.median(&d, self.repeats)?,
            flops: blocks.iter().flatten().map(Op::flops).sum(),
            bytes: per_block,
            matrix: self.products_on_matrix_units(),
            dispatches: Some(d.len() as u64),
        })
    }

    /// A latent preview after a step at a `size`² image, as a run with
    /// previews draws one: the map applied on the GPU to the latents in
    /// place, the levels read back at the latent's resolution and enlarged on
    /// the host (FLUX.2's map; zeros for a VAE without FLUX.2's 32 channels,
    /// which costs the same). Wall time, the best of the repeats.
    pub fn preview(&self, cfg: &VaeConfig, size: u64) -> Result<f64, RunError> {
        let cell = cfg.latent_cell() as u64;
        let grid = ((size / cell) as usize, (size / cell) as usize);
        let channels = 4 * cfg.latent_channels;
        let latents = self.gpu.upload_f32("preview latents", &vec![0.25f32; grid.0 * grid.1 * channels]);
        let map = match cfg.latent_channels {
            32 => crate::pipeline::preview::LatentRgbMap { factors: flux_lite_core::preview::FLUX2.factors.to_vec(), bias: flux_lite_core::preview::FLUX2.bias },
            c => crate::pipeline::preview::LatentRgbMap { factors: vec![[0.0; 3]; c], bias: [0.0; 3] },
        };
        let drawer = crate::pipeline::preview::GpuPreview::new(self.gpu, flux_lite_kernels::Mat { buf: &latents, offset: 0, stride: 0 }, &map, grid, cfg)?;
        let mut best = f64::INFINITY;
        for _ in 0..self.repeats.max(1) {
            let started = std::time::Instant::now();
            drawer.draw(self.gpu)?;
            best = best.min(started.elapsed().as_secs_f64());
        }
        Ok(best)
    }

    /// The text encoder over 512 prompt tokens, up to its deepest picked
    /// layer. The layers share the first layer's weights.
    pub fn text_encoder(&self, cfg: &Qwen3Config) -> Result<Figure, RunError> {
        let tokens = 512u64;
        let (layout, blocks, arena_bytes) = crate::components::text_encoder::programs(cfg, tokens as usize, cfg.output_layers(), self.gpu.plan_limits().half_operands)?;
        let runner = self.runner(arena_bytes, tokens, cfg.head_dim as u64, true);
        runner.write(self.gpu, layout.ones, &vec![1.0; cfg.hidden_size]);
        let weights = SyntheticWeights::new(|sink| tensors::text_encoder(cfg, sink));
        let placed = weights.place(self.gpu, blocks.iter().flatten())?;
        let d = self.prepare_all(&runner, &placed, &blocks)?;
        Ok(Figure {
            what: "text encoder".into(),
            shape: format!("{tokens} tokens, {} of {} layers", blocks.len() - 1, cfg.num_hidden_layers),
            seconds: self.timer.median(&d, self.repeats)?,
            flops: blocks.iter().flatten().map(Op::flops).sum(),
            bytes: blocks.iter().map(|b| weights.bytes_read(b)).sum(),
            matrix: self.products_on_matrix_units(),
            dispatches: Some(d.len() as u64),
        })
    }

    /// Sums measured phases into one end-to-end figure: the text encoder,
    /// `steps` denoising steps and the VAE decode (GPU time of each; loading
    /// and host work excluded). A guided generation encodes the negative
    /// prompt too and runs two transformer passes a step.
    pub fn end_to_end(encode: &Figure, step: &Figure, steps: u64, guided: bool, decode: &Figure, size: u64) -> Figure {
        let p = crate::pipeline::job::generation_passes(steps, guided);
        let how = if guided { format!("2 encodes + {steps} guided steps ({} passes)", p.transformer) } else { format!("encode + {steps} steps") };
        let (encodes, passes) = (p.encodes, p.transformer);
        Figure {
            what: "end to end".into(),
            shape: format!("{size}×{size}: {how} + decode"),
            seconds: encodes as f64 * encode.seconds + passes as f64 * step.seconds + decode.seconds,
            flops: encodes * encode.flops + passes * step.flops + decode.flops,
            bytes: encodes * encode.bytes + passes * step.bytes + decode.bytes,
            matrix: step.matrix,
            dispatches: match (encode.dispatches, step.dispatches, decode.dispatches) {
                (Some(e), Some(s), Some(d)) => Some(encodes * e + passes * s + d),
                _ => None,
            },
        }
    }

    /// DF11 expansion of `elements` bf16 weights into a slot, on the device.
    /// Fails if the expansion is not bit-exact.
    pub fn df11(&self, elements: usize) -> Result<Figure, RunError> {
        let weights = super::synthetic_weights(elements, 0);
        let buf = Df11GroupBuf::encode(&[&weights]).map_err(|e| RunError::layout("DF11 bench group")(&e))?;
        let group = buf.group().map_err(|e| RunError::layout("DF11 bench group")(&e))?;
        let on_device = Df11DeviceGroup::upload(self.gpu, &group);
        let slot = self.gpu.storage("bench df11 slot", 2 * elements as u64);
        let mut d = Vec::new();
        on_device.record_decode(self.gpu, &mut d, &slot, 0)?;
        let seconds = self.timer.median(&d, self.repeats)?;
        let back = self.gpu.read_bytes(&slot, 0, 2 * elements as u64)?;
        if !back.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).eq(weights.iter().copied()) {
            return Err(RunError::Gpu(flux_lite_kernels::GpuError::WrongResult("the DF11 expansion differs from the weights it was given".into())));
        }
        Ok(Figure {
            what: "DF11 expansion".into(),
            shape: format!("{elements} weights, {:.1}% of bf16", 100.0 * buf.total_bytes() as f64 / (2 * elements) as f64),
            seconds,
            flops: 0,
            bytes: buf.total_bytes() as u64 + 2 * elements as u64,
            matrix: false,
            dispatches: Some(d.len() as u64),
        })
    }

    /// GGUF expansion of `elements` weights in `ggml`'s blocks into f32, on
    /// the device (random block bytes: the rate does not depend on them;
    /// the bits are tested against gguf-py elsewhere).
    pub fn ggml(&self, ggml: flux_lite_core::ggml::GgmlType, elements: usize) -> Result<Figure, RunError> {
        let blocks = elements.div_ceil(flux_lite_core::ggml::QK_K) * flux_lite_core::ggml::QK_K / ggml.block_elements();
        let elements = blocks * ggml.block_elements();
        let mut bytes = vec![0f32; (blocks * ggml.block_bytes()).div_ceil(4)];
        flux_lite_core::numerics::rng::TorchGenerator::new(1).fill_randn_f32(&mut bytes);
        let raw = self.gpu.upload_f32("bench ggml blocks", &bytes);
        let slot = self.gpu.storage("bench ggml slot", 4 * elements as u64);
        let mut d = Vec::new();
        flux_lite_kernels::kernels::ggml_expand(self.gpu, &mut d, flux_lite_kernels::kernels::GgmlBlocks { ggml, scale: 1.0, buf: &raw, at: 0 }, blocks as u64, &slot, 0)?;
        let seconds = self.timer.median(&d, self.repeats)?;
        Ok(Figure {
            what: format!("GGUF {} expansion", ggml.name()),
            shape: format!("{elements} weights to f32, {:.1}% of bf16", 100.0 * (blocks * ggml.block_bytes()) as f64 / (2 * elements) as f64),
            seconds,
            flops: 0,
            bytes: (blocks * ggml.block_bytes()) as u64 + 4 * elements as u64,
            matrix: false,
            dispatches: Some(d.len() as u64),
        })
    }

    /// A pass over `text` prompt and `image` image tokens laid out as this
    /// device's transformer lays it out (f16 products' inputs on the matrix tier).
    fn tokens(&self, text: u64, image: u64) -> Tokens {
        Tokens { half_operands: self.gpu.plan_limits().half_operands, ..Tokens::plain(text, image) }
    }

    /// Token rows per pass when the single blocks' keys, a column window of
    /// the fused projection, would exceed one storage binding unchunked (as
    /// the planner decides for `gen`); `None` when they fit.
    fn chunk_for_keys(&self, cfg: &TransformerConfig, tokens: u64) -> Option<usize> {
        let fused = 3 * cfg.inner_dim() as u64 + 2 * cfg.mlp_hidden_dim() as u64;
        // A chunk as large as the pass would lay out the fused rows again.
        (4 * tokens * fused > self.gpu.max_binding()).then_some(KEY_CHUNK_ROWS.min(tokens as usize / 2).max(1))
    }

    /// An arena of `arena_bytes`, RoPE tables for `rows` tokens of `head_dim`
    /// (cos 1, sin 0), and with `masked` a key mask that keeps every key.
    fn runner(&self, arena_bytes: u64, rows: u64, head_dim: u64, masked: bool) -> Runner {
        let table = (rows * head_dim).max(1);
        Runner {
            arena: self.gpu.storage("bench activations", arena_bytes),
            rope_cos: self.gpu.upload_f32("bench rope cos", &vec![1.0; table as usize]),
            rope_sin: self.gpu.storage("bench rope sin", 4 * table),
            key_keep: masked.then(|| self.gpu.upload_u32("bench key mask", &vec![1; rows.max(1) as usize])),
            lora: None,
            operands: None,
            products_scratch: None,
        }
    }

    /// Every block's dispatches, in order, for one timed pass.
    fn prepare_all(&self, runner: &Runner, weights: &DeviceWeights, blocks: &[Vec<Op>]) -> Result<Vec<Dispatch>, GpuError> {
        Ok(runner.prepare(self.gpu, weights, blocks)?.into_iter().flatten().collect())
    }
}

/// [`ShapeBench::first_blocks`]: each block's name and program, their
/// tokens' description, the arena they run in and their weights.
struct FirstBlocks {
    shape: String,
    runner: Runner,
    weights: SyntheticWeights,
    blocks: Vec<(&'static str, Vec<Op>)>,
}

/// A linear shape of the blocks: `(cols, inner)`, the first weight of that
/// shape, and how many a block has.
type LinearShape = ((u64, u64), String, usize);

/// Each distinct linear shape of the first double and single block.
fn linear_shapes(cfg: &TransformerConfig, tokens: u64) -> Result<Vec<LinearShape>, RunError> {
    let (_, blocks, _) = programs(cfg, Tokens::plain(tokens / 2, tokens - tokens / 2), None)?;
    let first_double = blocks.get(1).filter(|_| cfg.num_layers > 0);
    let first_single = blocks.get(1 + cfg.num_layers).filter(|_| cfg.num_single_layers > 0);
    let mut shapes: Vec<LinearShape> = Vec::new();
    for op in first_double.into_iter().chain(first_single).flatten() {
        // A SwiGLU product is timed as the product of its gate and up rows.
        let shape = match op {
            Op::Linear { w, cols, inner, .. } | Op::LinearHalf { w, cols, inner, .. } => Some((w, *cols, *inner)),
            Op::LinearSwiGlu { w, cols, inner, .. } => Some((w, 2 * cols, *inner)),
            _ => None,
        };
        if let Some((w, cols, inner)) = shape {
            let (cols, inner) = (&cols, &inner);
            match shapes.iter_mut().find(|(s, _, _)| *s == (*cols, *inner)) {
                Some((_, _, n)) => *n += 1,
                None => shapes.push(((*cols, *inner), w.to_string(), 1)),
            }
        }
    }
    Ok(shapes)
}

/// Token rows per pass of the feed-forward and fused projections when the
/// keys force chunks (at most half the tokens): large enough that the
/// products stay efficient.
pub(super) const KEY_CHUNK_ROWS: usize = 1024;

fn chunked(chunk: Option<usize>) -> String {
    chunk.map_or(String::new(), |c| format!(", by {c}-token chunks"))
}

fn span0() -> flux_lite_core::ir::Span {
    flux_lite_core::ir::Span::new(0, 0)
}
