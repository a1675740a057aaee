//! The Qwen3 text encoder on the GPU: token ids and the padding mask in,
//! the stacked prompt embedding `[tokens, 3·hidden]` out.
//!
//! The embedding table stays in the memory-mapped file: the host gathers the
//! rows of the prompt's tokens and writes them into the arena, so the table
//! (778 MB for Qwen3-4B) never reaches the device. Only the layers up to the
//! deepest picked hidden state are uploaded and run. Dropping the encoder
//! releases all of its device memory.

use crate::error::{LoadError, RunError};
use flux_lite_kernels::Gpu;
use flux_lite_kernels::Dispatch;
use crate::exec::device_weights::DeviceWeights;
use crate::exec::runner::{self, collect_ops, BlockProgress, Runner};
use crate::model::safetensors_store::{widen_to_f32, WeightStore};
use flux_lite_core::config::Qwen3Config;
use flux_lite_core::plan::{WeightSizes, WeightStrategy};
use flux_lite_core::ir::Op;
use flux_lite_core::numerics::rope;
use flux_lite_core::models::text_encoder::{self as program, TextEncoderLayout};
use flux_lite_core::BumpArena;
use safetensors::tensor::Dtype;

const EMBEDDING: &str = "model.embed_tokens.weight";

#[derive(Debug)]
pub struct TextEncoder {
    pub config: Qwen3Config,
    pub layout: TextEncoderLayout,
    store: WeightStore,
    runner: Runner,
    weights: DeviceWeights,
    /// The prologue (picks of the embedding itself), then one block per layer.
    blocks: Vec<Vec<Op>>,
    prepared: Vec<Vec<Dispatch>>,
    pub arena_bytes: u64,
}

impl TextEncoder {
    /// Places the layers needed for the `picks` hidden states as `strategy`
    /// says, lays out the activations for `tokens` tokens and builds the RoPE
    /// tables (positions 0..tokens). A compressed embedding table is expanded
    /// on the host, where its rows are gathered. On the matrix tier's f16
    /// tiles the layers run the half-precision data path.
    pub fn new(
        gpu: &Gpu,
        config: &Qwen3Config,
        mut store: WeightStore,
        strategy: WeightStrategy,
        tokens: usize,
        picks: [usize; 3],
    ) -> Result<Self, RunError> {
        let (layout, blocks, arena_bytes) = programs(config, tokens, picks, gpu.plan_limits().half_operands)?;
        store.expand_df11_holding(EMBEDDING)?;
        // The activations first: an adapter that cannot hold them fails here, before any upload.
        let arena = gpu.storage("text encoder activations", arena_bytes);
        gpu.check_faults()?;
        let weights = DeviceWeights::for_blocks(gpu, &store, &blocks, strategy)?;
        embedding_table(&store, config)?;
        let hd = config.head_dim;
        let (mut cos, mut sin) = (vec![0f32; tokens * hd], vec![0f32; tokens * hd]);
        for t in 0..tokens {
            rope::qwen_row(t, hd, config.rope_theta, &mut cos[t * hd..][..hd], &mut sin[t * hd..][..hd]);
        }
        // Where its attention runs as products on the GEMM core (the flash kernel not proven), their buffers.
        let (operands, products_scratch) = crate::exec::runner::attention_buffers(gpu, &blocks.concat());
        let runner = Runner {
            arena,
            rope_cos: gpu.upload_f32("qwen rope cos", &cos),
            rope_sin: gpu.upload_f32("qwen rope sin", &sin),
            key_keep: Some(gpu.storage("qwen key mask", 4 * tokens.max(1) as u64)),
            lora: None,
            operands,
            products_scratch,
        };
        runner.write(gpu, layout.ones, &vec![1.0; config.hidden_size]);
        let prepared = runner.prepare(gpu, &weights, &blocks)?;
        Ok(Self { config: config.clone(), layout, store, runner, weights, blocks, prepared, arena_bytes })
    }

    /// The weight bytes of each block for the planner, as [`Self::new`] would place them.
    pub fn weight_sizes(config: &Qwen3Config, store: &WeightStore, tokens: usize, picks: [usize; 3]) -> Result<WeightSizes, RunError> {
        // The same weights on either data path.
        let (_, blocks, _) = programs(config, tokens, picks, false)?;
        DeviceWeights::sizes(store, &blocks)
    }

    /// Number of progress units in one encode (the prologue counts as one).
    pub fn block_count(&self) -> usize {
        self.blocks.len()
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> u64 {
        self.weights.bytes()
    }

    /// Encodes one tokenized prompt: `input_ids` and `attention_mask` (1 =
    /// real token) of `tokens` entries each. Returns `[tokens, 3·hidden]`.
    pub fn encode(
        &self,
        gpu: &Gpu,
        input_ids: &[u32],
        attention_mask: &[u32],
        progress: &mut dyn FnMut(BlockProgress),
    ) -> Result<Vec<f32>, RunError> {
        let tokens = self.layout.tokens as usize;
        if input_ids.len() != tokens || attention_mask.len() != tokens {
            return Err(RunError::input("text encoder", format!("{} token ids and {} mask entries; it takes {tokens} of each", input_ids.len(), attention_mask.len())));
        }
        let rows = self.gather_embeddings(input_ids)?;
        self.runner.write(gpu, self.layout.stream, &rows);
        if let Some(mask) = &self.runner.key_keep {
            gpu.queue.write_buffer(mask, 0, bytemuck::cast_slice(attention_mask));
        }
        runner::run_prepared(gpu, &self.weights, &self.store, &self.prepared, progress)?;
        Ok(self.runner.read(gpu, self.layout.embeds, self.layout.tokens, 3 * self.layout.hidden)?)
    }

    /// The embedding rows of `ids`, widened (or expanded from GGML blocks) to f32 on the host.
    fn gather_embeddings(&self, ids: &[u32]) -> Result<Vec<f32>, RunError> {
        let table = embedding_table(&self.store, &self.config)?;
        let hidden = self.config.hidden_size;
        let mut out = Vec::with_capacity(ids.len() * hidden);
        for &id in ids {
            let id = id as usize;
            if id >= self.config.vocab_size {
                return Err(RunError::input("text encoder", format!("token id {id}, outside its vocabulary of {}", self.config.vocab_size)));
            }
            let row = &table.bytes[id * table.row_bytes..][..table.row_bytes];
            match table.ggml {
                Some(ggml) => {
                    let at = out.len();
                    out.resize(at + hidden, 0.0);
                    flux_lite_core::ggml::expand_into(ggml, table.scale, row, &mut out[at..]);
                }
                // The table's dtype was checked to be one of the three when it was opened.
                None => {
                    widen_to_f32(table.dtype, row, &mut out);
                }
            }
        }
        Ok(out)
    }

    /// The program steps: the prologue, then one block per layer.
    pub fn blocks(&self) -> &[Vec<Op>] {
        &self.blocks
    }

    /// What runs the program: its arena and buffers (whether it has the
    /// attention on products' scratch, for one).
    pub fn runner(&self) -> &crate::exec::runner::Runner {
        &self.runner
    }
}

struct Table<'a> {
    dtype: Dtype,
    /// GGML blocks (a GGUF text encoder's), else a float dtype.
    ggml: Option<flux_lite_core::ggml::GgmlType>,
    /// FP8's per-tensor scale.
    scale: f32,
    row_bytes: usize,
    bytes: &'a [u8],
}

/// The embedding table, checked to be `[vocab, hidden]` in a float dtype or
/// in GGML blocks.
fn embedding_table<'a>(store: &'a WeightStore, config: &Qwen3Config) -> Result<Table<'a>, LoadError> {
    let want = [config.vocab_size, config.hidden_size];
    let wrong = |found: String| LoadError::WrongTensor { component: store.component.clone(), name: EMBEDDING.into(), expected: format!("shape {want:?}"), found };
    if let Some(q) = store.quantized(EMBEDDING) {
        let row_bytes = q.ggml.bytes_of(config.hidden_size as u64).unwrap_or(0) as usize;
        return match q.pieces.as_slice() {
            [bytes] if q.shape == want && row_bytes > 0 && bytes.len() == row_bytes * want[0] => Ok(Table { dtype: Dtype::U8, ggml: Some(q.ggml), scale: q.scale, row_bytes, bytes }),
            _ => Err(wrong(format!("{} of shape {:?} ({} bytes)", q.ggml.name(), q.shape, q.bytes()))),
        };
    }
    let t = store.tensor(EMBEDDING)?;
    let elem_bytes = match t.dtype {
        Dtype::BF16 | Dtype::F16 => 2,
        Dtype::F32 => 4,
        other => {
            return Err(LoadError::WrongTensor {
                component: store.component.clone(),
                name: EMBEDDING.into(),
                expected: "a bf16, f16 or f32 tensor".into(),
                found: format!("{other:?}"),
            })
        }
    };
    if t.shape != want || t.bytes.len() != want[0] * want[1] * elem_bytes {
        return Err(wrong(format!("shape {:?} ({} bytes)", t.shape, t.bytes.len())));
    }
    Ok(Table { dtype: t.dtype, ggml: None, scale: 1.0, row_bytes: want[1] * elem_bytes, bytes: t.bytes })
}

/// The activation layout, the block programs (prologue, then one per layer
/// run) and the arena bytes of one encode, on the half-precision data path
/// where `half_operands`.
pub(crate) fn programs(config: &Qwen3Config, tokens: usize, picks: [usize; 3], half_operands: bool) -> Result<(TextEncoderLayout, Vec<Vec<Op>>, u64), RunError> {
    let mut arena = BumpArena::new(u64::MAX);
    let layout = TextEncoderLayout::new(config, tokens as u64, picks, half_operands, &mut arena).map_err(|e| RunError::layout("text encoder")(&e))?;
    let mut blocks = vec![collect_ops(|emit| program::prologue(&layout, emit))];
    for i in 0..layout.layers_to_run() {
        blocks.push(collect_ops(|emit| program::layer(&layout, i, emit)));
    }
    Ok((layout, blocks, arena.high_water()))
}
