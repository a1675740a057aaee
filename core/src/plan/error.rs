//! Why a plan is refused, and the device and host sides of a figure.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanError {
    /// The size cannot be laid out at all (not a multiple of the latent cell, or beyond 64 bits).
    Size(&'static str),
    /// A reference image needs a larger buffer or binding than the adapter allows.
    ReferenceTooLarge { width: u64, height: u64, bytes: u64, limit: u64 },
    /// One row of the VAE decode's widest convolution exceeds what the adapter can bind, in any tile.
    VaeTooWide { width: u64, bytes: u64, limit: u64 },
    /// One row of the preview decoder's widest convolution exceeds what the adapter can bind, in any tile.
    PreviewTooWide { width: u64, bytes: u64, limit: u64 },
    /// The transformer's attention keys (all tokens, one binding) exceed the adapter's binding.
    AttentionTooLarge { tokens: u64, bytes: u64, limit: u64 },
    /// Every layout of `phase`'s activation arena (one device buffer) is larger
    /// than the adapter's largest buffer; `bytes`: the smallest of them.
    ArenaTooLarge { phase: &'static str, bytes: u64, limit: u64 },
    /// A forced VAE tile that is not a positive multiple of the latent cell (`unit` pixels).
    VaeTileSize { tile: u64, unit: u64 },
    /// A forced VAE tile whose band cannot hold one row of `what`'s widest convolution.
    VaeTileTooSmall { tile: u64, what: &'static str },
    /// No strategy of `phase` fits the budget; `minimum` is the smallest
    /// budget that works for the run, `device` and `host` its two sides (in
    /// the phase that needs it).
    TooSmall { budget: u64, phase: &'static str, minimum: u64, device: u64, host: u64 },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Size(why) => f.write_str(why),
            PlanError::AttentionTooLarge { tokens, bytes, limit } => write!(
                f,
                "the transformer's attention over {tokens} tokens binds {bytes} bytes of keys at once, above the adapter's limit of {limit} bytes; use a smaller size or fewer reference images"
            ),
            PlanError::VaeTooWide { width, bytes, limit } => write!(
                f,
                "the VAE cannot decode a {width}-pixel-wide image on this adapter: one row of its widest convolution needs {bytes} bytes, above the adapter's binding of {limit} bytes; use a smaller width"
            ),
            PlanError::PreviewTooWide { width, bytes, limit } => write!(
                f,
                "one row of the preview decoder's widest convolution at {width} pixels wide needs {bytes} bytes, above the adapter's binding of {limit} bytes; preview without a preview decoder, or use a smaller width"
            ),
            PlanError::ReferenceTooLarge { width, height, bytes, limit } => write!(
                f,
                "encoding a {width}×{height} reference image needs a {bytes}-byte buffer, above the adapter's limit of {limit} bytes"
            ),
            PlanError::ArenaTooLarge { phase, bytes, limit } => write!(
                f,
                "{phase} needs an activation buffer of at least {bytes} bytes at this size, above the adapter's largest buffer of {limit} bytes; use a smaller size or fewer reference images"
            ),
            PlanError::VaeTileSize { tile, unit } => write!(f, "the VAE tile {tile} is not a positive multiple of {unit} pixels"),
            PlanError::VaeTileTooSmall { tile, what } => write!(
                f,
                "a {tile}-pixel VAE tile cannot hold one row of {what}'s widest convolution on this adapter; use a larger tile or none"
            ),
            PlanError::TooSmall { budget, phase, minimum, device, host } => write!(
                f,
                "a budget of {} is too small ({phase} needs more); the smallest budget that works for this size is {} ({minimum} B): {}",
                Bytes(*budget),
                Bytes(*minimum),
                Sides(*device, *host)
            ),
        }
    }
}

/// The two sides of a minimum, as the refusal words them.
#[derive(Debug, Clone, Copy)]
pub struct Sides(pub u64, pub u64);

impl fmt::Display for Sides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on the device and {} on the host", Bytes(self.0), Bytes(self.1))
    }
}
