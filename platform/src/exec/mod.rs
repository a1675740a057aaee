//! Running core's Op programs on the GPU: the interpreter (`runner`), the
//! same programs band by band for images larger than the VAE's memory
//! (`vae_bands`, which rewrites each op into band ops run by the
//! interpreter, with the whole image's activations where `activations`
//! keeps them: a host scratch file or device buffers), and the weights on the device (`device_weights`:
//! resident, DF11-resident or streamed).

pub mod activations;
pub mod device_weights;
pub mod runner;
pub mod vae_bands;
