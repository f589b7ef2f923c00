"""How many CPU threads ``tformer serve``'s engine takes when the user does not say: PyTorch's count, or one
fewer when the HTTP process will need a share of a core.

The engine shares the machine's cores with the HTTP process, which tokenizes, formats and streams every token
to its client: about 0.1 ms of CPU a token (measured here: 0.19 of a core while serving gpt-mini at 1,943
tokens/s, the engine process using 0.98; benchmarks/logs/serve_load-gpt-mini-t1-rep3-2026-11-27b.log). When the
engine takes every core, each time the HTTP process runs it holds back one of the engine's threads, and the
others wait for it at the end of every operation: on two cores, gpt-mini served 16 clients at 0.67x its engine's
ceiling with two engine threads and 0.94x with one (docs/serving.md), while GPT-2, whose steps are 20 times
longer and whose tokens 15 times fewer, serves best with both. So at start the engine times a decoding step of
``BATCH`` sequences on all of PyTorch's threads, and keeps one core for the HTTP process when streaming that
many tokens a second would take at least ``HTTP_SHARE`` of a core.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from tformer.generation.session import open_session

HTTP_SECONDS_PER_TOKEN = 1e-4  # the HTTP process's CPU time per streamed token (see above)
# From this share of a core on, the HTTP process wakes often enough to stall an engine on every core: gpt-mini's
# 16-sequence step here makes about 3,300 tokens/s (0.33 of a core), GPT-2's about 190 (0.02).
HTTP_SHARE = 0.1
BATCH = 16  # sequences decoding together in the measured step (serve_load's 16 clients)
CONTEXT = 32  # positions each has seen
STEPS = 4  # one-token steps timed a round


def engine_threads(model: nn.Module, measure: Callable[[], float] | None = None) -> tuple[int, str]:
    """The threads the engine should take, and a line saying why. ``measure()`` gives a step's seconds on
    PyTorch's threads (default: ``decode_step_seconds(model)``)."""
    available = torch.get_num_threads()
    if available < 2 or model is not None and model.config.max_seq_len < 2:
        return available, f"{available} thread(s), PyTorch's count"
    seconds = (measure or (lambda: decode_step_seconds(model)))()
    tokens_per_second = BATCH / seconds
    share = tokens_per_second * HTTP_SECONDS_PER_TOKEN
    measured = (f"a decoding step of {BATCH} sequences makes {tokens_per_second:,.0f} tokens/s on {available} "
                f"threads, whose streaming takes about {share:.2f} of a core")
    if share >= HTTP_SHARE:
        return available - 1, f"{available - 1} of {available} threads: {measured}, left to the HTTP process"
    return available, f"{available} threads: {measured}"


@torch.no_grad()
def decode_step_seconds(model: nn.Module, rounds: int = 3) -> float:
    """The fastest of ``rounds`` timings of a one-token decoding step of ``BATCH`` sequences at ``CONTEXT``
    positions, or as many as the model's context leaves, through the generation protocol (a decoder's prompt of
    random token ids, an encoder-decoder's source of them, a speech model's window of silent features: a step's cost
    does not depend on them)."""
    total = min(CONTEXT + STEPS, model.config.max_seq_len)
    steps = min(STEPS, total - 1)
    if steps < 1:
        raise ValueError(f"a context of {model.config.max_seq_len} position(s) leaves no decoding step to time")
    generator = torch.Generator().manual_seed(0)
    if model.prompt_is_tokens:
        prompt = torch.randint(0, model.config.vocab_size, (BATCH, total - steps), generator=generator)
    else:  # (B, M, F): a window of the speech model's features
        prompt = torch.zeros(BATCH, model.config.num_mel_bins, model.config.input_frames)
    best = float("inf")
    for _ in range(rounds):
        session, state = open_session(model, prompt.to(model.device), None, steps)
        logits = session.extend(state.input_ids, last_only=True)
        started = time.perf_counter()
        for _ in range(steps):
            logits = session.extend(logits.argmax(-1), last_only=True)
        best = min(best, (time.perf_counter() - started) / steps)
    return best
