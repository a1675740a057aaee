//! The model's components on the GPU: each lays out its arena, uploads or
//! streams its weights, and runs its core program through the interpreter.

pub mod text_encoder;
pub mod tiny_decoder;
pub mod transformer;
pub mod vae;
pub mod vae_encoder;
