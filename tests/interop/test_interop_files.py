"""Hugging Face files without ``transformers``: a tformer model saved in HF's format and loaded
back computes exactly what it computed before, for every activation GPT-2's config can name, so
a field read with another meaning (the exact GELU taken for its tanh approximation) shows."""

import pytest
import torch

import tformer
from tformer.interop.rope import normalized_rope_scaling


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu", "silu"])
def test_gpt2_activations_survive_the_hf_round_trip_exactly(tmp_path, activation):
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", activation=activation, initializer_range=0.5).eval()
    model.save(tmp_path, format="hf")
    loaded = tformer.load(tmp_path)
    assert loaded.config.activation == activation
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_hugging_faces_rope_tables_are_normalised_on_the_way_in():
    assert normalized_rope_scaling({"type": "linear", "factor": 2}) == {"rope_type": "linear", "factor": 2}
    assert normalized_rope_scaling({"rope_type": "default"}) is None
    with pytest.raises(ValueError, match="names two types"):
        normalized_rope_scaling({"type": "linear", "rope_type": "yarn"})


def test_a_scaled_llama_round_trips_without_transformers(tmp_path):
    torch.manual_seed(0)
    model = tformer.build_model("llama-small", vocab_size=64, max_seq_len=64, d_model=32, num_layers=2, num_heads=4,
                                rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 16}).eval()
    model.save(tmp_path, format="hf")
    loaded = tformer.load(tmp_path)
    assert loaded.config == model.config
    ids = torch.randint(0, 64, (2, 40))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
