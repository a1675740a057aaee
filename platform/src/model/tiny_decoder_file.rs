//! A tiny preview decoder's file (diffusers' `AutoencoderTiny` layout or
//! TAESD's), read and checked against the model's VAE: its structure comes
//! from its tensors.

use crate::error::LoadError;
use crate::model::safetensors_store::WeightStore;
use flux_lite_core::config::VaeConfig;
use flux_lite_core::models::tiny_decoder::TinyDecoderConfig;
use flux_lite_core::plan::{preview_layouts, DeviceLimits, PreviewLayouts};
use std::path::{Path, PathBuf};

/// A tiny decoder's file, read and checked: its structure and its mapped tensors.
#[derive(Debug)]
pub struct TinyDecoderFile {
    pub path: PathBuf,
    pub config: TinyDecoderConfig,
    pub(crate) store: WeightStore,
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

    /// Its layouts for a `width × height` image on an adapter of `limits`,
    /// fastest first ([`preview_layouts`]), with `weights` device bytes of
    /// weights (and row scales, where the device keeps them); `forced`: the
    /// request's VAE tile, which bands the preview too. Refused, naming the
    /// file, when no band holds a row of its widest convolution.
    pub fn layouts(&self, width: usize, height: usize, weights: u64, limits: DeviceLimits, forced: Option<u64>) -> Result<PreviewLayouts, LoadError> {
        preview_layouts(&self.config, width as u64, height as u64, weights, limits, forced).map_err(|e| LoadError::Safetensors {
            path: self.path.clone(),
            detail: format!("the preview decoder cannot run at {width}×{height}: {e}"),
        })
    }

    pub(crate) fn latent(&self, vae: &VaeConfig, width: usize, height: usize) -> (u64, u64) {
        let scale = vae.scale_factor();
        ((height / scale) as u64, (width / scale) as u64)
    }
}
