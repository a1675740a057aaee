//! The engine as a library: open a model folder once, generate two images
//! from it, and write them as PNGs.
//!
//! ```sh
//! cargo run --release -p flux-lite-platform --example generate -- test_vectors/models/tiny-a fox
//! ```
//! writes `fox-0.png` and `fox-1.png` (seeds 0 and 1, 128×128, the model's default steps).

use flux_lite_platform::pipeline::output;
use flux_lite_platform::pipeline::{Observer, Options, Pipeline, Progress, Prompt, Request};
use std::path::PathBuf;

/// Prints each finished denoising step.
struct Steps;

impl Observer for Steps {
    fn progress(&mut self, p: Progress) {
        if let Progress::Denoise(s) = p {
            if s.block.done == s.block.total {
                eprintln!("step {}/{}", s.step + 1, s.steps);
            }
        }
    }

    fn warning(&mut self, message: &str) {
        eprintln!("{message}");
    }
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let (Some(model), Some(stem)) = (args.next(), args.next()) else {
        return Err("usage: generate MODEL_DIR OUTPUT_STEM".into());
    };
    let pipeline = Pipeline::open(model.as_ref(), Options::default()).map_err(|e| e.to_string())?;
    let steps = if pipeline.model().index.is_distilled { 4 } else { 50 };
    let prompt = Prompt::Text("a red fox in the snow".into());
    for seed in 0..2 {
        let request = Request { width: 128, height: 128, steps, seed, guidance: 1.0, vae_tile: None, memory_budget: None, references: Vec::new(), lora: Default::default() };
        let image = pipeline.generate(&prompt, &request, &[], &mut Steps).map_err(|e| e.to_string())?.image.ok_or("no image")?;
        let png = output::encode_png(image.width as u32, image.height as u32, &image.rgb, &[("seed", seed.to_string())])?;
        let path = PathBuf::from(format!("{stem}-{seed}.png"));
        output::write_atomically(&path, &png)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
