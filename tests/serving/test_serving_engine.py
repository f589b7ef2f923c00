"""Continuous batching over the paged cache: each request among many decodes exactly what
``tformer.generate`` decodes for it alone, the pool returns to empty, and a full pool, a cancelled
request or a bad one never corrupts the others."""

import pytest
import torch
from serving_models import VOCAB, alone, small_model

import tformer
from tformer.generation import GenerationConfig, GenerationError
from tformer.nn.attention.paged import PagedLayout
from tformer.serving import Engine
from tformer.serving.block_pool import BlockPool, BlockTable
from tformer.tokenizers import CharTokenizer


def prompts_of_lengths(lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (length,), generator=generator).tolist() for length in lengths]


LENGTHS = [1, 17, 3, 40, 8, 5, 29, 2, 11, 33, 6, 16, 4, 23, 9, 31]


@pytest.mark.parametrize("overrides", [
    dict(positional="learned"),
    dict(positional="rope", num_kv_heads=2, norm="rmsnorm", activation="swiglu", bias=False),
    dict(positional="sinusoidal", norm_position="post"),
    dict(positional="learned", d_model=384, num_heads=6),  # projections large enough for the W @ x.T path
    dict(positional="rope", partial_rotary_factor=0.5, bias=False, attention_bias=True, output_bias=False,
         rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
], ids=["gpt2-like", "llama-like-gqa", "post-norm-sinusoidal", "wide", "qwen2-like-yarn-partial"])
def test_sixteen_concurrent_greedy_requests_equal_each_alone(overrides):
    model = small_model(**overrides)
    prompts = prompts_of_lengths(LENGTHS)
    config = GenerationConfig(max_new_tokens=20, eos_token_id=())
    engine = Engine(model, cache_tokens=1024, block_size=8, max_running=16)
    requests = engine.complete(prompts, config)
    for prompt, request in zip(prompts, requests, strict=True):
        assert request.outputs()[0] == alone(model, prompt, config)
        assert request.finish_reasons() == ["length"]
    assert engine.pool.blocks_in_use == 0 and engine.pool.reserved == 0
    # All 16 ran together: one prefill step, then one step per further token.
    assert engine.stats.steps == 20


def test_requests_joining_a_running_batch_equal_each_alone():
    """Later requests are prefilled in the same steps as earlier ones decode."""
    model = small_model(positional="rope")
    prompts = prompts_of_lengths([5, 12, 7, 30, 1, 9])
    config = GenerationConfig(max_new_tokens=12, eos_token_id=())
    engine = Engine(model, cache_tokens=1024, block_size=4)
    requests = []
    for prompt in prompts:
        requests.append(engine.submit(prompt, config))
        engine.step()
        engine.step()
    engine.run_until_idle()
    for prompt, request in zip(prompts, requests, strict=True):
        assert request.outputs()[0] == alone(model, prompt, config)
    assert engine.pool.blocks_in_use == 0


def paged_step(model, engine, tables, new, state_slots):
    """One step of the engine's model over ``tables``, whose sequences add the tokens ``new`` (their rows of a
    running-state layer: ``state_slots``)."""
    for table, tokens in zip(tables, new, strict=True):
        table.append_slots(len(tokens))
    layout = PagedLayout.build(tables, [len(tokens) for tokens in new], engine.device, state_slots=state_slots)
    ids = torch.tensor([[token for tokens in new for token in tokens]])
    return model.step(ids, layout, engine.caches)[0]  # (sequences, V)


@pytest.mark.parametrize("overrides", [
    dict(positional="rope", num_kv_heads=2), dict(positional="alibi"), dict(positional="relative", num_kv_heads=1),
    dict(attention_kernel="chunked"), dict(attention_kernel="sliding_window", attention_window=4),
    dict(attention_kernel="performer", performer_features=16),
], ids=["rope-gqa", "alibi", "relative-mqa", "chunked", "sliding-window", "performer"])
def test_a_step_mixing_prefills_and_decodes_gives_the_models_logits(overrides):
    model = small_model(**overrides)
    engine = Engine(model, cache_tokens=512, block_size=4)
    sequences = prompts_of_lengths([6, 9, 3], seed=1)
    tables = [BlockTable(engine.pool, 8) for _ in sequences]
    assert engine.pool.reserve(24)
    with torch.inference_mode():
        for slot, (table, tokens) in enumerate(zip(tables[:2], sequences[:2], strict=True)):  # two already cached
            paged_step(model, engine, [table], [tokens[:-1]], [slot])
        new = [[sequences[0][-1]], [sequences[1][-1]], sequences[2]]  # two decode one token, one prefills
        logits = paged_step(model, engine, tables, new, [0, 1, 2])
        for row, tokens in enumerate(sequences):
            expected = model(torch.tensor([tokens])).logits[0, -1]
            torch.testing.assert_close(logits[row], expected, atol=1e-5, rtol=1e-5)


def test_seeded_sampling_draws_what_generate_draws():
    model = small_model()
    prompts = prompts_of_lengths([4, 10, 7], seed=2)
    configs = [GenerationConfig(max_new_tokens=15, eos_token_id=(), temperature=0.8, top_k=20, seed=seed)
               for seed in (1, 2, 3)]
    engine = Engine(model, cache_tokens=1024)
    requests = [engine.submit(prompt, config) for prompt, config in zip(prompts, configs, strict=True)]
    engine.run_until_idle()
    for prompt, config, request in zip(prompts, configs, requests, strict=True):
        assert request.outputs()[0] == alone(model, prompt, config)


def test_n_sequences_of_one_request_differ_and_each_is_reproducible():
    model = small_model()
    config = GenerationConfig(max_new_tokens=12, eos_token_id=(), do_sample=True, seed=7)
    engine = Engine(model, cache_tokens=1024)
    (first,) = engine.complete([[1, 2, 3]], config, n=3)
    (again,) = engine.complete([[1, 2, 3]], config, n=3)
    assert first.outputs() == again.outputs()
    assert len({tuple(output) for output in first.outputs()}) == 3
    assert first.outputs()[0] == alone(model, [1, 2, 3], config)


def test_end_ids_and_stop_strings_finish_a_sequence_and_stay_out_of_the_text():
    tokenizer = CharTokenizer.train("abcdefgh ")
    model = small_model(vocab_size=tokenizer.vocab_size)
    prompt = tokenizer.encode("ab")
    free = alone(model, prompt, GenerationConfig(max_new_tokens=20, eos_token_id=()))
    free_text = tokenizer.decode(free)
    stop = free_text[5:7]
    engine = Engine(model, tokenizer, cache_tokens=512)
    events = []
    request = engine.submit(prompt, GenerationConfig(max_new_tokens=20, eos_token_id=(), stop_strings=(stop,)),
                            on_event=events.append)
    engine.run_until_idle()
    text = request.texts()[0]
    assert text == free_text[: free_text.index(stop)] and request.finish_reasons() == ["stop"]
    assert "".join(event.text for event in events) == text
    assert events[-1].finish_reason == "stop" and all(event.finish_reason is None for event in events[:-1])
    # An end id: kept in the ids, not in the text.
    end = free[3]
    (ended,) = engine.complete([prompt], GenerationConfig(max_new_tokens=20, eos_token_id=end))
    assert ended.outputs()[0] == free[: free.index(end) + 1] and ended.finish_reasons() == ["stop"]
    assert ended.texts()[0] == tokenizer.decode(free[: free.index(end)])
    assert engine.pool.blocks_in_use == 0


def test_logprobs_are_the_models_log_softmax():
    model = small_model()
    prompt = [3, 1, 4, 1, 5]
    engine = Engine(model, cache_tokens=512)
    events = []
    engine.submit(prompt, GenerationConfig(max_new_tokens=3, eos_token_id=()), logprobs=2, on_event=events.append)
    engine.run_until_idle()
    ids = list(prompt)
    for event in events:
        with torch.no_grad():
            expected = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], -1)
        assert event.logprob == pytest.approx(float(expected[event.token_id]), abs=1e-4)
        assert [token for token, _ in event.top_logprobs] == expected.topk(2).indices.tolist()
        ids.append(event.token_id)


def test_prompt_logprobs_are_the_models_log_softmax_of_every_prompt_row():
    """Prompts scored in a step where another request decodes: each prompt token's log-probability and its top
    k are log_softmax of the model's own forward over the prompt, handed out once, on each sequence's first
    event; with max_new_tokens=0 a request finishes after its prefill without a token, its blocks released."""
    model = small_model(positional="rope", num_kv_heads=2)
    engine = Engine(model, cache_tokens=1024, block_size=4)
    config = GenerationConfig(max_new_tokens=6, eos_token_id=())
    running = engine.submit([5, 6, 7], config)
    engine.step()
    prompts = prompts_of_lengths([9, 1, 14, 6], seed=6)
    shapes = [(0, 1), (2, 1), (0, 2), (1, 3)]  # (max_new_tokens, n)
    events = []
    requests = [engine.submit(prompt, GenerationConfig(max_new_tokens=new, eos_token_id=()), n=n, logprobs=2,
                              prompt_logprobs=3, on_event=events.append)
                for prompt, (new, n) in zip(prompts, shapes, strict=True)]
    engine.run_until_idle()
    assert running.outputs()[0] == alone(model, [5, 6, 7], config)
    for prompt, (new, n), request in zip(prompts, shapes, requests, strict=True):
        with torch.no_grad():
            expected = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), -1)[:-1]  # (T - 1, V)
        for index in range(n):
            own = [event for event in events if event.request is request and event.index == index]
            assert [event.prompt_logprobs is not None for event in own] == [True] + [False] * (len(own) - 1)
            scores = own[0].prompt_logprobs
            targets = torch.tensor(prompt[1:], dtype=torch.long)
            torch.testing.assert_close(torch.tensor(scores.token_logprobs), expected.gather(1, targets[:, None])[:, 0],
                                       atol=1e-5, rtol=0)
            assert [[token for token, _ in top] for top in scores.top_logprobs] == expected.topk(3).indices.tolist()
            if new == 0:
                assert [(event.token_id, event.finish_reason) for event in own] == [(-1, "length")]
        assert [len(output) for output in request.outputs()] == [new] * n
        assert request.finish_reasons() == ["length"] * n
    assert engine.pool.blocks_in_use == 0 and engine.pool.reserved == 0
    assert engine.stats.generated_tokens == 6 + 2 + 1 * 3


def test_a_full_pool_makes_requests_wait_and_never_corrupts_running_ones():
    model = small_model()
    prompts = prompts_of_lengths([10, 10, 10, 10], seed=3)
    config = GenerationConfig(max_new_tokens=14, eos_token_id=())
    engine = Engine(model, cache_tokens=48, block_size=8)  # 6 blocks: room for 2 of these requests at a time
    held = []  # blocks in use at every event
    requests = [engine.submit(prompt, config, on_event=lambda _: held.append(engine.pool.blocks_in_use))
                for prompt in prompts]
    engine.step()
    assert engine.running == 2 and engine.queue_length == 2
    engine.run_until_idle()
    assert max(held) <= 6
    for prompt, request in zip(prompts, requests, strict=True):
        assert request.outputs()[0] == alone(model, prompt, config)
    assert engine.pool.blocks_in_use == 0 and engine.pool.reserved == 0


def test_a_request_waiting_past_the_queue_timeout_finishes_with_timeout():
    model = small_model()
    engine = Engine(model, cache_tokens=24, block_size=8, queue_timeout=0.0)
    config = GenerationConfig(max_new_tokens=12, eos_token_id=())
    first = engine.submit([1] * 10, config)
    engine.step()
    late = engine.submit([2] * 10, config)
    engine.run_until_idle()
    assert first.finish_reasons() == ["length"] and late.finish_reasons() == ["timeout"]
    assert late.outputs() == [[]] and engine.stats.requests_timed_out == 1


def test_a_cancelled_request_frees_its_blocks_and_the_others_go_on():
    model = small_model()
    prompts = prompts_of_lengths([6, 14, 9], seed=4)
    config = GenerationConfig(max_new_tokens=16, eos_token_id=())
    engine = Engine(model, cache_tokens=1024, block_size=4)
    requests = [engine.submit(prompt, config) for prompt in prompts]
    for _ in range(5):
        engine.step()
    held = engine.pool.blocks_in_use
    engine.cancel(requests[1].id)
    engine.step()
    assert engine.pool.blocks_in_use < held and requests[1].done.is_set()
    engine.run_until_idle()
    assert requests[1].finish_reasons() == ["cancelled"] and len(requests[1].outputs()[0]) == 5
    for index in (0, 2):
        assert requests[index].outputs()[0] == alone(model, prompts[index], config)
    assert engine.pool.blocks_in_use == 0 and engine.pool.reserved == 0


def test_blocks_held_follow_the_tokens_stored():
    model = small_model()
    engine = Engine(model, cache_tokens=2048, block_size=8)
    lengths = [3, 30, 12, 45, 7, 21]
    for prompt in prompts_of_lengths(lengths, seed=5):
        engine.submit(prompt, GenerationConfig(max_new_tokens=40, eos_token_id=()))
    for _ in range(10):
        engine.step()
    stored = sum(length + 10 - 1 for length in lengths)  # the 10th token is not cached yet
    held = engine.pool.blocks_in_use * engine.pool.block_size
    assert stored <= held < stored + len(lengths) * engine.pool.block_size


def test_requests_the_engine_cannot_serve_are_refused_by_name():
    with pytest.raises(GenerationError, match="rope_type='dynamic' turns each position by the longest position of "
                                              "its batch"):
        Engine(small_model(positional="rope", rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    engine = Engine(small_model(), cache_tokens=64, block_size=8)
    refusals = [
        (dict(prompt_ids=[]), "no tokens"),
        (dict(prompt_ids=[VOCAB]), "outside the vocabulary"),
        (dict(prompt_ids=[1] * 90, config=GenerationConfig(max_new_tokens=10)), "context of 96"),
        (dict(prompt_ids=[1] * 60, config=GenerationConfig(max_new_tokens=10)), "the pool holds 8"),
        (dict(prompt_ids=[1], config=GenerationConfig(stop_strings="x")), "need a tokenizer"),
        (dict(prompt_ids=[1], n=0), "n=0"),
        (dict(prompt_ids=[1], config=GenerationConfig(max_new_tokens=0)), "max_new_tokens=0 .* with prompt_logprobs"),
        (dict(prompt_ids=[1], prompt_logprobs=VOCAB + 1), "prompt_logprobs=62 must be an integer in"),
    ]
    for arguments, message in refusals:
        with pytest.raises(GenerationError, match=message):
            engine.submit(**arguments)
    assert engine.queue_length == 0
    engine.stop_admitting()
    with pytest.raises(GenerationError, match="shutting down"):
        engine.submit([1])


def test_the_pool_hands_out_only_what_it_promised():
    pool = BlockPool(4, 2, num_layers=1, num_kv_heads=1, head_dim=2)
    assert pool.reserve(3) and not pool.reserve(2)
    table = BlockTable(pool, 3)
    assert table.append_slots(5).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="past its reservation"):
        table.append_slots(2)
    table.release()
    assert pool.blocks_in_use == 0 and pool.available == 4


def test_requests_with_every_option_equal_generate_alone():
    """Whatever GenerationConfig offers that the engine honours (GENERATION_FIELDS), eighteen requests at once,
    each with its own options, decode the ids generate decodes for each alone, and stop for the same reason."""
    tokenizer = CharTokenizer.train("abcdefghij ")
    model = small_model(vocab_size=tokenizer.vocab_size, forced_eos_token_id=4)  # the model config's forced end
    prompts = [tokenizer.encode(text) for text in ("ab", "c", "j h", "dd", "e", "fgh ", "a b", "i", "bb", "c d",
                                                    "jj", "g", "h i", "aa", "e f", "d", "abab", "jiji")]
    free = [alone(model, prompt, GenerationConfig(max_new_tokens=12, eos_token_id=())) for prompt in prompts]
    options = [
        dict(), dict(eos_token_id=()), dict(forced_eos_token_id=False), dict(forced_eos_token_id=7),
        dict(min_new_tokens=5, eos_token_id=free[4][1]), dict(eos_token_id=(free[5][2], 9)),
        dict(stop_strings=(tokenizer.decode(free[6][3:5]),)), dict(stop_strings=("zz", tokenizer.decode(free[7][2:3]))),
        dict(temperature=0.7, seed=3), dict(do_sample=True, top_k=3, seed=4), dict(top_p=0.8, seed=5),
        dict(temperature=0.0, suppress_tokens=tuple(free[11][:2])),
        dict(max_new_tokens=3, begin_suppress_tokens=(free[12][0],)), dict(min_new_tokens=12, eos_token_id=free[13][0]),
        dict(do_sample=True, temperature=1.3, top_k=5, top_p=0.9, min_p=0.1, seed=9, min_new_tokens=2),
        dict(max_new_tokens=1), dict(repetition_penalty=1.5), dict(repetition_penalty=0.7, temperature=0.8, seed=2),
    ]
    configs = [GenerationConfig(**{"max_new_tokens": 12, **option}) for option in options]
    engine = Engine(model, tokenizer, cache_tokens=2048, block_size=4, max_running=18)
    requests = [engine.submit(prompt, config) for prompt, config in zip(prompts, configs, strict=True)]
    engine.run_until_idle()
    for prompt, config, request in zip(prompts, configs, requests, strict=True):
        output = tformer.generate(model, torch.tensor([prompt]), generation_config=config, tokenizer=tokenizer,
                                  return_dict=True)
        expected = output.new_tokens[0].tolist()
        ended = config.end_ids(model.config)
        if ended and any(token in ended for token in expected):  # generate pads after the end; the server stops
            expected = expected[: next(i for i, t in enumerate(expected) if t in ended) + 1]
        assert request.outputs()[0] == expected, config
    assert engine.stats.steps == 12 and engine.pool.blocks_in_use == 0
    assert requests[16].outputs()[0] != free[16][:len(requests[16].outputs()[0])]  # the penalty bites
    # The forced end: the model config's (4) unless a request sets its own (7) or none (False).
    assert [requests[index].outputs()[0][-1] for index in (0, 1, 2, 3)] == [4, 4, 2, 7]


def test_every_option_the_engine_does_not_honour_is_refused_by_name():
    from dataclasses import fields

    from tformer.serving.engine import GENERATION_FIELDS

    engine = Engine(small_model(), cache_tokens=64, block_size=8)
    unusual = {"pad_token_id": 3, "num_return_sequences": 2, "num_draft_tokens": 2, "output_scores": True,
               "return_dict": True, "use_cache": False, "cache_implementation": "static"}
    refused = {name for name, reason in GENERATION_FIELDS.items() if reason is not None}
    assert refused == set(unusual) and set(GENERATION_FIELDS) == {f.name for f in fields(GenerationConfig)}
    for name, value in unusual.items():
        config = GenerationConfig(**({"num_beams": 2} if name == "num_return_sequences" else {}), **{name: value})
        with pytest.raises(GenerationError, match=f"{name}=.* is not supported by the server"):
            engine.submit([1], config)
    with pytest.raises(GenerationError, match="decoder_prompt_ids are an encoder-decoder.s"):  # a decoder: its prompt
        engine.submit([1], GenerationConfig(decoder_prompt_ids=(1,)))
