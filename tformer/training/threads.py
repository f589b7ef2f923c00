"""CPU thread count chosen by measurement (``training.threads = 0`` on CPU).

On a machine that other processes share, PyTorch's OpenMP threads spin-wait for a partner
thread the scheduler has put aside: a small model's step can then be many times *slower* with
2 threads than with 1 (measured here: 1.8 s against 63 ms). Which count wins changes with the
load, so the tuner times steps at 1 thread and at PyTorch's default, keeps the faster, and
re-tries the other now and then, less often each time it loses. A trial that is already far
behind after one step ends at once, so a bad count costs one slow step, not several.

Off in deterministic mode: the thread count can change the order of floating-point sums, so
results would depend on the machine's load.
"""

from __future__ import annotations

import statistics

import torch

WARMUP_STEPS = 3  # not timed: allocations and caches settle
TIMED_STEPS = 5  # steps timed per count for a comparison
FIRST_PROBE_AFTER = 200
LONGEST_PROBE_INTERVAL = 3200
MARGIN = 0.9  # the other count wins when at least 10% faster
HOPELESS = 2.0  # a trial step this many times slower than the current median ends the trial


class ThreadTuner:
    """Call ``before_step()`` and ``after_step(seconds)`` around each training step."""

    def __init__(self, default_threads: int) -> None:
        self.candidates = (1, default_threads)  # 1 first: a bad default is the costly case to try
        self.current = 0
        self.recent: list[float] = []  # the last step times at the current count
        self.trial: list[float] = []  # step times of the other count while it is on trial
        self.trying = False
        self.steps = 0
        self.interval = FIRST_PROBE_AFTER
        self.next_trial = WARMUP_STEPS + TIMED_STEPS
        self.changes: list[str] = []  # each switch, for the log

    @property
    def threads(self) -> int:
        return self.candidates[1 - self.current if self.trying else self.current]

    def before_step(self) -> None:
        if not self.trying and self.steps >= self.next_trial:
            self.trying, self.trial = True, []
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    def after_step(self, seconds: float) -> None:
        self.steps += 1
        if self.steps <= WARMUP_STEPS:
            return
        if not self.trying:
            self.recent = (self.recent + [seconds])[-TIMED_STEPS:]
            return
        self.trial.append(seconds)
        baseline = statistics.median(self.recent)
        hopeless = min(self.trial) > HOPELESS * baseline
        if len(self.trial) < TIMED_STEPS and not hopeless:
            return
        self.trying = False
        trial = statistics.median(self.trial)
        if not hopeless and trial < MARGIN * baseline:
            before, self.current = self.candidates[self.current], 1 - self.current
            after = self.candidates[self.current]
            self.changes.append(f"{after} CPU thread{'s' if after > 1 else ''} ({trial * 1000:.0f} ms/step; "
                                f"{before}: {baseline * 1000:.0f} ms/step)")
            self.recent = self.trial[-TIMED_STEPS:]
            self.interval = FIRST_PROBE_AFTER
        else:
            self.interval = min(2 * self.interval, LONGEST_PROBE_INTERVAL)
        self.next_trial = self.steps + self.interval
