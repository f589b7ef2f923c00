"""Encoder-decoders in the engine: a request's prompt is the source; the engine encodes the sources of the
sequences a step starts, keeps each one's cross-attention keys in its row, and decodes every sequence in one
batch: each output equals ``generate`` on its source alone."""

import pytest
import torch
from serving_models import alone, assert_two_waves_decode_as_generate

import tformer
from tformer.generation import GenerationConfig, GenerationError
from tformer.serving import Engine

VOCAB = 53
END = 2  # the presets' end token
SOURCE_LENGTHS = [7, 1, 12, 3, 9, 15, 4, 6, 11, 2]


def translator(**overrides):
    settings = dict(vocab_size=VOCAB, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_seq_len=48, dropout=0.0)
    settings.update(overrides)
    torch.manual_seed(0)
    model = tformer.build_model("transformer-multi30k", **settings).eval()
    return model


def sources(lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (length,), generator=generator).tolist() for length in lengths]


@pytest.mark.parametrize("overrides", [
    dict(),
    dict(positional="relative", norm="rmsnorm", norm_position="pre", bias=False, scale_embeddings=False,
         num_kv_heads=2),
], ids=["2017-model", "t5-like-gqa"])
def test_concurrent_sources_decode_as_each_alone(overrides):
    model = translator(**overrides)
    config = GenerationConfig(max_new_tokens=10, eos_token_id=())
    engine = Engine(model, cache_tokens=512, block_size=4, max_running=8)
    assert not engine.prefix_caching  # a decoder's prefix means nothing without its source
    assert_two_waves_decode_as_generate(model, engine, sources(SOURCE_LENGTHS[:6]),
                                        sources(SOURCE_LENGTHS[6:], seed=1), config, steps_between=3)
    assert engine.pool.blocks_in_use == 0 and sorted(engine.scheduler.free_states) == list(range(8))


def test_a_row_taken_over_by_a_later_source_reads_that_source():
    model = translator()
    engine = Engine(model, cache_tokens=512, block_size=4, max_running=1)  # one row, each source in turn
    config = GenerationConfig(max_new_tokens=5, eos_token_id=())
    assert_two_waves_decode_as_generate(model, engine, sources([6, 3, 9], seed=5), [], config, steps_between=0)


def test_sampled_sequences_of_one_source_each_draw_as_generate_would():
    model = translator()
    config = GenerationConfig(max_new_tokens=8, eos_token_id=(), do_sample=True, temperature=1.5, seed=4)
    engine = Engine(model, cache_tokens=512, block_size=4)
    (request,) = engine.complete([sources([6])[0]], config, n=3)
    assert request.outputs()[0] == alone(model, sources([6])[0], config)
    assert len({tuple(output) for output in request.outputs()}) == 3


def test_what_an_encoder_decoder_cannot_do_is_refused_by_name():
    model = translator()
    engine = Engine(model, cache_tokens=256)
    with pytest.raises(GenerationError, match=r"prompt_logprobs score a decoder's prompt"):
        engine.submit([5, 6, 7], GenerationConfig(max_new_tokens=2), prompt_logprobs=1)
    with pytest.raises(GenerationError, match=r"the source \(49 tokens\) exceeds the model's 48 positions"):
        engine.submit([5] * 49, GenerationConfig(max_new_tokens=2))
    with pytest.raises(GenerationError, match=r"prefix_caching=True cannot be honoured: a layer keeps CrossAttention"):
        Engine(model, cache_tokens=256, prefix_caching=True)


@pytest.fixture(scope="module")
def reverser():
    """A translator trained for 60 steps to write its source backwards: unsure enough that beam search and greedy
    decoding part ways, and its answers depend on the source and end with the end token."""
    torch.manual_seed(0)
    model = translator()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    for _ in range(60):
        lengths = torch.randint(2, 9, (32,), generator=generator).tolist()
        source = torch.zeros(32, max(lengths) + 1, dtype=torch.long)
        target = torch.full_like(source, -100)
        for row, length in enumerate(lengths):
            tokens = torch.randint(3, VOCAB, (length,), generator=generator)
            source[row, : length + 1] = torch.cat([tokens, torch.tensor([END])])
            target[row, : length + 1] = torch.cat([tokens.flip(0), torch.tensor([END])])
        loss = model(source, attention_mask=(source > 0).long(), labels=target).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.mark.parametrize("beams", [2, 4])
def test_beam_searches_beside_greedy_requests_equal_generates(reverser, beams):
    engine = Engine(reverser, cache_tokens=1024, block_size=4, max_running=16)
    beam = GenerationConfig(max_new_tokens=12, num_beams=beams, length_penalty=0.8)
    endless = GenerationConfig(max_new_tokens=12, num_beams=beams, eos_token_id=())  # beams change places to the end
    greedy = GenerationConfig(max_new_tokens=12)
    texts = [source + [END] for source in sources([5, 9, 2, 12, 7, 4, 6], seed=3)]
    configs = [beam, greedy, endless, beam, greedy, endless, beam]
    requests = [engine.submit(source, config) for source, config in zip(texts, configs, strict=True)]
    engine.step()
    # a request's beams read one row of the encoder's keys, stored once: a row per running request
    running = {request.id: request for request, _ in engine.scheduler.running}
    assert any(request.config.num_beams > 1 for request in running.values())
    assert all(len({beam.state_slot for beam in request.sequences}) == 1 for request in running.values())
    assert len(engine.scheduler.free_states) == 16 - len(running)
    assert sum(length > 0 for length in engine.caches[0].cross_attention.lengths) == len(running)
    engine.run_until_idle()
    assert sorted(engine.scheduler.free_states) == list(range(16))  # every row back, once
    for source, config, request in zip(texts, configs, requests, strict=True):
        assert request.outputs()[0] == alone(reverser, source, config)
        ends = "stop" if config.eos_token_id is None else "length"  # the model's end token, or none to end at
        assert request.finish_reasons() == [ends] * config.num_beams
    differ = [request.outputs()[0] != alone(reverser, source, greedy)
              for source, config, request in zip(texts, configs, requests, strict=True) if config.num_beams > 1]
    assert sum(differ) >= 2  # the beams matter
    assert engine.pool.blocks_in_use == 0 and engine.pool.reserved == 0
