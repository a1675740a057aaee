//! The FLUX.2 transformer on the GPU: weights uploaded once, one activation
//! arena laid out by core before the first step, the forward pass as core's
//! block programs, and the Euler update on the device.

use crate::error::{GpuError, RunError};
use flux_lite_kernels::{DeviceBuffer, Gpu};
use flux_lite_kernels::kernels::{self, Elementwise};
use flux_lite_kernels::{Dispatch, Mat};
use crate::exec::device_weights::DeviceWeights;
use crate::exec::runner::{self, attention_buffers, collect_ops, BlockProgress, DeviceLora, Runner};
use crate::model::lora::LoraSet;
use crate::model::safetensors_store::WeightStore;
use flux_lite_core::config::TransformerConfig;
use flux_lite_core::plan::{WeightSizes, WeightStrategy};
use flux_lite_core::ir::Op;
use flux_lite_core::numerics::rope;
use flux_lite_core::models::transformer::{self as program, KvMode, KvPass, Tokens, TransformerLayout};
use flux_lite_core::BumpArena;

/// Longest timestep sinusoid supported without allocating (`timestep_guidance_channels`, checked by the config).
const MAX_SINUSOID: usize = flux_lite_core::config::MAX_TIMESTEP_CHANNELS;

/// The latent grids `(height, width)` in tokens of one pass's image rows:
/// the noise being denoised, then each reference image's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LatentGrids {
    pub noise: (usize, usize),
    pub references: Vec<(usize, usize)>,
    /// The klein KV pipeline's recipe for the references: their keys and
    /// values extracted on the first step and cached for the next
    /// ([`Transformer::use_kv_cache`]), or recomputed each step.
    pub kv_cache: KvMode,
    /// Keys and values kept in half precision (the plan's half-K/V layout).
    pub half_kv: bool,
}

impl LatentGrids {
    /// A pass without reference images.
    pub fn noise_only(latent_h: usize, latent_w: usize) -> Self {
        Self { noise: (latent_h, latent_w), references: Vec::new(), kv_cache: KvMode::Off, half_kv: false }
    }

    fn noise_tokens(&self) -> usize {
        self.noise.0 * self.noise.1
    }

    fn reference_tokens(&self) -> usize {
        self.references.iter().map(|(h, w)| h * w).sum()
    }

    /// FLUX.2's position of each image row: the noise at T = 0, reference
    /// `i` at T = 10·(i + 1), each over its own `(y, x)` grid.
    pub fn positions(&self) -> impl Iterator<Item = [f64; 4]> + '_ {
        let grid = |t: usize, (h, w): (usize, usize)| (0..h * w).map(move |i| rope::image_position(t, i / w, i % w));
        let references = self.references.iter().enumerate().flat_map(move |(i, &g)| grid(REFERENCE_T_STEP * (i + 1), g));
        grid(0, self.noise).chain(references)
    }
}

/// The step of the RoPE time index between reference images (diffusers' `_prepare_image_ids` scale).
pub const REFERENCE_T_STEP: usize = 10;

#[derive(Debug)]
pub struct Transformer {
    pub config: TransformerConfig,
    pub layout: TransformerLayout,
    runner: Runner,
    store: WeightStore,
    weights: DeviceWeights,
    /// The whole forward pass, grouped by block.
    blocks: Vec<Vec<Op>>,
    /// The same, as dispatches built once (pipelines, bindings, parameters).
    prepared: Vec<Vec<Dispatch>>,
    /// With the KV cache, the cached pass's dispatches (`prepared` is then
    /// the extracting pass), and whether the next pass reads the cache.
    cached: Option<Vec<Vec<Dispatch>>>,
    use_cache: std::cell::Cell<bool>,
    /// `latents += s·velocity`; `s` is rewritten in its parameters each step.
    euler: Dispatch,
    /// Guidance's buffer and dispatches, built once like the Euler step's.
    guidance: Guidance,
    pub arena_bytes: u64,
}

impl Transformer {
    /// Places the weights as `strategy` says, lays out the activations for
    /// `text` prompt tokens and the image tokens of `grids`, and builds the
    /// RoPE tables. Streaming reads the weights from `store` at
    /// every pass; a DF11 store is then expanded on the host first. With a
    /// `chunk`, the feed-forward and MLP projections run over that many
    /// token rows at a time (the same results in less memory).
    pub fn new(
        gpu: &Gpu,
        config: &TransformerConfig,
        store: WeightStore,
        strategy: WeightStrategy,
        chunk: Option<usize>,
        text: usize,
        grids: &LatentGrids,
    ) -> Result<Self, RunError> {
        Self::adapted(gpu, config, store, strategy, chunk, text, grids, &LoraSet::default())
    }

    /// [`Self::new`] with LoRA adapters added to the linears they adapt
    /// (their matrices resident on the device, the model's weights untouched).
    #[allow(clippy::too_many_arguments)] // new's, and the adapters
    pub fn adapted(
        gpu: &Gpu,
        config: &TransformerConfig,
        store: WeightStore,
        strategy: WeightStrategy,
        chunk: Option<usize>,
        text: usize,
        grids: &LatentGrids,
        lora: &LoraSet,
    ) -> Result<Self, RunError> {
        // A config read from a file was validated; one built by hand may not have been.
        config.validate().map_err(|e| RunError::input("transformer", format!("a config it cannot run: {e}")))?;
        let tokens = Tokens {
            text: text as u64,
            noise: grids.noise_tokens() as u64,
            references: grids.reference_tokens() as u64,
            kv_cache: grids.kv_cache,
            half_kv: grids.half_kv,
            half_operands: gpu.plan_limits().half_operands,
        };
        let (layout, blocks, arena_bytes) = programs(config, tokens, chunk)?;
        // The activations first: an adapter that cannot hold them fails here, before gigabytes of uploads.
        let arena = gpu.storage("transformer activations", arena_bytes);
        gpu.check_faults()?;
        let weights = DeviceWeights::for_blocks(gpu, &store, &blocks, strategy)?;
        let hd = config.attention_head_dim;
        let rows = text + grids.noise_tokens() + grids.reference_tokens();
        let (mut cos, mut sin) = (vec![0f32; rows * hd], vec![0f32; rows * hd]);
        let positions = (0..text).map(rope::text_position).chain(grids.positions());
        for (t, pos) in positions.enumerate() {
            rope::flux_row(pos, &config.axes_dims_rope, config.rope_theta, &mut cos[t * hd..][..hd], &mut sin[t * hd..][..hd]);
        }
        let (operands, products_scratch) = attention_buffers(gpu, &blocks.concat());
        let runner = Runner {
            arena,
            rope_cos: gpu.upload_f32("rope cos", &cos),
            rope_sin: gpu.upload_f32("rope sin", &sin),
            key_keep: None,
            lora: DeviceLora::upload(gpu, lora, rows as u64),
            operands,
            products_scratch,
        };
        let prepared = runner.prepare(gpu, &weights, &blocks)?;
        let cached = match layout.kv {
            Some(kv) if kv.cache.is_some() => Some(runner.prepare(gpu, &weights, &pass_blocks(config, &layout.with_pass(KvPass::Cached)))?),
            _ => None,
        };
        let mut euler = Vec::new();
        let mat = |s: flux_lite_core::ir::Span| Mat { buf: &runner.arena, offset: s.offset, stride: s.stride };
        kernels::elementwise(gpu, &mut euler, Elementwise::Axpy(0.0), mat(layout.velocity), None, mat(layout.latents), [layout.noise, layout.in_channels])?;
        let euler = match <[Dispatch; 1]>::try_from(euler) {
            Ok([d]) => d,
            Err(_) => return Err(RunError::Layout { component: "transformer", detail: "the latents are too large for one Euler dispatch".into() }),
        };
        let guidance = Guidance::prepare(gpu, &layout, &runner.arena)?;
        Ok(Self { config: config.clone(), layout, runner, store, weights, blocks, prepared, cached, use_cache: Default::default(), euler, guidance, arena_bytes })
    }

    /// The weight bytes of each block for the planner, as [`Self::new`] would place them.
    pub fn weight_sizes(config: &TransformerConfig, store: &WeightStore, text: usize, image: usize) -> Result<WeightSizes, RunError> {
        let (_, blocks, _) = programs(config, Tokens::plain(text as u64, image as u64), None)?;
        DeviceWeights::sizes(store, &blocks)
    }

    /// Sets the prompt embeddings `[text, joint_attention_dim]`.
    pub fn set_prompt(&self, gpu: &Gpu, prompt: &[f32]) -> Result<(), RunError> {
        let want = (self.layout.text * self.layout.joint_dim) as usize;
        if prompt.len() != want {
            let (text, joint) = (self.layout.text, self.layout.joint_dim);
            return Err(RunError::input("transformer", format!("prompt embeddings of {} values; it needs {text} × {joint} = {want}", prompt.len())));
        }
        self.runner.write(gpu, self.layout.prompt, prompt);
        Ok(())
    }

    /// Sets the packed noise latents `[noise, in_channels]`.
    pub fn set_latents(&self, gpu: &Gpu, latents: &[f32]) -> Result<(), RunError> {
        let want = (self.layout.noise * self.layout.in_channels) as usize;
        if latents.len() != want {
            return Err(RunError::input("transformer", format!("latents of {} values; it needs {want}", latents.len())));
        }
        self.runner.write(gpu, self.layout.latents, latents);
        Ok(())
    }

    /// Sets the reference images' tokens `[references, in_channels]`, which
    /// follow the noise rows and stay as they are through every step.
    pub fn set_references(&self, gpu: &Gpu, tokens: &[f32]) -> Result<(), RunError> {
        let rows = self.layout.image - self.layout.noise;
        let want = (rows * self.layout.in_channels) as usize;
        if tokens.len() != want {
            return Err(RunError::input("transformer", format!("reference tokens of {} values; it was laid out for {rows} × {}", tokens.len(), self.layout.in_channels)));
        }
        if rows > 0 {
            self.runner.write(gpu, self.layout.latents.rows_from(self.layout.noise), tokens);
        }
        Ok(())
    }

    /// Where the packed latents live on the device, for kernels that read them in place.
    pub fn latents_on_device(&self) -> flux_lite_kernels::Mat<'_> {
        let s = self.layout.latents;
        flux_lite_kernels::Mat { buf: &self.runner.arena, offset: s.offset, stride: s.stride }
    }

    /// The packed noise latents `[noise, in_channels]`.
    pub fn latents(&self, gpu: &Gpu) -> Result<Vec<f32>, GpuError> {
        self.runner.read(gpu, self.layout.latents, self.layout.noise, self.layout.in_channels)
    }

    /// The noise tokens' velocity `[noise, out_channels]`.
    pub fn velocity(&self, gpu: &Gpu) -> Result<Vec<f32>, GpuError> {
        self.runner.read(gpu, self.layout.velocity, self.layout.noise, self.layout.out_channels)
    }

    /// Number of progress units in one forward pass.
    pub fn block_count(&self) -> usize {
        self.blocks.len()
    }

    /// Runs one forward pass at timestep `t` (the scheduler's σ·1000); the
    /// velocity lands in `layout.velocity`. Encodes the dispatches prepared
    /// at construction: nothing is allocated on the device here.
    pub fn forward(&self, gpu: &Gpu, t: f32, progress: &mut dyn FnMut(BlockProgress)) -> Result<(), RunError> {
        let mut sinusoid = [0f32; MAX_SINUSOID];
        let sinusoid = &mut sinusoid[..self.layout.sinusoid_dim as usize];
        program::timestep_sinusoid(program::model_timestep(t), sinusoid);
        self.runner.write(gpu, self.layout.sinusoid, sinusoid);
        let prepared = match &self.cached {
            Some(cached) if self.use_cache.get() => cached,
            _ => {
                if let Some(kv) = self.layout.kv {
                    // The reference rows are modulated from timestep 0 (the pipeline's `ref_fixed_timestep`).
                    program::timestep_sinusoid(0.0, sinusoid);
                    self.runner.write(gpu, kv.sinusoid, sinusoid);
                }
                &self.prepared
            }
        };
        runner::run_prepared(gpu, &self.weights, &self.store, prepared, progress)
    }

    /// With the KV cache, whether the next passes read the reference keys
    /// and values cached by the last extracting pass (`false`: extract them
    /// again, as a run's first step does). Without it, nothing changes.
    pub fn use_kv_cache(&self, cached: bool) {
        self.use_cache.set(cached);
    }

    /// Runs steps of block `block` (its program or a part of it) in one
    /// submission, after expanding the weights the block keeps compressed.
    pub fn run_ops(&self, gpu: &Gpu, block: usize, ops: &[Op]) -> Result<(), RunError> {
        let dispatches = self.runner.prepare_block(gpu, &self.weights, block, ops)?;
        self.weights.stream_in(gpu, &self.store, block)?;
        gpu.submit(|enc| {
            flux_lite_kernels::encode(enc, &dispatches);
            Ok(())
        })?;
        Ok(())
    }

    /// Bytes of weights on the device (compressed groups and their slots included).
    pub fn weight_bytes(&self) -> u64 {
        self.weights.bytes() + self.runner.lora.as_ref().map_or(0, |l| l.bytes())
    }

    /// How many of its weights the products read as packed f16 (the matrix
    /// tier's half-precision data path; none elsewhere).
    pub fn half_packed_weights(&self) -> usize {
        self.weights.half_packed()
    }

    /// The dispatches of a forward pass as prepared (the extracting pass's,
    /// with the KV cache).
    pub fn dispatches(&self) -> usize {
        self.prepared.iter().map(Vec::len).sum()
    }

    /// Bytes of the bf16 slots DF11 groups are expanded into per block.
    pub fn weight_slot_bytes(&self) -> u64 {
        self.weights.slot_bytes()
    }

    /// The Euler step on the device: `latents += (σ_next − σ)·velocity`.
    pub fn euler_step(&self, gpu: &Gpu, sigma: f32, sigma_next: f32) -> Result<(), GpuError> {
        let offset = std::mem::offset_of!(flux_lite_kernels::kernels::elementwise::ElementwiseParams, scalar) as u64;
        gpu.queue.write_buffer(&self.euler.params, offset, bytemuck::bytes_of(&(sigma_next - sigma)));
        gpu.submit(|enc| {
            flux_lite_kernels::encode(enc, std::slice::from_ref(&self.euler));
            Ok(())
        })
    }

    /// Keeps the velocity just computed as the unconditional one of a guided step.
    pub fn keep_unconditional(&self, gpu: &Gpu) -> Result<(), GpuError> {
        gpu.submit(|enc| {
            flux_lite_kernels::encode(enc, &self.guidance.keep);
            Ok(())
        })
    }

    /// Classifier-free guidance on the conditional velocity just computed:
    /// `v = v_neg + g·(v_pos − v_neg)`, with diffusers' order of roundings.
    pub fn guide(&self, gpu: &Gpu, scale: f32) -> Result<(), GpuError> {
        let offset = std::mem::offset_of!(flux_lite_kernels::kernels::elementwise::ElementwiseParams, scalar) as u64;
        for d in &self.guidance.scale {
            gpu.queue.write_buffer(&d.params, offset, bytemuck::bytes_of(&scale));
        }
        let g = &self.guidance;
        gpu.submit(|enc| {
            for part in [&g.subtract, &g.scale, &g.add] {
                flux_lite_kernels::encode(enc, part);
            }
            Ok(())
        })
    }

    /// The program steps of each block, in order (prologue, doubles, singles, epilogue).
    pub fn blocks(&self) -> &[Vec<Op>] {
        &self.blocks
    }

    pub fn runner(&self) -> &Runner {
        &self.runner
    }
}

/// The activation layout, the block programs (prologue, doubles, singles,
/// epilogue) and the arena bytes of a forward pass (`chunk`: token rows per
/// feed-forward pass, `None`: all).
pub(crate) fn programs(config: &TransformerConfig, tokens: Tokens, chunk: Option<usize>) -> Result<(TransformerLayout, Vec<Vec<Op>>, u64), RunError> {
    let mut arena = BumpArena::new(u64::MAX);
    let chunk = chunk.map_or(tokens.text + tokens.image(), |c| c.max(1) as u64);
    let layout = TransformerLayout::chunked(config, tokens, chunk, &mut arena)
        .map_err(|e| RunError::Gpu(GpuError::UnsupportedShape(e.to_string())))?;
    let blocks = pass_blocks(config, &layout);
    Ok((layout, blocks, arena.high_water()))
}

/// The block programs (prologue, doubles, singles, epilogue) of one pass over `layout`.
fn pass_blocks(config: &TransformerConfig, layout: &TransformerLayout) -> Vec<Vec<Op>> {
    let mut blocks = vec![collect_ops(|emit| program::prologue(layout, emit))];
    for b in 0..config.num_layers {
        blocks.push(collect_ops(|emit| program::double_block(layout, b, emit)));
    }
    for b in 0..config.num_single_layers {
        blocks.push(collect_ops(|emit| program::single_block(layout, b, emit)));
    }
    blocks.push(collect_ops(|emit| program::epilogue(layout, emit)));
    blocks
}

/// The dispatches of a guided step: keep the unconditional velocity, then
/// `v − v_neg`, `·g` (the scale rewritten in its parameters each call), `+ v_neg`.
#[derive(Debug)]
struct Guidance {
    /// The unconditional velocity of a guided step, `[noise, out]`: only the
    /// dispatches read it; held so its bytes count while they bind it.
    _unconditional: DeviceBuffer,
    keep: Vec<Dispatch>,
    subtract: Vec<Dispatch>,
    scale: Vec<Dispatch>,
    add: Vec<Dispatch>,
}

impl Guidance {
    fn prepare(gpu: &Gpu, layout: &TransformerLayout, arena: &DeviceBuffer) -> Result<Self, GpuError> {
        let (rows, cols) = (layout.noise, layout.out_channels);
        let unconditional = gpu.storage("unconditional velocity", 4 * rows * cols);
        let v = Mat { buf: arena, offset: layout.velocity.offset, stride: layout.velocity.stride };
        let uncond = Mat { buf: &unconditional, offset: 0, stride: cols };
        let one = |op: Elementwise, a: Mat<'_>, dst: Mat<'_>| -> Result<Vec<Dispatch>, GpuError> {
            let mut d = Vec::new();
            kernels::elementwise(gpu, &mut d, op, a, None, dst, [rows, cols])?;
            Ok(d)
        };
        let (keep, subtract) = (one(Elementwise::Copy, v, uncond)?, one(Elementwise::Axpy(-1.0), uncond, v)?);
        let (scale, add) = (one(Elementwise::Scale(1.0), v, v)?, one(Elementwise::Axpy(1.0), uncond, v)?);
        Ok(Self { _unconditional: unconditional, keep, subtract, scale, add })
    }
}
