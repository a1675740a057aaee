//! Text-to-latents: the starting noise as diffusers draws it, the schedule,
//! and the denoising loop over the prepared transformer.

use flux_lite_kernels::{Gpu, GpuError};
use crate::error::RunError;
use crate::exec::runner::BlockProgress;
use crate::components::transformer::Transformer;
use flux_lite_core::config::{ImageSize, SchedulerConfig, SizeError, VaeConfig};
use flux_lite_core::numerics::rng::TorchGenerator;
use flux_lite_core::numerics::schedule;

/// The latent token grid `(rows, cols)` of an image size the VAE can take.
pub fn latent_grid(vae: &VaeConfig, width: usize, height: usize) -> Result<(usize, usize), SizeError> {
    let (rows, cols) = ImageSize::new(vae, width as u64, height as u64)?.latent_grid();
    Ok((rows as usize, cols as usize))
}

/// `torch.randn((1, channels, h, w), generator=manual_seed(seed), dtype=bfloat16)`,
/// widened to f32 and packed to `[h·w, channels]` (token `y·w + x`), as
/// `Flux2KleinPipeline` packs its latents.
pub fn packed_noise(seed: u64, channels: usize, h: usize, w: usize) -> Vec<f32> {
    let mut bits = vec![0u16; channels * h * w];
    TorchGenerator::new(seed).fill_randn_bf16(&mut bits);
    let mut packed = vec![0f32; bits.len()];
    for c in 0..channels {
        for t in 0..h * w {
            packed[t * channels + c] = flux_lite_core::numerics::bf16::to_f32(bits[c * h * w + t]);
        }
    }
    packed
}

/// Where the loop is, for progress reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepProgress {
    /// 0-based step index.
    pub step: usize,
    pub steps: usize,
    pub block: BlockProgress,
}

/// The prompt embeddings a denoising run conditions on.
#[derive(Debug, Clone, Copy)]
pub enum Conditioning<'a> {
    /// One pass per step.
    Prompt(&'a [f32]),
    /// Classifier-free guidance: an unconditional and a conditional pass per
    /// step (in that order), `v = v_neg + scale·(v_pos − v_neg)`.
    Guided { positive: &'a [f32], negative: &'a [f32], scale: f32 },
}

/// Image-to-image or inpainting ([`super::inpaint`]): the schedule starts
/// at `first_step` from `image` (the init image's packed latents) noised to
/// that point, and after each step the tokens outside `mask` go back to it.
#[derive(Debug, Clone, Copy)]
pub struct Init<'a> {
    pub first_step: usize,
    pub image: &'a [f32],
    /// Per token, 1 where repainted; `None`: every token.
    pub mask: Option<&'a [f32]>,
}

/// What a caller sees of a denoising run as it goes.
pub trait Watch {
    /// Blocks done in the step in progress.
    fn progress(&mut self, p: StepProgress);

    /// After each step run (0-based, from the first step run): the
    /// transformer, its latents updated (previews are drawn from them).
    fn after_step(&mut self, _step: usize, _transformer: &Transformer) -> Result<(), RunError> {
        Ok(())
    }
}

/// A closure watches the progress alone.
impl<F: FnMut(StepProgress)> Watch for F {
    fn progress(&mut self, p: StepProgress) {
        self(p)
    }
}

/// Runs the Euler steps of a `steps`-step schedule (from `init`'s first
/// step, else all) from `noise` and returns the final packed latents
/// `[tokens, channels]`, `watch` seeing its progress and each step's
/// result. Everything on the device was allocated before the first step;
/// the latents stay on the device until the end (an inpainting mask takes
/// them to the host and back each step).
#[allow(clippy::too_many_arguments)] // the run's inputs, and what the caller sees of it as it goes
pub fn denoise(
    gpu: &Gpu,
    transformer: &Transformer,
    scheduler: &SchedulerConfig,
    steps: usize,
    noise: &[f32],
    init: Option<Init<'_>>,
    conditioning: Conditioning<'_>,
    watch: &mut dyn Watch,
) -> Result<Vec<f32>, RunError> {
    // The schedule's shift counts the noise tokens only, as the pipeline does.
    let tokens = transformer.layout.noise as usize;
    let mut sigmas = vec![0f32; steps + 1];
    schedule::sigmas(scheduler, tokens, steps, &mut sigmas).map_err(|error| RunError::Schedule { steps, error })?;
    let first = init.map_or(0, |i| i.first_step);
    match init {
        Some(i) => transformer.set_latents(gpu, &super::inpaint::noised(sigmas[first], noise, i.image))?,
        None => transformer.set_latents(gpu, noise)?,
    }
    let blocks = transformer.block_count();
    let run = steps - first;
    for step in first..steps {
        let n = step - first;
        let progress = &mut |p: StepProgress| watch.progress(StepProgress { step: n, steps: run, ..p });
        let t = schedule::timestep_for(scheduler.num_train_timesteps, sigmas[step]);
        // The KV pipeline extracts the references' keys and values on its first step and reads them after.
        transformer.use_kv_cache(step > first);
        match conditioning {
            Conditioning::Prompt(prompt) => {
                transformer.set_prompt(gpu, prompt)?;
                transformer.forward(gpu, t, &mut |block| progress(StepProgress { step, steps, block }))?;
            }
            Conditioning::Guided { positive, negative, scale } => {
                // Progress counts both passes as one step of 2 × blocks.
                transformer.set_prompt(gpu, negative)?;
                transformer.forward(gpu, t, &mut |b| {
                    progress(StepProgress { step, steps, block: BlockProgress { done: b.done, total: 2 * blocks } })
                })?;
                transformer.keep_unconditional(gpu)?;
                transformer.set_prompt(gpu, positive)?;
                transformer.forward(gpu, t, &mut |b| {
                    progress(StepProgress { step, steps, block: BlockProgress { done: blocks + b.done, total: 2 * blocks } })
                })?;
                transformer.guide(gpu, scale)?;
            }
        }
        transformer.euler_step(gpu, sigmas[step], sigmas[step + 1])?;
        if let Some(Init { image, mask: Some(mask), .. }) = init {
            let mut latents = transformer.latents(gpu)?;
            let next = (step + 1 < steps).then(|| sigmas[step + 1]);
            super::inpaint::keep_unmasked(&mut latents, image, noise, mask, next);
            transformer.set_latents(gpu, &latents)?;
        }
        watch.after_step(n, transformer)?;
    }
    let latents = transformer.latents(gpu)?;
    plausible_latents(&latents)?;
    Ok(latents)
}

/// Denoised latents that cannot come from a working GPU, refused before
/// they are decoded into an image: any value not finite (f32 overflow, or a
/// failed submission some backends count as done), or one value throughout
/// (a buffer never written). Noise plus a velocity is never constant.
pub fn plausible_latents(latents: &[f32]) -> Result<(), RunError> {
    let broken = latents.iter().filter(|v| !v.is_finite()).count();
    if broken > 0 {
        return Err(RunError::Gpu(GpuError::WrongResult(format!("{broken} of the {} denoised latent values are not finite", latents.len()))));
    }
    if latents.len() > 1 && latents.iter().all(|&v| v == latents[0]) {
        return Err(RunError::Gpu(GpuError::WrongResult(format!("the denoised latents are {} throughout", latents[0]))));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::plausible_latents;

    #[test]
    fn latents_that_no_working_gpu_makes_are_refused() {
        assert!(plausible_latents(&[0.5, -1.25, 3.0]).is_ok());
        let nan = plausible_latents(&[0.5, f32::NAN, f32::INFINITY]).unwrap_err().to_string();
        assert!(nan.contains("2 of the 3 denoised latent values are not finite") && nan.contains("nothing was written"), "{nan}");
        let constant = plausible_latents(&[0.0; 16]).unwrap_err().to_string();
        assert!(constant.contains("the denoised latents are 0 throughout"), "{constant}");
    }
}
