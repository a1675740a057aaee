//! Prompt embeddings as a safetensors file: `prompt_embeds` `[512, joint]`
//! (and optionally `negative_prompt_embeds`), the names diffusers'
//! `encode_prompt` returns, so files made by either side are interchangeable.

use crate::output::write_atomically;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::HashMap;
use std::path::Path;

pub const PROMPT: &str = "prompt_embeds";
pub const NEGATIVE: &str = "negative_prompt_embeds";

/// Writes f32 `[rows, joint]` tensors with string metadata, atomically.
pub fn write(path: &Path, tensors: &[(&str, &[f32])], joint: usize, metadata: &[(&str, String)]) -> Result<(), String> {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let mut views = Vec::with_capacity(tensors.len());
    for ((name, values), data) in tensors.iter().zip(&bytes) {
        let shape = vec![values.len() / joint.max(1), joint];
        views.push((*name, TensorView::new(Dtype::F32, shape, data).map_err(|e| format!("{name}: {e}"))?));
    }
    let metadata: HashMap<String, String> = metadata.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let data = safetensors::serialize(views, Some(metadata)).map_err(|e| e.to_string())?;
    write_atomically(path, &data)
}

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
        let values = match t.dtype() {
            Dtype::F32 => t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Dtype::BF16 => t.data().chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            other => return Err(format!("{p}: `{name}` is {other:?}; expected F32 or BF16")),
        };
        Ok(Some(values))
    }
}
