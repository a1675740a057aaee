//! Prompt embeddings as a safetensors file: `prompt_embeds` `[512, joint]`
//! (and optionally `negative_prompt_embeds`), the names diffusers'
//! `encode_prompt` returns, so files made by either side are interchangeable.
//! They are written with [`crate::pipeline::output::write_f32_tensors`].

use crate::model::safetensors_store::widen_to_f32;
use safetensors::tensor::{Dtype, SafeTensors};
use std::path::Path;

pub const PROMPT: &str = "prompt_embeds";
pub const NEGATIVE: &str = "negative_prompt_embeds";

/// The embeddings file's tensors, read whole.
#[derive(Debug)]
pub struct EmbeddingsFile {
    path: String,
    bytes: Vec<u8>,
}

impl EmbeddingsFile {
    pub fn open(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let file = Self { path: path.display().to_string(), bytes };
        file.tensors()?;
        Ok(file)
    }

    fn tensors(&self) -> Result<SafeTensors<'_>, String> {
        SafeTensors::deserialize(&self.bytes).map_err(|e| format!("{}: not a valid safetensors file: {e}", self.path))
    }

    /// Tensor `name` as f32 `[rows, joint]` (a leading batch of 1 is allowed); `None` if absent.
    pub fn get(&self, name: &str, joint: usize) -> Result<Option<Vec<f32>>, String> {
        let st = self.tensors()?;
        let Ok(t) = st.tensor(name) else { return Ok(None) };
        let p = &self.path;
        match t.shape() {
            [rows, j] | [1, rows, j] if *j == joint && *rows > 0 => {}
            shape => return Err(format!("{p}: `{name}` has shape {shape:?}, expected [512, {joint}]")),
        }
        let mut values = Vec::with_capacity(t.data().len() / 2);
        match t.dtype() {
            dtype @ (Dtype::F32 | Dtype::BF16) => widen_to_f32(dtype, t.data(), &mut values),
            other => return Err(format!("{p}: `{name}` is {other:?}; expected F32 or BF16")),
        };
        Ok(Some(values))
    }
}
