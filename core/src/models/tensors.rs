//! The tensors each component's weight files must hold: names exactly as
//! diffusers/transformers save them, with shapes derived from the config.
//! The loader checks a model folder against these lists.

use crate::config::{Qwen3Config, TransformerConfig, VaeConfig};
use core::fmt::Write;

pub type TensorName = heapless::String<128>;

/// Element type a tensor is expected to have in the files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A floating-point weight (bf16 in the official files; f32/f16 also read).
    Float,
    /// An integer counter (`bn.num_batches_tracked`).
    Int,
}

/// One expected tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: TensorName,
    pub shape: heapless::Vec<usize, 4>,
    pub kind: Kind,
}

/// Collects specs through a callback so no_std callers need no allocation.
struct Emit<'a, F: FnMut(&TensorSpec)> {
    sink: &'a mut F,
}

impl<F: FnMut(&TensorSpec)> Emit<'_, F> {
    fn kind(&mut self, name: core::fmt::Arguments<'_>, shape: &[usize], kind: Kind) {
        let mut n = TensorName::new();
        n.write_fmt(name).expect("tensor names fit in 128 bytes");
        let spec =
            TensorSpec { name: n, shape: heapless::Vec::from_slice(shape).expect("rank ≤ 4"), kind };
        (self.sink)(&spec);
    }

    fn t(&mut self, name: core::fmt::Arguments<'_>, shape: &[usize]) {
        self.kind(name, shape, Kind::Float);
    }

    /// `{prefix}.weight` [out, in] and, with `bias`, `{prefix}.bias` [out].
    fn linear(&mut self, prefix: core::fmt::Arguments<'_>, out: usize, inp: usize, bias: bool) {
        self.t(format_args!("{prefix}.weight"), &[out, inp]);
        if bias {
            self.t(format_args!("{prefix}.bias"), &[out]);
        }
    }

    fn conv(&mut self, prefix: core::fmt::Arguments<'_>, out: usize, inp: usize, k: usize) {
        self.t(format_args!("{prefix}.weight"), &[out, inp, k, k]);
        self.t(format_args!("{prefix}.bias"), &[out]);
    }

    fn affine(&mut self, prefix: core::fmt::Arguments<'_>, c: usize) {
        self.t(format_args!("{prefix}.weight"), &[c]);
        self.t(format_args!("{prefix}.bias"), &[c]);
    }
}

/// Every tensor of `Flux2Transformer2DModel` (no linear has a bias).
pub fn transformer(c: &TransformerConfig, mut sink: impl FnMut(&TensorSpec)) {
    let e = &mut Emit { sink: &mut sink };
    let d = c.inner_dim();
    let f = c.mlp_hidden_dim();
    let hd = c.attention_head_dim;
    e.linear(format_args!("x_embedder"), d, c.in_channels, false);
    e.linear(format_args!("context_embedder"), d, c.joint_attention_dim, false);
    e.linear(format_args!("time_guidance_embed.timestep_embedder.linear_1"), d, c.timestep_guidance_channels, false);
    e.linear(format_args!("time_guidance_embed.timestep_embedder.linear_2"), d, d, false);
    e.linear(format_args!("double_stream_modulation_img.linear"), 6 * d, d, false);
    e.linear(format_args!("double_stream_modulation_txt.linear"), 6 * d, d, false);
    e.linear(format_args!("single_stream_modulation.linear"), 3 * d, d, false);
    for i in 0..c.num_layers {
        for p in ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"] {
            e.linear(format_args!("transformer_blocks.{i}.attn.{p}"), d, d, false);
        }
        for n in ["norm_q", "norm_k", "norm_added_q", "norm_added_k"] {
            e.t(format_args!("transformer_blocks.{i}.attn.{n}.weight"), &[hd]);
        }
        for ff in ["ff", "ff_context"] {
            e.linear(format_args!("transformer_blocks.{i}.{ff}.linear_in"), 2 * f, d, false);
            e.linear(format_args!("transformer_blocks.{i}.{ff}.linear_out"), d, f, false);
        }
    }
    for i in 0..c.num_single_layers {
        e.linear(format_args!("single_transformer_blocks.{i}.attn.to_qkv_mlp_proj"), 3 * d + 2 * f, d, false);
        e.linear(format_args!("single_transformer_blocks.{i}.attn.to_out"), d, d + f, false);
        for n in ["norm_q", "norm_k"] {
            e.t(format_args!("single_transformer_blocks.{i}.attn.{n}.weight"), &[hd]);
        }
    }
    e.linear(format_args!("norm_out.linear"), 2 * d, d, false);
    e.linear(format_args!("proj_out"), c.out_channels, d, false);
}

/// Every tensor of `Qwen3ForCausalLM` (`lm_head` only when not tied).
pub fn text_encoder(c: &Qwen3Config, mut sink: impl FnMut(&TensorSpec)) {
    let e = &mut Emit { sink: &mut sink };
    let h = c.hidden_size;
    let q = c.num_attention_heads * c.head_dim;
    let kv = c.num_key_value_heads * c.head_dim;
    e.t(format_args!("model.embed_tokens.weight"), &[c.vocab_size, h]);
    for i in 0..c.num_hidden_layers {
        e.linear(format_args!("model.layers.{i}.self_attn.q_proj"), q, h, false);
        e.linear(format_args!("model.layers.{i}.self_attn.k_proj"), kv, h, false);
        e.linear(format_args!("model.layers.{i}.self_attn.v_proj"), kv, h, false);
        e.linear(format_args!("model.layers.{i}.self_attn.o_proj"), h, q, false);
        e.t(format_args!("model.layers.{i}.self_attn.q_norm.weight"), &[c.head_dim]);
        e.t(format_args!("model.layers.{i}.self_attn.k_norm.weight"), &[c.head_dim]);
        e.linear(format_args!("model.layers.{i}.mlp.gate_proj"), c.intermediate_size, h, false);
        e.linear(format_args!("model.layers.{i}.mlp.up_proj"), c.intermediate_size, h, false);
        e.linear(format_args!("model.layers.{i}.mlp.down_proj"), h, c.intermediate_size, false);
        e.t(format_args!("model.layers.{i}.input_layernorm.weight"), &[h]);
        e.t(format_args!("model.layers.{i}.post_attention_layernorm.weight"), &[h]);
    }
    e.t(format_args!("model.norm.weight"), &[h]);
    if !c.tie_word_embeddings {
        e.t(format_args!("lm_head.weight"), &[c.vocab_size, h]);
    }
}

fn resnet<F: FnMut(&TensorSpec)>(e: &mut Emit<'_, F>, prefix: core::fmt::Arguments<'_>, cin: usize, cout: usize) {
    e.affine(format_args!("{prefix}.norm1"), cin);
    e.conv(format_args!("{prefix}.conv1"), cout, cin, 3);
    e.affine(format_args!("{prefix}.norm2"), cout);
    e.conv(format_args!("{prefix}.conv2"), cout, cout, 3);
    if cin != cout {
        e.conv(format_args!("{prefix}.conv_shortcut"), cout, cin, 1);
    }
}

fn mid_block<F: FnMut(&TensorSpec)>(e: &mut Emit<'_, F>, side: &str, c: usize, attention: bool) {
    resnet(e, format_args!("{side}.mid_block.resnets.0"), c, c);
    if attention {
        e.affine(format_args!("{side}.mid_block.attentions.0.group_norm"), c);
        for p in ["to_q", "to_k", "to_v", "to_out.0"] {
            e.linear(format_args!("{side}.mid_block.attentions.0.{p}"), c, c, true);
        }
    }
    resnet(e, format_args!("{side}.mid_block.resnets.1"), c, c);
}

/// Every tensor of `AutoencoderKLFlux2`: encoder, decoder, quant convs and the latent BatchNorm stats.
pub fn vae(c: &VaeConfig, mut sink: impl FnMut(&TensorSpec)) {
    let e = &mut Emit { sink: &mut sink };
    let enc = &c.block_out_channels;
    let levels = enc.len();
    let last = enc[levels - 1];
    e.conv(format_args!("encoder.conv_in"), enc[0], c.in_channels, 3);
    let mut cin = enc[0];
    for (i, &cout) in enc.iter().enumerate() {
        for j in 0..c.layers_per_block {
            resnet(e, format_args!("encoder.down_blocks.{i}.resnets.{j}"), if j == 0 { cin } else { cout }, cout);
        }
        if i + 1 < levels {
            e.conv(format_args!("encoder.down_blocks.{i}.downsamplers.0.conv"), cout, cout, 3);
        }
        cin = cout;
    }
    mid_block(e, "encoder", last, c.mid_block_add_attention);
    e.affine(format_args!("encoder.conv_norm_out"), last);
    e.conv(format_args!("encoder.conv_out"), 2 * c.latent_channels, last, 3);

    let dec = c.decoder_channels();
    let top = dec[levels - 1];
    e.conv(format_args!("decoder.conv_in"), top, c.latent_channels, 3);
    mid_block(e, "decoder", top, c.mid_block_add_attention);
    let mut cin = top;
    for i in 0..levels {
        let cout = dec[levels - 1 - i];
        for j in 0..=c.layers_per_block {
            resnet(e, format_args!("decoder.up_blocks.{i}.resnets.{j}"), if j == 0 { cin } else { cout }, cout);
        }
        if i + 1 < levels {
            e.conv(format_args!("decoder.up_blocks.{i}.upsamplers.0.conv"), cout, cout, 3);
        }
        cin = cout;
    }
    e.affine(format_args!("decoder.conv_norm_out"), dec[0]);
    e.conv(format_args!("decoder.conv_out"), c.out_channels, dec[0], 3);

    if c.use_quant_conv {
        e.conv(format_args!("quant_conv"), 2 * c.latent_channels, 2 * c.latent_channels, 1);
    }
    if c.use_post_quant_conv {
        e.conv(format_args!("post_quant_conv"), c.latent_channels, c.latent_channels, 1);
    }
    let bn = c.patchified_channels();
    e.t(format_args!("bn.running_mean"), &[bn]);
    e.t(format_args!("bn.running_var"), &[bn]);
    e.kind(format_args!("bn.num_batches_tracked"), &[], Kind::Int);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::klein_4b;

    fn count_and_params(f: impl FnOnce(&mut dyn FnMut(&TensorSpec))) -> (usize, u64) {
        let (mut n, mut p) = (0usize, 0u64);
        f(&mut |s: &TensorSpec| {
            n += 1;
            p += s.shape.iter().product::<usize>() as u64;
        });
        (n, p)
    }

    #[test]
    fn klein_4b_transformer_has_published_shapes() {
        let c = klein_4b::transformer();
        let mut qkv_mlp = None;
        transformer(&c, |s| {
            if s.name.as_str() == "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight" {
                qkv_mlp = Some(s.shape.clone());
            }
        });
        assert_eq!(qkv_mlp.unwrap().as_slice(), &[27648, 3072]);
        let (n, params) = count_and_params(|f| transformer(&c, f));
        // 7 lone linears, 5 × (8 attn + 4 norms + 4 ff), 20 × (2 + 2 norms), norm_out, proj_out.
        assert_eq!(n, 7 + 5 * 16 + 20 * 4 + 2);
        // About 3.9B parameters, as published.
        assert!((3.8e9..4.0e9).contains(&(params as f64)), "{params}");
    }

    #[test]
    fn qwen3_4b_parameter_count() {
        let (n, params) = count_and_params(|f| text_encoder(&klein_4b::text_encoder(), f));
        assert_eq!(n, 1 + 36 * 11 + 1);
        // Qwen3-4B: 4.02B parameters with the tied embedding.
        assert!((4.0e9..4.05e9).contains(&(params as f64)), "{params}");
    }

    #[test]
    fn vae_decoder_channels_follow_the_reversed_levels() {
        let mut shortcut = heapless::Vec::<TensorName, 8>::new();
        vae(&klein_4b::vae(), |s| {
            if s.name.starts_with("decoder.") && s.name.contains("conv_shortcut.weight") {
                shortcut.push(s.name.clone()).unwrap();
            }
        });
        assert_eq!(
            shortcut.iter().map(|s| s.as_str()).collect::<heapless::Vec<&str, 8>>().as_slice(),
            &["decoder.up_blocks.2.resnets.0.conv_shortcut.weight", "decoder.up_blocks.3.resnets.0.conv_shortcut.weight"]
        );
    }
}
