"""Docs that are executed (issue 61, part 2): every fenced block of README.md and docs/*.md is run here, or is
marked as not run with the reason, so a snippet that no longer works as written fails a test.

- **Code** is a block whose fence names ``python``, ``bash``, ``sh`` or ``console``. A page's Python blocks run in
  order in one namespace (a page's snippets build on each other); shell blocks run line by line (a trailing ``\\``
  joins lines, ``# comments`` are dropped): a ``tformer ...`` line (after ``VAR=value`` words) runs the command in
  this process, as the venv's ``tformer`` would, and must exit 0 without a warning; any other line runs in bash.
  Everything runs in a fresh temporary folder per page, offline (HF_HUB_OFFLINE=1), single-threaded.
- **Not run**: an HTML comment on the line right before the fence, ``<!-- not run: REASON -->``, skips the block
  (REASON is required: it trains for minutes, downloads, needs a GPU, serves, needs the reader's own files, ...).
  Markdown renders nothing for it. README's Development section tells contributors.
- **Output**: a ``text`` (or unnamed) block right after a run block is what that block prints; it is compared as
  doctest does with ELLIPSIS and NORMALIZE_WHITESPACE (``...`` stands for anything). Marked ``not run``, it is not
  compared (output that changes from run to run). Other ``text`` blocks are prose (layouts, logs, tables); one that
  holds a command (its first line starts with ``$ ``, ``tformer COMMAND`` or ``python SCRIPT.py``) must be fenced
  as code.
  ``toml`` and ``json`` blocks must parse.
- **What a reader already has**: the folder holds the checkpoints a reader makes by following README before a page
  asks for them, made small here in place of minutes of training: ``runs/demo`` (gpt-mini, character-level, as
  ``tformer demo`` saves it, untrained) and ``runs/nano`` (gpt-nano, the same), each only where its page names it.

``python tests/test_docs.py`` prints how many blocks of each page run, are marked, or are text."""

from __future__ import annotations

import contextlib
import doctest
import io
import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tformer.cli import COMMANDS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md"))]
CODE = {"python", "bash", "sh", "console"}
TEXT = {"", "text"}
DATA = {"toml", "json"}
NOT_RUN = re.compile(r"^<!-- not run: (\S.*?) -->$")
FENCE = re.compile(r"^(`{3,}|~{3,})(\S*)\s*$")
COMMAND_IN_TEXT = re.compile(r"^(\$ |python \S+\.py|tformer (" + "|".join(COMMANDS) + r") )")
VENV_BIN = Path(sys.executable).parent
CLONE = ("configs", "benchmarks", "examples")  # what a reader's clone has beside the run folders
BLOCK_SECONDS = 60  # a block that runs longer (a server, a training run) is marked not run instead


@dataclass
class Block:
    page: str
    line: int  # the fence's line, 1-based
    lang: str
    body: str
    not_run: str | None  # the reason, when marked


def read_blocks(page: str) -> list[Block]:
    """The fenced blocks of a page, with the ``not run`` reason of each marked one."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, close = i, fence.group(1)
        i += 1
        while i < len(lines) and lines[i].strip() != close:
            i += 1
        if i == len(lines):
            raise AssertionError(f"{page}:{start + 1}: the fence is never closed")
        marker = NOT_RUN.match(lines[start - 1].strip()) if start else None
        if start and lines[start - 1].strip().startswith("<!-- not run") and not marker:
            raise AssertionError(f"{page}:{start}: write the marker as <!-- not run: REASON -->")
        blocks.append(Block(page, start + 1, fence.group(2).lower(), "\n".join(lines[start + 1:i]) + "\n",
                            marker.group(1) if marker else None))
        i += 1
    return blocks


def follows(block: Block, previous: Block | None) -> bool:
    """Whether ``block`` comes right after ``previous`` (nothing but blank lines between)."""
    if previous is None:
        return False
    lines = (ROOT / block.page).read_text(encoding="utf-8").splitlines()
    end = previous.line + previous.body.count("\n")  # the closing fence's index
    return all(not line.strip() for line in lines[end + 1:block.line - 1])


def counts(page: str) -> dict[str, int]:
    """How many blocks of a page run, are marked not run, or are text and data."""
    tally = {"run": 0, "marked": 0, "text": 0}
    for block in read_blocks(page):
        kind = "marked" if block.not_run else "run" if block.lang in CODE else "text"
        tally[kind] += 1
    return tally


# What a reader has made by following README before the page asks for it (the module docstring).
def _char_model(preset: str, folder: Path) -> None:
    import tformer
    from tformer.data.corpus import builtin_corpus
    from tformer.tokenizers import CharTokenizer

    tokenizer = CharTokenizer.train(builtin_corpus())
    model = tformer.build_model(preset, vocab_size=tokenizer.vocab_size, positional="rope")
    model.tokenizer = tokenizer
    model.save(folder)


FIXTURES = {"runs/demo": lambda path: _char_model("gpt-mini", path),
            "runs/nano": lambda path: _char_model("gpt-nano", path)}


def run_python(block: Block, namespace: dict) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.body, f"{block.page}:{block.line}", "exec"), namespace)
    return out.getvalue()


def shell_lines(body: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and prompts dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    commands = []
    for line in joined.splitlines():
        line = line.strip().removeprefix("$ ")
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def run_tformer(words: list[str], where: str) -> str:
    """One ``tformer`` command in this process; it must exit 0 and warn nothing."""
    from tformer.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(words)
        except SystemExit as exit_:
            code = exit_.code
    assert code in (0, None), f"{where}: tformer {' '.join(words)} exited {code}:\n{err.getvalue()[-2000:]}"
    warned = [line for line in err.getvalue().splitlines() if ": warning:" in line]
    assert not warned, f"{where}: tformer {' '.join(words)} warned:\n" + "\n".join(warned)
    return out.getvalue()


def run_shell(block: Block, env: dict[str, str]) -> str:
    printed = []
    for command in shell_lines(block.body):
        words = shlex.split(command, comments=True)
        settings = {}
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            name, _, value = words.pop(0).partition("=")
            settings[name] = value
        where = f"{block.page}:{block.line}"
        plain = words and words[0] == "tformer" and not re.search(r"[|<>;&$`*]", command)
        if plain:
            with _environment(settings):
                printed.append(run_tformer(words[1:], where))
            continue
        result = subprocess.run(["bash", "-c", command], env={**env, **settings}, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, f"{where}: {command} exited {result.returncode}:\n{result.stderr[-2000:]}"
        printed.append(result.stdout)
    return "".join(printed)


@contextlib.contextmanager
def _environment(settings: dict[str, str]):
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _time_limit(block: Block):
    def stop(signum, frame):
        raise TimeoutError(f"over {BLOCK_SECONDS} s: mark it <!-- not run: REASON -->")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(BLOCK_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def check_output(block: Block, printed: str) -> None:
    checker = doctest.OutputChecker()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    if not checker.check_output(block.body, printed, flags):
        raise AssertionError(f"{block.page}:{block.line}: the page shows\n{block.body}but the block above it printed\n"
                             f"{printed}")


def check_text(block: Block) -> None:
    if block.lang == "toml":
        tomllib.loads(block.body)
    elif block.lang == "json":
        import json

        json.loads(block.body)
    elif block.lang in TEXT:
        first = block.body.lstrip().splitlines()[0] if block.body.strip() else ""
        where = f"{block.page}:{block.line}"
        assert not COMMAND_IN_TEXT.match(first), f"{where}: a command in a text block: fence it as code"
    else:
        raise AssertionError(f"{block.page}:{block.line}: unknown block language {block.lang!r}: "
                             f"use one of {sorted(CODE | DATA | TEXT)}")


@pytest.mark.parametrize("page", PAGES)
def test_page_runs_as_written(page, tmp_path, monkeypatch):
    text = (ROOT / page).read_text(encoding="utf-8")
    for name, make in FIXTURES.items():
        if name in text:
            make(tmp_path / name)
    for name in CLONE:
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace: dict = {"__name__": "__docs__"}
    previous, printed, failures = None, None, []
    for block in read_blocks(page):
        try:
            if block.not_run:
                printed = None
            elif block.lang in CODE:
                printed = None
                with _time_limit(block):
                    printed = run_python(block, namespace) if block.lang == "python" else run_shell(block, env)
            elif block.lang in TEXT and printed is not None and follows(block, previous):
                printed, shown = None, printed
                check_output(block, shown)
            else:
                printed = None
                check_text(block)
        except Exception as error:  # every failing block of the page reported at once; later ones may follow from it
            failures.append(f"{block.page}:{block.line}: {type(error).__name__}: {error}")
        previous = block
    assert not failures, "\n\n".join(failures)


def test_markers_name_a_reason_and_mark_blocks():
    """A marker with no reason, or one not right before a fence, is refused."""
    for page in PAGES:
        lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            if line.strip().startswith("<!-- not run"):
                assert NOT_RUN.match(line.strip()), f"{page}:{number + 1}: <!-- not run: REASON -->"
                following = lines[number + 1] if number + 1 < len(lines) else ""
                assert FENCE.match(following), f"{page}:{number + 1}: the marker must be right before a fence"


if __name__ == "__main__":
    total = {"run": 0, "marked": 0, "text": 0}
    for page in PAGES:
        tally = counts(page)
        total = {kind: total[kind] + tally[kind] for kind in total}
        print(f"{page:24} run {tally['run']:3}  marked {tally['marked']:3}  text {tally['text']:3}")
    print(f"{'all':24} run {total['run']:3}  marked {total['marked']:3}  text {total['text']:3}")
