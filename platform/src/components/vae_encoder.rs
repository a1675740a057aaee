//! The VAE encoder on the GPU: an image to its posterior mean with core's
//! encode program (channels-last with f16 activations where the device's
//! products take f16 operands), either recorded once over the whole image's arena or,
//! for an image larger than the tile, run op by op over bands of rows
//! ([`crate::exec::vae_bands`]) in an arena fixed by the tile; then the mean to the
//! reference tokens the transformer reads.

use crate::error::{LoadError, RunError};
use flux_lite_kernels::Gpu;
use crate::exec::device_weights::DeviceWeights;
use flux_lite_kernels::{Dispatch};
use crate::exec::runner::{collect_ops, Runner};
use crate::model::safetensors_store::{widen_to_f32, WeightStore};
use crate::components::vae::{arena_runner, check_image_size, check_tile, pack_products, plan_error, product_rows, row_scale_bytes, upload_on_path};
use crate::exec::activations::HostTensors;
use crate::exec::vae_bands::BandRunner;
use flux_lite_core::config::VaeConfig;
use flux_lite_core::models::tensors::TensorSpec;
use flux_lite_core::models::vae_encoder::{self as program, VaeEncoderLayout};
use flux_lite_core::models::vae_encoder_nhwc;
use flux_lite_core::models::vae::band_arena_bytes;
use flux_lite_core::BumpArena;

#[derive(Debug)]
pub struct VaeEncoder {
    pub config: VaeConfig,
    /// Images wider or taller than this many pixels are encoded by bands; `None`: never.
    tile: Option<usize>,
    /// The encode of one image size: its arena and, untiled, recorded dispatches.
    pass: Option<EncodePass>,
    /// The encoder's weights on the device, uploaded once for every size.
    weights: DeviceWeights,
    /// `bn.running_mean` and `bn.running_var`, for the reference tokens.
    bn_mean: Vec<f32>,
    bn_var: Vec<f32>,
    /// Where an encode by bands keeps the image's activations (a scratch file).
    scratch_dir: std::path::PathBuf,
    /// The channels-last program on f16 activations (the device's products take f16 operands).
    channels_last: bool,
}

#[derive(Debug)]
struct EncodePass {
    /// The whole image's layout: the arena's when untiled, the host tensors' when banded.
    layout: VaeEncoderLayout,
    mode: Mode,
    runner: Runner,
    arena_bytes: u64,
}

#[derive(Debug)]
enum Mode {
    /// In one pass, the program recorded once over the arena.
    Whole { dispatches: Vec<Dispatch> },
    /// Op by op over bands whose operands take at most `capacity` f32.
    Banded { capacity: u64 },
}

impl VaeEncoder {
    /// Keeps an encode by bands' activations in a scratch file in `dir`
    /// (else the OS's temporary folder).
    pub fn in_scratch(mut self, dir: &std::path::Path) -> Self {
        self.scratch_dir = dir.to_path_buf();
        self
    }

    /// Uploads the encoder's weights (from the VAE's `store`) and lays out
    /// the encode of `width × height` images (multiples of twice the VAE
    /// scale factor): whole when `tile_px` is `None` or covers the image, else
    /// by bands in an arena the size a `tile_px`-square image needs untiled
    /// (and no larger than a storage binding).
    pub fn new(gpu: &Gpu, config: &VaeConfig, store: &WeightStore, width: usize, height: usize, tile_px: Option<usize>) -> Result<Self, RunError> {
        check_image_size(config, width, height)?;
        check_tile(config, tile_px)?;
        let channels_last = gpu.plan_limits().half_operands;
        let mut weights = upload_on_path(gpu, store, &encoder_specs(config), channels_last)?;
        weights.keep_row_scales(gpu, &product_rows(&encoder_specs(config)))?;
        if channels_last {
            // The weights are the same at every size: the program of the smallest image names them.
            let unit = config.latent_cell() as u64;
            let layout = VaeEncoderLayout::new(config, unit, unit, true, &mut BumpArena::new(u64::MAX)).map_err(plan_error)?;
            pack_products(gpu, &mut weights, &collect_ops(|emit| vae_encoder_nhwc::encode(&layout, emit)))?;
        }
        let features = 4 * config.latent_channels;
        let bn_mean = bn_stat(store, "bn.running_mean", features)?;
        let bn_var = bn_stat(store, "bn.running_var", features)?;
        let mut encoder = Self { config: config.clone(), tile: tile_px, pass: None, weights, bn_mean, bn_var, scratch_dir: std::env::temp_dir(), channels_last };
        encoder.lay_out(gpu, width, height)?;
        Ok(encoder)
    }

    /// Lays out the encode of `width × height` images, keeping the weights;
    /// the previous size's arena is released first, so the device never
    /// holds two. Nothing happens when the size is the current one.
    pub fn lay_out(&mut self, gpu: &Gpu, width: usize, height: usize) -> Result<(), RunError> {
        if self.pass.as_ref().is_some_and(|p| (p.layout.width, p.layout.height) == (width as u64, height as u64)) {
            return Ok(());
        }
        self.pass = None;
        check_image_size(&self.config, width, height)?;
        let mut arena = BumpArena::new(u64::MAX);
        let layout = VaeEncoderLayout::new(&self.config, height as u64, width as u64, self.channels_last, &mut arena).map_err(plan_error)?;
        let banded = self.tile.filter(|&t| t < width.max(height));
        let (arena_bytes, capacity) = match banded {
            None => (arena.high_water(), None),
            Some(t) => {
                let capacity = program::band_capacity(&self.config, t as u64, gpu.max_binding(), self.channels_last).map_err(plan_error)?;
                (band_arena_bytes(capacity), Some(capacity))
            }
        };
        if arena_bytes > gpu.limits.max_buffer_size {
            let detail = format!("encoding {width}×{height} pixels needs a {arena_bytes}-byte buffer, above the adapter's {} bytes; encode it by smaller bands", gpu.limits.max_buffer_size);
            return Err(RunError::Layout { component: "VAE encoder", detail });
        }
        let runner = arena_runner(gpu, "vae encoder activations", [arena_bytes, flux_lite_core::models::vae::attention_operand_bytes(&self.config, self.channels_last)]);
        let mode = match capacity {
            Some(capacity) => Mode::Banded { capacity },
            None => {
                let mut dispatches = Vec::new();
                for op in &collect_ops(|emit| vae_encoder_nhwc::encode_whole(&layout, emit)) {
                    runner.record(gpu, &mut dispatches, &self.weights, op)?;
                }
                Mode::Whole { dispatches }
            }
        };
        self.pass = Some(EncodePass { layout, mode, runner, arena_bytes });
        Ok(())
    }

    /// Bytes of the current size's activation arena (fixed by the tile when banded).
    pub fn arena_bytes(&self) -> u64 {
        self.pass.as_ref().map_or(0, |p| p.arena_bytes)
    }

    /// Whether it runs the channels-last program on f16 activations.
    pub fn is_channels_last(&self) -> bool {
        self.channels_last
    }

    /// Whether the current size is encoded by bands.
    pub fn is_banded(&self) -> bool {
        self.pass.as_ref().is_some_and(|p| matches!(p.mode, Mode::Banded { .. }))
    }

    /// The pass of the current size ([`Self::new`] and [`Self::lay_out`] leave one on success).
    fn pass(&self) -> Result<&EncodePass, RunError> {
        self.pass.as_ref().ok_or_else(|| RunError::input("VAE encoder", "an image before any image size was laid out"))
    }

    /// The latent grid (height, width) in cells.
    pub fn latent_size(&self) -> (usize, usize) {
        let (h, w) = self.pass.as_ref().map_or((0, 0), |p| p.layout.latent_size());
        (h as usize, w as usize)
    }

    /// The reference tokens' grid (height, width): one token per 2×2 latent cells.
    pub fn token_grid(&self) -> (usize, usize) {
        let (h, w) = self.latent_size();
        (h / 2, w / 2)
    }

    /// The posterior mean `[latent_channels, h, w]` of an image `[3, height, width]` in [-1, 1].
    pub fn posterior_mean(&self, gpu: &Gpu, image: &[f32]) -> Result<Vec<f32>, RunError> {
        let pass = self.pass()?;
        let l = &pass.layout;
        let want = (l.in_channels * l.height * l.width) as usize;
        if image.len() != want {
            return Err(RunError::input("VAE encoder", format!("an image of {} values; {}×{} needs {want}", image.len(), l.width, l.height)));
        }
        let image = image_as_laid_out(l, image);
        match &pass.mode {
            Mode::Whole { dispatches } => {
                pass.runner.write(gpu, l.image, &image);
                gpu.submit(|enc| {
                    flux_lite_kernels::encode(enc, dispatches);
                    Ok(())
                })?;
                Ok(pass.runner.read(gpu, l.moments, 1, l.mean_len())?)
            }
            Mode::Banded { capacity } => {
                let full = program::arena_bytes(&self.config, l.height, l.width, l.channels_last).map_err(plan_error)?;
                let mut host = HostTensors::scratch_in(&self.scratch_dir, full / 4)?;
                host.insert(l.image, &image)?;
                let bands = BandRunner { gpu, runner: &pass.runner, weights: &self.weights, capacity: *capacity };
                for op in &collect_ops(|emit| vae_encoder_nhwc::encode_whole(l, emit)) {
                    bands.run(&mut host, op)?;
                }
                Ok(host.get(l.moments, l.mean_len())?.to_vec())
            }
        }
    }

    /// The reference tokens `[tokens, 4·latent_channels]` of an image, as the
    /// pipeline appends them after the noise tokens.
    pub fn reference_tokens(&self, gpu: &Gpu, image: &[f32]) -> Result<Vec<f32>, RunError> {
        let mean = self.posterior_mean(gpu, image)?;
        let (h, w) = self.latent_size();
        let channels = self.config.latent_channels;
        let mut tokens = vec![0.0; mean.len()];
        let eps = self.config.batch_norm_eps as f32;
        program::reference_tokens(&mean, &self.bn_mean, &self.bn_var, [channels, h, w], eps, &mut tokens);
        Ok(tokens)
    }
}

/// Device bytes of the encoder's weights as [`VaeEncoder::new`] uploads them.
pub fn encoder_weight_bytes(config: &VaeConfig, store: &WeightStore) -> Result<u64, LoadError> {
    crate::components::vae::weight_bytes(store, &encoder_specs(config))
}

/// What encoding reads: `encoder.*` and `quant_conv.*`.
/// Device bytes of the encoder's weights' row scales, where the device keeps them.
pub fn encoder_row_scale_bytes(config: &VaeConfig) -> u64 {
    row_scale_bytes(&product_rows(&encoder_specs(config)))
}

fn encoder_specs(config: &VaeConfig) -> Vec<TensorSpec> {
    crate::components::vae::specs_under(config, &program::WEIGHTS)
}

/// The image `[channels, pixels]` as the layout takes it: as it is, or
/// channels-last, each pixel's channels then zeros to [`VaeEncoderLayout::image_row`].
fn image_as_laid_out<'a>(l: &VaeEncoderLayout, image: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
    if !l.channels_last {
        return image.into();
    }
    let (channels, row, pixels) = (l.in_channels as usize, l.image_row() as usize, (l.height * l.width) as usize);
    let mut rows = vec![0.0; row * pixels];
    for (c, plane) in image.chunks_exact(pixels).take(channels).enumerate() {
        for (i, &v) in plane.iter().enumerate() {
            rows[i * row + c] = v;
        }
    }
    rows.into()
}

/// One BatchNorm statistic as f32, checked to hold `features` values.
fn bn_stat(store: &WeightStore, name: &str, features: usize) -> Result<Vec<f32>, LoadError> {
    let t = store.tensor(name)?;
    let mut values = Vec::with_capacity(features);
    if !widen_to_f32(t.dtype, t.bytes, &mut values) || values.len() != features {
        return Err(LoadError::WrongTensor {
            component: store.component.clone(),
            name: name.into(),
            expected: format!("{features} float values"),
            found: format!("{:?} of shape {:?}", t.dtype, t.shape),
        });
    }
    Ok(values)
}
