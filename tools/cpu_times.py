"""A pytest plugin that measures each test's CPU time (its own process's and that of the processes it
starts, setup and teardown included) and adds the tests over ``SLOW_CPU_SECONDS`` to
``tests/slow_by_cpu.txt``, the list tests/conftest.py marks ``slow``. CPU time rather than wall time: it
holds on a busy machine, where the list is usually made. Run it over the fast tests, in one process:

    PYTHONPATH=tools .venv/bin/python -m pytest -q -p cpu_times -m "not slow" --cpu-times

The listed tests are slow already, so a run measures the others and adds those now over the line: a test
whose fixture an earlier (now listed) test used to pay for shows up on the next run. Entries stay until the
file is deleted (then two runs make it again). Commit the list when it changes."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

SLOW_CPU_SECONDS = 0.1  # make test-fast's budget: under 60 s on 2 cores for what stays under it
LIST = Path(__file__).resolve().parents[1] / "tests" / "slow_by_cpu.txt"
HEADER = f"""\
# Tests over {SLOW_CPU_SECONDS} s of CPU time (their process and the processes they start), which tests/conftest.py
# marks slow so that make test-fast stays near a minute on 2 cores; made by tools/cpu_times.py (see there).
# CPU seconds, then the test.
"""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-times", action="store_true", help=f"add the tests over {SLOW_CPU_SECONDS} s of "
                     f"CPU time to {LIST.relative_to(LIST.parents[1])}")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("cpu_times") and config.getoption("numprocesses", None) and \
            not hasattr(config, "workerinput"):
        raise pytest.UsageError("--cpu-times measures in one process: leave out -n")


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_measured: dict[str, float] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    started = _cpu_seconds()
    yield
    _measured[item.nodeid] = _cpu_seconds() - started


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not session.config.getoption("cpu_times"):
        return
    listed = {}
    if LIST.exists():
        lines = LIST.read_text(encoding="utf-8").splitlines()
        listed = {name: float(seconds) for seconds, name in
                  (line.split(maxsplit=1) for line in lines if line.strip() and not line.startswith("#"))}
    listed.update((name, seconds) for name, seconds in _measured.items() if seconds > SLOW_CPU_SECONDS)
    rows = sorted(((seconds, name) for name, seconds in listed.items()), reverse=True)
    LIST.write_text(HEADER + "".join(f"{seconds:.2f} {name}\n" for seconds, name in rows), encoding="utf-8")
