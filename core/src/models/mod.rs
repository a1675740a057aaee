//! Each model as an Op program over arena slices: what its blocks compute,
//! in order, with the tensors they read (`tensors`: the official names).

pub mod group_norm;
pub mod tensors;
pub mod text_encoder;
pub mod tiny_decoder;
pub mod tiny_decoder_nhwc;
pub mod transformer;
pub mod vae;
pub mod vae_encoder;
pub mod vae_encoder_nhwc;
pub mod vae_nhwc;
