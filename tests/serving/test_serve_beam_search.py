"""Beam search in the engine: a request's beams decode in the running batch beside other requests, each beam taking
over its parent's keys and values as the search goes; the answer is ``generate``'s with the same ``num_beams``."""

import pytest
import torch
from serving_models import alone, small_model

from tformer.generation import GenerationConfig, GenerationError
from tformer.serving import Engine

END = 60  # a token the progressions never hold: an end only a poorly trained step would choose


@pytest.fixture(scope="module")
def counter():
    """A decoder trained for 60 steps on arithmetic progressions modulo 60 (a start, then a stride of 1 to 5):
    unsure enough that beam search and greedy decoding part ways and beams change places, its answers depending on
    the prompt."""
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    model.train()
    for _ in range(60):
        starts = torch.randint(0, 60, (32, 1), generator=generator)
        strides = torch.randint(1, 6, (32, 1), generator=generator)
        rows = (starts + strides * torch.arange(20)) % 60  # (32, 20)
        loss = model(rows, labels=rows).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def prompts(count, seed):
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, 60, (count,), generator=generator).tolist()
    strides = torch.randint(1, 6, (count,), generator=generator).tolist()
    lengths = torch.randint(5, 10, (count,), generator=generator).tolist()
    return [[(start + stride * step) % 60 for step in range(length)]
            for start, stride, length in zip(starts, strides, lengths, strict=True)]


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["beams-share-the-prompt", "beams-prefill-each"])
def test_beam_searches_beside_other_requests_equal_generates(counter, prefix_caching):
    engine = Engine(counter, cache_tokens=2048, block_size=4, max_running=24, prefix_caching=prefix_caching)
    beam = GenerationConfig(max_new_tokens=10, num_beams=4, eos_token_id=END, length_penalty=1.2)
    endless = GenerationConfig(max_new_tokens=10, num_beams=3, eos_token_id=())
    greedy = GenerationConfig(max_new_tokens=10, eos_token_id=END)
    sampled = GenerationConfig(max_new_tokens=10, eos_token_id=END, do_sample=True, seed=5)
    texts = prompts(8, seed=2)
    configs = [beam, greedy, endless, sampled, beam, endless, greedy, beam]
    requests = [engine.submit(prompt, config) for prompt, config in zip(texts, configs, strict=True)]
    engine.run_until_idle()
    for prompt, config, request in zip(texts, configs, requests, strict=True):
        assert request.outputs()[0] == alone(counter, prompt, config)
    differ = [request.outputs()[0] != alone(counter, prompt, greedy)
              for prompt, config, request in zip(texts, configs, requests, strict=True) if config.num_beams > 1]
    assert sum(differ) >= 2  # the beams matter
    assert engine.pool.blocks_in_use == 0 and engine.pool.reserved == 0


def test_what_a_beam_search_request_cannot_have_is_refused_by_name(counter):
    engine = Engine(counter, cache_tokens=256)
    beam = GenerationConfig(max_new_tokens=4, num_beams=3)
    with pytest.raises(GenerationError, match=r"n=2 with num_beams > 1: a beam search hands out its best"):
        engine.submit([1, 2, 3], beam, n=2)
    with pytest.raises(GenerationError, match=r"logprobs with num_beams > 1"):
        engine.submit([1, 2, 3], beam, logprobs=2)
    performer = Engine(small_model(attention_kernel="performer", performer_features=16), cache_tokens=256)
    with pytest.raises(GenerationError, match=r"num_beams > 1: a beam taking over another's tokens would need its "
                                              r"running sums"):
        performer.submit([1, 2, 3], beam)


def test_a_cancelled_beam_search_ends_with_one_event_and_frees_its_beams(counter):
    engine = Engine(counter, cache_tokens=512, block_size=4)
    events = []
    request = engine.submit(prompts(1, seed=4)[0], GenerationConfig(max_new_tokens=10, num_beams=3, eos_token_id=()),
                            on_event=events.append)
    engine.step()
    engine.step()
    engine.cancel(request.id)
    engine.run_until_idle()
    assert [(event.index, event.token_id, event.finish_reason) for event in events] == [(0, -1, "cancelled")]
    assert request.done.is_set() and engine.pool.blocks_in_use == 0 and engine.pool.reserved == 0
