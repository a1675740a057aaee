#!/usr/bin/env python3
"""Regenerate flux-lite's test vectors: two tiny random FLUX.2-klein pipelines in the
official diffusers layout, and goldens computed by diffusers in float32.

Run from anywhere:  python3 test_vectors/generate.py
Everything is deterministic (fixed torch seeds, CPU only). See README.md for the layout.
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import Qwen2TokenizerFast, Qwen3Config, Qwen3ForCausalLM
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
GOLDENS_DIR = ROOT / "goldens"
MAX_SEQ = 512
CLAMP_LIMIT = 0.30  # max fraction of decoded pixels allowed to sit at 0 or 1
MODULATION_GAIN = 2.0  # weight gain of the DiT's AdaLN modulation linears (see build_transformer)

torch.set_num_threads(2)
torch.use_deterministic_algorithms(True)
diffusers_logging.disable_progress_bar()
diffusers_logging.set_verbosity_error()
transformers_logging.disable_progress_bar()
warnings.filterwarnings("ignore", category=FutureWarning)

# --------------------------------------------------------------------------------------------
# Tokenizer: a tiny byte-level BPE in the Qwen2/Qwen3 tokenizer.json format.
# --------------------------------------------------------------------------------------------

QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
BPE_VOCAB_SIZE = 480  # 256 byte symbols + merges; the added tokens come on top

# (content, special) in id order, appended after the BPE vocabulary as Qwen does.
ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
]

# Qwen3-style chat template (the tool-calling branches of the public template are left out).
CHAT_TEMPLATE = """\
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if message.role == 'system' or message.role == 'user' %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' + content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

TRAINING_TEXT = """\
A red fox trots across the snow at dawn, leaving a neat line of prints behind it.
The lighthouse on the cliff has guided ships since 1998; its lamp turns every 12 seconds.
Blue birds sing in the garden while the kettle boils. Isn't it lovely? We'll see, they're late.
A small cabin in the mountains, warm light in the windows, smoke rising from the chimney.
Photograph of a city street at night: neon signs, wet asphalt, reflections, people with umbrellas.
An astronaut riding a horse on the moon, highly detailed, dramatic lighting, 35mm film, f/2.8.
Portrait of an old fisherman with a grey beard, wearing a yellow raincoat, cinematic, 4k.
A bowl of ramen with an egg, green onions and nori; steam rising; top-down view (food photography).
Watercolor painting of a quiet harbor with sailboats, soft pastel colors and gentle waves.
The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG!
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 2048 3.14159 -17 +23 1,000,000 12:30 2026-01-15.
Punctuation & symbols: ... -- -> <= >= != == ;; :: () [] {} "quoted" 'single' #hash @at $5 50% a*b=c ~tilde_ |pipe| \\back/slash.
Code: def main(x): return x ** 2  # comment; for (int i = 0; i < n; ++i) { sum += a[i]; }
Café au lait, crème brûlée, naïve façade, jalapeño, São Paulo, Zürich, Kraków, Ærø, smørrebrød.
Ünïcödé tëxt wïth diacritics: à á â ã ä å è é ê ë ì í î ï ò ó ô õ ö ù ú û ü ý ÿ ç ñ ß œ.
Español: el zorro rojo corre por la nieve. Français: un phare sur une falaise au coucher du soleil.
Deutsch: Ein kleiner Vogel singt über dem grünen Wald. Português: o pássaro azul está na árvore.
Polski: żółć, gęślą jaźń. Čeština: příliš žluťoučký kůň úpěl ďábelské ódy. Türkçe: çay ve şeker.
東京の夜景はとても美しいです。赤い狐が雪の中を走っている。灯台は崖の上に立っている。
北京是中国的首都。一只蓝色的小鸟在树上唱歌。我们明天去海边看日出。东京 东京 东京 夜 夜。
한국어 문장도 조금 있습니다. 서울의 밤은 밝습니다. Русский текст: красная лиса бежит по снегу.
Ελληνικά: η αλεπού τρέχει στο χιόνι. العربية: الثعلب الأحمر في الثلج. हिन्दी: लाल लोमड़ी बर्फ में।
Emoji: 🦊 🐦 🌊 🏔️ ✨ 🔥 ❤️ 👍 🎨 🌙 ☀️ 🌸 — fox, bird, wave, mountain, sparkles, fire, heart.
Mixed lines
with line breaks\r\nand windows endings\n\n   indented text with   several   spaces   
\ttabs\tand\ttrailing whitespace \t
A lighthouse on a cliff, 1998
second line of the prompt, third line, and the final line.
a photo of a cat sitting on a windowsill, golden hour, bokeh background, shallow depth of field
a fantasy castle floating above the clouds, epic scale, matte painting, trending on artstation
minimalist logo of a mountain and a river, flat design, vector art, white background
an isometric pixel-art village with tiny houses, trees, a well and a windmill at sunset
macro shot of a dewdrop on a leaf, ultra sharp, natural light, 100mm lens
the user asks and the assistant answers: user, assistant, user, assistant; system prompt.
oil painting of a stormy sea with a small boat, thick brush strokes, in the style of the old masters
"""


def build_tokenizer() -> Qwen2TokenizerFast:
    tok = Tokenizer(
        models.BPE(
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    # Repeat the corpus so that merge counts are well above min_frequency; the result is deterministic.
    tok.train_from_iterator([TRAINING_TEXT] * 4, trainer=trainer)
    assert tok.get_vocab_size() == BPE_VOCAB_SIZE, tok.get_vocab_size()
    tok.add_tokens(
        [
            AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
            for content, special in ADDED_TOKENS
        ]
    )
    # The Python bindings serialise a few fields differently from Qwen's published tokenizer.json
    # (the ByteLevel decoder's flags, the BPE affixes); set them as Qwen has them.
    spec = json.loads(tok.to_str())
    spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    spec["model"]["continuing_subword_prefix"] = ""
    spec["model"]["end_of_word_suffix"] = ""
    tok = Tokenizer.from_str(json.dumps(spec))

    hf = Qwen2TokenizerFast(
        tokenizer_object=tok,
        unk_token=None,
        bos_token=None,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        padding_side="right",
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def render_prompt(tokenizer, prompt: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )


def check_tokenizer(tokenizer) -> None:
    rendered = render_prompt(tokenizer, "hello")
    want = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert rendered == want, repr(rendered)
    vocab = tokenizer.get_vocab()
    for i, (content, _) in enumerate(ADDED_TOKENS):
        assert vocab[content] == BPE_VOCAB_SIZE + i, (content, vocab[content])
    assert tokenizer.pad_token_id == vocab["<|endoftext|>"]
    assert tokenizer.padding_side == "right"
    # Round trip through bytes for text the BPE never saw.
    text = "Ωmega 🦄 test\r\n"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text


TOKENIZER_PROMPTS = [
    "a red fox in the snow",
    "Ünïcödé café 東京 🦊 at night",
    "a lighthouse on a cliff, 1998\nsecond line",
    "blue bird",
    "",
    "   leading and trailing spaces   ",
    "tabs\tand\r\nwindows line endings\n\n\nthree newlines",
    "Numbers 0123456789 3.14159 -42 1,000,000 and 2026-01-15",
    "I'm sure they'll say it's fine, WE'D AGREE, you've done it",
    "混合テキスト：北京と東京、한국어 and Ελληνικά ✨🔥👍🏽",
    "e\u0301 composed by NFC vs é precomposed, Å vs A\u030a",  # exercises the NFC normalizer
    "<|im_end|> literal special token and <think> inside a prompt",
    " ".join(f"word{i} is number {i}, ünïcödé {i % 7};" for i in range(120)),  # > 512 tokens
]


def tokenizer_cases(tokenizer) -> list[dict]:
    cases = []
    for prompt in TOKENIZER_PROMPTS:
        rendered = render_prompt(tokenizer, prompt)
        full = tokenizer(rendered)["input_ids"]
        enc = tokenizer(rendered, padding="max_length", truncation=True, max_length=MAX_SEQ)
        assert len(enc["input_ids"]) == MAX_SEQ
        cases.append(
            {
                "prompt": prompt,
                "rendered": rendered,
                "num_tokens_untruncated": len(full),
                "tokens_untruncated": tokenizer.convert_ids_to_tokens(full),
                "input_ids": enc["input_ids"],
                "attention_mask": enc["attention_mask"],
            }
        )
    assert any(c["num_tokens_untruncated"] > MAX_SEQ for c in cases)
    return cases


# --------------------------------------------------------------------------------------------
# Tiny models
# --------------------------------------------------------------------------------------------


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

QWEN_COMMON = dict(
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    max_position_embeddings=1024,
    attention_bias=False,
    hidden_act="silu",
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

TINY_A = ModelSpec(
    name="tiny-a",
    seed=1234,
    is_distilled=True,
    transformer=dict(
        patch_size=1,
        in_channels=16,
        out_channels=None,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=96,
        timestep_guidance_channels=256,
        mlp_ratio=3.0,
        axes_dims_rope=(4, 4, 4, 4),
        rope_theta=2000,
        eps=1e-6,
        guidance_embeds=False,
    ),
    qwen=dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    ),
    vae=dict(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(32, 64),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=64,
        use_quant_conv=True,
        use_post_quant_conv=True,
        mid_block_add_attention=True,
    ),
    out_layers=(1, 2, 3),
)

TINY_B = ModelSpec(
    name="tiny-b",
    seed=5678,
    is_distilled=False,
    transformer=dict(
        patch_size=1,
        in_channels=32,
        out_channels=None,
        num_layers=1,
        num_single_layers=3,
        attention_head_dim=24,
        num_attention_heads=2,
        joint_attention_dim=144,
        timestep_guidance_channels=256,
        mlp_ratio=3.0,
        axes_dims_rope=(4, 4, 8, 8),
        rope_theta=2000,
        eps=1e-6,
        guidance_embeds=False,
    ),
    qwen=dict(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=8,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=8,
    ),
    vae=dict(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(16, 32, 32),
        layers_per_block=1,
        latent_channels=8,
        norm_num_groups=8,
        sample_size=64,
        use_quant_conv=True,
        use_post_quant_conv=True,
        mid_block_add_attention=True,
    ),
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


# --------------------------------------------------------------------------------------------
# Goldens
# --------------------------------------------------------------------------------------------


@dataclass
class Case:
    model: ModelSpec
    name: str
    prompt: str
    seed: int
    width: int
    height: int
    steps: int
    guidance: float


CASES = [
    Case(TINY_A, "one-step", "a red fox in the snow", 42, 32, 32, 1, 1.0),
    Case(TINY_A, "four-step-wide", "Ünïcödé café 東京 🦊 at night", 7, 48, 32, 4, 1.0),
    Case(TINY_B, "three-step", "a lighthouse on a cliff, 1998\nsecond line", 0, 32, 32, 3, 1.0),
    Case(TINY_B, "cfg", "blue bird", 3, 32, 48, 2, 4.0),
    Case(TINY_9B, "two-step", "a paper boat on a pond", 11, 32, 32, 2, 1.0),
]


def vae_scale_factor(pipe) -> int:
    return 2 ** (len(pipe.vae.config.block_out_channels) - 1)


def make_noise(pipe, case: Case) -> torch.Tensor:
    """Noise exactly as flux-lite draws it: bf16 randn in the patchified shape (1, C, h, w)."""
    s = vae_scale_factor(pipe)
    assert case.width % (2 * s) == 0 and case.height % (2 * s) == 0
    shape = (1, pipe.transformer.config.in_channels, case.height // (2 * s), case.width // (2 * s))
    gen = torch.Generator().manual_seed(case.seed)
    return torch.randn(shape, generator=gen, dtype=torch.bfloat16)


class Recorder:
    """Hooks on the pipeline's modules that capture the intermediate tensors of one call."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.te_inputs: list[dict] = []
        self.te_hidden: list[tuple] = []
        self.te_layer_out: list[torch.Tensor] = []  # raw decoder-layer outputs, all calls in order
        self.qwen_rope: list[tuple] = []
        self.tr_calls: list[dict] = []
        self.pos_embed: list[tuple] = []
        self.temb: list[torch.Tensor] = []
        self.temb_input: list[torch.Tensor] = []
        self.sinusoid: list[torch.Tensor] = []
        self.sched_steps: list[dict] = []
        self.step_latents: list[torch.Tensor] = []
        self.decode_in: list[torch.Tensor] = []
        self.decode_out: list[torch.Tensor] = []
        # One dict per transformer call: the DiT's internal tensors, batch dim dropped (see tr_inner_hooks).
        self.tr_inner: list[dict[str, torch.Tensor]] = []
        self._handles = []
        self._orig_step = None
        self._orig_decode = None

    def __enter__(self):
        pipe = self.pipe
        te, tr = pipe.text_encoder, pipe.transformer

        def te_pre(_m, args, kwargs):
            self.te_inputs.append(
                {"input_ids": kwargs["input_ids"].clone(), "attention_mask": kwargs["attention_mask"].clone()}
            )

        def te_post(_m, _args, _kwargs, out):
            self.te_hidden.append(tuple(h.detach().clone() for h in out.hidden_states))

        def layer_post(_m, _args, out):
            self.te_layer_out.append((out[0] if isinstance(out, tuple) else out).detach().clone())

        def rope_post(_m, _args, out):
            self.qwen_rope.append((out[0].detach().clone(), out[1].detach().clone()))

        def tr_post(_m, _args, kwargs, out):
            self.tr_calls.append(
                {
                    "hidden_states": kwargs["hidden_states"].detach().clone(),
                    "encoder_hidden_states": kwargs["encoder_hidden_states"].detach().clone(),
                    "timestep": kwargs["timestep"].detach().clone(),
                    "txt_ids": kwargs["txt_ids"].detach().clone(),
                    "img_ids": kwargs["img_ids"].detach().clone(),
                    "out": out[0].detach().clone(),
                }
            )

        def pos_post(_m, args, out):
            self.pos_embed.append((args[0].detach().clone(), out[0].detach().clone(), out[1].detach().clone()))

        def temb_post(_m, args, out):
            self.temb_input.append(args[0].detach().clone())
            self.temb.append(out.detach().clone())

        def lin1_pre(_m, args):
            self.sinusoid.append(args[0].detach().clone())

        self._handles = [
            te.register_forward_pre_hook(te_pre, with_kwargs=True),
            te.register_forward_hook(te_post, with_kwargs=True),
            te.model.rotary_emb.register_forward_hook(rope_post),
            *[layer.register_forward_hook(layer_post) for layer in te.model.layers],
            tr.register_forward_hook(tr_post, with_kwargs=True),
            tr.pos_embed.register_forward_hook(pos_post),
            tr.time_guidance_embed.register_forward_hook(temb_post),
            tr.time_guidance_embed.timestep_embedder.linear_1.register_forward_pre_hook(lin1_pre),
            *self.tr_inner_hooks(tr),
        ]

        sched = pipe.scheduler
        self._orig_step = sched.step

        def step(model_output, timestep, sample, *args, **kwargs):
            res = self._orig_step(model_output, timestep, sample, *args, **kwargs)
            prev = res[0] if isinstance(res, tuple) else res.prev_sample
            self.sched_steps.append(
                {"velocity": model_output.detach().clone(), "t": timestep, "sample": sample.clone(), "prev": prev.clone()}
            )
            return res

        sched.step = step

        vae = pipe.vae
        self._orig_decode = vae.decode

        def decode(z, *args, **kwargs):
            self.decode_in.append(z.detach().clone())
            res = self._orig_decode(z, *args, **kwargs)
            self.decode_out.append((res[0] if isinstance(res, tuple) else res.sample).detach().clone())
            return res

        vae.decode = decode
        return self

    def tr_inner_hooks(self, tr) -> list:
        """Hooks that record the DiT's per-block tensors of every transformer call into self.tr_inner."""

        def put(key: str, t: torch.Tensor) -> None:
            cur = self.tr_inner[-1]
            assert key not in cur, key  # every module runs once per call
            assert t.shape[0] == 1, (key, t.shape)  # batch 1
            cur[key] = t[0].detach().clone()

        def tr_pre(_m, _args):
            self.tr_inner.append({})

        def out_hook(key):
            return lambda _m, _args, out: put(key, out)

        def double_post(b):
            def hook(_m, args, kwargs, out):
                assert not args  # Flux2Transformer2DModel passes everything by keyword
                put(f"double.{b}.in_img", kwargs["hidden_states"])
                put(f"double.{b}.in_txt", kwargs["encoder_hidden_states"])
                put(f"double.{b}.temb_mod_img", kwargs["temb_mod_img"])
                put(f"double.{b}.temb_mod_txt", kwargs["temb_mod_txt"])
                enc_out, img_out = out  # the block returns (encoder_hidden_states, hidden_states)
                put(f"double.{b}.out_img", img_out)
                put(f"double.{b}.out_txt", enc_out)

            return hook

        def single_post(b):
            def hook(_m, args, kwargs, out):
                assert not args
                # diffusers concatenates [txt; img] once, before the first single block, and passes the joint
                # stream as hidden_states with encoder_hidden_states=None.
                assert kwargs["encoder_hidden_states"] is None
                assert not kwargs.get("split_hidden_states", False)
                put(f"single.{b}.in", kwargs["hidden_states"])
                put(f"single.{b}.temb_mod", kwargs["temb_mod"])
                put(f"single.{b}.out", out)

            return hook

        def norm_out_post(_m, args, out):
            put("norm_out.in", args[0])
            put("norm_out.temb", args[1])
            put("norm_out", out)

        return [
            tr.register_forward_pre_hook(tr_pre),
            tr.x_embedder.register_forward_hook(out_hook("x_embed")),
            tr.context_embedder.register_forward_hook(out_hook("context_embed")),
            tr.double_stream_modulation_img.register_forward_hook(out_hook("mod_img")),
            tr.double_stream_modulation_txt.register_forward_hook(out_hook("mod_txt")),
            tr.single_stream_modulation.register_forward_hook(out_hook("mod_single")),
            *[
                blk.register_forward_hook(double_post(b), with_kwargs=True)
                for b, blk in enumerate(tr.transformer_blocks)
            ],
            *[
                blk.register_forward_hook(single_post(b), with_kwargs=True)
                for b, blk in enumerate(tr.single_transformer_blocks)
            ],
            tr.norm_out.register_forward_hook(norm_out_post),
            tr.proj_out.register_forward_hook(out_hook("proj_out")),
        ]

    def on_step_end(self, _pipe, i, t, kwargs):
        assert i == len(self.step_latents)
        self.step_latents.append(kwargs["latents"].detach().clone())
        return {}

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        del self.pipe.scheduler.step  # back to the class method
        del self.pipe.vae.decode


def f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float32).contiguous()


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


def check_dit_chain(tr, inner: dict, S: int, out: torch.Tensor, temb: torch.Tensor) -> None:
    """The captured DiT tensors of one call fit together exactly (torch.equal, no tolerance)."""
    D, T = tr.inner_dim, MAX_SEQ
    n_double, n_single = len(tr.transformer_blocks), len(tr.single_transformer_blocks)
    assert inner["x_embed"].shape == (S, D) and inner["context_embed"].shape == (T, D)
    assert inner["mod_img"].shape == inner["mod_txt"].shape == (6 * D,) and inner["mod_single"].shape == (3 * D,)
    img, txt = inner["x_embed"], inner["context_embed"]
    for b in range(n_double):
        assert torch.equal(inner[f"double.{b}.in_img"], img) and torch.equal(inner[f"double.{b}.in_txt"], txt), b
        # Every double block gets the same, unsplit modulation vectors.
        assert torch.equal(inner[f"double.{b}.temb_mod_img"], inner["mod_img"])
        assert torch.equal(inner[f"double.{b}.temb_mod_txt"], inner["mod_txt"])
        img, txt = inner[f"double.{b}.out_img"], inner[f"double.{b}.out_txt"]
        assert img.shape == (S, D) and txt.shape == (T, D)
    x = torch.cat([txt, img])  # the joint single-stream sequence: text first
    for b in range(n_single):
        assert torch.equal(inner[f"single.{b}.in"], x), b
        assert torch.equal(inner[f"single.{b}.temb_mod"], inner["mod_single"])
        x = inner[f"single.{b}.out"]
        assert x.shape == (T + S, D)
    assert torch.equal(inner["norm_out.in"], x[T:])  # text tokens dropped before norm_out
    assert torch.equal(inner["norm_out.temb"], temb)
    assert inner["norm_out"].shape == (S, D)
    assert torch.equal(inner["proj_out"], out)


def _layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dim, no affine, biased variance (as torch.nn.LayerNorm)."""
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [L, H, hd]; cos/sin [L, hd]. Interleaved pairs (2j, 2j+1) rotate together."""
    rot = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    return x * cos[:, None] + rot * sin[:, None]


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Full (unmasked) softmax attention over [L, H, hd]; returns [L, H*hd]."""
    w = (torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])).softmax(-1)
    return torch.einsum("hqk,khd->qhd", w, v).flatten(1)


def _lin(m: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    assert m.bias is None
    return x @ m.weight.T


def _swiglu_ff(ff, x: torch.Tensor) -> torch.Tensor:
    h = _lin(ff.linear_in, x)
    m = h.shape[-1] // 2
    return _lin(ff.linear_out, torch.nn.functional.silu(h[:, :m]) * h[:, m:])  # first half is the gate


@torch.no_grad()
def check_dit_reference(tr, inner: dict, sinusoid: torch.Tensor, t_in: torch.Tensor, rope) -> None:
    """An independent re-implementation of each DiT stage (plain tensor ops, in the order a Rust engine
    follows), fed with the captured inputs of that stage, matches diffusers' output to float32 rounding."""
    silu = torch.nn.functional.silu
    eps = tr.config.eps
    D, T = tr.inner_dim, MAX_SEQ
    cos, sin = rope

    def close(name, got, want, tol=1e-5):
        err = float((got - want).abs().max() / want.abs().max().clamp(min=1.0))
        assert err <= tol, (name, err)

    # Timestep (t_in is already ×1000): [cos, sin] of t_in·exp(-ln(1e4)·k/128), k < 128, all in f32;
    # then linear_1 → SiLU → linear_2.
    half = tr.config.timestep_guidance_channels // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    arg = t_in[:, None] * freqs[None]
    close("sinusoid", torch.cat([arg.cos(), arg.sin()], -1)[0], sinusoid, 1e-4)
    te = tr.time_guidance_embed.timestep_embedder
    temb = _lin(te.linear_2, silu(_lin(te.linear_1, sinusoid)))
    close("temb", temb, inner["norm_out.temb"])
    # Modulations: linear(SiLU(temb)), raw [k·D] output, chunked later into (shift, scale, gate) per set.
    for key, mod in (
        ("mod_img", tr.double_stream_modulation_img),
        ("mod_txt", tr.double_stream_modulation_txt),
        ("mod_single", tr.single_stream_modulation),
    ):
        close(key, _lin(mod.linear, silu(temb)), inner[key])

    for b, blk in enumerate(tr.transformer_blocks):
        a, hd = blk.attn, blk.attn.head_dim
        assert blk.norm1.eps == blk.norm2.eps == a.norm_q.eps == a.norm_added_k.eps == eps
        img, txt = inner[f"double.{b}.in_img"], inner[f"double.{b}.in_txt"]
        i_shift1, i_scale1, i_gate1, i_shift2, i_scale2, i_gate2 = inner["mod_img"].chunk(6)
        t_shift1, t_scale1, t_gate1, t_shift2, t_scale2, t_gate2 = inner["mod_txt"].chunk(6)
        xi = _layer_norm(img, eps) * (1 + i_scale1) + i_shift1
        xt = _layer_norm(txt, eps) * (1 + t_scale1) + t_shift1

        def heads(lin, x):
            return _lin(lin, x).unflatten(-1, (-1, hd))

        # Per-head RMSNorm before RoPE; the text stream has its own projections and norms.
        q = torch.cat(
            [
                _rms_norm(heads(a.add_q_proj, xt), a.norm_added_q.weight, eps),
                _rms_norm(heads(a.to_q, xi), a.norm_q.weight, eps),
            ]
        )
        k = torch.cat(
            [
                _rms_norm(heads(a.add_k_proj, xt), a.norm_added_k.weight, eps),
                _rms_norm(heads(a.to_k, xi), a.norm_k.weight, eps),
            ]
        )
        v = torch.cat([heads(a.add_v_proj, xt), heads(a.to_v, xi)])
        o = _attention(_rope(q, cos, sin), _rope(k, cos, sin), v)  # joint sequence [txt; img]
        img = img + i_gate1 * _lin(a.to_out[0], o[T:])
        txt = txt + t_gate1 * _lin(a.to_add_out, o[:T])
        img = img + i_gate2 * _swiglu_ff(blk.ff, _layer_norm(img, eps) * (1 + i_scale2) + i_shift2)
        txt = txt + t_gate2 * _swiglu_ff(blk.ff_context, _layer_norm(txt, eps) * (1 + t_scale2) + t_shift2)
        close(f"double.{b}.out_img", img, inner[f"double.{b}.out_img"])
        close(f"double.{b}.out_txt", txt, inner[f"double.{b}.out_txt"])

    for b, blk in enumerate(tr.single_transformer_blocks):
        a, hd, m = blk.attn, blk.attn.head_dim, blk.attn.mlp_hidden_dim
        assert blk.norm.eps == a.norm_q.eps == a.norm_k.eps == eps
        x = inner[f"single.{b}.in"]
        shift, scale, gate = inner["mod_single"].chunk(3)
        p = _lin(a.to_qkv_mlp_proj, _layer_norm(x, eps) * (1 + scale) + shift)
        assert p.shape[-1] == 3 * D + 2 * m
        q, k, v = (p[:, j * D : (j + 1) * D].unflatten(-1, (-1, hd)) for j in range(3))
        mlp = silu(p[:, 3 * D : 3 * D + m]) * p[:, 3 * D + m :]
        q = _rope(_rms_norm(q, a.norm_q.weight, eps), cos, sin)
        k = _rope(_rms_norm(k, a.norm_k.weight, eps), cos, sin)
        o = _attention(q, k, v)
        x = x + gate * _lin(a.to_out, torch.cat([o, mlp], -1))
        close(f"single.{b}.out", x, inner[f"single.{b}.out"])

    assert tr.norm_out.norm.eps == eps and tr.norm_out.norm.weight is None
    scale, shift = _lin(tr.norm_out.linear, silu(temb)).chunk(2)  # note: scale first here
    close("norm_out", _layer_norm(inner["norm_out.in"], eps) * (1 + scale) + shift, inner["norm_out"])


def unpack_and_denorm(pipe, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Our own decode preparation: tokens → (C, h, w) → BN de-normalisation → unpatchify."""
    s = vae_scale_factor(pipe)
    h, w = height // (2 * s), width // (2 * s)
    x = latents[0].T.reshape(1, -1, h, w)  # token = y*w + x
    bn = pipe.vae.bn
    std = torch.sqrt(bn.running_var + pipe.vae.config.batch_norm_eps).view(1, -1, 1, 1)
    x = x * std + bn.running_mean.view(1, -1, 1, 1)
    c = x.shape[1] // 4
    x = x.reshape(1, c, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(1, c, 2 * h, 2 * w)
    return x


@torch.no_grad()
def run_case(pipe, case: Case) -> dict:
    spec = case.model
    noise = make_noise(pipe, case)  # (1, C, h, w) bf16
    packed = noise.reshape(1, noise.shape[1], -1).permute(0, 2, 1)  # (1, S, C)
    S, C = packed.shape[1], packed.shape[2]
    do_cfg = case.guidance > 1.0 and not spec.is_distilled
    calls_per_step = 2 if do_cfg else 1

    with Recorder(pipe) as rec:
        result = pipe(
            prompt=case.prompt,
            height=case.height,
            width=case.width,
            num_inference_steps=case.steps,
            guidance_scale=case.guidance,
            # diffusers packs the (B, C, h, w) latents itself (prepare_latents); pass them unpacked.
            latents=noise.to(torch.float32),
            output_type="pil",
            max_sequence_length=MAX_SEQ,
            text_encoder_out_layers=spec.out_layers,
            callback_on_step_end=rec.on_step_end,
            callback_on_step_end_tensor_inputs=["latents"],
        )
    pil = result.images[0]
    sched = pipe.scheduler

    n = case.steps
    assert len(rec.te_inputs) == (2 if do_cfg else 1)
    assert len(rec.tr_calls) == n * calls_per_step
    assert len(rec.sched_steps) == n and len(rec.step_latents) == n
    assert len(rec.decode_in) == 1

    g: dict[str, torch.Tensor] = {}
    g["input_ids"] = rec.te_inputs[0]["input_ids"][0].to(torch.int64)
    g["attention_mask"] = rec.te_inputs[0]["attention_mask"][0].to(torch.int64)
    hidden = rec.te_hidden[0]
    assert len(hidden) == pipe.text_encoder.config.num_hidden_layers + 1
    num_layers = pipe.text_encoder.config.num_hidden_layers
    for k in spec.out_layers:
        # hidden_states[k] is the raw output of decoder layer k-1 (only the last entry is normed).
        assert torch.equal(hidden[k], rec.te_layer_out[k - 1]), k
        g[f"hidden_states.{k}"] = f32(hidden[k][0])
    assert not torch.equal(hidden[num_layers], rec.te_layer_out[num_layers - 1])
    prompt_embeds = rec.tr_calls[0]["encoder_hidden_states"][0]
    g["prompt_embeds"] = f32(prompt_embeds)
    # prompt_embeds[:, slot*hidden + d] = hidden_states[out_layers[slot]][:, d]
    stacked = torch.cat([hidden[k][0] for k in spec.out_layers], dim=-1)
    assert torch.equal(stacked, prompt_embeds)
    if do_cfg:
        g["negative_input_ids"] = rec.te_inputs[1]["input_ids"][0].to(torch.int64)
        g["negative_attention_mask"] = rec.te_inputs[1]["attention_mask"][0].to(torch.int64)
        g["negative_prompt_embeds"] = f32(rec.tr_calls[1]["encoder_hidden_states"][0])
        neg_stacked = torch.cat([rec.te_hidden[1][k][0] for k in spec.out_layers], dim=-1)
        assert torch.equal(neg_stacked, rec.tr_calls[1]["encoder_hidden_states"][0])
    qcos, qsin = rec.qwen_rope[0]
    g["qwen_rope_cos"] = f32(qcos[0])
    g["qwen_rope_sin"] = f32(qsin[0])

    g["noise"] = f32(packed[0])
    assert torch.equal(rec.tr_calls[0]["hidden_states"][0], g["noise"])  # diffusers packed it the same way
    g["sigmas"] = f32(sched.sigmas)
    g["timesteps"] = f32(sched.timesteps)
    assert g["sigmas"].shape == (n + 1,) and g["timesteps"].shape == (n,)

    # pos_embed is called on img_ids first, then txt_ids (transformer forward).
    img_ids, img_cos, img_sin = rec.pos_embed[0]
    txt_ids, txt_cos, txt_sin = rec.pos_embed[1]
    assert img_cos.shape[0] == S and txt_cos.shape[0] == MAX_SEQ
    g["txt_ids"] = txt_ids.to(torch.int64)
    g["img_ids"] = img_ids.to(torch.int64)
    g["txt_rope_cos"], g["txt_rope_sin"] = f32(txt_cos), f32(txt_sin)
    g["img_rope_cos"], g["img_rope_sin"] = f32(img_cos), f32(img_sin)

    for i in range(n):
        call = rec.tr_calls[i * calls_per_step]
        g[f"temb.{i}"] = f32(rec.temb[i * calls_per_step][0])
        g[f"timestep_input.{i}"] = f32(rec.temb_input[i * calls_per_step]).reshape(1)
        g[f"timestep_sinusoid.{i}"] = f32(rec.sinusoid[i * calls_per_step][0])
        if do_cfg:
            assert torch.equal(rec.temb[2 * i], rec.temb[2 * i + 1])
            g[f"velocity_pos.{i}"] = f32(call["out"][0, :S])
            g[f"velocity_neg.{i}"] = f32(rec.tr_calls[2 * i + 1]["out"][0, :S])
            guided = g[f"velocity_neg.{i}"] + case.guidance * (g[f"velocity_pos.{i}"] - g[f"velocity_neg.{i}"])
            assert torch.equal(guided, rec.sched_steps[i]["velocity"][0])
        g[f"velocity.{i}"] = f32(rec.sched_steps[i]["velocity"][0])
        g[f"latents.{i}"] = f32(rec.step_latents[i][0])
        if not do_cfg:
            assert torch.equal(rec.sched_steps[i]["velocity"][0], call["out"][0, :S])
        assert torch.equal(rec.sched_steps[i]["prev"], rec.step_latents[i])

    # DiT internals, block by block, for every step (cfg: the positive pass only). Checked for every call.
    tr = pipe.transformer
    assert len(rec.tr_inner) == n * calls_per_step
    rope = (
        torch.cat([g["txt_rope_cos"], g["img_rope_cos"]]),
        torch.cat([g["txt_rope_sin"], g["img_rope_sin"]]),
    )
    for c, inner in enumerate(rec.tr_inner):
        check_dit_chain(tr, inner, S, rec.tr_calls[c]["out"][0], rec.temb[c][0])
        check_dit_reference(tr, inner, rec.sinusoid[c][0], rec.temb_input[c].reshape(1), rope)
    n_double, n_single = len(tr.transformer_blocks), len(tr.single_transformer_blocks)
    for i in range(n):
        inner = rec.tr_inner[i * calls_per_step]
        # proj_out(norm_out) is the velocity of this pass (the conditional one for cfg).
        v = g[f"velocity_pos.{i}"] if do_cfg else g[f"velocity.{i}"]
        assert torch.equal(inner["proj_out"], v)
        assert torch.allclose(inner["norm_out"] @ tr.proj_out.weight.T, v, rtol=0, atol=1e-5)
        keys = ["x_embed", "context_embed", "mod_img", "mod_txt", "mod_single", "norm_out"]
        keys += [f"double.{b}.{part}" for b in range(n_double) for part in ("in_img", "in_txt", "out_img", "out_txt")]
        keys += [f"single.{b}.{part}" for b in range(n_single) for part in ("in", "out")]
        for key in keys:
            assert f"tr.{key}.{i}" not in g
            g[f"tr.{key}.{i}"] = f32(inner[key])

    z = rec.decode_in[0]
    g["denorm_latent"] = f32(z[0])
    decoded = rec.decode_out[0]
    g["decoded"] = f32(decoded[0])
    image = (decoded[0] / 2 + 0.5).clamp(0, 1)
    g["image"] = f32(image)

    # --- independent checks --------------------------------------------------------------
    # 1. The Euler steps reproduce the captured latents (f32 arithmetic, as the scheduler).
    lat = packed.to(torch.float32)[0]
    for i in range(n):
        lat = lat + (g["sigmas"][i + 1] - g["sigmas"][i]) * g[f"velocity.{i}"]
        assert torch.allclose(lat, g[f"latents.{i}"], rtol=0, atol=1e-6), i
        lat = g[f"latents.{i}"]
    # 2. Our own unpack/de-normalise/unpatchify of the final latents gives what entered the VAE.
    z_own = unpack_and_denorm(pipe, g[f"latents.{n - 1}"][None], case.height, case.width)
    assert torch.allclose(z_own, z, rtol=0, atol=1e-6)
    # 3. Decoding it again reproduces the pipeline image and PNG.
    dec_own = pipe.vae.decode(z_own, return_dict=False)[0]
    assert torch.allclose(dec_own, decoded, rtol=0, atol=1e-5)
    u8 = (image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    pil_np = np.asarray(pil.convert("RGB"))
    assert pil_np.shape == (case.height, case.width, 3)
    assert np.array_equal(u8, pil_np)

    clamped = float(((image <= 0.0) | (image >= 1.0)).float().mean())
    stats = {
        "clamped_fraction": clamped,
        "image_mean": float(image.mean()),
        "image_std": float(image.std()),
        "velocity0_std": float(g["velocity.0"].std()),
        "prompt_embeds_std": float(g["prompt_embeds"].std()),
    }
    return {"tensors": g, "pil": pil, "stats": stats}


def write_case(case: Case, out: dict) -> Path:
    d = GOLDENS_DIR / case.model.name / case.name
    d.mkdir(parents=True, exist_ok=True)
    meta = {
        "model": case.model.name,
        "model_dir": f"models/{case.model.name}",
        "prompt": case.prompt,
        "seed": case.seed,
        "width": case.width,
        "height": case.height,
        "steps": case.steps,
        "guidance": case.guidance,
        "cfg": case.guidance > 1.0 and not case.model.is_distilled,
        "text_encoder_out_layers": list(case.model.out_layers),
        "max_sequence_length": MAX_SEQ,
        "noise_shape": list(make_noise_shape(case)),
        "clamped_fraction": round(out["stats"]["clamped_fraction"], 6),
    }
    (d / "case.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    tensors = {k: v.contiguous() for k, v in sorted(out["tensors"].items())}
    save_file(tensors, str(d / "goldens.safetensors"), metadata={"generator": "test_vectors/generate.py"})
    out["pil"].save(d / "image.png")
    return d


def make_noise_shape(case: Case) -> tuple[int, ...]:
    s = 2 ** (len(case.model.vae["block_out_channels"]) - 1)
    return (1, case.model.transformer["in_channels"], case.height // (2 * s), case.width // (2 * s))


def dump_tokenizer_cases(cases: list[dict]) -> str:
    """JSON with one line per field, so that the 512-long id lists stay on one line each."""
    parts = []
    for c in cases:
        fields = ",\n".join(f"   {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in c.items())
        parts.append("  {\n" + fields + "\n  }")
    text = '{\n "max_length": %d,\n "cases": [\n%s\n ]\n}\n' % (MAX_SEQ, ",\n".join(parts))
    assert json.loads(text) == {"max_length": MAX_SEQ, "cases": cases}
    return text


def main() -> None:
    tokenizer = build_tokenizer()
    check_tokenizer(tokenizer)

    if GOLDENS_DIR.exists():
        shutil.rmtree(GOLDENS_DIR)
    GOLDENS_DIR.mkdir(parents=True)

    model_dirs = {}
    for spec in MODEL_SPECS:
        pipe16 = build_pipeline(spec, tokenizer)
        model_dirs[spec.name] = save_pipeline(spec, pipe16)
        pipe32 = load_float32_pipeline(model_dirs[spec.name])
        check_weights_match(pipe32, pipe16)
        # The Qwen3 rope base survived the round trip through config.json (either spelling).
        te = pipe32.text_encoder
        hd = te.config.head_dim
        want_inv_freq = 1.0 / (1_000_000.0 ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        assert torch.allclose(te.model.rotary_emb.inv_freq, want_inv_freq, rtol=1e-6, atol=0)
        # The tokenizer as the Rust side will read it (from the saved folder).
        saved_tok = pipe32.tokenizer
        check_tokenizer(saved_tok)
        for case in [c for c in CASES if c.model is spec]:
            out = run_case(pipe32, case)
            d = write_case(case, out)
            st = out["stats"]
            print(
                f"{spec.name}/{case.name}: clamped={st['clamped_fraction']:.3f} mean={st['image_mean']:.3f} "
                f"std={st['image_std']:.3f} v0_std={st['velocity0_std']:.3f} emb_std={st['prompt_embeds_std']:.3f}"
                f" -> {d.relative_to(ROOT)}"
            )
            assert st["clamped_fraction"] <= CLAMP_LIMIT, st

    # Tokenizer cases, from the tokenizer as reloaded from a saved model folder.
    tok = Qwen2TokenizerFast.from_pretrained(model_dirs["tiny-a"] / "tokenizer")
    check_tokenizer(tok)
    cases = tokenizer_cases(tok)
    assert cases == tokenizer_cases(tokenizer)
    (GOLDENS_DIR / "tokenizer_cases.json").write_text(dump_tokenizer_cases(cases))
    print(f"tokenizer: {len(tok)} tokens, {len(cases)} cases")


if __name__ == "__main__":
    main()
