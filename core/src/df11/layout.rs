//! Which weights of FLUX.2-klein's components flux-lite puts in DF11 groups:
//! the layout of the community klein DF11 checkpoints for the transformer
//! (spec/df11.md §4), and one group per decoder layer for the Qwen3 text
//! encoder. `flux-lite compress` writes these groups; the memory planner
//! estimates compressed sizes from them when no DF11 file is at hand.

/// Modules matched by one `pattern_dict` entry, and the linears each group concatenates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupPattern {
    /// Dotted module path; with `numbered`, followed by `.<layer index>`.
    pub module: &'static str,
    pub numbered: bool,
    /// Sub-module paths of the linears, in concatenation order; empty for a
    /// lone linear (the module itself).
    pub linears: &'static [&'static str],
}

impl GroupPattern {
    /// Whether tensor `name` is a weight this pattern puts in a group.
    pub fn holds(&self, name: &str) -> bool {
        let Some(rest) = name.strip_prefix(self.module) else { return false };
        let rest = if self.numbered {
            let Some(rest) = rest.strip_prefix('.') else { return false };
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return false;
            }
            &rest[digits..]
        } else {
            rest
        };
        if self.linears.is_empty() {
            return rest == ".weight";
        }
        self.linears.iter().any(|l| rest.strip_prefix('.').and_then(|r| r.strip_prefix(l)) == Some(".weight"))
    }

    /// The `pattern_dict` key: the module path as a regex, dots escaped.
    #[cfg(feature = "alloc")]
    pub fn regex(&self) -> alloc::string::String {
        let mut re = self.module.replace('.', r"\.");
        if self.numbered {
            re.push_str(r"\.\d+");
        }
        re
    }
}

/// The transformer: a double block's 12 linears, a single block's 2, and five lone linears.
pub const TRANSFORMER_GROUPS: &[GroupPattern] = &[
    GroupPattern {
        module: "transformer_blocks",
        numbered: true,
        linears: &[
            "attn.to_q",
            "attn.to_k",
            "attn.to_v",
            "attn.to_out.0",
            "attn.add_q_proj",
            "attn.add_k_proj",
            "attn.add_v_proj",
            "attn.to_add_out",
            "ff.linear_in",
            "ff.linear_out",
            "ff_context.linear_in",
            "ff_context.linear_out",
        ],
    },
    GroupPattern { module: "single_transformer_blocks", numbered: true, linears: &["attn.to_qkv_mlp_proj", "attn.to_out"] },
    GroupPattern { module: "double_stream_modulation_img.linear", numbered: false, linears: &[] },
    GroupPattern { module: "double_stream_modulation_txt.linear", numbered: false, linears: &[] },
    GroupPattern { module: "single_stream_modulation.linear", numbered: false, linears: &[] },
    GroupPattern { module: "context_embedder", numbered: false, linears: &[] },
    GroupPattern { module: "norm_out.linear", numbered: false, linears: &[] },
];

/// Qwen3 (transformers names): one group per decoder layer. The embedding
/// table stays bf16: the host gathers its rows from the file.
pub const TEXT_ENCODER_GROUPS: &[GroupPattern] = &[GroupPattern {
    module: "model.layers",
    numbered: true,
    linears: &[
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ],
}];

/// Whether any of `patterns` puts weight `name` in a group.
pub fn grouped(patterns: &[GroupPattern], name: &str) -> bool {
    patterns.iter().any(|p| p.holds(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_hold_exactly_their_linears() {
        assert!(grouped(TRANSFORMER_GROUPS, "transformer_blocks.12.attn.to_out.0.weight"));
        assert!(grouped(TRANSFORMER_GROUPS, "single_transformer_blocks.3.attn.to_qkv_mlp_proj.weight"));
        assert!(grouped(TRANSFORMER_GROUPS, "context_embedder.weight"));
        assert!(grouped(TRANSFORMER_GROUPS, "norm_out.linear.weight"));
        // Norms, biases, unlisted linears and look-alike paths stay plain.
        assert!(!grouped(TRANSFORMER_GROUPS, "transformer_blocks.0.attn.norm_q.weight"));
        assert!(!grouped(TRANSFORMER_GROUPS, "transformer_blocks.x.attn.to_q.weight"));
        assert!(!grouped(TRANSFORMER_GROUPS, "transformer_blocks.0.attn.to_qx.weight"));
        assert!(!grouped(TRANSFORMER_GROUPS, "x_embedder.weight"));
        assert!(!grouped(TRANSFORMER_GROUPS, "proj_out.weight"));
        assert!(!grouped(TRANSFORMER_GROUPS, "context_embedder.bias"));
        assert!(grouped(TEXT_ENCODER_GROUPS, "model.layers.35.mlp.down_proj.weight"));
        assert!(!grouped(TEXT_ENCODER_GROUPS, "model.layers.35.input_layernorm.weight"));
        assert!(!grouped(TEXT_ENCODER_GROUPS, "model.embed_tokens.weight"));
    }

    #[test]
    fn regexes_are_the_official_keys() {
        assert_eq!(TRANSFORMER_GROUPS[0].regex(), r"transformer_blocks\.\d+");
        assert_eq!(TRANSFORMER_GROUPS[2].regex(), r"double_stream_modulation_img\.linear");
        assert_eq!(TEXT_ENCODER_GROUPS[0].regex(), r"model\.layers\.\d+");
    }
}
