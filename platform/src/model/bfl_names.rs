//! BFL's original module names (as its checkpoints, ai-toolkit's LoRAs and
//! GGUF files spell them) and kohya's flattened spelling, mapped to the
//! diffusers module names the engine's transformer uses. A fused BFL
//! projection maps to several diffusers modules, in the order its rows
//! split; `true` beside a module means its rows' halves swap (the final
//! modulation's shift/scale order).

/// BFL's names (after `diffusion_model.`) to diffusers'.
pub(crate) fn bfl_targets(name: &str) -> Option<Vec<(String, bool)>> {
    let one = |m: String| Some(vec![(m, false)]);
    for prefix in ["transformer_blocks.", "single_transformer_blocks."] {
        if name.starts_with(prefix) {
            return one(name.to_string());
        }
    }
    if let Some(rest) = name.strip_prefix("double_blocks.") {
        let (i, part) = rest.split_once('.')?;
        let i: usize = i.parse().ok()?;
        return double_block(i, part);
    }
    if let Some(rest) = name.strip_prefix("single_blocks.") {
        let (i, part) = rest.split_once('.')?;
        let i: usize = i.parse().ok()?;
        return single_block(i, part);
    }
    let top = match name {
        "img_in" => "x_embedder",
        "txt_in" => "context_embedder",
        "time_in.in_layer" => "time_guidance_embed.timestep_embedder.linear_1",
        "time_in.out_layer" => "time_guidance_embed.timestep_embedder.linear_2",
        "guidance_in.in_layer" => "time_guidance_embed.guidance_embedder.linear_1",
        "guidance_in.out_layer" => "time_guidance_embed.guidance_embedder.linear_2",
        "final_layer.linear" => "proj_out",
        "final_layer.adaLN_modulation.1" => return Some(vec![("norm_out.linear".into(), true)]),
        "single_stream_modulation.lin" => "single_stream_modulation.linear",
        "double_stream_modulation_img.lin" => "double_stream_modulation_img.linear",
        "double_stream_modulation_txt.lin" => "double_stream_modulation_txt.linear",
        _ => return None,
    };
    one(top.into())
}

/// A double block's part, BFL-named with dots (`img_attn.qkv`) or kohya's underscores.
fn double_block(i: usize, part: &str) -> Option<Vec<(String, bool)>> {
    let b = |m: &str| (format!("transformer_blocks.{i}.{m}"), false);
    Some(match part.replace('_', ".").as_str() {
        "img.attn.qkv" => vec![b("attn.to_q"), b("attn.to_k"), b("attn.to_v")],
        "txt.attn.qkv" => vec![b("attn.add_q_proj"), b("attn.add_k_proj"), b("attn.add_v_proj")],
        "img.attn.proj" => vec![b("attn.to_out.0")],
        "txt.attn.proj" => vec![b("attn.to_add_out")],
        "img.mlp.0" => vec![b("ff.linear_in")],
        "img.mlp.2" => vec![b("ff.linear_out")],
        "txt.mlp.0" => vec![b("ff_context.linear_in")],
        "txt.mlp.2" => vec![b("ff_context.linear_out")],
        _ => return None,
    })
}

fn single_block(i: usize, part: &str) -> Option<Vec<(String, bool)>> {
    let m = match part {
        "linear1" => "attn.to_qkv_mlp_proj",
        "linear2" => "attn.to_out",
        _ => return None,
    };
    Some(vec![(format!("single_transformer_blocks.{i}.{m}"), false)])
}

/// kohya's names (after `lora_unet_`) to diffusers'.
pub(crate) fn kohya_targets(name: &str) -> Option<Vec<(String, bool)>> {
    for (prefix, block) in [("double_blocks_", double_block as fn(usize, &str) -> Option<Vec<(String, bool)>>), ("single_blocks_", single_block)] {
        if let Some(rest) = name.strip_prefix(prefix) {
            let (i, part) = rest.split_once('_')?;
            return block(i.parse().ok()?, part);
        }
    }
    let top = match name {
        "img_in" => "x_embedder",
        "txt_in" => "context_embedder",
        "time_in_in_layer" => "time_guidance_embed.timestep_embedder.linear_1",
        "time_in_out_layer" => "time_guidance_embed.timestep_embedder.linear_2",
        "final_layer_linear" => "proj_out",
        _ => return None,
    };
    Some(vec![(top.into(), false)])
}

/// A tensor of a BFL-named checkpoint (GGUF and single files; any
/// `model.diffusion_model.` or `diffusion_model.` prefix taken off) to the
/// diffusers tensors it holds: a fused projection's rows split evenly in
/// order, `true` where the rows' halves swap. The RMS norms' `scale` is
/// diffusers' `weight`.
pub(crate) fn bfl_tensor(name: &str) -> Option<Vec<(String, bool)>> {
    let name = name.strip_prefix("model.").unwrap_or(name);
    let name = name.strip_prefix("diffusion_model.").unwrap_or(name);
    if let Some(module) = name.strip_suffix(".weight") {
        let targets = bfl_targets(module)?;
        return Some(targets.into_iter().map(|(m, swap)| (format!("{m}.weight"), swap)).collect());
    }
    let module = name.strip_suffix(".scale")?;
    let norm = |prefix: &str, rest: &str| -> Option<String> {
        let (i, part) = rest.split_once('.')?;
        let i: usize = i.parse().ok()?;
        let n = match part {
            "img_attn.norm.query_norm" | "norm.query_norm" => "norm_q",
            "img_attn.norm.key_norm" | "norm.key_norm" => "norm_k",
            "txt_attn.norm.query_norm" if prefix == "transformer_blocks" => "norm_added_q",
            "txt_attn.norm.key_norm" if prefix == "transformer_blocks" => "norm_added_k",
            _ => return None,
        };
        if prefix == "transformer_blocks" && part.starts_with("norm.") || prefix == "single_transformer_blocks" && part.contains("attn.") {
            return None;
        }
        Some(format!("{prefix}.{i}.attn.{n}.weight"))
    };
    let target = if let Some(rest) = module.strip_prefix("double_blocks.") {
        norm("transformer_blocks", rest)?
    } else {
        norm("single_transformer_blocks", module.strip_prefix("single_blocks.")?)?
    };
    Some(vec![(target, false)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bfl_tensors_map_as_diffusers_converts_them() {
        let one = |n: &str| bfl_tensor(n).map(|v| v.into_iter().map(|(m, s)| format!("{m}{}", if s { " (swapped)" } else { "" })).collect::<Vec<_>>());
        assert_eq!(
            one("model.diffusion_model.double_blocks.3.img_attn.qkv.weight").unwrap(),
            ["transformer_blocks.3.attn.to_q.weight", "transformer_blocks.3.attn.to_k.weight", "transformer_blocks.3.attn.to_v.weight"]
        );
        assert_eq!(one("double_blocks.0.txt_attn.norm.key_norm.scale").unwrap(), ["transformer_blocks.0.attn.norm_added_k.weight"]);
        assert_eq!(one("single_blocks.7.norm.query_norm.scale").unwrap(), ["single_transformer_blocks.7.attn.norm_q.weight"]);
        assert_eq!(one("single_blocks.7.linear1.weight").unwrap(), ["single_transformer_blocks.7.attn.to_qkv_mlp_proj.weight"]);
        assert_eq!(one("final_layer.adaLN_modulation.1.weight").unwrap(), ["norm_out.linear.weight (swapped)"]);
        assert_eq!(one("diffusion_model.img_in.weight").unwrap(), ["x_embedder.weight"]);
        assert_eq!(one("single_blocks.7.txt_attn.norm.key_norm.scale"), None);
        assert_eq!(one("double_blocks.0.norm.key_norm.scale"), None);
        assert_eq!(one("double_blocks.0.img_attn.qkv.bias"), None);
    }
}
