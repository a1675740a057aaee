//! LoRA adapters for the transformer, read from the three layouts FLUX.2
//! adapters are published in and brought to diffusers' module names:
//!
//! - diffusers/PEFT: `transformer.<module>.lora_A.weight` / `lora_B.weight`,
//!   with PEFT's `lora_alpha`, `r`, `rank_pattern`, `alpha_pattern` and
//!   `use_rslora` in the header's `lora_adapter_metadata` (without it every
//!   module's scale is 1, as diffusers infers `lora_alpha = r`);
//! - BFL names as ai-toolkit saves them (`diffusion_model.double_blocks.N.img_attn.qkv.lora_A.weight`,
//!   `single_blocks.N.linear1`, …), also under PEFT's `base_model.model.`;
//! - kohya's (`lora_unet_double_blocks_N_img_attn_qkv.lora_down.weight`,
//!   `lora_up`, `.alpha`: scale alpha / rank).
//!
//! A fused BFL projection (`img_attn.qkv`, `txt_attn.qkv`) adapts the three
//! separate diffusers projections: its down matrix is shared by all three and
//! its up matrix is cut into thirds by rows, as diffusers' conversion does.
//! Every value is held as f32; a module's scale (alpha / rank and the
//! user's weight) is folded into its up matrix.
//!
//! The engine never merges an adapter into the model's weights: each adapted
//! linear adds `(x·Aᵀ)·(s·B)ᵀ` to its output (see `exec::runner`), as PEFT
//! computes it, so the base weights (bf16, DF11 or streamed) stay untouched.

use super::bfl_names::{bfl_targets, kohya_targets};
use crate::error::LoadError;
use flux_lite_core::config::TransformerConfig;
use memmap2::Mmap;
use crate::model::safetensors_store::widen_to_f32;
use safetensors::tensor::{Dtype, SafeTensors};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One adapter as the user names it: `FILE[:SCALE]` (scale 1 by default).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSpec {
    pub path: PathBuf,
    pub scale: f32,
}

impl LoraSpec {
    /// Parses `FILE[:SCALE]`: the text after the last `:` is the scale when it
    /// reads as a finite number, else it is part of the file's name.
    pub fn parse(arg: &str) -> Result<Self, String> {
        if let Some((file, scale)) = arg.rsplit_once(':') {
            if let Ok(s) = scale.parse::<f32>() {
                if !s.is_finite() {
                    return Err(format!("{arg}: the scale must be a finite number"));
                }
                if file.is_empty() {
                    return Err(format!("{arg}: no file before the scale"));
                }
                return Ok(Self { path: file.into(), scale: s });
            }
        }
        if arg.is_empty() {
            return Err("no file given".into());
        }
        Ok(Self { path: arg.into(), scale: 1.0 })
    }
}

/// The layout a file's keys are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Diffusers,
    Bfl,
    Kohya,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Diffusers => "diffusers/PEFT",
            Layout::Bfl => "BFL (ai-toolkit)",
            Layout::Kohya => "kohya",
        }
    }
}

/// Where a tensor's bytes lie in a mapped file.
#[derive(Debug, Clone)]
struct Stored {
    dtype: Dtype,
    bytes: std::ops::Range<usize>,
}

/// One module's adapter from one file: where its down `[rank, in]` matrix
/// and its rows `[out, rank]` of the up matrix lie, and the module's scale. The values stay in the mapped file
/// until the transformer is built.
#[derive(Debug, Clone)]
struct Part {
    /// The module's weight, as the transformer names it (`….weight`).
    weight: String,
    /// The file's key it came from (its down matrix), for messages.
    key: String,
    rank: usize,
    inner: usize,
    out: usize,
    down: Stored,
    /// This module's rows of the up matrix (a third of it for a fused qkv).
    up: Stored,
    /// alpha / rank, or PEFT's scaling.
    scale: f32,
    /// BFL's final modulation is (shift, scale); diffusers' `norm_out` is
    /// (scale, shift): the up matrix's halves swap.
    swap_halves: bool,
}

/// One adapter file, read, converted to diffusers' names and checked
/// against the transformer; its values stay in the mapped file.
#[derive(Debug)]
pub struct Lora {
    pub spec: LoraSpec,
    pub layout: Layout,
    map: Mmap,
    parts: Vec<Part>,
    /// Keys that matched no transformer module, in file order.
    pub unmatched: Vec<String>,
    /// Keys for the text encoder, which flux-lite does not adapt.
    pub text_encoder_keys: usize,
}

impl Lora {
    /// How many of the transformer's linears this file adapts.
    pub fn modules(&self) -> usize {
        self.parts.len()
    }

    /// Its ranks, smallest and largest.
    pub fn ranks(&self) -> (usize, usize) {
        let ranks = self.parts.iter().map(|p| p.rank);
        (ranks.clone().min().unwrap_or(0), ranks.max().unwrap_or(0))
    }

    /// Device bytes of its matrices as the engine holds them (f32).
    pub fn device_bytes(&self) -> u64 {
        self.parts.iter().map(|p| 4 * (p.rank * (p.inner + p.out)) as u64).sum()
    }

    /// One line for `--verbose` and `info --lora`.
    pub fn summary(&self) -> String {
        let (lo, hi) = self.ranks();
        let rank = if lo == hi { format!("rank {hi}") } else { format!("ranks {lo}-{hi}") };
        format!(
            "{} ({} layout): {} modules, {rank}, scale {}, {} on the device",
            self.spec.path.display(),
            self.layout.name(),
            self.modules(),
            self.spec.scale,
            flux_lite_core::bytes::Bytes(self.device_bytes())
        )
    }

    fn values(&self, t: &Stored) -> Vec<f32> {
        let mut out = Vec::new();
        widen_to_f32(t.dtype, &self.map[t.bytes.clone()], &mut out);
        out
    }

    /// A part's down matrix `[rank, in]`.
    fn down(&self, p: &Part) -> Vec<f32> {
        self.values(&p.down)
    }

    /// A part's up matrix `[out, rank]` times its scale, halves swapped where BFL's order differs.
    fn up(&self, p: &Part) -> Vec<f32> {
        let mut rows: Vec<f32> = self.values(&p.up).iter().map(|v| v * p.scale).collect();
        if p.swap_halves {
            rows.rotate_left(p.out / 2 * p.rank);
        }
        rows
    }
}

/// The adapters of one run, combined per module: each adapted linear gets
/// `A` `[R, in]` (every adapter's down matrix stacked) and `B` `[out, R]`
/// (their scaled up matrices side by side), `R` the sum of their ranks, so
/// one pair of products serves all of them. Nothing is held but the mapped
/// files: [`Self::combined`] reads a module's matrices when the transformer
/// is built.
#[derive(Debug, Default)]
pub struct LoraSet {
    pub adapters: Vec<Lora>,
    /// Per adapted weight: `(adapter, part)` of each adapter of it, in order.
    modules: BTreeMap<String, Vec<(usize, usize)>>,
}

/// One module's adapters combined.
#[derive(Debug)]
pub struct Combined {
    /// `[rank, in]`
    pub down: Vec<f32>,
    /// `[out, rank]`
    pub up: Vec<f32>,
    pub rank: usize,
}

impl LoraSet {
    /// Reads every file of `specs` and checks it against `config`'s
    /// transformer. Adapters of scale 0 are read and checked but add nothing.
    pub fn open(specs: &[LoraSpec], config: &TransformerConfig) -> Result<Arc<Self>, LoadError> {
        let shapes = module_shapes(config);
        let mut set = Self::default();
        for spec in specs {
            set.adapters.push(read(spec, &shapes)?);
        }
        for (a, lora) in set.adapters.iter().enumerate().filter(|(_, l)| l.spec.scale != 0.0) {
            for (i, part) in lora.parts.iter().enumerate() {
                set.modules.entry(part.weight.clone()).or_default().push((a, i));
            }
        }
        Ok(Arc::new(set))
    }

    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// The weights of the linears adapted.
    pub fn modules(&self) -> impl Iterator<Item = &str> {
        self.modules.keys().map(String::as_str)
    }

    /// The combined adapter of the linear whose weight is `weight`, read from the files.
    pub fn combined(&self, weight: &str) -> Option<Combined> {
        let parts = self.modules.get(weight)?;
        let mut c = Combined { down: Vec::new(), up: Vec::new(), rank: 0 };
        for &(a, i) in parts {
            let (lora, part) = (&self.adapters[a], &self.adapters[a].parts[i]);
            c.push(&lora.down(part), &lora.up(part), part.rank, part.out, lora.spec.scale);
        }
        Some(c)
    }

    fn parts(&self, weight: &str) -> impl Iterator<Item = &Part> {
        self.modules.get(weight).into_iter().flatten().map(|&(a, i)| &self.adapters[a].parts[i])
    }

    /// The combined rank of each adapted linear.
    fn ranks(&self) -> impl Iterator<Item = usize> + '_ {
        self.modules.keys().map(|w| self.parts(w).map(|p| p.rank).sum())
    }

    /// The largest combined rank: the width of the engine's `x·Aᵀ` scratch.
    pub fn max_rank(&self) -> usize {
        self.ranks().max().unwrap_or(0)
    }

    /// Device bytes while the transformer runs over `rows` token rows: every
    /// combined matrix (f32) and the `[rows, max rank]` scratch.
    pub fn device_bytes(&self, rows: u64) -> u64 {
        let matrices: u64 = self.modules.keys().flat_map(|w| self.parts(w)).map(|p| 4 * (p.rank * (p.inner + p.out)) as u64).sum();
        if matrices == 0 {
            return 0;
        }
        matrices + 4 * rows * self.max_rank() as u64
    }

    /// What identifies this set for a transformer kept between runs.
    pub fn key(&self) -> Vec<(PathBuf, u32)> {
        self.adapters.iter().map(|l| (l.spec.path.clone(), l.spec.scale.to_bits())).collect()
    }
}

impl Combined {
    /// Adds an adapter of rank `r`: `down` `[r, in]` below the stacked ones,
    /// `scale · up` (`[out, r]`) to the right of the others.
    fn push(&mut self, down: &[f32], up: &[f32], r: usize, out: usize, scale: f32) {
        let r0 = self.rank;
        let rank = r0 + r;
        self.down.extend_from_slice(down);
        let mut wide = vec![0f32; out * rank];
        for o in 0..out {
            wide[o * rank..o * rank + r0].copy_from_slice(&self.up[o * r0..o * r0 + r0]);
            for j in 0..r {
                wide[o * rank + r0 + j] = scale * up[o * r + j];
            }
        }
        self.up = wide;
        self.rank = rank;
    }
}

/// `[out, in]` of every linear weight of the transformer, by weight name.
fn module_shapes(config: &TransformerConfig) -> HashMap<String, (usize, usize)> {
    let mut shapes = HashMap::new();
    flux_lite_core::models::tensors::transformer(config, |s| {
        if s.shape.len() == 2 && s.name.ends_with(".weight") {
            shapes.insert(s.name.to_string(), (s.shape[0], s.shape[1]));
        }
    });
    shapes
}

/// An error about `path`, naming `key` where there is one.
fn problem(path: &Path, key: Option<&str>, detail: impl Into<String>) -> LoadError {
    let detail = detail.into();
    LoadError::Lora { path: path.into(), detail: match key { Some(k) => format!("`{k}`: {detail}"), None => detail } }
}

/// A file mapped and its safetensors header parsed.
struct File<'a> {
    path: &'a Path,
    tensors: SafeTensors<'a>,
    /// The address of the map's first byte, to turn tensor slices into ranges.
    start: usize,
}

impl File<'_> {
    /// Where a tensor lies, after checking that it is bf16, f16 or f32 and
    /// every value is finite (the values are not kept).
    fn stored(&self, key: &str) -> Result<(Stored, Vec<usize>), LoadError> {
        let t = self.tensors.tensor(key).map_err(|e| problem(self.path, Some(key), e.to_string()))?;
        let mut values = Vec::new();
        if !widen_to_f32(t.dtype(), t.data(), &mut values) {
            return Err(problem(self.path, Some(key), format!("is {:?}; a LoRA tensor must be bf16, f16 or f32", t.dtype())));
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(problem(self.path, Some(key), format!("holds a non-finite value ({} at element {i})", values[i])));
        }
        let start = t.data().as_ptr() as usize - self.start;
        Ok((Stored { dtype: t.dtype(), bytes: start..start + t.data().len() }, t.shape().to_vec()))
    }

    /// A scalar such as kohya's `.alpha`.
    fn scalar(&self, key: &str) -> Result<Option<f32>, LoadError> {
        if !self.has(key) {
            return Ok(None);
        }
        let t = self.tensors.tensor(key).map_err(|e| problem(self.path, Some(key), e.to_string()))?;
        let mut v = Vec::new();
        widen_to_f32(t.dtype(), t.data(), &mut v);
        match v.as_slice() {
            [a] if a.is_finite() && *a > 0.0 => Ok(Some(*a)),
            _ => Err(problem(self.path, Some(key), format!("should hold one positive value, holds {v:?}"))),
        }
    }

    fn has(&self, key: &str) -> bool {
        self.tensors.tensor(key).is_ok()
    }
}

/// Reads one adapter file and converts it to diffusers' module names.
fn read(spec: &LoraSpec, shapes: &HashMap<String, (usize, usize)>) -> Result<Lora, LoadError> {
    let path = spec.path.as_path();
    let handle = std::fs::File::open(path).map_err(|e| LoadError::Io { path: path.into(), source: e })?;
    // SAFETY: the file is only read; flux-lite never writes adapters.
    let map = unsafe { Mmap::map(&handle) }.map_err(|e| LoadError::Io { path: path.into(), source: e })?;
    let tensors = SafeTensors::deserialize(&map).map_err(|e| problem(path, None, format!("not a safetensors file we can read ({e})")))?;
    let metadata = SafeTensors::read_metadata(&map).ok().and_then(|(_, m)| m.metadata().clone());
    let file = File { path, tensors, start: map.as_ptr() as usize };
    let mut keys: Vec<String> = file.tensors.names().into_iter().map(str::to_string).collect();
    keys.sort();
    let layout = if keys.iter().any(|k| k.contains(".lora_down.weight") && k.starts_with("lora_")) {
        Layout::Kohya
    } else if keys.iter().any(|k| k.starts_with("diffusion_model.") || k.starts_with("base_model.model.")) {
        Layout::Bfl
    } else {
        Layout::Diffusers
    };
    let mut used = BTreeSet::new();
    let mut parts = Vec::new();
    let mut text_encoder_keys = 0;
    let metadata = match layout {
        Layout::Diffusers => Some(PeftConfig::from_metadata(path, metadata.as_ref())?),
        _ => None,
    };
    for key in &keys {
        let key = key.as_str();
        let Some((base, _, up_suffix)) = down_key(key) else { continue };
        if is_text_encoder(layout, base) {
            continue;
        }
        let Some(targets) = targets(layout, base) else { continue };
        // A module this model lacks (klein has no guidance embedder) leaves its keys unmatched.
        if targets.iter().any(|(m, _)| !shapes.contains_key(&format!("{m}.weight"))) {
            continue;
        }
        let up_key = format!("{base}{up_suffix}");
        let (down, down_shape) = file.stored(key)?;
        if !file.has(&up_key) {
            return Err(problem(path, Some(key), format!("has no `{up_key}` beside it")));
        }
        let (up, up_shape) = file.stored(&up_key)?;
        let [rank, inner] = matrix(path, key, &down_shape)?;
        let [out_all, up_rank] = matrix(path, &up_key, &up_shape)?;
        if up_rank != rank {
            return Err(problem(path, Some(&up_key), format!("has rank {up_rank}, its down matrix `{key}` rank {rank}")));
        }
        let alpha_key = format!("{base}.alpha");
        let scale = match &metadata {
            Some(peft) => peft.scale(path, key, &targets[0].0, rank)?,
            // kohya's and (beyond diffusers, which refuses them) a BFL file's alpha: alpha / rank.
            None => file.scalar(&alpha_key)?.map_or(1.0, |alpha| alpha / rank as f32),
        };
        used.extend([key.to_string(), up_key.clone(), alpha_key]);
        let pieces = targets.len();
        if !out_all.is_multiple_of(pieces) {
            return Err(problem(path, Some(&up_key), format!("has {out_all} rows, which do not split into the {pieces} projections it adapts")));
        }
        let out = out_all / pieces;
        for (i, (module, swap_halves)) in targets.iter().enumerate() {
            let weight = format!("{module}.weight");
            let (want_out, want_in) = shapes[&weight];
            if inner != want_in || out != want_out {
                let (what, got) = if inner != want_in { (key, format!("takes {inner} inputs")) } else { (up_key.as_str(), format!("gives {out} outputs")) };
                return Err(problem(path, Some(what), format!("{got}, but `{module}` is {want_out}×{want_in} (out×in) in this model")));
            }
            // This module's rows of the up matrix: the i-th `out` of them.
            let row_bytes = rank * up.dtype.bitsize() / 8;
            let first = up.bytes.start + i * out * row_bytes;
            let rows = Stored { dtype: up.dtype, bytes: first..first + out * row_bytes };
            parts.push(Part { weight, key: key.to_string(), rank, inner, out, down: down.clone(), up: rows, scale, swap_halves: *swap_halves });
        }
    }
    for key in &keys {
        let base = down_key(key).map(|(b, _, _)| b).or_else(|| up_base(key)).unwrap_or(key);
        if is_text_encoder(layout, base) {
            text_encoder_keys += 1;
            used.insert(key.clone());
        }
    }
    let unmatched: Vec<String> = keys.iter().filter(|k| !used.contains(*k)).cloned().collect();
    if parts.is_empty() && keys.iter().any(|k| k.contains(".lokr_") || k.contains(".hada_")) {
        return Err(problem(path, None, "is a LoKr or LoHa adapter (`lokr_`/`hada_` keys); flux-lite reads LoRA adapters only"));
    }
    if parts.is_empty() {
        let first = unmatched.first().or(keys.first()).map_or("none".to_string(), |k| format!("`{k}`"));
        return Err(problem(
            path,
            None,
            format!("no key adapts this model's transformer (read as {} layout; {} keys, the first {first}): a LoRA for another model?", layout.name(), keys.len()),
        ));
    }
    parts.sort_by(|a, b| a.weight.cmp(&b.weight));
    if let Some(w) = parts.windows(2).find(|w| w[0].weight == w[1].weight) {
        return Err(problem(path, Some(&w[1].key), format!("adapts `{}` a second time (also `{}`)", w[1].weight, w[0].key)));
    }
    drop(file);
    Ok(Lora { spec: spec.clone(), layout, map, parts, unmatched, text_encoder_keys })
}

/// A 2-D shape, or an error naming the key.
fn matrix(path: &Path, key: &str, shape: &[usize]) -> Result<[usize; 2], LoadError> {
    match shape {
        [a, b] if *a > 0 && *b > 0 => Ok([*a, *b]),
        _ => Err(problem(path, Some(key), format!("has shape {shape:?}; a LoRA matrix is 2-D"))),
    }
}

/// A down matrix's key split into its module part and the suffixes of its
/// down and up matrices.
fn down_key(key: &str) -> Option<(&str, &'static str, &'static str)> {
    for (down, up) in [(".lora_A.weight", ".lora_B.weight"), (".lora_down.weight", ".lora_up.weight")] {
        if let Some(base) = key.strip_suffix(down) {
            return Some((base, down, up));
        }
    }
    None
}

fn up_base(key: &str) -> Option<&str> {
    key.strip_suffix(".lora_B.weight").or_else(|| key.strip_suffix(".lora_up.weight")).or_else(|| key.strip_suffix(".alpha"))
}

fn is_text_encoder(layout: Layout, base: &str) -> bool {
    match layout {
        Layout::Kohya => base.starts_with("lora_te"),
        _ => base.starts_with("text_encoder.") || base.starts_with("text_encoder_2."),
    }
}

/// The diffusers modules a file's module name adapts, each with whether its
/// up matrix's halves swap; several for a fused projection (its up matrix
/// split by rows in this order). `None`: not a transformer module we know.
fn targets(layout: Layout, base: &str) -> Option<Vec<(String, bool)>> {
    let one = |m: String| Some(vec![(m, false)]);
    match layout {
        Layout::Diffusers => one(base.strip_prefix("transformer.").unwrap_or(base).to_string()),
        Layout::Bfl => {
            let name = base.strip_prefix("diffusion_model.").or_else(|| base.strip_prefix("base_model.model.")).unwrap_or(base);
            bfl_targets(name)
        }
        Layout::Kohya => kohya_targets(base.strip_prefix("lora_unet_")?),
    }
}

/// PEFT's `LoraConfig` as diffusers stores it in `lora_adapter_metadata`.
#[derive(Debug, Default)]
struct PeftConfig {
    r: Option<f64>,
    alpha: Option<f64>,
    rank_pattern: Vec<(String, f64)>,
    alpha_pattern: Vec<(String, f64)>,
    rslora: bool,
}

impl PeftConfig {
    fn from_metadata(path: &Path, metadata: Option<&HashMap<String, String>>) -> Result<Self, LoadError> {
        let Some(text) = metadata.and_then(|m| m.get("lora_adapter_metadata")) else { return Ok(Self::default()) };
        let bad = |detail: String| problem(path, Some("lora_adapter_metadata"), detail);
        let json: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(format!("is not JSON: {e}")))?;
        let object = json.as_object().ok_or_else(|| bad("is not a JSON object".into()))?;
        // diffusers prefixes each field with the component (`transformer.r`).
        let field = |name: &str| object.get(&format!("transformer.{name}")).or_else(|| object.get(name));
        let number = |name: &str| -> Result<Option<f64>, LoadError> {
            match field(name) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => v.as_f64().filter(|x| *x > 0.0).map(Some).ok_or_else(|| bad(format!("`{name}` is {v}, not a positive number"))),
            }
        };
        let pattern = |name: &str| -> Result<Vec<(String, f64)>, LoadError> {
            match field(name) {
                None | Some(serde_json::Value::Null) => Ok(Vec::new()),
                Some(serde_json::Value::Object(m)) => {
                    m.iter().map(|(k, v)| v.as_f64().map(|x| (k.clone(), x)).ok_or_else(|| bad(format!("`{name}` holds {v} for `{k}`")))).collect()
                }
                Some(v) => Err(bad(format!("`{name}` is {v}, not an object"))),
            }
        };
        Ok(Self {
            r: number("r")?,
            alpha: number("lora_alpha")?,
            rank_pattern: pattern("rank_pattern")?,
            alpha_pattern: pattern("alpha_pattern")?,
            rslora: field("use_rslora").and_then(|v| v.as_bool()).unwrap_or(false),
        })
    }

    /// PEFT's scaling of `module`: alpha / r (alpha / √r with rsLoRA), each
    /// from its pattern where one matches the module. Without metadata, 1
    /// (diffusers then takes `lora_alpha = r`). The rank it states must be
    /// the tensors'.
    fn scale(&self, path: &Path, key: &str, module: &str, rank: usize) -> Result<f32, LoadError> {
        let Some(r) = self.r else { return Ok(1.0) };
        let r = pattern_match(&self.rank_pattern, module).unwrap_or(r);
        if r != rank as f64 {
            return Err(problem(path, Some(key), format!("has rank {rank}, but the file's lora_adapter_metadata says r = {r}")));
        }
        let alpha = pattern_match(&self.alpha_pattern, module).or(self.alpha).unwrap_or(r);
        Ok((if self.rslora { alpha / r.sqrt() } else { alpha / r }) as f32)
    }
}

/// PEFT's pattern rule: a pattern names a module when the module's name is
/// it or ends with `.` followed by it.
fn pattern_match(patterns: &[(String, f64)], module: &str) -> Option<f64> {
    patterns.iter().find(|(p, _)| module == p || module.ends_with(&format!(".{p}"))).map(|(_, v)| *v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_takes_its_scale_after_the_last_colon() {
        assert_eq!(LoraSpec::parse("a.safetensors").unwrap(), LoraSpec { path: "a.safetensors".into(), scale: 1.0 });
        assert_eq!(LoraSpec::parse("a.safetensors:0.5").unwrap(), LoraSpec { path: "a.safetensors".into(), scale: 0.5 });
        assert_eq!(LoraSpec::parse("C:/x/a.safetensors:-1").unwrap(), LoraSpec { path: "C:/x/a.safetensors".into(), scale: -1.0 });
        // Not a number after the colon: part of the name.
        assert_eq!(LoraSpec::parse("dir:name.safetensors").unwrap().path, PathBuf::from("dir:name.safetensors"));
        assert!(LoraSpec::parse("a.safetensors:inf").is_err());
        assert!(LoraSpec::parse(":0.5").is_err());
        assert!(LoraSpec::parse("").is_err());
    }

    #[test]
    fn bfl_and_kohya_names_reach_the_same_diffusers_modules() {
        let q = |l, n| targets(l, n).map(|t| t.into_iter().map(|(m, s)| format!("{m}{}", if s { "!" } else { "" })).collect::<Vec<_>>());
        let qkv = Some(vec!["transformer_blocks.3.attn.to_q".to_string(), "transformer_blocks.3.attn.to_k".into(), "transformer_blocks.3.attn.to_v".into()]);
        assert_eq!(q(Layout::Bfl, "diffusion_model.double_blocks.3.img_attn.qkv"), qkv);
        assert_eq!(q(Layout::Kohya, "lora_unet_double_blocks_3_img_attn_qkv"), qkv);
        assert_eq!(q(Layout::Bfl, "diffusion_model.double_blocks.0.txt_mlp.2"), Some(vec!["transformer_blocks.0.ff_context.linear_out".into()]));
        assert_eq!(q(Layout::Kohya, "lora_unet_double_blocks_0_txt_mlp_2"), Some(vec!["transformer_blocks.0.ff_context.linear_out".into()]));
        assert_eq!(q(Layout::Bfl, "diffusion_model.single_blocks.11.linear1"), Some(vec!["single_transformer_blocks.11.attn.to_qkv_mlp_proj".into()]));
        assert_eq!(q(Layout::Kohya, "lora_unet_single_blocks_11_linear2"), Some(vec!["single_transformer_blocks.11.attn.to_out".into()]));
        assert_eq!(q(Layout::Bfl, "base_model.model.txt_in"), Some(vec!["context_embedder".into()]));
        // The final modulation's halves swap, as the base weight's do in BFL → diffusers.
        assert_eq!(q(Layout::Bfl, "diffusion_model.final_layer.adaLN_modulation.1"), Some(vec!["norm_out.linear!".into()]));
        assert_eq!(q(Layout::Diffusers, "transformer.transformer_blocks.0.attn.to_out.0"), Some(vec!["transformer_blocks.0.attn.to_out.0".into()]));
        assert_eq!(q(Layout::Bfl, "diffusion_model.double_blocks.0.img_norm"), None);
        assert!(is_text_encoder(Layout::Kohya, "lora_te1_encoder_layers_0_mlp_fc1"));
        assert!(is_text_encoder(Layout::Diffusers, "text_encoder.model.layers.0.mlp.up_proj"));
    }

    #[test]
    fn peft_scales_follow_alpha_over_rank_and_the_patterns() {
        let path = Path::new("x.safetensors");
        let c = PeftConfig { r: Some(4.0), alpha: Some(8.0), rank_pattern: vec![("to_k".into(), 2.0)], alpha_pattern: vec![("attn.to_k".into(), 1.0)], rslora: false };
        assert_eq!(c.scale(path, "k", "transformer_blocks.0.attn.to_q", 4).unwrap(), 2.0);
        assert_eq!(c.scale(path, "k", "transformer_blocks.0.attn.to_k", 2).unwrap(), 0.5);
        // A pattern matches whole name parts only.
        assert_eq!(c.scale(path, "k", "transformer_blocks.0.attn.add_k_proj", 4).unwrap(), 2.0);
        let err = c.scale(path, "the.key", "transformer_blocks.0.attn.to_q", 8).unwrap_err().to_string();
        assert!(err.contains("`the.key`") && err.contains("rank 8") && err.contains("r = 4"), "{err}");
        assert_eq!(PeftConfig::default().scale(path, "k", "m", 16).unwrap(), 1.0);
        let rs = PeftConfig { r: Some(16.0), alpha: Some(8.0), rslora: true, ..Default::default() };
        assert_eq!(rs.scale(path, "k", "m", 16).unwrap(), 2.0);
    }

    #[test]
    fn adapters_combine_by_stacking_down_and_placing_scaled_up_side_by_side() {
        let mut c = Combined { down: Vec::new(), up: Vec::new(), rank: 0 };
        c.push(&[1.0, 2.0], &[3.0, 4.0, 5.0], 1, 3, 2.0);
        c.push(&[6.0, 7.0, 8.0, 9.0], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3, 0.5);
        assert_eq!(c.rank, 3);
        assert_eq!(c.down, vec![1.0, 2.0, 6.0, 7.0, 8.0, 9.0]);
        assert_eq!(c.up, vec![6.0, 0.5, 1.0, 8.0, 1.5, 2.0, 10.0, 2.5, 3.0]);
    }
}
