//! A tiny decoder for previews on the GPU (`--preview-decoder`): the file's
//! weights and the VAE's BatchNorm statistics uploaded once, then any
//! number of decodes of the transformer's packed latents into 8-bit RGB:
//! the whole image in one arena, core's program recorded once for the
//! run's image size, or, when the plan gives it bands (an image whose
//! activations the adapter cannot bind, or a budget too tight for them),
//! the same program run op by op over bands of rows
//! ([`crate::exec::vae_bands`], as the VAE decodes a large image) in an
//! arena fixed by the tile, the whole image's activations kept on the
//! device where the budget holds them, else in a host scratch file. Where
//! the device's products take f16 inputs (the matrix tier) the program is
//! the channels-last one (`tiny_decoder_nhwc`), as the VAE's decode there.

use crate::components::vae::{arena_runner, interleave_rgb, pack_products, planar, upload_checked};
use crate::error::RunError;
use crate::model::safetensors_store::{TensorRef, WeightStore};
use crate::exec::device_weights::{DeviceWeight, DeviceWeights};
use crate::exec::runner::{collect_ops, Runner};
use crate::exec::activations::{Activations, BandActivations, Bands};
use crate::exec::vae_bands::BandRunner;
use flux_lite_core::config::VaeConfig;
use flux_lite_core::models::tiny_decoder::{self as program, TinyDecoderLayout};
use flux_lite_core::models::tiny_decoder_nhwc::decode_whole;
use flux_lite_core::models::vae::band_arena_bytes;
use flux_lite_core::BumpArena;
use flux_lite_kernels::{Dispatch, Gpu};

pub use crate::model::tiny_decoder_file::TinyDecoderFile;

/// Device bytes of a tiny decoder's weights' row scales, where the device keeps them.
pub fn row_scale_bytes(file: &TinyDecoderFile) -> u64 {
    crate::components::vae::row_scale_bytes(&file.product_rows())
}

/// How the image is decoded.
#[derive(Debug)]
enum Mode {
    /// In one pass, the program recorded once over the whole image's layout.
    Whole { dispatches: Vec<Dispatch> },
    /// Op by op over bands whose operands take at most `capacity` f32, the
    /// whole image's activations in `activations` (device pages: the plan
    /// counts them beside the transformer).
    Banded { capacity: u64, activations: BandActivations },
}

/// A tiny decoder laid out for one image size, its program recorded once
/// or run by bands.
#[derive(Debug)]
pub struct TinyDecoder {
    /// The whole image's layout (the host's scratch arena when banded).
    layout: TinyDecoderLayout,
    runner: Runner,
    weights: DeviceWeights,
    mode: Mode,
}

impl TinyDecoder {
    /// Keeps a decode by bands on the host in a scratch file in `dir` (else
    /// the OS's temporary folder).
    pub fn in_scratch(mut self, dir: &std::path::Path) -> Self {
        if let Mode::Banded { activations, .. } = &mut self.mode {
            activations.in_folder(dir);
        }
        self
    }

    /// Uploads `file`'s weights and the VAE's BatchNorm statistics (from
    /// `vae_store`) and lays out the decode of a `width × height` image as
    /// `bands` says (the plan's choice, [`Self::layouts`]): whole, recorded
    /// once, or by bands in the arena a tile's square would take whole (and
    /// no more than one binding).
    #[allow(clippy::too_many_arguments)] // the decoder, the VAE, the image and its layout
    pub fn new(gpu: &Gpu, file: &TinyDecoderFile, vae: &VaeConfig, vae_store: &WeightStore, width: usize, height: usize, bands: Bands) -> Result<Self, RunError> {
        file.check_fits(vae)?;
        let (lat_h, lat_w) = file.latent(vae, width, height);
        let side = width.max(height) as u64;
        let banded = bands.banded(side);
        let channels_last = gpu.plan_limits().half_operands;
        if banded.is_none() {
            // Checked by the plan's layouts; here for a caller without a plan.
            file.layouts(width, height, 0, gpu.plan_limits(), None)?.first().filter(|l| l.tile.is_none()).ok_or_else(|| {
                RunError::Layout { component: "preview decoder", detail: format!("{width}×{height} in one pass does not fit this adapter; the plan bands it") }
            })?;
        }
        let mut arena = BumpArena::new(u64::MAX);
        let layout = TinyDecoderLayout::new(&file.config, lat_h, lat_w, vae.batch_norm_eps as f32, channels_last, &mut arena).map_err(plan_error)?;
        let (bytes, capacity) = match banded {
            None => (arena.high_water(), 0),
            Some((t, _)) => {
                let capacity = program::band_capacity(&file.config, t / file.config.scale(), gpu.max_binding(), channels_last).map_err(plan_error)?;
                (band_arena_bytes(capacity), capacity)
            }
        };
        let runner = arena_runner(gpu, "preview decoder activations", [bytes, 0]);
        gpu.check_faults()?;
        let mut weights = upload_checked(gpu, vae_store, &crate::components::vae::specs_under(vae, &["bn.running_"]))?;
        // Channels-last, each 3×3 W's taps in the order A runs in (`DeviceWeight::upload_taps_last`).
        let upload = if channels_last { DeviceWeight::upload_taps_last } else { DeviceWeight::upload };
        let mut missing = None;
        file.config.tensors(|t| {
            if missing.is_some() {
                return;
            }
            let uploaded = if t.zero {
                // In its W's dtype as uploaded (bf16 stays bf16, f16 and f32 become f32): a convolution reads both alike.
                let weight = t.name.as_str().strip_suffix(".bias").map(|m| format!("{m}.weight"));
                let bf16 = weight.and_then(|w| file.store.tensor(&w).ok()).is_some_and(|w| w.dtype == safetensors::Dtype::BF16);
                let (dtype, width) = if bf16 { (safetensors::Dtype::BF16, 2) } else { (safetensors::Dtype::F32, 4) };
                let count = t.shape.iter().product::<u64>() as usize;
                let zeros = vec![0u8; width * count];
                DeviceWeight::upload(gpu, "preview decoder", &t.name, TensorRef { dtype, shape: &[count], bytes: &zeros })
            } else {
                file.store.tensor(&t.name).and_then(|r| upload(gpu, "preview decoder", &t.name, r))
            };
            match uploaded {
                Ok(w) => weights.insert(&t.name, w),
                Err(e) => missing = Some(e),
            }
        });
        if let Some(e) = missing {
            return Err(e.into());
        }
        weights.keep_row_scales(gpu, &file.product_rows())?;
        let program = collect_ops(|emit| decode_whole(&layout, emit));
        if channels_last {
            pack_products(gpu, &mut weights, &program)?;
        }
        let mode = match banded {
            None => {
                let mut dispatches = Vec::new();
                for op in &program {
                    runner.record(gpu, &mut dispatches, &weights, op)?;
                }
                Mode::Whole { dispatches }
            }
            Some((_, on_device)) => {
                let elements = program::arena_bytes(&file.config, lat_h, lat_w, channels_last).map_err(plan_error)? / 4;
                Mode::Banded { capacity, activations: BandActivations::new(gpu, elements, on_device)? }
            }
        };
        Ok(Self { layout, runner, weights, mode })
    }

    /// Whether the image is decoded by bands.
    pub fn is_banded(&self) -> bool {
        matches!(self.mode, Mode::Banded { .. })
    }

    /// Whether it runs the channels-last program (f16 activations: the
    /// matrix tier's half-precision data path).
    pub fn is_channels_last(&self) -> bool {
        self.layout.channels_last
    }

    /// How many of its weights its products read packed as f16 (on the
    /// matrix tier's f16 tiles, every convolution's W).
    pub fn packed_weights(&self) -> usize {
        self.weights.half_packed()
    }

    /// The image's size in pixels `(width, height)`.
    pub fn size(&self) -> (usize, usize) {
        let (h, w) = self.layout.image_size();
        (w as usize, h as usize)
    }

    /// Decodes packed latents `[tokens, 4·latent_channels]`; the decoded
    /// values `[3, H·W]` (in [-1, 1], as the VAE's) when `values`, and the
    /// 8-bit RGB, interleaved (as the channels-last program leaves its levels).
    pub fn decode(&self, gpu: &Gpu, packed: &[f32], values: bool) -> Result<(Option<Vec<f32>>, Vec<u8>), RunError> {
        let want = self.layout.latent_h * self.layout.latent_w * self.layout.config.latent_channels;
        if packed.len() as u64 != want {
            return Err(RunError::input("preview decoder", format!("{} latent values; it takes {want}", packed.len())));
        }
        let n = self.layout.decoded_len();
        let (decoded, levels) = match &self.mode {
            Mode::Whole { dispatches } => {
                self.runner.write(gpu, self.layout.packed, packed);
                gpu.submit(|enc| {
                    flux_lite_kernels::encode(enc, dispatches);
                    Ok(())
                })?;
                let decoded = if values { Some(self.runner.read(gpu, self.layout.decoded(), 1, n)?) } else { None };
                (decoded, self.runner.read_levels(gpu, self.layout.levels(), n)?)
            }
            Mode::Banded { capacity, activations } => {
                let mut held = activations.hold()?;
                let store = held.store();
                self.decode_banded(gpu, *capacity, packed, store)?;
                let decoded = if values { Some(store.read(gpu, self.layout.decoded(), n)?) } else { None };
                (decoded, store.read_levels(gpu, self.layout.levels(), n)?)
            }
        };
        let pixels = (n / 3) as usize;
        let rgb = match self.layout.channels_last {
            true => levels,
            false => interleave_rgb(&levels, pixels),
        };
        let decoded = decoded.map(|d| if self.layout.channels_last { planar(&d, pixels) } else { d });
        Ok((decoded, rgb))
    }

    /// Core's decode program over the whole image's layout, each op run by
    /// bands with the activations in `store`.
    fn decode_banded(&self, gpu: &Gpu, capacity: u64, packed: &[f32], store: &mut dyn Activations) -> Result<(), RunError> {
        store.write(gpu, self.layout.packed, packed)?;
        let bands = BandRunner { gpu, runner: &self.runner, weights: &self.weights, capacity };
        for op in collect_ops(|emit| decode_whole(&self.layout, emit)) {
            bands.run(store, &op)?;
        }
        Ok(())
    }
}

fn plan_error(e: program::TinyDecoderError) -> RunError {
    RunError::layout("preview decoder")(&e)
}
