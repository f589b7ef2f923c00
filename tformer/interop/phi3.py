"""Phi-3 (``model_type: phi3``): Mistral's layout (an optional sliding window) with the query, key and value
projections in one ``qkv_proj`` and the gate and up projections in one ``gate_up_proj``, as tformer holds them;
LongRoPE for the long-context variants (older files name it ``su`` or ``yarn``), rotary on a leading share of each
head (``partial_rotary_factor``), and ``original_max_position_embeddings`` at the top of config.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tformer.config import ModelConfig
from tformer.interop.mistral import MistralFamily
from tformer.interop.weight_map import ModuleMap

LONGROPE_ALIASES = ("su", "yarn")  # what Phi-3's configuration reads as longrope


class Phi3Family(MistralFamily):
    model_type = "phi3"
    architecture_class = "Phi3ForCausalLM"
    modules = {
        **{name: spec for name, spec in MistralFamily.modules.items()
           if not name.endswith(("attention.qkv_proj", "feedforward.in_proj"))},
        "stack.blocks.{i}.attention.qkv_proj": ModuleMap(("model.layers.{i}.self_attn.qkv_proj",)),
        "stack.blocks.{i}.feedforward.in_proj": ModuleMap(("model.layers.{i}.mlp.gate_up_proj",)),
    }
    hf_keys = {**MistralFamily.hf_keys, "vocab_size": ("vocab_size", 32064),
               "max_seq_len": ("max_position_embeddings", 4096), "d_ff": ("intermediate_size", 8192),
               "num_kv_heads": ("num_key_value_heads", None), "norm_eps": ("rms_norm_eps", 1e-5)}
    # dropout on the residual branches only (tformer's dropout also drops the embeddings): refused past 0
    pinned = {"resid_pdrop": 0.0}
    token_defaults = {"bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000}
    partial_rotation = True
    fields_in_overrides = MistralFamily.fields_in_overrides | {"partial_rotary_factor"}
    window_default = None  # Phi3Config's sliding_window when config.json has no such key

    def values_from_hf(self, raw: Mapping[str, Any], tokens: dict[str, Any]) -> dict[str, Any]:
        table_key = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
        table = raw.get(table_key)
        if isinstance(table, Mapping) and table.get("rope_type", table.get("type")) in LONGROPE_ALIASES:
            table = {**{key: value for key, value in table.items() if key != "type"}, "rope_type": "longrope"}
            raw = {**raw, table_key: table}
        return super().values_from_hf(raw, tokens)

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]:
        scaling = config.rope_scaling or {}
        # Phi3Config's own top-level key wins over the RoPE table's: write the table's (or the context) there
        original = scaling.get("original_max_position_embeddings", config.max_seq_len)
        return {**super().config_to_hf(config), "original_max_position_embeddings": original}
