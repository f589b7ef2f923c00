"""T5 (``model_type: t5``, T5ForConditionalGeneration): an encoder-decoder with pre-norm RMS norms
(no mean, no bias), no biases anywhere, T5's bucketed relative position bias (one table per stack,
shared by its blocks, bidirectional in the encoder), a ReLU (T5) or tanh-GELU gated (``gated-gelu``,
T5 v1.1) feed-forward, and (T5, not v1.1) the decoder's last states scaled by d_model^-0.5 before the
output: ``scale_decoder_outputs`` in transformers 5's configs, ``tie_word_embeddings`` in older ones.

T5 does not divide attention scores by sqrt(head size); tformer does. The query weights are
multiplied by sqrt(d_kv) on the way in and divided on the way out, so the scores are the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from tformer.checkpoint import CheckpointError
from tformer.config import ModelConfig
from tformer.interop.family import Family, hf_field
from tformer.interop.weight_map import ModuleMap

QUERY_SUFFIXES = (".SelfAttention.q.weight", ".EncDecAttention.q.weight")


def _attention(prefix: str, theirs: str) -> dict[str, ModuleMap]:
    return {
        f"{prefix}.qkv_proj": ModuleMap((f"{theirs}.q", f"{theirs}.k", f"{theirs}.v"), fused="qkv"),
        f"{prefix}.out_proj": ModuleMap((f"{theirs}.o",)),
    }


def _cross_attention(prefix: str, theirs: str) -> dict[str, ModuleMap]:
    return {
        f"{prefix}.q_proj": ModuleMap((f"{theirs}.q",)),
        f"{prefix}.kv_proj": ModuleMap((f"{theirs}.k", f"{theirs}.v"), fused="kv"),
        f"{prefix}.out_proj": ModuleMap((f"{theirs}.o",)),
    }


def _feedforward(prefix: str, theirs: str, gated: bool) -> dict[str, ModuleMap]:
    if gated:
        in_proj = ModuleMap((f"{theirs}.wi_0", f"{theirs}.wi_1"), fused="gate_up")
    else:
        in_proj = ModuleMap((f"{theirs}.wi",))
    return {f"{prefix}.in_proj": in_proj, f"{prefix}.out_proj": ModuleMap((f"{theirs}.wo",))}


def _modules(gated: bool) -> dict[str, ModuleMap]:
    encoder, decoder = "encoder.block.{i}.layer", "decoder.block.{i}.layer"
    bias = "block.0.layer.0.SelfAttention.relative_attention_bias"  # in the first block, shared by all
    return {
        "embedding.token": ModuleMap(("shared",)),
        "encoder.positional.bias.embedding": ModuleMap((f"encoder.{bias}",)),
        "encoder.blocks.{i}.attention_norm": ModuleMap((f"{encoder}.0.layer_norm",)),
        **_attention("encoder.blocks.{i}.attention", f"{encoder}.0.SelfAttention"),
        "encoder.blocks.{i}.feedforward_norm": ModuleMap((f"{encoder}.1.layer_norm",)),
        **_feedforward("encoder.blocks.{i}.feedforward", f"{encoder}.1.DenseReluDense", gated),
        "encoder.final_norm": ModuleMap(("encoder.final_layer_norm",)),
        "decoder.positional.bias.embedding": ModuleMap((f"decoder.{bias}",)),
        "decoder.blocks.{i}.attention_norm": ModuleMap((f"{decoder}.0.layer_norm",)),
        **_attention("decoder.blocks.{i}.attention", f"{decoder}.0.SelfAttention"),
        "decoder.blocks.{i}.cross_attention_norm": ModuleMap((f"{decoder}.1.layer_norm",)),
        **_cross_attention("decoder.blocks.{i}.cross_attention", f"{decoder}.1.EncDecAttention"),
        "decoder.blocks.{i}.feedforward_norm": ModuleMap((f"{decoder}.2.layer_norm",)),
        **_feedforward("decoder.blocks.{i}.feedforward", f"{decoder}.2.DenseReluDense", gated),
        "decoder.final_norm": ModuleMap(("decoder.final_layer_norm",)),
        "lm_head": ModuleMap(("lm_head",)),
    }


class T5Family(Family):
    model_type = "t5"
    architecture = "encoder_decoder"
    architecture_class = "T5ForConditionalGeneration"
    base_prefix = ""
    modules = _modules(gated=False)
    ignored_names = (r"^(encoder|decoder)\.embed_tokens\.weight$",)  # aliases of the shared table

    def module_map(self, config: ModelConfig) -> Mapping[str, ModuleMap]:
        return _modules(gated=config.gated)

    hf_keys = {
        "vocab_size": ("vocab_size", 32128),
        "d_model": ("d_model", 512),
        "num_encoder_layers": ("num_layers", 6),
        "num_layers": ("num_decoder_layers", None),  # None: num_layers (the encoder's)
        "num_heads": ("num_heads", 8),
        "head_dim": ("d_kv", 64),
        "d_ff": ("d_ff", 2048),
        "activation": ("feed_forward_proj", "relu"),
        "norm_eps": ("layer_norm_epsilon", 1e-6),
        "relative_num_buckets": ("relative_attention_num_buckets", 32),
        "relative_max_distance": ("relative_attention_max_distance", 128),
        "dropout": ("dropout_rate", 0.1),
        "tie_embeddings": ("tie_word_embeddings", True),
        # transformers 5 writes scale_decoder_outputs; older configs say it by tie_word_embeddings (v1.1: False).
        "scale_decoder_output": ("scale_decoder_outputs", None),  # None: tie_embeddings
        "decoder_start_token_id": ("decoder_start_token_id", 0),
    }
    activations = {"relu": "relu", "gated-gelu": "geglu_tanh"}
    layout = {"positional": "relative", "norm": "rmsnorm", "norm_position": "pre", "bias": False, "norm_bias": False,
              "attention_bias": False, "feedforward_bias": False, "attention_dropout": 0.0}
    requirements = {"num_kv_heads": lambda config: config.num_heads}
    pinned = {"is_encoder_decoder": True}
    token_defaults = {"pad_token_id": 0, "eos_token_id": 1}
    fields_in_overrides = frozenset({"initializer_range", "initializer"})  # initializer_factor; T5's draws

    def values_from_hf(self, raw: Mapping[str, Any], tokens: dict[str, Any]) -> dict[str, Any]:
        values = super().values_from_hf(raw, tokens)
        if values["num_layers"] is None:
            values["num_layers"] = values["num_encoder_layers"]
        if values["scale_decoder_output"] is None:
            values["scale_decoder_output"] = values["tie_embeddings"]
        # T5 scales every initial standard deviation by initializer_factor (tformer's are 0.02 * it).
        values["initializer_range"] = hf_field(raw, "initializer_factor", 1.0) * 0.02
        values["initializer"] = "t5"  # a model built from this config draws its weights as T5's do
        return values

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]:
        return {**super().config_to_hf(config), "initializer_factor": config.initializer_range / 0.02}

    def normalized_state(self, hf_state: Mapping[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
        shared = hf_state.get("shared.weight")
        for alias in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):  # ignored_names drops them
            if shared is not None and alias in hf_state and not torch.equal(hf_state[alias], shared):
                raise CheckpointError(f"{alias} differs from shared.weight: tformer's T5 has one token table for "
                                      "the encoder and the decoder, as T5's checkpoints do")
        state = super().normalized_state(hf_state, config)
        return {name: t * config.head_dim ** 0.5 if name.endswith(QUERY_SUFFIXES) else t for name, t in state.items()}

    def saved_state(self, hf_state: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
        return {name: (t / config.head_dim ** 0.5).contiguous() if name.endswith(QUERY_SUFFIXES) else t
                for name, t in hf_state.items()}
