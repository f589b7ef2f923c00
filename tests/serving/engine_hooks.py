"""tformer serve's engine with test hooks: each step slowed (a larger model's pace: time to act between steps)
and a submit that fails on a bug. A module of its own, light to import: the engine process imports it to
build its engine."""

import time

from tformer.cli.serve import build_engine


def slowed(step, seconds):
    def slow_step():
        time.sleep(seconds)
        return step()

    return slow_step


def hooked_engine(step_seconds, failing_prompt, *build_args):
    """``build_engine(*build_args)``, each step slowed by ``step_seconds`` and a submit of ``failing_prompt``
    raising a KeyError, where given."""
    engine = build_engine(*build_args)
    if step_seconds is not None:
        engine.step = slowed(engine.step, step_seconds)
    if failing_prompt is not None:
        submit = engine.submit

        def failing_submit(prompt_ids, *args, **kwargs):
            if list(prompt_ids) == failing_prompt:
                raise KeyError("a bug")
            return submit(prompt_ids, *args, **kwargs)

        engine.submit = failing_submit
    return engine
