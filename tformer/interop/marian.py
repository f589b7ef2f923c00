"""Marian (``model_type: marian``, MarianMTModel): the Helsinki-NLP translation models, an
encoder-decoder with post-norm blocks, sinusoidal positions with every sine before every cosine,
embeddings scaled by sqrt(d_model) and shared by the encoder, the decoder and the output, and a
per-token bias on the logits (``final_logits_bias``, stored as (1, V); tformer's ``lm_head.bias``).

Hugging Face keeps the queries, keys and values apart; tformer stacks them (self-attention
``qkv_proj``, cross-attention ``kv_proj``). Positions count from 0 over the whole padded row in
Marian and over the real tokens in tformer: the same for the right-padded batches Marian's
tokenizer makes, where padding is masked anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from tformer.checkpoint import CheckpointError
from tformer.config import ModelConfig
from tformer.interop.family import CLASSIC_MHA_WITH_BIASES, Family, hf_field, require
from tformer.interop.weight_map import ModuleMap

LOGITS_BIAS = "final_logits_bias"


def _layers(stack: str, theirs: str, cross: bool) -> dict[str, ModuleMap]:
    """The module map of one stack's blocks (``stack``: encoder or decoder)."""
    layer = f"model.{theirs}.layers.{{i}}"
    modules = {
        f"{stack}.blocks.{{i}}.attention_norm": ModuleMap((f"{layer}.self_attn_layer_norm",)),
        f"{stack}.blocks.{{i}}.attention.qkv_proj": ModuleMap(
            (f"{layer}.self_attn.q_proj", f"{layer}.self_attn.k_proj", f"{layer}.self_attn.v_proj"), fused="qkv"),
        f"{stack}.blocks.{{i}}.attention.out_proj": ModuleMap((f"{layer}.self_attn.out_proj",)),
        f"{stack}.blocks.{{i}}.feedforward_norm": ModuleMap((f"{layer}.final_layer_norm",)),
        f"{stack}.blocks.{{i}}.feedforward.in_proj": ModuleMap((f"{layer}.fc1",)),
        f"{stack}.blocks.{{i}}.feedforward.out_proj": ModuleMap((f"{layer}.fc2",)),
    }
    if cross:
        modules.update({
            f"{stack}.blocks.{{i}}.cross_attention_norm": ModuleMap((f"{layer}.encoder_attn_layer_norm",)),
            f"{stack}.blocks.{{i}}.cross_attention.q_proj": ModuleMap((f"{layer}.encoder_attn.q_proj",)),
            f"{stack}.blocks.{{i}}.cross_attention.kv_proj": ModuleMap(
                (f"{layer}.encoder_attn.k_proj", f"{layer}.encoder_attn.v_proj"), fused="kv"),
            f"{stack}.blocks.{{i}}.cross_attention.out_proj": ModuleMap((f"{layer}.encoder_attn.out_proj",)),
        })
    return modules


class MarianFamily(Family):
    model_type = "marian"
    architecture = "encoder_decoder"
    architecture_class = "MarianMTModel"
    base_prefix = "model."
    modules = {
        "embedding.token": ModuleMap(("model.shared",)),
        **_layers("encoder", "encoder", cross=False),
        **_layers("decoder", "decoder", cross=True),
        "lm_head": ModuleMap(("lm_head",)),
    }
    # The fixed position tables (never trained; rebuilt from the config) and the aliases of the shared table.
    ignored_names = (r"embed_positions\.weight$", r"^model\.(encoder|decoder)\.embed_tokens\.weight$")
    hf_keys = {
        "vocab_size": ("vocab_size", 58101),
        "max_seq_len": ("max_position_embeddings", 1024),
        "d_model": ("d_model", 1024),
        "num_layers": ("decoder_layers", 12),
        "num_encoder_layers": ("encoder_layers", 12),
        "num_heads": ("encoder_attention_heads", 16),
        "d_ff": ("encoder_ffn_dim", 4096),
        "activation": ("activation_function", "gelu"),
        "dropout": ("dropout", 0.1),
        "attention_dropout": ("attention_dropout", 0.0),
        "tie_embeddings": ("tie_word_embeddings", True),
        "scale_embeddings": ("scale_embedding", False),
        "initializer_range": ("init_std", 0.02),
        "decoder_start_token_id": ("decoder_start_token_id", 58100),
    }
    activations = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh"}
    layout = {"positional": "sinusoidal", "sinusoidal_layout": "split", "norm": "layernorm", "norm_position": "post",
              "norm_eps": 1e-5, "lm_head_bias": True}
    requirements = CLASSIC_MHA_WITH_BIASES
    pinned = {"share_encoder_decoder_embeddings": True, "normalize_before": False, "activation_dropout": 0.0}
    token_defaults = {"pad_token_id": 58100, "eos_token_id": 0}
    fields_in_overrides = frozenset({"forced_eos_token_id"})
    # The decoder's sizes, which must equal the encoder's: config.json key -> (the field, MarianConfig's
    # default; None: the field's value).
    decoder_keys = {"decoder_vocab_size": ("vocab_size", None), "decoder_attention_heads": ("num_heads", 16),
                    "decoder_ffn_dim": ("d_ff", 4096)}

    def values_from_hf(self, raw: Mapping[str, Any], tokens: dict[str, Any]) -> dict[str, Any]:
        values = super().values_from_hf(raw, tokens)
        for key, (name, default) in self.decoder_keys.items():
            require("marian", key, hf_field(raw, key, values[name] if default is None else default), values[name])
        # null means none here (hf_field would read it as absent); MarianConfig's default is 0
        values["forced_eos_token_id"] = raw["forced_eos_token_id"] if "forced_eos_token_id" in raw else 0
        return values

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]:
        raw = super().config_to_hf(config)
        raw.update({key: getattr(config, name) for key, (name, _) in self.decoder_keys.items()})
        return {**raw, "is_encoder_decoder": True, "forced_eos_token_id": config.forced_eos_token_id}

    def required_values(self, config: ModelConfig) -> list[str]:
        found = super().required_values(config)
        if config.pad_token_id is None:
            found.append("pad_token_id=None (needs a token id: Marian pads and starts the decoder with it)")
        return found

    def normalized_state(self, hf_state: Mapping[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
        state = super().normalized_state(hf_state, config)
        if LOGITS_BIAS in state:  # (1, V) -> the output layer's bias (V,)
            state["lm_head.bias"] = state.pop(LOGITS_BIAS).reshape(-1)
        return state

    def saved_state(self, hf_state: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
        state = dict(hf_state)
        state[LOGITS_BIAS] = state.pop("lm_head.bias").reshape(1, -1).contiguous()
        return state


# Parameters that read the residual stream (their columns are its channels) and that write it or scale it
# (their rows are), by name suffix; the biases of projections into attention or the feed-forward are neither.
READS_RESIDUAL = ("embedding.token.weight", "qkv_proj.weight", "q_proj.weight", "kv_proj.weight",
                  "feedforward.in_proj.weight", "lm_head.weight")
WRITES_RESIDUAL = ("out_proj.weight", "out_proj.bias", "_norm.weight", "_norm.bias", "final_norm.weight",
                   "final_norm.bias")
NEITHER = ("qkv_proj.bias", "q_proj.bias", "kv_proj.bias", "feedforward.in_proj.bias", "lm_head.bias")


def marian_equivalent(model):
    """A model Marian can hold that computes what ``model`` computes, or ``model`` itself when it can
    already: an encoder-decoder with the paper's interleaved sinusoidal positions is re-laid out for
    Marian's split table by permuting its residual channels (channel 2i -> i, 2i + 1 -> D/2 + i: every
    weight reading or writing the stream, the norms and the token table alike; layer norms do not mind the
    order), and one without an output bias gets a zero one (Marian's ``final_logits_bias``)."""
    import torch

    config = model.config
    if config.architecture != "encoder_decoder" or config.positional != "sinusoidal" or (
            config.sinusoidal_layout == "split" and config.lm_head_bias):
        return model
    equivalent = type(model)(config.replace(sinusoidal_layout="split", lm_head_bias=True))
    width = config.d_model
    order = torch.cat([torch.arange(0, width, 2), torch.arange(1, width, 2)])
    if config.sinusoidal_layout == "split":
        order = torch.arange(width)
    state = {}
    for name, tensor in model.state_dict().items():
        if name.endswith(NEITHER):
            state[name] = tensor
        elif name.endswith(READS_RESIDUAL):
            state[name] = tensor[:, order]
        elif name.endswith(WRITES_RESIDUAL):
            state[name] = tensor[order]
        else:
            raise CheckpointError(f"cannot lay {name} out for Marian's positions: it is not a known weight of the "
                                  "encoder-decoder")
    state.setdefault("lm_head.bias", torch.zeros(config.vocab_size, dtype=model.dtype))
    equivalent.load_state_dict(state)
    equivalent.tokenizer = getattr(model, "tokenizer", None)
    return equivalent.to(model.dtype)
