//! What made an image, carried in the image so it can be made again: the
//! whole request as JSON (the `flux-lite` chunk, [`Recipe`]) and the same
//! in AUTOMATIC1111's wording (`parameters`, [`a1111_parameters`]), which
//! A1111, Forge and the image browsers built for them read back. `gen`
//! and `serve` write both; `gen --from`, `info IMAGE` and serve's
//! `/sdapi/v1/png-info` read them.

use flux_lite_platform::pipeline::image_file;
use flux_lite_platform::pipeline::init_image::Marks;
use flux_lite_platform::pipeline::{KvPrecision, Prompt, Request};
use serde::{Deserialize, Serialize};

/// The text chunk holding a [`Recipe`] as JSON.
pub const CHUNK: &str = image_file::RECIPE;
/// The text chunk holding the settings in A1111's wording.
pub const A1111_CHUNK: &str = image_file::PARAMETERS;

/// One image's request, whole: with the same adapter and tier, running it
/// again makes the same bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    /// `flux-lite VERSION`.
    pub software: String,
    pub model: ModelId,
    /// `--transformer`: a folder or file read instead of the model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformer: Option<String>,
    /// `--text-encoder`: a GGUF file read instead of the model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_encoder: Option<String>,
    pub prompt: String,
    #[serde(default)]
    pub negative_prompt: String,
    /// Prompt embeddings read from this file instead of a prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embeddings: Option<String>,
    pub seed: u64,
    pub steps: usize,
    pub guidance: f32,
    pub width: usize,
    pub height: usize,
    #[serde(default)]
    pub lora: Vec<LoraUse>,
    /// Reference images, in order (the init image is not among them).
    #[serde(default)]
    pub references: Vec<Source>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<InitUse>,
    /// The tier that ran: `f32`, `f16` or `matrix`.
    pub precision: String,
    /// The adapter that ran it, as `flux-lite gpu` names it.
    pub adapter: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vae_tile: Option<usize>,
    pub kv_cache: bool,
    /// `auto`, `f32` or `f16`.
    pub kv_precision: String,
}

/// Which model: the folder as given, its name, and its weights' fingerprint
/// ([`flux_lite_platform::model::fingerprint`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelId {
    pub folder: String,
    pub name: String,
    pub weights: String,
}

impl ModelId {
    /// The model as an image names it: the folder as given, its name, its weights' fingerprint.
    pub fn of(folder: &std::path::Path, model: &flux_lite_platform::model::ModelFolder) -> Result<Self, String> {
        let weights = flux_lite_platform::model::fingerprint::fingerprint(model).map_err(|e| format!("{}: reading the weights' fingerprint: {e}", folder.display()))?;
        let name = folder.file_name().map_or_else(|| folder.display().to_string(), |n| n.to_string_lossy().into_owned());
        Ok(Self { folder: folder.display().to_string(), name, weights })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraUse {
    pub file: String,
    pub scale: f32,
}

/// An input image: the file it was read from (`gen`), or the request field
/// it was sent in (`serve`), whose bytes a PNG keeps ([`INPUT_CHUNK`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    File(String),
    Sent(String),
}

/// Image-to-image or inpainting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InitUse {
    pub image: Source,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<Source>,
    pub strength: f64,
    /// `--mask-crop`: the padding around the mask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_crop: Option<usize>,
    /// What in the mask repaints: `white` (the default), `black` or `transparent`.
    #[serde(default = "white", skip_serializing_if = "is_white")]
    pub mask_marks: String,
}

fn white() -> String {
    Marks::White.name().into()
}

fn is_white(marks: &str) -> bool {
    marks == Marks::White.name()
}

/// Where a run's picture to change and its mask came from.
#[derive(Debug, Clone)]
pub struct InitSources {
    pub image: Source,
    pub mask: Option<Source>,
    pub marks: Marks,
    pub mask_crop: Option<usize>,
}

/// What every image of one run shares: where its inputs came from and what
/// ran it. Each image's recipe adds its prompt and seed ([`Run::recipe`]).
#[derive(Debug, Clone)]
pub struct Run {
    pub model: ModelId,
    pub transformer: Option<String>,
    pub text_encoder: Option<String>,
    pub embeddings: Option<String>,
    pub references: Vec<Source>,
    pub init: Option<InitSources>,
    pub precision: String,
    pub adapter: String,
}

impl Run {
    /// What a pipeline over the model at `folder` puts in every image, before
    /// any input image: the model, its replaced components, the tier and adapter.
    pub fn of_pipeline(folder: &std::path::Path, pipeline: &flux_lite_platform::Pipeline, transformer: Option<&std::path::Path>, text_encoder: Option<&std::path::Path>) -> Result<Self, String> {
        let shown = |p: &std::path::Path| p.display().to_string();
        Ok(Run {
            model: ModelId::of(folder, pipeline.model())?,
            transformer: transformer.map(shown),
            text_encoder: text_encoder.map(shown),
            embeddings: None,
            references: Vec::new(),
            init: None,
            precision: pipeline.gpu().precision().name().into(),
            adapter: pipeline.gpu().info.name.clone(),
        })
    }

    /// The recipe of the image of `prompt` made with `seed` under `request`.
    pub fn recipe(&self, prompt: &Prompt, seed: u64, request: &Request) -> Recipe {
        let (positive, negative) = texts(prompt);
        Recipe {
            software: software(),
            model: self.model.clone(),
            transformer: self.transformer.clone(),
            text_encoder: self.text_encoder.clone(),
            prompt: positive.into(),
            negative_prompt: negative.into(),
            embeddings: self.embeddings.clone(),
            seed,
            steps: request.steps,
            guidance: request.guidance,
            width: request.width,
            height: request.height,
            lora: request.lora.adapters.iter().map(|l| LoraUse { file: l.spec.path.display().to_string(), scale: l.spec.scale }).collect(),
            references: self.references.clone(),
            init: match (&self.init, &request.init) {
                (Some(s), Some(init)) => {
                    Some(InitUse { image: s.image.clone(), mask: s.mask.clone(), strength: init.strength, mask_crop: s.mask_crop, mask_marks: s.marks.name().into() })
                }
                _ => None,
            },
            precision: self.precision.clone(),
            adapter: self.adapter.clone(),
            memory_budget: request.memory_budget,
            vae_tile: request.vae_tile,
            kv_cache: request.kv_cache,
            kv_precision: kv_precision_name(request.kv_precision).into(),
        }
    }
}

/// `flux-lite VERSION`.
pub fn software() -> String {
    format!("flux-lite {}", env!("CARGO_PKG_VERSION"))
}

pub fn kv_precision_name(p: KvPrecision) -> &'static str {
    match p {
        KvPrecision::Auto => "auto",
        KvPrecision::F32 => "f32",
        KvPrecision::F16 => "f16",
    }
}

/// A prompt's positive and negative texts; embeddings have none (empty).
pub fn texts(prompt: &Prompt) -> (&str, &str) {
    match prompt {
        Prompt::Text { positive, negative } => (positive, negative),
        Prompt::Embeddings { .. } => ("", ""),
    }
}

impl Recipe {
    /// The text chunks an image carries: `parameters` (A1111's wording),
    /// `flux-lite` (this recipe as JSON), and one chunk a setting for
    /// tools that read a key at a time.
    pub fn chunks(&self) -> Vec<(&'static str, String)> {
        let mut text = vec![(A1111_CHUNK, a1111_parameters(self)), (CHUNK, self.to_json()), ("prompt", self.prompt.clone())];
        if !self.negative_prompt.is_empty() {
            text.push(("negative_prompt", self.negative_prompt.clone()));
        }
        text.extend([
            ("seed", self.seed.to_string()),
            ("steps", self.steps.to_string()),
            ("size", format!("{}x{}", self.width, self.height)),
            ("guidance", self.guidance.to_string()),
            ("model", self.model.folder.clone()),
            (image_file::SOFTWARE, self.software.clone()),
        ]);
        text.extend(self.lora.iter().map(|l| ("lora", format!("{}:{}", l.file, l.scale))));
        text.extend(self.embeddings.iter().map(|e| ("embeddings", e.clone())));
        text.extend(self.references.iter().filter_map(|r| match r {
            Source::File(f) => Some(("reference", f.clone())),
            Source::Sent(_) => None,
        }));
        text
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn from_json(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| format!("its `{CHUNK}` settings are not this version's JSON ({e})"))
    }
}

/// A generation's settings as AUTOMATIC1111 writes them (its "infotext"):
/// the prompt, then `Negative prompt: …` where there is one, then on the
/// last line `Key: value` pairs joined by `, `, a value holding a comma, a
/// colon or a quote written as a JSON string. The sampler is flow-matching
/// Euler (`FlowMatchEulerDiscreteScheduler`); the model is named by its
/// folder's name, its hash the weights' fingerprint; LoRAs by file name and
/// scale.
pub fn a1111_parameters(recipe: &Recipe) -> String {
    let mut pairs: Vec<(&str, String)> = vec![
        ("Steps", recipe.steps.to_string()),
        ("Sampler", "Euler".into()),
        ("CFG scale", recipe.guidance.to_string()),
        ("Seed", recipe.seed.to_string()),
        ("Size", format!("{}x{}", recipe.width, recipe.height)),
        ("Model hash", recipe.model.weights.trim_start_matches("sha256:").chars().take(10).collect()),
        ("Model", recipe.model.name.clone()),
    ];
    if let Some(init) = &recipe.init {
        pairs.push(("Denoising strength", init.strength.to_string()));
    }
    if !recipe.lora.is_empty() {
        let name = |p: &str| std::path::Path::new(p).file_name().map_or_else(|| p.to_string(), |n| n.to_string_lossy().into_owned());
        let list: Vec<String> = recipe.lora.iter().map(|l| format!("{}: {}", name(&l.file), l.scale)).collect();
        pairs.push(("LoRA", list.join(", ")));
    }
    pairs.push(("Version", recipe.software.clone()));
    let quoted = |v: &str| match v.contains([',', ':', '"', '\n']) {
        true => serde_json::Value::String(v.to_string()).to_string(),
        false => v.to_string(),
    };
    let line: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}: {}", quoted(v))).collect();
    match recipe.negative_prompt.is_empty() {
        true => format!("{}\n{}", recipe.prompt, line.join(", ")),
        false => format!("{}\nNegative prompt: {}\n{}", recipe.prompt, recipe.negative_prompt, line.join(", ")),
    }
}

/// An A1111 infotext read back as A1111's `parse_generation_parameters`
/// reads it: the prompt (the lines before one starting `Negative prompt: `,
/// or before the last line of pairs), the negative, and the pairs in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Infotext {
    pub prompt: String,
    pub negative_prompt: String,
    pub fields: Vec<(String, String)>,
}

impl Infotext {
    pub fn parse(text: &str) -> Self {
        let mut lines: Vec<&str> = text.trim().split('\n').collect();
        // The last line holds the pairs when it reads as at least three of them, as A1111 decides.
        let fields = match lines.last().map(|l| pairs(l)) {
            Some(f) if f.len() >= 3 => {
                lines.pop();
                f
            }
            _ => Vec::new(),
        };
        let (mut prompt, mut negative, mut in_negative) = (Vec::new(), Vec::new(), false);
        for line in lines {
            if let Some(rest) = line.strip_prefix("Negative prompt:") {
                in_negative = true;
                negative.push(rest.trim_start());
            } else if in_negative {
                negative.push(line);
            } else {
                prompt.push(line);
            }
        }
        Self { prompt: prompt.join("\n"), negative_prompt: negative.join("\n"), fields }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The width and height of `Size: WxH`.
    pub fn size(&self) -> Option<(usize, usize)> {
        let (w, h) = self.get("Size")?.split_once('x')?;
        Some((w.trim().parse().ok()?, h.trim().parse().ok()?))
    }

    /// The fields as A1111's png-info answer keys them: `Prompt`,
    /// `Negative prompt`, each pair, and `Size-1`/`Size-2` for the size.
    pub fn to_json(&self) -> serde_json::Value {
        let mut map = serde_json::Map::new();
        map.insert("Prompt".into(), self.prompt.clone().into());
        map.insert("Negative prompt".into(), self.negative_prompt.clone().into());
        for (k, v) in &self.fields {
            map.insert(k.clone(), v.clone().into());
        }
        if let Some((w, h)) = self.size() {
            map.insert("Size-1".into(), w.into());
            map.insert("Size-2".into(), h.into());
        }
        serde_json::Value::Object(map)
    }
}

/// `Key: value, Key: "quoted, value", …`.
fn pairs(line: &str) -> Vec<(String, String)> {
    let (mut fields, mut rest) = (Vec::new(), line.trim());
    while let Some((key, after)) = rest.split_once(": ") {
        if key.is_empty() || key.contains([',', '"']) {
            return Vec::new();
        }
        let (value, next) = match after.starts_with('"') {
            true => {
                let mut values = serde_json::Deserializer::from_str(after).into_iter::<String>();
                match values.next() {
                    Some(Ok(value)) => (value, &after[values.byte_offset()..]),
                    _ => return Vec::new(),
                }
            }
            false => {
                let (value, next) = after.split_once(", ").unwrap_or((after, ""));
                (value.to_string(), next)
            }
        };
        fields.push((key.trim().to_string(), value));
        rest = next.trim_start_matches(',').trim_start();
    }
    fields
}

/// The settings an image carries: its recipe where flux-lite made it, else
/// the A1111 infotext another tool wrote; `None` where it has neither.
#[derive(Debug, Clone, PartialEq)]
pub enum Carried {
    Recipe(Box<Recipe>),
    Infotext(Infotext),
}

/// What an image's text chunks say of how it was made; `name` names the
/// image in errors.
pub fn carried(name: &str, chunks: &[(String, String)]) -> Result<Option<Carried>, String> {
    let chunk = |key: &str| chunks.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    if let Some(json) = chunk(CHUNK) {
        return Recipe::from_json(json).map(|r| Some(Carried::Recipe(Box::new(r)))).map_err(|e| format!("{name}: {e}"));
    }
    Ok(chunk(A1111_CHUNK).map(|text| Carried::Infotext(Infotext::parse(text))))
}

/// The start of the PNG chunk that holds an input image a request sent
/// (`flux-lite-input:init_images[0]`): its file bytes in base64, so that an
/// image a server made can be made again from itself.
pub const INPUT_CHUNK: &str = "flux-lite-input:";

/// The chunk of an input image sent as `field`.
pub fn input_chunk(field: &str, bytes: &[u8]) -> (String, String) {
    use base64::Engine;
    (format!("{INPUT_CHUNK}{field}"), base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// What an image file carries: how it was made, and the input images a
/// server kept in it, by request field.
#[derive(Debug)]
pub struct FromImage {
    pub carried: Carried,
    pub inputs: Vec<(String, Vec<u8>)>,
}

impl FromImage {
    /// The bytes of the input image sent as `field`, where the image kept them.
    pub fn input(&self, field: &str) -> Option<&[u8]> {
        self.inputs.iter().find(|(f, _)| f == field).map(|(_, b)| b.as_slice())
    }
}

/// The settings an image file (PNG, JPEG or WebP) carries, or an error naming the file.
pub fn read_image_file(path: &std::path::Path) -> Result<FromImage, String> {
    use base64::Engine;
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| format!("{name}: {e}"))?;
    let chunks = image_file::image_text(&bytes).map_err(|e| format!("{name}: {e}"))?;
    let carried = carried(&name, &chunks)?.ok_or_else(|| format!("{name}: carries no settings (no `{CHUNK}` or `{A1111_CHUNK}` text)"))?;
    let mut inputs = Vec::new();
    for (key, text) in &chunks {
        if let Some(field) = key.strip_prefix(INPUT_CHUNK) {
            let decoded = base64::engine::general_purpose::STANDARD.decode(text).map_err(|e| format!("{name}: its input `{field}` is not base64 ({e})"))?;
            inputs.push((field.to_string(), decoded));
        }
    }
    Ok(FromImage { carried, inputs })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe() -> Recipe {
        Recipe {
            software: software(),
            model: ModelId { folder: "models/FLUX.2-klein-4B".into(), name: "FLUX.2-klein-4B".into(), weights: "sha256:0123456789abcdef".into() },
            transformer: None,
            text_encoder: None,
            prompt: "a fox, at night: \"quiet\"\nsecond line".into(),
            negative_prompt: "blur, low quality".into(),
            embeddings: None,
            seed: 42,
            steps: 4,
            guidance: 1.0,
            width: 64,
            height: 48,
            lora: vec![LoraUse { file: "loras/ink, v2.safetensors".into(), scale: 0.8 }],
            references: vec![Source::File("ref.png".into()), Source::Sent("image[1]".into())],
            init: Some(InitUse { image: Source::File("room.png".into()), mask: None, strength: 0.6, mask_crop: Some(8), mask_marks: "black".into() }),
            precision: "f32".into(),
            adapter: "llvmpipe".into(),
            memory_budget: Some(1 << 30),
            vae_tile: None,
            kv_cache: false,
            kv_precision: "auto".into(),
        }
    }

    #[test]
    fn a_recipe_reads_back_from_its_json_whole() {
        let r = recipe();
        assert_eq!(Recipe::from_json(&r.to_json()).unwrap(), r);
        assert!(Recipe::from_json("{\"seed\": 1}").unwrap_err().contains("not this version's JSON"));
    }

    #[test]
    fn a1111s_wording_reads_back_as_a1111_parses_it() {
        let r = recipe();
        let text = a1111_parameters(&r);
        let info = Infotext::parse(&text);
        assert_eq!(info.prompt, r.prompt);
        assert_eq!(info.negative_prompt, r.negative_prompt);
        assert_eq!(info.get("Steps"), Some("4"));
        assert_eq!(info.get("Seed"), Some("42"));
        assert_eq!(info.size(), Some((64, 48)));
        assert_eq!(info.get("Model hash"), Some("0123456789"));
        assert_eq!(info.get("LoRA"), Some("ink, v2.safetensors: 0.8"));
        assert_eq!(info.get("Denoising strength"), Some("0.6"));
        assert_eq!(info.to_json()["Size-2"], 48);
        // Another tool's infotext, with its own keys.
        let other = Infotext::parse("a cat\nNegative prompt: dog\nSteps: 20, Sampler: DPM++ 2M, CFG scale: 7, Seed: 1, Size: 512x768, Model: sd15");
        assert_eq!((other.prompt.as_str(), other.negative_prompt.as_str(), other.size()), ("a cat", "dog", Some((512, 768))));
        // A prompt alone: no pairs.
        assert_eq!(Infotext::parse("just a prompt"), Infotext { prompt: "just a prompt".into(), ..Infotext::default() });
    }

    #[test]
    fn the_chunks_hold_the_recipe_and_the_infotext() {
        let r = recipe();
        let chunks: Vec<(String, String)> = r.chunks().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        assert_eq!(carried("x.png", &chunks).unwrap(), Some(Carried::Recipe(Box::new(r.clone()))));
        let only_a1111: Vec<(String, String)> = chunks.iter().filter(|(k, _)| k != CHUNK).cloned().collect();
        assert!(matches!(carried("x.png", &only_a1111).unwrap(), Some(Carried::Infotext(i)) if i.prompt == r.prompt));
        assert_eq!(carried("x.png", &[]).unwrap(), None);
        // The references sent to a server are not files to name.
        assert_eq!(chunks.iter().filter(|(k, _)| k == "reference").count(), 1);
    }
}
