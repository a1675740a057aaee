//! A request the engine refuses, naming the setting at fault: made by
//! `Job::resolve` (and by the files a request names), printed by each door
//! its own way. Below everything that can raise one.

use std::fmt;

/// Tokens per prompt: diffusers' `max_sequence_length`, which the transformer attends over in full.
pub const PROMPT_TOKENS: usize = 512;

/// An image side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Width,
    Height,
}

/// The settings of a job, as errors name them; each caller names them its
/// own way (`gen` by its flags, `serve` by its JSON fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    Prompt,
    NegativePrompt,
    Embeddings,
    Images,
    References,
    /// One reference image (its name is the error's value).
    Reference,
    Width,
    Height,
    Steps,
    Guidance,
    VaeTile,
    InitImage,
    Mask,
    Strength,
}

impl Setting {
    /// The setting in words.
    pub fn words(self) -> &'static str {
        match self {
            Setting::Prompt => "prompt",
            Setting::NegativePrompt => "negative prompt",
            Setting::Embeddings => "prompt embeddings",
            Setting::Images => "images",
            Setting::References => "reference images",
            Setting::Reference => "reference image",
            Setting::Width => "width",
            Setting::Height => "height",
            Setting::Steps => "steps",
            Setting::Guidance => "guidance",
            Setting::VaeTile => "VAE tile",
            Setting::InitImage => "init image",
            Setting::Mask => "mask",
            Setting::Strength => "strength",
        }
    }
}

/// A job the engine refuses, naming the setting at fault (never a flag).
#[derive(Debug, Clone, PartialEq)]
pub enum RequestError {
    NoPrompt,
    PromptTooLong { index: usize, bytes: usize, limit: usize },
    NegativePromptTooLong { index: usize, bytes: usize, limit: usize },
    /// Embeddings of the wrong size: `which` is "prompt" or "negative prompt".
    Embeddings { index: usize, which: &'static str, values: usize, expected: (usize, usize) },
    Images { per_prompt: usize, total: usize, limit: usize },
    References { count: usize, limit: usize },
    /// A reference image that cannot be read or used; `name` is its file or field.
    Reference { name: String, why: String },
    /// A side off the VAE's grid.
    Size { side: Side, pixels: usize, cell: usize },
    SideTooLarge { side: Side, pixels: usize, limit: usize },
    Steps { steps: usize, limit: usize },
    Guidance { guidance: f32 },
    /// A VAE tile that cannot be used (`None`: the planned one, or untiled).
    VaeTile { tile: Option<usize>, why: String },
    /// A size asked for beside an init image, which sets the size.
    InitSize { side: Side, asked: usize, pixels: usize },
    /// A mask that does not fit its init image; `name` is its file or field.
    Mask { name: String, why: String },
    Strength { strength: f64, why: String },
    /// An init image for a KV-cache model, whose pipeline has no image-to-image or inpainting.
    InitWithKvCache,
}

impl RequestError {
    pub fn setting(&self) -> Setting {
        match self {
            RequestError::NoPrompt | RequestError::PromptTooLong { .. } => Setting::Prompt,
            RequestError::NegativePromptTooLong { .. } => Setting::NegativePrompt,
            RequestError::Embeddings { .. } => Setting::Embeddings,
            RequestError::Images { .. } => Setting::Images,
            RequestError::References { .. } => Setting::References,
            RequestError::Reference { .. } => Setting::Reference,
            RequestError::Size { side: Side::Width, .. } | RequestError::SideTooLarge { side: Side::Width, .. } => Setting::Width,
            RequestError::Size { side: Side::Height, .. } | RequestError::SideTooLarge { side: Side::Height, .. } => Setting::Height,
            RequestError::Steps { .. } => Setting::Steps,
            RequestError::Guidance { .. } => Setting::Guidance,
            RequestError::VaeTile { .. } => Setting::VaeTile,
            RequestError::InitSize { side: Side::Width, .. } => Setting::Width,
            RequestError::InitSize { side: Side::Height, .. } => Setting::Height,
            RequestError::Mask { .. } => Setting::Mask,
            RequestError::Strength { .. } => Setting::Strength,
            RequestError::InitWithKvCache => Setting::InitImage,
        }
    }

    /// The value as the caller gave it (empty where the setting has none).
    pub fn value(&self) -> String {
        match self {
            RequestError::NoPrompt | RequestError::References { .. } | RequestError::VaeTile { tile: None, .. } | RequestError::InitWithKvCache => String::new(),
            RequestError::PromptTooLong { .. } | RequestError::NegativePromptTooLong { .. } | RequestError::Embeddings { .. } => String::new(),
            RequestError::Images { per_prompt, .. } => per_prompt.to_string(),
            RequestError::Reference { name, .. } => name.clone(),
            RequestError::Size { pixels, .. } | RequestError::SideTooLarge { pixels, .. } => pixels.to_string(),
            RequestError::Steps { steps, .. } => steps.to_string(),
            RequestError::Guidance { guidance } => guidance.to_string(),
            RequestError::VaeTile { tile: Some(t), .. } => t.to_string(),
            RequestError::InitSize { asked, .. } => asked.to_string(),
            RequestError::Mask { name, .. } => name.clone(),
            RequestError::Strength { strength, .. } => strength.to_string(),
        }
    }

    /// What is wrong, naming neither the setting nor its value.
    pub fn reason(&self) -> String {
        match self {
            RequestError::NoPrompt => "give a prompt (text or embeddings)".into(),
            RequestError::PromptTooLong { index, bytes, limit } | RequestError::NegativePromptTooLong { index, bytes, limit } => {
                format!("prompt {}: {bytes} bytes is over the {limit}-byte limit (the text encoder reads {PROMPT_TOKENS} tokens)", index + 1)
            }
            RequestError::Embeddings { index, which, values, expected: (rows, width) } => {
                format!("prompt {}: the {which} embeddings hold {values} values; expected [{rows}, {width}]", index + 1)
            }
            RequestError::Images { total, limit, .. } => format!("{total} images in all; give 1 to {limit}"),
            RequestError::References { count, limit } => format!("{count} reference images; at most {limit}"),
            RequestError::Reference { why, .. } | RequestError::VaeTile { why, .. } | RequestError::Mask { why, .. } | RequestError::Strength { why, .. } => why.clone(),
            RequestError::InitSize { pixels, .. } => format!("the init image sets the size ({pixels} here); leave it out"),
            RequestError::Size { cell, .. } => format!("not a positive multiple of {cell} (2 × the VAE scale factor)"),
            RequestError::SideTooLarge { limit, .. } => format!("at most {limit}"),
            RequestError::Steps { limit, .. } => format!("give 1 to {limit}"),
            RequestError::Guidance { .. } => "give a finite number ≥ 0".into(),
            RequestError::InitWithKvCache => {
                "this model's pipeline (Flux2KleinKVPipeline) takes reference images, not an init image; image-to-image and inpainting need a model without the KV cache".into()
            }
        }
    }

    /// `NAME VALUE: REASON` with the setting named by `name` (a flag, a field).
    pub fn line(&self, name: &str) -> String {
        let value = self.value();
        match (name.is_empty(), value.is_empty()) {
            (true, true) => self.reason(),
            (true, false) => format!("{value}: {}", self.reason()),
            (false, true) => format!("{name}: {}", self.reason()),
            (false, false) => format!("{name} {value}: {}", self.reason()),
        }
    }
}

impl From<flux_lite_core::config::SizeError> for RequestError {
    fn from(e: flux_lite_core::config::SizeError) -> Self {
        let side = if e.side == "width" { Side::Width } else { Side::Height };
        RequestError::Size { side, pixels: e.pixels as usize, cell: e.cell as usize }
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line(self.setting().words()))
    }
}

impl std::error::Error for RequestError {}
