"""Prefix caching in the paged pool: a prompt that starts with blocks computed before reuses them and
decodes exactly what it decodes without them (and what ``tformer.generate`` decodes), a block is shared
only while full and read-only, evicted only when nobody holds it, and every reference comes back; a
request's ``n`` sequences prefill their prompt once."""

import random

import pytest
import torch
from serving_models import VOCAB, alone
from serving_models import small_model as engine_model

import tformer
from tformer.generation import GenerationConfig
from tformer.serving import Engine
from tformer.serving.block_pool import BlockPool, BlockTable, prefix_keys


def small_model(**overrides):
    """Weights large enough that greedy answers vary from token to token (a missing copy shows)."""
    return engine_model(**{"max_seq_len": 128, "initializer_range": 0.3, **overrides})


def random_ids(length, seed):
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def pool_is_consistent(engine):
    """Every block's reference count is the number of running tables holding it, the pool's reservation is
    what those tables have left, and no block is held while free or cached."""
    pool = engine.pool
    held = [0] * pool.num_blocks
    for _, sequence in engine.scheduler.running:
        for block in sequence.table.blocks:
            held[block] += 1
    assert held == [pool.references(block) for block in range(pool.num_blocks)]
    assert pool.reserved == sum(sequence.table.reservation for _, sequence in engine.scheduler.running)
    assert pool.blocks_in_use == sum(count > 0 for count in held)
    assert pool.available >= 0


def pool_is_idle(engine):
    pool = engine.pool
    assert pool.blocks_in_use == 0 and pool.reserved == 0
    assert all(pool.references(block) == 0 for block in range(pool.num_blocks))
    assert pool.available == pool.num_blocks  # every block free or cached


def test_a_block_key_names_its_whole_prefix():
    first, second = prefix_keys([1, 2, 3, 4, 5, 6, 7], 3), prefix_keys([1, 2, 3, 4, 5, 6, 8, 9], 3)
    assert len(first) == 2 and len(second) == 2  # full blocks only
    assert first == second  # the same six ids
    assert prefix_keys([9, 2, 3, 4, 5, 6], 3)[1] != first[1]  # the same block after another prefix
    assert prefix_keys([4, 5, 6], 3)[0] != first[1]


def test_the_pool_evicts_only_cached_blocks_least_recently_used_first():
    pool = BlockPool(4, 2, num_layers=1, num_kv_heads=1, head_dim=2)
    keys = prefix_keys([1, 2, 3, 4, 5, 6], 2)
    assert pool.reserve(3)
    table = BlockTable(pool, 3)
    table.append_slots(6)
    for block, key in zip(table.blocks, keys, strict=True):
        pool.register(block, key)
    assert pool.lookup(keys) == table.blocks == [0, 1, 2]
    assert pool.lookup([keys[0], b"other", keys[2]]) == [0]  # found only from the first block on
    table.release()
    assert pool.blocks_in_use == 0 and pool.cached_blocks == 3 and pool.available == 4
    # A prompt holding the first two again: they leave the cache, so only 2 blocks stay available.
    assert not pool.reserve(3, shared=[0, 1])
    assert pool.reserve(2, shared=[0, 1]) and pool.references(0) == 1 and pool.available == 0
    holder = BlockTable(pool, 2, shared=[0, 1])
    assert holder.append_slots(3).tolist() == [6, 7, 4]  # the free block 3 first, then block 2 evicted
    assert pool.lookup(keys) == [0, 1] and pool.cached_blocks == 0
    with pytest.raises(RuntimeError, match="without a reservation"):
        pool.allocate()  # nothing is taken from a held block
    holder.release()
    assert pool.cached_blocks == 2 and pool.blocks_in_use == 0 and pool.reserved == 0


def test_the_least_recently_used_prefix_is_evicted_first():
    pool = BlockPool(5, 2, num_layers=1, num_kv_heads=1, head_dim=2)
    chains = [prefix_keys([1, 2, 3, 4], 2), prefix_keys([5, 6, 7, 8], 2)]
    tables = []
    for keys in chains:
        assert pool.reserve(2)
        table = BlockTable(pool, 2)
        table.append_slots(4)
        for block, key in zip(table.blocks, keys, strict=True):
            pool.register(block, key)
        tables.append(table)
    for table in tables:
        table.release()
    assert pool.reserve(0, shared=pool.lookup(chains[0]))  # the first prefix is used again: now the most recent
    BlockTable(pool, 0, shared=pool.lookup(chains[0])).release()
    assert pool.reserve(3)
    assert [pool.allocate() for _ in range(3)] == [4, 3, 2]  # the free block, then the second prefix, last block first
    assert pool.lookup(chains[0]) == [0, 1] and pool.lookup(chains[1]) == []


def test_a_key_computed_twice_names_one_block_and_the_other_is_freed():
    pool = BlockPool(4, 2, num_layers=1, num_kv_heads=1, head_dim=2)
    (key,) = prefix_keys([1, 2], 2)
    assert pool.reserve(2)
    tables = [BlockTable(pool, 1), BlockTable(pool, 1)]
    for table in tables:
        table.append_slots(2)
        pool.register(table.blocks[0], key)
    assert pool.lookup([key]) == [0]
    for table in tables:
        table.release()
    assert pool.cached_blocks == 1 and pool.available == 4


SYSTEM = random_ids(37, seed=1)  # a shared system prompt: 4 full blocks of 8, and a part-filled one
QUESTIONS = [random_ids(length, seed=10 + length) for length in (1, 6, 11, 3, 19, 2, 8)]


@pytest.mark.parametrize("overrides", [
    dict(positional="rope", num_kv_heads=2), dict(positional="alibi"), dict(positional="learned"),
], ids=["rope-gqa", "alibi", "learned"])
def test_greedy_answers_are_the_same_with_and_without_prefix_caching(overrides):
    model = small_model(**overrides)
    prompts = [SYSTEM + question for question in QUESTIONS]
    prompts += [SYSTEM, SYSTEM[:31], prompts[1], SYSTEM[:16], SYSTEM[:3]]  # whole blocks, a repeat, short ones
    config = GenerationConfig(max_new_tokens=10, eos_token_id=())
    answers, stats = {}, {}
    for caching in (True, False):
        engine = Engine(model, cache_tokens=1024, block_size=8, prefix_caching=caching)
        requests = [engine.submit(prompt, config) for prompt in prompts[:3]]  # admitted in the same step
        engine.step()
        engine.step()
        for prompt in prompts[3:]:  # later, while the first ones decode
            requests.append(engine.submit(prompt, config))
            engine.step()
        engine.run_until_idle()
        answers[caching] = [request.outputs()[0] for request in requests]
        stats[caching] = engine.stats
        pool_is_idle(engine)
    assert answers[True] == answers[False]
    assert answers[True] == [alone(model, prompt, config) for prompt in prompts]
    with_cache, without = stats[True], stats[False]
    assert without.prefix_cache_hit_tokens == 0 and without.prompt_tokens_computed == sum(map(len, prompts))
    # The first three, admitted together, compute the system prompt; later, each question finds its 4 full
    # blocks, the system prompt alone 4, its first 31 tokens 3, the repeat all 5 of its full blocks, the first
    # 16 tokens 1 (its last token is computed, for its logits) and the first 3 none.
    assert with_cache.prefix_cache_hit_tokens == 8 * (4 * 4 + 4 + 3 + 5 + 1)
    assert with_cache.prompt_tokens_computed == with_cache.prompt_tokens - with_cache.prefix_cache_hit_tokens
    assert with_cache.prefix_cache_hit_rate == pytest.approx(232 / sum(map(len, prompts)))


@pytest.mark.parametrize("overrides", [
    dict(positional="rope", num_kv_heads=2), dict(positional="alibi"), dict(positional="relative", num_kv_heads=1),
    dict(attention_kernel="chunked"), dict(attention_kernel="sliding_window", attention_window=4),
], ids=["rope-gqa", "alibi", "relative-mqa", "chunked", "sliding-window"])  # Performer: no prefix (test_cache_specs)
def test_a_request_that_hit_the_cache_has_generates_logits(overrides):
    """Every step's distribution of a request whose prefill started after a cached prefix (its new tokens a
    part of its context, then decoding over shared blocks) is generate's, over the whole vocabulary."""
    model = small_model(**overrides)
    config = GenerationConfig(max_new_tokens=4, eos_token_id=())
    engine = Engine(model, cache_tokens=512, block_size=4)
    engine.complete([SYSTEM[:21]], config)
    events = []
    prompt = SYSTEM[:13] + QUESTIONS[1]
    engine.submit(prompt, config, logprobs=VOCAB, on_event=events.append)
    engine.run_until_idle()
    assert engine.stats.prefix_cache_hit_tokens == 12
    expected = tformer.generate(model, torch.tensor([prompt]), generation_config=config, output_scores=True)
    assert [event.token_id for event in events] == expected.new_tokens[0].tolist()
    for event, scores in zip(events, expected.scores, strict=True):
        logprobs = torch.log_softmax(scores[0].float(), -1)
        served = torch.empty(VOCAB)
        for token, logprob in event.top_logprobs:
            served[token] = logprob
        torch.testing.assert_close(served, logprobs, atol=2e-5, rtol=1e-5)


def test_a_prompt_to_score_is_computed_whole_even_when_its_prefix_is_cached():
    """Prompt log-probabilities need every prompt row's logits, so a scored prompt finds nothing in the cache."""
    model = small_model()
    engine = Engine(model, cache_tokens=512, block_size=4)
    prompt = SYSTEM[:18]
    engine.complete([prompt], GenerationConfig(max_new_tokens=2, eos_token_id=()))
    events = []
    engine.submit(prompt, GenerationConfig(max_new_tokens=0), n=2, prompt_logprobs=1, on_event=events.append)
    engine.run_until_idle()
    assert engine.stats.prefix_cache_hit_tokens == 0 and engine.stats.prompt_tokens_computed == 2 * 18
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor([prompt])).logits[0], -1)[:-1]  # (T - 1, V)
    expected = expected.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    for event in events:  # each sequence's one event
        torch.testing.assert_close(torch.tensor(event.prompt_logprobs.token_logprobs), expected, atol=1e-5, rtol=0)
    assert len(events) == 2
    engine.complete([prompt + [1]], GenerationConfig(max_new_tokens=2, eos_token_id=()))
    assert engine.stats.prefix_cache_hit_tokens == 16  # a prompt not scored still finds it
    pool_is_idle(engine)


def test_a_small_pool_evicts_idle_prefixes_and_never_a_held_block():
    model = small_model(positional="rope")
    engine = Engine(model, cache_tokens=64, block_size=4)  # 16 blocks
    config = GenerationConfig(max_new_tokens=6, eos_token_id=())
    long_config = GenerationConfig(max_new_tokens=30, eos_token_id=())
    shared = SYSTEM[:16]
    holder = engine.submit(shared + [5, 6], long_config)  # holds the 4 prefix blocks all along: 12 blocks
    engine.step()
    others = [engine.submit(random_ids(6, seed=50 + seed) + [7], config) for seed in range(6)]  # 4 blocks each
    hitting = engine.submit(shared + [8], config)  # waits for room behind them; then finds the prefix
    while not hitting.done.is_set():
        engine.step()
        pool_is_consistent(engine)
        assert all(engine.pool.references(block) >= 1 for block in holder.sequences[0].table.blocks)
    engine.run_until_idle()
    for request, prompt in [(holder, shared + [5, 6]), (hitting, shared + [8])] + [
            (other, random_ids(6, seed=50 + seed) + [7]) for seed, other in enumerate(others)]:
        assert request.outputs()[0] == alone(model, prompt, request.config)
    assert engine.stats.prefix_cache_hit_tokens == 16
    pool_is_idle(engine)
    # Some of the others' idle prompt blocks were evicted to make room; the shared prefix is still cached.
    assert sum(len(engine.pool.lookup(prefix_keys(random_ids(6, seed=50 + seed) + [7], 4))) for seed in range(6)) < 6
    assert len(engine.pool.lookup(prefix_keys(shared, 4))) == 4
    # A request that needs the whole pool evicts every cached block and still decodes what generate does.
    whole = random_ids(40, seed=99)
    (big,) = engine.complete([whole], GenerationConfig(max_new_tokens=24, eos_token_id=()))
    assert big.outputs()[0] == alone(model, whole, big.config)
    assert engine.pool.lookup(prefix_keys(shared, 4)) == []
    pool_is_idle(engine)


def test_cancelling_a_request_that_shares_blocks_leaves_the_others_intact():
    model = small_model()
    engine = Engine(model, cache_tokens=512, block_size=4)
    config = GenerationConfig(max_new_tokens=12, eos_token_id=())
    prompts = [SYSTEM[:20] + question for question in QUESTIONS[:3]]
    first = engine.submit(prompts[0], config)
    engine.step()
    rest = [engine.submit(prompt, config) for prompt in prompts[1:]]
    engine.step()  # both found the first's 5 blocks
    shared = first.sequences[0].table.blocks[:5]
    assert [engine.pool.references(block) for block in shared] == [3] * 5
    engine.cancel(first.id)
    engine.cancel(rest[0].id)
    engine.step()
    assert [engine.pool.references(block) for block in shared] == [1] * 5
    pool_is_consistent(engine)
    engine.run_until_idle()
    assert rest[1].outputs()[0] == alone(model, prompts[2], config)
    assert first.finish_reasons() == ["cancelled"] and rest[0].finish_reasons() == ["cancelled"]
    pool_is_idle(engine)
    assert engine.pool.cached_blocks == 5 + 1 + 2  # the shared prefix and the others' full prompt blocks


def test_n_sequences_prefill_the_prompt_once_and_decode_what_each_would_alone():
    model = small_model(positional="rope", num_kv_heads=2)
    prompts = [SYSTEM[:21], SYSTEM[:24]]  # a part-filled last block (copied to each sibling), and none
    greedy = GenerationConfig(max_new_tokens=8, eos_token_id=())
    seeded = GenerationConfig(max_new_tokens=8, eos_token_id=(), do_sample=True, temperature=0.9, seed=5)
    outputs, computed = {}, {}
    for caching in (True, False):
        engine = Engine(model, cache_tokens=1024, block_size=4, prefix_caching=caching)
        requests = [engine.submit(prompt, config, n=3) for prompt in prompts for config in (greedy, seeded)]
        requests.append(engine.submit(prompts[0], greedy, n=2, logprobs=2))
        requests.append(engine.submit(prompts[1], GenerationConfig(max_new_tokens=1, eos_token_id=()), n=4))
        engine.step()
        pool_is_consistent(engine)
        engine.run_until_idle()
        outputs[caching] = [request.outputs() for request in requests]
        computed[caching] = engine.stats.prompt_tokens_computed
        pool_is_idle(engine)
    assert outputs[True] == outputs[False]
    assert computed[False] == 3 * 2 * (21 + 24) + 2 * 21 + 4 * 24
    assert computed[True] == 2 * (21 + 24) + 21 + 24  # each request's prompt once, all admitted together
    for index, prompt in enumerate(prompts):
        greedy_outputs, seeded_outputs = outputs[True][2 * index : 2 * index + 2]
        assert greedy_outputs == [alone(model, prompt, greedy)] * 3
        assert seeded_outputs == [alone(model, prompt, GenerationConfig(**{**vars(seeded), "seed": 5 + sequence}))
                                  for sequence in range(3)]  # sequence i draws what seed + i draws
    assert len({tuple(output) for output in outputs[True][1]}) > 1


def test_n_sequences_of_a_request_that_hit_the_cache_share_its_blocks():
    model = small_model()
    engine = Engine(model, cache_tokens=512, block_size=4)
    config = GenerationConfig(max_new_tokens=5, eos_token_id=())
    engine.complete([SYSTEM[:20]], config)
    request = engine.submit(SYSTEM[:18] + [3, 4, 5], config, n=3)
    engine.step()
    tables = [sequence.table for sequence in request.sequences]
    assert tables[0].blocks[:4] == tables[1].blocks[:4] == tables[2].blocks[:4]  # 4 cached, then its 5th
    assert len({table.blocks[5] for table in tables}) == 3  # the part-filled 6th, copied
    assert [engine.pool.references(block) for block in tables[0].blocks[:5]] == [3] * 5
    assert engine.stats.prefix_cache_hit_tokens == 16 and engine.stats.prompt_tokens_computed == 20 + 5
    engine.run_until_idle()
    assert request.outputs() == [alone(model, SYSTEM[:18] + [3, 4, 5], config)] * 3
    pool_is_idle(engine)


def test_five_hundred_mixed_requests_with_cancellations_leak_nothing():
    model = small_model(d_model=32, num_layers=1)
    engine = Engine(model, cache_tokens=160, block_size=4, max_running=12)  # 40 blocks: it must evict
    rng = random.Random(0)
    prefixes = [random_ids(length, seed=200 + length) for length in (9, 16, 23)]
    requests, prompts = [], {}
    for index in range(500):
        prompt = (rng.choice(prefixes)[: rng.randint(1, 23)] if rng.random() < 0.8 else []) + \
            random_ids(rng.randint(1, 5), seed=1000 + index)
        options = dict(max_new_tokens=rng.randint(1, 6), eos_token_id=())
        if rng.random() < 0.3:
            options.update(do_sample=True, seed=index)
        request = engine.submit(prompt, GenerationConfig(**options), n=rng.choice((1, 1, 1, 2, 3)))
        requests.append(request)
        prompts[request.id] = prompt
        if rng.random() < 0.2:  # one of the latest: waiting, prefilling or decoding
            engine.cancel(rng.choice(requests[-12:]).id)
        if rng.random() < 0.5:
            engine.step()
            pool_is_consistent(engine)
    engine.run_until_idle()
    assert all(request.done.is_set() for request in requests)
    assert engine.stats.requests_cancelled > 40 and engine.stats.prefix_cache_hit_tokens > 1000
    cancelled = [request for request in requests if "cancelled" in request.finish_reasons()]
    assert any(request.outputs()[0] for request in cancelled) and not all(request.outputs()[0] for request in cancelled)
    pool_is_idle(engine)
    # More distinct full blocks were computed than the pool holds: idle ones were evicted along the way.
    ran = [prompts[request.id] for request in requests if request.outputs()[0]]
    assert len({key for prompt in ran for key in prefix_keys(prompt, 4)}) > engine.pool.num_blocks
    finished = [request for request in requests if request.finish_reasons()[0] == "length"
                and not request.config.do_sample]
    for request in finished[::10]:  # a sample of the greedy ones, checked against generate
        assert request.outputs() == [alone(model, prompts[request.id], request.config)] * len(request.sequences)
