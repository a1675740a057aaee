//! A tiny decoder for previews on the GPU (`--preview-decoder`): the file's
//! weights and the VAE's BatchNorm statistics uploaded once, core's
//! program recorded once for the run's image size, then any number of
//! decodes of the transformer's packed latents into 8-bit RGB.

use crate::components::vae::{arena_runner, upload_checked};
use crate::error::{LoadError, RunError};
use crate::model::safetensors_store::{TensorRef, WeightStore};
use crate::run::device_weights::{DeviceWeight, DeviceWeights};
use crate::run::runner::{collect_ops, Runner};
use flux_lite_core::config::VaeConfig;
use flux_lite_core::models::tiny_decoder::{self as program, TinyDecoderConfig, TinyDecoderLayout};
use flux_lite_core::BumpArena;
use flux_lite_kernels::{Dispatch, Gpu};
use std::path::{Path, PathBuf};

/// A tiny decoder's file, read and checked: its structure and its mapped tensors.
#[derive(Debug)]
pub struct TinyDecoderFile {
    pub path: PathBuf,
    pub config: TinyDecoderConfig,
    store: WeightStore,
}

impl TinyDecoderFile {
    /// Opens a safetensors file in diffusers' `AutoencoderTiny` layout or
    /// TAESD's, or a folder holding one (`diffusion_pytorch_model.safetensors`).
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let file = if path.is_dir() { path.join("diffusion_pytorch_model.safetensors") } else { path.to_path_buf() };
        if file.extension().is_some_and(|e| e == "pth" || e == "pt" || e == "ckpt") {
            let detail = "a PyTorch pickle; give the decoder as safetensors (docs/usage.md shows the one-line conversion)".into();
            return Err(LoadError::Safetensors { path: file, detail });
        }
        let store = WeightStore::open_file(&file, "preview decoder")?;
        let config = TinyDecoderConfig::from_tensors(store.shapes()).map_err(|e| LoadError::Safetensors { path: file.clone(), detail: format!("not a tiny decoder: {e}") })?;
        for name in store.names() {
            if name.starts_with(config.layout.prefix()) {
                let t = store.tensor(name)?;
                if !matches!(t.dtype, safetensors::Dtype::F32 | safetensors::Dtype::F16 | safetensors::Dtype::BF16) {
                    return Err(LoadError::WrongTensor { component: store.component.clone(), name: name.into(), expected: "f32, f16 or bf16".into(), found: format!("{:?}", t.dtype) });
                }
            }
        }
        Ok(Self { path: file, config, store })
    }

    /// Refuses a decoder that does not fit `vae`'s latents and scale.
    pub fn check_fits(&self, vae: &VaeConfig) -> Result<(), LoadError> {
        let (lc, scale) = (self.config.latent_channels, self.config.scale());
        if lc != vae.latent_channels as u64 || scale != vae.scale_factor() as u64 {
            let detail = format!(
                "a decoder of {lc} latent channels at {scale}× cannot preview this model's VAE ({} latent channels at {}×)",
                vae.latent_channels,
                vae.scale_factor()
            );
            return Err(LoadError::Safetensors { path: self.path.clone(), detail });
        }
        Ok(())
    }

    /// Device bytes of its weights as uploaded (f16 and bf16 widened to f32,
    /// the biases of bias-free convolutions as zeros) with the VAE's two
    /// BatchNorm statistics.
    pub fn weight_bytes(&self, vae: &VaeConfig) -> u64 {
        let mut bytes = 2 * 4 * 4 * vae.latent_channels as u64;
        self.config.tensors(|t| bytes += 4 * t.shape.iter().product::<u64>());
        bytes
    }

    /// Its convolutions' weights as (name, rows, terms a row), whose rows'
    /// range scales a device that measures them keeps.
    pub fn product_rows(&self) -> Vec<(String, u64, u64)> {
        let mut rows = Vec::new();
        self.config.tensors(|t| {
            if t.shape.len() >= 2 {
                rows.push((t.name.to_string(), t.shape[0], t.shape[1..].iter().product::<u64>()));
            }
        });
        rows
    }

    /// Device bytes of those row scales.
    pub fn row_scale_bytes(&self) -> u64 {
        crate::components::vae::row_scale_bytes(&self.product_rows())
    }

    /// Device bytes a decode of a `width × height` image takes: weights,
    /// the arena, and the dispatches' parameters.
    pub fn device_bytes(&self, vae: &VaeConfig, width: usize, height: usize) -> Result<u64, RunError> {
        let (lat_h, lat_w) = self.latent(vae, width, height);
        Ok(self.weight_bytes(vae) + program::run_bytes(&self.config, lat_h, lat_w).map_err(plan_error)?)
    }

    /// Refuses, before anything runs, a `width × height` image whose decode
    /// needs an arena above the adapter's largest buffer or one activation
    /// above its largest binding (the tiny decoder runs whole, not by bands).
    pub fn check_limits(&self, vae: &VaeConfig, width: usize, height: usize, max_buffer: u64, max_binding: u64) -> Result<(), LoadError> {
        let (lat_h, lat_w) = self.latent(vae, width, height);
        let activation = 4 * self.config.largest_activation(lat_h * lat_w);
        let mut arena = BumpArena::new(u64::MAX);
        let arena = match TinyDecoderLayout::new(&self.config, lat_h, lat_w, 0.0, &mut arena) {
            Ok(_) => arena.high_water(),
            Err(_) => u64::MAX,
        };
        let over = if activation > max_binding {
            Some(format!("one activation takes {activation} bytes, above the adapter's largest binding of {max_binding}"))
        } else if arena > max_buffer {
            Some(format!("its arena takes {arena} bytes, above the adapter's largest buffer of {max_buffer}"))
        } else {
            None
        };
        match over {
            Some(why) => Err(LoadError::Safetensors {
                path: self.path.clone(),
                detail: format!("the preview decoder cannot run at {width}×{height}: {why} (preview without --preview-decoder, or make a smaller image)"),
            }),
            None => Ok(()),
        }
    }

    fn latent(&self, vae: &VaeConfig, width: usize, height: usize) -> (u64, u64) {
        let scale = vae.scale_factor();
        ((height / scale) as u64, (width / scale) as u64)
    }
}

/// A tiny decoder laid out for one image size, its program recorded once.
#[derive(Debug)]
pub struct TinyDecoder {
    layout: TinyDecoderLayout,
    runner: Runner,
    _weights: DeviceWeights,
    dispatches: Vec<Dispatch>,
}

impl TinyDecoder {
    /// Uploads `file`'s weights and the VAE's BatchNorm statistics (from
    /// `vae_store`) and records the decode of a `width × height` image.
    pub fn new(gpu: &Gpu, file: &TinyDecoderFile, vae: &VaeConfig, vae_store: &WeightStore, width: usize, height: usize) -> Result<Self, RunError> {
        file.check_fits(vae)?;
        file.check_limits(vae, width, height, gpu.limits.max_buffer_size, gpu.max_binding())?;
        let (lat_h, lat_w) = file.latent(vae, width, height);
        let mut arena = BumpArena::new(u64::MAX);
        let layout = TinyDecoderLayout::new(&file.config, lat_h, lat_w, vae.batch_norm_eps as f32, &mut arena).map_err(plan_error)?;
        let bytes = arena.high_water();
        let runner = arena_runner(gpu, "preview decoder activations", bytes);
        gpu.check_faults()?;
        let mut weights = upload_checked(gpu, vae_store, &crate::components::vae::specs_under(vae, &["bn.running_"]))?;
        let mut missing = None;
        file.config.tensors(|t| {
            if missing.is_some() {
                return;
            }
            let uploaded = if t.zero {
                let zeros = vec![0u8; 4 * t.shape.iter().product::<u64>() as usize];
                let shape = [zeros.len() / 4];
                DeviceWeight::upload(gpu, "preview decoder", &t.name, TensorRef { dtype: safetensors::Dtype::F32, shape: &shape, bytes: &zeros })
            } else {
                file.store.tensor(&t.name).and_then(|r| DeviceWeight::upload(gpu, "preview decoder", &t.name, r))
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
        let mut dispatches = Vec::new();
        for op in collect_ops(|emit| program::decode(&layout, emit)) {
            runner.record(gpu, &mut dispatches, &weights, &op)?;
        }
        Ok(Self { layout, runner, _weights: weights, dispatches })
    }

    /// The image's size in pixels `(width, height)`.
    pub fn size(&self) -> (usize, usize) {
        let (h, w) = self.layout.image_size();
        (w as usize, h as usize)
    }

    /// Decodes packed latents `[tokens, 4·latent_channels]`; the decoded
    /// values `[3, H·W]` (in [-1, 1], as the VAE's) when `values`, and the 8-bit RGB, interleaved.
    pub fn decode(&self, gpu: &Gpu, packed: &[f32], values: bool) -> Result<(Option<Vec<f32>>, Vec<u8>), RunError> {
        let want = self.layout.latent_h * self.layout.latent_w * self.layout.config.latent_channels;
        if packed.len() as u64 != want {
            return Err(RunError::Internal(format!("the preview decoder takes {want} latent values, not {}", packed.len())));
        }
        self.runner.write(gpu, self.layout.packed, packed);
        gpu.submit(|enc| {
            flux_lite_kernels::encode(enc, &self.dispatches);
            Ok(())
        })?;
        let n = self.layout.decoded_len();
        let decoded = if values { Some(self.runner.read(gpu, self.layout.decoded(), 1, n)?) } else { None };
        let levels = self.runner.read(gpu, self.layout.levels(), 1, n)?;
        let pixels = (n / 3) as usize;
        // The levels are whole numbers in [0, 255]; the cast only changes the type.
        let rgb = (0..pixels).flat_map(|i| [levels[i], levels[pixels + i], levels[2 * pixels + i]].map(|v| v as u8)).collect();
        Ok((decoded, rgb))
    }
}

fn plan_error(e: program::TinyDecoderError) -> RunError {
    RunError::Internal(format!("the preview decoder: {e}"))
}
