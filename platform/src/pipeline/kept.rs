//! What a pipeline keeps loaded between generations when it was opened with
//! `Options::keep_loaded` (a server, a REPL): each component after its
//! phase, while everything kept and the request's largest phase still fit
//! the budget together. Each kept component is charged its phase's planned
//! peak (weights, activations and host bytes): an upper bound, so a kept
//! component never lets a later phase exceed the budget.

use crate::components::text_encoder::TextEncoder;
use crate::components::transformer::{LatentGrids, Transformer};
use crate::components::vae::VaeDecoder;
use crate::model::tokenizer::PromptTokenizer;
use flux_lite_core::plan::{Plan, WeightStrategy};

/// The text encoder with its tokenizer, as one phase loads them.
#[derive(Debug)]
pub struct PromptEncoder {
    pub strategy: WeightStrategy,
    pub tokenizer: PromptTokenizer,
    pub encoder: TextEncoder,
    /// The warning naming the text encoder's unread tensors, when there are any.
    pub unread: Option<String>,
}

/// What a transformer was laid out for: a kept one serves a request with the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransformerKey {
    pub strategy: WeightStrategy,
    pub chunk: Option<usize>,
    pub grids: LatentGrids,
    /// The LoRA adapters added: each file with its scale's bits.
    pub lora: Vec<(std::path::PathBuf, u32)>,
}

/// What a VAE decoder was laid out for: `(width, height, layout)`.
pub type VaeKey = (usize, usize, crate::run::activations::Bands);

/// A kept component, its key and what it is charged.
#[derive(Debug)]
pub struct Slot<K, T> {
    pub key: K,
    pub value: T,
    pub cost: u64,
}

/// The components kept between generations; empty unless the pipeline keeps them.
#[derive(Debug, Default)]
pub struct Kept {
    pub text: Option<Slot<WeightStrategy, PromptEncoder>>,
    pub transformer: Option<Slot<TransformerKey, Transformer>>,
    pub vae: Option<Slot<VaeKey, VaeDecoder>>,
}

impl Kept {
    /// The bytes charged for what is kept.
    pub fn cost(&self) -> u64 {
        self.text.as_ref().map_or(0, |s| s.cost) + self.transformer.as_ref().map_or(0, |s| s.cost) + self.vae.as_ref().map_or(0, |s| s.cost)
    }

    /// The names of the kept components, for `--verbose` and the server's log.
    pub fn names(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.text.is_some() {
            out.push("text encoder");
        }
        if self.transformer.is_some() {
            out.push("transformer");
        }
        if self.vae.is_some() {
            out.push("VAE decoder");
        }
        out
    }

    /// Drops everything kept unless it and `plan`'s largest phase fit `budget` together.
    pub fn make_room(&mut self, plan: &Plan, budget: Option<u64>) {
        if !fits(self.cost(), plan, budget) {
            *self = Self::default();
        }
    }

    /// Whether a component charged `cost` may be kept beside the others.
    pub fn has_room(&self, cost: u64, plan: &Plan, budget: Option<u64>) -> bool {
        fits(self.cost() + cost, plan, budget)
    }
}

/// Takes `slot`'s value when its key is `key`; drops a value laid out for another key.
pub fn take_matching<K: PartialEq, T>(slot: &mut Option<Slot<K, T>>, key: &K) -> Option<T> {
    match slot.take() {
        Some(s) if &s.key == key => Some(s.value),
        _ => None,
    }
}

fn fits(kept: u64, plan: &Plan, budget: Option<u64>) -> bool {
    budget.is_none_or(|b| kept.saturating_add(plan.peak()) <= b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_taken_only_for_its_own_key_and_emptied_either_way() {
        let mut slot = Some(Slot { key: (32usize, 32usize, None::<u64>), value: "decoder", cost: 5 });
        assert_eq!(take_matching(&mut slot, &(64, 32, None)), None);
        assert!(slot.is_none(), "a decoder laid out for another size is dropped, not kept beside the new one");
        let mut slot = Some(Slot { key: (32usize, 32usize, None::<u64>), value: "decoder", cost: 5 });
        assert_eq!(take_matching(&mut slot, &(32, 32, None)), Some("decoder"));
        assert!(slot.is_none());
    }
}
