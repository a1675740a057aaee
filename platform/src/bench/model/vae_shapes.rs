//! The VAE's benchmarks at a model's shapes: the decode whole and by
//! bands, the tiny preview decoder, one up block.

use super::*;
use flux_lite_core::models::vae_encoder;

impl<'g> ShapeBench<'g> {
    /// Why the untiled VAE decoder cannot run at `size`² on this adapter (its
    /// arena above the largest buffer, or one activation above the largest
    /// binding; `gen` decodes such sizes in tiles), or `None` if it can.
    pub fn vae_unfit(&self, cfg: &VaeConfig, size: u64) -> Option<String> {
        let latent = size / cfg.scale_factor() as u64;
        let channels_last = self.gpu.plan_limits().half_operands;
        let tensor = vae::largest_binding(cfg, latent * latent, channels_last);
        self.unfit(vae::arena_bytes(cfg, latent, latent, channels_last).map_err(|e| e.to_string()), tensor)
    }

    /// Why an arena of `arena` bytes with a largest tensor of `tensor` bytes
    /// does not fit this adapter's buffers and bindings, or `None`.
    fn unfit(&self, arena: Result<u64, String>, tensor: u64) -> Option<String> {
        let arena = match arena {
            Ok(bytes) => bytes,
            Err(e) => return Some(e),
        };
        let (buffer, binding) = (self.gpu.limits.max_buffer_size, self.gpu.max_binding());
        if arena > buffer {
            Some(format!("its {arena}-byte arena is above the adapter's largest buffer, {buffer} bytes"))
        } else if tensor > binding {
            Some(format!("a tensor of {tensor} bytes is above the adapter's largest binding, {binding} bytes"))
        } else {
            None
        }
    }

    /// The whole VAE decoder for a `size`² image, untiled, to its 8-bit levels as `gen` runs it.
    pub fn vae_decode(&self, cfg: &VaeConfig, size: u64) -> Result<Figure, RunError> {
        let (program, arena_bytes) = self.whole_decode(cfg, size)?;
        self.vae_program("VAE decode", format!("{size}×{size}"), cfg, &program, arena_bytes)
    }

    /// The untiled decode of a `size`² image op by op, each op timed
    /// alone (as [`ShapeBench::block_ops`] times a block's), summed by kind
    /// in the order each kind first runs, then the sum of them all: where
    /// a decode's time goes.
    pub fn vae_decode_ops(&self, cfg: &VaeConfig, size: u64) -> Result<Vec<Figure>, RunError> {
        let (program, arena_bytes) = self.whole_decode(cfg, size)?;
        let (placed, runner) = self.vae_placed(cfg, &program, arena_bytes)?;
        let timed = self.each_op(&program, &runner, &placed)?;
        let mut kinds: Vec<&str> = Vec::new();
        for (kind, _) in &timed {
            if !kinds.contains(kind) {
                kinds.push(kind);
            }
        }
        let shape = format!("{size}×{size}");
        let mut figures: Vec<Figure> = kinds
            .iter()
            .map(|k| {
                let of_kind: Vec<&Figure> = timed.iter().filter(|(kind, _)| kind == k).map(|(_, f)| f).collect();
                let count = if of_kind.len() == 1 { "1 op".to_string() } else { format!("{} ops", of_kind.len()) };
                block_ops::summed(format!("VAE decode: {k} ({count})"), shape.clone(), of_kind.into_iter())
            })
            .collect();
        figures.push(block_ops::summed("VAE decode, the sum of its ops timed alone".into(), shape, timed.iter().map(|(_, f)| f)));
        Ok(figures)
    }

    /// Why the untiled VAE encoder cannot take a `size`² image on this
    /// adapter (its arena above the largest buffer, or one tensor above the
    /// largest binding; `gen` encodes such images by bands), or `None` if it can.
    pub fn vae_encode_unfit(&self, cfg: &VaeConfig, size: u64) -> Option<String> {
        let channels_last = self.gpu.plan_limits().half_operands;
        self.unfit(vae_encoder::arena_bytes(cfg, size, size, channels_last).map_err(|e| e.to_string()), vae_encoder::largest_binding(cfg, size, size, channels_last))
    }

    /// The whole VAE encoder over a `size`² image, untiled, to its posterior
    /// mean, as `gen` encodes an init image or a reference the adapter holds whole.
    pub fn vae_encode(&self, cfg: &VaeConfig, size: u64) -> Result<Figure, RunError> {
        let mut arena = BumpArena::new(u64::MAX);
        let channels_last = self.gpu.plan_limits().half_operands;
        let layout = vae_encoder::VaeEncoderLayout::new(cfg, size, size, channels_last, &mut arena).map_err(|e| RunError::layout("VAE encoder")(&e))?;
        let program = collect_ops(|emit| flux_lite_core::models::vae_encoder_nhwc::encode_whole(&layout, emit));
        self.vae_program("VAE encode", format!("{size}×{size}"), cfg, &program, arena.high_water())
    }

    /// The VAE decode of a `size`² image by bands, as `gen` decodes an
    /// image the adapter cannot hold whole and the budget does not limit: by
    /// bands of one binding with the activations on the device (the plan's
    /// first choice then), else in the arena of the largest tile the adapter
    /// holds whole whose band takes a row of the widest convolution, with
    /// the activations in a scratch file; each op band by band, the
    /// wall-clock median of the decodes, each band's copies included.
    pub fn vae_decode_banded(&self, cfg: &VaeConfig, size: u64) -> Result<Figure, RunError> {
        let internal = |e: vae::VaePlanError| RunError::layout("VAE")(&e);
        // The program `gen` runs by bands: the whole decode's, levels included.
        let (program, arena_bytes) = self.whole_decode(cfg, size)?;
        let channels_last = self.gpu.plan_limits().half_operands;
        let scale = cfg.scale_factor() as u64;
        let limits = self.gpu.plan_limits();
        let row = flux_lite_core::models::vae_nhwc::decode_band_minimum(cfg, size / scale, size / scale, channels_last).map_err(internal)?;
        let (how, capacity, on_device) = match flux_lite_core::plan::decode_device_capacity(cfg, size, row, limits) {
            Some(capacity) => ("bands of a binding, activations on the device".to_string(), capacity, true),
            None => {
                // The plan's rule for a tile, the largest below the image first.
                let mut tiles = (1..size / (2 * scale)).rev().map(|n| n * 2 * scale);
                let (tile, capacity) = tiles
                    .find_map(|t| flux_lite_core::plan::decode_tile_capacity(cfg, t, size, row, limits).map(|c| (t, c)))
                    .ok_or_else(|| RunError::Layout { component: "VAE", detail: format!("no tile holds a row of a {size}-pixel-wide decode on this adapter") })?;
                (format!("a {tile}² tile's arena, activations on the host"), capacity, false)
            }
        };
        let weights = SyntheticWeights::new(|sink| tensors::vae(cfg, sink));
        let placed = weights.place(self.gpu, &program)?;
        Ok(Figure {
            what: "VAE decode, by bands".into(),
            shape: format!("{size}×{size}, {how}, wall clock"),
            seconds: self.banded_median(&program, &placed, capacity, arena_bytes / 4, on_device)?,
            flops: program.iter().map(Op::flops).sum(),
            bytes: program.iter().map(conv_bytes).sum(),
            matrix: self.products_on_matrix_units(),
            dispatches: None,
        })
    }

    /// A tiny preview decoder of TAEF2's shape (`taesd.py`'s decoder, 64
    /// channels, global-norm blocks in its first level) for this VAE's
    /// latents, decoding a `size`² image from packed latents to 8-bit levels,
    /// as `--preview-decoder` runs it after a step (channels-last on the
    /// matrix tier's f16 data path): whole where the adapter
    /// holds it (the latents' upload and the levels' readback excluded),
    /// else by bands in the largest tile's arena the plan would take
    /// (wall clock, each band's upload and readback included).
    pub fn tiny_decode(&self, cfg: &VaeConfig, size: u64) -> Result<Figure, RunError> {
        use flux_lite_core::models::tiny_decoder as tiny;
        let internal = |e: tiny::TinyDecoderError| RunError::layout("preview decoder")(&e);
        let channels_last = self.gpu.plan_limits().half_operands;
        let crate::bench::TinyDecode { shape, program, arena_bytes } = crate::bench::TinyDecode::taef2(cfg, [size, size], channels_last)?;
        let weights = SyntheticWeights::new(|sink| {
            tensors::vae(cfg, &mut |s: &tensors::TensorSpec| {
                if s.name.starts_with("bn.running_") {
                    sink(s)
                }
            });
            shape.tensors(|t| sink(&t.spec()));
        });
        let placed = weights.place(self.gpu, &program)?;
        let layouts = flux_lite_core::plan::preview_layouts(&shape, size, size, 0, self.gpu.plan_limits(), None).map_err(|e| RunError::layout("preview decoder")(&e))?;
        let first = layouts.first().copied().unwrap_or_default();
        let (how, seconds, dispatches) = match first.tile {
            None => {
                let runner = self.runner(arena_bytes, 0, 0, false);
                let d = runner.prepare_block(self.gpu, &placed, 0, &program)?;
                (String::new(), self.timer.median(&d, self.repeats)?, Some(d.len() as u64))
            }
            Some(tile) => {
                let capacity = tiny::band_capacity(&shape, tile / cfg.scale_factor() as u64, self.gpu.max_binding(), channels_last).map_err(internal)?;
                let (how, elements) = (if first.on_device { "activations on the device" } else { "activations on the host" }, arena_bytes / 4);
                (format!(", by bands in a {tile}² tile's arena, {how}, wall clock"), self.banded_median(&program, &placed, capacity, elements, first.on_device)?, None)
            }
        };
        Ok(Figure {
            what: "tiny decoder".into(),
            shape: format!("{size}×{size}, TAEF2's shape{how}"),
            seconds,
            flops: program.iter().map(Op::flops).sum(),
            bytes: program.iter().map(conv_bytes).sum(),
            matrix: self.products_on_matrix_units(),
            dispatches,
        })
    }

    /// The wall-clock median of `repeats` runs of `program` op by op over
    /// bands whose operands take `capacity` f32, with fresh storage for the
    /// whole image's `elements` f32 of activations each run: on the device
    /// when `on_device`, else in a scratch file.
    pub(super) fn banded_median(&self, program: &[Op], weights: &DeviceWeights, capacity: u64, elements: u64, on_device: bool) -> Result<f64, RunError> {
        use crate::exec::activations::BandActivations;
        use crate::exec::vae_bands::BandRunner;
        let mut runner = self.runner(vae::band_arena_bytes(capacity), 0, 0, false);
        runner.operands = crate::exec::runner::attention_buffers(self.gpu, program).0;
        let bands = BandRunner { gpu: self.gpu, runner: &runner, weights, capacity };
        let mut times = Vec::new();
        for _ in 0..self.repeats.max(1) {
            let activations = BandActivations::new(self.gpu, elements, on_device)?;
            let mut held = activations.hold()?;
            self.gpu.wait()?;
            let start = std::time::Instant::now();
            for op in program {
                bands.run(held.store(), op)?;
            }
            self.gpu.wait()?;
            times.push(start.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// The VAE decoder's last up block (the one at full resolution) for a `size`² image.
    pub fn vae_up_block(&self, cfg: &VaeConfig, size: u64) -> Result<Figure, RunError> {
        // The channel-major program's block.
        let (layout, arena_bytes) = vae_layout(cfg, size, false)?;
        let last = vae::up_block_count(&layout).saturating_sub(1);
        let block = collect_ops(|emit| vae::up_block(&layout, last, emit));
        let channels = cfg.decoder_channels().first().copied().unwrap_or(0);
        self.vae_program("VAE up block", format!("{size}×{size}, {channels} channels"), cfg, &block, arena_bytes)
    }

    /// Times VAE decoder steps over an arena of `arena_bytes`.
    pub(super) fn vae_program(&self, what: &str, shape: String, cfg: &VaeConfig, program: &[Op], arena_bytes: u64) -> Result<Figure, RunError> {
        let (placed, runner) = self.vae_placed(cfg, program, arena_bytes)?;
        let d = runner.prepare_block(self.gpu, &placed, 0, program)?;
        Ok(Figure {
            what: what.into(),
            shape,
            seconds: self.timer.median(&d, self.repeats)?,
            flops: program.iter().map(Op::flops).sum(),
            // Each convolution's input, output and weights once, at least.
            bytes: program.iter().map(conv_bytes).sum(),
            matrix: self.products_on_matrix_units(),
            dispatches: Some(d.len() as u64),
        })
    }

    /// The untiled decoder's program for a `size`² image, to its 8-bit
    /// levels, as this device lays it out (channels-last on f16 tiles), and
    /// its arena bytes.
    fn whole_decode(&self, cfg: &VaeConfig, size: u64) -> Result<(Vec<Op>, u64), RunError> {
        let channels_last = self.gpu.plan_limits().half_operands;
        let (layout, arena_bytes) = vae_layout(cfg, size, channels_last)?;
        Ok((collect_ops(|emit| flux_lite_core::models::vae_nhwc::decode_whole(&layout, channels_last, emit)), arena_bytes))
    }

    /// Synthetic VAE weights placed for `program`, and an arena of
    /// `arena_bytes` to run it in.
    fn vae_placed(&self, cfg: &VaeConfig, program: &[Op], arena_bytes: u64) -> Result<(DeviceWeights, Runner), RunError> {
        let weights = SyntheticWeights::new(|sink| tensors::vae(cfg, sink));
        let mut runner = self.runner(arena_bytes, 0, 0, false);
        runner.operands = crate::exec::runner::attention_buffers(self.gpu, program).0;
        Ok((weights.place(self.gpu, program)?, runner))
    }
}

/// The untiled decode's layout for a `size`² image and its arena bytes.
fn vae_layout(cfg: &VaeConfig, size: u64, channels_last: bool) -> Result<(vae::VaeLayout, u64), RunError> {
    let latent = size / cfg.scale_factor() as u64;
    let mut arena = BumpArena::new(u64::MAX);
    let layout = vae::VaeLayout::new(cfg, latent, latent, channels_last, &mut arena).map_err(|e| RunError::layout("VAE")(&e))?;
    Ok((layout, arena.high_water()))
}

/// Bytes a convolution must at least move: its input (f32, or f16 with a
/// scale a pixel channels-last), weights (bf16) and output (f32) once each.
fn conv_bytes(op: &Op) -> u64 {
    let (c, input_bytes) = match op {
        Op::Conv2d { shape, .. } => (shape, 4 * shape.in_channels * shape.height * shape.width),
        Op::ConvNhwc { shape, .. } => (shape, (2 * shape.in_channels + 4) * shape.height * shape.width),
        _ => return 0,
    };
    let output = c.out_channels * c.out_height * c.out_width;
    let weights = c.out_channels * c.in_channels * c.kernel * c.kernel;
    (input_bytes + 4 * output + 2 * weights) as u64
}
