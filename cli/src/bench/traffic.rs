//! `flux-lite bench traffic`: what the prompt's encoding, a denoising step,
//! a VAE decode and encode, a preview's tiny decode and a whole generation move, and in how many
//! dispatches, on a tier's data path, from the config files alone; beside
//! the roofline those figures allow on an H200.

use super::{shapes, Shapes};
use crate::stdout::say;
use flux_lite_platform::bench::traffic::{self, Traffic, H200};
use flux_lite_platform::pipeline::job::{default_steps_for, generation_passes};
use flux_lite_platform::Precision;

/// Prompt tokens of the step counted: the tokenizer's fixed 512.
const PROMPT_TOKENS: u64 = 512;

pub fn run(model: &str, [width, height]: [u64; 2], tier: Precision) -> Result<(), String> {
    let Shapes { name, transformer, text_encoder, vae, distilled } = shapes(model)?;
    let multiple = 2 * vae.scale_factor() as u64;
    for (flag, side) in [("--width", width), ("--height", height)] {
        if side == 0 || !side.is_multiple_of(multiple) {
            return Err(format!("{flag} {side} is not a positive multiple of {multiple}"));
        }
    }
    let tier_name = if tier == Precision::Auto { Precision::Matrix.name() } else { tier.name() };
    let m = H200;
    let step = traffic::step(&transformer, [width, height], vae.latent_cell() as u64, PROMPT_TOKENS, tier, &m).map_err(|e| e.to_string())?;
    let decode = traffic::vae_decode(&vae, [width, height], tier, &m).map_err(|e| e.to_string())?;
    let encode = traffic::vae_encode(&vae, [width, height], tier, &m).map_err(|e| e.to_string())?;
    let preview = traffic::preview_decode(&vae, [width, height], tier, &m).map_err(|e| e.to_string())?;
    let (prompt, prompt_on_products) = traffic::text_encoder(&text_encoder, PROMPT_TOKENS, tier, &m).map_err(|e| e.to_string())?;
    // As `gen` runs the model by default: its steps, guided unless distilled.
    let steps = default_steps_for(distilled) as u64;
    let generation = traffic::end_to_end(&prompt.total, &step.step, steps, !distilled, &decode.total);
    say!("model shapes: {name}; {width}×{height}: {PROMPT_TOKENS} prompt + {} image tokens; the {tier_name} tier's data path; bf16 weights", step.image_tokens);
    say!("counted from the programs, no GPU: each dispatch's inputs and outputs once, at the width the tier stores them in (re-reads served by caches not counted)");
    say!(
        "roofline on {}: each dispatch at the slower of its FLOPs ({:.0} TFLOP/s on matrix units, {:.1} with FMAs) and its bytes ({:.1} TB/s)",
        m.name,
        m.matrix_flops / 1e12,
        m.fma_flops / 1e12,
        m.bytes_per_second / 1e12
    );
    say!();
    let run = text_encoder.output_layers().into_iter().max().unwrap_or(0);
    let layers = format!("{run} of {} layers", text_encoder.num_hidden_layers);
    say!("text encoder: {} ({PROMPT_TOKENS} tokens, {layers})", line(&prompt.total, m.name));
    say!("{}", waves(&prompt.total, &m));
    if let Some([whole, attention]) = prompt_on_products {
        say!("text encoder, attention as products on the GEMM core (where the flash kernel's check fails): {}", line(&whole, m.name));
        say!("{}", waves(&whole, &m));
        say!("  of which attention: {}", attention_line(&attention));
    }
    say!("step: {}", line(&step.step, m.name));
    say!("{}", waves(&step.step, &m));
    if let Some(t) = step.double_block {
        say!("double block: {} dispatches (budget {}), {} GB moved", t.dispatches, traffic::DOUBLE_BLOCK_DISPATCHES, gb(t.bytes));
    }
    if let Some(t) = step.single_block {
        say!("single block: {} dispatches (budget {}), {} GB moved", t.dispatches, traffic::SINGLE_BLOCK_DISPATCHES, gb(t.bytes));
    }
    if let Some([on_products, attention]) = step.on_products {
        say!("step, attention as products on the GEMM core (where the flash kernel's check fails): {}", line(&on_products, m.name));
        say!("{}", waves(&on_products, &m));
        say!("  of which attention: {}", attention_line(&attention));
        say!("  {}", stacks(&transformer, PROMPT_TOKENS + step.image_tokens, m.max_buffer));
    }
    for (what, t) in [("decode", &decode), ("encode", &encode)] {
        let how = if t.whole { String::new() } else { format!(" (laid out whole; at this size gen {what}s by bands, whose copies are not counted)") };
        say!("vae {what}: {}{how}", line(&t.total, m.name));
        say!("{}", waves(&t.total, &m));
    }
    let share = 100.0 * preview.total.seconds / decode.total.seconds;
    say!("preview decode (a tiny decoder of TAEF2's shape, after a step): {}, {share:.1}% of the VAE decode's roofline", line(&preview.total, m.name));
    let passes = generation_passes(steps, !distilled);
    let how = match distilled {
        true => format!("the prompt's encode, {steps} steps"),
        false => format!("{} encodes (the prompt's and the negative's), {steps} guided steps ({} passes)", passes.encodes, passes.transformer),
    };
    say!("end to end ({how}, the decode): {}", line(&generation, m.name));
    say!("{}", waves(&generation, &m));
    say!();
    by_kind_table("text encoder", &prompt.by_kind);
    say!();
    by_kind_table("step", &step.by_kind);
    say!();
    by_kind_table("vae decode", &decode.by_kind);
    say!();
    by_kind_table("vae encode", &encode.by_kind);
    say!();
    by_kind_table("preview decode", &preview.by_kind);
    Ok(())
}

/// `what`'s traffic as a table, a row for each kind of op.
fn by_kind_table(what: &str, rows: &[(&str, Traffic)]) {
    say!("| {what}, by op | dispatches | GB moved | TFLOP | roofline ms | in whole waves ms |");
    say!("|---|---|---|---|---|---|");
    for (kind, t) in rows {
        say!("| {kind} | {} | {} | {} | {} | {} |", t.dispatches, gb(t.bytes), significant(t.flops as f64 / 1e12), significant(t.seconds * 1e3), significant(t.filled * 1e3));
    }
}

/// `N dispatches, X GB moved, Y TFLOP, roofline Z ms on MACHINE`.
fn line(t: &Traffic, machine: &str) -> String {
    format!("{} dispatches, {} GB moved, {} TFLOP, roofline {} ms on {machine}", t.dispatches, gb(t.bytes), significant(t.flops as f64 / 1e12), significant(t.seconds * 1e3))
}

/// An attention's share of a whole: `N dispatches, X GB moved, roofline Z ms (W ms in whole waves)`.
fn attention_line(t: &Traffic) -> String {
    format!("{} dispatches, {} GB moved, roofline {:.1} ms ({:.1} ms in whole waves)", t.dispatches, gb(t.bytes), t.seconds * 1e3, t.filled * 1e3)
}

/// The roofline again with each product's workgroups in whole waves of the machine's slots.
fn waves(t: &Traffic, m: &traffic::Machine) -> String {
    format!("  in whole waves (each product's workgroups {} at a time, two on each multiprocessor): {} ms", m.workgroup_slots, significant(t.filled * 1e3))
}

/// Bytes in GB (10⁹), as [`significant`] writes them.
fn gb(bytes: u64) -> String {
    significant(bytes as f64 / 1e9)
}

/// Three decimals, or three significant digits below 1 (a tiny model's
/// figures must not read as 0).
fn significant(v: f64) -> String {
    let decimals = if v >= 1.0 || v == 0.0 { 3 } else { (2 - v.log10().floor() as i32) as usize };
    format!("{v:.decimals$}")
}

/// How the attention on products stacks its heads at `tokens` tokens, and
/// how many blocks of the GEMM core (128 rows and columns on an H200's
/// 16×16 tiles) its `P·V` gives a dispatch so, against one head alone.
fn stacks(transformer: &flux_lite_core::config::TransformerConfig, tokens: u64, max_buffer: u64) -> String {
    use flux_lite_core::ir::{head_blocks, HeadsOnProducts, ATTENTION_FILL_BLOCKS, ATTENTION_QUERY_BAND};
    let (heads, d) = (transformer.num_attention_heads as u64, transformer.attention_head_dim as u64);
    let part = HeadsOnProducts::new(tokens, tokens, d, heads, max_buffer);
    let one = head_blocks(tokens.min(ATTENTION_QUERY_BAND), d);
    format!(
        "its P·V in stacks of {} of {heads} heads: {} blocks of 128 × 128 a product, where one head's alone gives {one} ({ATTENTION_FILL_BLOCKS} keep two workgroups on each of an H200's 132 multiprocessors)",
        part.heads,
        part.heads * one
    )
}
