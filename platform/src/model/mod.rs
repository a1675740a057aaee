//! The official diffusers model folder: `model_index.json`, `scheduler/`,
//! `text_encoder/`, `tokenizer/`, `transformer/`, `vae/`. Architecture comes
//! from each component's `config.json`.

mod bfl_names;
mod llama_names;
pub mod compress;
pub mod config_json;
pub mod df11;
pub mod fingerprint;
pub mod gguf;
pub mod lora;
pub mod quantize;
pub mod safetensors_store;
pub mod tiny_decoder_file;
pub mod tokenizer;


use config_json::JsonFile;
use crate::error::LoadError;
use crate::model::safetensors_store::{weight_file_kind, WeightFile, WeightStore};
use flux_lite_core::config::{ModelIndex, Qwen3Config, SchedulerConfig, TransformerConfig, VaeConfig};
use flux_lite_core::models::tensors::{self, TensorSpec};
use std::path::{Path, PathBuf};

/// A model folder with every config read and validated (weights are opened on demand).
#[derive(Debug)]
pub struct ModelFolder {
    pub root: PathBuf,
    pub index: ModelIndex,
    pub transformer: TransformerConfig,
    pub text_encoder: Qwen3Config,
    pub vae: VaeConfig,
    pub scheduler: SchedulerConfig,
    /// Where the transformer is read from: `root/transformer` unless replaced.
    transformer_dir: PathBuf,
    /// A GGUF or BFL single file the transformer is read from instead
    /// (`--transformer FILE.gguf`, `--transformer FILE.safetensors`).
    transformer_file: Option<PathBuf>,
    /// A GGUF file the text encoder is read from instead (`--text-encoder FILE.gguf`).
    text_encoder_file: Option<PathBuf>,
    /// A tiny decoder that draws the previews instead of the VAE's
    /// latent-to-RGB map (`--preview-decoder`), checked against the VAE.
    pub preview_decoder: Option<std::sync::Arc<tiny_decoder_file::TinyDecoderFile>>,
}

impl ModelFolder {
    pub fn open(root: &Path) -> Result<Self, LoadError> {
        if !root.is_dir() {
            return Err(LoadError::Io {
                path: root.into(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "model folder not found"),
            });
        }
        let index = config_json::model_index(&JsonFile::read(&root.join("model_index.json"))?)?;
        let transformer = config_json::transformer(&JsonFile::read(&root.join("transformer/config.json"))?)?;
        let text_encoder = config_json::qwen3(&JsonFile::read(&root.join("text_encoder/config.json"))?)?;
        let vae = config_json::vae(&JsonFile::read(&root.join("vae/config.json"))?)?;
        let scheduler = config_json::scheduler(&JsonFile::read(&root.join("scheduler/scheduler_config.json"))?)?;
        let transformer_dir = root.join("transformer");
        let folder = Self { root: root.into(), index, transformer, text_encoder, vae, scheduler, transformer_dir, transformer_file: None, text_encoder_file: None, preview_decoder: None };
        folder.check_cross_component()?;
        Ok(folder)
    }

    /// The shapes that must agree between components (spec §5).
    fn check_cross_component(&self) -> Result<(), LoadError> {
        let mismatch = |field: &str, problem: String| LoadError::Field {
            path: self.transformer_dir.join("config.json"),
            field: field.into(),
            problem,
        };
        let joint = 3 * self.text_encoder.hidden_size;
        if self.transformer.joint_attention_dim != joint {
            return Err(mismatch(
                "joint_attention_dim",
                format!("is {} but the text encoder gives 3 × {} = {joint}", self.transformer.joint_attention_dim, self.text_encoder.hidden_size),
            ));
        }
        let latent = self.vae.patchified_channels();
        if self.transformer.in_channels != latent {
            return Err(mismatch(
                "in_channels",
                format!("is {} but the VAE's patchified latent has {latent} channels", self.transformer.in_channels),
            ));
        }
        Ok(())
    }

    /// Draws previews with the tiny decoder in `file` (diffusers'
    /// `AutoencoderTiny` layout or TAESD's, e.g. TAEF2), which must take
    /// this VAE's latents at its scale.
    pub fn with_preview_decoder(mut self, file: &Path) -> Result<Self, LoadError> {
        let decoder = tiny_decoder_file::TinyDecoderFile::open(file)?;
        decoder.check_fits(&self.vae)?;
        self.preview_decoder = Some(std::sync::Arc::new(decoder));
        Ok(self)
    }

    /// Reads the transformer from `dir` (a diffusers transformer folder with
    /// its own config.json, e.g. a fine-tune or a compressed copy) instead of
    /// the model's own.
    /// A `.gguf` file, or one `.safetensors` file (BFL's single files, FP8
    /// ones included), holds a transformer under BFL's names; the
    /// architecture stays the model folder's, and the file's tensors are
    /// checked against it.
    pub fn with_transformer(mut self, dir: &Path) -> Result<Self, LoadError> {
        if dir.is_file() && matches!(weight_file_kind(&dir.to_string_lossy()), Some(WeightFile::Gguf | WeightFile::Tensors)) {
            self.transformer_file = Some(dir.into());
            return Ok(self);
        }
        let json = JsonFile::read(&dir.join("config.json"))?;
        // An official DF11 folder's config.json holds only `dfloat11_config`:
        // the architecture stays the model folder's.
        let df11_only = json.value.get("dfloat11_config").is_some() && json.value.get("num_layers").is_none();
        if !df11_only {
            self.transformer = config_json::transformer(&json)?;
        }
        self.transformer_dir = dir.into();
        self.check_cross_component()?;
        Ok(self)
    }

    /// Reads the text encoder from a GGUF file (llama.cpp's Qwen3 layout,
    /// e.g. `Qwen3-4B-Q8_0.gguf`); the architecture stays the model folder's
    /// `text_encoder/config.json` and the tokenizer its `tokenizer/`.
    pub fn with_text_encoder(mut self, file: &Path) -> Result<Self, LoadError> {
        if weight_file_kind(&file.to_string_lossy()) != Some(WeightFile::Gguf) || !file.is_file() {
            return Err(LoadError::Io {
                path: file.into(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "a text encoder replaces the model's as a .gguf file"),
            });
        }
        self.text_encoder_file = Some(file.into());
        Ok(self)
    }

    pub fn component_dir(&self, component: &str) -> PathBuf {
        if component == Component::Transformer.dir() {
            self.transformer_dir.clone()
        } else {
            self.root.join(component)
        }
    }

    /// Opens a component's weights and checks them against its architecture.
    pub fn weights(&self, component: Component) -> Result<WeightStore, LoadError> {
        let file = match component {
            Component::Transformer => self.transformer_file.as_ref(),
            Component::TextEncoder => self.text_encoder_file.as_ref(),
            Component::Vae => None,
        };
        let mut store = match file {
            Some(file) if weight_file_kind(&file.to_string_lossy()) == Some(WeightFile::Gguf) => WeightStore::open_gguf(file, component.dir())?,
            Some(file) => WeightStore::open_single_file(file, component.dir())?,
            None => WeightStore::open(&self.component_dir(component.dir()), component.dir())?,
        };
        store.check(&self.expected_tensors(component))?;
        Ok(store)
    }

    /// Whether a component's folder holds weight files (`*.safetensors`, or a shard index).
    pub fn has_weight_files(&self, component: Component) -> bool {
        if component == Component::Transformer && self.transformer_file.is_some() || component == Component::TextEncoder && self.text_encoder_file.is_some() {
            return true;
        }
        let Ok(listing) = std::fs::read_dir(self.component_dir(component.dir())) else { return false };
        listing.flatten().any(|e| weight_file_kind(&e.file_name().to_string_lossy()).is_some())
    }

    pub fn expected_tensors(&self, component: Component) -> Vec<TensorSpec> {
        let mut specs = Vec::new();
        let push = |s: &TensorSpec| specs.push(s.clone());
        match component {
            Component::Transformer => tensors::transformer(&self.transformer, push),
            Component::TextEncoder => tensors::text_encoder(&self.text_encoder, push),
            Component::Vae => tensors::vae(&self.vae, push),
        }
        specs
    }
}

/// The components that carry weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Transformer,
    TextEncoder,
    Vae,
}

impl Component {
    pub const ALL: [Component; 3] = [Component::TextEncoder, Component::Transformer, Component::Vae];

    pub fn dir(self) -> &'static str {
        match self {
            Component::Transformer => "transformer",
            Component::TextEncoder => "text_encoder",
            Component::Vae => "vae",
        }
    }
}
