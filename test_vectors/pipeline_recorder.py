"""Hooks on a diffusers Flux2KleinPipeline that capture the intermediate tensors of one call:
the text encoder's inputs and hidden states, every transformer call and its blocks' tensors,
the scheduler's steps and the VAE decode."""

from __future__ import annotations

import torch


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
