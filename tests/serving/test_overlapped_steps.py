"""Decode steps launched one ahead of their host work (``serving/overlapped_steps.py``): on the CPU, where
``overlap=True`` runs the same code a GPU runs asynchronously, every request receives the events the plain loop
sends (tokens, text, ends), requests join and leave mid-run, and the pool gets every block back."""

import pytest
import torch
from serving_models import alone, small_model

import tformer
from tformer.generation import GenerationConfig, GenerationError
from tformer.serving import Engine
from tformer.tokenizers import CharTokenizer


def prompts_and_budgets(count, vocab, seed=1):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 10, (count,), generator=generator).tolist()
    prompts = [torch.randint(0, vocab, (length,), generator=generator).tolist() for length in lengths]
    return prompts, torch.randint(2, 20, (count,), generator=generator).tolist()


def served(engine, prompts, configs, n=1, submit_later=(), steps_before=3):
    """Each request's events as (token, text, finish reason); the requests in ``submit_later`` join after
    ``steps_before`` steps."""
    events = [[] for _ in prompts]
    requests = [None] * len(prompts)

    def submit(index):
        requests[index] = engine.submit(prompts[index], configs[index], n=n, on_event=events[index].append)

    for index in range(len(prompts)):
        if index not in submit_later:
            submit(index)
    for _ in range(steps_before):
        engine.step()
    for index in submit_later:
        submit(index)
    engine.run_until_idle()
    return requests, [[(event.index, event.token_id, event.text, event.finish_reason) for event in received]
                      for received in events]


def test_overlapped_steps_send_the_plain_loops_events_for_end_ids_stop_strings_and_late_requests():
    """Greedy requests ending by length, by an end id mid-run and by a stop string, some joining while others
    decode (the steps in flight handed out first), each with 2 sequences sharing the prompt's blocks."""
    tokenizer = CharTokenizer.train("abcdefghij ")
    model = small_model(vocab_size=tokenizer.vocab_size)
    prompts, budgets = prompts_and_budgets(12, tokenizer.vocab_size)
    free = [alone(model, prompt, GenerationConfig(max_new_tokens=budget, eos_token_id=()))
            for prompt, budget in zip(prompts, budgets, strict=True)]
    configs = [GenerationConfig(max_new_tokens=budget, eos_token_id=()) for budget in budgets]
    for index in (1, 4, 7):  # an end id the free run meets mid-way
        configs[index] = GenerationConfig(max_new_tokens=budgets[index], eos_token_id=free[index][1])
    for index in (2, 9):  # a stop string
        configs[index] = GenerationConfig(max_new_tokens=budgets[index], eos_token_id=(),
                                          stop_strings=(tokenizer.decode(free[index][1:3]),))
    outcomes = {}
    for overlap in (False, True):
        engine = Engine(model, tokenizer, cache_tokens=2048, block_size=4, max_running=24, overlap=overlap)
        outcomes[overlap] = served(engine, prompts, configs, n=2, submit_later=(3, 8, 10))
        assert engine.pool.blocks_in_use == 0 and engine.pool.reserved == 0
        assert (engine.overlapped is not None) == overlap
        if overlap:
            assert engine.overlapped.steps >= 10
    (plain_requests, plain_events), (requests, events) = outcomes[False], outcomes[True]
    assert events == plain_events
    assert [request.outputs() for request in requests] == [request.outputs() for request in plain_requests]
    for index in (1, 4, 7):
        assert requests[index].finish_reasons() == ["stop", "stop"]
        assert requests[index].outputs()[0] == free[index][: free[index].index(free[index][1]) + 1]
    for index in (2, 9):
        assert requests[index].finish_reasons() == ["stop", "stop"]


def test_overlapped_steps_draw_sampled_tokens_and_drain_for_penalties_and_logprobs():
    """Seeded sampling (temperature; top-k, top-p and an end id held back) and a forced last token decoded ahead
    beside greedy requests, a repetition penalty and log-probabilities (which read the tokens in flight: the step in
    flight is handed out first): every answer is generate's alone."""
    model = small_model()
    prompts, budgets = prompts_and_budgets(8, model.config.vocab_size, seed=2)
    budgets = [max(budget, 12) for budget in budgets]
    configs = [GenerationConfig(max_new_tokens=budget, eos_token_id=()) for budget in budgets]
    configs[2] = GenerationConfig(max_new_tokens=budgets[2], temperature=0.8, seed=5, eos_token_id=())
    configs[3] = GenerationConfig(max_new_tokens=budgets[3], do_sample=True, top_k=5, top_p=0.9, seed=6,
                                  min_new_tokens=4, eos_token_id=7)
    configs[4] = GenerationConfig(max_new_tokens=budgets[4], forced_eos_token_id=9, eos_token_id=())  # greedy
    configs[5] = GenerationConfig(max_new_tokens=5, repetition_penalty=1.4, eos_token_id=())
    configs[6] = GenerationConfig(max_new_tokens=3, eos_token_id=())  # with log-probabilities
    engine = Engine(model, cache_tokens=2048, block_size=4, max_running=8, overlap=True)
    requests = [engine.submit(prompt, config, logprobs=2 if index == 6 else None)
                for index, (prompt, config) in enumerate(zip(prompts, configs, strict=True))]
    engine.run_until_idle()
    for prompt, config, request in zip(prompts, configs, requests, strict=True):
        expected = alone(model, prompt, config)
        if 7 in expected and config.eos_token_id == 7:  # generate pads after the end; the server stops
            expected = expected[: expected.index(7) + 1]
        assert request.outputs()[0] == expected, config
    longest = max(len(request.outputs()[0]) for request in requests)
    assert longest - 6 <= engine.overlapped.steps <= longest - 4  # ahead once the penalty's request has ended
    assert engine.pool.blocks_in_use == 0


def test_no_step_runs_past_a_length_limit():
    """A request of 10 tokens takes 10 forward passes (its prefill, then 9 steps), as in the plain loop: the step
    after its last token, which would feed that token back, is never launched."""
    model = small_model()
    for overlap in (False, True):
        engine = Engine(model, cache_tokens=256, block_size=4, overlap=overlap)
        (request,) = engine.complete([[1, 2, 3]], GenerationConfig(max_new_tokens=10, eos_token_id=()))
        assert len(request.outputs()[0]) == 10 and engine.stats.steps == 10


def test_a_cancelled_request_ends_while_a_step_is_in_flight():
    model = small_model()
    engine = Engine(model, cache_tokens=1024, block_size=4, overlap=True)
    config = GenerationConfig(max_new_tokens=30, eos_token_id=())
    kept, cancelled = engine.submit([1, 2, 3], config), engine.submit([4, 5], config)
    for _ in range(5):
        engine.step()
    assert engine.overlapped.in_flight is not None
    engine.cancel(cancelled.id)
    engine.run_until_idle()
    assert cancelled.finish_reasons() == ["cancelled"] and 0 < len(cancelled.outputs()[0]) < 30
    assert cancelled.outputs()[0] == alone(model, [4, 5], config)[: len(cancelled.outputs()[0])]
    assert kept.outputs()[0] == alone(model, [1, 2, 3], config)
    assert engine.pool.blocks_in_use == 0 and engine.pool.reserved == 0


def test_overlapped_steps_run_an_encoder_decoder_and_captured_steps(traced_on_the_cpu):
    """A translator's decode steps launched ahead (its encoder's output kept in its rows), and a decoder's through
    the captured decode-only steps a GPU replays (traced on the CPU): generate's answers."""
    torch.manual_seed(0)
    translator = tformer.build_model("transformer-multi30k", vocab_size=53, d_model=32, num_heads=4, num_layers=2,
                                     d_ff=64, max_seq_len=48, dropout=0.0).eval()
    torch.manual_seed(0)
    decoder = tformer.build_model("gpt-nano", initializer_range=0.3).eval()
    for model in (translator, decoder):
        prompts, budgets = prompts_and_budgets(10, 50, seed=4)
        configs = [GenerationConfig(max_new_tokens=budget, eos_token_id=()) for budget in budgets]
        engine = Engine(model, cache_tokens=2048, block_size=8, max_running=16, paged_attention="gather",
                        overlap=True)
        requests = [engine.submit(prompt, config) for prompt, config in zip(prompts, configs, strict=True)]
        engine.run_until_idle()
        for prompt, config, request in zip(prompts, configs, requests, strict=True):
            assert request.outputs()[0] == alone(model, prompt, config)
        assert engine.overlapped.steps >= 10
    assert engine.captured is not None and engine.captured.steps >= 10


def test_overlap_is_on_by_default_only_where_the_device_is_asynchronous():
    model = small_model()
    assert Engine(model, cache_tokens=256).overlapped is None  # the CPU
    with pytest.raises(GenerationError, match="overlap='yes' must be True, False or None"):
        Engine(model, cache_tokens=256, overlap="yes")
