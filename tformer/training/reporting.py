"""What a run reports as it goes: a tqdm bar (step, loss, lr, tokens/s or examples/s, peak memory, ETA or, under a
time budget, the minutes it has left), metrics.jsonl
(one JSON object per line: ``step`` and metrics by name) and TensorBoard when it is installed.

Only the main process reports; the others get a silent reporter. The bar's text is refreshed
a few times a second at most, so a fast loop does not pay for drawing it every step.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from tformer.files import write_text_atomically
from tformer.memory import format_bytes

METRICS_NAME = "metrics.jsonl"
REFRESH_SECONDS = 0.5


class Reporter:
    """Progress bar, metrics file and TensorBoard writer of one run."""

    def __init__(self, out_dir: Path | None, total_steps: int | None, start_step: int, *, enabled: bool = True,
                 progress: bool = True, tensorboard: bool = True, unit: str = "tokens") -> None:
        self.enabled = enabled
        self.rate_label = "tok/s" if unit == "tokens" else f"{unit}/s"
        self.metrics_file = None
        self.tensorboard = None
        self.bar = None
        self._last_refresh = 0.0
        if not enabled:
            return
        if out_dir is not None:
            self.metrics_file = open(Path(out_dir) / METRICS_NAME, "a", encoding="utf-8")  # noqa: SIM115
            if tensorboard and importlib.util.find_spec("tensorboard") is not None:
                from torch.utils.tensorboard import SummaryWriter

                self.tensorboard = SummaryWriter(log_dir=str(Path(out_dir) / "tensorboard"))
        if progress:
            self.bar = tqdm(total=total_steps, initial=start_step, desc="training", unit="step",
                            dynamic_ncols=True, file=sys.stderr, smoothing=0.05)

    def log(self, record: dict) -> None:
        """Write one record (``step`` + metrics) to metrics.jsonl and TensorBoard."""
        if self.metrics_file is not None:
            finite = {name: None if isinstance(value, float) and not math.isfinite(value) else value
                      for name, value in record.items()}  # strict JSON: a NaN loss is written as null
            self.metrics_file.write(json.dumps(finite) + "\n")
        if self.tensorboard is not None:
            for name, value in record.items():
                if name != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    self.tensorboard.add_scalar(name, value, record["step"])

    def advance(self, steps: int, loss: float, lr: float, rate: float, memory: int | None = None,
                minutes_left: float | None = None) -> None:
        """Move the bar; redraw its loss / lr / throughput (units per second) / peak memory (bytes) / time budget
        left (minutes) text a few times a second. ``total_steps`` None (a run sized by the clock): the bar counts
        steps without an end, and the minutes left say when it ends."""
        if self.bar is None:
            return
        now = time.perf_counter()
        if now - self._last_refresh >= REFRESH_SECONDS:
            self._last_refresh = now
            held = "" if memory is None else f", mem={format_bytes(memory).replace(' ', '')}"
            left = "" if minutes_left is None else f", left={minutes_left:.1f}min"
            self.bar.set_postfix_str(f"loss={loss:.4f}, lr={lr:.2e}, {self.rate_label}={rate:,.0f}{held}{left}",
                                     refresh=False)
        self.bar.update(steps)

    def message(self, text: str) -> None:
        """A line above the bar (or on stdout without one)."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def flush(self) -> None:
        """Make everything logged so far durable (called before each checkpoint)."""
        if self.metrics_file is not None:
            self.metrics_file.flush()
            os.fsync(self.metrics_file.fileno())
        if self.tensorboard is not None:
            self.tensorboard.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.metrics_file is not None:
            self.metrics_file.close()
            self.metrics_file = None
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None


def truncate_metrics(out_dir: Path, last_step: int, tag: str | None = None) -> None:
    """Drop metrics.jsonl records after ``last_step`` (logged after the checkpoint a run
    resumes from), rewriting the file atomically (``tag``: the run's token, see ``write_text_atomically``)."""
    path = Path(out_dir) / METRICS_NAME
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= last_step:
                kept.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut short by a kill
    write_text_atomically(path, "".join(line + "\n" for line in kept), tag)
