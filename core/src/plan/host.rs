//! The host side of the plan: the bytes the engine itself allocates in the
//! process's memory during each phase, beside the phase's device bytes.
//! The budget bounds their sum, as one memory does on Apple Silicon.
//!
//! Counted: the tokenizer, upload staging ([`staging`]), the prompt
//! embeddings, the noise and latents, the reference images and their
//! tokens, RoPE tables built on the host, and the decoded image on its way
//! to 8-bit RGB. Not counted, because the engine does not allocate them:
//! the memory-mapped weight files (page cache the OS reclaims), the VAE's
//! scratch file in bands (file pages the OS can write out), the driver's
//! own footprint and compiled pipelines, and the program's code.

use crate::config::Qwen3Config;
use super::{latent_grid, reference_tokens, PlanError, PlanInput, UPLOAD_STAGING};

/// Host staging of the phase's uploads: [`UPLOAD_STAGING`] in flight and,
/// as measured on lavapipe, up to as much again that the allocators keep
/// from the batch before until it is reused (a synthetic 136 MiB model
/// loaded resident held 15 MiB more with 16 MiB of staging than with 8);
/// never more than the phase puts on the device.
pub fn staging(device: u64) -> u64 {
    device.min(2 * UPLOAD_STAGING)
}

/// Host bytes of the prompt embeddings: the prompt's and, when guidance
/// runs, the empty prompt's (counted always: the planner does not know).
fn embeddings(input: &PlanInput<'_>) -> u64 {
    let width = input.text_encoder.hidden_size as u64 * input.text_encoder.output_layers().len() as u64;
    2 * 4 * input.prompt_tokens * width
}

/// The reference images as prepared (f32 RGB), held for the whole run.
fn reference_pixels(input: &PlanInput<'_>) -> u64 {
    input.references.iter().map(|&(w, h)| 4 * 3 * w * h).sum()
}

/// The reference images' tokens, held from their encode to the end of the denoising.
fn reference_token_bytes(input: &PlanInput<'_>) -> Result<u64, PlanError> {
    Ok(4 * reference_tokens(input)? * input.transformer.in_channels as u64)
}

/// One set of packed latents `[image tokens, channels]`.
fn latent_bytes(input: &PlanInput<'_>) -> Result<u64, PlanError> {
    let (h, w) = latent_grid(input)?;
    Ok(4 * h * w * input.transformer.in_channels as u64)
}

/// The text encoder's phase: the tokenizer, the prompt's embedding rows
/// gathered from the mapped table, the RoPE tables, `kept` embeddings read back.
pub fn text_encoder(c: &Qwen3Config, tokens: u64, tokenizer_bytes: u64, kept: u64) -> u64 {
    let rows = 4 * tokens * c.hidden_size as u64;
    let tables = 2 * 4 * tokens * c.head_dim as u64;
    let embedding = 4 * tokens * c.hidden_size as u64 * c.output_layers().len() as u64;
    tokenizer_bytes + rows + tables + kept * embedding
}

/// The text encoder's phase of a run: both prompts' embeddings (see
/// [`embeddings`]), with the reference images already prepared.
pub(super) fn encode(input: &PlanInput<'_>) -> u64 {
    text_encoder(input.text_encoder, input.prompt_tokens, input.tokenizer_bytes, 2) + reference_pixels(input)
}

/// The transformer's phase: the embeddings, the noise, the latents read
/// back, the reference tokens, and the RoPE tables of every token.
pub(super) fn denoise(input: &PlanInput<'_>) -> Result<u64, PlanError> {
    let c = input.transformer;
    let (h, w) = latent_grid(input)?;
    let rows = input.prompt_tokens + h * w + reference_tokens(input)?;
    let tables = 2 * 4 * rows * c.attention_head_dim as u64;
    Ok(embeddings(input) + 2 * latent_bytes(input)? + reference_token_bytes(input)? + reference_pixels(input) + tables)
}

/// The VAE encoder's phase, its costliest reference in one pass (`band:
/// None`) or by bands (`band`: the arena), whose operands and result the
/// host copies in and out, together at most the arena.
pub(super) fn references(input: &PlanInput<'_>, band: Option<u64>) -> u64 {
    let bands = band.unwrap_or(0);
    // The sizes were checked when the encoder's layouts were.
    embeddings(input) + reference_token_bytes(input).unwrap_or(0) + reference_pixels(input) + bands
}

/// The VAE decode's phase. Untiled: the latents, the levels computed on the
/// device read back once (a byte a value), and the interleaved RGB, 6 bytes
/// a pixel. In bands (`band`: the arena): the decoded values stay in the
/// scratch file; the host copies one band's operands and result (together
/// at most the arena), then reads the levels out of it and holds them and
/// the RGB bytes.
pub(super) fn decode(input: &PlanInput<'_>, band: Option<u64>) -> u64 {
    let pixels = input.width.saturating_mul(input.height);
    decode_image(input, match band {
        None => (3 + 3) * pixels,
        Some(arena) => arena + (3 + 3) * pixels,
    })
}

/// The same by bands with the activations on the device: the levels read
/// back (3 bytes a pixel) with one page's read of them in flight (at most 3
/// more), and the RGB bytes. A run asks for no decoded values.
pub(super) fn decode_device_bands(input: &PlanInput<'_>) -> u64 {
    decode_image(input, (3 + 3 + 3) * input.width.saturating_mul(input.height))
}

/// The decode's host bytes around `image`: the latents and the reference pixels.
fn decode_image(input: &PlanInput<'_>, image: u64) -> u64 {
    // The size was checked when the decoder's layouts were.
    latent_bytes(input).unwrap_or(0) + reference_pixels(input) + image
}
