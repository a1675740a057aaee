//! Each component's `config.json` read into core's plain config structs.
//! Missing or mistyped fields are errors naming the file and the field;
//! optional fields take the defaults of the diffusers/transformers classes.

use crate::error::LoadError;
use flux_lite_core::config::{
    ConfigError, ModelIndex, Qwen3Config, SchedulerConfig, TimeShift, TransformerConfig, VaeConfig, MAX_LIST,
};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// JSON files larger than this are refused before parsing (configs are a few KB).
pub const MAX_JSON_BYTES: u64 = 16 << 20;

/// A parsed JSON object and the file it came from.
#[derive(Debug)]
pub struct JsonFile {
    pub path: PathBuf,
    pub value: Value,
}

impl JsonFile {
    pub fn read(path: &Path) -> Result<Self, LoadError> {
        let io = |source| LoadError::Io { path: path.to_path_buf(), source };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_JSON_BYTES {
            return Err(LoadError::Json { path: path.into(), detail: format!("{len} bytes is too large for a config") });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| LoadError::Json { path: path.into(), detail: e.to_string() })?;
        if !value.is_object() {
            return Err(LoadError::Json { path: path.into(), detail: "the top level is not an object".into() });
        }
        Ok(Self { path: path.into(), value })
    }

    fn err(&self, field: &str, problem: impl Into<String>) -> LoadError {
        LoadError::Field { path: self.path.clone(), field: field.into(), problem: problem.into() }
    }

    fn get(&self, field: &str) -> Option<&Value> {
        self.value.get(field).filter(|v| !v.is_null())
    }

    pub fn usize(&self, field: &str) -> Result<usize, LoadError> {
        let v = self.get(field).ok_or_else(|| self.err(field, "is missing"))?;
        as_usize(v).ok_or_else(|| self.err(field, format!("should be a non-negative integer, found {v}")))
    }

    pub fn usize_or(&self, field: &str, default: usize) -> Result<usize, LoadError> {
        if self.get(field).is_some() { self.usize(field) } else { Ok(default) }
    }

    pub fn f64(&self, field: &str) -> Result<f64, LoadError> {
        let v = self.get(field).ok_or_else(|| self.err(field, "is missing"))?;
        v.as_f64().filter(|x| x.is_finite()).ok_or_else(|| self.err(field, format!("should be a number, found {v}")))
    }

    pub fn f64_or(&self, field: &str, default: f64) -> Result<f64, LoadError> {
        if self.get(field).is_some() { self.f64(field) } else { Ok(default) }
    }

    pub fn bool_or(&self, field: &str, default: bool) -> Result<bool, LoadError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.err(field, format!("should be true or false, found {v}"))),
        }
    }

    pub fn str_or<'a>(&'a self, field: &str, default: &'a str) -> Result<&'a str, LoadError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v.as_str().ok_or_else(|| self.err(field, format!("should be a string, found {v}"))),
        }
    }

    pub fn usize_list(&self, field: &str) -> Result<flux_lite_core::heapless::Vec<usize, MAX_LIST>, LoadError> {
        let v = self.get(field).ok_or_else(|| self.err(field, "is missing"))?;
        let items = v.as_array().ok_or_else(|| self.err(field, format!("should be a list, found {v}")))?;
        let mut out = flux_lite_core::heapless::Vec::new();
        for item in items {
            let n = as_usize(item).ok_or_else(|| self.err(field, format!("has a non-integer entry {item}")))?;
            out.push(n).map_err(|_| self.err(field, format!("has more than {MAX_LIST} entries")))?;
        }
        Ok(out)
    }

    fn checked(&self, r: Result<(), ConfigError>) -> Result<(), LoadError> {
        r.map_err(|e| self.err(e.field, e.problem))
    }
}

fn as_usize(v: &Value) -> Option<usize> {
    v.as_u64().and_then(|n| usize::try_from(n).ok()).filter(|&n| n <= 1 << 40)
}

pub fn transformer(file: &JsonFile) -> Result<TransformerConfig, LoadError> {
    let in_channels = file.usize("in_channels")?;
    let c = TransformerConfig {
        patch_size: file.usize_or("patch_size", 1)?,
        in_channels,
        out_channels: file.usize_or("out_channels", in_channels)?,
        num_layers: file.usize("num_layers")?,
        num_single_layers: file.usize("num_single_layers")?,
        attention_head_dim: file.usize("attention_head_dim")?,
        num_attention_heads: file.usize("num_attention_heads")?,
        joint_attention_dim: file.usize("joint_attention_dim")?,
        timestep_guidance_channels: file.usize_or("timestep_guidance_channels", 256)?,
        mlp_ratio: file.f64_or("mlp_ratio", 3.0)?,
        axes_dims_rope: file.usize_list("axes_dims_rope")?,
        rope_theta: file.f64_or("rope_theta", 2000.0)?,
        eps: file.f64_or("eps", 1e-6)?,
        guidance_embeds: file.bool_or("guidance_embeds", true)?,
    };
    file.checked(c.validate())?;
    Ok(c)
}

pub fn qwen3(file: &JsonFile) -> Result<Qwen3Config, LoadError> {
    let hidden = file.usize("hidden_size")?;
    let heads = file.usize("num_attention_heads")?;
    // transformers 5 nests the base under `rope_parameters`; 4.x keeps it at the top.
    let rope_theta = match file.value.get("rope_parameters").and_then(|p| p.get("rope_theta")) {
        Some(v) => v.as_f64().ok_or_else(|| file.err("rope_parameters.rope_theta", format!("should be a number, found {v}")))?,
        None => file.f64_or("rope_theta", 10000.0)?,
    };
    if let Some(kind) = file.value.get("rope_parameters").and_then(|p| p.get("rope_type")).and_then(Value::as_str) {
        if kind != "default" {
            return Err(file.err("rope_parameters.rope_type", format!("{kind:?} is not supported (only \"default\")")));
        }
    }
    let act = file.str_or("hidden_act", "silu")?;
    if act != "silu" {
        return Err(file.err("hidden_act", format!("{act:?} is not supported (only \"silu\")")));
    }
    if file.bool_or("use_sliding_window", false)? {
        return Err(file.err("use_sliding_window", "true is not supported"));
    }
    if file.bool_or("attention_bias", false)? {
        return Err(file.err("attention_bias", "true is not supported (Qwen3 has no attention biases)"));
    }
    let c = Qwen3Config {
        vocab_size: file.usize("vocab_size")?,
        hidden_size: hidden,
        intermediate_size: file.usize("intermediate_size")?,
        num_hidden_layers: file.usize("num_hidden_layers")?,
        num_attention_heads: heads,
        num_key_value_heads: file.usize_or("num_key_value_heads", heads)?,
        head_dim: file.usize_or("head_dim", hidden / heads.max(1))?,
        rms_norm_eps: file.f64_or("rms_norm_eps", 1e-6)?,
        rope_theta,
        tie_word_embeddings: file.bool_or("tie_word_embeddings", false)?,
        max_position_embeddings: file.usize_or("max_position_embeddings", 32768)?,
    };
    file.checked(c.validate())?;
    Ok(c)
}

pub fn vae(file: &JsonFile) -> Result<VaeConfig, LoadError> {
    let patch = match file.get("patch_size") {
        None => [2, 2],
        Some(_) => {
            let p = file.usize_list("patch_size")?;
            if p.len() != 2 {
                return Err(file.err("patch_size", "should have two entries"));
            }
            [p[0], p[1]]
        }
    };
    let decoder = match file.get("decoder_block_out_channels") {
        None => None,
        Some(_) => Some(file.usize_list("decoder_block_out_channels")?),
    };
    let c = VaeConfig {
        in_channels: file.usize_or("in_channels", 3)?,
        out_channels: file.usize_or("out_channels", 3)?,
        block_out_channels: file.usize_list("block_out_channels")?,
        decoder_block_out_channels: decoder,
        layers_per_block: file.usize_or("layers_per_block", 2)?,
        latent_channels: file.usize("latent_channels")?,
        norm_num_groups: file.usize_or("norm_num_groups", 32)?,
        use_quant_conv: file.bool_or("use_quant_conv", true)?,
        use_post_quant_conv: file.bool_or("use_post_quant_conv", true)?,
        mid_block_add_attention: file.bool_or("mid_block_add_attention", true)?,
        batch_norm_eps: file.f64_or("batch_norm_eps", 1e-4)?,
        patch_size: patch,
    };
    file.checked(c.validate())?;
    let act = file.str_or("act_fn", "silu")?;
    if act != "silu" {
        return Err(file.err("act_fn", format!("{act:?} is not supported (only \"silu\")")));
    }
    Ok(c)
}

pub fn scheduler(file: &JsonFile) -> Result<SchedulerConfig, LoadError> {
    let time_shift_type = match file.str_or("time_shift_type", "exponential")? {
        "exponential" => TimeShift::Exponential,
        "linear" => TimeShift::Linear,
        other => return Err(file.err("time_shift_type", format!("{other:?} is not exponential or linear"))),
    };
    for flag in ["use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "stochastic_sampling", "invert_sigmas"] {
        if file.bool_or(flag, false)? {
            return Err(file.err(flag, "true is not supported"));
        }
    }
    Ok(SchedulerConfig {
        num_train_timesteps: file.usize_or("num_train_timesteps", 1000)?,
        shift: file.f64_or("shift", 1.0)?,
        use_dynamic_shifting: file.bool_or("use_dynamic_shifting", false)?,
        time_shift_type,
        base_shift: file.f64_or("base_shift", 0.5)?,
        max_shift: file.f64_or("max_shift", 1.15)?,
        base_image_seq_len: file.usize_or("base_image_seq_len", 256)?,
        max_image_seq_len: file.usize_or("max_image_seq_len", 4096)?,
    })
}

pub fn model_index(file: &JsonFile) -> Result<ModelIndex, LoadError> {
    let class = file.str_or("_class_name", "")?;
    let kv_cache = match class {
        "Flux2KleinPipeline" => false,
        "Flux2KleinKVPipeline" => true,
        _ => return Err(file.err("_class_name", format!("{class:?} is not Flux2KleinPipeline or Flux2KleinKVPipeline"))),
    };
    Ok(ModelIndex { is_distilled: file.bool_or("is_distilled", false)?, kv_cache })
}
