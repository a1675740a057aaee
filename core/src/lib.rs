//! flux-lite-core: the portable part of the engine.
//!
//! Model configurations as plain structs, the bump arena that hands out device
//! slices, bf16 helpers, host-side tables (RoPE), and the scalar reference for
//! every GPU op. No I/O, no threads, no wgpu; `no_std` without the `std`
//! feature.
#![cfg_attr(not(feature = "std"), no_std)]

pub mod arena;
pub mod bf16;
pub mod config;
pub mod program;
pub mod reference;
pub mod rng;
pub mod rope;
pub mod schedule;
pub mod tensors;
pub mod text_encoder;
pub mod transformer;
pub mod vae;

pub use arena::{ArenaError, ArenaSlice, BumpArena};
// Config structs expose heapless collections; dependents use the same version.
pub use heapless;
