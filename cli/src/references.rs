//! `--image FILE` as `gen` and `info` read it: the reference images, each
//! prepared as the pipeline prepares it, and the image size they imply.

use flux_lite_platform::model::ModelFolder;
use flux_lite_platform::pipeline::reference_image::{self, ReferenceImage, MAX_REFERENCES};
use std::path::PathBuf;

/// The image size without flags or reference images.
const DEFAULT_SIZE: usize = 1024;

/// Loads and prepares each `--image` file for `model`'s VAE (at most [`MAX_REFERENCES`]).
pub fn load(paths: &[PathBuf], model: &ModelFolder) -> Result<Vec<ReferenceImage>, String> {
    if paths.len() > MAX_REFERENCES {
        return Err(format!("{} reference images given; at most {MAX_REFERENCES} are supported", paths.len()));
    }
    let unit = model.vae.latent_cell();
    paths.iter().map(|path| reference_image::load(path, unit)).collect::<Result<_, _>>().map_err(|e| e.to_string())
}

/// `(width, height)`: the flags where given, else (as the pipeline) the
/// first reference's prepared size, else 1024.
pub fn image_size(width: Option<usize>, height: Option<usize>, references: &[ReferenceImage]) -> (usize, usize) {
    let first = references.first();
    (width.or(first.map(|r| r.width)).unwrap_or(DEFAULT_SIZE), height.or(first.map(|r| r.height)).unwrap_or(DEFAULT_SIZE))
}
