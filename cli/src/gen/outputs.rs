//! Where `gen`'s images go.

use flux_lite_platform::pipeline::image_file::{encode_image, ImageFormat};
use flux_lite_platform::pipeline::{output, Made};
use std::path::PathBuf;

/// The output flags checked before any work: a file, a pipe or `-`, at most
/// one of them standard output; a preview only to a file; the image's
/// format by its extension, `--quality` only for JPEG. Returns that format.
pub fn check_flags(output: &Option<PathBuf>, latents: &Option<PathBuf>, preview: &Option<PathBuf>, preview_every: usize, quality: Option<u8>) -> Result<ImageFormat, String> {
    if output.is_none() && latents.is_none() {
        return Err("give --output FILE.png (or --output-latents FILE)".into());
    }
    let to_stdout = |p: &Option<PathBuf>| p.as_deref().is_some_and(|p| p.as_os_str() == output::STDOUT);
    if to_stdout(output) && to_stdout(latents) {
        return Err("--output - and --output-latents -: only one of them can go to standard output".into());
    }
    for (flag, path) in [("--output", output), ("--output-latents", latents), ("--preview", preview)] {
        if let Some(path) = path {
            output::check_output_path(flag, path)?;
        }
    }
    if to_stdout(preview) {
        return Err("--preview -: a preview is rewritten after each step, so it goes to a file".into());
    }
    if preview_every == 0 {
        return Err("--preview-every 0: give a number of steps, 1 or more".into());
    }
    if let Some(path) = preview {
        ImageFormat::for_path(path, None).map_err(|e| format!("--preview {e}"))?;
    }
    match output {
        Some(path) => ImageFormat::for_path(path, quality).map_err(|e| format!("--output {e}")),
        None if quality.is_some() => Err("--quality is the JPEG's: give --output FILE.jpg".into()),
        None => Ok(ImageFormat::Png),
    }
}

/// Where each image of the run goes: the paths the flags give for one
/// image; `NAME-0001.png`, … for several, none of which may exist.
pub struct Outputs {
    images: Option<Vec<PathBuf>>,
    format: ImageFormat,
    latents: Option<Vec<PathBuf>>,
}

impl Outputs {
    pub fn new(images_to: &Option<PathBuf>, format: ImageFormat, latents: &Option<PathBuf>, images: usize) -> Result<Self, String> {
        let name = |flag: &str, path: &Option<PathBuf>| -> Result<Option<Vec<PathBuf>>, String> {
            let Some(path) = path else { return Ok(None) };
            if images == 1 {
                return Ok(Some(vec![path.clone()]));
            }
            if path.as_os_str() == output::STDOUT {
                return Err(format!("{flag} -: {images} images cannot all go to standard output; give a file name (they are numbered)"));
            }
            let paths: Vec<PathBuf> = (0..images).map(|i| numbered(path, i)).collect();
            if let Some(taken) = paths.iter().find(|p| p.symlink_metadata().is_ok()) {
                return Err(format!("{flag}: {} exists; a batch never overwrites a file (move it, or give another name)", taken.display()));
            }
            Ok(Some(paths))
        };
        Ok(Self { images: name("--output", images_to)?, format, latents: name("--output-latents", latents)? })
    }

    /// Writes image `index`'s latents and image file; an error is one line naming the file.
    pub fn write(&self, made: &Made, in_channels: usize, text: &[(&str, String)]) -> Result<(), String> {
        let several = self.images.as_ref().or(self.latents.as_ref()).is_some_and(|p| p.len() > 1);
        if let Some(path) = self.latents.as_ref().map(|p| &p[made.index]) {
            if several && path.symlink_metadata().is_ok() {
                return Err(format!("--output-latents: {} appeared during the run; a batch never overwrites a file", path.display()));
            }
            output::write_f32_tensors(path, &[("latents", &made.latents)], in_channels, text)?;
        }
        if let (Some(path), Some(image)) = (self.images.as_ref().map(|p| &p[made.index]), &made.image) {
            if several && path.symlink_metadata().is_ok() {
                return Err(format!("--output: {} appeared during the run; a batch never overwrites a file", path.display()));
            }
            let bytes = encode_image(self.format, image.width as u32, image.height as u32, &image.rgb, text)?;
            output::write_atomically(path, &bytes)?;
            eprintln!("wrote {}", output::shown(path));
        }
        Ok(())
    }
}

/// `dir/NAME-0001.ext` for image 0 of `dir/NAME.ext`.
fn numbered(path: &std::path::Path, index: usize) -> PathBuf {
    let stem = path.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let name = match path.extension() {
        Some(ext) => format!("{stem}-{:04}.{}", index + 1, ext.to_string_lossy()),
        None => format!("{stem}-{:04}", index + 1),
    };
    path.with_file_name(name)
}
