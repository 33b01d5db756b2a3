"""Plain-torch DeepSeek-V3 with its MTP layer, computing what vLLM computes (no vLLM import).

The model (:class:`Reference`) has the module tree of a DeepSeek-V3 checkpoint, so that its
``state_dict`` names are the checkpoint's (``model.layers.{i}.self_attn.q_a_proj.weight``, ...,
the MTP layer at ``model.layers.{num_hidden_layers}``); :func:`checkpoint_tensors` adds the MTP
layer's own copies of the embedding and the LM head that DeepSeek-V3 checkpoints carry.

What vLLM does, and this module does the same (vLLM 0.32's ``deepseek_v2.py`` /
``deepseek_mtp.py`` / ``llm_base_proposer.py``, identical in these respects in 0.33 and in
0.34, whose ``TargetDependentARSpeculator`` replaced the older proposer):

* attention is MLA with ``q_lora_rank``: ``q = q_b(rms(q_a(x)))``, ``[kv_c, k_pe] =
  kv_a_with_mqa(x)``, ``kv_c`` RMS-normed, ``k = [kv_b(kv_c)_nope, k_pe]``, ``v = kv_b(kv_c)_v``,
  softmax scale ``(qk_nope + qk_rope) ** -0.5``. The KV cache holds ``[rms(kv_c), rope(k_pe)]``
  (576 values per token): the key's position is baked in when it is written.
* RoPE is GPT-J style (``is_neox_style=False``: pairs of *adjacent* channels rotate), which
  vLLM uses for every DeepSeek MLA layer whatever ``rope_interleave`` says; with
  ``rope_interleave`` Hugging Face's implementation permutes channels before a neox rotation,
  which gives the same attention scores.
* the target model returns the hidden state *after* its final norm; the MTP layer's first draft
  step gets that normed hidden (then applies ``hnorm`` to it);
* the MTP layer embeds its input token (zeroed where the position is 0), computes
  ``eh_proj([enorm(embed), hnorm(hidden)])``, runs one decoder block, and returns the block's
  output *before* and *after* ``shared_head.norm``; the logits are ``lm_head(shared_head.norm(
  pre))`` and the hidden state recycled into the next draft step (``K > 1`` with one MTP layer)
  is the *post*-norm one (``model_returns_tuple()`` is true for ``DeepSeekMTPModel`` in 0.32 and
  0.33; 0.34 unpacks any tuple the same way);
* the MTP layer uses the target's embedding and LM head (vLLM's proposer shares them and drops
  the MTP layer's own copies), so the checkpoint's copies must equal the target's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ModelConfig",
    "Reference",
    "checkpoint_tensors",
    "load_reference",
    "new_model",
]

@attrs.frozen
class ModelConfig:
    """The shape of the model (the fields of its ``config.json`` that matter here).

    Attributes:
        vocab_size: vocabulary size.
        hidden_size: residual width.
        intermediate_size: dense MLP width.
        num_hidden_layers: target layers (the MTP layer comes after them).
        num_attention_heads: attention heads.
        q_lora_rank: rank of the query's low-rank projection.
        kv_lora_rank: width of the compressed KV (the latent cached per token).
        qk_nope_head_dim: per-head query/key width without RoPE.
        qk_rope_head_dim: query/key width with RoPE (one shared key part).
        v_head_dim: per-head value width.
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: RoPE base.
        max_position_embeddings: positions the config declares.
    """

    vocab_size: int = 18
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    q_lora_rank: int = 128
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096

    def hf_config(self, torch_dtype: str = "bfloat16") -> dict[str, Any]:
        """The Hugging Face DeepSeek-V3 ``config.json`` for this shape: the tiny model's
        (:data:`~draftmeta.integrations.vllm.tools.e2e.shapes.MODEL_CONFIG`, one MTP layer) with
        this shape's sizes, every layer dense (no routed expert is used)."""
        from draftmeta.integrations.vllm.tools.e2e.shapes import MODEL_CONFIG

        return {
            **MODEL_CONFIG,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            # every layer, the MTP layer at index num_hidden_layers included, is dense
            "first_k_dense_replace": self.num_hidden_layers + 1,
            "kv_lora_rank": self.kv_lora_rank,
            "q_lora_rank": self.q_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "v_head_dim": self.v_head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "torch_dtype": torch_dtype,
        }

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> ModelConfig:
        """The shape read from a ``config.json`` mapping.

        Raises:
            ValueError: the config is not a dense DeepSeek-V3 with one MTP layer.
        """
        if config.get("num_nextn_predict_layers") != 1:
            raise ValueError("the reference handles exactly one MTP layer")
        if config.get("first_k_dense_replace", 0) <= config["num_hidden_layers"]:
            raise ValueError("the reference handles dense layers only (MTP layer included)")
        names = [f.name for f in attrs.fields(cls)]
        return cls(**{name: config[name] for name in names if name in config})


class RMSNorm(nn.Module):
    """RMSNorm as vLLM computes it (in float32, then scaled by the weight)."""

    def __init__(self, width: int, eps: float) -> None:
        """A norm over ``width`` channels with weight 1."""
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` normalised over its last dimension."""
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return x32.to(x.dtype) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float, heads: bool) -> torch.Tensor:
    """GPT-J style RoPE (vLLM's ``is_neox_style=False``) of ``x`` (``[..., T, D]``, or
    ``[..., T, heads, D]`` if ``heads``) at ``positions`` (``[..., T]``, broadcast)."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv_freq
    cos, sin = freqs.cos(), freqs.sin()
    if heads:
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.flatten(-2).to(x.dtype)


class MLA(nn.Module):
    """Multi-head latent attention with a low-rank query (DeepSeek-V3's ``self_attn``)."""

    def __init__(self, c: ModelConfig) -> None:
        """Projections for shape ``c``."""
        super().__init__()
        self.c = c
        heads, qk = c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim
        self.q_a_proj = nn.Linear(c.hidden_size, c.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.rms_norm_eps)
        self.q_b_proj = nn.Linear(c.q_lora_rank, heads * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(
            c.hidden_size, c.kv_lora_rank + c.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
        self.kv_b_proj = nn.Linear(
            c.kv_lora_rank, heads * (c.qk_nope_head_dim + c.v_head_dim), bias=False)
        self.o_proj = nn.Linear(heads * c.v_head_dim, c.hidden_size, bias=False)
        self.scale = qk ** -0.5

    def project(self, x: torch.Tensor, positions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries ``[..., heads, qk]`` (RoPE applied) and cache entries ``[..., kv_lora +
        rope]`` (normed latent, key RoPE part at ``positions``) of ``x`` ``[..., hidden]``."""
        c = self.c
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.unflatten(-1, (c.num_attention_heads, -1))
        q_nope, q_pe = torch.split(q, [c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        q = torch.cat([q_nope, rope(q_pe, positions, c.rope_theta, True)], dim=-1)
        kv_c, k_pe = self.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, c.qk_rope_head_dim], -1)
        entry = torch.cat(
            [self.kv_a_layernorm(kv_c), rope(k_pe, positions, c.rope_theta, False)], -1)
        return q, entry

    def _keys_values(self, entries: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.c
        kv_c, k_pe = torch.split(entries, [c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(kv_c).unflatten(-1, (c.num_attention_heads, -1))
        k_nope, v = torch.split(kv, [c.qk_nope_head_dim, c.v_head_dim], dim=-1)
        return k_nope, k_pe, v

    def attend(self, q: torch.Tensor, entries: torch.Tensor, visible: torch.Tensor,
               private: torch.Tensor | None = None) -> torch.Tensor:
        """Attention output (after ``o_proj``) of queries ``q`` ``[B, T, heads, qk]`` over
        cache ``entries`` ``[B, S, 576]`` where ``visible`` ``[B or 1, T, S]`` is true, plus
        each query's own always-visible ``private`` entries ``[B, T, m, 576]`` if given."""
        c = self.c
        q_nope, q_pe = torch.split(q, [c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        k_nope, k_pe, v = self._keys_values(entries)
        scores = (torch.einsum("bthd,bshd->bhts", q_nope, k_nope)
                  + torch.einsum("bthd,bsd->bhts", q_pe, k_pe)) * self.scale
        scores = scores.masked_fill(~visible.unsqueeze(1), float("-inf"))
        if private is None:
            probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            out = torch.einsum("bhts,bshd->bthd", probs, v)
        else:
            pk_nope, pk_pe, pv = self._keys_values(private)
            extra = (torch.einsum("bthd,btmhd->bhtm", q_nope, pk_nope)
                     + torch.einsum("bthd,btmd->bhtm", q_pe, pk_pe)) * self.scale
            probs = torch.softmax(torch.cat([scores, extra], -1).float(), dim=-1).to(q.dtype)
            shared, own = torch.split(probs, [scores.shape[-1], extra.shape[-1]], dim=-1)
            out = (torch.einsum("bhts,bshd->bthd", shared, v)
                   + torch.einsum("bhtm,btmhd->bthd", own, pv))
        result: torch.Tensor = self.o_proj(out.flatten(-2))
        return result


class MLP(nn.Module):
    """Dense SiLU-gated MLP."""

    def __init__(self, c: ModelConfig) -> None:
        """Projections for shape ``c``."""
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``down(silu(gate(x)) * up(x))``."""
        result: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return result


class DecoderLayer(nn.Module):
    """A pre-norm decoder block: MLA attention then a dense MLP, each with a residual."""

    def __init__(self, c: ModelConfig) -> None:
        """A block of shape ``c``."""
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = MLA(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def block(self, x: torch.Tensor, positions: torch.Tensor, entries: torch.Tensor | None,
              visible: torch.Tensor, private: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's output for ``x`` ``[B, T, hidden]`` and its own cache entries.

        ``entries`` None: attend over the block's own entries (``visible`` ``[B or 1, T, T]``);
        else over ``entries`` (the caller wrote the new ones in), plus ``private``.
        """
        q, own = self.self_attn.project(self.input_layernorm(x), positions)
        keys = own if entries is None else entries
        h = x + self.self_attn.attend(q, keys, visible, private)
        return h + self.mlp(self.post_attention_layernorm(h)), own


class MTPLayer(DecoderLayer):
    """DeepSeek-V3's MTP layer: ``enorm``/``hnorm``/``eh_proj`` in front of a decoder block and
    ``shared_head.norm`` after it (embedding and LM head are the target's)."""

    def __init__(self, c: ModelConfig) -> None:
        """An MTP layer of shape ``c``."""
        super().__init__(c)
        self.enorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hnorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def fuse(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
             ) -> torch.Tensor:
        """The block's input: ``eh_proj([enorm(embeds), hnorm(hidden)])`` with the embedding
        zeroed where the position is 0 (as vLLM masks it)."""
        embeds = torch.where((positions == 0).unsqueeze(-1), torch.zeros_like(embeds), embeds)
        result: torch.Tensor = self.eh_proj(
            torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        return result

    def head_norm(self, x: torch.Tensor) -> torch.Tensor:
        """``shared_head.norm``: the hidden state the logits come from and, in every
        supported vLLM, the one recycled into the next draft step."""
        norm: RMSNorm = self.shared_head.norm  # type: ignore[assignment]
        result: torch.Tensor = norm(x)
        return result


class _Trunk(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(
            [DecoderLayer(c) for _ in range(c.num_hidden_layers)] + [MTPLayer(c)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


@attrs.frozen
class MTPOutput:
    """One MTP layer pass.

    Attributes:
        pre_norm: the block's output before ``shared_head.norm``.
        post_norm: after it (what the logits come from and what vLLM recycles).
        logits: ``lm_head(post_norm)``.
        entries: the MTP layer's cache entries for the new tokens.
    """

    pre_norm: torch.Tensor
    post_norm: torch.Tensor
    logits: torch.Tensor
    entries: torch.Tensor


class Reference(nn.Module):
    """DeepSeek-V3 (dense layers, MLA) with one MTP layer; ``state_dict`` names are the
    checkpoint's."""

    def __init__(self, c: ModelConfig) -> None:
        """A model of shape ``c`` with PyTorch's default initialisation."""
        super().__init__()
        self.config = c
        self.model = _Trunk(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    @property
    def target_layers(self) -> list[DecoderLayer]:
        """The target's decoder layers."""
        return [m for m in self.model.layers[: self.config.num_hidden_layers]]  # type: ignore[misc]

    @property
    def mtp(self) -> MTPLayer:
        """The MTP layer."""
        layer = self.model.layers[self.config.num_hidden_layers]
        assert isinstance(layer, MTPLayer)
        return layer

    # ---- whole sequences (training, and the prompt-logits check) -------------------------

    def target(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The target over whole sequences ``[B, T]`` (positions ``0 .. T-1``): its hidden
        states after the final norm and its logits."""
        t = tokens.shape[1]
        positions = torch.arange(t)
        causal = torch.ones(t, t, dtype=torch.bool).tril().unsqueeze(0)
        x = self.model.embed_tokens(tokens)
        for layer in self.target_layers:
            x, _ = layer.block(x, positions, None, causal)
        hidden = self.model.norm(x)
        return hidden, self.lm_head(hidden)

    def mtp_chain(self, tokens: torch.Tensor, target_hidden: torch.Tensor, steps: int,
                  hidden_noise: float = 0.0, generator: torch.Generator | None = None,
                  token_noise: float = 0.0, chain_hidden_noise: float | None = None
                  ) -> list[torch.Tensor]:
        """The MTP layer drafting ``steps`` tokens after every position, as vLLM chains it.

        Step 0 runs at every position ``i`` (token ``tokens[:, i + 1]``, the target's hidden at
        ``i``); step ``j`` runs for origin ``i`` at position ``i + j`` on token
        ``tokens[:, i + j + 1]`` (teacher forcing: drafts count only when right) and the
        post-norm hidden of step ``j - 1``, attending over step 0's entries at positions
        ``<= i`` and its own chain's entries at ``i + 1 .. i + j``. Returns per step the logits
        ``[B, T - 1 - j, vocab]``; row ``i`` predicts ``tokens[:, i + j + 2]``.

        ``hidden_noise``: probability, per row and step, that the hidden input is replaced by
        another row's (training only: teaches the layer to take recent tokens from its cache).
        ``chain_hidden_noise``: the same for the chained steps (``j >= 1``, the recycled hidden),
        if not ``hidden_noise``.
        ``token_noise``: probability, per row and step, that the *residual* stream gets another
        row's input token while attention (query and the new key) still sees the right one
        (training only: teaches the layer to read its own token from its own key, so that a
        step which cannot see its own key fails; in vLLM both always see the same token).
        """
        mtp = self.mtp
        n0 = tokens.shape[1] - 1
        pos0 = torch.arange(n0)
        hidden = target_hidden[:, :n0]
        chain: list[torch.Tensor] = []
        shared: torch.Tensor | None = None
        out: list[torch.Tensor] = []
        for j in range(steps):
            n = n0 - j
            positions = pos0[:n] + j
            noise = hidden_noise if j == 0 or chain_hidden_noise is None else chain_hidden_noise
            if noise > 0:
                hidden = _shuffle_rows(hidden[:, :n], noise, generator)
            embeds = self.model.embed_tokens(tokens[:, j + 1: j + 1 + n])
            x = mtp.fuse(embeds, hidden[:, :n], positions)
            q, own = mtp.self_attn.project(mtp.input_layernorm(x), positions)
            if token_noise > 0:
                x = mtp.fuse(_shuffle_rows(embeds, token_noise, generator), hidden[:, :n],
                             positions)
            if j == 0:
                shared = own
                visible = torch.ones(n, n, dtype=torch.bool).tril().unsqueeze(0)
                private = None
            else:
                assert shared is not None
                visible = (torch.arange(n0).unsqueeze(0) <= pos0[:n].unsqueeze(1)).unsqueeze(0)
                private = torch.stack([e[:, :n] for e in chain] + [own], dim=2)
            keys = shared if shared is not None else own
            h = x + mtp.self_attn.attend(q, keys, visible, private)
            y = h + mtp.mlp(mtp.post_attention_layernorm(h))
            hidden = mtp.head_norm(y)
            out.append(self.lm_head(hidden))
            if j > 0:
                chain.append(own)
        return out

    # ---- one request with a KV cache (the draft loop) ------------------------------------

    def target_step(self, cache: torch.Tensor, tokens: torch.Tensor, start: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The target on ``tokens`` ``[m]`` at positions ``start ..``, writing its cache
        ``[layers, slots, 576]``; returns normed hidden ``[m, hidden]`` and logits."""
        m = tokens.shape[0]
        positions = torch.arange(start, start + m)
        slots = torch.arange(cache.shape[1])
        visible = (slots.unsqueeze(0) <= positions.unsqueeze(1)).unsqueeze(0)
        x = self.model.embed_tokens(tokens).unsqueeze(0)
        for index, layer in enumerate(self.target_layers):
            q, own = layer.self_attn.project(layer.input_layernorm(x), positions)
            cache[index, positions] = own[0]
            h = x + layer.self_attn.attend(q, cache[index].unsqueeze(0), visible)
            x = h + layer.mlp(layer.post_attention_layernorm(h))
        hidden = self.model.norm(x)[0]
        return hidden, self.lm_head(hidden)

    def mtp_step(self, cache: torch.Tensor, tokens: torch.Tensor, hidden: torch.Tensor,
                 positions: torch.Tensor, slots: torch.Tensor, visible_lengths: torch.Tensor
                 ) -> MTPOutput:
        """The MTP layer on ``tokens`` ``[m]`` with input hidden ``[m, hidden]``: RoPE (and the
        position-0 mask) at ``positions``, new entries written to cache ``[slots, 576]`` at
        ``slots``, query ``i`` attending over cache slots ``[0, visible_lengths[i])``."""
        mtp = self.mtp
        x = mtp.fuse(self.model.embed_tokens(tokens), hidden, positions).unsqueeze(0)
        q, own = mtp.self_attn.project(mtp.input_layernorm(x), positions)
        cache[slots] = own[0]
        visible = (torch.arange(cache.shape[0]).unsqueeze(0)
                   < visible_lengths.unsqueeze(1)).unsqueeze(0)
        h = x + mtp.self_attn.attend(q, cache.unsqueeze(0), visible)
        y = (h + mtp.mlp(mtp.post_attention_layernorm(h)))[0]
        post = mtp.head_norm(y)
        return MTPOutput(y, post, self.lm_head(post), own[0])


def _shuffle_rows(hidden: torch.Tensor, p: float, generator: torch.Generator | None
                  ) -> torch.Tensor:
    b, n, _ = hidden.shape
    flat = hidden.reshape(b * n, -1)
    replace = torch.rand(b * n, generator=generator) < p
    source = torch.randint(0, b * n, (b * n,), generator=generator)
    # no gradient through the borrowed rows: the backward of a gather with repeated indices
    # accumulates in a thread-dependent order on CPU, which made training non-deterministic
    borrowed = flat[source].detach()
    return torch.where(replace.unsqueeze(-1), borrowed, flat).reshape(hidden.shape)


# ---- checkpoint -----------------------------------------------------------------------------

def checkpoint_tensors(model: Reference, dtype: torch.dtype = torch.bfloat16
                       ) -> dict[str, torch.Tensor]:
    """The model's tensors under DeepSeek-V3 checkpoint names, in ``dtype``: its
    ``state_dict`` plus the MTP layer's copies of the embedding
    (``model.layers.{n}.embed_tokens.weight``) and LM head
    (``model.layers.{n}.shared_head.head.weight``)."""
    n = model.config.num_hidden_layers
    tensors = {name: t.detach().to(dtype).contiguous() for name, t in model.state_dict().items()}
    tensors[f"model.layers.{n}.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors[f"model.layers.{n}.shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    return tensors


def load_reference(folder: Path, dtype: torch.dtype = torch.float32) -> Reference:
    """The model in ``folder`` (``config.json``, ``model.safetensors``), computing in ``dtype``.

    Raises:
        ValueError: a tensor is missing or unexpected, or the MTP layer's embedding or head
            copy differs from the target's (vLLM would use the target's).
    """
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    model = Reference(ModelConfig.from_hf(config))
    tensors = load_file(str(folder / "model.safetensors"))
    n = model.config.num_hidden_layers
    for copy, original in ((f"model.layers.{n}.embed_tokens.weight", "model.embed_tokens.weight"),
                           (f"model.layers.{n}.shared_head.head.weight", "lm_head.weight")):
        if copy not in tensors or not torch.equal(tensors.pop(copy), tensors[original]):
            raise ValueError(f"{copy} is missing or differs from {original}")
    missing, unexpected = model.load_state_dict(
        {k: v.to(dtype) for k, v in tensors.items()}, strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint mismatch: missing {missing}, unexpected {unexpected}")
    return model.to(dtype).eval()


def _init_weights(model: Reference, generator: torch.Generator) -> None:
    """Norms 1, matrices N(0, 1/fan_in) (residual outputs scaled down by the depth)."""
    depth = 2 * (model.config.num_hidden_layers + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.fill_(1.0)
                continue
            std = param.shape[-1] ** -0.5
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                std /= math.sqrt(depth)
            if name.endswith("embed_tokens.weight"):
                std = 1.0
            param.copy_(torch.randn(param.shape, generator=generator) * std)


def new_model(config: ModelConfig, seed: int) -> Reference:
    """A freshly initialised model (deterministic in ``seed``)."""
    model = Reference(config)
    _init_weights(model, torch.Generator().manual_seed(seed))
    return model
