"""The built-in model shapes: DeepSeek-V3-architecture ``config.json`` files with one MTP layer.

Each is run with vLLM's dummy weights, re-initialised so that attention matters
(:mod:`~draftmeta.integrations.vllm.tools.e2e.weights`);
:data:`~draftmeta.integrations.vllm.tools.e2e.models.
SHORTCUTS` names them for ``draftmeta e2e --models``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "LARGE_MODEL_CONFIG",
    "MODEL_CONFIG",
    "TRAINED",
    "V2_LITE_CONFIG",
    "V3_RANK_CONFIG",
    "write_model",
]

MODEL_CONFIG: Mapping[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": 128,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 64,
    "v_head_dim": 128,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rope_interleave": True,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}
"""``config.json`` of the tiny model: 2 layers (MLA attention, dense MLP), 1 MTP layer,
a 2048-token vocabulary."""


LARGE_MODEL_CONFIG: Mapping[str, Any] = {
    **MODEL_CONFIG,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 4,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
}
"""``config.json`` of a model with DeepSeek-V3's layer dimensions (hidden 7168, 128 heads,
``q_lora_rank`` 1536, ``kv_lora_rank`` 512, rope 64, nope 128, v 128), made small in depth: 3
layers and the MTP layer, all dense like DeepSeek-V3's first three (MLP 18432, no experts);
about 2.5 billion parameters. A draft step's share of the time is then closer to production's
than with the tiny model (weights, not launches, bound each forward pass)."""


V3_RANK_CONFIG: Mapping[str, Any] = {
    **MODEL_CONFIG,
    "vocab_size": 129280 // 8,
    "hidden_size": 7168,
    "intermediate_size": 18432 // 8,
    "moe_intermediate_size": 2048 // 8,
    "num_hidden_layers": 61,
    "first_k_dense_replace": 3,
    "num_attention_heads": 128 // 8,
    "num_key_value_heads": 128 // 8,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "n_group": 8,
    "topk_group": 4,
    "routed_scaling_factor": 2.5,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]},
}
"""``config.json`` of one rank of DeepSeek-V3 served with tensor parallelism 8, as one model on
one GPU: all 61 layers (the first 3 dense) and the MTP layer (a MoE layer, as DeepSeek-V3's
layer 61), hidden 7168, DeepSeek-V3's MLA (``q_lora_rank`` 1536, ``kv_lora_rank`` 512, rope 64,
nope 128, v 128), FP8 weights in 128 x 128 blocks as the released checkpoint has them, and each
rank's share of what TP8 splits: 16 of the 128 query heads (``q_b_proj``, ``kv_b_proj`` and
``o_proj`` sharded by head), 2304 of the dense MLPs' 18432 intermediate channels, 256 of each
expert's 2048 (all 256 routed experts, 8 active, and the shared expert, sharded by channel as
vLLM's fused MoE shards them under TP), and 16160 of the 129280 vocabulary rows in the
embedding and the head. What TP replicates stays whole: ``q_a_proj``, ``kv_a_proj_with_mqa``,
the norms and the router (256 experts in 8 groups, top 4 groups).

What a real TP8 rank does that this model does not: the collectives. Each layer's attention
output and MLP output are all-reduced across the 8 ranks (122 all-reduces per forward pass of
the target, 2 per MTP step) and the logits all-gathered; a rank also waits for the slowest of
the 8. Those add time to every step, so a real rank's step is longer than this model's, and the
share of it that draft metadata takes is smaller."""


V2_LITE_CONFIG: Mapping[str, Any] = {
    **MODEL_CONFIG,
    "vocab_size": 163840,
    "hidden_size": 2048,
    "intermediate_size": 11264,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "first_k_dense_replace": 1,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "n_shared_experts": 2,
    "routed_scaling_factor": 2.446,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "max_position_embeddings": 8192,
}
"""``config.json`` of a whole mid-size MLA mixture of experts on one GPU, in the shape of
Moonlight-16B-A3B (DeepSeek-V3's architecture at DeepSeek-V2-Lite's size): 27 layers (the
first dense), hidden 2048, 16 heads with MLA without a query LoRA (``kv_lora_rank`` 512, rope 64,
nope 128, v 128), 64 routed experts (6 active, 1408 channels each) and 2 shared, a 163840-token
vocabulary, bf16; plus one MTP layer of the same shape (Moonlight ships none). About 16 billion
parameters, 3 billion active per token."""


TRAINED = "trained"
"""The name of the trained model (:mod:`draftmeta.integrations.vllm.tools.e2e.trained`): vLLM loads
its
shipped checkpoint with its default loader, and its prompts are its task's; every other model of
the end-to-end runs is a ``config.json`` with vLLM's dummy weights (re-initialised)."""


def write_model(folder: Path, config: Mapping[str, Any] = MODEL_CONFIG) -> Path:
    """Write a model's ``config.json`` (the tiny model's by default) into ``folder`` (created)
    and return ``folder``.

    vLLM loads it with ``load_format="dummy"`` and ``skip_tokenizer_init=True``: no weights or
    tokenizer files are needed.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(config), indent=1) + "\n",
                                        encoding="utf-8")
    return folder
