"""Greedy decoding and sampling: one new token per step from the last position's logits."""

from __future__ import annotations

from collections.abc import Iterator

from torch import Tensor

from tformer.generation.run import DecodingRun
from tformer.generation.session import Session


def autoregressive_decode(session: Session, run: DecodingRun, logits: Tensor) -> Iterator[Tensor]:
    """Choose a token from ``logits`` (B, V), feed it back, repeat; yield each (B, 1) token.

    Stops after ``max_new_tokens`` or when every row has finished (then-finished rows are
    padded with ``pad_id`` while the others go on).
    """
    chooser, stop = run.chooser, run.stop
    reads_history = chooser.reads_history  # a rule (the repetition penalty) reads each row's tokens so far
    finished: Tensor | None = None  # (B,) bool, once anything can finish a row
    for step in range(run.max_new_tokens):
        scores = chooser.scores(logits, step, history=run.history() if reads_history else None)
        if run.scores is not None:
            run.scores.append(scores)
        token = chooser.choose(scores, run.generator)  # (B,)
        if finished is not None:
            token = token.masked_fill(finished, run.pad_id)
        run.sequences[:, run.length] = token
        run.length += 1
        yield token[:, None]
        if stop.active:
            hit = stop.hits(run.sequences, run.length, None if finished is None else ~finished)
            finished = hit if finished is None else finished | hit
            if bool(finished.all()):
                return
        if step + 1 < run.max_new_tokens:
            logits = session.extend(token[:, None], last_only=True)[:, -1]
