//! Numbers that must match torch and diffusers bit for bit: bf16 rounding,
//! torch's CPU generator, the flow-matching schedule, RoPE tables.

pub mod bf16;
pub mod f16;
pub mod rng;
pub mod rope;
pub mod schedule;
