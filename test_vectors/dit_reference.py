"""Checks of the DiT tensors one transformer call recorded: that they chain exactly, and that an
independent re-implementation of each stage, fed the captured inputs, matches diffusers."""

from __future__ import annotations

import math

import torch

from tiny_tokenizer import MAX_SEQ


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
