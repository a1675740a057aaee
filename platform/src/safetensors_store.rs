//! One component's weights: its safetensors files (single or sharded with an
//! `*.safetensors.index.json`), memory-mapped, with tensors found by name and
//! checked against what the architecture expects.

use crate::config_json::JsonFile;
use crate::df11::{self, Df11Config};
use crate::error::LoadError;
use flux_lite_core::df11::{Df11Field, Df11Fields, Df11Group};
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

/// Where a tensor's bytes are: a byte range of a shard's data section, or a
/// buffer expanded from DF11 at open.
#[derive(Debug, Clone, Copy)]
enum Source {
    Shard { shard: usize, range: (usize, usize) },
    Expanded(usize),
}

#[derive(Debug)]
struct Entry {
    source: Source,
    dtype: Dtype,
    shape: Vec<usize>,
}

/// A DF11 group found in a component: its module path, the weights it held
/// (now expanded), and its compressed size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Df11GroupInfo {
    pub module: String,
    pub weights: Vec<String>,
    pub elements: u64,
    pub compressed_bytes: u64,
}

/// The weights of one component folder (`transformer/`, `text_encoder/`, `vae/`).
#[derive(Debug)]
pub struct WeightStore {
    pub component: String,
    shards: Vec<Shard>,
    entries: BTreeMap<String, Entry>,
    /// bf16 bytes of the weights expanded from DF11 groups.
    expanded: Vec<Vec<u8>>,
    df11_groups: Vec<Df11GroupInfo>,
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
        let mut store =
            Self { component: component.into(), shards: Vec::new(), entries: BTreeMap::new(), expanded: Vec::new(), df11_groups: Vec::new() };
        for path in files {
            store.add_shard(path)?;
        }
        if let Some((index_path, map)) = weight_map {
            for (name, file) in map {
                let found = match store.entries.get(&name).map(|e| e.source) {
                    Some(Source::Shard { shard, .. }) => Some(&store.shards[shard].path),
                    _ => None,
                };
                if found.and_then(|p| p.file_name()).map(|f| f.to_string_lossy()) != Some(file.as_str().into()) {
                    return Err(LoadError::Safetensors {
                        path: index_path,
                        detail: format!("the index places `{name}` in {file}, but that file does not hold it"),
                    });
                }
            }
        }
        let config = dir.join("config.json");
        if config.is_file() {
            if let Some(df11) = Df11Config::read(&JsonFile::read(&config)?)? {
                store.expand_df11(&df11, dir)?;
            }
        }
        Ok(store)
    }

    /// Replaces every DF11 group's six tensors with the bf16 weights they encode.
    fn expand_df11(&mut self, config: &Df11Config, dir: &Path) -> Result<(), LoadError> {
        let suffix = format!(".{}", Df11Field::EncodedExponent.name());
        let modules: Vec<String> = self.entries.keys().filter_map(|n| n.strip_suffix(&suffix)).map(String::from).collect();
        for module in modules {
            let bad = |detail: String| LoadError::Safetensors { path: dir.into(), detail: format!("DF11 group `{module}`: {detail}") };
            let field = |f: Df11Field| -> Result<&[u8], LoadError> {
                let name = format!("{module}.{}", f.name());
                let t = self.tensor(&name)?;
                let want = df11::field_dtype(f);
                if t.dtype != want {
                    return Err(bad(format!("`{name}` is {:?}, expected {want:?}", t.dtype)));
                }
                Ok(t.bytes)
            };
            let fields = Df11Fields {
                luts: field(Df11Field::Luts)?,
                encoded_exponent: field(Df11Field::EncodedExponent)?,
                sign_mantissa: field(Df11Field::SignMantissa)?,
                output_positions: field(Df11Field::OutputPositions)?,
                gaps: field(Df11Field::Gaps)?,
                split_positions: field(Df11Field::SplitPositions)?,
            };
            let group = Df11Group::new(fields).map_err(|e| bad(e.to_string()))?;
            let weights = config.weights_of(&module).ok_or_else(|| bad("no pattern of dfloat11_config matches it".into()))?;
            let ranges: Vec<std::ops::Range<usize>> = group.weight_ranges().collect();
            if ranges.len() != weights.len() {
                return Err(bad(format!("it holds {} weights, its pattern lists {}", ranges.len(), weights.len())));
            }
            let mut words = vec![0u16; group.n_elements()];
            df11::expand_on_host(&group, &mut words).map_err(|e| bad(e.to_string()))?;
            let info = Df11GroupInfo {
                module: module.clone(),
                weights: weights.clone(),
                elements: group.n_elements() as u64,
                compressed_bytes: fields.total_bytes() as u64,
            };
            for (name, range) in weights.into_iter().zip(ranges) {
                if self.entries.contains_key(&name) {
                    return Err(bad(format!("`{name}` is stored both plain and compressed")));
                }
                let bytes: Vec<u8> = words[range.clone()].iter().flat_map(|w| w.to_le_bytes()).collect();
                self.expanded.push(bytes);
                // The flat shape becomes the expected one in `check`.
                let entry = Entry { source: Source::Expanded(self.expanded.len() - 1), dtype: Dtype::BF16, shape: vec![range.len()] };
                self.entries.insert(name, entry);
            }
            for f in Df11Field::ALL {
                self.entries.remove(&format!("{module}.{}", f.name()));
            }
            self.df11_groups.push(info);
        }
        Ok(())
    }

    /// The DF11 groups this component was stored in (empty for plain weights).
    pub fn df11_groups(&self) -> &[Df11GroupInfo] {
        &self.df11_groups
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
            let source = Source::Shard { shard, range: info.data_offsets };
            self.entries.insert(name, Entry { source, dtype: info.dtype, shape: info.shape.clone() });
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
        let bytes = match e.source {
            Source::Shard { shard, range } => {
                let shard = &self.shards[shard];
                &shard.map[shard.data_start + range.0..shard.data_start + range.1]
            }
            Source::Expanded(i) => &self.expanded[i],
        };
        Ok(TensorRef { dtype: e.dtype, shape: &e.shape, bytes })
    }

    /// Checks that the files hold exactly the expected tensors, each with its
    /// shape and a usable dtype.
    pub fn check(&mut self, expected: &[TensorSpec]) -> Result<(), LoadError> {
        let mut wanted: HashMap<&str, &TensorSpec> = HashMap::new();
        for spec in expected {
            // A weight expanded from DF11 is flat until it meets its architecture.
            if let Some(e) = self.entries.get_mut(spec.name.as_str()) {
                let n: usize = spec.shape.iter().product();
                if matches!(e.source, Source::Expanded(_)) && e.shape == [n] {
                    e.shape = spec.shape.to_vec();
                }
            }
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
        self.entries
            .values()
            .map(|e| match e.source {
                Source::Shard { range, .. } => (range.1 - range.0) as u64,
                Source::Expanded(i) => self.expanded[i].len() as u64,
            })
            .sum()
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
