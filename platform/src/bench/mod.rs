//! Throughput figures, each beside the physical ceiling measured in the same
//! run: DF11 expansion on the host (one thread, all threads) against a plain
//! copy of the same bf16 bytes, and on the device against a buffer copy.

use crate::model::df11::{expand_on_host, Df11DeviceGroup};
use crate::error::GpuError;
use flux_lite_kernels::Gpu;
use flux_lite_core::df11::{Df11Error, Df11GroupBuf};
use flux_lite_core::numerics::rng::TorchGenerator;
use std::time::{Duration, Instant};

pub mod model;
pub mod timer;
pub mod traffic;

pub use model::{Ceilings, Figure, LinearFigures, ShapeBench};
pub use timer::{Clock, Timer};

/// A tiny preview decoder of TAEF2's shape for the VAE `cfg`, decoding a
/// `width × height` image from packed latents to its 8-bit levels laid out
/// whole, as `--preview-decoder` runs it after a step (channels-last where
/// `channels_last`): what `bench kernels` times and `bench traffic` counts.
pub(crate) struct TinyDecode {
    pub shape: flux_lite_core::models::tiny_decoder::TinyDecoderConfig,
    pub program: Vec<flux_lite_core::ir::Op>,
    pub arena_bytes: u64,
}

impl TinyDecode {
    pub(crate) fn taef2(cfg: &flux_lite_core::config::VaeConfig, [width, height]: [u64; 2], channels_last: bool) -> Result<Self, crate::error::RunError> {
        use flux_lite_core::models::tiny_decoder::{TinyDecoderConfig, TinyDecoderError, TinyDecoderLayout};
        let internal = |e: TinyDecoderError| crate::error::RunError::layout("preview decoder")(&e);
        let shape = TinyDecoderConfig::taef2_shape(cfg.latent_channels as u64, cfg.scale_factor() as u64).map_err(internal)?;
        let scale = cfg.scale_factor() as u64;
        let mut arena = flux_lite_core::BumpArena::new(u64::MAX);
        let layout = TinyDecoderLayout::new(&shape, height / scale, width / scale, cfg.batch_norm_eps as f32, channels_last, &mut arena).map_err(internal)?;
        let program = crate::exec::runner::collect_ops(|emit| flux_lite_core::models::tiny_decoder_nhwc::decode_whole(&layout, emit));
        Ok(Self { shape, program, arena_bytes: arena.high_water() })
    }
}

/// What [`df11`] measured. Rates are bytes of bf16 output per second.
#[derive(Debug, Clone, PartialEq)]
pub struct Df11Bench {
    pub elements: u64,
    pub compressed_bytes: u64,
    pub encode: Duration,
    pub host_one_thread: f64,
    pub host_threads: usize,
    pub host_all_threads: f64,
    pub host_copy: f64,
    /// `(decode, copy, bit-exact)` on the device, when one was given.
    pub device: Option<(f64, f64, bool)>,
}

/// bf16 weights distributed like a trained model's: normal, σ = 0.02.
pub fn synthetic_weights(elements: usize, seed: u64) -> Vec<u16> {
    let mut x = vec![0f32; elements];
    TorchGenerator::new(seed).fill_randn_f32(&mut x);
    x.iter().map(|&v| flux_lite_core::numerics::bf16::from_f32(v * 0.02)).collect()
}

/// The shortest of `repeats` runs of `f`.
fn best(repeats: usize, mut f: impl FnMut() -> Result<(), BenchError>) -> Result<Duration, BenchError> {
    let mut fastest = Duration::MAX;
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        f()?;
        fastest = fastest.min(t.elapsed());
    }
    Ok(fastest)
}

fn rate(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64().max(1e-9)
}

#[derive(Debug)]
pub enum BenchError {
    Df11(Df11Error),
    Gpu(GpuError),
}

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BenchError::Df11(e) => write!(f, "DF11: {e}"),
            BenchError::Gpu(e) => e.fmt(f),
        }
    }
}

impl From<Df11Error> for BenchError {
    fn from(e: Df11Error) -> Self {
        BenchError::Df11(e)
    }
}

impl From<GpuError> for BenchError {
    fn from(e: GpuError) -> Self {
        BenchError::Gpu(e)
    }
}

/// Compresses `weights` into one group, then times its expansion `repeats` times each way.
pub fn df11(weights: &[u16], gpu: Option<&Gpu>, repeats: usize) -> Result<Df11Bench, BenchError> {
    let t = Instant::now();
    let buf = Df11GroupBuf::encode(&[weights])?;
    let encode = t.elapsed();
    let group = buf.group()?;
    let bytes = 2 * weights.len() as u64;
    let mut out = vec![0u16; weights.len()];
    let one = best(repeats, || Ok(group.decode_into(&mut out)?))?;
    let all = best(repeats, || Ok(expand_on_host(&group, &mut out)?))?;
    let mut copy = vec![0u16; weights.len()];
    let host_copy = best(repeats, || {
        copy.copy_from_slice(std::hint::black_box(&out));
        Ok(())
    })?;
    let device = match gpu {
        None => None,
        Some(gpu) => {
            let on_device = Df11DeviceGroup::upload(gpu, &group);
            let slot = gpu.storage("df11 bench slot", bytes);
            let copy_dst = gpu.storage("df11 bench copy", bytes);
            let copy_bytes = bytes.div_ceil(4) * 4;
            let mut prepared = Vec::new();
            on_device.record_decode(gpu, &mut prepared, &slot, 0)?;
            let decode = || -> Result<(), BenchError> {
                gpu.submit(|enc| {
                    flux_lite_kernels::encode(enc, &prepared);
                    Ok(())
                })?;
                Ok(gpu.wait()?)
            };
            decode()?;
            let t_decode = best(repeats, decode)?;
            let t_copy = best(repeats, || {
                gpu.submit(|enc| {
                    enc.copy_buffer_to_buffer(&slot, 0, &copy_dst, 0, copy_bytes);
                    Ok(())
                })?;
                Ok(gpu.wait()?)
            })?;
            let back = gpu.read_bytes(&slot, 0, bytes)?;
            let exact = back.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).eq(weights.iter().copied());
            Some((rate(bytes, t_decode), rate(bytes, t_copy), exact))
        }
    };
    Ok(Df11Bench {
        elements: weights.len() as u64,
        compressed_bytes: buf.total_bytes() as u64,
        encode,
        host_one_thread: rate(bytes, one),
        host_threads: rayon::current_num_threads(),
        host_all_threads: rate(bytes, all),
        host_copy: rate(bytes, host_copy),
        device,
    })
}
