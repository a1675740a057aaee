"""The tiny models' tokenizer: a small byte-level BPE trained here, in the Qwen2/Qwen3
tokenizer.json format, with Qwen3's chat template, and the tokenizer cases the Rust side is
checked against."""

from __future__ import annotations

import json

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import Qwen2TokenizerFast

MAX_SEQ = 512  # the text encoder's padded prompt length

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


def dump_tokenizer_cases(cases: list[dict]) -> str:
    """JSON with one line per field, so that the 512-long id lists stay on one line each."""
    parts = []
    for c in cases:
        fields = ",\n".join(f"   {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in c.items())
        parts.append("  {\n" + fields + "\n  }")
    text = '{\n "max_length": %d,\n "cases": [\n%s\n ]\n}\n' % (MAX_SEQ, ",\n".join(parts))
    assert json.loads(text) == {"max_length": MAX_SEQ, "cases": cases}
    return text
