use super::*;
use crate::config::{klein_4b, klein_9b};
use crate::models::transformer::KvMode;
use crate::models::{vae, vae_encoder, vae_nhwc};

mod strategies;
mod previews;
mod vae_and_references;
mod readme;
mod limits;

const GIB: u64 = 1 << 30;
/// An adapter with large buffers (Metal on a Mac with 32 GB or more reports
/// a largest buffer of about 16 GiB) and bindings up to 4 GiB − 4: the
/// tables of docs/memory.md are for it. NVIDIA's Vulkan driver allows 4 GiB buffers,
/// so there the transformer's arena refuses 4096² (`limits::REAL_LIMITS`).
const LIMITS: DeviceLimits = DeviceLimits { max_buffer: 16 * GIB, max_binding: 4 * GIB - 4, half_operands: false, attention_products: crate::ir::AttentionProducts::NONE };

struct Model {
    transformer: TransformerConfig,
    text_encoder: Qwen3Config,
    vae: VaeConfig,
    df11: bool,
}

impl Model {
    fn klein_4b(df11: bool) -> Self {
        Self { transformer: klein_4b::transformer(), text_encoder: klein_4b::text_encoder(), vae: klein_4b::vae(), df11 }
    }

    fn klein_9b(df11: bool) -> Self {
        Self { transformer: klein_9b::transformer(), text_encoder: klein_9b::text_encoder(), vae: klein_9b::vae(), df11 }
    }

    fn input(&self, size: u64, budget: Option<u64>) -> PlanInput<'_> {
        PlanInput {
            transformer: &self.transformer,
            text_encoder: &self.text_encoder,
            vae: &self.vae,
            width: size,
            height: size,
            prompt_tokens: 512,
            references: &[],
            transformer_weights: transformer_weights(&self.transformer, self.df11),
            text_encoder_weights: text_encoder_weights(&self.text_encoder, self.df11),
            vae_weight_bytes: vae_decoder_weights(&self.vae),
            vae_encoder_weight_bytes: vae_encoder_weights(&self.vae),
            tokenizer_bytes: tokenizer_bytes(TOKENIZER_FILE_BYTES),
            limits: LIMITS,
            budget,
            vae_tile: None,
            kv_cache: false,
            kv_precision: KvPrecision::Auto,
            previews: &[],
        }
    }
}
