//! `gen --from IMAGE`: the request an image carries, run again. Every flag
//! given wins over the image's setting; the rest come from the image.

use super::GenArgs;
use crate::recipe::{self, Carried, Recipe, Source};
use flux_lite_platform::model::lora::LoraSpec;
use std::path::{Path, PathBuf};

/// What `--from` found: the image's recipe, for [`compare`] once the model
/// is open, and the folder holding the input images it kept (removed when
/// dropped, after the run).
#[derive(Debug, Default)]
pub struct Again {
    pub recipe: Option<Recipe>,
    _inputs: Option<tempfile::TempDir>,
}

/// Fills the flags left out from the settings `args.from` carries. An
/// image another tool made (A1111's `parameters` alone) gives its prompt,
/// negative, seed, steps, guidance and size; the model is then a flag. The
/// input images a server kept in its PNG are written to a temporary folder
/// and read from there.
pub fn fill(args: &mut GenArgs) -> Result<Again, String> {
    let Some(image) = args.from.clone() else { return Ok(Again::default()) };
    let shown = image.display().to_string();
    let from = recipe::read_image_file(&image).map_err(|e| format!("--from {e}"))?;
    let settings = match &from.carried {
        Carried::Recipe(r) => (**r).clone(),
        Carried::Infotext(info) => {
            fill_from_infotext(args, info, &shown)?;
            return Ok(Again::default());
        }
    };
    let folder = match from.inputs.is_empty() {
        true => None,
        false => Some(tempfile::Builder::new().prefix("flux-lite-from-").tempdir().map_err(|e| format!("--from {shown}: a folder for its input images: {e}"))?),
    };
    let r = &settings;
    let file = |s: &Source, what: &str| -> Result<PathBuf, String> {
        let field = match s {
            Source::File(f) => return Ok(PathBuf::from(f)),
            Source::Sent(field) => field,
        };
        match (from.input(field), &folder) {
            (Some(bytes), Some(dir)) => {
                let path = dir.path().join(field.replace(['/', '\\'], "_"));
                std::fs::write(&path, bytes).map_err(|e| format!("--from {shown}: writing its {what} `{field}`: {e}"))?;
                Ok(path)
            }
            _ => Err(format!("--from {shown}: its {what} came as `{field}` in a request to a server and is not in the image; give it with {}", flag_for(what))),
        }
    };
    args.model.get_or_insert_with(|| PathBuf::from(&r.model.folder));
    if args.transformer.is_none() {
        args.transformer = r.transformer.as_ref().map(PathBuf::from);
    }
    if args.text_encoder.is_none() {
        args.text_encoder = r.text_encoder.as_ref().map(PathBuf::from);
    }
    if prompt_left_out(args) {
        match &r.embeddings {
            Some(e) => args.embeddings = Some(PathBuf::from(e)),
            None => args.prompt = Some(r.prompt.clone()),
        }
        if args.negative_prompt.is_none() && args.embeddings.is_none() && !r.negative_prompt.is_empty() {
            args.negative_prompt = Some(r.negative_prompt.clone());
        }
    }
    args.seed.get_or_insert(r.seed);
    args.steps.get_or_insert(r.steps);
    args.guidance.get_or_insert(r.guidance);
    if args.lora.is_empty() {
        args.lora = r.lora.iter().map(|l| LoraSpec { path: PathBuf::from(&l.file), scale: l.scale }).collect();
    }
    if args.image.is_empty() {
        args.image = r.references.iter().map(|s| file(s, "reference image")).collect::<Result<_, _>>()?;
    }
    match (&r.init, &args.init_image) {
        (Some(init), None) => {
            args.init_image = Some(file(&init.image, "init image")?);
            if args.mask.is_none() {
                args.mask = init.mask.as_ref().map(|m| file(m, "mask")).transpose()?;
            }
            args.strength.get_or_insert(init.strength);
            if args.mask_crop.is_none() {
                args.mask_crop = init.mask_crop;
            }
            if args.mask_marks.is_none() && args.mask.is_some() {
                args.mask_marks = flux_lite_platform::pipeline::init_image::Marks::from_name(&init.mask_marks);
            }
        }
        // Without an init image the size is the image's own; with one, the init image sets it.
        (None, None) => {
            args.width.get_or_insert(r.width);
            args.height.get_or_insert(r.height);
        }
        (_, Some(_)) => {}
    }
    if args.vae_tile.is_none() {
        args.vae_tile = r.vae_tile;
    }
    if args.memory_budget.is_none() {
        args.memory_budget = r.memory_budget;
    }
    args.kv_cache.get_or_insert(r.kv_cache);
    if args.kv_precision.is_none() {
        args.kv_precision = Some(super::parse_kv_precision(&r.kv_precision).map_err(|e| format!("--from {shown}: {e}"))?);
    }
    if args.precision.is_none() {
        args.precision = flux_lite_platform::Precision::from_name(&r.precision);
    }
    Ok(Again { recipe: Some(settings), _inputs: folder })
}

/// What another tool's infotext gives: the prompts, seed, steps, guidance and size.
fn fill_from_infotext(args: &mut GenArgs, info: &recipe::Infotext, shown: &str) -> Result<(), String> {
    if args.model.is_none() {
        return Err(format!("--from {shown}: not made by flux-lite (its settings name no model folder); give --model DIR"));
    }
    if prompt_left_out(args) {
        args.prompt = Some(info.prompt.clone());
        if args.negative_prompt.is_none() && !info.negative_prompt.is_empty() {
            args.negative_prompt = Some(info.negative_prompt.clone());
        }
    }
    let number = |key: &str| info.get(key).map(|v| v.trim().parse::<f64>().map_err(|_| format!("--from {shown}: `{key}: {v}` is not a number")));
    if let Some(seed) = number("Seed").transpose()? {
        args.seed.get_or_insert(seed as u64);
    }
    if let Some(steps) = number("Steps").transpose()? {
        args.steps.get_or_insert(steps as usize);
    }
    if let Some(cfg) = number("CFG scale").transpose()? {
        args.guidance.get_or_insert(cfg as f32);
    }
    if let Some((w, h)) = info.size() {
        args.width.get_or_insert(w);
        args.height.get_or_insert(h);
    }
    Ok(())
}

fn prompt_left_out(args: &GenArgs) -> bool {
    args.prompt.is_none() && args.prompt_file.is_none() && args.batch_file.is_none() && args.embeddings.is_none()
}

fn flag_for(what: &str) -> &'static str {
    match what {
        "init image" => "--init-image",
        "mask" => "--mask",
        _ => "--image",
    }
}

/// Says where this run cannot make the image's bytes again: other weights,
/// or another adapter (whose last bits may differ).
pub fn compare(image: &Path, made: &Recipe, now: &recipe::Run) {
    if made.model.weights != now.model.weights {
        eprintln!(
            "warning: {} was made with other weights ({} as {}; here {} as {}): expect another image",
            image.display(),
            made.model.name,
            made.model.weights,
            now.model.name,
            now.model.weights
        );
    }
    if made.adapter != now.adapter || made.precision != now.precision {
        eprintln!(
            "notice: {} was made on {} at {}; here {} at {}: the same request, but the last bits may differ",
            image.display(),
            made.adapter,
            made.precision,
            now.adapter,
            now.precision
        );
    }
}
