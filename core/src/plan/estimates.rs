//! Weight sizes estimated from a config alone (`flux-lite info` on a folder
//! of config files), every weight bf16 and DF11 groups at
//! [`DF11_ESTIMATE_PERCENT`] of their bf16 bytes.

use super::{BlockWeights, WeightSizes, DF11_ESTIMATE_PERCENT, SLOT_ALIGN};
use crate::config::{Qwen3Config, TransformerConfig, VaeConfig};
use crate::df11::layout::{self, GroupPattern};
use crate::models::tensors::{self, TensorSpec};
use crate::models::{vae, vae_encoder};

/// Calls its argument with every tensor spec of a component.
pub type SpecSource<'a> = dyn FnMut(&mut dyn FnMut(&TensorSpec)) + 'a;

/// Weight sizes of a component from its tensor specs, every weight bf16,
/// grouped as `groups` says with compressed sizes estimated at
/// [`DF11_ESTIMATE_PERCENT`] (`df11: false`: a plain bf16 model). `block_of`
/// maps a tensor name to its block; `blocks` is the number of blocks.
pub fn estimate_weights(
    specs: &mut SpecSource<'_>,
    groups: &[GroupPattern],
    df11: bool,
    blocks: usize,
    block_of: &dyn Fn(&str) -> Option<usize>,
) -> WeightSizes {
    const MAX_BLOCKS: usize = 256;
    let mut per_block = [BlockWeights::default(); MAX_BLOCKS];
    specs(&mut |s: &TensorSpec| {
        let Some(b) = block_of(&s.name).filter(|&b| b < blocks.min(MAX_BLOCKS)) else { return };
        let bytes = 2 * s.shape.iter().product::<usize>() as u64;
        // Each weight takes its own aligned place in a slot.
        if df11 && layout::grouped(groups, &s.name) {
            per_block[b].grouped += bytes.next_multiple_of(SLOT_ALIGN);
            per_block[b].compressed += bytes * DF11_ESTIMATE_PERCENT / 100;
        } else {
            per_block[b].plain += bytes.next_multiple_of(SLOT_ALIGN);
        }
    });
    let mut sizes = WeightSizes::default();
    for b in per_block.iter_mut().take(blocks.min(MAX_BLOCKS)) {
        // A block's grouped weights are one group (the layouts group per
        // block); its five arrays each start on an aligned offset.
        if b.compressed > 0 {
            b.largest_group = b.compressed + 5 * SLOT_ALIGN;
        }
        sizes.add_block(*b);
    }
    sizes
}

/// Bytes of the tokenizer.json FLUX.2-klein ships (Qwen3's, about 11.4 MB),
/// for plans made without the file.
pub const TOKENIZER_FILE_BYTES: u64 = 11_422_654;

/// Host bytes loading a tokenizer takes per byte of its tokenizer.json,
/// rounded up from the peak measured while loading a Qwen3-sized one: 157.8
/// MiB of anonymous memory for an 11.0 MiB file (14.3×; 91 MiB stay held).
pub const TOKENIZER_BYTES_PER_FILE_BYTE: u64 = 15;

/// Host bytes of a tokenizer loaded from a tokenizer.json of `file_bytes`.
pub fn tokenizer_bytes(file_bytes: u64) -> u64 {
    file_bytes * TOKENIZER_BYTES_PER_FILE_BYTE
}

/// A component's size as its files would hold it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ComponentBytes {
    pub parameters: u64,
    /// Every weight as bf16.
    pub bf16: u64,
    /// Grouped weights compressed (estimated at [`DF11_ESTIMATE_PERCENT`]), the rest bf16.
    pub df11: u64,
}

/// The bf16 and estimated DF11 bytes of every tensor `specs` names, grouped as `groups` says.
pub fn component_bytes(specs: &mut SpecSource<'_>, groups: &[GroupPattern]) -> ComponentBytes {
    let mut total = ComponentBytes::default();
    specs(&mut |s: &TensorSpec| {
        let parameters = s.shape.iter().product::<usize>() as u64;
        total.parameters += parameters;
        total.bf16 += 2 * parameters;
        total.df11 += if layout::grouped(groups, &s.name) { 2 * parameters * DF11_ESTIMATE_PERCENT / 100 } else { 2 * parameters };
    });
    total
}

/// The transformer's weight sizes by program block (prologue, doubles, singles, epilogue), estimated from the config.
pub fn transformer_weights(c: &TransformerConfig, df11: bool) -> WeightSizes {
    let (doubles, singles) = (c.num_layers, c.num_single_layers);
    let block_of = |name: &str| -> Option<usize> {
        let index = |rest: &str| rest.split('.').next().and_then(|n| n.parse::<usize>().ok());
        if let Some(rest) = name.strip_prefix("transformer_blocks.") {
            index(rest).map(|i| 1 + i)
        } else if let Some(rest) = name.strip_prefix("single_transformer_blocks.") {
            index(rest).map(|i| 1 + doubles + i)
        } else if name.starts_with("proj_out.") {
            Some(1 + doubles + singles)
        } else {
            // The embedders and every modulation, `norm_out`'s included, run in the prologue.
            Some(0)
        }
    };
    estimate_weights(&mut |sink| tensors::transformer(c, sink), layout::TRANSFORMER_GROUPS, df11, doubles + singles + 2, &block_of)
}

/// The text encoder's weight sizes by block (prologue, then the layers up
/// to the deepest picked state), estimated from the config. The embedding
/// table stays on the host.
pub fn text_encoder_weights(c: &Qwen3Config, df11: bool) -> WeightSizes {
    let layers = c.output_layers().into_iter().max().unwrap_or(0).min(c.num_hidden_layers);
    let block_of = |name: &str| -> Option<usize> {
        if let Some(rest) = name.strip_prefix("model.layers.") {
            rest.split('.').next().and_then(|n| n.parse::<usize>().ok()).filter(|&i| i < layers).map(|i| 1 + i)
        } else if name == "model.norm.weight" {
            // Read by the last layer run only when the last hidden state is picked.
            (layers == c.num_hidden_layers).then_some(layers)
        } else {
            None
        }
    };
    estimate_weights(&mut |sink| tensors::text_encoder(c, sink), layout::TEXT_ENCODER_GROUPS, df11, layers + 1, &block_of)
}

/// The VAE encoder's weight bytes (bf16), estimated from the config.
pub fn vae_encoder_weights(c: &VaeConfig) -> u64 {
    vae_weights(c, &vae_encoder::WEIGHTS)
}

/// The VAE decoder's weight bytes (bf16), estimated from the config.
pub fn vae_decoder_weights(c: &VaeConfig) -> u64 {
    vae_weights(c, &vae::DECODER_WEIGHTS)
}

/// Bytes of the VAE's bf16 tensors whose names start with one of `prefixes`.
fn vae_weights(c: &VaeConfig, prefixes: &[&str]) -> u64 {
    let mut bytes = 0;
    tensors::vae(c, |s| {
        if prefixes.iter().any(|p| s.name.starts_with(p)) {
            // Each weight is its own buffer, a whole number of 4-byte words.
            bytes += (2 * s.shape.iter().product::<usize>() as u64).next_multiple_of(4);
        }
    });
    bytes
}
