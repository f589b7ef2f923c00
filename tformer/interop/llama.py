"""Llama (``model_type: llama``): RoPE, RMSNorm, SwiGLU, grouped-query attention, untied head.

Hugging Face keeps ``q_proj``/``k_proj``/``v_proj`` and ``gate_proj``/``up_proj`` apart;
tformer stacks them into ``qkv_proj`` and ``in_proj``. Both use the half-split rotary layout
(``rotate_half``), so query and key rows need no permutation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from tformer.config import ModelConfig
from tformer.interop.family import ORIGIN_KEY, Family
from tformer.interop.rope import rope_from_hf, rope_to_hf
from tformer.interop.weight_map import ModuleMap


class LlamaFamily(Family):
    model_type = "llama"
    architecture_class = "LlamaForCausalLM"
    base_prefix = "model."
    modules = {
        "embedding.token": ModuleMap(("model.embed_tokens",)),
        "stack.blocks.{i}.attention_norm": ModuleMap(("model.layers.{i}.input_layernorm",)),
        "stack.blocks.{i}.attention.qkv_proj": ModuleMap(
            ("model.layers.{i}.self_attn.q_proj", "model.layers.{i}.self_attn.k_proj",
             "model.layers.{i}.self_attn.v_proj"),
            fused="qkv",
        ),
        "stack.blocks.{i}.attention.out_proj": ModuleMap(("model.layers.{i}.self_attn.o_proj",)),
        "stack.blocks.{i}.feedforward_norm": ModuleMap(("model.layers.{i}.post_attention_layernorm",)),
        "stack.blocks.{i}.feedforward.in_proj": ModuleMap(
            ("model.layers.{i}.mlp.gate_proj", "model.layers.{i}.mlp.up_proj"), fused="gate_up"
        ),
        "stack.blocks.{i}.feedforward.out_proj": ModuleMap(("model.layers.{i}.mlp.down_proj",)),
        "stack.final_norm": ModuleMap(("model.norm",)),
        "lm_head": ModuleMap(("lm_head",)),
    }
    # Files written by older transformers versions carry the rotary frequencies as a buffer.
    ignored_names = (r"\.rotary_emb\.inv_freq$",)
    # norm_bias: RMSNorm has no bias whatever it says. extra: a Llama 3 list of end-of-sequence ids.
    fields_in_overrides = frozenset({"norm_bias", "rope_theta", "rope_scaling", "extra"})
    partial_rotation: ClassVar[bool] = False  # HF's Llama rotates whole heads: partial_rotary_factor refused

    hf_keys = {
        "vocab_size": ("vocab_size", 32000),
        "max_seq_len": ("max_position_embeddings", 2048),
        "d_model": ("hidden_size", 4096),
        "num_layers": ("num_hidden_layers", 32),
        "num_heads": ("num_attention_heads", 32),
        "num_kv_heads": ("num_key_value_heads", None),  # None: num_heads
        "head_dim": ("head_dim", None),  # None: d_model // num_heads
        "d_ff": ("intermediate_size", 11008),
        "activation": ("hidden_act", "silu"),
        "norm_eps": ("rms_norm_eps", 1e-6),
        "attention_dropout": ("attention_dropout", 0.0),
        "attention_bias": ("attention_bias", False),
        "feedforward_bias": ("mlp_bias", False),
        "tie_embeddings": ("tie_word_embeddings", False),
        "initializer_range": ("initializer_range", 0.02),
    }
    activations = {"silu": "swiglu", "gelu": "geglu"}  # HF ``hidden_act``, applied to the gate
    layout = {"positional": "rope", "norm": "rmsnorm", "norm_position": "pre"}
    token_defaults = {"bos_token_id": 1, "eos_token_id": 2}

    def values_from_hf(self, raw: Mapping[str, Any], tokens: dict[str, Any]) -> dict[str, Any]:
        values = super().values_from_hf(raw, tokens)
        eos_token_ids = values["eos_token_id"]
        extra = {} if self.model_type == "llama" else {ORIGIN_KEY: self.model_type}  # saved back as this family
        if isinstance(eos_token_ids, list):  # Llama 3: eos_token_id holds the first, extra all of them
            extra["eos_token_ids"] = eos_token_ids
            values["eos_token_id"] = eos_token_ids[0] if eos_token_ids else None
        if extra:
            values["extra"] = extra
        rope = rope_from_hf(self.model_type, raw, partial=self.partial_rotation)
        if not self.partial_rotation:
            del rope["partial_rotary_factor"]
        return {**values, "bias": False, **rope}

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]:
        return {
            **super().config_to_hf(config),
            **rope_to_hf(config),
            "eos_token_id": config.extra.get("eos_token_ids", config.eos_token_id),
        }
