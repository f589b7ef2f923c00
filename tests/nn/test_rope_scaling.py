"""RoPE scaling and partial rotation: what each type does to the frequencies, and the refusals of a config
that cannot be run (tests/nn/test_rope_scaling_hf.py compares the figures with Hugging Face's)."""

import math

import pytest
import torch

from tformer.config import ConfigError, ModelConfig
from tformer.nn.positions import ROPE_SCALINGS, RotaryEmbedding, apply_rotary, positional_from_config
from tformer.nn.positions.rope_scaling import default_frequencies

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def scaled(parameters: dict, rotary_dim: int = 32, theta: float = 10000.0, max_seq_len: int = 256):
    return ROPE_SCALINGS[parameters["rope_type"]](parameters, rotary_dim, theta, max_seq_len)


def test_linear_scaling_is_position_interpolation():
    rope = RotaryEmbedding(16, scaling={"rope_type": "linear", "factor": 4.0})
    plain = RotaryEmbedding(16)
    positions = torch.arange(0, 64, 4)[None]
    torch.testing.assert_close(rope(positions)[0], plain(positions // 4)[0], rtol=1e-6, atol=1e-6)


def test_llama3_keeps_short_wavelengths_divides_long_ones_and_blends_between():
    inverse, factor = scaled(LLAMA3).frequencies()
    plain = default_frequencies(32, 10000.0)
    wavelengths = 2 * math.pi / plain
    short, long = wavelengths < 64 / 4, wavelengths > 64 / 1
    assert short.any() and long.any() and (~short & ~long).any()
    torch.testing.assert_close(inverse[short], plain[short])
    torch.testing.assert_close(inverse[long], plain[long] / 8)
    between = ~short & ~long
    assert ((inverse[between] < plain[between]) & (inverse[between] > plain[between] / 8)).all()
    assert factor == 1.0


def test_length_dependent_types_change_only_past_their_context():
    dynamic = scaled({"rope_type": "dynamic", "factor": 2.0}, max_seq_len=64)
    plain = default_frequencies(32, 10000.0)
    torch.testing.assert_close(dynamic.frequencies(64)[0], plain)
    assert (dynamic.frequencies(65)[0][1:] < plain[1:]).all()  # a larger base past max_seq_len
    longrope = scaled({"rope_type": "longrope", "short_factor": [1.0] * 16, "long_factor": [2.0] * 16,
                       "original_max_position_embeddings": 64})
    torch.testing.assert_close(longrope.frequencies(64)[0], plain)
    torch.testing.assert_close(longrope.frequencies(65)[0], plain / 2)
    assert longrope.frequencies()[1] == pytest.approx(math.sqrt(1 + math.log(256 / 64) / math.log(64)))


def test_a_length_dependent_rotary_takes_the_longest_position_of_its_pass():
    rope = RotaryEmbedding(8, scaling={"rope_type": "dynamic", "factor": 2.0}, max_seq_len=16)
    assert rope.length_dependent and not RotaryEmbedding(8, scaling=LLAMA3).length_dependent
    short, long = rope(torch.tensor([[3]]))[0], rope(torch.tensor([[3, 40]]))[0][:, :, :1]
    torch.testing.assert_close(short, RotaryEmbedding(8)(torch.tensor([[3]]))[0])
    assert not torch.allclose(short, long)


def test_yarn_scales_cos_and_sin_by_its_attention_factor():
    rope = RotaryEmbedding(16, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
                           max_seq_len=128)
    cos, sin = rope(torch.arange(10)[None])
    torch.testing.assert_close(cos ** 2 + sin ** 2, torch.full_like(cos, (0.1 * math.log(4.0) + 1) ** 2))


def test_partial_rotation_turns_the_leading_share_and_passes_the_rest():
    config = ModelConfig(d_model=32, num_heads=2, num_layers=1, positional="rope", partial_rotary_factor=0.25)
    scheme = positional_from_config(config, causal=True)
    cos, sin = scheme.rotary_angles(torch.arange(6)[None], torch.float32)
    assert cos.shape == (1, 1, 6, 4)  # int(16 x 0.25) of each head's 16 dimensions
    x = torch.randn(1, 2, 6, 16)
    rotated = apply_rotary(x, cos, sin)
    torch.testing.assert_close(rotated[..., 4:], x[..., 4:], rtol=0, atol=0)
    full = apply_rotary(x[..., :4], cos, sin)
    torch.testing.assert_close(rotated[..., :4], full, rtol=0, atol=0)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps lengths


def test_rope_scaling_round_trips_through_json():
    config = ModelConfig(positional="rope", rope_scaling={"rope_type": "linear", "factor": 2})
    assert ModelConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize("changes, message", [
    (dict(rope_scaling={"rope_type": "ntk"}), r"rope_scaling rope_type='ntk' is not one of linear, dynamic, yarn"),
    (dict(rope_scaling={"rope_type": "linear"}), r"rope_scaling of rope_type='linear' needs factor$"),
    (dict(rope_scaling={"rope_type": "linear", "factor": 2, "beta": 1}),
     r"rope_scaling beta is not read by rope_type='linear' \(it reads factor\)"),
    (dict(rope_scaling={"rope_type": "linear", "factor": -2}), r"factor=-2 must be a number > 0"),
    (dict(rope_scaling={**LLAMA3, "high_freq_factor": 1.0}), r"high_freq_factor=1.0 must be above low_freq_factor"),
    (dict(rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 32,
                        "original_max_position_embeddings": 64}),
     r"short_factor must be a list of 32 numbers > 0 \(one per rotated pair\)"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 8, "truncate": 1}),
     r"truncate=1 must be true or false"),
    (dict(rope_scaling=["linear", 2]), r"rope_scaling=\['linear', 2\] must be a table with a rope_type"),
    (dict(rope_scaling={"type": "linear", "factor": 2}), r"rope_scaling=.* needs rope_type \(one of linear, dynamic"),
    (dict(partial_rotary_factor=1.5), r"partial_rotary_factor=1.5 must be a number in \(0, 1\]"),
    (dict(partial_rotary_factor=0.3), r"head_dim=64 x partial_rotary_factor=0.3 = 19 must be even"),
    (dict(positional="learned", rope_scaling={"rope_type": "linear", "factor": 2}),
     r"rope_scaling=.* is read only by positional='rope', not positional='learned'"),
    (dict(positional="alibi", partial_rotary_factor=0.5),
     r"partial_rotary_factor=0.5 is read only by positional='rope', not positional='alibi'"),
    (dict(positional="rope", sinusoidal_layout="split"),
     r"sinusoidal_layout='split' is read only by positional='sinusoidal', not positional='rope'"),
])
def test_rotary_settings_that_cannot_run_are_refused_naming_them(changes, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**{"positional": "rope", **changes})


def test_vision_models_refuse_rotary_settings():
    with pytest.raises(ConfigError, match=r"rope_scaling=.* is a field of the .* families; architecture='vision'"):
        ModelConfig(architecture="vision", rope_scaling={"rope_type": "linear", "factor": 2.0})
