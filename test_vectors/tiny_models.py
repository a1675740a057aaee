"""The tiny random FLUX.2-klein pipelines (tiny-a, tiny-b and the 9B's structure, tiny-9b):
their specs, built with seeded weights in bf16, saved in the official diffusers layout and
loaded back in float32."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as transformers_logging

from diffusers import (
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Transformer2DModel,
)
from diffusers.utils import logging as diffusers_logging

ROOT = Path(__file__).resolve().parent
MODELS_DIR = ROOT / "models"
MODULATION_GAIN = 2.0  # weight gain of the DiT's AdaLN modulation linears (see build_transformer)

# Every script that builds or runs the tiny models imports this module first: the same
# deterministic CPU arithmetic for all of them.
torch.set_num_threads(2)
torch.use_deterministic_algorithms(True)
diffusers_logging.disable_progress_bar()
diffusers_logging.set_verbosity_error()
transformers_logging.disable_progress_bar()
warnings.filterwarnings("ignore", category=FutureWarning)


@dataclass
class ModelSpec:
    name: str
    seed: int
    is_distilled: bool
    transformer: dict
    qwen: dict
    vae: dict
    out_layers: tuple[int, ...]
    # Components re-saved as sharded checkpoints, with the shard size used.
    sharded: dict = field(default_factory=dict)
    # Write the Qwen3 rope base as the legacy top-level `rope_theta` key (transformers 4.x style).
    legacy_rope_theta: bool = False


SCHEDULER_CONFIG = dict(
    num_train_timesteps=1000,
    shift=3.0,
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=1.15,
    base_image_seq_len=256,
    max_image_seq_len=4096,
    time_shift_type="exponential",
)

# The fields every Qwen3 text encoder of FLUX.2-klein shares, published and tiny alike.
QWEN3_FIXED = dict(
    rms_norm_eps=1e-6,
    attention_bias=False,
    hidden_act="silu",
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
)

# The tiny text encoders' fields beside their specs' widths.
QWEN_COMMON = dict(
    QWEN3_FIXED,
    tie_word_embeddings=True,
    max_position_embeddings=1024,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def transformer_config(**fields) -> dict:
    """A FLUX.2 transformer's config: the fields every klein transformer shares
    (published and tiny alike), then its own `fields`."""
    fixed = dict(
        patch_size=1,
        out_channels=None,
        timestep_guidance_channels=256,
        mlp_ratio=3.0,
        rope_theta=2000,
        eps=1e-6,
        guidance_embeds=False,
    )
    return dict(fixed, **fields)


def vae_config(block_out_channels: tuple[int, ...], **fields) -> dict:
    """A FLUX.2 VAE's config: RGB in and out, one encoder and one decoder block
    per entry of `block_out_channels`, the quant convs and the mid-block
    attention, then its own `fields`."""
    blocks = len(block_out_channels)
    return dict(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * blocks,
        up_block_types=("UpDecoderBlock2D",) * blocks,
        block_out_channels=block_out_channels,
        use_quant_conv=True,
        use_post_quant_conv=True,
        mid_block_add_attention=True,
        **fields,
    )

TINY_A = ModelSpec(
    name="tiny-a",
    seed=1234,
    is_distilled=True,
    transformer=transformer_config(
        in_channels=16,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=96,
        axes_dims_rope=(4, 4, 4, 4),
    ),
    qwen=dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    ),
    vae=vae_config((32, 64), layers_per_block=1, latent_channels=4, norm_num_groups=8, sample_size=64),
    out_layers=(1, 2, 3),
)

TINY_B = ModelSpec(
    name="tiny-b",
    seed=5678,
    is_distilled=False,
    transformer=transformer_config(
        in_channels=32,
        num_layers=1,
        num_single_layers=3,
        attention_head_dim=24,
        num_attention_heads=2,
        joint_attention_dim=144,
        axes_dims_rope=(4, 4, 8, 8),
    ),
    qwen=dict(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=8,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=8,
    ),
    vae=vae_config((16, 32, 32), layers_per_block=1, latent_channels=8, norm_num_groups=8, sample_size=64),
    out_layers=(2, 4, 6),
    sharded={"text_encoder": "100KB", "transformer": "300KB"},
    legacy_rope_theta=True,
)

# The klein-9B's structure at a tiny scale: one double block to three single
# blocks (8 / 24), the transformer as wide as the text encoder (4096 / 4096),
# the joint dim three text widths (12288), Qwen3 query width equal to its
# hidden size with four query heads per key head (32 / 8), an MLP three times
# the hidden size (12288). The VAE is tiny-a's (the 9B shares the 4B's VAE).
TINY_9B = ModelSpec(
    name="tiny-9b",
    seed=9012,
    is_distilled=True,
    transformer=dict(TINY_A.transformer, num_layers=2, num_single_layers=6, joint_attention_dim=192),
    qwen=dict(
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=8,
    ),
    vae=TINY_A.vae,
    out_layers=(2, 4, 6),
)

MODEL_SPECS = [TINY_A, TINY_B, TINY_9B]


def _norm_modules(module: torch.nn.Module):
    for name, m in module.named_modules():
        if isinstance(m, (torch.nn.GroupNorm, torch.nn.LayerNorm, torch.nn.RMSNorm)) or type(m).__name__.endswith(
            "RMSNorm"
        ):
            yield name, m


@torch.no_grad()
def randomize_norms(module: torch.nn.Module, gen: torch.Generator) -> int:
    """Replace the 1/0 defaults of every affine norm by random values near them."""
    count = 0
    for _, m in _norm_modules(module):
        w = getattr(m, "weight", None)
        b = getattr(m, "bias", None)
        if isinstance(w, torch.nn.Parameter):
            w.copy_(1.0 + 0.2 * torch.randn(w.shape, generator=gen))
            count += 1
        if isinstance(b, torch.nn.Parameter):
            b.copy_(0.1 * torch.randn(b.shape, generator=gen))
            count += 1
    return count


@torch.no_grad()
def build_text_encoder(spec: ModelSpec, vocab_size: int, gen: torch.Generator) -> Qwen3ForCausalLM:
    config = Qwen3Config(vocab_size=vocab_size, **spec.qwen, **QWEN_COMMON)
    model = Qwen3ForCausalLM(config).eval()
    # Unit-scale weights so that every layer moves the residual stream noticeably.
    model.model.embed_tokens.weight.copy_(torch.randn(model.model.embed_tokens.weight.shape, generator=gen))
    for _, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and m is not model.lm_head:
            m.weight.copy_(torch.randn(m.weight.shape, generator=gen) / math.sqrt(m.in_features))
    n = randomize_norms(model, gen)
    assert n == 2 * spec.qwen["num_hidden_layers"] + 2 * spec.qwen["num_hidden_layers"] + 1, n
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


@torch.no_grad()
def build_transformer(spec: ModelSpec, gen: torch.Generator) -> Flux2Transformer2DModel:
    model = Flux2Transformer2DModel(**spec.transformer).eval()
    # nn.Linear's default init (std 1/sqrt(3 fan_in)) leaves the AdaLN gates near 0.03, so attention,
    # the text and the timestep hardly reach the velocity (two prompts gave PNGs within 1 level).
    # Variance-preserving weights, doubled on the modulation heads, make every path visible.
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            gain = MODULATION_GAIN if ("modulation" in name or name.startswith("norm_out")) else 1.0
            m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * (gain / math.sqrt(m.in_features)))
    n = randomize_norms(model, gen)
    expected = 4 * spec.transformer["num_layers"] + 2 * spec.transformer["num_single_layers"]
    assert n == expected, (n, expected)
    return model


@torch.no_grad()
def build_vae(spec: ModelSpec, gen: torch.Generator) -> AutoencoderKLFlux2:
    model = AutoencoderKLFlux2(**spec.vae).eval()
    randomize_norms(model, gen)
    bn = model.bn
    bn.running_mean.copy_(0.5 * torch.randn(bn.running_mean.shape, generator=gen))
    bn.running_var.copy_(0.5 + 1.5 * torch.rand(bn.running_var.shape, generator=gen))
    return model


def build_pipeline(spec: ModelSpec, tokenizer) -> Flux2KleinPipeline:
    torch.manual_seed(spec.seed)  # drives the default nn init inside the constructors
    gen = torch.Generator().manual_seed(spec.seed + 1)
    text_encoder = build_text_encoder(spec, len(tokenizer), gen)
    transformer = build_transformer(spec, gen)
    vae = build_vae(spec, gen)
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)
    pipe = Flux2KleinPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        is_distilled=spec.is_distilled,
    )
    # Structural constraints from the spec (section 5).
    tcfg, vcfg, qcfg = transformer.config, vae.config, text_encoder.config
    assert sum(tcfg.axes_dims_rope) == tcfg.attention_head_dim and all(d % 2 == 0 for d in tcfg.axes_dims_rope)
    assert tcfg.in_channels == 4 * vcfg.latent_channels == vae.bn.num_features
    assert tcfg.joint_attention_dim == len(spec.out_layers) * qcfg.hidden_size
    assert all(k < qcfg.num_hidden_layers for k in spec.out_layers)
    L = qcfg.num_hidden_layers
    assert tuple(spec.out_layers) == (L // 4, L // 2, 3 * L // 4)
    return pipe.to(torch.bfloat16)


def save_pipeline(spec: ModelSpec, pipe: Flux2KleinPipeline) -> Path:
    out = MODELS_DIR / spec.name
    if out.exists():
        shutil.rmtree(out)
    pipe.save_pretrained(out, safe_serialization=True)
    for component, shard_size in spec.sharded.items():
        comp_dir = out / component
        for f in comp_dir.glob("*.safetensors*"):
            f.unlink()
        getattr(pipe, component).save_pretrained(comp_dir, safe_serialization=True, max_shard_size=shard_size)
        shards = sorted(comp_dir.glob("*.safetensors"))
        assert len(shards) >= 2 and list(comp_dir.glob("*.safetensors.index.json")), (component, shards)
    te_cfg_path = out / "text_encoder" / "config.json"
    te_cfg = json.loads(te_cfg_path.read_text())
    if spec.legacy_rope_theta:
        te_cfg["rope_theta"] = te_cfg["rope_parameters"]["rope_theta"]
        del te_cfg["rope_parameters"]
        te_cfg_path.write_text(json.dumps(te_cfg, indent=2, sort_keys=True) + "\n")
    theta = te_cfg.get("rope_theta") or te_cfg["rope_parameters"]["rope_theta"]
    assert theta == 1_000_000.0, te_cfg
    return out


def load_float32_pipeline(model_dir: Path) -> Flux2KleinPipeline:
    pipe = Flux2KleinPipeline.from_pretrained(model_dir, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    for comp in ("text_encoder", "transformer", "vae"):
        module = getattr(pipe, comp)
        module.eval()
        for n, p in list(module.named_parameters()) + list(module.named_buffers()):
            if p.is_floating_point():
                assert p.dtype == torch.float32, (comp, n, p.dtype)
    return pipe


def check_weights_match(pipe32, pipe16) -> None:
    """The reloaded float32 weights are exactly the bf16 weights that were saved."""
    for comp in ("text_encoder", "transformer", "vae"):
        a = dict(getattr(pipe32, comp).state_dict())
        b = dict(getattr(pipe16, comp).state_dict())
        assert a.keys() == b.keys(), (comp, set(a) ^ set(b))
        for k in a:
            if a[k].is_floating_point():
                assert torch.equal(a[k], b[k].to(torch.float32)), (comp, k)
            else:
                assert torch.equal(a[k], b[k]), (comp, k)
