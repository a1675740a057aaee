//! The prompt tokenizer: the Qwen3 chat template around the prompt, then the
//! model's own `tokenizer/tokenizer.json` (byte-level BPE with the Qwen2 split,
//! NFC, added tokens) through Hugging Face's `tokenizers` crate, then the
//! truncation and padding that diffusers' `Flux2KleinPipeline` asks of
//! transformers: `padding="max_length", truncation=True, max_length=512`.
//!
//! We do the truncation and padding ourselves rather than through the crate's
//! settings, so that the number of tokens the prompt really had stays known
//! (the CLI warns when the end of a prompt is dropped) and the padding side
//! comes from `tokenizer_config.json`, where transformers reads it, instead of
//! from `tokenizer.json`.

use crate::model::config_json::JsonFile;
use crate::error::{LoadError, TokenizeError};
use std::path::Path;

/// How many tokens the text encoder reads: diffusers' default
/// `max_sequence_length` for FLUX.2-klein. Every prompt is padded or cut to it.
pub const MAX_SEQUENCE_LENGTH: usize = 512;

/// The pad token when `tokenizer_config.json` names none: Qwen2's default.
pub const DEFAULT_PAD_TOKEN: &str = "<|endoftext|>";

/// The chat-template text of one user turn, as the Qwen3 chat template renders
/// it with `add_generation_prompt=True, enable_thinking=False` (the call in
/// diffusers' `_get_qwen3_prompt_embeds`): no system message, and an empty
/// think block because thinking is off.
///
/// Hard-coded rather than run through a Jinja engine: the pipeline only ever
/// renders this one shape, and the goldens check it against the template
/// transformers ran.
pub fn render_chat(prompt: &str) -> String {
    format!("<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
}

/// Where the pads go. transformers' Qwen2 tokenizers pad on the right unless
/// `tokenizer_config.json` says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaddingSide {
    Right,
    Left,
}

/// One prompt ready for the text encoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizedPrompt {
    /// `max_len` ids: the first `real_tokens` tokens of the rendered prompt
    /// and the pads, on the configured side.
    pub input_ids: Vec<u32>,
    /// 1 for a real token, 0 for a pad, aligned with `input_ids`.
    pub attention_mask: Vec<u32>,
    /// How many of `input_ids` are real tokens.
    pub real_tokens: usize,
    /// How many tokens from the end of the rendered prompt truncation removed.
    pub dropped: usize,
}

impl TokenizedPrompt {
    /// The length of the rendered prompt before truncation.
    pub fn untruncated_tokens(&self) -> usize {
        self.real_tokens + self.dropped
    }

    /// The line the CLI prints when truncation dropped tokens, `None` when it
    /// dropped none. diffusers drops them silently; we say so because the end
    /// of a long prompt then has no effect on the image.
    pub fn truncation_warning(&self) -> Option<String> {
        (self.dropped > 0).then(|| {
            format!(
                "warning: the prompt is {} tokens long with its chat template; the last {} were dropped \
                 (the text encoder reads {})",
                self.untruncated_tokens(),
                self.dropped,
                self.input_ids.len()
            )
        })
    }
}

/// `tokenizer.json` files larger than this are refused before reading
/// (Qwen3's is about 11 MB).
pub const MAX_TOKENIZER_BYTES: u64 = 64 << 20;

/// The model's tokenizer with the padding settings of its `tokenizer_config.json`.
#[derive(Debug)]
pub struct PromptTokenizer {
    tokenizer: tokenizers::Tokenizer,
    pad_id: u32,
    padding_side: PaddingSide,
}

impl PromptTokenizer {
    /// Reads `tokenizer.json` and, when present, `tokenizer_config.json` from a
    /// model's `tokenizer/` folder. A missing `tokenizer_config.json` means the
    /// transformers defaults: right padding, pad token `<|endoftext|>`.
    pub fn load(tokenizer_dir: &Path) -> Result<Self, LoadError> {
        let json_path = tokenizer_dir.join("tokenizer.json");
        let io = |source| LoadError::Io { path: json_path.clone(), source };
        let len = std::fs::metadata(&json_path).map_err(io)?.len();
        if len > MAX_TOKENIZER_BYTES {
            return Err(LoadError::Tokenizer { path: json_path, detail: format!("{len} bytes is too large") });
        }
        let bytes = std::fs::read(&json_path).map_err(io)?;
        // Valid JSON first: the tokenizers library panics (instead of failing)
        // on some malformed values inside a component such as `decoder`.
        // Checked without building the document (a Qwen3 tokenizer.json as a
        // `Value` would add about 4 times its size to the load's peak).
        serde_json::from_slice::<serde::de::IgnoredAny>(&bytes)
            .map_err(|e| LoadError::Tokenizer { path: json_path.clone(), detail: format!("invalid JSON: {e}") })?;
        let mut tokenizer = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| LoadError::Tokenizer { path: json_path.clone(), detail: e.to_string() })?;
        // Truncation and padding are ours (see the module doc); a tokenizer.json
        // that configures its own would otherwise cut or pad before we count.
        tokenizer
            .with_truncation(None)
            .map_err(|e| LoadError::Tokenizer { path: json_path.clone(), detail: e.to_string() })?;
        tokenizer.with_padding(None);

        let config_path = tokenizer_dir.join("tokenizer_config.json");
        let (pad_token, padding_side) = read_config(&config_path)?;
        let pad_name = pad_token.as_deref().unwrap_or(DEFAULT_PAD_TOKEN);
        let pad_id = tokenizer.token_to_id(pad_name).ok_or_else(|| LoadError::Field {
            path: config_path.clone(),
            field: "pad_token".into(),
            problem: format!(
                "is `{pad_name}`{}, which {} does not hold",
                if pad_token.is_none() { " (the default, as none is given)" } else { "" },
                json_path.display()
            ),
        })?;
        Ok(Self { tokenizer, pad_id, padding_side })
    }

    /// The id padding uses.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// The side padding goes on.
    pub fn padding_side(&self) -> PaddingSide {
        self.padding_side
    }

    /// The ids of `text` as it stands (no chat template, truncation or padding).
    /// Added and special tokens written in the text are matched as single
    /// tokens, as transformers does with `split_special_tokens=False`.
    pub fn encode_raw(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        Ok(self.encoding(text)?.get_ids().to_vec())
    }

    /// The byte-level token strings of `text` as it stands, for diagnostics
    /// (the goldens list them as `tokens_untruncated`).
    pub fn token_strings(&self, text: &str) -> Result<Vec<String>, TokenizeError> {
        Ok(self.encoding(text)?.get_tokens().to_vec())
    }

    /// A prompt as the text encoder takes it: rendered with [`render_chat`],
    /// tokenized, cut to its first `max_len` tokens and padded to `max_len`.
    pub fn encode_prompt(&self, prompt: &str, max_len: usize) -> Result<TokenizedPrompt, TokenizeError> {
        let mut ids = self.encode_raw(&render_chat(prompt))?;
        let dropped = ids.len().saturating_sub(max_len);
        ids.truncate(max_len);
        let real_tokens = ids.len();
        let pads = max_len - real_tokens;
        let (input_ids, attention_mask) = match self.padding_side {
            PaddingSide::Right => (
                ids.into_iter().chain(std::iter::repeat_n(self.pad_id, pads)).collect(),
                std::iter::repeat_n(1, real_tokens).chain(std::iter::repeat_n(0, pads)).collect(),
            ),
            PaddingSide::Left => (
                std::iter::repeat_n(self.pad_id, pads).chain(ids).collect(),
                std::iter::repeat_n(0, pads).chain(std::iter::repeat_n(1, real_tokens)).collect(),
            ),
        };
        Ok(TokenizedPrompt { input_ids, attention_mask, real_tokens, dropped })
    }

    fn encoding(&self, text: &str) -> Result<tokenizers::Encoding, TokenizeError> {
        // `add_special_tokens` only runs the post-processor's template (a BOS,
        // say). transformers passes true; Qwen2's ByteLevel post-processor adds
        // nothing either way, and true keeps other tokenizers as transformers has them.
        self.tokenizer.encode(text, true).map_err(|e| TokenizeError { detail: e.to_string() })
    }
}

/// `pad_token` and `padding_side` from `tokenizer_config.json`, with the
/// transformers defaults for whatever is absent (the file included); `None`
/// for the pad token means the default. A null `pad_token` counts as absent:
/// the pipeline always pads to 512, so it needs one.
fn read_config(path: &Path) -> Result<(Option<String>, PaddingSide), LoadError> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((None, PaddingSide::Right)),
        Err(source) => return Err(LoadError::Io { path: path.to_path_buf(), source }),
        Ok(_) => {}
    }
    let file = JsonFile::read(path)?;
    let field_err = |field: &str, problem: String| LoadError::Field { path: path.to_path_buf(), field: field.into(), problem };

    let padding_side = match file.str_or("padding_side", "right")? {
        "right" => PaddingSide::Right,
        "left" => PaddingSide::Left,
        other => return Err(field_err("padding_side", format!("should be \"right\" or \"left\", found {other:?}"))),
    };

    // Written as a string, or (older transformers) as an AddedToken object.
    let pad = match file.value.get("pad_token") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(v @ serde_json::Value::Object(o)) => match o.get("content").and_then(|c| c.as_str()) {
            Some(s) => Some(s.to_string()),
            None => return Err(field_err("pad_token", format!("is an object without a string `content`: {v}"))),
        },
        Some(v) => return Err(field_err("pad_token", format!("should be a string or an object with `content`, found {v}"))),
    };
    Ok((pad, padding_side))
}
