"""Mixtral (``model_type: mixtral``): Mistral's attention (an optional sliding window) with a sparse mixture of
experts as every layer's feed-forward: ``num_local_experts`` SwiGLU experts of ``intermediate_size``, each token
routed to its ``num_experts_per_tok`` most probable ones, their weights renormalised (tformer's
``norm_topk_prob=True``), and ``router_aux_loss_coef`` weighting the load-balancing loss in training.

Hub files (and transformers 5's ``save_pretrained``) hold one tensor per expert and projection,
``model.layers.{i}.block_sparse_moe.experts.{e}.w1`` (gate), ``w3`` (up) and ``w2`` (down), and the router as
``block_sparse_moe.gate``; transformers 5 fuses them in memory (``mlp.experts.gate_up_proj`` (E, 2F, D),
``mlp.experts.down_proj`` (E, D, F)) and writes that layout with ``save_pretrained(save_original_format=False)``:
both are read, the Hub's is written. ``router_jitter_noise`` (a training-time perturbation of the router's
input) is refused past 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor

from tformer.config import ModelConfig
from tformer.interop.mistral import MistralFamily
from tformer.interop.weight_map import ModuleMap

# transformers 5's in-memory layout of a layer's experts: one 3-D tensor per projection kind
FUSED_EXPERTS = re.compile(r"^(?P<layer>.*\.layers\.\d+)\.mlp\.experts\.(?P<kind>gate_up_proj|down_proj)$")


def expert_modules(config: ModelConfig, moe: str, router: str, parts: tuple[str, str, str]) -> dict[str, ModuleMap]:
    """The module map of a layer's router and experts: ``moe`` the HF mixture's path (``{i}`` the layer),
    ``router`` its router's name, ``parts`` each expert's gate, up and down projections' names."""
    gate, up, down = parts
    ours = "stack.blocks.{i}.feedforward"
    modules = {f"{ours}.router": ModuleMap((f"{moe}.{router}",))}
    for expert in range(config.num_experts):
        theirs = f"{moe}.experts.{expert}"
        modules[f"{ours}.experts.{expert}.in_proj"] = ModuleMap((f"{theirs}.{gate}", f"{theirs}.{up}"), fused="gate_up")
        modules[f"{ours}.experts.{expert}.out_proj"] = ModuleMap((f"{theirs}.{down}",))
    return modules


def without_experts(model_type: str, config: ModelConfig) -> list[str]:
    """The phrase for a dense config, which a family whose every layer is a mixture of experts cannot hold."""
    if config.num_experts:
        return []
    return [f"num_experts=0 (needs > 0: every {model_type} layer is a mixture of experts)"]


def per_expert_state(state: Mapping[str, Tensor], moe: str, parts: tuple[str, str, str]) -> dict[str, Tensor]:
    """``state`` with transformers 5's fused experts (``mlp.experts.gate_up_proj`` (E, 2F, D), gate rows first,
    and ``mlp.experts.down_proj`` (E, D, F)) split into the per-expert tensors Hub files hold, under the mixture's
    path ``moe`` (Mixtral's ``block_sparse_moe``, whose other ``mlp.`` tensors are renamed with it); a state
    without them is returned as it is."""
    if not any(FUSED_EXPERTS.match(name) for name in state):
        return dict(state)
    gate, up, down = parts
    split: dict[str, Tensor] = {}
    for name, tensor in state.items():
        match = FUSED_EXPERTS.match(name)
        if match is None:
            split[re.sub(r"(\.layers\.\d+)\.mlp\.", rf"\1.{moe}.", name)] = tensor
            continue
        for expert, weights in enumerate(tensor.unbind(0)):
            prefix = f"{match['layer']}.{moe}.experts.{expert}"
            if match["kind"] == "down_proj":
                split[f"{prefix}.{down}.weight"] = weights
            else:
                split[f"{prefix}.{gate}.weight"], split[f"{prefix}.{up}.weight"] = weights.chunk(2, dim=0)
    return split


class MixtralFamily(MistralFamily):
    model_type = "mixtral"
    architecture_class = "MixtralForCausalLM"
    modules = {name: spec for name, spec in MistralFamily.modules.items() if ".feedforward." not in name}
    hf_keys = {**MistralFamily.hf_keys, "norm_eps": ("rms_norm_eps", 1e-5),
               "num_experts": ("num_local_experts", 8), "num_experts_per_token": ("num_experts_per_tok", 2),
               "router_aux_loss_coef": ("router_aux_loss_coef", 0.001)}
    # top-k renormalised, no shared expert
    layout = {**MistralFamily.layout, "norm_topk_prob": True, "shared_expert_d_ff": 0, "shared_expert_gate": False}
    requirements = {"moe_d_ff": lambda config: config.d_ff}  # intermediate_size is each expert's width
    pinned = {"router_jitter_noise": 0.0}
    window_default = None  # MixtralConfig's sliding_window when config.json has no such key
    default_theta: ClassVar[float] = 1000000.0  # MixtralConfig's RoPE base when config.json names none
    moe_path: ClassVar[str] = "block_sparse_moe"  # the mixture's module in a layer, as Hub files name it
    router_name: ClassVar[str] = "gate"
    expert_parts: ClassVar[tuple[str, str, str]] = ("w1", "w3", "w2")  # gate, up, down

    def module_map(self, config: ModelConfig) -> Mapping[str, ModuleMap]:
        return {**self.modules, **expert_modules(config, f"model.layers.{{i}}.{self.moe_path}", self.router_name,
                                                 self.expert_parts)}

    def values_from_hf(self, raw: Mapping[str, Any], tokens: dict[str, Any]) -> dict[str, Any]:
        table = raw.get("rope_scaling") or raw.get("rope_parameters")
        if raw.get("rope_theta") is None and not (isinstance(table, Mapping) and table.get("rope_theta")):
            raw = {**raw, "rope_theta": self.default_theta}
        return super().values_from_hf(raw, tokens)

    def required_values(self, config: ModelConfig) -> list[str]:
        return super().required_values(config) + without_experts(self.model_type, config)

    def normalized_state(self, hf_state: Mapping[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
        return super().normalized_state(per_expert_state(hf_state, self.moe_path, self.expert_parts), config)
