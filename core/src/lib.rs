//! flux-lite-core: the portable part of the engine.
//!
//! Model configurations as plain structs, the bump arena that hands out device
//! slices, bf16 helpers, host-side tables (RoPE), and the scalar reference for
//! every GPU op, and the DF11 codec. No I/O, no threads, no wgpu; `no_std`
//! without the `std` feature (the DF11 encoder needs `alloc`).
#![cfg_attr(not(feature = "std"), no_std)]

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod arena;
#[cfg(feature = "alloc")]
pub mod bands;
pub mod bf16;
pub mod config;
pub mod df11;
pub mod plan;
pub mod program;
pub mod reference;
pub mod rng;
pub mod rope;
pub mod schedule;
pub mod tensors;
pub mod text_encoder;
pub mod transformer;
pub mod vae;
pub mod vae_encoder;

pub use arena::{ArenaError, ArenaSlice, BumpArena};
// Config structs expose heapless collections; dependents use the same version.
pub use heapless;
