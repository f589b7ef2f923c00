"""The ``tformer`` command. Each subcommand lives in its own module of this package and
registers itself through ``register(subparsers)``; add its name to COMMANDS."""

from __future__ import annotations

import argparse
import importlib
import sys

from tformer.errors import TformerError

COMMANDS = ["convert", "demo", "generate", "info", "plot", "tokenize", "tokenizer", "train"]


class UsageError(TformerError):
    """A bad command-line argument found after parsing (a missing file, an impossible value)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tformer",
        description="The transformer family in one library: build, train, generate, inspect and convert models.",
    )
    from tformer import __version__

    parser.add_argument("--version", action="version", version=f"tformer {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in COMMANDS:
        importlib.import_module(f"tformer.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.run(args) or 0
    except (TformerError, FileNotFoundError, IsADirectoryError, PermissionError) as error:
        print(f"tformer {args.command}: error: {_one_line(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupted:  # a TrainingInterrupted says where the run was saved
        print(f"tformer {args.command}: {interrupted or 'interrupted'}", file=sys.stderr)
        return getattr(interrupted, "exit_code", 130)


def _one_line(error: BaseException) -> str:
    if isinstance(error, OSError) and error.filename:
        return f"{error.filename}: {error.strerror}"
    return str(error).splitlines()[0] if str(error) else type(error).__name__
