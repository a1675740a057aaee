//! What `gen`'s flags give the job: the prompts, and the init image with its mask.

use super::GenArgs;
use flux_lite_platform::model::ModelFolder;
use flux_lite_platform::pipeline::embeddings_file::{self, EmbeddingsFile};
use flux_lite_platform::pipeline::reference_image::{self, Fit};
use flux_lite_platform::pipeline::{inpaint, mask_crop, InitImage, Prompt};
use flux_lite_platform::{RequestError, RunError};

/// An image file's error named by the flag that gave the file.
fn named(flag: &str, e: &RunError) -> String {
    match e {
        RunError::Request(r @ RequestError::Reference { .. }) => r.line(flag),
        e => crate::errors::run_line(e),
    }
}

/// `--init-image`, `--mask`, `--strength` and `--mask-crop`: the init image
/// brought to whole latent cells, its mask at its size (with `--mask-crop`,
/// both the crop around the mask, put back over the image after the decode).
pub fn init_image(args: &GenArgs, model: &ModelFolder) -> Result<Option<InitImage>, String> {
    let Some(path) = &args.init_image else {
        return match (&args.mask, args.strength) {
            (Some(_), _) => Err("--mask needs --init-image (the picture the mask is for)".into()),
            (None, Some(_)) => Err("--strength needs --init-image (the picture to start from)".into()),
            (None, None) if args.mask_crop.is_some() => Err("--mask-crop needs --init-image and --mask (the region comes from the mask)".into()),
            (None, None) => Ok(None),
        };
    };
    let strength = args.strength.unwrap_or(flux_lite_platform::pipeline::job::DEFAULT_STRENGTH);
    if let Some(pad) = args.mask_crop {
        let Some(mask_path) = &args.mask else {
            return Err("--mask-crop needs --mask (the region comes from the mask)".into());
        };
        let image = reference_image::decode(path).map_err(|e| named("--init-image", &e))?;
        let (_, mask) = reference_image::decode(mask_path).map_err(|e| named("--mask", &e))?;
        let name = mask_path.display().to_string();
        return mask_crop::prepare(path, image, &name, mask, pad, model.vae.latent_cell(), strength).map(Some).map_err(|e| named("--init-image", &e));
    }
    let image = reference_image::load_fitted(path, model.vae.latent_cell(), Fit::Resize).map_err(|e| named("--init-image", &e))?;
    let mask = match &args.mask {
        Some(m) => Some(inpaint::load_mask(m, image.width, image.height).map_err(|e| named("--mask", &e))?),
        None => None,
    };
    Ok(Some(InitImage { image, mask, strength, overlay: None }))
}

/// The prompts the flags give: `--prompt`/`--prompt-file`, `--batch-file`'s
/// lines, or `--embeddings` (read for a model whose joint width is `joint`).
pub fn prompts(args: &GenArgs, joint: usize) -> Result<Vec<Prompt>, String> {
    let text = crate::prompt::from_flags(args.prompt.as_deref(), args.prompt_file.as_deref())?;
    let negative = args.negative_prompt.clone().unwrap_or_default();
    if args.negative_prompt.is_some() && args.embeddings.is_some() {
        return Err("--negative-prompt with --embeddings: the embeddings file holds the negative (flux-lite encode --negative-prompt writes it)".into());
    }
    let text_prompt = |positive: String| Prompt::with_negative(positive, negative.clone());
    match (text, &args.embeddings, &args.batch_file) {
        (None, None, Some(path)) => Ok(crate::prompt::lines(path)?.into_iter().map(text_prompt).collect()),
        (_, _, Some(path)) => Err(format!("--batch-file {} gives the prompts: leave out --prompt, --prompt-file and --embeddings", path.display())),
        (Some(text), None, None) => Ok(vec![text_prompt(text)]),
        (Some(_), Some(_), None) => Err("give --prompt or --embeddings, not both".into()),
        (None, None, None) => Err("give --prompt TEXT (or --prompt-file FILE, --batch-file FILE or --embeddings FILE)".into()),
        (None, Some(path), None) => {
            let file = EmbeddingsFile::open(path)?;
            let positive = file.get(embeddings_file::PROMPT, joint)?.ok_or_else(|| format!("{}: no tensor `{}`", path.display(), embeddings_file::PROMPT))?;
            Ok(vec![Prompt::Embeddings { positive, negative: file.get(embeddings_file::NEGATIVE, joint)? }])
        }
    }
}
