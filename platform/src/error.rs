//! Typed errors. Each names the file, tensor or setting at fault, so the CLI
//! can print it as one line.

pub use flux_lite_kernels::error::{one_line, GpuError};
use std::fmt;
use std::path::PathBuf;

#[derive(Debug)]
pub enum LoadError {
    /// A file or folder the model needs is missing or unreadable.
    Io { path: PathBuf, source: std::io::Error },
    /// A JSON file is not valid JSON.
    Json { path: PathBuf, detail: String },
    /// A config field is missing or has the wrong type.
    Field { path: PathBuf, field: String, problem: String },
    /// A safetensors file's header is malformed or its data does not match it.
    Safetensors { path: PathBuf, detail: String },
    /// A tensor the architecture needs is absent.
    MissingTensor { component: String, name: String },
    /// A tensor is present but not what the config says it should be.
    WrongTensor { component: String, name: String, expected: String, found: String },
    /// `tokenizer.json` is readable but the tokenizer library cannot build a tokenizer from it.
    Tokenizer { path: PathBuf, detail: String },
    /// A LoRA adapter file that cannot adapt this model (its detail names the key).
    Lora { path: PathBuf, detail: String },
    /// A file the model folder lacks for what was asked; `what` says what to add.
    Missing { path: PathBuf, what: String },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            LoadError::Json { path, detail } => write!(f, "{}: invalid JSON: {detail}", path.display()),
            LoadError::Field { path, field, problem } => write!(f, "{}: `{field}` {problem}", path.display()),
            LoadError::Safetensors { path, detail } => write!(f, "{}: {detail}", path.display()),
            LoadError::MissingTensor { component, name } => write!(f, "{component}: tensor `{name}` is missing"),
            LoadError::WrongTensor { component, name, expected, found } => {
                write!(f, "{component}: tensor `{name}` should be {expected} but is {found}")
            }
            LoadError::Tokenizer { path, detail } => write!(f, "{}: not a tokenizer we can read: {detail}", path.display()),
            LoadError::Lora { path, detail } => write!(f, "LoRA {}: {detail}", path.display()),
            LoadError::Missing { path, what } => write!(f, "{}: missing: {what}", path.display()),
        }
    }
}

impl std::error::Error for LoadError {}

/// Running a model component: loading its weights, the GPU, or the input it was given.
#[derive(Debug)]
pub enum RunError {
    Load(LoadError),
    Gpu(GpuError),
    /// The memory planner refused the request (budget, size, forced VAE tile).
    Plan(flux_lite_core::plan::PlanError),
    /// The request itself, naming the setting at fault.
    Request(crate::request::RequestError),
    /// The banded VAE's scratch file cannot be made in `dir`.
    Scratch { dir: PathBuf, detail: String },
    /// Handing a result over failed (writing a file, encoding a PNG); the
    /// message names the file.
    Output(String),
    /// A prompt the model's tokenizer cannot spell.
    Tokenize(TokenizeError),
    /// The model's scheduler config gives no schedule of `steps` steps.
    Schedule { steps: usize, error: flux_lite_core::numerics::schedule::ScheduleError },
    /// A component cannot be laid out at this size on this adapter (its
    /// arena or a dispatch would not fit); the memory plan bands what it can.
    Layout { component: &'static str, detail: String },
    /// A component was handed inputs that do not fit how it was laid out: a
    /// library caller's mistake (a resolved job's run never makes one).
    Input { component: &'static str, detail: String },
    /// An invariant broke: a bug, never the caller's or the model's doing.
    Internal(String),
}

impl RunError {
    /// A [`RunError::Layout`] of `component`, from its layout's error.
    pub fn layout(component: &'static str) -> impl Fn(&dyn fmt::Display) -> RunError {
        move |e| RunError::Layout { component, detail: e.to_string() }
    }

    /// A [`RunError::Input`] of `component`.
    pub fn input(component: &'static str, detail: impl Into<String>) -> RunError {
        RunError::Input { component, detail: detail.into() }
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Load(e) => e.fmt(f),
            RunError::Gpu(e) => e.fmt(f),
            RunError::Plan(e) => e.fmt(f),
            RunError::Request(e) => e.fmt(f),
            RunError::Scratch { dir, detail } => write!(f, "the VAE's scratch file in {}: {detail} (give another scratch folder)", dir.display()),
            RunError::Tokenize(e) => e.fmt(f),
            RunError::Schedule { steps, error } => write!(f, "the schedule of {steps} steps: {error}"),
            RunError::Layout { component, detail } => write!(f, "the {component} cannot be laid out here: {detail}"),
            RunError::Input { component, detail } => write!(f, "the {component} was given {detail}"),
            RunError::Output(e) | RunError::Internal(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for RunError {}

impl From<LoadError> for RunError {
    fn from(e: LoadError) -> Self {
        RunError::Load(e)
    }
}

impl From<flux_lite_core::plan::PlanError> for RunError {
    fn from(e: flux_lite_core::plan::PlanError) -> Self {
        RunError::Plan(e)
    }
}

impl From<crate::request::RequestError> for RunError {
    fn from(e: crate::request::RequestError) -> Self {
        RunError::Request(e)
    }
}

impl From<TokenizeError> for RunError {
    fn from(e: TokenizeError) -> Self {
        RunError::Tokenize(e)
    }
}

/// A size off the VAE's grid is the request's fault (a resolved job never has one).
impl From<flux_lite_core::config::SizeError> for RunError {
    fn from(e: flux_lite_core::config::SizeError) -> Self {
        RunError::Request(e.into())
    }
}

impl From<GpuError> for RunError {
    fn from(e: GpuError) -> Self {
        RunError::Gpu(e)
    }
}

/// Tokenizing a prompt failed. The byte-level BPE of Qwen tokenizers covers every
/// byte, so this only happens with a tokenizer.json whose model cannot spell some text.
#[derive(Debug)]
pub struct TokenizeError {
    pub detail: String,
}

impl fmt::Display for TokenizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tokenizing the prompt failed: {}", self.detail)
    }
}

impl std::error::Error for TokenizeError {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{RequestError, Setting};

    #[test]
    fn conditions_a_caller_or_a_model_causes_keep_their_types() {
        // A size off the grid is the request's, naming the side.
        let e: RunError = flux_lite_core::config::SizeError { side: "height", pixels: 30, cell: 16 }.into();
        assert!(matches!(&e, RunError::Request(r @ RequestError::Size { .. }) if r.setting() == Setting::Height), "{e:?}");
        let e: RunError = TokenizeError { detail: "no token for \u{1}".into() }.into();
        assert!(matches!(e, RunError::Tokenize(_)) && e.to_string().starts_with("tokenizing the prompt failed"));
        let e = RunError::Schedule { steps: 0, error: flux_lite_core::numerics::schedule::ScheduleError::NoSteps };
        assert_eq!(e.to_string(), "the schedule of 0 steps: the number of steps must be at least 1");
        let e = RunError::input("transformer", "latents of 3 values; it needs 8");
        assert_eq!(e.to_string(), "the transformer was given latents of 3 values; it needs 8");
        let e = LoadError::Missing { path: "m/vae/latent_rgb.json".into(), what: "a map".into() };
        assert_eq!(e.to_string(), "m/vae/latent_rgb.json: missing: a map");
    }
}

/// Writing a compressed model folder failed.
#[derive(Debug)]
pub enum CompressError {
    /// Reading the model failed.
    Load(LoadError),
    /// The output folder is already there; it is never overwritten.
    OutputExists(PathBuf),
    /// The output folder cannot be made where it was asked for.
    OutputFolder { path: PathBuf, problem: String },
    /// The output would land inside the model folder it copies.
    OutputInsideModel { output: PathBuf, model: PathBuf },
    /// A component with no DF11 layout (the VAE).
    NotCompressible(&'static str),
    /// A weight to compress is not bf16.
    NotBf16 { component: &'static str, name: String, dtype: String },
    /// The DF11 encoder refused a group (an exponent it cannot code, a group over 2^31 elements).
    Encode { component: &'static str, module: String, detail: String },
    /// Creating, copying or writing a file of the output failed (the message names it).
    Write(String),
}

impl fmt::Display for CompressError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompressError::Load(e) => e.fmt(f),
            CompressError::OutputExists(p) => write!(f, "the output folder {} already exists; give a new folder", p.display()),
            CompressError::OutputFolder { path, problem } => write!(f, "the output folder {}: {problem}", path.display()),
            CompressError::OutputInsideModel { output, model } => {
                write!(f, "the output folder {} is inside the model folder {}; give a folder outside it", output.display(), model.display())
            }
            CompressError::NotCompressible(c) => write!(f, "{c} has no DF11 layout (compress transformer, text_encoder)"),
            CompressError::NotBf16 { component, name, dtype } => {
                write!(f, "{component}: tensor `{name}` is {dtype}; DF11 compresses bf16 weights only")
            }
            CompressError::Encode { component, module, detail } => write!(f, "{component}: DF11 group `{module}`: {detail}"),
            CompressError::Write(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for CompressError {}

impl From<LoadError> for CompressError {
    fn from(e: LoadError) -> Self {
        CompressError::Load(e)
    }
}
