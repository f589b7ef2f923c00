"""Qwen2-MoE (``model_type: qwen2_moe``, Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (biases on the query,
key and value projections only) with a sparse mixture of experts as every layer's feed-forward: ``num_experts``
SwiGLU experts of ``moe_intermediate_size``, each token routed to ``num_experts_per_tok`` of them (the softmax
probabilities as they are unless ``norm_topk_prob``), plus a shared expert of ``shared_expert_intermediate_size``
that every token goes through, scaled by a sigmoid gate (``shared_expert_gate``, a linear map to one logit).
``intermediate_size`` (the width of the dense layers Qwen2-MoE can interleave) is kept as ``d_ff`` and written back.

Files hold ``mlp.gate`` (the router), ``mlp.experts.{e}.gate_proj`` / ``up_proj`` / ``down_proj``,
``mlp.shared_expert.*`` and ``mlp.shared_expert_gate``; transformers 5's fused layout
(``save_original_format=False``) is read too (interop/mixtral.py). Refused: dense layers among the sparse ones
(``decoder_sparse_step`` != 1, a non-empty ``mlp_only_layers``), ``qkv_bias=false``, and a sliding window
(``use_sliding_window``, on some layers only, as Qwen2's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor

from tformer.checkpoint import CheckpointError
from tformer.config import ModelConfig
from tformer.interop.mixtral import expert_modules, per_expert_state, without_experts
from tformer.interop.qwen2 import Qwen2Family
from tformer.interop.weight_map import ModuleMap

SHARED = "model.layers.{i}.mlp.shared_expert"


class Qwen2MoeFamily(Qwen2Family):
    model_type = "qwen2_moe"
    architecture_class = "Qwen2MoeForCausalLM"
    modules = {
        **{name: spec for name, spec in Qwen2Family.modules.items() if ".feedforward." not in name},
        "stack.blocks.{i}.feedforward.shared_expert.in_proj": ModuleMap(
            (f"{SHARED}.gate_proj", f"{SHARED}.up_proj"), fused="gate_up"),
        "stack.blocks.{i}.feedforward.shared_expert.out_proj": ModuleMap((f"{SHARED}.down_proj",)),
        "stack.blocks.{i}.feedforward.shared_expert_gate": ModuleMap(("model.layers.{i}.mlp.shared_expert_gate",)),
    }
    hf_keys = {**Qwen2Family.hf_keys, "d_model": ("hidden_size", 2048), "d_ff": ("intermediate_size", 5632),
               "num_layers": ("num_hidden_layers", 24), "num_heads": ("num_attention_heads", 16),
               "num_kv_heads": ("num_key_value_heads", 16),
               "num_experts": ("num_experts", 60), "num_experts_per_token": ("num_experts_per_tok", 4),
               "moe_d_ff": ("moe_intermediate_size", 1408), "norm_topk_prob": ("norm_topk_prob", False),
               "shared_expert_d_ff": ("shared_expert_intermediate_size", 5632),
               "router_aux_loss_coef": ("router_aux_loss_coef", 0.001)}
    layout = {**Qwen2Family.layout, "shared_expert_gate": True}
    pinned = {**Qwen2Family.pinned, "qkv_bias": True, "decoder_sparse_step": 1, "mlp_only_layers": []}
    expert_parts: ClassVar[tuple[str, str, str]] = ("gate_proj", "up_proj", "down_proj")

    def module_map(self, config: ModelConfig) -> Mapping[str, ModuleMap]:
        return {**self.modules, **expert_modules(config, "model.layers.{i}.mlp", "gate", self.expert_parts)}

    def values_from_hf(self, raw: Mapping[str, Any], tokens: dict[str, Any]) -> dict[str, Any]:
        if any(kind != "full_attention" for kind in raw.get("layer_types") or ()):
            raise CheckpointError(f"qwen2_moe layer_types={raw['layer_types']!r} is not supported by tformer (full "
                                  "attention on every layer)")
        values = super().values_from_hf(raw, tokens)
        for name in ("num_experts", "shared_expert_d_ff"):
            if not values[name]:  # Qwen2-MoE builds dense layers without experts, an empty shared expert
                key = self.hf_keys[name][0]
                raise CheckpointError(f"qwen2_moe {key}={values[name]!r} is not supported by tformer (needs > 0)")
        return values

    def required_values(self, config: ModelConfig) -> list[str]:
        return super().required_values(config) + without_experts(self.model_type, config)

    def normalized_state(self, hf_state: Mapping[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
        return super().normalized_state(per_expert_state(hf_state, "mlp", self.expert_parts), config)
