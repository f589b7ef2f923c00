"""Ctrl-C (SIGINT) and SIGTERM as a request to stop: the training loop finishes its step,
saves a checkpoint and raises ``TrainingInterrupted``, instead of dying mid-write. A second
Ctrl-C stops at once."""

from __future__ import annotations

import signal
import threading


class TrainingInterrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM after saving its checkpoint. A ``KeyboardInterrupt``,
    so a program that does not catch it stops as it would on Ctrl-C; ``result`` is the
    ``TrainingResult`` so far (``stopped == "interrupted"``), ``signal_name`` the signal this
    process received (None when only a peer process did), ``exit_code`` the shell's 128 + N."""

    def __init__(self, message: str, result, signal_name: str | None = None) -> None:
        super().__init__(message)
        self.result = result
        self.signal_name = signal_name

    @property
    def exit_code(self) -> int:
        return 128 + (signal.SIGTERM if self.signal_name == "SIGTERM" else signal.SIGINT)


class StopRequest:
    """While active, SIGINT / SIGTERM set ``requested`` (the signal's name) instead of killing
    the process. Only the main thread can install handlers; elsewhere this does nothing."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _handle(self, number: int, frame) -> None:
        if self.requested is not None and number == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop without saving
        self.requested = signal.Signals(number).name
