//! The VAE decoder on the GPU: the decoder's weights uploaded once, then
//! either the whole image decoded in one arena by core's decode program
//! recorded once, or, when the image is too large for the device memory the
//! VAE may take, the same program run op by op over bands of rows
//! ([`crate::exec::vae_bands`]) in an arena fixed by the tile size. Both give the
//! same image up to rounding.

use crate::error::{LoadError, RunError};
use flux_lite_kernels::Gpu;
use flux_lite_kernels::Dispatch;
use crate::exec::device_weights::{DeviceWeight, DeviceWeights};
use crate::exec::runner::{collect_ops, Runner};
use crate::model::safetensors_store::WeightStore;
use crate::exec::activations::{Activations, BandActivations, Bands, HeldActivations, HostTensors};
use crate::exec::vae_bands::BandRunner;
use flux_lite_core::config::{ImageSize, VaeConfig};
use flux_lite_core::ir::{Op, Span};
use flux_lite_core::models::tensors::{self, TensorSpec};
use flux_lite_core::models::vae::{self as program, VaeLayout, VaePlanError};
use flux_lite_core::models::vae_nhwc;
use flux_lite_core::BumpArena;

/// Steps of one [`VaeDecoder::decode`] done: one when untiled, one per op of the decode program when banded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileProgress {
    pub done: usize,
    pub total: usize,
}

/// A decoded image.
#[derive(Debug)]
pub struct DecodedImage {
    pub width: usize,
    pub height: usize,
    /// The raw output, where [`VaeDecoder::decode`] was asked to keep it.
    decoded: Option<Decoded>,
    /// 8-bit RGB, row-major, 3 bytes per pixel (what goes into the PNG).
    pub rgb: Vec<u8>,
}

/// The decoder's raw output: read back into memory after an untiled decode,
/// or left where a banded decode wrote it, in its scratch file (so a large
/// image's f32 values never take the process's own memory).
#[derive(Debug)]
enum Decoded {
    Read(Vec<f32>),
    Scratch { host: HostTensors, span: Span, len: u64 },
}

impl DecodedImage {
    /// The decoder's raw output `[3, height, width]`, before the clamp,
    /// where the decode kept it (empty otherwise).
    pub fn decoded(&self) -> &[f32] {
        self.decoded.as_ref().map_or(&[], Decoded::values)
    }
}

impl Decoded {
    fn values(&self) -> &[f32] {
        match self {
            Decoded::Read(values) => values,
            // The span was read once when the decode finished, so it is in the arena.
            Decoded::Scratch { host, span, len } => host.get(*span, *len).unwrap_or_default(),
        }
    }
}

/// How the image is decoded.
#[derive(Debug)]
enum Mode {
    /// In one pass, the program recorded once over the whole image's layout:
    /// channels-last where the device's products take f16 inputs (the
    /// matrix tier's half-precision path; its output and levels then come
    /// pixel by pixel), else channel-major.
    Whole { layout: Box<VaeLayout>, dispatches: Vec<Dispatch>, channels_last: bool },
    /// Op by op over bands whose operands take at most `capacity` f32, the
    /// image's activations in `activations` between bands; the same program
    /// as the whole decode's (channels-last or not), so the same bits.
    Banded { capacity: u64, activations: BandActivations, channels_last: bool },
}

#[derive(Debug)]
pub struct VaeDecoder {
    pub config: VaeConfig,
    /// The latent in VAE cells (the decoder's input grid).
    latent_h: u64,
    latent_w: u64,
    mode: Mode,
    runner: Runner,
    weights: DeviceWeights,
    arena_bytes: u64,
    /// Whether a decode has run (the whole image's latent is then in the arena when untiled).
    decoded_once: bool,
}

impl VaeDecoder {
    /// Keeps a decode by bands on the host in a scratch file in `dir` (else
    /// the OS's temporary folder).
    pub fn in_scratch(mut self, dir: &std::path::Path) -> Self {
        if let Mode::Banded { activations, .. } = &mut self.mode {
            activations.in_folder(dir);
        }
        self
    }

    /// Uploads the decoder's weights (from the VAE's `store`) and lays out
    /// the arena to decode `width × height` pixel images: whole when
    /// `tile_px` is `None` or covers the image, else by bands in an arena the
    /// size a `tile_px`-square image would need untiled (and no larger than a
    /// storage binding). The tile must be a multiple of 2 × the VAE scale factor.
    pub fn new(
        gpu: &Gpu,
        config: &VaeConfig,
        store: &WeightStore,
        width: usize,
        height: usize,
        tile_px: Option<usize>,
    ) -> Result<Self, RunError> {
        Self::laid_out(gpu, config, store, width, height, tile_px.map_or(Bands::Whole, |t| Bands::OnHost { tile: t as u64 }))
    }

    /// [`Self::new`] in the layout `bands` says (the plan's); by bands on
    /// the device, the image's activations take pages of the adapter's
    /// largest buffer, allocated here.
    pub fn laid_out(gpu: &Gpu, config: &VaeConfig, store: &WeightStore, width: usize, height: usize, bands: Bands) -> Result<Self, RunError> {
        // A config read from a file was validated (RGB out); one built by hand may not have been.
        config.validate().map_err(|e| RunError::input("VAE decoder", format!("a config it cannot run: {e}")))?;
        check_image_size(config, width, height)?;
        let scale = config.scale_factor();
        let banded = bands.banded(width.max(height) as u64);
        if let Bands::OnHost { tile } = bands {
            check_tile(config, Some(tile as usize))?;
        }
        let (latent_h, latent_w) = ((height / scale) as u64, (width / scale) as u64);
        let channels_last = gpu.plan_limits().half_operands;
        // The whole image's layout, or the elements a band's operands may take.
        let (layout, capacity, arena_bytes) = match banded {
            None => {
                let mut arena = BumpArena::new(u64::MAX);
                let layout = VaeLayout::new(config, latent_h, latent_w, channels_last, &mut arena).map_err(plan_error)?;
                (Some(layout), 0, arena.high_water())
            }
            Some((t, _)) => {
                let side = t / scale as u64;
                let capacity = program::band_capacity(config, side, gpu.max_binding(), channels_last).map_err(plan_error)?;
                (None, capacity, program::band_arena_bytes(capacity))
            }
        };
        if arena_bytes > gpu.limits.max_buffer_size {
            let detail = format!("decoding {width}×{height} pixels needs a {arena_bytes}-byte buffer, above the adapter's {} bytes; decode it by smaller bands", gpu.limits.max_buffer_size);
            return Err(RunError::Layout { component: "VAE decoder", detail });
        }
        // The activations first: an adapter that cannot hold them fails here, before the upload.
        let runner = arena_runner(gpu, "vae activations", [arena_bytes, program::attention_operand_bytes(config, channels_last)]);
        gpu.check_faults()?;
        let mut weights = upload_on_path(gpu, store, &decoder_specs(config), channels_last)?;
        weights.keep_row_scales(gpu, &product_rows(&decoder_specs(config)))?;
        if channels_last {
            // The weights are the same at every size: the program of the smallest latent names them.
            let unit = VaeLayout::new(config, 2, 2, true, &mut BumpArena::new(u64::MAX)).map_err(plan_error)?;
            pack_products(gpu, &mut weights, &collect_ops(|emit| vae_nhwc::decode_to_levels(&unit, emit)))?;
        }
        let mode = match layout {
            Some(layout) => {
                // The 8-bit levels in the same pass: one readback gives the image.
                let ops = collect_ops(|emit| vae_nhwc::decode_whole(&layout, channels_last, emit));
                let mut dispatches = Vec::new();
                for op in &ops {
                    runner.record(gpu, &mut dispatches, &weights, op)?;
                }
                Mode::Whole { layout: Box::new(layout), dispatches, channels_last }
            }
            None => {
                let on_device = banded.is_some_and(|(_, on_device)| on_device);
                let elements = program::arena_bytes(config, latent_h, latent_w, channels_last).map_err(plan_error)? / 4;
                Mode::Banded { capacity, activations: BandActivations::new(gpu, elements, on_device)?, channels_last }
            }
        };
        Ok(Self { config: config.clone(), latent_h, latent_w, mode, runner, weights, arena_bytes, decoded_once: false })
    }

    /// Bytes of the activation arena (fixed by the tile when banded, whatever the image size).
    pub fn arena_bytes(&self) -> u64 {
        self.arena_bytes
    }

    /// Device bytes of its weights (and their row scales, where the device keeps them).
    pub fn weight_bytes(&self) -> u64 {
        self.weights.bytes()
    }

    /// Whether the image is decoded by bands.
    pub fn is_banded(&self) -> bool {
        matches!(self.mode, Mode::Banded { .. })
    }

    /// Decodes packed latents `[tokens, 4·latent_channels]` (token = y·(W/2s) + x,
    /// as the transformer leaves them) into the image, reporting progress;
    /// keeps the raw output too when `values` ([`DecodedImage::decoded`]).
    /// Untiled, the image is read back once, as its 8-bit levels.
    pub fn decode(&mut self, gpu: &Gpu, packed: &[f32], values: bool, progress: &mut dyn FnMut(TileProgress)) -> Result<DecodedImage, RunError> {
        let (lat_h, lat_w) = (self.latent_h, self.latent_w);
        let scale = self.config.scale_factor();
        let features = 4 * self.config.latent_channels;
        let tokens = (lat_h * lat_w / 4) as usize;
        if packed.len() != tokens * features {
            return Err(RunError::input("VAE decoder", format!(
                "latents of {} values; a {}×{} image needs {tokens} tokens × {features} = {}",
                packed.len(),
                lat_w as usize * scale,
                lat_h as usize * scale,
                tokens * features
            )));
        }
        let (height, width) = (lat_h as usize * scale, lat_w as usize * scale);
        let (decoded, rgb) = match &self.mode {
            Mode::Whole { layout, dispatches, channels_last } => {
                self.runner.write(gpu, layout.packed, packed);
                gpu.submit(|enc| {
                    flux_lite_kernels::encode(enc, dispatches);
                    Ok(())
                })?;
                progress(TileProgress { done: 1, total: 1 });
                let pixels = height * width;
                let decoded = match values {
                    true => {
                        let read = self.runner.read(gpu, layout.decoded, 1, layout.decoded_len())?;
                        Some(Decoded::Read(if *channels_last { planar(&read, pixels) } else { read }))
                    }
                    false => None,
                };
                let levels = self.runner.read_levels(gpu, layout.levels, layout.decoded_len())?;
                (decoded, if *channels_last { levels } else { interleave_rgb(&levels, pixels) })
            }
            Mode::Banded { capacity, activations, channels_last } => {
                let full = VaeLayout::new(&self.config, self.latent_h, self.latent_w, *channels_last, &mut BumpArena::new(u64::MAX)).map_err(plan_error)?;
                let mut held = activations.hold()?;
                self.decode_banded(gpu, (*capacity, *channels_last), &full, packed, held.store(), progress)?;
                // The levels made by bands where the activations are: one
                // readback of the image where they are on the device.
                let levels = held.store().read_levels(gpu, full.levels, full.decoded_len())?;
                let pixels = height * width;
                let decoded = match (values, held) {
                    (false, _) => None,
                    (true, HeldActivations::Device(pages)) => {
                        let read = pages.read(gpu, full.decoded, full.decoded_len())?;
                        Some(Decoded::Read(if *channels_last { planar(&read, pixels) } else { read }))
                    }
                    // Channels-last, its values planar, as an untiled decode gives them.
                    (true, HeldActivations::Host(host)) if *channels_last => Some(Decoded::Read(planar(host.get(full.decoded, full.decoded_len())?, pixels))),
                    // Left in the scratch file, its span read once into the arena.
                    (true, HeldActivations::Host(host)) => {
                        host.get(full.decoded, full.decoded_len())?;
                        Some(Decoded::Scratch { host, span: full.decoded, len: full.decoded_len() })
                    }
                };
                (decoded, if *channels_last { levels } else { interleave_rgb(&levels, pixels) })
            }
        };
        self.decoded_once = true;
        Ok(DecodedImage { width, height, rgb, decoded })
    }

    /// The 8-bit levels of decoded values (`round(clamp(x/2 + 1/2, 0, 1)·255)`),
    /// computed on the device in chunks that fit the arena.
    pub fn pixel_levels(&self, gpu: &Gpu, decoded: &[f32]) -> Result<Vec<u8>, RunError> {
        let (src, dst, chunk) = match &self.mode {
            // The latent stays in place for `last_latent`.
            Mode::Whole { layout, .. } => (layout.decoded, layout.levels, layout.decoded_len()),
            // Values at the arena's start, levels in its second half.
            Mode::Banded { .. } => {
                let half = (self.arena_bytes / 2) / 256 * 256;
                (Span::new(0, 0), Span::new(half / 4, 0), half / 4)
            }
        };
        let chunk = chunk.max(1) as usize;
        let mut out = Vec::with_capacity(decoded.len());
        for part in decoded.chunks(chunk) {
            self.runner.write(gpu, src, part);
            let op = Op::PixelLevels { src, dst, count: part.len() as u64 };
            gpu.submit(|enc| self.runner.record(gpu, enc, &self.weights, &op))?;
            out.extend(self.runner.read_levels(gpu, dst, part.len() as u64)?);
        }
        Ok(out)
    }

    /// The de-normalised, unpatchified latent `[latent_channels, h, w]` of
    /// the last untiled decode: the decoder's input.
    pub fn last_latent(&self, gpu: &Gpu) -> Result<Vec<f32>, RunError> {
        match &self.mode {
            Mode::Whole { layout, .. } if self.decoded_once => {
                Ok(self.runner.read(gpu, layout.latent, 1, layout.latent_channels * self.latent_h * self.latent_w)?)
            }
            Mode::Whole { .. } => Err(RunError::input("VAE decoder", "a request for its latent before anything was decoded")),
            Mode::Banded { .. } => Err(RunError::input("VAE decoder", "a request for its latent, which a banded decode keeps on the host")),
        }
    }

    /// Core's decode program over the whole image's layout `full`, each op
    /// run by bands with the activations in `store`.
    #[allow(clippy::too_many_arguments)] // the decode's layout, its input, the store and the progress
    fn decode_banded(&self, gpu: &Gpu, (capacity, channels_last): (u64, bool), full: &VaeLayout, packed: &[f32], store: &mut dyn Activations, progress: &mut dyn FnMut(TileProgress)) -> Result<(), RunError> {
        let ops = collect_ops(|emit| vae_nhwc::decode_whole(full, channels_last, emit));
        store.write(gpu, full.packed, packed)?;
        let bands = BandRunner { gpu, runner: &self.runner, weights: &self.weights, capacity };
        for (i, op) in ops.iter().enumerate() {
            bands.run(store, op)?;
            progress(TileProgress { done: i + 1, total: ops.len() });
        }
        Ok(())
    }
}

/// What decoding reads: `decoder.*`, `post_quant_conv.*` and the latent BatchNorm statistics.
fn decoder_specs(config: &VaeConfig) -> Vec<TensorSpec> {
    specs_under(config, &flux_lite_core::models::vae::DECODER_WEIGHTS)
}

/// The VAE's tensor specs whose names start with one of `prefixes`.
pub(crate) fn specs_under(config: &VaeConfig, prefixes: &[&str]) -> Vec<TensorSpec> {
    let mut specs = Vec::new();
    tensors::vae(config, |s| {
        if prefixes.iter().any(|p| s.name.starts_with(p)) {
            specs.push(s.clone());
        }
    });
    specs
}

/// The products' weights among `specs` (convolutions' and linears':
/// two dims or more) as (name, rows, terms a row), whose rows' range scales
/// a device that measures them keeps (`DeviceWeights::keep_row_scales`).
pub(crate) fn product_rows(specs: &[TensorSpec]) -> Vec<(String, u64, u64)> {
    specs
        .iter()
        .filter(|s| s.shape.len() >= 2)
        .map(|s| (s.name.to_string(), s.shape[0] as u64, s.shape[1..].iter().product::<usize>() as u64))
        .collect()
}

/// Device bytes of those row scales.
pub(crate) fn row_scale_bytes(rows: &[(String, u64, u64)]) -> u64 {
    4 * rows.iter().map(|&(_, rows, _)| rows).sum::<u64>()
}

/// Device bytes of the decoder's weights' row scales, where the device keeps them.
pub fn decoder_row_scale_bytes(config: &VaeConfig) -> u64 {
    row_scale_bytes(&product_rows(&decoder_specs(config)))
}

/// Device bytes of the decoder's weights as [`VaeDecoder::new`] uploads them.
pub fn decoder_weight_bytes(config: &VaeConfig, store: &WeightStore) -> Result<u64, LoadError> {
    weight_bytes(store, &decoder_specs(config))
}

/// Device bytes of the tensors `specs` name as [`upload_checked`] uploads
/// them (f16 widened to f32, each a whole number of 4-byte words).
pub(crate) fn weight_bytes(store: &WeightStore, specs: &[TensorSpec]) -> Result<u64, LoadError> {
    let mut bytes = 0;
    for spec in specs {
        let t = store.tensor(&spec.name)?;
        let widened = if t.dtype == safetensors::tensor::Dtype::F16 { 2 } else { 1 };
        bytes += (widened * t.bytes.len() as u64).div_ceil(4).max(1) * 4;
    }
    Ok(bytes)
}

/// The tensors `specs` names, each checked against its shape; on the
/// channels-last data path each convolution's W with its taps in the order
/// the convolution runs them.
pub(crate) fn upload_on_path(gpu: &Gpu, store: &WeightStore, specs: &[TensorSpec], channels_last: bool) -> Result<DeviceWeights, LoadError> {
    let upload = if channels_last { DeviceWeight::upload_taps_last } else { DeviceWeight::upload };
    upload_checked_with(gpu, store, specs, upload)
}

/// Packs, as f16 under its rows' kept scales, each W the channels-last
/// `program` reads so ([`Op::packed_weight`]: its convolutions' and its
/// attention's projections'): its products then stage W's words as they
/// are. A bf16 W in place; a convolution's f32 W (a tiny decoder's file)
/// into a buffer of half its bytes.
pub(crate) fn pack_products(gpu: &Gpu, weights: &mut DeviceWeights, program: &[Op]) -> Result<(), RunError> {
    weights.pack_half(gpu, program.iter().filter_map(Op::packed_weight))?;
    let convolutions = program.iter().filter(|op| matches!(op, Op::ConvNhwc { .. })).filter_map(Op::packed_weight);
    Ok(weights.pack_half_f32(gpu, convolutions)?)
}

/// Uploads the tensors `specs` name, each checked against its shape.
pub(crate) fn upload_checked(gpu: &Gpu, store: &WeightStore, specs: &[TensorSpec]) -> Result<DeviceWeights, LoadError> {
    upload_checked_with(gpu, store, specs, DeviceWeight::upload)
}

/// [`upload_checked`], each tensor uploaded by `upload`.
fn upload_checked_with(gpu: &Gpu, store: &WeightStore, specs: &[TensorSpec], upload: UploadFn) -> Result<DeviceWeights, LoadError> {
    let mut weights = DeviceWeights::default();
    for spec in specs {
        let t = store.tensor(&spec.name)?;
        if t.shape != spec.shape.as_slice() {
            return Err(LoadError::WrongTensor {
                component: store.component.clone(),
                name: spec.name.to_string(),
                expected: format!("shape {:?}", spec.shape.as_slice()),
                found: format!("shape {:?}", t.shape),
            });
        }
        weights.insert(&spec.name, upload(gpu, &store.component, &spec.name, t)?);
    }
    Ok(weights)
}

/// How a tensor reaches the device.
type UploadFn = fn(&Gpu, &str, &str, crate::model::safetensors_store::TensorRef<'_>) -> Result<DeviceWeight, LoadError>;

/// Refuses an image size the VAE cannot take ([`ImageSize`]'s rule).
pub(crate) fn check_image_size(config: &VaeConfig, width: usize, height: usize) -> Result<(), RunError> {
    // `Job::resolve` refuses such a request: only a library caller laying a component out by hand meets this.
    ImageSize::new(config, width as u64, height as u64).map_err(|e| RunError::input("VAE", format!("a {width}×{height} image: {e}")))?;
    Ok(())
}

/// Refuses a tile size that is not a positive multiple of twice the VAE
/// scale factor: `Job::resolve` refuses such a request, so only a library
/// caller laying a component out by hand meets this.
pub(crate) fn check_tile(config: &VaeConfig, tile_px: Option<usize>) -> Result<(), RunError> {
    let unit = config.latent_cell();
    match tile_px {
        Some(t) if t == 0 || !t.is_multiple_of(unit) => Err(RunError::input("VAE", format!("a {t}-pixel tile, not a positive multiple of {unit} pixels"))),
        _ => Ok(()),
    }
}

/// A runner over a VAE activation arena of `bytes` (the VAE reads no RoPE
/// tables), with a buffer of `operand_bytes` for its chunked attention's
/// right operands where it has one.
pub(crate) fn arena_runner(gpu: &Gpu, label: &str, [bytes, operand_bytes]: [u64; 2]) -> Runner {
    let operands = (operand_bytes > 0).then(|| gpu.storage("attention operands", operand_bytes));
    Runner { arena: gpu.storage(label, bytes), rope_cos: gpu.storage("unused", 4), rope_sin: gpu.storage("unused", 4), key_keep: None, lora: None, operands, products_scratch: None }
}

/// Channels-last `[pixels, 3]` values to planar `[3, pixels]`.
pub(crate) fn planar(interleaved: &[f32], pixels: usize) -> Vec<f32> {
    (0..3).flat_map(|c| (0..pixels).map(move |i| interleaved[3 * i + c])).collect()
}

/// Planar `[3, pixels]` levels to interleaved RGB.
pub(crate) fn interleave_rgb(planar: &[u8], pixels: usize) -> Vec<u8> {
    (0..pixels).flat_map(|i| [planar[i], planar[pixels + i], planar[2 * pixels + i]]).collect()
}

pub(crate) fn plan_error(e: VaePlanError) -> RunError {
    RunError::layout("VAE")(&e)
}
