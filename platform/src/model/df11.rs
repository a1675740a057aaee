//! DF11 weights in a component folder, as the official loader reads them:
//! `config.json` holds `dfloat11_config`, whose `pattern_dict` maps module
//! regexes to the linears each matched module concatenates; every matched
//! module stores its group as six tensors under its own path. Groups are
//! expanded to bf16 on the host, their 4 KiB blocks spread over threads, or
//! on the device by the `df11_decode` kernel.

use crate::model::config_json::JsonFile;
use crate::error::{GpuError, LoadError};
use flux_lite_kernels::{DeviceBuffer, Gpu};
use flux_lite_kernels::kernels::{self, DF11_BLOCK_BYTES};
use flux_lite_core::df11::{Df11Error, Df11Field, Df11Group};
use safetensors::tensor::Dtype;
use rayon::prelude::*;
use regex::Regex;

/// `dfloat11_config` of a component.
#[derive(Debug, Clone)]
pub struct Df11Config {
    pub version: String,
    /// `(pattern, its regex anchored at both ends, sub-module paths)` in file order.
    patterns: Vec<(String, Regex, Vec<String>)>,
}

impl Df11Config {
    /// The component's `dfloat11_config`, if its config.json has one.
    pub fn read(json: &JsonFile) -> Result<Option<Self>, LoadError> {
        let Some(cfg) = json.value.get("dfloat11_config") else {
            return Ok(None);
        };
        let bad = |field: &str, problem: String| LoadError::Field { path: json.path.clone(), field: field.into(), problem };
        let version = cfg.get("version").and_then(|v| v.as_str()).unwrap_or("unknown").to_string();
        let dict = cfg
            .get("pattern_dict")
            .and_then(|d| d.as_object())
            .ok_or_else(|| bad("dfloat11_config.pattern_dict", "missing or not an object".into()))?;
        let mut patterns = Vec::new();
        for (pattern, subs) in dict {
            let regex = Regex::new(&format!("^(?:{pattern})$"))
                .map_err(|e| bad("dfloat11_config.pattern_dict", format!("pattern `{pattern}`: {e}")))?;
            let subs = subs
                .as_array()
                .and_then(|a| a.iter().map(|s| s.as_str().map(String::from)).collect::<Option<Vec<_>>>())
                .ok_or_else(|| bad("dfloat11_config.pattern_dict", format!("`{pattern}` must map to a list of module paths")))?;
            patterns.push((pattern.clone(), regex, subs));
        }
        Ok(Some(Self { version, patterns }))
    }

    /// A config with these `(pattern, sub-module paths)` entries (what the compressor writes).
    pub fn new(patterns: &[(&str, &[&str])]) -> Result<Self, regex::Error> {
        let patterns = patterns
            .iter()
            .map(|(p, subs)| Ok((p.to_string(), Regex::new(&format!("^(?:{p})$"))?, subs.iter().map(|s| s.to_string()).collect())))
            .collect::<Result<_, regex::Error>>()?;
        Ok(Self { version: flux_lite_core::df11::FORMAT_VERSION.into(), patterns })
    }

    /// The weights a group at module path `module` holds, in concatenation
    /// order: `<module>.<sub>.weight` for each listed sub-module, or the
    /// module's own `weight` when the list is empty (a lone linear).
    pub fn weights_of(&self, module: &str) -> Option<Vec<String>> {
        let subs = self.patterns_matching(module).next()?;
        Some(if subs.is_empty() { vec![format!("{module}.weight")] } else { subs.iter().map(|s| format!("{module}.{s}.weight")).collect() })
    }

    /// The sub-module lists of every pattern that matches `module`, in dict
    /// order (the official loader takes the first).
    pub fn patterns_matching<'s>(&'s self, module: &'s str) -> impl Iterator<Item = &'s [String]> {
        self.patterns.iter().filter(|(_, re, _)| re.is_match(module)).map(|(_, _, subs)| subs.as_slice())
    }

    /// The groups a compressor makes from a component whose tensors are
    /// `names`: every module path (dotted prefix of a name) a pattern matches,
    /// pattern by pattern in dict order and, within a pattern, in model order
    /// (numeric parts compared as numbers), as `compress_model` visits
    /// `named_modules()`. A module an earlier pattern took is not taken again.
    pub fn modules_in<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let mut paths = std::collections::BTreeSet::new();
        for name in names {
            paths.extend(name.match_indices('.').map(|(i, _)| &name[..i]));
        }
        let mut taken = std::collections::HashSet::new();
        let mut modules = Vec::new();
        for (_, re, _) in &self.patterns {
            let mut matched: Vec<&str> = paths.iter().copied().filter(|p| re.is_match(p) && !taken.contains(p)).collect();
            matched.sort_by(|a, b| model_order(a, b));
            taken.extend(matched.iter().copied());
            modules.extend(matched.into_iter().map(String::from));
        }
        modules
    }

    /// `(pattern, sub-module paths)` in order, for writing config.json.
    pub fn patterns(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.patterns.iter().map(|(p, _, s)| (p.as_str(), s.as_slice()))
    }

    /// The JSON value of `dfloat11_config`, as the official compressor writes it.
    pub fn to_json(&self) -> serde_json::Value {
        let dict: serde_json::Map<String, serde_json::Value> =
            self.patterns().map(|(p, subs)| (p.to_string(), serde_json::json!(subs))).collect();
        serde_json::json!({
            "version": self.version,
            "threads_per_block": [flux_lite_core::df11::THREADS_PER_BLOCK],
            "bytes_per_thread": flux_lite_core::df11::BYTES_PER_THREAD,
            "pattern_dict": dict,
        })
    }
}

/// Module paths in model order: `blocks.2` before `blocks.10`.
fn model_order(a: &str, b: &str) -> std::cmp::Ordering {
    // Numeric parts sort before words, by value among themselves.
    fn parts(s: &str) -> impl Iterator<Item = (bool, u64, &str)> {
        s.split('.').map(|p| p.parse::<u64>().map_or((true, 0, p), |n| (false, n, p)))
    }
    parts(a).cmp(parts(b))
}

/// The safetensors dtype official files store a group field in.
pub fn field_dtype(field: Df11Field) -> Dtype {
    if field == Df11Field::SplitPositions {
        Dtype::I64
    } else {
        Dtype::U8
    }
}

/// Expands a group into `out` (one bf16 word per element), blocks in parallel.
pub fn expand_on_host(group: &Df11Group<'_>, out: &mut [u16]) -> Result<(), Df11Error> {
    let pieces: Vec<(usize, &mut [u16])> = group.split_output(out)?.collect();
    pieces.into_par_iter().try_for_each(|(block, piece)| group.decode_block_into(block, piece))
}

/// A DF11 group's arrays on the device, for [`kernels::df11_decode`]; byte
/// arrays padded to whole words (and `gaps` by one more word, which the last
/// thread's two-byte read may touch).
#[derive(Debug)]
pub struct Df11DeviceGroup {
    luts: DeviceBuffer,
    stream: DeviceBuffer,
    sign_mantissa: DeviceBuffer,
    gaps: DeviceBuffer,
    positions: DeviceBuffer,
    host_positions: Vec<u32>,
    n_luts: u32,
    n_bytes: u64,
    n_elements: u64,
}

/// The first element of each 4096-byte block of a group, then its element
/// count: official files may stop one entry short (spec §2.7), so every
/// block gets its start here.
pub fn block_positions(group: &Df11Group<'_>) -> Vec<u32> {
    let n_elements = group.n_elements();
    (0..group.n_blocks()).map(|b| group.block_output_range(b).map_or(n_elements, |r| r.start) as u32).chain([n_elements as u32]).collect()
}

/// One array's piece in the streaming area: bytes `source` of the group's
/// array (of the positions' bytes, for them), copied to byte `at` of the
/// area, where `len` bytes (padding included) are set aside; it holds the
/// array from element `first` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AreaPiece {
    pub at: u64,
    pub len: u64,
    pub source: std::ops::Range<usize>,
    pub first: u64,
}

/// A run of a group's 4096-byte blocks as the streaming area holds it: the
/// decode tables, and the exponents, signs and mantissas, gaps and block
/// positions of those blocks alone, each piece at a multiple of `align`
/// bytes. A group larger than the area streams through it run by run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AreaRun {
    pub blocks: std::ops::Range<u64>,
    pub luts: AreaPiece,
    pub stream: AreaPiece,
    pub sign_mantissa: AreaPiece,
    /// Followed by a zero word the last thread's two-byte read may touch.
    pub gaps: AreaPiece,
    /// Bytes of [`block_positions`] as u32s.
    pub positions: AreaPiece,
    /// The area bytes the run needs.
    pub bytes: u64,
}

impl AreaRun {
    /// Blocks `b0..b1` of `group` (with its [`block_positions`]).
    pub fn new(group: &Df11Group<'_>, positions: &[u32], blocks: std::ops::Range<u64>, align: u64) -> Self {
        use flux_lite_kernels::kernels::df11::{DF11_GAP_BYTES_PER_BLOCK as GAP, DF11_LOOK_AHEAD};
        let f = group.fields();
        let (b0, b1) = (blocks.start, blocks.end);
        let words = |n: usize| (n.div_ceil(4).max(1) * 4) as u64;
        let clip = |start: u64, end: u64, len: usize| (start as usize).min(len)..(end as usize).min(len);
        let bb = DF11_BLOCK_BYTES;
        let (e0, e1) = (positions[b0 as usize] as u64, positions[b1 as usize] as u64);
        let sources = [
            (0..f.luts.len(), 0, 0),
            (clip(b0 * bb, b1 * bb + DF11_LOOK_AHEAD, f.encoded_exponent.len()), b0 * bb, 0),
            (clip(e0, e1, f.sign_mantissa.len()), e0, 0),
            (clip(b0 * GAP, b1 * GAP + 2, f.gaps.len()), b0 * GAP, 4),
            (4 * b0 as usize..4 * (b1 as usize + 1), b0, 0),
        ];
        let mut at = 0u64;
        let pieces = sources.map(|(source, first, pad)| {
            let len = words(source.len() + pad);
            let piece = AreaPiece { at, len, source, first };
            at = (at + len).next_multiple_of(align);
            piece
        });
        let [luts, stream, sign_mantissa, gaps, positions] = pieces;
        Self { blocks, luts, stream, sign_mantissa, gaps, positions, bytes: at }
    }

    /// The runs `group` streams through an area of `capacity` bytes in:
    /// each as many whole blocks as fit, or why not even one does.
    pub fn cut(group: &Df11Group<'_>, positions: &[u32], capacity: u64, align: u64) -> Result<Vec<Self>, String> {
        let n = group.n_blocks() as u64;
        let mut runs = Vec::new();
        let mut b0 = 0;
        while b0 < n {
            let mut run = Self::new(group, positions, b0..b0 + 1, align);
            if run.bytes > capacity {
                return Err(format!("one DF11 block needs {} bytes of streaming area, more than its {capacity}", run.bytes));
            }
            // Grow by doubling, then by halving steps back (the size grows with the blocks).
            let mut step = 1;
            while run.blocks.end < n {
                let next = Self::new(group, positions, b0..(run.blocks.end + step).min(n), align);
                if next.bytes <= capacity {
                    run = next;
                    step *= 2;
                } else if step > 1 {
                    step /= 2;
                } else {
                    break;
                }
            }
            b0 = run.blocks.end;
            runs.push(run);
        }
        Ok(runs)
    }

    /// The run's pieces as the decode kernel reads them from `area`.
    pub fn arrays<'a>(&self, area: &'a wgpu::Buffer, group: &Df11Group<'_>, positions: &'a [u32]) -> kernels::Df11Arrays<'a> {
        let region = |p: &AreaPiece| kernels::df11::Region { buffer: area, at: p.at, len: p.len, first: p.first };
        kernels::Df11Arrays {
            luts: region(&self.luts),
            n_luts: group.n_luts() as u32,
            stream: region(&self.stream),
            n_bytes: group.n_bytes() as u64,
            sign_mantissa: region(&self.sign_mantissa),
            n_elements: group.n_elements() as u64,
            gaps: region(&self.gaps),
            positions: region(&self.positions),
            host_positions: positions,
        }
    }
}

/// The streaming-area bytes a whole group would take as one run.
pub fn area_bytes_of(group: &Df11Group<'_>, align: u64) -> u64 {
    let positions = block_positions(group);
    AreaRun::new(group, &positions, 0..group.n_blocks() as u64, align).bytes
}

impl Df11DeviceGroup {
    pub fn upload(gpu: &Gpu, group: &Df11Group<'_>) -> Self {
        let device = Self::allocate(gpu, group);
        device.fill(gpu, group);
        device
    }

    /// The group's buffers, zeroed, for [`Self::fill`].
    pub fn allocate(gpu: &Gpu, group: &Df11Group<'_>) -> Self {
        let f = group.fields();
        let host_positions = block_positions(group);
        let words = |n: usize| (n.div_ceil(4).max(1) * 4) as u64;
        Self {
            luts: gpu.storage("df11 luts", words(f.luts.len())),
            stream: gpu.storage("df11 exponents", words(f.encoded_exponent.len())),
            sign_mantissa: gpu.storage("df11 signs and mantissas", words(f.sign_mantissa.len())),
            // The zero word after the gaps is the buffer's own.
            gaps: gpu.storage("df11 gaps", words(f.gaps.len() + 4)),
            positions: gpu.storage("df11 positions", 4 * host_positions.len() as u64),
            host_positions,
            n_luts: group.n_luts() as u32,
            n_bytes: group.n_bytes() as u64,
            n_elements: group.n_elements() as u64,
        }
    }

    /// Writes the group's arrays into the buffers [`Self::allocate`] made.
    pub fn fill(&self, gpu: &Gpu, group: &Df11Group<'_>) {
        let f = group.fields();
        gpu.write(&self.luts, 0, f.luts);
        gpu.write(&self.stream, 0, f.encoded_exponent);
        gpu.write(&self.sign_mantissa, 0, f.sign_mantissa);
        gpu.write(&self.gaps, 0, f.gaps);
        gpu.write(&self.positions, 0, bytemuck::cast_slice(&self.host_positions));
    }

    pub fn n_elements(&self) -> u64 {
        self.n_elements
    }

    /// Device bytes [`Self::upload`] would take for `group`.
    pub fn device_bytes_of(group: &Df11Group<'_>) -> u64 {
        let f = group.fields();
        let words = |n: usize| (n.div_ceil(4).max(1) * 4) as u64;
        words(f.luts.len()) + words(f.encoded_exponent.len()) + words(f.sign_mantissa.len()) + words(f.gaps.len() + 4) + 4 * (group.n_blocks() as u64 + 1)
    }

    /// Device bytes the compressed group takes.
    pub fn device_bytes(&self) -> u64 {
        [&self.luts, &self.stream, &self.sign_mantissa, &self.gaps, &self.positions].iter().map(|b| b.size()).sum()
    }

    /// Records the expansion into bf16 elements `[out_base, out_base + n_elements)` of `slot`.
    pub fn record_decode(&self, gpu: &Gpu, sink: &mut dyn flux_lite_kernels::Sink, slot: &wgpu::Buffer, out_base: u64) -> Result<(), GpuError> {
        let whole = kernels::df11::Region::whole;
        let arrays = kernels::Df11Arrays {
            luts: whole(&self.luts),
            n_luts: self.n_luts,
            stream: whole(&self.stream),
            n_bytes: self.n_bytes,
            sign_mantissa: whole(&self.sign_mantissa),
            n_elements: self.n_elements,
            gaps: whole(&self.gaps),
            positions: whole(&self.positions),
            host_positions: &self.host_positions,
        };
        kernels::df11_decode(gpu, sink, arrays, slot, out_base)
    }
}
