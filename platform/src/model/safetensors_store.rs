//! One component's weights: its safetensors files (single or sharded with an
//! `*.safetensors.index.json`), memory-mapped, with tensors found by name and
//! checked against what the architecture expects.

use crate::model::config_json::JsonFile;
use crate::model::df11::{self, Df11Config};
use crate::error::LoadError;
use flux_lite_core::df11::{Df11Field, Df11Fields, Df11Group};
use flux_lite_core::ggml::GgmlType;
use flux_lite_core::models::tensors::{Kind, TensorSpec};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

mod renamed;

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

/// Where a tensor's bytes are: a byte range of a shard's data section, a
/// range of elements of a DF11 group still compressed, or a buffer expanded
/// from DF11 on the host.
#[derive(Debug, Clone)]
enum Source {
    Shard { shard: usize, range: (usize, usize) },
    Df11 { group: usize, elements: std::ops::Range<usize> },
    Expanded(usize),
    /// GGML blocks of a GGUF file: byte ranges of the shard (its map, from
    /// byte 0), in order (two for rows whose halves swap).
    Quantized { shard: usize, pieces: Vec<(usize, usize)>, ggml: GgmlType, scale: f32 },
}

/// A tensor still in GGML blocks: its pieces in order, whole rows each.
#[derive(Debug, Clone)]
pub struct QuantizedRef<'a> {
    pub ggml: GgmlType,
    /// FP8's per-tensor scale (1 for GGML blocks, which carry their own).
    pub scale: f32,
    pub shape: &'a [usize],
    pub pieces: Vec<&'a [u8]>,
}

impl<'a> QuantizedRef<'a> {
    pub fn bytes(&self) -> usize {
        self.pieces.iter().map(|p| p.len()).sum()
    }

    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The blocks laid end to end: borrowed where they lie in one piece,
    /// else joined on the host (only a tensor whose halves swap has two).
    pub fn joined(&self) -> std::borrow::Cow<'a, [u8]> {
        match self.pieces.as_slice() {
            [one] => std::borrow::Cow::Borrowed(one),
            pieces => std::borrow::Cow::Owned(pieces.concat()),
        }
    }
}

#[derive(Debug)]
struct Entry {
    source: Source,
    dtype: Dtype,
    shape: Vec<usize>,
}

/// A DF11 group found in a component: its module path, the weights it
/// holds in concatenation order, and its compressed size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Df11GroupInfo {
    pub module: String,
    pub weights: Vec<String>,
    pub elements: u64,
    pub compressed_bytes: u64,
}

/// A DF11 group as stored: where its six fields lie in the shards, and
/// whether it has been expanded on the host.
#[derive(Debug)]
struct StoredGroup {
    info: Df11GroupInfo,
    /// `(shard, byte range)` of each field, in [`Df11Field::ALL`] order.
    fields: Vec<(usize, (usize, usize))>,
    expanded: bool,
}

/// The weights of one component folder (`transformer/`, `text_encoder/`, `vae/`).
#[derive(Debug)]
pub struct WeightStore {
    pub component: String,
    shards: Vec<Shard>,
    entries: BTreeMap<String, Entry>,
    /// bf16 bytes of the weights expanded from DF11 groups on the host.
    expanded: Vec<Vec<u8>>,
    df11_groups: Vec<StoredGroup>,
    /// Tensors in the files that the architecture does not read (after [`Self::check`]).
    unread: Vec<String>,
}

/// A file a component's weights are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFile {
    /// `*.safetensors`: tensors.
    Tensors,
    /// `*.safetensors.index.json`: which shard holds each tensor.
    Index,
    /// `*.gguf`: a whole component in GGUF (BFL's names for a transformer).
    Gguf,
}

/// Which kind of weight file `name` is, if any.
pub fn weight_file_kind(name: &str) -> Option<WeightFile> {
    if name.ends_with(".safetensors.index.json") {
        Some(WeightFile::Index)
    } else if name.ends_with(".safetensors") {
        Some(WeightFile::Tensors)
    } else if name.ends_with(".gguf") {
        Some(WeightFile::Gguf)
    } else {
        None
    }
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
        let mut ggufs = Vec::new();
        for entry in listing {
            let name = entry.map_err(io(dir))?.file_name().to_string_lossy().into_owned();
            match weight_file_kind(&name) {
                Some(WeightFile::Index) => index = Some(dir.join(&name)),
                Some(WeightFile::Tensors) => singles.push(dir.join(&name)),
                Some(WeightFile::Gguf) => ggufs.push(dir.join(&name)),
                None => {}
            }
        }
        if singles.is_empty() && index.is_none() {
            match ggufs.as_slice() {
                [one] => return Self::open_gguf(one, component),
                [] => {}
                _ => {
                    return Err(LoadError::Io {
                        path: dir.into(),
                        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "more than one .gguf file: give one with --transformer"),
                    })
                }
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
            Self { component: component.into(), shards: Vec::new(), entries: BTreeMap::new(), expanded: Vec::new(), df11_groups: Vec::new(), unread: Vec::new() };
        for path in files {
            store.add_shard(path)?;
        }
        if let Some((index_path, map)) = weight_map {
            for (name, file) in map {
                let found = match store.entries.get(&name).map(|e| &e.source) {
                    Some(Source::Shard { shard, .. }) => Some(&store.shards[*shard].path),
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
                store.find_df11_groups(&df11, dir)?;
            }
        }
        Ok(store)
    }

    /// Replaces every DF11 group's six tensors with entries for the bf16
    /// weights it encodes, checking the group's invariants; the weights stay
    /// compressed until the device or [`Self::expand_df11_on_host`] expands them.
    fn find_df11_groups(&mut self, config: &Df11Config, dir: &Path) -> Result<(), LoadError> {
        let suffix = format!(".{}", Df11Field::EncodedExponent.name());
        let modules: Vec<String> = self.entries.keys().filter_map(|n| n.strip_suffix(&suffix)).map(String::from).collect();
        for module in modules {
            let bad = |detail: String| LoadError::Safetensors { path: dir.into(), detail: format!("DF11 group `{module}`: {detail}") };
            let mut fields = Vec::with_capacity(Df11Field::ALL.len());
            for f in Df11Field::ALL {
                let name = format!("{module}.{}", f.name());
                let e = self.entries.get(&name).ok_or_else(|| bad(format!("`{name}` is missing")))?;
                let want = df11::field_dtype(f);
                if e.dtype != want {
                    return Err(bad(format!("`{name}` is {:?}, expected {want:?}", e.dtype)));
                }
                match e.source {
                    Source::Shard { shard, range } => fields.push((shard, range)),
                    _ => return Err(bad(format!("`{name}` is not stored in a file"))),
                }
            }
            let group = self.group_view(&fields).map_err(|e| bad(e.to_string()))?;
            let weights = config.weights_of(&module).ok_or_else(|| bad("no pattern of dfloat11_config matches it".into()))?;
            let ranges: Vec<std::ops::Range<usize>> = group.weight_ranges().collect();
            if ranges.len() != weights.len() {
                return Err(bad(format!("it holds {} weights, its pattern lists {}", ranges.len(), weights.len())));
            }
            let info = Df11GroupInfo {
                module: module.clone(),
                weights: weights.clone(),
                elements: group.n_elements() as u64,
                compressed_bytes: group.fields().total_bytes() as u64,
            };
            let index = self.df11_groups.len();
            for (name, elements) in weights.into_iter().zip(ranges) {
                if self.entries.contains_key(&name) {
                    return Err(bad(format!("`{name}` is stored both plain and compressed")));
                }
                // The flat shape becomes the expected one in `check`.
                let shape = vec![elements.len()];
                self.entries.insert(name, Entry { source: Source::Df11 { group: index, elements }, dtype: Dtype::BF16, shape });
            }
            for f in Df11Field::ALL {
                self.entries.remove(&format!("{module}.{}", f.name()));
            }
            self.df11_groups.push(StoredGroup { info, fields, expanded: false });
        }
        Ok(())
    }

    fn group_view(&self, fields: &[(usize, (usize, usize))]) -> Result<Df11Group<'_>, flux_lite_core::df11::Df11Error> {
        let bytes = |f: Df11Field| {
            let (shard, (a, b)) = fields[Df11Field::ALL.iter().position(|&x| x == f).unwrap_or(0)];
            let shard = &self.shards[shard];
            &shard.map[shard.data_start + a..shard.data_start + b]
        };
        Df11Group::new(Df11Fields {
            luts: bytes(Df11Field::Luts),
            encoded_exponent: bytes(Df11Field::EncodedExponent),
            sign_mantissa: bytes(Df11Field::SignMantissa),
            output_positions: bytes(Df11Field::OutputPositions),
            gaps: bytes(Df11Field::Gaps),
            split_positions: bytes(Df11Field::SplitPositions),
        })
    }

    /// The DF11 groups this component was stored in (empty for plain weights).
    pub fn df11_groups(&self) -> impl ExactSizeIterator<Item = &Df11GroupInfo> {
        self.df11_groups.iter().map(|g| &g.info)
    }

    /// The compressed group `index` (of [`Self::df11_groups`]), unless it was expanded on the host.
    pub fn df11_group(&self, index: usize) -> Option<Df11Group<'_>> {
        let g = self.df11_groups.get(index).filter(|g| !g.expanded)?;
        // The invariants were checked when the store was opened.
        self.group_view(&g.fields).ok()
    }

    /// Where a weight still compressed lies: its group and its elements in the group's output.
    pub fn df11_location(&self, name: &str) -> Option<(usize, std::ops::Range<usize>)> {
        match &self.entries.get(name)?.source {
            Source::Df11 { group, elements } => Some((*group, elements.clone())),
            _ => None,
        }
    }

    /// Expands every DF11 group still compressed on the host (rayon over
    /// its 4 KiB blocks), so [`Self::tensor`] serves its weights as bf16 bytes.
    pub fn expand_df11_on_host(&mut self) -> Result<(), LoadError> {
        for index in 0..self.df11_groups.len() {
            self.expand_group_on_host(index)?;
        }
        Ok(())
    }

    /// Expands on the host the group holding `name`, if it is compressed.
    pub fn expand_df11_holding(&mut self, name: &str) -> Result<(), LoadError> {
        match self.df11_location(name) {
            Some((group, _)) => self.expand_group_on_host(group),
            None => Ok(()),
        }
    }

    fn expand_group_on_host(&mut self, index: usize) -> Result<(), LoadError> {
        let Some(group) = self.df11_group(index) else {
            return Ok(());
        };
        let stored = &self.df11_groups[index];
        let bad = |detail: String| LoadError::Safetensors {
            path: self.shards[stored.fields[0].0].path.clone(),
            detail: format!("DF11 group `{}`: {detail}", stored.info.module),
        };
        let mut words = vec![0u16; group.n_elements()];
        df11::expand_on_host(&group, &mut words).map_err(|e| bad(e.to_string()))?;
        let names = stored.info.weights.clone();
        for name in names {
            let Some(entry) = self.entries.get_mut(&name) else { continue };
            if let Source::Df11 { elements, .. } = &entry.source {
                let bytes: Vec<u8> = words[elements.clone()].iter().flat_map(|w| w.to_le_bytes()).collect();
                self.expanded.push(bytes);
                entry.source = Source::Expanded(self.expanded.len() - 1);
            }
        }
        self.df11_groups[index].expanded = true;
        Ok(())
    }

    /// The tensors of one plain safetensors file, as stored.
    pub fn open_file(path: &Path, component: &str) -> Result<Self, LoadError> {
        let mut store =
            Self { component: component.into(), shards: Vec::new(), entries: BTreeMap::new(), expanded: Vec::new(), df11_groups: Vec::new(), unread: Vec::new() };
        store.add_shard(path.to_path_buf())?;
        Ok(store)
    }

    /// Each tensor's name and shape, as stored.
    pub fn shapes(&self) -> impl Iterator<Item = (&str, &[usize])> + Clone {
        self.entries.iter().map(|(n, e)| (n.as_str(), e.shape.as_slice()))
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

    /// A tensor still in GGML blocks, if `name` is one.
    pub fn quantized(&self, name: &str) -> Option<QuantizedRef<'_>> {
        let e = self.entries.get(name)?;
        let Source::Quantized { shard, pieces, ggml, scale } = &e.source else { return None };
        let map = &self.shards[*shard].map;
        Some(QuantizedRef { ggml: *ggml, scale: *scale, shape: &e.shape, pieces: pieces.iter().map(|&(a, b)| &map[a..b]).collect() })
    }

    /// The GGML types of the tensors still in blocks, with their counts (for `info`).
    pub fn quantized_types(&self) -> BTreeMap<&'static str, usize> {
        let mut types = BTreeMap::new();
        for e in self.entries.values() {
            if let Source::Quantized { ggml, .. } = e.source {
                *types.entry(ggml.name()).or_insert(0) += 1;
            }
        }
        types
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    pub fn tensor(&self, name: &str) -> Result<TensorRef<'_>, LoadError> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor { component: self.component.clone(), name: name.into() })?;
        let bytes = match &e.source {
            Source::Shard { shard, range } => {
                let shard = &self.shards[*shard];
                &shard.map[shard.data_start + range.0..shard.data_start + range.1]
            }
            Source::Expanded(i) => &self.expanded[*i],
            Source::Df11 { group, .. } => {
                return Err(LoadError::WrongTensor {
                    component: self.component.clone(),
                    name: name.into(),
                    expected: "bf16 bytes".into(),
                    found: format!("still compressed in DF11 group `{}`", self.df11_groups[*group].info.module),
                })
            }
            Source::Quantized { ggml, .. } => {
                return Err(LoadError::WrongTensor {
                    component: self.component.clone(),
                    name: name.into(),
                    expected: "float bytes".into(),
                    found: format!("{} blocks, expanded on the device", ggml.name()),
                })
            }
        };
        Ok(TensorRef { dtype: e.dtype, shape: &e.shape, bytes })
    }

    /// Checks that the files hold every expected tensor, each with its shape
    /// and a usable dtype. Tensors the architecture does not read are
    /// tolerated, as diffusers and transformers load such files with a
    /// warning (a tied text encoder that also carries `lm_head.weight`), and
    /// listed in [`Self::unread`].
    pub fn check(&mut self, expected: &[TensorSpec]) -> Result<(), LoadError> {
        let mut wanted: HashMap<&str, &TensorSpec> = HashMap::new();
        for spec in expected {
            // A weight from a DF11 group is flat until it meets its architecture.
            let e = self
                .entries
                .get_mut(spec.name.as_str())
                .ok_or_else(|| LoadError::MissingTensor { component: self.component.clone(), name: spec.name.to_string() })?;
            let n: usize = spec.shape.iter().product();
            if matches!(e.source, Source::Df11 { .. } | Source::Expanded(_)) && e.shape == [n] {
                e.shape = spec.shape.to_vec();
            }
            wanted.insert(spec.name.as_str(), spec);
            let t = &*e;
            let quantized = matches!(t.source, Source::Quantized { .. });
            let dtype_ok = match spec.kind {
                Kind::Float => quantized || matches!(t.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32),
                Kind::Int => matches!(t.dtype, Dtype::I64 | Dtype::I32),
            };
            if !dtype_ok || t.shape != spec.shape.as_slice() {
                let kind = if spec.kind == Kind::Float { "a float tensor" } else { "an integer tensor" };
                let dtype = match &t.source {
                    Source::Quantized { ggml, .. } => ggml.name().to_string(),
                    _ => format!("{:?}", t.dtype),
                };
                return Err(LoadError::WrongTensor {
                    component: self.component.clone(),
                    name: spec.name.to_string(),
                    expected: format!("{kind} of shape {:?}", spec.shape.as_slice()),
                    found: format!("{dtype} of shape {:?}", t.shape),
                });
            }
        }
        self.unread = self.names().filter(|n| !wanted.contains_key(n)).map(String::from).collect();
        Ok(())
    }

    /// The tensors in the files that the architecture does not read.
    pub fn unread(&self) -> &[String] {
        &self.unread
    }

    /// A warning naming the unread tensors, when there are any.
    pub fn unread_warning(&self) -> Option<String> {
        let (first, n) = (self.unread.first()?, self.unread.len());
        let more = if n > 1 { format!(" and {} more", n - 1) } else { String::new() };
        Some(format!("warning: {}: {n} tensors in the files are not part of this architecture and are not read (`{first}`{more})", self.component))
    }

    /// Bytes of tensor data as held: compressed groups count their compressed size.
    pub fn data_bytes(&self) -> u64 {
        let plain: u64 = self
            .entries
            .values()
            .map(|e| match &e.source {
                Source::Shard { range, .. } => (range.1 - range.0) as u64,
                Source::Expanded(i) => self.expanded[*i].len() as u64,
                Source::Df11 { .. } => 0,
                Source::Quantized { pieces, .. } => pieces.iter().map(|p| (p.1 - p.0) as u64).sum(),
            })
            .sum();
        plain + self.df11_groups.iter().filter(|g| !g.expanded).map(|g| g.info.compressed_bytes).sum::<u64>()
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
