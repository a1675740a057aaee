//! `--lora FILE[:SCALE]` as `gen`, `info` and `serve` read it.

use flux_lite_platform::model::lora::{LoraSet, LoraSpec};
use std::sync::Arc;

/// Unmatched LoRA keys `--verbose` lists.
const UNMATCHED_LISTED: usize = 10;

pub fn parse_lora(arg: &str) -> Result<LoraSpec, String> {
    LoraSpec::parse(arg).map_err(|e| format!("--lora {e}"))
}

/// Reads and checks the adapters before any work: one line each with
/// `verbose`, a warning for keys left unused (listed with `verbose`).
pub fn open_lora(specs: &[LoraSpec], config: &flux_lite_core::config::TransformerConfig, verbose: bool) -> Result<Arc<LoraSet>, String> {
    let set = LoraSet::open(specs, config).map_err(|e| e.to_string())?;
    for lora in &set.adapters {
        if verbose {
            eprintln!("lora: {}", lora.summary());
        }
        if lora.text_encoder_keys > 0 {
            eprintln!("warning: LoRA {}: {} text-encoder keys are not supported and were skipped", lora.spec.path.display(), lora.text_encoder_keys);
        }
        if !lora.unmatched.is_empty() {
            let listed = if verbose {
                let first: Vec<&str> = lora.unmatched.iter().take(UNMATCHED_LISTED).map(String::as_str).collect();
                format!(": {}", first.join(", "))
            } else {
                " (--verbose lists them)".to_string()
            };
            eprintln!(
                "warning: LoRA {}: adapted {} modules; {} keys matched no module of this transformer{listed}",
                lora.spec.path.display(),
                lora.modules(),
                lora.unmatched.len()
            );
        }
    }
    Ok(set)
}
