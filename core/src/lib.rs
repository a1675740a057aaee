//! flux-lite-core: the model's math, portable.
//!
//! - `config`: architectures as plain structs; `ir`: the Op program a block
//!   runs; `models`: the transformer, text encoder and VAE as Op programs.
//! - `plan`: the memory planner (pure arithmetic); `arena`: the bump arena.
//! - `numerics`: bf16, torch's generator, the schedule, RoPE tables.
//! - `oracle`: the scalar f64 reference every GPU kernel is tested against.
//! - `df11`: the DFloat11 codec; `ggml`: GGUF tensor types and their block
//!   sizes.
//!
//! No I/O, no threads, no wgpu; `no_std` without the `std` feature (the DF11
//! encoder needs `alloc`).
#![cfg_attr(not(feature = "std"), no_std)]

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod arena;
pub mod bytes;
pub mod config;
pub mod df11;
pub mod ggml;
pub mod ir;
pub mod models;
pub mod numerics;
pub mod oracle;
pub mod plan;
pub mod preview;
pub mod tolerance;

pub use arena::{ArenaError, ArenaSlice, BumpArena};
// Config structs expose heapless collections; dependents use the same version.
pub use heapless;
