//! `--image FILE` as `gen` and `info` read it: the reference images, each
//! prepared as the pipeline prepares it (their number and sizes are checked
//! with the rest of the job, by `Job::resolve`).

use flux_lite_platform::model::ModelFolder;
use flux_lite_platform::pipeline::reference_image;
use flux_lite_platform::ReferenceImage;
use std::path::PathBuf;

/// Loads and prepares each `--image` file for `model`'s VAE.
pub fn load(paths: &[PathBuf], model: &ModelFolder) -> Result<Vec<ReferenceImage>, String> {
    let unit = model.vae.latent_cell();
    paths.iter().map(|path| reference_image::load(path, unit)).collect::<Result<_, _>>().map_err(|e| crate::errors::run_line(&e))
}
