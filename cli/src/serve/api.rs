//! The two request shapes front ends already speak, read into one [`Order`]
//! and checked before anything is queued: OpenAI's Images API
//! (`/v1/images/generations`, `/v1/images/edits` with JSON images) and
//! AUTOMATIC1111's (`/sdapi/v1/txt2img`, `/sdapi/v1/img2img`). Unknown
//! fields are ignored, as those servers do; a field of the wrong type, a size
//! off the VAE's grid, too many steps or images, a prompt too long, or a
//! request the memory budget cannot hold is a 400 with one JSON line.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use flux_lite_platform::pipeline::image_file::ImageFormat;
use flux_lite_platform::pipeline::init_image::{self, Marks, Source};
use flux_lite_platform::pipeline::job;
use flux_lite_platform::pipeline::reference_image;
use flux_lite_platform::pipeline::{InitImage, Prompt};
use flux_lite_platform::{Job, Pipeline, RequestError, Resolved, Setting};
use serde::Deserialize;

/// A request's error: its status and one line, sent as `{"error": {"message": …}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }

    pub fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn busy() -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "the queue is full; try again later")
    }

    pub fn cancelled(id: &str) -> Self {
        Self::new(StatusCode::CONFLICT, format!("job {id} was cancelled"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = if self.status.is_client_error() { "invalid_request_error" } else { "server_error" };
        // One line, as every error of this project: a JSON string has no raw line breaks.
        let body = serde_json::json!({ "error": { "message": self.message, "type": kind, "code": self.status.as_u16() } });
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("5"));
        }
        response
    }
}

/// The server's rules beyond a job's: its limits, budget and adapters.
#[derive(Debug, Clone)]
pub struct Limits {
    pub job: flux_lite_platform::Limits,
    pub memory_budget: Option<u64>,
    /// The precisions the transformer's keys and values may take (`--kv-precision`).
    pub kv_precision: flux_lite_platform::pipeline::KvPrecision,
    /// The server's LoRA adapters (`--lora`), added to every request.
    pub lora: std::sync::Arc<flux_lite_platform::model::lora::LoraSet>,
}

/// A checked request, ready to queue.
#[derive(Debug)]
pub struct Order {
    pub job: Resolved,
    /// The file format its images are sent in.
    pub format: ImageFormat,
    /// What its images carry of how they were made.
    pub run: crate::recipe::Run,
    /// The input images the request sent, by field, which its PNGs keep.
    pub inputs: Vec<(String, Vec<u8>)>,
}

impl Order {
    /// The request's one prompt (a request has one, made `n` times).
    pub fn prompt(&self) -> &Prompt {
        &self.job.batch().prompts[0]
    }
}

/// What both shapes ask for, before it is checked.
#[derive(Debug)]
pub struct Asked {
    pub prompt: String,
    /// What to steer away from under guidance; empty: the empty prompt, as diffusers.
    pub negative_prompt: String,
    pub width: Option<usize>,
    pub height: Option<usize>,
    pub steps: Option<usize>,
    pub seed: Option<u64>,
    pub guidance: Option<f32>,
    pub count: usize,
    /// Reference images: `(field name for errors, file bytes)`.
    pub images: Vec<(String, Vec<u8>)>,
    /// Image-to-image or inpainting.
    pub init: Option<AskedInit>,
    /// The images' file format (OpenAI's `output_format`; A1111's answers are PNG).
    pub format: ImageFormat,
}

/// The picture to change, its mask and the strength, before they are checked.
#[derive(Debug)]
pub struct AskedInit {
    pub image: (String, Vec<u8>),
    pub mask: Option<AskedMask>,
    pub strength: f64,
    /// Work on the region around the mask grown by this many pixels, and
    /// paste the result back (A1111's "only masked", diffusers' `padding_mask_crop`).
    pub crop: Option<usize>,
}

/// A mask's field name, its file bytes, and how it marks what to repaint.
#[derive(Debug)]
pub struct AskedMask {
    pub name: String,
    pub bytes: Vec<u8>,
    /// OpenAI's: transparent repaints. Else AUTOMATIC1111's: white repaints (black with `invert`).
    pub alpha: bool,
    pub invert: bool,
}

/// `POST /v1/images/generations` (and `/v1/images/edits` with `image`/`images`).
#[derive(Debug, Deserialize)]
pub struct OpenAiRequest {
    pub prompt: String,
    #[serde(default)]
    pub n: Option<usize>,
    /// "WxH", or "auto".
    #[serde(default)]
    pub size: Option<String>,
    #[serde(default)]
    pub response_format: Option<String>,
    /// `png` (the default), `jpeg` or `webp` (lossless), and the JPEG's
    /// quality as OpenAI's compression level (0 to 100, default 100).
    #[serde(default)]
    pub output_format: Option<String>,
    #[serde(default)]
    pub output_compression: Option<u8>,
    /// Extensions: the seed of the first image, the steps, the guidance
    /// scale, the negative prompt.
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub steps: Option<usize>,
    #[serde(default)]
    pub guidance: Option<f32>,
    #[serde(default)]
    pub negative_prompt: String,
    /// `/v1/images/edits`: one image (base64 or a data URL), or a list of them
    /// as strings or `{"image_url": …}` objects.
    #[serde(default)]
    pub image: Option<OneOrMany>,
    #[serde(default)]
    pub images: Option<OneOrMany>,
    /// `stream: true`: the answer comes as server-sent events,
    /// `partial_images` (0 to 3) previews of the image forming, then each image.
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub partial_images: Option<usize>,
    /// `/v1/images/edits`: a PNG whose transparent pixels mark what to repaint
    /// in the first image (inpainting; the other images stay references).
    #[serde(default)]
    pub mask: Option<ImageField>,
    /// Extension: with `mask`, how far from the first image to start (default 1).
    #[serde(default)]
    pub strength: Option<f64>,
}

/// How an OpenAI request wants its answer: `Some(partial images)` to stream it.
pub fn streaming(stream: Option<bool>, partial_images: Option<usize>) -> Result<Option<usize>, ApiError> {
    match (stream.unwrap_or(false), partial_images) {
        (_, Some(n)) if n > 3 => Err(ApiError::bad(format!("partial_images {n}: give 0 to 3"))),
        (false, Some(n)) if n > 0 => Err(ApiError::bad("partial_images needs stream: true")),
        (true, n) => Ok(Some(n.unwrap_or(0))),
        (false, _) => Ok(None),
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(ImageField),
    Many(Vec<ImageField>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ImageField {
    Text(String),
    Url { image_url: String },
}

impl OpenAiRequest {
    pub fn asked(self, model_default: usize) -> Result<Asked, ApiError> {
        if let Some(format) = self.response_format.as_deref() {
            if format != "b64_json" {
                return Err(ApiError::bad(format!("response_format {format:?}: only \"b64_json\" is served (images are not stored)")));
            }
        }
        let (width, height) = match self.size.as_deref() {
            None | Some("auto") => (None, None),
            Some(size) => {
                let (w, h) = parse_size(size).ok_or_else(|| ApiError::bad(format!("size {size:?}: give \"WIDTHxHEIGHT\", e.g. \"{model_default}x{model_default}\"")))?;
                (Some(w), Some(h))
            }
        };
        let mut images = Vec::new();
        for (field, value) in [("image", self.image), ("images", self.images)] {
            let list = match value {
                None => Vec::new(),
                Some(OneOrMany::One(one)) => vec![one],
                Some(OneOrMany::Many(many)) => many,
            };
            for (i, item) in list.into_iter().enumerate() {
                let text = match item {
                    ImageField::Text(t) | ImageField::Url { image_url: t } => t,
                };
                let name = format!("{field}[{i}]");
                images.push((name.clone(), decode_base64(&name, &text)?));
            }
        }
        let init = match (self.mask, self.strength) {
            (None, None) => None,
            (None, Some(_)) => return Err(ApiError::bad("strength needs mask (the first image is changed where the mask is transparent)")),
            (Some(mask), strength) => {
                if images.is_empty() {
                    return Err(ApiError::bad("mask needs image: the picture to change"));
                }
                let text = match mask {
                    ImageField::Text(t) | ImageField::Url { image_url: t } => t,
                };
                let mask = AskedMask { name: "mask".into(), bytes: decode_base64("mask", &text)?, alpha: true, invert: false };
                Some(AskedInit { image: images.remove(0), mask: Some(mask), strength: strength.unwrap_or(job::OPENAI_EDIT_STRENGTH), crop: None })
            }
        };
        let count = self.n.unwrap_or(1);
        let format = openai_format(self.output_format.as_deref(), self.output_compression)?;
        let (prompt, negative_prompt, steps, seed, guidance) = (self.prompt, self.negative_prompt, self.steps, self.seed, self.guidance);
        Ok(Asked { prompt, negative_prompt, width, height, steps, seed, guidance, count, images, init, format })
    }
}

/// `POST /sdapi/v1/txt2img` and `/sdapi/v1/img2img`.
#[derive(Debug, Deserialize)]
pub struct A1111Request {
    #[serde(default)]
    pub prompt: String,
    #[serde(default)]
    pub negative_prompt: String,
    #[serde(default)]
    pub width: Option<usize>,
    #[serde(default)]
    pub height: Option<usize>,
    #[serde(default)]
    pub steps: Option<usize>,
    /// -1 (A1111's default): a random seed.
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub cfg_scale: Option<f32>,
    #[serde(default)]
    pub batch_size: Option<usize>,
    #[serde(default)]
    pub n_iter: Option<usize>,
    /// img2img: the picture to change first (base64 or data URLs); the
    /// others are reference images.
    #[serde(default)]
    pub init_images: Vec<String>,
    /// img2img: how far from the first init image to start (A1111's default 0.75).
    #[serde(default)]
    pub denoising_strength: Option<f64>,
    /// img2img: what to repaint, white (black with `inpainting_mask_invert: 1`).
    #[serde(default)]
    pub mask: Option<String>,
    #[serde(default)]
    pub inpainting_mask_invert: Option<u8>,
    /// img2img with a mask: "only masked", the region around the mask grown
    /// by `inpaint_full_res_padding` pixels (A1111's default 32), pasted back.
    #[serde(default)]
    pub inpaint_full_res: Option<bool>,
    #[serde(default)]
    pub inpaint_full_res_padding: Option<usize>,
    /// Fields with no diffusers equivalent, accepted only at the value that
    /// matches what runs: no blur, the original content.
    #[serde(default)]
    pub mask_blur: Option<u32>,
    #[serde(default)]
    pub inpainting_fill: Option<u8>,
}

/// AUTOMATIC1111's `inpaint_full_res_padding` when a request gives none.
const A1111_FULL_RES_PADDING: usize = 32;

impl A1111Request {
    pub fn asked(self) -> Result<Asked, ApiError> {
        let guidance = self.cfg_scale;
        let seed = match self.seed {
            None | Some(-1) => None,
            Some(s) if s < 0 => return Err(ApiError::bad(format!("seed {s}: give -1 (random) or a seed ≥ 0"))),
            Some(s) => Some(s as u64),
        };
        let count = self.batch_size.unwrap_or(1).saturating_mul(self.n_iter.unwrap_or(1));
        for (field, set, runs) in [
            ("mask_blur", self.mask_blur.is_some_and(|b| b != 0), "0 (the mask is used as sent)"),
            ("inpainting_fill", self.inpainting_fill.is_some_and(|f| f != 1), "1 (the original content, noised)"),
            ("inpainting_mask_invert", self.inpainting_mask_invert.is_some_and(|i| i > 1), "0 or 1"),
        ] {
            if set {
                return Err(ApiError::bad(format!("{field}: not supported as sent; leave it out or set it to {runs}")));
            }
        }
        let mut images: Vec<(String, Vec<u8>)> = self
            .init_images
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let name = format!("init_images[{i}]");
                decode_base64(&name, text).map(|b| (name, b))
            })
            .collect::<Result<_, _>>()?;
        let mask = match &self.mask {
            Some(text) => Some(AskedMask { name: "mask".into(), bytes: decode_base64("mask", text)?, alpha: false, invert: self.inpainting_mask_invert == Some(1) }),
            None => None,
        };
        let crop = match self.inpaint_full_res {
            Some(true) if mask.is_none() => return Err(ApiError::bad("inpaint_full_res: needs a mask (the region comes from it)")),
            Some(true) => Some(self.inpaint_full_res_padding.unwrap_or(A1111_FULL_RES_PADDING)),
            _ => None,
        };
        let init = match images.is_empty() {
            true if mask.is_some() => return Err(ApiError::bad("mask needs init_images: the picture to change")),
            true => None,
            false => Some(AskedInit { image: images.remove(0), mask, strength: self.denoising_strength.unwrap_or(job::A1111_STRENGTH), crop }),
        };
        let (width, height, steps) = (self.width, self.height, self.steps);
        Ok(Asked { prompt: self.prompt, negative_prompt: self.negative_prompt, width, height, steps, seed, guidance, count, images, init, format: ImageFormat::Png })
    }
}

/// OpenAI's `output_format` and `output_compression`: JPEG's quality is the
/// compression level (100, the default, the best); WebP is written lossless,
/// so only 100 matches it; PNG takes none.
fn openai_format(format: Option<&str>, compression: Option<u8>) -> Result<ImageFormat, ApiError> {
    let name = format.unwrap_or("png");
    let named = ImageFormat::named(name, None).map_err(|e| ApiError::bad(format!("output_format {e}")))?;
    match (named, compression) {
        (ImageFormat::Jpeg { .. }, c) => ImageFormat::named(name, Some(c.unwrap_or(100).max(1))).map_err(|e| ApiError::bad(format!("output_compression: {e}"))),
        (ImageFormat::Webp, None | Some(100)) | (ImageFormat::Png, None) => Ok(named),
        (ImageFormat::Webp, Some(c)) => Err(ApiError::bad(format!("output_compression {c}: webp is written lossless; leave it out or give 100"))),
        (ImageFormat::Png, Some(c)) => Err(ApiError::bad(format!("output_compression {c}: only jpeg and webp take it"))),
    }
}

/// Which request shape asked, for naming its fields in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    OpenAi,
    A1111,
}

/// Checks what was asked as `gen` checks its flags (one `Job`, resolved),
/// then against the memory plan; the errors name the shape's fields.
pub fn check(asked: Asked, shape: Shape, pipeline: &Pipeline, limits: &Limits, server: &crate::recipe::Run) -> Result<Order, ApiError> {
    let model = pipeline.model();
    let unit = model.vae.latent_cell();
    // The job's own rule, checked before any image is decoded (a request may carry many).
    let count = asked.images.len() + usize::from(asked.init.is_some());
    job::check_reference_count(count).map_err(|e| ApiError::bad(request_line(&e, shape, &asked)))?;
    let references = asked
        .images
        .iter()
        .map(|(name, bytes)| reference_image::from_bytes(name, bytes, unit).map_err(|e| ApiError::bad(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    let init = match &asked.init {
        Some(init) => Some(init_image(init, unit).map_err(|e| ApiError::bad(e.to_string()))?),
        None => None,
    };
    let job = Job {
        init,
        images_per_prompt: asked.count,
        references,
        width: asked.width,
        height: asked.height,
        steps: asked.steps,
        guidance: asked.guidance,
        seed: asked.seed,
        lora: limits.lora.clone(),
        memory_budget: limits.memory_budget,
        kv_precision: limits.kv_precision,
        ..Job::new(Prompt::with_negative(asked.prompt.clone(), asked.negative_prompt.clone()))
    };
    let job = job.resolve(model, &limits.job).map_err(|e| ApiError::bad(request_line(&e, shape, &asked)))?;
    let (width, height) = (job.request().width, job.request().height);
    pipeline.plan(&job).map_err(|e| ApiError::bad(format!("{width}x{height}: {}", plan_reason(&e))))?;
    let sent = |name: &String| crate::recipe::Source::Sent(name.clone());
    let run = crate::recipe::Run {
        references: asked.images.iter().map(|(name, _)| sent(name)).collect(),
        init: asked.init.as_ref().map(|i| crate::recipe::InitSources {
            image: sent(&i.image.0),
            mask: i.mask.as_ref().map(|m| sent(&m.name)),
            marks: i.mask.as_ref().map_or(Marks::White, mask_marks),
            mask_crop: i.crop,
        }),
        ..server.clone()
    };
    let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
    if let Some(init) = &asked.init {
        inputs.push(init.image.clone());
        inputs.extend(init.mask.as_ref().map(|m| (m.name.clone(), m.bytes.clone())));
    }
    inputs.extend(asked.images.iter().cloned());
    Ok(Order { job, format: asked.format, run, inputs })
}

/// What in a sent mask repaints.
fn mask_marks(m: &AskedMask) -> Marks {
    match (m.alpha, m.invert) {
        (true, _) => Marks::Transparent,
        (false, true) => Marks::Black,
        (false, false) => Marks::White,
    }
}

/// The picture to change and its mask, prepared as `gen --init-image` prepares them.
fn init_image(init: &AskedInit, unit: usize) -> Result<InitImage, flux_lite_platform::RunError> {
    let (name, bytes) = &init.image;
    let mask = init.mask.as_ref().map(|m| (Source::Bytes { name: &m.name, bytes: &m.bytes }, mask_marks(m)));
    init_image::prepare(Source::Bytes { name, bytes }, mask, init.strength, init.crop, unit)
}

/// A refused job, named by the shape's fields: OpenAI's `size` holds both sides.
fn request_line(e: &RequestError, shape: Shape, asked: &Asked) -> String {
    let field = match (e.setting(), shape) {
        (Setting::Prompt, _) => "prompt",
        (Setting::NegativePrompt, _) => "negative_prompt",
        (Setting::Embeddings, _) => "prompt embeddings",
        (Setting::Images, Shape::OpenAi) => "n",
        (Setting::Images, Shape::A1111) => "batch_size × n_iter",
        (Setting::References, _) => "images",
        // The error's value is the field's name (`image[0]`, `init_images[1]`).
        (Setting::Reference, _) => "",
        (Setting::Width | Setting::Height, Shape::OpenAi) => {
            let (w, h) = (asked.width.unwrap_or_default(), asked.height.unwrap_or_default());
            return format!("size {w}x{h}: {e}");
        }
        (Setting::Width, Shape::A1111) => "width",
        (Setting::Height, Shape::A1111) => "height",
        (Setting::Steps, _) => "steps",
        (Setting::Guidance, Shape::OpenAi) => "guidance",
        (Setting::Guidance, Shape::A1111) => "cfg_scale",
        (Setting::VaeTile, _) => "VAE tile",
        // The error's value is the field's name (`init_images[0]`, `mask`).
        (Setting::InitImage | Setting::Mask, _) => "",
        (Setting::Strength, Shape::OpenAi) => "strength",
        (Setting::Strength, Shape::A1111) => "denoising_strength",
    };
    e.line(field)
}

/// The planner's refusal, naming the server's budget rather than a flag.
fn plan_reason(e: &flux_lite_platform::RunError) -> String {
    match e {
        flux_lite_platform::RunError::Plan(p) => format!("this server's memory budget cannot hold it ({p})"),
        e => e.to_string(),
    }
}

/// "WxH" (also "W*H" or "W×H").
fn parse_size(size: &str) -> Option<(usize, usize)> {
    let (w, h) = size.split_once(['x', 'X', '*', '×'])?;
    Some((w.trim().parse().ok()?, h.trim().parse().ok()?))
}

/// Base64, bare or as a `data:image/…;base64,` URL.
pub fn decode_base64(name: &str, text: &str) -> Result<Vec<u8>, ApiError> {
    let data = match text.strip_prefix("data:") {
        Some(url) => url.split_once(";base64,").map(|(_, d)| d).ok_or_else(|| ApiError::bad(format!("{name}: a data URL must be base64 (data:image/png;base64,…)")))?,
        None => text,
    };
    let cleaned: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(cleaned).map_err(|e| ApiError::bad(format!("{name}: not base64 ({e})")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_openai_and_its_neighbours_write_them() {
        assert_eq!(parse_size("1024x768"), Some((1024, 768)));
        assert_eq!(parse_size("512*512"), Some((512, 512)));
        assert_eq!(parse_size("64×48"), Some((64, 48)));
        assert_eq!(parse_size("big"), None);
        assert_eq!(parse_size("10x"), None);
    }

    #[test]
    fn images_come_as_bare_base64_or_data_urls() {
        assert_eq!(decode_base64("image", "aGk=").unwrap(), b"hi");
        assert_eq!(decode_base64("image", "data:image/png;base64,aG\nk=").unwrap(), b"hi");
        assert!(decode_base64("image", "data:image/png,hi").unwrap_err().message.contains("must be base64"));
        assert!(decode_base64("init_images[0]", "@@").unwrap_err().message.starts_with("init_images[0]: not base64"));
    }
}
