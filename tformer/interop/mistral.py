"""Mistral (``model_type: mistral``): Llama's layout, with a sliding window of ``sliding_window`` keys on every
layer when the config sets one (Mistral 7B v0.1: 4,096; later versions: null, full attention).

Hugging Face's window holds ``sliding_window`` keys counting the query's own (keys j > i - W); tformer's
``attention_window`` counts the keys before it (i - W .. i), so a window of W is ``attention_window = W - 1`` on
the sliding-window kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from tformer.checkpoint import CheckpointError
from tformer.config import ModelConfig
from tformer.interop.llama import LlamaFamily
from tformer.nn.attention.registry import EXACT_ATTENTION_KERNELS

WINDOW_KERNEL = "sliding_window"


class MistralFamily(LlamaFamily):
    model_type = "mistral"
    architecture_class = "MistralForCausalLM"
    hf_keys = {name: spec for name, spec in LlamaFamily.hf_keys.items()
               if name not in ("attention_bias", "feedforward_bias")}
    hf_keys["max_seq_len"] = ("max_position_embeddings", 4096 * 32)
    hf_keys["d_ff"] = ("intermediate_size", 14336)
    hf_keys["num_kv_heads"] = ("num_key_value_heads", 8)
    layout = {**LlamaFamily.layout, "bias": False, "attention_bias": False, "feedforward_bias": False}
    activations = {"silu": "swiglu"}
    attention_kernels = (*EXACT_ATTENTION_KERNELS, WINDOW_KERNEL)
    fields_in_overrides = LlamaFamily.fields_in_overrides | {"attention_window"}
    window_default: ClassVar[int | None] = 4096  # MistralConfig's sliding_window when config.json has no such key

    def values_from_hf(self, raw: Mapping[str, Any], tokens: dict[str, Any]) -> dict[str, Any]:
        values = super().values_from_hf(raw, tokens)
        if "layer_types" in raw and any(kind != "full_attention" for kind in raw["layer_types"] or ()):
            raise CheckpointError(f"mistral layer_types={raw['layer_types']!r} is not supported by tformer (one "
                                  "attention for every layer: a sliding_window or none)")
        window = raw["sliding_window"] if "sliding_window" in raw else self.window_default
        if window is None:
            return values
        if isinstance(window, bool) or not isinstance(window, int) or window < 2:
            raise CheckpointError(f"mistral sliding_window={window!r} must be an integer >= 2 (keys a query sees, "
                                  "itself included) or null")
        if window >= values["max_seq_len"]:  # a window no sequence fills: full attention, as the kernel requires
            return values
        return {**values, "attention_kernel": WINDOW_KERNEL, "attention_window": window - 1}

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]:
        window = config.attention_window + 1 if config.attention_kernel == WINDOW_KERNEL else None
        return {**super().config_to_hf(config), "sliding_window": window}
