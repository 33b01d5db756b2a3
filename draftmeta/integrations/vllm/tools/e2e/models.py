"""What an end-to-end run runs on: a model folder, its draft, its weights, and whether it fits.

A run's model is a :class:`ModelSource`: any local folder vLLM can load (``draftmeta e2e --model
PATH``) or one of the built-in shapes (:data:`SHORTCUTS`: ``tiny``, ``large``, ``v3-rank``,
``v2-lite``, written as a ``config.json`` and run with vLLM's dummy weights; ``trained``, the
shipped checkpoint). Both go through one path: :func:`resolve` reads the folder's
``config.json`` and refuses, before any engine starts, what cannot work:

* no draft: the config declares no MTP layer (``num_nextn_predict_layers``) and no separate
  draft folder (``--draft-model``) was given;
* not an MLA model: the config has no ``kv_lora_rank`` (draftmeta's plugin updates MLA attention
  metadata; another attention's draft loop is vLLM's own);
* no weights: the folder holds no ``*.safetensors`` / ``*.bin`` and ``--dummy-weights`` was not
  given;
* does not fit: :meth:`ModelSource.fit_problem` compares the weights (the files' sizes, or an
  estimate from the config for dummy weights: :func:`estimate_parameters`) with the GPUs' memory
  at the tensor-parallel size asked for, and the GPUs there are with the ranks asked for.

Nothing here imports vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from draftmeta.integrations.vllm.tools.e2e.errors import E2EUnavailable
from draftmeta.integrations.vllm.tools.e2e.shapes import (
    LARGE_MODEL_CONFIG,
    MODEL_CONFIG,
    TRAINED,
    V2_LITE_CONFIG,
    V3_RANK_CONFIG,
    write_model,
)

__all__ = [
    "ENGINE_HEADROOM_GIB",
    "SHORTCUTS",
    "Draft",
    "ModelProblem",
    "ModelSource",
    "Shortcut",
    "estimate_parameters",
    "resolve",
    "weight_bytes",
]

ENGINE_HEADROOM_GIB = 8.0
"""GPU memory an engine needs beside its weights (KV cache for the run's requests,
activations, the profiling pass, CUDA graphs), GiB."""


class ModelProblem(E2EUnavailable):
    """The model asked for cannot run here: no draft, not MLA, no weights, does not fit. The
    message is one line: what, where, and what to do."""


@attrs.frozen
class Draft:
    """How a model drafts.

    Attributes:
        method: vLLM's ``speculative_config["method"]`` (``"mtp"``, ``"eagle"``,
            ``"eagle3"``).
        folder: a separate draft model's folder; ``None`` for the target's own MTP layers.
        layers: the draft's layers (MTP layers, or the draft model's hidden layers).
    """

    method: str
    folder: Path | None = None
    layers: int = 1

    def describe(self) -> str:
        """``MTP, 1 layer in the model`` or ``eagle3 from /path (1 layer)``."""
        plural = "s" if self.layers != 1 else ""
        if self.folder is None:
            return f"{self.method.upper()}, {self.layers} layer{plural} in the model"
        return f"{self.method} from {self.folder} ({self.layers} layer{plural})"


@attrs.frozen
class Shortcut:
    """A built-in model shape: a name for a ``config.json`` run with dummy weights, or the
    trained checkpoint.

    Attributes:
        description: what it is, in a few words.
        config: its ``config.json``; ``None`` for the trained model (its folder holds its own).
        max_model_len: its engines' context limit.
    """

    description: str
    config: Mapping[str, Any] | None
    max_model_len: int = 1024


SHORTCUTS: Mapping[str, Shortcut] = {
    "tiny": Shortcut("2 layers, random weights", MODEL_CONFIG),
    "large": Shortcut("DeepSeek-V3's layer dimensions, 3 layers, random weights",
                      LARGE_MODEL_CONFIG),
    "v3-rank": Shortcut("one rank of DeepSeek-V3 under TP8 (61 layers, FP8), random weights",
                        V3_RANK_CONFIG),
    "v2-lite": Shortcut("a Moonlight-shaped MLA MoE (27 layers) with an MTP layer, random "
                        "weights", V2_LITE_CONFIG),
    TRAINED: Shortcut("a small trained DeepSeek-V3 with its MTP layer (its checkpoint)", None,
                      max_model_len=128),
}
"""The built-in shapes by name (``--models NAME``): each is a folder like a user's model, made
for the run (``tiny``, ``large``, ``v3-rank``, ``v2-lite``: a ``config.json``, vLLM's dummy
weights re-initialised) or shipped (``trained``)."""


def _int(config: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = config.get(key)
    return default if value is None else int(value)


def estimate_parameters(config: Mapping[str, Any]) -> int:
    """The parameters of a DeepSeek-V2/V3-style MLA model (DeepSeek, Kimi-K2, Moonlight,
    GLM-4.7-Flash, ...) from its ``config.json``: embedding and head, each layer's MLA
    projections and its dense MLP or mixture of experts (the first ``first_k_dense_replace``
    layers dense), and each MTP layer (a layer of the last kind, its two norms' projection
    ``eh_proj`` and its own head). Norms and routers' biases are left out (well under 1%)."""
    hidden = _int(config, "hidden_size")
    vocab = _int(config, "vocab_size")
    heads = _int(config, "num_attention_heads")
    rope, nope = _int(config, "qk_rope_head_dim"), _int(config, "qk_nope_head_dim")
    value, latent = _int(config, "v_head_dim"), _int(config, "kv_lora_rank")
    q_rank = _int(config, "q_lora_rank")
    query = (hidden * q_rank + q_rank * heads * (nope + rope) if q_rank
             else hidden * heads * (nope + rope))
    attention = (query + hidden * (latent + rope) + latent * heads * (nope + value)
                 + heads * value * hidden)
    dense = attention + 3 * hidden * _int(config, "intermediate_size")
    experts = _int(config, "n_routed_experts") + _int(config, "n_shared_experts")
    moe = (attention + 3 * hidden * _int(config, "moe_intermediate_size") * experts
           + hidden * _int(config, "n_routed_experts"))
    layers = _int(config, "num_hidden_layers")
    routed = _int(config, "n_routed_experts")
    first_dense = min(layers, _int(config, "first_k_dense_replace")) if routed else layers
    body = first_dense * dense + (layers - first_dense) * moe
    ends = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    # an MTP layer sits at index num_hidden_layers: a MoE layer unless every layer is dense
    mtp_layer = moe if routed and _int(config, "first_k_dense_replace") <= layers else dense
    mtp = _int(config, "num_nextn_predict_layers") * (mtp_layer + 2 * hidden * hidden
                                                     + vocab * hidden)
    return body + ends + mtp


def weight_bytes(config: Mapping[str, Any], folder: Path | None, dummy: bool) -> int:
    """The bytes the weights take on the device: the folder's weight files where vLLM loads
    them (real weights), else :func:`estimate_parameters` at one byte per parameter for an FP8
    checkpoint (``quantization_config``) and two otherwise (bf16)."""
    if folder is not None and not dummy:
        files = _weight_files(folder)
        if files:
            return sum(f.stat().st_size for f in files)
    quantized = (config.get("quantization_config") or {}).get("quant_method") == "fp8"
    return estimate_parameters(config) * (1 if quantized else 2)


def _weight_files(folder: Path) -> list[Path]:
    return sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")])


@attrs.frozen
class ModelSource:
    """A model an end-to-end run can load, checked.

    Attributes:
        name: its name in tables and results (a shortcut's name, or the folder's name).
        config: its ``config.json``.
        folder: the folder vLLM loads; ``None`` for a shortcut written at run time
            (:meth:`folder_in`).
        dummy_weights: vLLM's dummy loader (weights re-initialised by
            :func:`~draftmeta.integrations.vllm.tools.e2e.weights.reinitialized_weights`) instead
            of the
            folder's weights.
        draft: how it drafts.
        max_model_len: the engines' context limit.
        shortcut: the built-in shape's name, if it is one.
    """

    name: str
    config: Mapping[str, Any]
    folder: Path | None
    dummy_weights: bool
    draft: Draft
    max_model_len: int
    shortcut: str | None = None

    @property
    def load_format(self) -> str:
        """vLLM's ``load_format``: ``"dummy"`` or ``"auto"`` (the folder's weights, vLLM's
        default loader)."""
        return "dummy" if self.dummy_weights else "auto"

    @property
    def vocab_size(self) -> int:
        """The vocabulary size."""
        return _int(self.config, "vocab_size")

    @property
    def weights_gib(self) -> float:
        """The weights on the device, GiB (:func:`weight_bytes`)."""
        return weight_bytes(self.config, self.folder, self.dummy_weights) / 2**30

    def folder_in(self, workdir: Path) -> Path:
        """The folder vLLM loads: its own, or a shortcut's ``config.json`` written under
        ``workdir``."""
        if self.folder is not None:
            return self.folder
        return write_model(workdir / self.name, self.config)

    def describe(self) -> str:
        """One line: what the model is, its weights and its draft."""
        where = (f"built-in '{self.shortcut}' ({SHORTCUTS[self.shortcut].description})"
                 if self.shortcut else str(self.folder))
        weights = "dummy weights (re-initialised)" if self.dummy_weights else "its weights"
        size = (f"{self.weights_gib:.1f} GiB" if self.weights_gib >= 0.1
                else f"{self.weights_gib * 1024:.1f} MiB")
        return (f"{where}: {self.config.get('model_type', '?')}, {weights}, about {size}, "
                f"draft {self.draft.describe()}")

    def fit_problem(self, *, gpus: int, gpu_gib: float, tensor_parallel_size: int = 1,
                    engines: int = 1) -> str | None:
        """Why this model cannot run on ``gpus`` GPUs of ``gpu_gib`` each with
        ``tensor_parallel_size`` ranks (``engines`` engines alive at once), or ``None``."""
        if tensor_parallel_size > gpus:
            return (f"--tensor-parallel-size {tensor_parallel_size} needs "
                    f"{tensor_parallel_size} GPUs; this machine has {gpus}")
        need = self.weights_gib / tensor_parallel_size + ENGINE_HEADROOM_GIB
        if engines * need > 0.92 * gpu_gib:
            per = f" ({tensor_parallel_size} ranks)" if tensor_parallel_size > 1 else ""
            return (f"{self.name} needs about {need:.0f} GiB per GPU{per}: "
                    f"{self.weights_gib:.1f} GiB of weights"
                    + (f" / {tensor_parallel_size}" if tensor_parallel_size > 1 else "")
                    + f" + {ENGINE_HEADROOM_GIB:.0f} GiB for the engine; this GPU has "
                    f"{gpu_gib:.0f} GiB: raise --tensor-parallel-size or use a larger GPU")
        return None

    def placement(self, gpu_gib: float, tensor_parallel_size: int = 1) -> tuple[bool, float]:
        """How an engine pair shares the GPUs: whether both engines fit at once (their
        generates then alternate; else each is created, measured and freed before the other),
        and the share of GPU memory each may take.

        Raises:
            ModelProblem: one engine does not fit.
        """
        problem = self.fit_problem(gpus=tensor_parallel_size, gpu_gib=gpu_gib,
                                   tensor_parallel_size=tensor_parallel_size)
        if problem is not None:
            raise ModelProblem(problem)
        need = self.weights_gib / tensor_parallel_size + ENGINE_HEADROOM_GIB
        if 2 * need <= 0.9 * gpu_gib:
            return True, round(max(0.2, need / gpu_gib), 3)
        return False, 0.92


def _read_config(folder: Path, what: str) -> dict[str, Any]:
    path = folder / "config.json"
    if not folder.is_dir():
        raise ModelProblem(f"{what} {folder}: no such folder")
    if not path.is_file():
        raise ModelProblem(f"{what} {folder}: no config.json there (a model folder as vLLM "
                           "loads it has its config.json, weights and tokenizer files)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelProblem(f"{what} {path}: cannot read it as JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ModelProblem(f"{what} {path}: not a JSON object")
    return config


_MLA_HINT = ("draftmeta's plugin updates MLA attention metadata (DeepSeek-V2/V3, Kimi-K2, "
             "Moonlight, GLM-4.7-Flash, ...)")


def _draft_of(config: Mapping[str, Any], folder: Path, draft_folder: Path | None) -> Draft:
    if draft_folder is not None:
        draft = _read_config(draft_folder, "--draft-model")
        if "kv_lora_rank" not in draft:
            raise ModelProblem(
                f"--draft-model {draft_folder}: its attention is not MLA (no kv_lora_rank in "
                f"its config.json): {_MLA_HINT}, so it would have nothing to update in this "
                "draft loop")
        names = " ".join(draft.get("architectures") or []) + " " + str(draft.get("model_type"))
        lowered = names.lower()
        method = ("eagle3" if "eagle3" in lowered else "eagle" if "eagle" in lowered
                  else "mtp" if "mtp" in lowered or "nextn" in lowered else None)
        if method is None:
            raise ModelProblem(
                f"--draft-model {draft_folder}: cannot tell its draft method from its "
                f"architectures ({names.strip()}): it must be an EAGLE, EAGLE-3 or MTP model")
        layers = _int(draft, "num_nextn_predict_layers") or _int(draft, "num_hidden_layers", 1)
        return Draft(method, draft_folder, layers)
    layers = _int(config, "num_nextn_predict_layers")
    if layers < 1:
        raise ModelProblem(
            f"--model {folder}: no draft: its config.json declares no MTP layer "
            "(num_nextn_predict_layers) and no --draft-model was given (an EAGLE or MTP "
            "model's folder)")
    return Draft("mtp", None, layers)


def resolve(model: str, *, draft_model: Path | None = None, dummy_weights: bool | None = None,
            max_model_len: int | None = None) -> ModelSource:
    """The model ``model`` names, checked: a shortcut of :data:`SHORTCUTS`, else a folder.

    Args:
        model: a shortcut's name or a model folder's path.
        draft_model: a separate draft model's folder (EAGLE, EAGLE-3 or MTP).
        dummy_weights: vLLM's dummy loader instead of the folder's weights (default: the
            shortcut's own choice, or ``False`` for a folder).
        max_model_len: the engines' context limit (default: the shortcut's, or the smaller of
            the config's ``max_position_embeddings`` and 4096 for a folder).

    Raises:
        ModelProblem: the model cannot run (module docs).
    """
    if model in SHORTCUTS and not Path(model).exists():
        shortcut = SHORTCUTS[model]
        if shortcut.config is None:
            from draftmeta.integrations.vllm.tools.e2e.trained import CHECKPOINT

            if not (CHECKPOINT / "config.json").is_file():
                raise ModelProblem(
                    "--models trained: its checkpoint ships with draftmeta's source, not its "
                    "wheel: run from a checkout (pip install -e . in a clone), or give a model "
                    "folder with --model PATH")
            config = _read_config(CHECKPOINT, "the trained model's checkpoint")
            folder: Path | None = CHECKPOINT
            dummy = bool(dummy_weights)
        else:
            config, folder, dummy = dict(shortcut.config), None, True
            if dummy_weights is False:
                raise ModelProblem(f"--models {model} has no weights to load: it is a "
                                   "config.json run with dummy weights")
        draft = _draft_of(config, Path(model), draft_model)
        return ModelSource(model, config, folder, dummy, draft,
                           max_model_len or shortcut.max_model_len, shortcut=model)
    folder = Path(model).expanduser().resolve()
    config = _read_config(folder, "--model")
    if "kv_lora_rank" not in config:
        raise ModelProblem(
            f"--model {folder}: not an MLA model (its config.json, model_type "
            f"{config.get('model_type', '?')!r}, has no kv_lora_rank): {_MLA_HINT}; another "
            "attention's draft loop is left to vLLM")
    draft = _draft_of(config, folder, draft_model)
    dummy = bool(dummy_weights)
    if not dummy and not _weight_files(folder):
        raise ModelProblem(
            f"--model {folder}: no weights there (no *.safetensors or *.bin); pass "
            "--dummy-weights to run its config.json with random weights")
    limit = max_model_len or min(_int(config, "max_position_embeddings", 4096), 4096)
    return ModelSource(folder.name, config, folder, dummy, draft, limit)
