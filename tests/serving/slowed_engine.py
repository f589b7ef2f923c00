"""tformer serve's engine at a larger model's pace (each step slowed), for the server tests. A module of its
own, light to import: the engine process imports it to build its engine."""

import time

from tformer.cli.serve import build_engine


def slowed(step, seconds):
    def slow_step():
        time.sleep(seconds)
        return step()

    return slow_step


def slowed_engine(step_seconds, *build_args):
    """``build_engine(*build_args)``, each step slowed by ``step_seconds`` when given: time to act between
    steps."""
    engine = build_engine(*build_args)
    if step_seconds is not None:
        engine.step = slowed(engine.step, step_seconds)
    return engine
