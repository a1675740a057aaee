//! One component's weights: its safetensors files (single or sharded with an
//! `*.safetensors.index.json`), memory-mapped, with tensors found by name and
//! checked against what the architecture expects.

use crate::config_json::JsonFile;
use crate::error::LoadError;
use flux_lite_core::tensors::{Kind, TensorSpec};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

/// A tensor inside a mapped file.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

/// Appends little-endian `bytes` of a bf16, f16 or f32 tensor to `out` as
/// f32 (exact for all three). Returns false, appending nothing, for any other dtype.
pub fn widen_to_f32(dtype: Dtype, bytes: &[u8], out: &mut Vec<f32>) -> bool {
    match dtype {
        Dtype::BF16 => out.extend(bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())),
        Dtype::F16 => out.extend(bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())),
        Dtype::F32 => out.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        _ => return false,
    }
    true
}

#[derive(Debug)]
struct Shard {
    path: PathBuf,
    map: Mmap,
    /// Where tensor data starts (after the 8-byte length and the JSON header).
    data_start: usize,
}

#[derive(Debug)]
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range inside the shard's data section.
    range: (usize, usize),
}

/// The weights of one component folder (`transformer/`, `text_encoder/`, `vae/`).
#[derive(Debug)]
pub struct WeightStore {
    pub component: String,
    shards: Vec<Shard>,
    entries: BTreeMap<String, Entry>,
}

impl WeightStore {
    pub fn open(dir: &Path, component: &str) -> Result<Self, LoadError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| LoadError::Io { path, source }
        };
        let listing = std::fs::read_dir(dir).map_err(io(dir))?;
        let mut singles = Vec::new();
        let mut index = None;
        for entry in listing {
            let name = entry.map_err(io(dir))?.file_name().to_string_lossy().into_owned();
            if name.ends_with(".safetensors.index.json") {
                index = Some(dir.join(&name));
            } else if name.ends_with(".safetensors") {
                singles.push(dir.join(&name));
            }
        }
        let (files, weight_map) = match index {
            Some(index_path) => {
                let (files, map) = read_index(&index_path)?;
                (files.into_iter().map(|f| dir.join(f)).collect::<Vec<_>>(), Some((index_path, map)))
            }
            None => {
                singles.sort();
                (singles, None)
            }
        };
        if files.is_empty() {
            return Err(LoadError::Io {
                path: dir.into(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no .safetensors files"),
            });
        }
        let mut store = Self { component: component.into(), shards: Vec::new(), entries: BTreeMap::new() };
        for path in files {
            store.add_shard(path)?;
        }
        if let Some((index_path, map)) = weight_map {
            for (name, file) in map {
                let found = store.entries.get(&name).map(|e| &store.shards[e.shard].path);
                if found.and_then(|p| p.file_name()).map(|f| f.to_string_lossy()) != Some(file.as_str().into()) {
                    return Err(LoadError::Safetensors {
                        path: index_path,
                        detail: format!("the index places `{name}` in {file}, but that file does not hold it"),
                    });
                }
            }
        }
        Ok(store)
    }

    fn add_shard(&mut self, path: PathBuf) -> Result<(), LoadError> {
        let file = File::open(&path).map_err(|source| LoadError::Io { path: path.clone(), source })?;
        // SAFETY: the map is read-only and model files are not modified while a run holds them.
        let map = unsafe { Mmap::map(&file) }.map_err(|source| LoadError::Io { path: path.clone(), source })?;
        let bad = |detail: String| LoadError::Safetensors { path: path.clone(), detail };
        let (header_len, metadata) = SafeTensors::read_metadata(&map).map_err(|e| bad(format!("invalid safetensors: {e}")))?;
        let shard = self.shards.len();
        for (name, info) in metadata.tensors() {
            if self.entries.contains_key(&name) {
                return Err(bad(format!("tensor `{name}` appears in more than one file")));
            }
            self.entries.insert(
                name,
                Entry { shard, dtype: info.dtype, shape: info.shape.clone(), range: info.data_offsets },
            );
        }
        self.shards.push(Shard { path, map, data_start: 8 + header_len });
        Ok(())
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    pub fn tensor(&self, name: &str) -> Result<TensorRef<'_>, LoadError> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor { component: self.component.clone(), name: name.into() })?;
        let shard = &self.shards[e.shard];
        Ok(TensorRef {
            dtype: e.dtype,
            shape: &e.shape,
            bytes: &shard.map[shard.data_start + e.range.0..shard.data_start + e.range.1],
        })
    }

    /// Checks that the files hold exactly the expected tensors, each with its
    /// shape and a usable dtype.
    pub fn check(&self, expected: &[TensorSpec]) -> Result<(), LoadError> {
        let mut wanted: HashMap<&str, &TensorSpec> = HashMap::new();
        for spec in expected {
            wanted.insert(spec.name.as_str(), spec);
            let t = self.tensor(&spec.name)?;
            let dtype_ok = match spec.kind {
                Kind::Float => matches!(t.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32),
                Kind::Int => matches!(t.dtype, Dtype::I64 | Dtype::I32),
            };
            if !dtype_ok || t.shape != spec.shape.as_slice() {
                let kind = if spec.kind == Kind::Float { "a float tensor" } else { "an integer tensor" };
                return Err(LoadError::WrongTensor {
                    component: self.component.clone(),
                    name: spec.name.to_string(),
                    expected: format!("{kind} of shape {:?}", spec.shape.as_slice()),
                    found: format!("{:?} of shape {:?}", t.dtype, t.shape),
                });
            }
        }
        if let Some(extra) = self.names().find(|n| !wanted.contains_key(n)) {
            return Err(LoadError::UnexpectedTensor { component: self.component.clone(), name: extra.into() });
        }
        Ok(())
    }

    /// Total bytes of tensor data.
    pub fn data_bytes(&self) -> u64 {
        self.entries.values().map(|e| (e.range.1 - e.range.0) as u64).sum()
    }
}

/// The shard files and the tensor → file map of an index file.
fn read_index(path: &Path) -> Result<(Vec<String>, BTreeMap<String, String>), LoadError> {
    let json = JsonFile::read(path)?;
    let bad = |detail: &str| LoadError::Safetensors { path: path.into(), detail: detail.into() };
    let map = json.value.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| bad("no `weight_map` object"))?;
    let mut weight_map = BTreeMap::new();
    let mut files = Vec::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| bad("a `weight_map` entry is not a file name"))?;
        if file.contains('/') || file.contains('\\') || file == ".." || !file.ends_with(".safetensors") {
            return Err(bad(&format!("`weight_map` names {file:?}, which is not a .safetensors file in this folder")));
        }
        if !files.iter().any(|f| f == file) {
            files.push(file.to_string());
        }
        weight_map.insert(name.clone(), file.to_string());
    }
    files.sort();
    Ok((files, weight_map))
}
