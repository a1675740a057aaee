//! llama.cpp's tensor names for a Qwen3 model (`blk.N.attn_q.weight`, …), as
//! its converter writes a Qwen3-4B GGUF, mapped to transformers' names. Qwen3's
//! projections are written unpermuted (only LLaMA's q and k rows are), so each
//! tensor maps whole.

/// transformers' name of llama.cpp tensor `name`, if it is one of Qwen3's.
pub(crate) fn qwen3_tensor(name: &str) -> Option<String> {
    match name {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (i, part) = rest.split_once('.')?;
    let i: usize = i.parse().ok()?;
    let module = match part.strip_suffix(".weight")? {
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{i}.{module}.weight"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_names_map_to_transformers() {
        assert_eq!(qwen3_tensor("blk.12.attn_output.weight").as_deref(), Some("model.layers.12.self_attn.o_proj.weight"));
        assert_eq!(qwen3_tensor("blk.0.ffn_norm.weight").as_deref(), Some("model.layers.0.post_attention_layernorm.weight"));
        assert_eq!(qwen3_tensor("token_embd.weight").as_deref(), Some("model.embed_tokens.weight"));
        assert_eq!(qwen3_tensor("blk.0.attn_q.bias"), None);
        assert_eq!(qwen3_tensor("rope_freqs.weight"), None);
    }
}
