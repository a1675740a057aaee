//! `flux-lite quantize`: a model's transformer written as one GGUF file in
//! the layout ComfyUI-GGUF and stable-diffusion.cpp read for FLUX.2: BFL's
//! tensor names (q, k and v joined into `qkv`, the final modulation's shift
//! and scale swapped back), the block linears and modulations quantized,
//! `img_in`, `txt_in`, `time_in` and `final_layer` kept in BF16 as
//! ComfyUI-GGUF's converter keeps them, the 1-D norms in F32. Each legacy
//! quantizer computes what gguf-py's `quantize` computes for the type, bit
//! for bit; the K-quants (`kquants`) what llama.cpp's reference quantizers
//! compute, gguf-py having none.

mod kquants;

use crate::error::LoadError;
use crate::model::safetensors_store::widen_to_f32;
use crate::model::{Component, ModelFolder};
use flux_lite_core::ggml::GgmlType;
use flux_lite_core::models::tensors;
use std::io::Write;
use std::path::Path;

/// The types `quantize` writes.
pub const WRITABLE: [GgmlType; 12] = [
    GgmlType::Q8_0,
    GgmlType::Q6K,
    GgmlType::Q5K,
    GgmlType::Q5_1,
    GgmlType::Q5_0,
    GgmlType::Q4K,
    GgmlType::Q4_1,
    GgmlType::Q4_0,
    GgmlType::Q3K,
    GgmlType::Q2K,
    GgmlType::Bf16,
    GgmlType::F16,
];

/// Tensors kept in BF16 whatever the type asked for (ComfyUI-GGUF's rule).
const KEPT: [&str; 4] = ["img_in.", "txt_in.", "time_in.", "final_layer.linear."];

/// What a quantized file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantizeSummary {
    pub tensors: usize,
    pub quantized: usize,
    /// Tensors left in BF16 because their rows are not whole blocks of the type.
    pub not_whole_blocks: Vec<String>,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// One tensor of the file: its BFL name, shape (outermost first), type,
/// and the diffusers tensors it is made of (rows in order; `true`: halves swapped).
struct Planned {
    name: String,
    shape: Vec<usize>,
    ggml: GgmlType,
    sources: Vec<(String, bool)>,
    /// Left in BF16 because its rows are not whole blocks of the type asked for.
    not_whole_blocks: bool,
}

/// Writes `model`'s transformer to `output` with its block linears in `ggml`.
pub fn quantize_transformer(model: &ModelFolder, ggml: GgmlType, output: &Path) -> Result<QuantizeSummary, String> {
    if !WRITABLE.contains(&ggml) {
        let names: Vec<&str> = WRITABLE.iter().map(|t| t.name()).collect();
        return Err(format!("--type {}: not a type quantize writes; one of {}", ggml.name(), names.join(", ")));
    }
    let mut store = model.weights(Component::Transformer).map_err(|e| e.to_string())?;
    store.expand_df11_on_host().map_err(|e: LoadError| e.to_string())?;
    let plan = plan(model, &store, ggml)?;
    let infos: Vec<(String, Vec<u64>, GgmlType, u64)> = plan
        .iter()
        .map(|p| {
            let elements: usize = p.shape.iter().product();
            let bytes = p.ggml.bytes_of(elements as u64).unwrap_or(0);
            (p.name.clone(), p.shape.iter().rev().map(|&d| d as u64).collect(), p.ggml, bytes)
        })
        .collect();
    let summary = QuantizeSummary {
        tensors: plan.len(),
        quantized: plan.iter().filter(|p| p.ggml == ggml && ggml.is_quantized()).count(),
        not_whole_blocks: plan.iter().filter(|p| p.not_whole_blocks).map(|p| p.name.clone()).collect(),
        bytes_before: store.data_bytes(),
        bytes_after: infos.iter().map(|i| i.3).sum(),
    };
    let header = super::gguf::header("flux", &infos);
    let mut write = |w: &mut dyn Write| -> std::io::Result<()> {
        w.write_all(&header)?;
        let mut written = header.len() as u64;
        for p in &plan {
            let pad = written.next_multiple_of(super::gguf::ALIGNMENT) - written;
            w.write_all(&vec![0u8; pad as usize])?;
            let values = gather(&store, p).map_err(std::io::Error::other)?;
            let bytes = quantize(p.ggml, &values);
            w.write_all(&bytes)?;
            written += pad + bytes.len() as u64;
        }
        Ok(())
    };
    crate::output::write_streamed(output, &mut write)?;
    Ok(summary)
}

/// The file's tensors in the order of the model's own list, each with its type.
fn plan(model: &ModelFolder, store: &crate::model::safetensors_store::WeightStore, ggml: GgmlType) -> Result<Vec<Planned>, String> {
    let c = &model.transformer;
    let mut names = vec!["img_in.weight".to_string(), "txt_in.weight".into(), "time_in.in_layer.weight".into(), "time_in.out_layer.weight".into()];
    names.extend(["double_stream_modulation_img.lin.weight", "double_stream_modulation_txt.lin.weight", "single_stream_modulation.lin.weight"].map(String::from));
    for i in 0..c.num_layers {
        for side in ["img", "txt"] {
            for part in ["attn.qkv.weight", "attn.proj.weight", "mlp.0.weight", "mlp.2.weight", "attn.norm.query_norm.scale", "attn.norm.key_norm.scale"] {
                names.push(format!("double_blocks.{i}.{side}_{part}"));
            }
        }
    }
    for i in 0..c.num_single_layers {
        for part in ["linear1.weight", "linear2.weight", "norm.query_norm.scale", "norm.key_norm.scale"] {
            names.push(format!("single_blocks.{i}.{part}"));
        }
    }
    names.extend(["final_layer.adaLN_modulation.1.weight", "final_layer.linear.weight"].map(String::from));
    let mut covered = std::collections::HashSet::new();
    let mut plan = Vec::new();
    for name in names {
        let sources = super::bfl_names::bfl_tensor(&name).ok_or_else(|| format!("internal: `{name}` has no diffusers tensors"))?;
        let mut shape: Vec<usize> = Vec::new();
        for (s, _) in &sources {
            let t = store.tensor(s).map_err(|e| e.to_string())?;
            match shape.first_mut() {
                Some(rows) if t.shape.len() == 2 => *rows += t.shape[0],
                _ => shape = t.shape.to_vec(),
            }
            covered.insert(s.clone());
        }
        let matrix = shape.len() == 2;
        let kept = KEPT.iter().any(|k| name.starts_with(k));
        let not_whole_blocks = matrix && !kept && !shape[1].is_multiple_of(ggml.block_elements());
        let kind = match (matrix, kept || not_whole_blocks) {
            (false, _) => GgmlType::F32,
            (true, true) => GgmlType::Bf16,
            (true, false) => ggml,
        };
        plan.push(Planned { name, shape, ggml: kind, sources, not_whole_blocks });
    }
    let mut missing = Vec::new();
    tensors::transformer(c, |s| {
        if !covered.contains(s.name.as_str()) {
            missing.push(s.name.to_string());
        }
    });
    match missing.first() {
        Some(m) => Err(format!("internal: `{m}` has no place in BFL's layout")),
        None => Ok(plan),
    }
}

/// A file tensor's values: its diffusers tensors' rows in order, as f32.
fn gather(store: &crate::model::safetensors_store::WeightStore, p: &Planned) -> Result<Vec<f32>, String> {
    let mut out = Vec::new();
    for (name, swap) in &p.sources {
        let t = store.tensor(name).map_err(|e| e.to_string())?;
        let at = out.len();
        if !widen_to_f32(t.dtype, t.bytes, &mut out) {
            return Err(format!("`{name}` is {:?}, not a float tensor", t.dtype));
        }
        if *swap {
            let half = (out.len() - at) / 2;
            out[at..].rotate_left(half);
        }
    }
    Ok(out)
}

/// `values` (whole blocks) in `ggml`'s bytes, as gguf-py's `quantize`
/// writes them (K-quants: as llama.cpp's reference quantizers do).
pub fn quantize(ggml: GgmlType, values: &[f32]) -> Vec<u8> {
    match ggml {
        GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
        GgmlType::Bf16 => values.iter().flat_map(|&v| bf16_bits(v).to_le_bytes()).collect(),
        _ => {
            // Blocks are independent: runs of them on every core (the K-quant
            // fits take ~20 trial scales a sub-block), joined in order.
            use rayon::prelude::*;
            let run = ggml.block_elements() * 1024;
            let parts: Vec<Vec<u8>> = values
                .par_chunks(run)
                .map(|part| {
                    let mut out = Vec::with_capacity(ggml.bytes_of(part.len() as u64).unwrap_or(0) as usize);
                    for block in part.chunks_exact(ggml.block_elements()) {
                        match ggml {
                            GgmlType::Q8_0 => q8_0(block, &mut out),
                            GgmlType::Q4_0 | GgmlType::Q5_0 => symmetric(block, ggml == GgmlType::Q5_0, &mut out),
                            GgmlType::Q4_1 | GgmlType::Q5_1 => with_min(block, ggml == GgmlType::Q5_1, &mut out),
                            k => kquants::quantize_block(k, block, &mut out),
                        }
                    }
                    out
                })
                .collect();
            parts.concat()
        }
    }
}

/// gguf-py's BF16: round to nearest even, NaNs made quiet.
fn bf16_bits(v: f32) -> u16 {
    let mut n = v.to_bits() as u64;
    if n & 0x7fff_ffff > 0x7f80_0000 {
        n = (n & 0xffff_0000) | (64 << 16);
    }
    ((n + 0x7fff + ((n >> 16) & 1)) >> 16) as u16
}

fn half_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// numpy's `np_roundf` of gguf-py: half away from zero, as C's `roundf`.
fn roundf(n: f32) -> f32 {
    let a = n.abs();
    let floored = a.floor();
    let b = floored + (2.0 * (a - floored)).floor();
    if n > 0.0 {
        b
    } else if n < 0.0 {
        -b
    } else {
        0.0
    }
}

fn q8_0(x: &[f32], out: &mut Vec<u8>) {
    let d = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    out.extend(half_bytes(d));
    out.extend(x.iter().map(|&v| roundf(v * id) as i8 as u8));
}

/// Q4_0 / Q5_0: the scale from the value of largest magnitude, signed.
fn symmetric(x: &[f32], five: bool, out: &mut Vec<u8>) {
    // numpy's argmax of |x|: the first of equal magnitudes (the first element when all are 0).
    let max = x[(1..x.len()).fold(0, |best, i| if x[i].abs() > x[best].abs() { i } else { best })];
    let (levels, offset, top) = if five { (-16.0f32, 16.5f32, 31u8) } else { (-8.0, 8.5, 15) };
    let d = max / levels;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let q: Vec<u8> = x.iter().map(|&v| ((v * id + offset).trunc() as u8).min(top)).collect();
    out.extend(half_bytes(d));
    pack(&q, five, out);
}

/// Q4_1 / Q5_1: scale and minimum from the block's range.
fn with_min(x: &[f32], five: bool, out: &mut Vec<u8>) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let top = if five { 31u8 } else { 15 };
    let d = (max - min) / top as f32;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let q: Vec<u8> = x.iter().map(|&v| (((v - min) * id + 0.5).trunc() as u8).min(top)).collect();
    out.extend(half_bytes(d));
    out.extend(half_bytes(min));
    pack(&q, five, out);
}

/// Nibbles (elements 0..16 low, 16..32 high), after the fifth bits when `five`.
fn pack(q: &[u8], five: bool, out: &mut Vec<u8>) {
    if five {
        let qh = q.iter().enumerate().fold(0u32, |h, (l, &v)| h | (((v >> 4) as u32 & 1) << l));
        out.extend(qh.to_le_bytes());
    }
    out.extend((0..16).map(|l| (q[l] & 0x0f) | (q[l + 16] << 4)));
}
