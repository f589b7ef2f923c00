"""Hugging Face files without ``transformers``: a tformer model saved in HF's format and loaded
back computes exactly what it computed before, for every activation GPT-2's config can name, so
a field read with another meaning (the exact GELU taken for its tanh approximation) shows."""

import pytest
import torch

import tformer


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
