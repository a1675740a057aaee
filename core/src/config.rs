//! Model configurations as plain structs. `platform` fills them from each
//! component's `config.json`; everything downstream takes its dimensions from
//! here and never from constants.

use core::fmt;
use heapless::Vec;

/// At most this many entries in list-valued fields (RoPE axes, VAE levels).
pub const MAX_LIST: usize = 8;

/// Upper bounds on config values, far above any published model (the 9B's
/// widest is 12288, its vocabulary 151936, its deepest stack 36 layers) and
/// low enough that every size derived from them fits in 64 bits: a hostile
/// config can ask for nothing the planner cannot compute.
pub const MAX_WIDTH: usize = 1 << 20;
pub const MAX_LAYERS: usize = 1024;
pub const MAX_VOCAB: usize = 1 << 24;

/// The longest timestep sinusoid (`timestep_guidance_channels`) the transformer takes.
pub const MAX_TIMESTEP_CHANNELS: usize = 1024;

/// `transformer/config.json` of `Flux2Transformer2DModel`.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerConfig {
    pub patch_size: usize,
    pub in_channels: usize,
    pub out_channels: usize,
    pub num_layers: usize,
    pub num_single_layers: usize,
    pub attention_head_dim: usize,
    pub num_attention_heads: usize,
    pub joint_attention_dim: usize,
    pub timestep_guidance_channels: usize,
    pub mlp_ratio: f64,
    pub axes_dims_rope: Vec<usize, MAX_LIST>,
    pub rope_theta: f64,
    pub eps: f64,
    pub guidance_embeds: bool,
}

impl TransformerConfig {
    /// Width of the residual stream (heads × head dim).
    pub fn inner_dim(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Hidden width of the SwiGLU feed-forward (`int(dim * mlp_ratio)`).
    pub fn mlp_hidden_dim(&self) -> usize {
        (self.inner_dim() as f64 * self.mlp_ratio) as usize
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let axes_sum: usize = self.axes_dims_rope.iter().sum();
        check(self.patch_size == 1, "patch_size", "only patch_size 1 is supported")?;
        check(self.in_channels > 0, "in_channels", "must be positive")?;
        check(self.num_attention_heads > 0, "num_attention_heads", "must be positive")?;
        check(self.attention_head_dim > 0, "attention_head_dim", "must be positive")?;
        for (field, value) in [
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
            ("attention_head_dim", self.attention_head_dim),
            ("num_attention_heads", self.num_attention_heads),
            ("joint_attention_dim", self.joint_attention_dim),
            ("timestep_guidance_channels", self.timestep_guidance_channels),
        ] {
            check(value <= MAX_WIDTH, field, "is above 2^20, beyond any model this engine can run")?;
        }
        check(self.inner_dim() <= MAX_WIDTH, "num_attention_heads", "× attention_head_dim is above 2^20")?;
        check(self.num_layers <= MAX_LAYERS && self.num_single_layers <= MAX_LAYERS, "num_layers", "is above 1024")?;
        check(self.mlp_ratio <= 64.0, "mlp_ratio", "is above 64")?;
        check(self.axes_dims_rope.len() == 4, "axes_dims_rope", "must have 4 axes (T, H, W, L)")?;
        check(
            self.axes_dims_rope.iter().all(|d| d % 2 == 0),
            "axes_dims_rope",
            "every axis dimension must be even",
        )?;
        check(axes_sum == self.attention_head_dim, "axes_dims_rope", "must sum to attention_head_dim")?;
        check(self.mlp_ratio > 0.0, "mlp_ratio", "must be positive")?;
        check(self.timestep_guidance_channels.is_multiple_of(2), "timestep_guidance_channels", "must be even")?;
        check(self.timestep_guidance_channels <= MAX_TIMESTEP_CHANNELS, "timestep_guidance_channels", "is above 1024, the longest timestep sinusoid supported")?;
        check(!self.guidance_embeds, "guidance_embeds", "guidance-distilled models are not supported")?;
        Ok(())
    }
}

/// `text_encoder/config.json` of `Qwen3ForCausalLM`.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
}

impl Qwen3Config {
    /// The decoder layers whose raw outputs make the prompt embedding:
    /// `hidden_states[L/4], [L/2], [3L/4]` (36 layers → 9, 18, 27).
    pub fn output_layers(&self) -> [usize; 3] {
        let l = self.num_hidden_layers;
        [l / 4, l / 2, 3 * l / 4]
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check(self.num_hidden_layers >= 4, "num_hidden_layers", "must be at least 4")?;
        check(self.num_hidden_layers <= MAX_LAYERS, "num_hidden_layers", "is above 1024")?;
        for (field, value) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("head_dim", self.head_dim),
        ] {
            check(value <= MAX_WIDTH, field, "is above 2^20, beyond any model this engine can run")?;
        }
        check(self.num_attention_heads * self.head_dim <= MAX_WIDTH, "num_attention_heads", "× head_dim is above 2^20")?;
        check(self.vocab_size <= MAX_VOCAB, "vocab_size", "is above 2^24")?;
        check(self.num_key_value_heads > 0, "num_key_value_heads", "must be positive")?;
        check(
            self.num_attention_heads.is_multiple_of(self.num_key_value_heads),
            "num_attention_heads",
            "must be a multiple of num_key_value_heads",
        )?;
        check(self.head_dim.is_multiple_of(2) && self.head_dim > 0, "head_dim", "must be even and positive")?;
        check(self.vocab_size > 0, "vocab_size", "must be positive")?;
        check(self.rope_theta > 0.0, "rope_theta", "must be positive")?;
        Ok(())
    }
}

/// `vae/config.json` of `AutoencoderKLFlux2`.
#[derive(Debug, Clone, PartialEq)]
pub struct VaeConfig {
    pub in_channels: usize,
    pub out_channels: usize,
    pub block_out_channels: Vec<usize, MAX_LIST>,
    /// Decoder widths when they differ from the encoder's (`decoder_block_out_channels`).
    pub decoder_block_out_channels: Option<Vec<usize, MAX_LIST>>,
    pub layers_per_block: usize,
    pub latent_channels: usize,
    pub norm_num_groups: usize,
    pub use_quant_conv: bool,
    pub use_post_quant_conv: bool,
    pub mid_block_add_attention: bool,
    pub batch_norm_eps: f64,
    pub patch_size: [usize; 2],
}

impl VaeConfig {
    /// Pixels per latent cell: `2^(levels - 1)`.
    pub fn scale_factor(&self) -> usize {
        1 << (self.block_out_channels.len() - 1)
    }

    /// Pixels per side of one packed latent token: twice the scale factor
    /// (16 for the real VAE). Image sides and VAE tiles are multiples of it.
    pub fn latent_cell(&self) -> usize {
        2 * self.scale_factor()
    }

    pub fn decoder_channels(&self) -> &[usize] {
        self.decoder_block_out_channels.as_deref().unwrap_or(&self.block_out_channels)
    }

    /// Channels of the patchified latent the transformer sees.
    pub fn patchified_channels(&self) -> usize {
        self.latent_channels * self.patch_size[0] * self.patch_size[1]
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check(!self.block_out_channels.is_empty(), "block_out_channels", "must not be empty")?;
        check(
            self.decoder_channels().len() == self.block_out_channels.len(),
            "decoder_block_out_channels",
            "must have as many levels as block_out_channels",
        )?;
        check(self.norm_num_groups > 0, "norm_num_groups", "must be positive")?;
        check(
            self.block_out_channels.iter().chain(self.decoder_channels()).all(|&c| c > 0 && c <= MAX_WIDTH),
            "block_out_channels",
            "every level's channels must be in 1..=2^20",
        )?;
        for (field, value) in
            [("in_channels", self.in_channels), ("out_channels", self.out_channels), ("latent_channels", self.latent_channels)]
        {
            check(value <= MAX_WIDTH, field, "is above 2^20, beyond any model this engine can run")?;
        }
        check(self.layers_per_block <= 64, "layers_per_block", "is above 64")?;
        let divides = |c: &usize| (*c).is_multiple_of(self.norm_num_groups);
        check(
            self.block_out_channels.iter().all(divides) && self.decoder_channels().iter().all(divides),
            "norm_num_groups",
            "must divide every block's channel count",
        )?;
        check(self.patch_size == [2, 2], "patch_size", "only 2x2 patches are supported")?;
        check(self.latent_channels > 0, "latent_channels", "must be positive")?;
        check(self.out_channels == 3, "out_channels", "must be 3: the decoder makes RGB images")?;
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeShift {
    Exponential,
    Linear,
}

/// `scheduler/scheduler_config.json` of `FlowMatchEulerDiscreteScheduler`.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    pub num_train_timesteps: usize,
    pub shift: f64,
    pub use_dynamic_shifting: bool,
    pub time_shift_type: TimeShift,
    pub base_shift: f64,
    pub max_shift: f64,
    pub base_image_seq_len: usize,
    pub max_image_seq_len: usize,
}

/// The parts of `model_index.json` the engine acts on.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelIndex {
    /// `true` for the step-distilled klein models (no CFG, 4 steps).
    pub is_distilled: bool,
    /// `true` for `Flux2KleinKVPipeline` (klein 9B KV): the reference images'
    /// keys and values are computed on the first step and cached for the rest.
    pub kv_cache: bool,
}

/// A config value that the engine cannot run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigError {
    pub field: &'static str,
    pub problem: &'static str,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` {}", self.field, self.problem)
    }
}

fn check(ok: bool, field: &'static str, problem: &'static str) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError { field, problem })
    }
}

/// The published klein-4B shapes, for tests and planning without a model folder.
pub mod klein_4b {
    use super::*;

    pub fn transformer() -> TransformerConfig {
        TransformerConfig {
            patch_size: 1,
            in_channels: 128,
            out_channels: 128,
            num_layers: 5,
            num_single_layers: 20,
            attention_head_dim: 128,
            num_attention_heads: 24,
            joint_attention_dim: 7680,
            timestep_guidance_channels: 256,
            mlp_ratio: 3.0,
            axes_dims_rope: Vec::from_slice(&[32, 32, 32, 32]).expect("4 axes fit"),
            rope_theta: 2000.0,
            eps: 1e-6,
            guidance_embeds: false,
        }
    }

    pub fn text_encoder() -> Qwen3Config {
        Qwen3Config {
            vocab_size: 151936,
            hidden_size: 2560,
            intermediate_size: 9728,
            num_hidden_layers: 36,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            head_dim: 128,
            rms_norm_eps: 1e-6,
            rope_theta: 1e6,
            tie_word_embeddings: true,
            max_position_embeddings: 40960,
        }
    }

    pub fn vae() -> VaeConfig {
        VaeConfig {
            in_channels: 3,
            out_channels: 3,
            block_out_channels: Vec::from_slice(&[128, 256, 512, 512]).expect("4 levels fit"),
            decoder_block_out_channels: None,
            layers_per_block: 2,
            latent_channels: 32,
            norm_num_groups: 32,
            use_quant_conv: true,
            use_post_quant_conv: true,
            mid_block_add_attention: true,
            batch_norm_eps: 1e-4,
            patch_size: [2, 2],
        }
    }
}

/// The published klein-9B shapes: 8 double and 24 single blocks, 32 heads,
/// a Qwen3-8B text encoder; the VAE is the 4B's.
pub mod klein_9b {
    use super::*;

    pub fn transformer() -> TransformerConfig {
        TransformerConfig {
            num_layers: 8,
            num_single_layers: 24,
            num_attention_heads: 32,
            joint_attention_dim: 12288,
            ..klein_4b::transformer()
        }
    }

    pub fn text_encoder() -> Qwen3Config {
        Qwen3Config {
            hidden_size: 4096,
            intermediate_size: 12288,
            num_hidden_layers: 36,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            tie_word_embeddings: false,
            ..klein_4b::text_encoder()
        }
    }

    pub fn vae() -> VaeConfig {
        klein_4b::vae()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klein_4b_derived_sizes() {
        let t = klein_4b::transformer();
        t.validate().unwrap();
        assert_eq!(t.inner_dim(), 3072);
        assert_eq!(t.mlp_hidden_dim(), 9216);
        let q = klein_4b::text_encoder();
        q.validate().unwrap();
        assert_eq!(q.output_layers(), [9, 18, 27]);
        assert_eq!(3 * q.hidden_size, t.joint_attention_dim);
        let v = klein_4b::vae();
        v.validate().unwrap();
        assert_eq!(v.scale_factor(), 8);
        assert_eq!(v.patchified_channels(), t.in_channels);
    }

    #[test]
    fn rejects_inconsistent_rope_axes() {
        let mut t = klein_4b::transformer();
        t.axes_dims_rope = Vec::from_slice(&[32, 32, 32, 30]).unwrap();
        assert_eq!(t.validate().unwrap_err().field, "axes_dims_rope");
    }

    #[test]
    fn rejects_groups_that_do_not_divide_channels() {
        let mut v = klein_4b::vae();
        v.norm_num_groups = 48;
        assert_eq!(v.validate().unwrap_err().field, "norm_num_groups");
    }
}

/// An image size the model can take: both sides positive multiples of the
/// VAE's latent cell ([`VaeConfig::latent_cell`]), so the latent packs into
/// 2×2 tokens. The one place the size rule is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSize {
    pub width: u64,
    pub height: u64,
    cell: u64,
}

/// A side of an image that breaks the size rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeError {
    /// `"width"` or `"height"`.
    pub side: &'static str,
    pub pixels: u64,
    pub cell: u64,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the {} {} is not a positive multiple of {} (2 × the VAE scale factor)", self.side, self.pixels, self.cell)
    }
}

impl ImageSize {
    pub fn new(vae: &VaeConfig, width: u64, height: u64) -> Result<Self, SizeError> {
        let cell = vae.latent_cell() as u64;
        for (side, pixels) in [("width", width), ("height", height)] {
            if pixels == 0 || !pixels.is_multiple_of(cell) {
                return Err(SizeError { side, pixels, cell });
            }
        }
        Ok(Self { width, height, cell })
    }

    /// The packed latent token grid `(rows, cols)`: `(H/(2s), W/(2s))`.
    pub fn latent_grid(&self) -> (u64, u64) {
        (self.height / self.cell, self.width / self.cell)
    }
}
