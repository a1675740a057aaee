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
use crate::error::RunError;
use flux_lite_core::plan::{Plan, WeightStrategy};

/// The text encoder with its tokenizer, as one phase loads them.
#[derive(Debug)]
pub struct PromptEncoder {
    pub strategy: WeightStrategy,
    pub tokenizer: PromptTokenizer,
    pub encoder: TextEncoder,
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
pub type VaeKey = (usize, usize, crate::exec::activations::Bands);

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
    text: Option<Slot<WeightStrategy, PromptEncoder>>,
    transformer: Option<Slot<TransformerKey, Transformer>>,
    vae: Option<Slot<VaeKey, VaeDecoder>>,
}

/// A component the pool keeps: what it is laid out for, its name, its slot.
pub trait Keepable: Sized {
    type Key: PartialEq;
    const NAME: &'static str;
    fn slot(kept: &mut Kept) -> &mut Option<Slot<Self::Key, Self>>;
}

impl Keepable for PromptEncoder {
    type Key = WeightStrategy;
    const NAME: &'static str = "text encoder";
    fn slot(kept: &mut Kept) -> &mut Option<Slot<Self::Key, Self>> {
        &mut kept.text
    }
}

impl Keepable for Transformer {
    type Key = TransformerKey;
    const NAME: &'static str = "transformer";
    fn slot(kept: &mut Kept) -> &mut Option<Slot<Self::Key, Self>> {
        &mut kept.transformer
    }
}

impl Keepable for VaeDecoder {
    type Key = VaeKey;
    const NAME: &'static str = "VAE decoder";
    fn slot(kept: &mut Kept) -> &mut Option<Slot<Self::Key, Self>> {
        &mut kept.vae
    }
}

/// A component as [`Kept::get_or_load`] hands it out: kept from an earlier
/// generation, or loaded now.
#[derive(Debug)]
pub struct Got<T> {
    pub value: T,
    pub reused: bool,
}

impl Kept {
    /// The bytes charged for what is kept.
    pub fn cost(&self) -> u64 {
        self.text.as_ref().map_or(0, |s| s.cost) + self.transformer.as_ref().map_or(0, |s| s.cost) + self.vae.as_ref().map_or(0, |s| s.cost)
    }

    /// The names of the kept components, for `--verbose` and the server's log.
    pub fn names(&self) -> Vec<&'static str> {
        let kept = [(self.text.is_some(), PromptEncoder::NAME), (self.transformer.is_some(), Transformer::NAME), (self.vae.is_some(), VaeDecoder::NAME)];
        kept.into_iter().filter(|(held, _)| *held).map(|(_, name)| name).collect()
    }

    /// Drops everything kept unless it and `plan`'s largest phase fit `budget` together.
    pub fn make_room(&mut self, plan: &Plan, budget: Option<u64>) {
        if !fits(self.cost(), plan, budget) {
            *self = Self::default();
        }
    }

    /// The component laid out for `key`: the kept one where its key is
    /// `key` (taken out of the pool until [`Kept::keep`] puts it back), else
    /// `load`'s; a kept one laid out for another key is dropped first, so
    /// the two are never held together.
    pub fn get_or_load<T: Keepable>(&mut self, key: &T::Key, load: impl FnOnce() -> Result<T, RunError>) -> Result<Got<T>, RunError> {
        match take_matching(T::slot(self), key) {
            Some(value) => Ok(Got { value, reused: true }),
            None => Ok(Got { value: load()?, reused: false }),
        }
    }

    /// Keeps `value` (laid out for `key`, charged `cost`) for a later
    /// generation where it and everything kept fit beside `plan`'s largest
    /// phase within `budget`; else drops it.
    pub fn keep<T: Keepable>(&mut self, key: T::Key, value: T, cost: u64, plan: &Plan, budget: Option<u64>) {
        if fits(self.cost() + cost, plan, budget) {
            *T::slot(self) = Some(Slot { key, value, cost });
        }
    }
}

/// Takes `slot`'s value when its key is `key`; drops a value laid out for another key.
fn take_matching<K: PartialEq, T>(slot: &mut Option<Slot<K, T>>, key: &K) -> Option<T> {
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
