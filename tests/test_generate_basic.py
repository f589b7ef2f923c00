"""The first ``generate``: greedy equals the argmax of a full forward; sampling is seeded."""

import pytest
import torch

import tformer


def greedy_without_cache(model, ids, steps):
    for _ in range(steps):
        ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi"])
def test_cached_greedy_equals_uncached_greedy(positional):
    model = tformer.build_model("gpt-nano", positional=positional).eval()
    prompt = torch.randint(0, 64, (2, 5))
    assert torch.equal(tformer.generate(model, prompt, 12), greedy_without_cache(model, prompt, 12))


def test_sampling_is_reproducible_with_a_seed():
    model = tformer.build_model("gpt-nano").eval()
    prompt = torch.randint(0, 64, (1, 3))
    a = tformer.generate(model, prompt, 20, temperature=1.5, seed=3)
    assert torch.equal(a, tformer.generate(model, prompt, 20, temperature=1.5, seed=3))
    assert not torch.equal(a, tformer.generate(model, prompt, 20, temperature=1.5, seed=4))


def test_top_k_one_is_greedy():
    model = tformer.build_model("gpt-nano").eval()
    prompt = torch.randint(0, 64, (1, 3))
    assert torch.equal(tformer.generate(model, prompt, 10, do_sample=True, top_k=1, seed=0),
                       tformer.generate(model, prompt, 10))


def test_generation_past_the_position_table_is_refused():
    model = tformer.build_model("gpt-nano")
    with pytest.raises(ValueError, match="exceeds max_seq_len=64"):
        tformer.generate(model, torch.zeros(1, 60, dtype=torch.long), 10)
