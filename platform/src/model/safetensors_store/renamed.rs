//! Components in one file whose tensor names are not diffusers': GGUF files
//! (a transformer under BFL's names, a text encoder under llama.cpp's) and
//! BFL-named single safetensors files, FP8 ones included.

use super::{widen_to_f32, Entry, Shard, Source, WeightStore};
use crate::error::LoadError;
use flux_lite_core::ggml::GgmlType;
use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::Path;

impl WeightStore {
    /// A component in one GGUF file. A transformer's tensors are under BFL's names
    /// (ComfyUI-GGUF's and stable-diffusion.cpp's layout) brought to
    /// diffusers' as `convert_flux2_transformer_checkpoint_to_diffusers`
    /// brings them: fused projections split by rows, the final modulation's
    /// halves swapped. Names it does not know stay as they are (and are
    /// reported unread by [`Self::check`]). A text encoder's are under
    /// llama.cpp's Qwen3 names (its tokenizer metadata is not read: the
    /// model folder's `tokenizer/` is the tokenizer).
    pub fn open_gguf(path: &Path, component: &str) -> Result<Self, LoadError> {
        let map = map_file(path)?;
        let header = crate::model::gguf::parse(&map).map_err(|detail| LoadError::Safetensors { path: path.into(), detail })?;
        let tensors = header
            .tensors
            .into_iter()
            .map(|t| {
                let kind = match t.ggml {
                    GgmlType::F32 => Stored::Float(Dtype::F32),
                    GgmlType::F16 => Stored::Float(Dtype::F16),
                    GgmlType::Bf16 => Stored::Float(Dtype::BF16),
                    ggml => Stored::Quantized(ggml, 1.0),
                };
                Named { name: t.name, shape: t.shape, kind, range: t.range }
            })
            .collect();
        Self::from_renamed(path, map, component, tensors, header.architecture.as_deref().unwrap_or("unnamed"))
    }

    /// A transformer in one safetensors file under BFL's names, as BFL's
    /// and ComfyUI's single files hold it, FP8 ones included: an `F8_E4M3`
    /// weight is multiplied by its module's `weight_scale` (or
    /// `scale_weight`) as it is expanded, by 1 without one; the activation
    /// scales (`input_scale`, `scale_input`) are hints for FP8 products and
    /// are not read.
    pub fn open_single_file(path: &Path, component: &str) -> Result<Self, LoadError> {
        let map = map_file(path)?;
        let bad = |detail: String| LoadError::Safetensors { path: path.into(), detail };
        let (header_len, metadata) = SafeTensors::read_metadata(&map).map_err(|e| bad(format!("invalid safetensors: {e}")))?;
        let start = 8 + header_len;
        let mut scales = HashMap::new();
        for (name, info) in metadata.tensors() {
            let Some(module) = name.strip_suffix(".weight_scale").or_else(|| name.strip_suffix(".scale_weight")) else { continue };
            let (a, b) = info.data_offsets;
            let mut value = Vec::new();
            if info.shape.iter().product::<usize>() != 1 || !widen_to_f32(info.dtype, &map[start + a..start + b], &mut value) {
                return Err(bad(format!("`{name}` should be one float, the scale of `{module}.weight`; it is {:?} of shape {:?}", info.dtype, info.shape)));
            }
            scales.insert(format!("{module}.weight"), value[0]);
        }
        let mut tensors = Vec::new();
        for (name, info) in metadata.tensors() {
            let hint = [".weight_scale", ".scale_weight", ".input_scale", ".scale_input"].iter().any(|s| name.ends_with(s));
            if hint {
                continue;
            }
            let kind = match info.dtype {
                Dtype::F8_E4M3 => Stored::Quantized(GgmlType::F8E4M3, scales.get(&name).copied().unwrap_or(1.0)),
                other => Stored::Float(other),
            };
            let (a, b) = info.data_offsets;
            tensors.push(Named { name, shape: info.shape.clone(), kind, range: start + a..start + b });
        }
        Self::from_renamed(path, map, component, tensors, "safetensors")
    }

    /// A store of one mapped file whose tensors are under BFL's names (a
    /// transformer) or llama.cpp's (a text encoder), brought to diffusers'
    /// and transformers': fused projections split by rows, the final
    /// modulation's halves swapped. Unknown names stay as they are.
    fn from_renamed(path: &Path, map: Mmap, component: &str, tensors: Vec<Named>, architecture: &str) -> Result<Self, LoadError> {
        let bad = |detail: String| LoadError::Safetensors { path: path.into(), detail };
        let mut store =
            Self { component: component.into(), shards: Vec::new(), entries: BTreeMap::new(), expanded: Vec::new(), df11_groups: Vec::new(), unread: Vec::new() };
        // A transformer is named as BFL's checkpoints, a text encoder as llama.cpp's.
        let text_encoder = component == "text_encoder";
        let targets_of = |name: &str| {
            if text_encoder {
                crate::model::llama_names::qwen3_tensor(name).map(|n| vec![(n, false)])
            } else {
                crate::model::bfl_names::bfl_tensor(name)
            }
        };
        let mut known = 0;
        for t in &tensors {
            let targets = targets_of(&t.name);
            known += usize::from(targets.is_some());
            let targets = targets.unwrap_or_else(|| vec![(t.name.clone(), false)]);
            // Whole rows (each whole blocks: the parser checked) are what splits and swaps move.
            let matrix = t.shape.len() > 1 && t.shape[0] > 0;
            let (rows, row_bytes) = if matrix { (t.shape[0], t.range.len() / t.shape[0]) } else { (1, t.range.len()) };
            let parts = targets.len();
            let swaps = targets.iter().any(|t| t.1);
            if (parts > 1 || swaps) && !matrix || !rows.is_multiple_of(parts) || swaps && !rows.is_multiple_of(2) {
                return Err(bad(format!("tensor `{}` of shape {:?} cannot be split into {parts} diffusers tensors by rows", t.name, t.shape)));
            }
            let part_rows = rows / parts;
            for (i, (name, swap)) in targets.into_iter().enumerate() {
                let start = t.range.start + i * part_rows * row_bytes;
                let end = start + part_rows * row_bytes;
                let mut shape = t.shape.clone();
                if matrix {
                    shape[0] = part_rows;
                }
                let half = part_rows / 2 * row_bytes;
                let pieces = if swap { vec![(start + half, end), (start, start + half)] } else { vec![(start, end)] };
                let entry = match t.kind {
                    Stored::Float(dtype) => {
                        let source = if swap {
                            store.expanded.push(pieces.iter().flat_map(|&(a, b)| map[a..b].iter().copied()).collect());
                            Source::Expanded(store.expanded.len() - 1)
                        } else {
                            Source::Shard { shard: 0, range: pieces[0] }
                        };
                        Entry { source, dtype, shape }
                    }
                    Stored::Quantized(ggml, scale) => Entry { source: Source::Quantized { shard: 0, pieces, ggml, scale }, dtype: Dtype::U8, shape },
                };
                if store.entries.insert(name.clone(), entry).is_some() {
                    return Err(bad(format!("`{name}` is given twice (by `{}` and another tensor)", t.name)));
                }
            }
        }
        if known == 0 {
            let kind = if text_encoder { "a Qwen3 text encoder's name as llama.cpp writes it" } else { "a FLUX.2 transformer's name" };
            return Err(bad(format!("none of its {} tensors has {kind} (architecture `{architecture}`): is it another model's file?", tensors.len())));
        }
        store.shards.push(Shard { path: path.into(), map, data_start: 0 });
        Ok(store)
    }
}

/// How a tensor of a renamed file is stored.
#[derive(Debug, Clone, Copy)]
enum Stored {
    Float(Dtype),
    /// GGML blocks, or FP8 with its scale.
    Quantized(GgmlType, f32),
}

/// A tensor of a file whose names are brought to diffusers': its byte range in the map.
struct Named {
    name: String,
    shape: Vec<usize>,
    kind: Stored,
    range: std::ops::Range<usize>,
}

fn map_file(path: &Path) -> Result<Mmap, LoadError> {
    let file = File::open(path).map_err(|source| LoadError::Io { path: path.into(), source })?;
    // SAFETY: the map is read-only and model files are not modified while a run holds them.
    unsafe { Mmap::map(&file) }.map_err(|source| LoadError::Io { path: path.into(), source })
}

