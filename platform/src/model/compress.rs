//! A model folder rewritten with DF11 weights (`flux-lite compress`). Each
//! compressed component gets one `model.safetensors` as the official
//! `compress_model(save_single_file=True)` writes it (each group's six tensors
//! under its module path, every other tensor unchanged) and its own
//! `config.json` with `dfloat11_config` added, so the official loader and
//! [`WeightStore`](crate::model::safetensors_store::WeightStore) both read it. Every
//! other file is hard-linked (or copied). The folder is built under a hidden
//! temporary name beside the output and renamed when complete.

use crate::model::config_json::JsonFile;
use crate::model::df11::{self, Df11Config};
use crate::error::{CompressError, LoadError};
use crate::model::{Component, ModelFolder};
use crate::output;
use flux_lite_core::df11::{layout, Df11Field, Df11GroupBuf};
use rayon::prelude::*;
use safetensors::tensor::Dtype;
use std::borrow::Cow;
use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The one weights file of a compressed component, named as the official compressor names it.
pub const WEIGHTS_FILE: &str = "model.safetensors";

/// The `dfloat11_config` a component is compressed with; `None` for the VAE,
/// which has no DF11 layout.
pub fn df11_config(component: Component) -> Option<Df11Config> {
    let groups = match component {
        Component::Transformer => layout::TRANSFORMER_GROUPS,
        Component::TextEncoder => layout::TEXT_ENCODER_GROUPS,
        Component::Vae => return None,
    };
    let keys: Vec<String> = groups.iter().map(|g| g.regex()).collect();
    let patterns: Vec<(&str, &[&str])> = keys.iter().zip(groups).map(|(k, g)| (k.as_str(), g.linears)).collect();
    Some(Df11Config::new(&patterns).expect("the built-in patterns are valid regexes"))
}

/// Groups encoded so far in the component being compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub component: Component,
    pub done: usize,
    pub total: usize,
}

/// What compressing one component did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComponentSizes {
    pub component: Component,
    pub groups: usize,
    /// bf16 bytes of the weights now in DF11 groups.
    pub weights_bf16: u64,
    /// Bytes of those groups' six tensors.
    pub weights_df11: u64,
    /// Tensor data of the whole component, before and after.
    pub total_before: u64,
    pub total_after: u64,
}

/// Writes `model` to the new folder `output` with `components` in DF11 and
/// everything else as it was. Refuses an `output` that exists; on any error
/// nothing is left under `output` (nor beside it).
pub fn compress_model(
    model: &ModelFolder,
    output: &Path,
    components: &[Component],
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<Vec<ComponentSizes>, CompressError> {
    if let Some(c) = components.iter().find(|&&c| df11_config(c).is_none()) {
        return Err(CompressError::NotCompressible(c.dir()));
    }
    let temp = temp_dir_for(model, output)?;
    let _ = fs::remove_dir_all(&temp); // left by a killed run that had our process id
    fs::create_dir(&temp).map_err(|e| write_error(&temp, e))?;
    let result = build(model, &temp, components, progress).and_then(|sizes| {
        // A rename onto an empty folder would succeed: look again.
        if output.symlink_metadata().is_ok() {
            return Err(CompressError::OutputExists(output.into()));
        }
        fs::rename(&temp, output).map_err(|e| write_error(output, e))?;
        Ok(sizes)
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&temp);
    }
    result
}

/// The hidden folder `output` is built in: beside it, so the final rename stays on one file system.
fn temp_dir_for(model: &ModelFolder, output: &Path) -> Result<PathBuf, CompressError> {
    if output.symlink_metadata().is_ok() {
        return Err(CompressError::OutputExists(output.into()));
    }
    let flag = |problem: String| CompressError::OutputFolder { path: output.into(), problem };
    let name = output.file_name().ok_or_else(|| flag("not a folder name".into()))?;
    let parent = output.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let parent_abs = fs::canonicalize(parent).map_err(|e| flag(format!("{}: {e}", parent.display())))?;
    let root = fs::canonicalize(&model.root).map_err(|source| LoadError::Io { path: model.root.clone(), source })?;
    if parent_abs.starts_with(&root) {
        return Err(CompressError::OutputInsideModel { output: output.into(), model: model.root.clone() });
    }
    Ok(parent.join(format!(".{}.partial-{}", name.to_string_lossy(), std::process::id())))
}

fn build(
    model: &ModelFolder,
    dir: &Path,
    components: &[Component],
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<Vec<ComponentSizes>, CompressError> {
    // `.cache` is huggingface_hub's record of the files it downloaded, which this folder no longer holds.
    let replaced = |name: &str| name == ".cache" || components.iter().any(|c| c.dir() == name);
    link_entries(&model.root, dir, &|name| !replaced(name))?;
    components.iter().map(|&c| compress_component(model, c, &dir.join(c.dir()), progress)).collect()
}

fn compress_component(
    model: &ModelFolder,
    component: Component,
    dir: &Path,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<ComponentSizes, CompressError> {
    let config = df11_config(component).ok_or(CompressError::NotCompressible(component.dir()))?;
    let name = component.dir();
    let source = model.component_dir(name);
    let mut store = model.weights(component)?;
    // A component already compressed is compressed again from its bf16 weights.
    store.expand_df11_on_host()?;
    fs::create_dir(dir).map_err(|e| write_error(dir, e))?;
    // What the component holds besides its config and weights (e.g. generation_config.json).
    let is_weights = |f: &str| f.ends_with(".safetensors") || f.ends_with(".safetensors.index.json");
    link_entries(&source, dir, &|f| f != "config.json" && !is_weights(f))?;

    let mut groups = Vec::new();
    for module in config.modules_in(store.names()) {
        let weights = config.weights_of(&module).unwrap_or_default();
        for w in &weights {
            let t = store.tensor(w)?;
            if t.dtype != Dtype::BF16 {
                return Err(CompressError::NotBf16 { component: name, name: w.clone(), dtype: format!("{:?}", t.dtype) });
            }
        }
        groups.push((module, weights));
    }

    let total = groups.len();
    progress(Progress { component, done: 0, total });
    let reporter = Mutex::new((0usize, progress));
    let encoded = groups
        .par_iter()
        .map(|(module, weights)| {
            let words = weights.iter().map(|w| Ok(bf16_words(store.tensor(w)?.bytes))).collect::<Result<Vec<_>, LoadError>>()?;
            let slices: Vec<&[u16]> = words.iter().map(|w| w.as_ref()).collect();
            let group = Df11GroupBuf::encode(&slices)
                .map_err(|e| CompressError::Encode { component: name, module: module.clone(), detail: e.to_string() })?;
            if let Ok(mut guard) = reporter.lock() {
                let (done, report) = &mut *guard;
                *done += 1;
                report(Progress { component, done: *done, total });
            }
            Ok(group)
        })
        .collect::<Result<Vec<_>, CompressError>>()?;

    let compressed: HashSet<&str> = groups.iter().flat_map(|(_, w)| w.iter().map(String::as_str)).collect();
    let mut tensors = Vec::new();
    let mut weights_bf16 = 0;
    for tensor in store.names() {
        let t = store.tensor(tensor)?;
        if compressed.contains(tensor) {
            weights_bf16 += t.bytes.len() as u64;
        } else {
            tensors.push((tensor.to_string(), t.dtype, t.shape.to_vec(), t.bytes));
        }
    }
    for ((module, _), group) in groups.iter().zip(&encoded) {
        for field in Df11Field::ALL {
            let bytes = group.fields().get(field);
            let shape = match field {
                Df11Field::Luts => vec![bytes.len() / 256, 256],
                Df11Field::SplitPositions => vec![bytes.len() / 8],
                _ => vec![bytes.len()],
            };
            tensors.push((format!("{module}.{field}"), df11::field_dtype(field), shape, bytes));
        }
    }
    output::write_tensors(&dir.join(WEIGHTS_FILE), tensors, &[]).map_err(CompressError::Write)?;

    // The diffusers/transformers config, every field kept, with the DF11 layout added.
    let mut json = JsonFile::read(&source.join("config.json"))?;
    json.value["dfloat11_config"] = config.to_json();
    let text = serde_json::to_string_pretty(&json.value).map_err(|e| CompressError::Write(e.to_string()))? + "\n";
    output::write_atomically(&dir.join("config.json"), text.as_bytes()).map_err(CompressError::Write)?;

    let weights_df11 = encoded.iter().map(|g| g.total_bytes() as u64).sum::<u64>();
    let total_before = store.data_bytes();
    Ok(ComponentSizes {
        component,
        groups: total,
        weights_bf16,
        weights_df11,
        total_before,
        total_after: total_before - weights_bf16 + weights_df11,
    })
}

/// A tensor's little-endian bf16 words, borrowed from the file when aligned.
fn bf16_words(bytes: &[u8]) -> Cow<'_, [u16]> {
    match bytemuck::try_cast_slice(bytes) {
        Ok(words) if cfg!(target_endian = "little") => Cow::Borrowed(words),
        _ => Cow::Owned(bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()),
    }
}

/// Links (or copies) the entries of `from` whose names `keep` accepts into `to`, folders recursively.
fn link_entries(from: &Path, to: &Path, keep: &dyn Fn(&str) -> bool) -> Result<(), CompressError> {
    let read = |source| CompressError::Load(LoadError::Io { path: from.into(), source });
    for entry in fs::read_dir(from).map_err(read)? {
        let entry = entry.map_err(read)?;
        let name = entry.file_name();
        if !keep(&name.to_string_lossy()) {
            continue;
        }
        let (src, dst) = (entry.path(), to.join(&name));
        // Follows symlinks: a Hugging Face cache snapshot is made of links into its blob store.
        let meta = fs::metadata(&src).map_err(|source| LoadError::Io { path: src.clone(), source })?;
        if meta.is_dir() {
            fs::create_dir(&dst).map_err(|e| write_error(&dst, e))?;
            link_entries(&src, &dst, &|_| true)?;
        } else {
            link_or_copy(&src, &dst)?;
        }
    }
    Ok(())
}

/// A hard link to the file `src` resolves to, or a copy where links are not possible
/// (another file system).
fn link_or_copy(src: &Path, dst: &Path) -> Result<(), CompressError> {
    let real = fs::canonicalize(src).map_err(|source| LoadError::Io { path: src.into(), source })?;
    if fs::hard_link(&real, dst).is_err() {
        fs::copy(&real, dst).map_err(|e| CompressError::Write(format!("copying {} to {}: {e}", src.display(), dst.display())))?;
    }
    Ok(())
}

fn write_error(path: &Path, e: std::io::Error) -> CompressError {
    CompressError::Write(format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_follow_the_pattern_order_then_the_model_order() {
        let config = df11_config(Component::Transformer).unwrap();
        let names = [
            "single_transformer_blocks.10.attn.to_out.weight",
            "single_transformer_blocks.2.attn.to_out.weight",
            "norm_out.linear.weight",
            "transformer_blocks.1.attn.to_q.weight",
            "transformer_blocks.0.attn.to_q.weight",
            "context_embedder.weight",
            "x_embedder.weight",
        ];
        assert_eq!(
            config.modules_in(names),
            [
                "transformer_blocks.0",
                "transformer_blocks.1",
                "single_transformer_blocks.2",
                "single_transformer_blocks.10",
                "context_embedder",
                "norm_out.linear"
            ]
        );
        let te = df11_config(Component::TextEncoder).unwrap();
        assert_eq!(te.modules_in(["model.embed_tokens.weight", "model.layers.3.mlp.up_proj.weight"]), ["model.layers.3"]);
        assert!(df11_config(Component::Vae).is_none());
    }
}
