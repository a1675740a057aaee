//! What `gen`'s flags give the job: the prompts, and the init image with its mask.

use super::GenArgs;
use flux_lite_platform::model::ModelFolder;
use flux_lite_platform::pipeline::embeddings_file::{self, EmbeddingsFile};
use flux_lite_platform::pipeline::init_image::{self, Marks, Source};
use flux_lite_platform::pipeline::{InitImage, Prompt};
use flux_lite_platform::{RequestError, RunError};

/// An image file's error named by the flag that gave the file: `--mask`
/// for the mask's, `--init-image` for the picture's.
fn named(e: &RunError, mask: Option<&std::path::Path>) -> String {
    match e {
        RunError::Request(r @ RequestError::Reference { name, .. }) => {
            let from_mask = mask.is_some_and(|m| m.display().to_string() == *name);
            r.line(if from_mask { "--mask" } else { "--init-image" })
        }
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
    if args.mask_crop.is_some() && args.mask.is_none() {
        return Err("--mask-crop needs --mask (the region comes from the mask)".into());
    }
    if args.mask_marks.is_some() && args.mask.is_none() {
        return Err("--mask-marks says what in --mask repaints: give --mask FILE too".into());
    }
    let mask = args.mask.as_deref().map(|m| (Source::File(m), args.mask_marks.unwrap_or(Marks::White)));
    let prepared = init_image::prepare(Source::File(path), mask, strength, args.mask_crop, model.vae.latent_cell());
    prepared.map(Some).map_err(|e| named(&e, args.mask.as_deref()))
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
