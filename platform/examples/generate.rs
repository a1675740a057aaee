//! The engine as a library: open a model folder once, describe a job of two
//! images, resolve it (the defaults and rules `flux-lite gen` applies), run
//! it, and write each image as a PNG as it is made.
//!
//! ```sh
//! cargo run --release -p flux-lite-platform --example generate -- test_vectors/models/tiny-a fox
//! ```
//! writes `fox-0.png` and `fox-1.png` (seeds 0 and 1, 128×128, the model's default steps).

use flux_lite_platform::pipeline::output;
use flux_lite_platform::{Job, Limits, Observer, Options, Pipeline, Progress, Prompt};
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
    let job = Job { width: Some(128), height: Some(128), seed: Some(0), images_per_prompt: 2, ..Job::new(Prompt::text("a red fox in the snow")) };
    let job = job.resolve(pipeline.model(), &Limits::default()).map_err(|e| e.to_string())?;
    pipeline
        .run(&job, &mut Steps, &mut |made| {
            let image = made.image.ok_or_else(|| flux_lite_platform::RunError::Internal("no image".into()))?;
            let png = flux_lite_platform::pipeline::image_file::encode_png(image.width as u32, image.height as u32, &image.rgb, &[("seed", made.seed.to_string())]).map_err(flux_lite_platform::RunError::Output)?;
            let path = PathBuf::from(format!("{stem}-{}.png", made.seed));
            output::write_atomically(&path, &png).map_err(flux_lite_platform::RunError::Output)?;
            eprintln!("wrote {}", path.display());
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}
