"""Whisper (``model_type: whisper``, WhisperForConditionalGeneration): OpenAI's speech recogniser, tformer's
speech architecture. Pre-norm blocks with exact GELU on both sides; the encoder reads log-mel frames through
two convolutions (``conv1``, ``conv2``) and a fixed sinusoid table (``embed_positions``, stored in the file
and used as stored); the decoder has learned positions and an output tied to its token table
(``proj_out``); the key projections have no bias.

Hugging Face keeps the queries, keys and values apart; tformer stacks them (self-attention ``qkv_proj``,
cross-attention ``kv_proj``, without biases) and keeps the query and value biases beside them
(``keyless_bias``). ``suppress_tokens`` and ``begin_suppress_tokens`` (config.json's, as WhisperConfig holds
them) become generation's defaults; ids outside the vocabulary suppress nothing there and are dropped.
The decoder prompt (<|startoftranscript|>, language, task, <|notimestamps|>) is the caller's, given to
``generate`` as ``decoder_prompt_ids`` (``tformer.models.speech.whisper_prompt``): config.json's old
``forced_decoder_ids`` are not read, and there is no language detection.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tformer.checkpoint import CheckpointError
from tformer.config import ModelConfig
from tformer.interop.family import CLASSIC_MHA_WITH_BIASES, Family, hf_field, require
from tformer.interop.weight_map import ModuleMap

SUPPRESSION_KEYS = ("suppress_tokens", "begin_suppress_tokens")


def _layers(stack: str, cross: bool) -> dict[str, ModuleMap]:
    """The module map of one stack's blocks (``stack``: encoder or decoder; Hugging Face names them alike)."""
    layer = f"model.{stack}.layers.{{i}}"
    ours = f"{stack}.blocks.{{i}}"
    modules = {
        f"{ours}.attention_norm": ModuleMap((f"{layer}.self_attn_layer_norm",)),
        f"{ours}.attention.qkv_proj": ModuleMap(
            (f"{layer}.self_attn.q_proj", f"{layer}.self_attn.k_proj", f"{layer}.self_attn.v_proj"), fused="qkv"),
        f"{ours}.attention.keyless_bias": ModuleMap(
            (f"{layer}.self_attn.q_proj", f"{layer}.self_attn.v_proj"), fused="qv"),
        f"{ours}.attention.out_proj": ModuleMap((f"{layer}.self_attn.out_proj",)),
        f"{ours}.feedforward_norm": ModuleMap((f"{layer}.final_layer_norm",)),
        f"{ours}.feedforward.in_proj": ModuleMap((f"{layer}.fc1",)),
        f"{ours}.feedforward.out_proj": ModuleMap((f"{layer}.fc2",)),
    }
    if cross:
        modules.update({
            f"{ours}.cross_attention_norm": ModuleMap((f"{layer}.encoder_attn_layer_norm",)),
            f"{ours}.cross_attention.q_proj": ModuleMap((f"{layer}.encoder_attn.q_proj",)),
            f"{ours}.cross_attention.kv_proj": ModuleMap(
                (f"{layer}.encoder_attn.k_proj", f"{layer}.encoder_attn.v_proj"), fused="kv"),
            f"{ours}.cross_attention.keyless_bias": ModuleMap((f"{layer}.encoder_attn.v_proj",)),
            f"{ours}.cross_attention.out_proj": ModuleMap((f"{layer}.encoder_attn.out_proj",)),
        })
    return modules


class WhisperFamily(Family):
    model_type = "whisper"
    architecture = "speech"
    architecture_class = "WhisperForConditionalGeneration"
    base_prefix = "model."
    modules = {
        "audio.conv1": ModuleMap(("model.encoder.conv1",)),
        "audio.conv2": ModuleMap(("model.encoder.conv2",)),
        "audio.positions": ModuleMap(("model.encoder.embed_positions",)),
        **_layers("encoder", cross=False),
        "encoder.final_norm": ModuleMap(("model.encoder.layer_norm",)),
        "embedding.token": ModuleMap(("model.decoder.embed_tokens",)),
        "decoder.positional.absolute.embedding": ModuleMap(("model.decoder.embed_positions",)),
        **_layers("decoder", cross=True),
        "decoder.final_norm": ModuleMap(("model.decoder.layer_norm",)),
        "lm_head": ModuleMap(("proj_out",)),
    }
    tied_output_names = ("proj_out.weight",)
    hf_keys = {
        "vocab_size": ("vocab_size", 51865),
        "max_seq_len": ("max_target_positions", 448),
        "d_model": ("d_model", 384),
        "num_layers": ("decoder_layers", 4),
        "num_encoder_layers": ("encoder_layers", 4),
        "num_heads": ("encoder_attention_heads", 6),
        "d_ff": ("encoder_ffn_dim", 1536),
        "activation": ("activation_function", "gelu"),
        "dropout": ("dropout", 0.0),
        "attention_dropout": ("attention_dropout", 0.0),
        "tie_embeddings": ("tie_word_embeddings", True),
        "initializer_range": ("init_std", 0.02),
        "decoder_start_token_id": ("decoder_start_token_id", 50257),
        "num_mel_bins": ("num_mel_bins", 80),
        "max_source_positions": ("max_source_positions", 1500),
        "suppress_tokens": ("suppress_tokens", None),
        "begin_suppress_tokens": ("begin_suppress_tokens", [220, 50256]),
    }
    layout = {"positional": "learned", "norm": "layernorm", "norm_position": "pre", "norm_eps": 1e-5,
              "key_bias": False}
    requirements = CLASSIC_MHA_WITH_BIASES
    # Variants tformer does not implement: embeddings scaled by sqrt(d_model) (the decoder's only, in Hugging
    # Face), dropout inside the feed-forward, layer drop and SpecAugment (training only, but not tformer's).
    pinned = {"scale_embedding": False, "activation_dropout": 0.0, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
              "apply_spec_augment": False}
    token_defaults = {"pad_token_id": 50256, "bos_token_id": 50256, "eos_token_id": 50256}
    # The decoder's sizes, which must equal the encoder's: config.json key -> (the field, WhisperConfig's default).
    decoder_keys = {"decoder_attention_heads": ("num_heads", 6), "decoder_ffn_dim": ("d_ff", 1536)}

    def values_from_hf(self, raw: Mapping[str, Any], tokens: dict[str, Any]) -> dict[str, Any]:
        values = super().values_from_hf(raw, tokens)
        for key, (name, default) in self.decoder_keys.items():
            require("whisper", key, hf_field(raw, key, default), values[name])
        for name in SUPPRESSION_KEYS:
            ids = values[name] or ()
            if not isinstance(ids, (list, tuple)) or not all(
                    isinstance(token, int) and not isinstance(token, bool) and token >= 0 for token in ids):
                raise CheckpointError(f"whisper {name}={ids!r} must be a list of token ids")
            values[name] = tuple(token for token in ids if token < values["vocab_size"])
        return values

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]:
        raw = super().config_to_hf(config)
        raw.update({key: getattr(config, name) for key, (name, _) in self.decoder_keys.items()})
        raw.update({name: list(getattr(config, name)) for name in SUPPRESSION_KEYS})
        return {**raw, "is_encoder_decoder": True}
