"""Gemma 2 (``model_type: gemma2``): Gemma's layout (GeGLU with the tanh GELU, ``(1 + w)`` RMSNorm, embeddings
scaled by sqrt(hidden_size)) with

- four norms per block, on each side of attention and of the feed-forward (``norm_position = "sandwich"``):
  ``input_layernorm`` and ``post_attention_layernorm``, ``pre_feedforward_layernorm`` and
  ``post_feedforward_layernorm``;
- the scores scaled by ``query_pre_attn_scalar``**-0.5 rather than head_dim**-0.5;
- the attention scores and the final logits soft-capped, ``cap * tanh(x / cap)`` (``attn_logit_softcapping``,
  ``final_logit_softcapping``; null: none), so the layers without a window run ``chunked`` (exact, and it forms
  the scores to cap; ``sdpa`` cannot) unless nothing is capped;
- local and global layers: ``layer_types`` (transformers 5; absent or null: sliding on layers 0, 2, 4, ..., as
  ``Gemma2Config`` derives it) names the layers with a sliding window of ``sliding_window`` keys; as for Mistral,
  Hugging Face counts the query itself, so a window of W is ``layer_attention_windows`` entry W - 1 on those
  layers (0 on the others). A window no sequence fills (W > ``max_position_embeddings``) leaves its layers full.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tformer.checkpoint import CheckpointError
from tformer.config import WINDOW_KERNEL, ModelConfig
from tformer.interop.gemma import GemmaFamily
from tformer.interop.weight_map import ModuleMap
from tformer.nn.attention.registry import EXACT_ATTENTION_KERNELS

LAYER_KINDS = ("sliding_attention", "full_attention")
WINDOW_DEFAULT = 4096  # Gemma2Config's sliding_window; written where no layer has a window (HF still needs one)
SOFTCAPS = {  # ModelConfig field -> (config.json key, Gemma2Config's default); null: no cap
    "attention_softcap": ("attn_logit_softcapping", 50.0),
    "final_logit_softcap": ("final_logit_softcapping", 30.0),
}
FULL_KERNEL_WHEN_CAPPED = "chunked"  # the kernel of the layers without a window when the scores are capped


class Gemma2Family(GemmaFamily):
    model_type = "gemma2"
    architecture_class = "Gemma2ForCausalLM"
    modules = {
        **{path: spec for path, spec in GemmaFamily.modules.items() if path != "stack.blocks.{i}.feedforward_norm"},
        "stack.blocks.{i}.attention_output_norm": ModuleMap(("model.layers.{i}.post_attention_layernorm",)),
        "stack.blocks.{i}.feedforward_norm": ModuleMap(("model.layers.{i}.pre_feedforward_layernorm",)),
        "stack.blocks.{i}.feedforward_output_norm": ModuleMap(("model.layers.{i}.post_feedforward_layernorm",)),
    }
    hf_keys = {name: spec for name, spec in GemmaFamily.hf_keys.items() if name != "activation"}
    hf_keys.update({
        "d_model": ("hidden_size", 2304), "d_ff": ("intermediate_size", 9216), "num_layers": ("num_hidden_layers", 26),
        "num_heads": ("num_attention_heads", 8), "num_kv_heads": ("num_key_value_heads", 4),
        # Gemma2's MLP reads hidden_activation (a hidden_act beside it is ignored, as HF ignores it)
        "activation": ("hidden_activation", "gelu_pytorch_tanh"),
        "query_pre_attn_scalar": ("query_pre_attn_scalar", 256),
    })
    activations = {"gelu_pytorch_tanh": "geglu_tanh", "gelu": "geglu"}
    layout = {**GemmaFamily.layout, "norm_position": "sandwich"}
    attention_kernels = (*EXACT_ATTENTION_KERNELS, WINDOW_KERNEL)  # the window: on its layers only, or on all
    fields_in_overrides = GemmaFamily.fields_in_overrides | {"layer_attention_windows", "attention_window",
                                                             *SOFTCAPS}

    def values_from_hf(self, raw: Mapping[str, Any], tokens: dict[str, Any]) -> dict[str, Any]:
        values = super().values_from_hf(raw, tokens)
        for name, (key, default) in SOFTCAPS.items():
            values[name] = raw.get(key, default)  # null is no cap, not the default
        windows = self.windows_from_hf(raw, values)
        values["layer_attention_windows"] = windows if any(windows) else ()
        if values["attention_softcap"] is not None:
            values["attention_kernel"] = FULL_KERNEL_WHEN_CAPPED
        return values

    def windows_from_hf(self, raw: Mapping[str, Any], values: Mapping[str, Any]) -> tuple[int, ...]:
        """Each layer's window in tformer's count (the keys before the query; 0: none) from ``layer_types`` and
        ``sliding_window``; a list that does not name every layer, or a window tformer cannot hold, refused."""
        layers = values["num_layers"]
        kinds = raw.get("layer_types")
        if kinds is None:
            kinds = [LAYER_KINDS[layer % 2] for layer in range(layers)]
        if not isinstance(kinds, list) or len(kinds) != layers or any(kind not in LAYER_KINDS for kind in kinds):
            raise CheckpointError(f"gemma2 layer_types={kinds!r} must name each of the {layers} layers "
                                  f"{' or '.join(map(repr, LAYER_KINDS))}")
        if LAYER_KINDS[0] not in kinds:
            return (0,) * layers
        window = raw["sliding_window"] if "sliding_window" in raw else WINDOW_DEFAULT
        if isinstance(window, bool) or not isinstance(window, int) or window < 2:
            raise CheckpointError(f"gemma2 sliding_window={window!r} must be an integer >= 2 (keys a query sees, "
                                  "itself included) for its sliding_attention layers")
        if window > values["max_seq_len"]:  # a window no sequence fills: full attention
            return (0,) * layers
        return tuple(window - 1 if kind == LAYER_KINDS[0] else 0 for kind in kinds)

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]:
        windows = config.layer_attention_windows or (0,) * config.num_layers
        if config.attention_kernel == WINDOW_KERNEL:  # a tformer model windowed on every layer
            windows = (config.attention_window,) * config.num_layers
        window = max(windows)
        return {
            **super().config_to_hf(config),
            "query_pre_attn_scalar": config.query_pre_attn_scalar or config.head_dim,
            "layer_types": [LAYER_KINDS[0] if size else LAYER_KINDS[1] for size in windows],
            "sliding_window": window + 1 if window else WINDOW_DEFAULT,
            **{key: getattr(config, name) for name, (key, _) in SOFTCAPS.items()},
        }

    def required_values(self, config: ModelConfig) -> list[str]:
        found = super().required_values(config)
        sizes = sorted(set(config.layer_attention_windows) - {0})
        if len(sizes) > 1:
            found.append(f"layer_attention_windows={config.layer_attention_windows!r} (needs one window size: "
                         "gemma2's sliding_window is the same on every local layer)")
        return found
