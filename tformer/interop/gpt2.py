"""GPT-2 (``model_type: gpt2``): learned positions, pre-norm LayerNorm, GELU, fused QKV.

Hugging Face's GPT-2 already fuses queries, keys and values (``c_attn``) in tformer's row
order, but its ``Conv1D`` layers store weights as (in, out): every 2-D weight is transposed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tformer.config import ModelConfig
from tformer.interop.family import CLASSIC_MHA_WITH_BIASES, Family
from tformer.interop.weight_map import ModuleMap


def _conv1d(*theirs: str) -> ModuleMap:
    return ModuleMap(theirs, transposed=True)


class GPT2Family(Family):
    model_type = "gpt2"
    architecture_class = "GPT2LMHeadModel"
    base_prefix = "transformer."
    modules = {
        "embedding.token": ModuleMap(("transformer.wte",)),
        "stack.positional.absolute.embedding": ModuleMap(("transformer.wpe",)),
        "stack.blocks.{i}.attention_norm": ModuleMap(("transformer.h.{i}.ln_1",)),
        "stack.blocks.{i}.attention.qkv_proj": _conv1d("transformer.h.{i}.attn.c_attn"),
        "stack.blocks.{i}.attention.out_proj": _conv1d("transformer.h.{i}.attn.c_proj"),
        "stack.blocks.{i}.feedforward_norm": ModuleMap(("transformer.h.{i}.ln_2",)),
        "stack.blocks.{i}.feedforward.in_proj": _conv1d("transformer.h.{i}.mlp.c_fc"),
        "stack.blocks.{i}.feedforward.out_proj": _conv1d("transformer.h.{i}.mlp.c_proj"),
        "stack.final_norm": ModuleMap(("transformer.ln_f",)),
        "lm_head": ModuleMap(("lm_head",)),
    }
    # The causal-mask buffers that files written by older transformers versions carry.
    ignored_names = (r"\.attn\.bias$", r"\.attn\.masked_bias$")

    hf_keys = {
        "vocab_size": ("vocab_size", 50257),
        "max_seq_len": ("n_positions", 1024),
        "d_model": ("n_embd", 768),
        "num_layers": ("n_layer", 12),
        "num_heads": ("n_head", 12),
        "d_ff": ("n_inner", None),  # None: 4 * d_model
        "activation": ("activation_function", "gelu_new"),
        "norm_eps": ("layer_norm_epsilon", 1e-5),
        "dropout": ("resid_pdrop", 0.1),
        "attention_dropout": ("attn_pdrop", 0.1),
        "tie_embeddings": ("tie_word_embeddings", True),
        "initializer_range": ("initializer_range", 0.02),
    }
    layout = {"positional": "learned", "norm": "layernorm", "norm_position": "pre"}
    requirements = CLASSIC_MHA_WITH_BIASES
    # Variants of HF's GPT-2 that tformer does not implement, each with the one value it supports.
    pinned = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False}
    token_defaults = {"bos_token_id": 50256, "eos_token_id": 50256}

    def values_from_hf(self, raw: Mapping[str, Any], tokens: dict[str, Any]) -> dict[str, Any]:
        values = super().values_from_hf(raw, tokens)
        if values["d_ff"] is None:
            values["d_ff"] = 4 * values["d_model"]
        return values

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]:
        return {**super().config_to_hf(config), "embd_pdrop": config.dropout}
