"""Each RoPE scaling type's inverse frequencies and attention factor equal transformers'
``ROPE_INIT_FUNCTIONS`` below and beyond the original context, and partial rotation equals Phi-3's."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb  # noqa: E402

from tformer.nn.positions import ROPE_SCALINGS, RotaryEmbedding, apply_rotary, rotary_dimensions  # noqa: E402

pytestmark = pytest.mark.slow  # compares with transformers

HEAD_DIM, MAX_POSITIONS, ORIGINAL, THETA = 24, 256, 64, 50000.0
CASES = {
    "linear": {"rope_type": "linear", "factor": 2.5},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "yarn-factor-from-lengths": {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": ORIGINAL},
    "yarn-deepseek": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": ORIGINAL,
                      "mscale": 1.0, "mscale_all_dim": 0.707, "beta_fast": 16, "beta_slow": 2, "truncate": False},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIGINAL,
                              "attention_factor": 1.3},
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": ORIGINAL,
                 "short_factor": [1.0 + 0.05 * i for i in range(12)],
                 "long_factor": [1.0 + 0.4 * i for i in range(12)]},
    "longrope-factor": {"rope_type": "longrope", "original_max_position_embeddings": ORIGINAL, "factor": 16.0,
                        "short_factor": [1.0] * 12, "long_factor": [2.0 + i for i in range(12)]},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIGINAL},
}
# Each case on whole heads, and the types whose keys do not count the rotated pairs on half of each head too.
SHARES = [(case, 1.0) for case in CASES] + [(case, 0.5) for case in ("linear", "dynamic", "yarn", "llama3")]


def hf_config(parameters: dict, partial: float) -> LlamaConfig:
    rope = {**parameters, "rope_theta": THETA}
    if partial != 1.0:
        rope["partial_rotary_factor"] = partial
    return LlamaConfig(hidden_size=96, num_attention_heads=4, head_dim=HEAD_DIM, max_position_embeddings=MAX_POSITIONS,
                       rope_parameters=rope)


@pytest.mark.parametrize("case, partial", SHARES, ids=[f"{case}-{share}" for case, share in SHARES])
@pytest.mark.parametrize("seq_len", [10, ORIGINAL, ORIGINAL + 1, MAX_POSITIONS + 40])
def test_frequencies_and_attention_factor_equal_transformers(case, partial, seq_len):
    parameters = CASES[case]
    rope_type = parameters["rope_type"]
    # HF's forward hands its maximum position over as a tensor; its init (and tformer's build) hands none
    theirs, their_factor = ROPE_INIT_FUNCTIONS[rope_type](hf_config(parameters, partial), "cpu",
                                                          seq_len=torch.tensor(seq_len))
    scaling = ROPE_SCALINGS[rope_type](parameters, rotary_dimensions(HEAD_DIM, partial), THETA, MAX_POSITIONS)
    ours, our_factor = scaling.frequencies(seq_len)
    if rope_type == "dynamic" and seq_len <= MAX_POSITIONS:  # HF keeps its built frequencies inside max positions
        theirs, their_factor = ROPE_INIT_FUNCTIONS[rope_type](hf_config(parameters, partial), "cpu")
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    assert our_factor == pytest.approx(their_factor, rel=1e-12)


@pytest.mark.parametrize("case", CASES)
def test_cos_and_sin_equal_hugging_faces_rotary_module_over_a_growing_pass(case):
    """HF's rotary module (with its dynamic and LongRoPE updates) and tformer's, for passes whose longest
    position grows past the original context and past max positions, as decoding grows."""
    parameters = CASES[case]
    config = hf_config(parameters, 1.0)
    theirs = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    ours = RotaryEmbedding(HEAD_DIM, THETA, scaling=parameters, max_seq_len=MAX_POSITIONS)
    for end in (12, ORIGINAL + 3, MAX_POSITIONS + 9):
        positions = torch.arange(end - 8, end)[None].expand(2, 8)
        their_cos, their_sin = theirs(torch.zeros(1, dtype=torch.float32), positions)
        our_cos, our_sin = ours(positions)
        torch.testing.assert_close(our_cos[:, 0], their_cos, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(our_sin[:, 0], their_sin, rtol=1e-6, atol=1e-6)


def test_partial_rotation_equals_phi3s():
    rope = RotaryEmbedding(HEAD_DIM, THETA, rotary_dim=rotary_dimensions(HEAD_DIM, 0.5))
    cos, sin = rope(torch.arange(7)[None])
    q, k = torch.randn(1, 3, 7, HEAD_DIM), torch.randn(1, 3, 7, HEAD_DIM)
    their_q, their_k = apply_rotary_pos_emb(q, k, cos[:, 0], sin[:, 0])
    torch.testing.assert_close(apply_rotary(q, cos, sin), their_q, rtol=0, atol=0)
    torch.testing.assert_close(apply_rotary(k, cos, sin), their_k, rtol=0, atol=0)
