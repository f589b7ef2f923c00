"""ModelConfig: validation names the field, JSON round trip, presets."""

import pytest
import torch

from tformer import ConfigError, ModelConfig, build_model
from tformer.config import PRESETS, non_default_fields, resolve_config


def test_gpt2_preset_has_124m_parameters():
    with torch.device("meta"):  # shapes only: counting needs no weights
        assert build_model("gpt2").num_parameters() == 124_439_808


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"d_model": 500, "num_heads": 8}, "d_model=500 is not divisible by num_heads=8"),
        ({"num_heads": 8, "num_kv_heads": 3}, "num_kv_heads=3 must divide num_heads=8"),
        ({"activation": "tanh"}, "activation='tanh' is not one of relu, gelu"),
        ({"norm_position": "middle"}, "norm_position='middle' is not one of pre, post"),
        ({"positional": "xpos"}, "positional='xpos' is not one of"),
        ({"dropout": 1.5}, "dropout=1.5 must be a number in [0, 1)"),
        ({"vocab_size": 0}, "vocab_size=0 must be a positive integer"),
        ({"eos_token_id": 10**6}, "eos_token_id=1000000 must be a token id"),
        ({"type_vocab_size": 2},
         "type_vocab_size=2 is a field of the encoder family; architecture='decoder' does not use it"),
        ({"architecture": "encoder_decoder", "initializer": "xavier"}, "initializer='xavier' is not one of normal, t5"),
        ({"initializer": "t5"},
         "initializer='t5' is a field of the encoder_decoder family; architecture='decoder' does not use it"),
    ],
)
def test_bad_config_names_the_field(fields, message):
    with pytest.raises(ConfigError) as error:
        ModelConfig(**fields)
    assert message in str(error.value)


def test_json_round_trip_keeps_every_field():
    for config in PRESETS.values():
        assert ModelConfig.from_json(config.to_json()) == config


def test_unknown_field_is_named():
    with pytest.raises(ConfigError, match="unknown ModelConfig field"):
        ModelConfig.from_dict({"d_modle": 3})
    with pytest.raises(ConfigError, match="unknown preset 'gpt5'; presets: "):
        resolve_config("gpt5")


def test_derived_fields_follow_overrides():
    config = resolve_config("gpt-nano", d_model=64)
    assert config.d_ff == 256 and config.head_dim == 16
    assert resolve_config("llama-small").d_ff == 1408
    assert resolve_config("gpt-nano", d_ff=100).d_ff == 100


def test_smaller_vocabulary_drops_preset_token_ids_it_cannot_hold():
    config = resolve_config("gpt2", vocab_size=8192)
    assert config.eos_token_id is None and config.bos_token_id is None
    assert resolve_config("gpt2", vocab_size=60000).eos_token_id == 50256
    with pytest.raises(ConfigError, match="eos_token_id=9000"):
        resolve_config("gpt2", vocab_size=8192, eos_token_id=9000)


def test_family_fields_at_their_default_are_accepted_everywhere():
    assert ModelConfig(type_vocab_size=0).type_vocab_size == 0
    assert ModelConfig(embedding_norm=True).embedding_norm  # a stack switch: every family may use it


def test_non_default_fields_count_derived_values_as_defaults():
    assert non_default_fields(ModelConfig()) == []
    assert non_default_fields(ModelConfig(bias=False)) == ["bias"]  # norm/attention/feed-forward biases follow it
    assert non_default_fields(ModelConfig(num_heads=6, num_kv_heads=2)) == ["num_heads", "num_kv_heads"]


VISION = {"architecture": "vision", "image_size": 16, "patch_size": 4, "d_model": 32, "num_heads": 4}


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"attention_kernel": "flash"},
         "attention_kernel='flash' is not one of sdpa, reference, chunked, performer, sliding_window"),
        ({"attention_kernel": "performer", "positional": "alibi"},
         "attention_kernel='performer' cannot express positional='alibi' (an additive bias on scores it never "
         "forms); allowed positional: learned, sinusoidal, rope, none"),
        ({"attention_kernel": "performer", "positional": "relative"},
         "attention_kernel='performer' cannot express positional='relative'"),
        ({"attention_kernel": "performer", "performer_features": 0}, "performer_features=0 must be a positive integer"),
        ({"attention_kernel": "performer", "performer_redraw_interval": -1},
         "performer_redraw_interval=-1 must be an integer >= 0"),
        ({"attention_kernel": "performer", "attention_dropout": 0.1},
         "attention_dropout=0.1 is not supported by attention_kernel='performer' (needs 0.0"),
        ({"attention_kernel": "chunked", "attention_dropout": 0.1},
         "attention_dropout=0.1 is not supported by attention_kernel='chunked'"),
        ({"attention_kernel": "sliding_window"},
         "attention_window=0 must be an integer in [1, 1024] (the longest sequence of architecture='decoder') for "
         "attention_kernel='sliding_window'"),
        ({"attention_kernel": "sliding_window", "attention_window": 1025}, "attention_window=1025 must be an integer"),
        ({**VISION, "attention_kernel": "sliding_window", "attention_window": 18},
         "attention_window=18 must be an integer in [1, 17]"),
        ({"attention_window": 16},
         "attention_window=16 is read only by attention_kernel='sliding_window', not attention_kernel='sdpa'"),
        ({"attention_kernel": "chunked", "performer_features": 64},
         "performer_features=64 is read only by attention_kernel='performer', not attention_kernel='chunked'"),
        ({"performer_redraw_interval": 10},
         "performer_redraw_interval=10 is read only by attention_kernel='performer'"),
        # soft-capping needs the scores formed; another scale than head_dim**-0.5 a kernel that takes one
        ({"attention_softcap": 50.0}, "attention_softcap=50.0 is not supported by attention_kernel='sdpa' (needs "
                                      "None; 'reference' and 'chunked' and 'sliding_window' and 'flex' have it)"),
        ({"attention_kernel": "performer", "attention_softcap": 50.0},
         "attention_softcap=50.0 is not supported by attention_kernel='performer'"),
        ({"attention_kernel": "performer", "query_pre_attn_scalar": 64},
         "query_pre_attn_scalar=64 is not supported by attention_kernel='performer'"),
        ({"attention_kernel": "chunked", "attention_softcap": 0.0},
         "attention_softcap=0.0 must be a finite number > 0, or null (none)"),
        ({"query_pre_attn_scalar": float("inf")}, "query_pre_attn_scalar=inf must be a finite number > 0"),
        ({"final_logit_softcap": -1}, "final_logit_softcap=-1 must be a finite number > 0"),
        ({"architecture": "encoder", "final_logit_softcap": 30.0},
         "final_logit_softcap=30.0 is a field of the decoder family; architecture='encoder' does not use it"),
        # a window per layer: one for each, within the sequence, some layer windowed, the others' kernel another
        ({"layer_attention_windows": (3, 0)},
         "layer_attention_windows=(3, 0) must hold one window per layer (num_layers=12), each an integer in "
         "[0, 1024]"),
        ({"num_layers": 2, "layer_attention_windows": (1025, 0)}, "layer_attention_windows=(1025, 0) must hold"),
        ({"num_layers": 2, "layer_attention_windows": (0, 0)},
         "layer_attention_windows=(0, 0) gives no layer a window: leave it empty"),
        ({"num_layers": 2, "layer_attention_windows": (3, 0), "attention_kernel": "sliding_window",
          "attention_window": 3}, "attention_kernel names the other layers' kernel and cannot be 'sliding_window'"),
        ({"num_layers": 2, "layer_attention_windows": (3, 0), "attention_dropout": 0.1},
         "attention_dropout=0.1 is not supported by attention_kernel='sliding_window'"),
        ({"num_layers": 2, "layer_attention_windows": (3, 0), "attention_kernel": "chunked", "positional": "alibi",
          "attention_softcap": 5.0, "query_pre_attn_scalar": 7}, None),
        ({"architecture": "encoder_decoder", "num_layers": 2, "layer_attention_windows": (3, 0)},
         "layer_attention_windows=(3, 0) is a field of the decoder family"),
    ],
)
def test_bad_attention_kernel_settings_are_refused_at_build_time(fields, message):
    if message is None:  # accepted
        assert ModelConfig.from_json(ModelConfig(**fields).to_json()) == ModelConfig(**fields)
        return
    with pytest.raises(ConfigError) as error:
        ModelConfig(**fields)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_every_kernel_builds_from_a_config():
    assert ModelConfig().attention_kernel == "sdpa"
    assert all(config.attention_kernel == "sdpa" for config in PRESETS.values())
    for kernel in ("reference", "chunked"):
        assert ModelConfig(attention_kernel=kernel).attention_kernel == kernel
    windowed = ModelConfig(attention_kernel="sliding_window", attention_window=1024)
    assert ModelConfig.from_json(windowed.to_json()) == windowed
    assert ModelConfig(**VISION, attention_kernel="sliding_window", attention_window=17).attention_window == 17
    performer = ModelConfig(attention_kernel="performer", performer_features=16, performer_redraw_interval=100)
    assert non_default_fields(performer) == ["attention_kernel", "performer_features", "performer_redraw_interval"]


def test_output_bias_takes_only_the_output_projections_bias():
    """Qwen2's attention: biases on the query, key and value rows, none on the output projection."""
    attention = build_model("gpt-nano", bias=False, attention_bias=True, output_bias=False).stack.blocks[0].attention
    assert attention.qkv_proj.bias is not None and attention.out_proj.bias is None
    with pytest.raises(ConfigError, match=r"output_bias=False takes the output projection's bias away from "
                                          r"attention_bias=True"):
        ModelConfig(bias=False, output_bias=False)
