"""Learning-rate schedules as pure functions of the step (or, for a run sized by the clock, of the step and the
fraction of its time budget spent), so a resumed run needs no scheduler state."""

from __future__ import annotations

import math

SCHEDULES = ("cosine", "linear", "constant", "inverse_sqrt")


def learning_rate(
    step: int,
    *,
    schedule: str,
    lr: float,
    warmup_steps: int,
    max_steps: int,
    min_lr: float = 0.0,
    d_model: int | None = None,
) -> float:
    """The learning rate at ``step`` (0-based).

    cosine / linear: linear warmup from 0 to ``lr`` over ``warmup_steps``, then decay to
    ``min_lr`` at ``max_steps``. constant: warmup then ``lr``. inverse_sqrt: the 2017 paper's
    ``lr * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)`` with s = step + 1 (``lr`` is a multiplier).
    """
    if schedule == "inverse_sqrt":
        if d_model is None:
            raise ValueError("the inverse_sqrt schedule needs d_model")
        s = step + 1
        return lr * d_model**-0.5 * min(s**-0.5, s * max(warmup_steps, 1) ** -1.5)
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return _decayed(progress, schedule, lr, min_lr)


CLOCK_SCHEDULES = ("cosine", "linear", "constant")  # inverse_sqrt has no end to fit to a budget


def clock_learning_rate(
    step: int,
    budget_fraction: float,
    *,
    schedule: str,
    lr: float,
    warmup_steps: int,
    min_lr: float = 0.0,
) -> float:
    """The learning rate of a run sized by the clock (``training.max_steps = 0`` with ``max_minutes``).

    ``budget_fraction``: the share of the time budget spent when the step starts (resumes included). The decay
    (cosine, linear) measures its progress in that fraction instead of step / max_steps, so the rate reaches
    ``min_lr`` as the budget ends, however many steps the host fits into it. The warmup stays in steps (the
    optimiser's statistics settle per update, and the first steps are then the same on every host): the rate
    is the lower of the warmup's ramp and the decay, so a warmup that is still going when the decay has
    started only rises until it meets it.
    """
    if schedule not in CLOCK_SCHEDULES:
        raise ValueError(f"schedule={schedule!r} cannot follow the clock; one of {', '.join(CLOCK_SCHEDULES)} can")
    ramp = lr * (step + 1) / warmup_steps if step < warmup_steps else lr
    if schedule == "constant":
        return ramp
    return min(ramp, _decayed(min(1.0, max(0.0, budget_fraction)), schedule, lr, min_lr))


def _decayed(progress: float, schedule: str, lr: float, min_lr: float) -> float:
    """``lr`` decayed to ``min_lr`` over progress 0..1."""
    if schedule == "cosine":
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
    if schedule == "linear":
        return lr + progress * (min_lr - lr)
    raise ValueError(f"schedule={schedule!r} is not one of {', '.join(SCHEDULES)}")
