"""Greedy decoding and sampling: one new token per step from the last position's logits."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from tformer.generation.run import DecodingRun
from tformer.generation.session import Session

# device type -> steps between two reads of whether every row has ended (1 elsewhere). A read waits for the device
# to finish the step, so on a GPU reading at every step would leave it idle while the host prepares the next one;
# the few steps run after the last row ended are taken back.
END_CHECK_EVERY = {"cuda": 8}


def autoregressive_decode(session: Session, run: DecodingRun, logits: Tensor,
                          end_check_every: int = 1) -> Iterator[Tensor]:
    """Choose a token from ``logits`` (B, V), feed it back, repeat; yield each (B, 1) token.

    Stops after ``max_new_tokens`` or when every row has finished (then-finished rows are
    padded with ``pad_id`` while the others go on), which it reads every ``end_check_every`` steps: the steps
    made after every row had ended are then taken back from the run (tokens and scores), though they were yielded.
    """
    chooser, stop = run.chooser, run.stop
    reads_history = chooser.reads_history  # a rule (the repetition penalty) reads each row's tokens so far
    finished: Tensor | None = None  # (B,) bool, once anything can finish a row
    unread: list[Tensor] = []  # whether every row had ended after each step since the last read
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
            unread.append(finished.all())
            if len(unread) == end_check_every or step + 1 == run.max_new_tokens:
                ended = [bool(unread[0])] if len(unread) == 1 else torch.stack(unread).tolist()
                if True in ended:
                    _take_back(run, len(ended) - 1 - ended.index(True))
                    return
                unread.clear()
        if step + 1 < run.max_new_tokens:
            logits = session.extend(token[:, None], last_only=True)[:, -1]


def _take_back(run: DecodingRun, steps: int) -> None:
    """Forget the last ``steps`` new tokens of every row (and their scores): steps made after every row had ended."""
    run.length -= steps
    if run.scores is not None and steps:
        del run.scores[-steps:]
