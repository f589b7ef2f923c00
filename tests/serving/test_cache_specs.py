"""Each layer declares the cache it keeps, and the engine allocates from the declarations: a block pool for the
layers that store keys per token, a row per running sequence for Performer's running sums; outputs equal
``generate``'s whatever the mix."""

import random

import pytest
import torch
from serving_models import VOCAB, alone, assert_two_waves_decode_as_generate, small_model

import tformer
from tformer.generation import GenerationConfig, GenerationError
from tformer.nn.attention.cache_spec import CrossAttention, FullAttention, RunningSums, SlidingWindow
from tformer.serving import Engine

LENGTHS = [1, 17, 3, 40, 8, 5, 29, 2, 11, 33, 6, 16, 4, 23, 9, 31]
PERFORMER = dict(attention_kernel="performer", performer_features=16)


def prompts(lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (length,), generator=generator).tolist() for length in lengths]


def test_each_layer_declares_the_cache_its_kernel_keeps():
    model = small_model(num_layers=3, num_kv_heads=2, layer_attention_windows=[4, 0, 4], **PERFORMER)
    specs = model.cache_specs()
    assert [layer.self_attention for layer in specs] == [SlidingWindow(2, 12, 4), RunningSums(2, 12, 16),
                                                        SlidingWindow(2, 12, 4)]
    assert all(layer.cross_attention is None for layer in specs)
    assert specs[0].self_attention.bytes_per_token(torch.bfloat16) == 2 * 2 * 12 * 2
    assert specs[1].self_attention.bytes_per_token(torch.float32) == 0  # nothing per token
    assert specs[1].self_attention.bytes_per_sequence(torch.bfloat16) == 2 * (16 * 13 + 2) * 4  # kept in float32
    plain = small_model(num_kv_heads=1).cache_specs()
    assert [layer.self_attention for layer in plain] == [FullAttention(1, 12)] * 2


def test_an_encoder_decoders_cross_attention_declares_the_encoders_keys():
    model = tformer.build_model("transformer-multi30k", vocab_size=50, d_model=32, num_heads=2, num_layers=2,
                                d_ff=64, max_seq_len=32)
    specs = model.cache_specs()
    assert len(specs) == 2
    assert all(layer.self_attention == FullAttention(2, 16) for layer in specs)
    assert all(layer.cross_attention == CrossAttention(2, 16) for layer in specs)
    assert not CrossAttention.paged


@pytest.mark.parametrize("overrides", [
    PERFORMER,
    dict(num_layers=3, layer_attention_windows=[4, 0, 0], **PERFORMER),
    dict(num_layers=3, num_kv_heads=2, positional="rope", layer_attention_windows=[4, 0, 4]),
], ids=["performer", "performer-and-sliding-window", "sliding-window-and-full"])
def test_sixteen_concurrent_requests_over_declared_caches_equal_each_alone(overrides):
    model = small_model(**overrides)
    config = GenerationConfig(max_new_tokens=12, eos_token_id=())
    engine = Engine(model, cache_tokens=1024, block_size=8, max_running=16)
    specs = [layer.self_attention for layer in model.cache_specs()]
    assert engine.pool.keys.shape[0] == sum(spec.paged for spec in specs)  # the pool holds per-token layers only
    assert_two_waves_decode_as_generate(model, engine, prompts(LENGTHS[:9]), prompts(LENGTHS[9:], seed=1), config,
                                        steps_between=5)
    assert engine.pool.blocks_in_use == 0 and engine.pool.reserved == 0
    keeps_states = any(not spec.paged for spec in specs)
    assert engine.scheduler.free_states is None if not keeps_states else \
        sorted(engine.scheduler.free_states) == list(range(16))  # every row back


def test_a_running_state_keeps_one_row_a_sequence_of_the_declared_size():
    model = small_model(**PERFORMER)
    engine = Engine(model, cache_tokens=64, block_size=8, max_running=5)
    spec = model.cache_specs()[0].self_attention
    state = engine.caches[0].self_attention
    assert sum(tensor.nbytes for tensor in (state.sums, state.level, state.raw_max)) == \
        5 * spec.bytes_per_sequence(torch.float32)


def test_a_running_state_shares_no_prefix():
    model = small_model(**PERFORMER)
    with pytest.raises(GenerationError, match=r"prefix_caching=True cannot be honoured: a layer keeps RunningSums"):
        Engine(model, cache_tokens=256, prefix_caching=True)
    engine = Engine(model, cache_tokens=256)
    assert not engine.prefix_caching  # the default: on only where every layer's cache is per token
    assert Engine(small_model(), cache_tokens=256).prefix_caching
    config = GenerationConfig(max_new_tokens=8, eos_token_id=(), do_sample=True, seed=3)
    (request,) = engine.complete([[5, 6, 7, 8]], config, n=3)  # each sequence prefills the prompt itself
    assert request.outputs()[0] == alone(model, [5, 6, 7, 8], config)
    assert len({tuple(output) for output in request.outputs()}) == 3
    assert engine.stats.prompt_tokens_computed == 3 * 4


def test_running_states_too_large_for_memory_are_refused_before_allocation():
    with pytest.raises(GenerationError, match=r"of running states\); .* is available on cpu"):
        Engine(small_model(**PERFORMER), cache_tokens=64, max_running=10**12)


def _engine_for(family: str) -> tuple[torch.nn.Module, Engine, tuple[int, ...]]:
    """A model of ``family``, an engine that must queue and evict, and the beam counts its requests may ask for."""
    if family == "encoder-decoder":  # a row of cross-attention keys per sequence
        torch.manual_seed(0)
        model = tformer.build_model("transformer-multi30k", vocab_size=VOCAB, d_model=32, num_heads=4, num_layers=2,
                                    d_ff=64, max_seq_len=48, dropout=0.0).eval()
        return model, Engine(model, cache_tokens=160, block_size=4, max_running=8), (2, 3)
    model = small_model(num_layers=3, layer_attention_windows=[4, 0, 0], **PERFORMER)  # running sums beside blocks
    return model, Engine(model, cache_tokens=160, block_size=4, max_running=8), ()


@pytest.mark.slow  # 500 requests, over 2 s
@pytest.mark.parametrize("family", ["performer-and-sliding-window", "encoder-decoder"])
def test_five_hundred_mixed_requests_with_cancellations_give_back_every_row_and_block(family):
    model, engine, beam_counts = _engine_for(family)
    rng = random.Random(0)
    requests = []
    for index in range(500):
        prompt = prompts([rng.randint(1, 12)], seed=index)[0]
        options = dict(max_new_tokens=rng.randint(1, 6), eos_token_id=())
        draw, n = rng.random(), rng.choice((1, 1, 2, 3))
        if draw < 0.3:
            options.update(do_sample=True, seed=index)
        elif draw < 0.5 and beam_counts:
            options.update(num_beams=rng.choice(beam_counts))
            n = 1
        requests.append(engine.submit(prompt, GenerationConfig(**options), n=n))
        if rng.random() < 0.2:  # one of the latest: waiting, starting or decoding
            engine.cancel(rng.choice(requests[-12:]).id)
        if rng.random() < 0.5:
            engine.step()
    engine.run_until_idle()
    assert all(request.done.is_set() for request in requests) and engine.stats.requests_cancelled > 40
    assert sorted(engine.scheduler.free_states) == list(range(8))  # every state or source row back
    assert engine.pool.blocks_in_use == 0 and engine.pool.reserved == 0
    assert engine.pool.available == engine.pool.num_blocks
    finished = [request for request in requests if request.finish_reasons()[0] == "length"
                and not request.config.do_sample]
    assert sum(request.config.num_beams > 1 for request in finished) >= 20 or not beam_counts
    for request in finished[::10]:  # a sample of the greedy and beam ones, checked against generate
        assert request.outputs()[0] == alone(model, request.prompt_ids if not model.encodes_prompt
                                             else request.source, request.config)
