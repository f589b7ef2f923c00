"""The ``tformer`` command. Each subcommand lives in its own module of this package and
registers itself through ``register(subparsers)``; add its name to COMMANDS. A command that loads a model takes
the one option group of ``model_source`` (and loads through it); a command module never imports another: what
two commands share lives here, in ``model_source`` or in ``model_inputs``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn

from tformer.errors import TformerError

COMMANDS = ["attention", "average", "classify", "convert", "data", "demo", "download", "embed", "evaluate", "generate",
            "info", "merge", "plot", "predict", "quantize", "serve", "tokenize", "tokenizer", "train", "transcribe",
            "translate"]


class UsageError(TformerError):
    """A bad command-line argument found after parsing (a missing file, an impossible value)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser (its subcommands' too) whose errors are one line, as tformer's own are, without the
    usage block argparse prints before them: ``tformer CMD: error: WHAT; see tformer CMD --help``, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would report them from the top parser, naming no command
        command = f"tformer {args.command}" if args.command else "tformer"
        print(f"{command}: error: unrecognized arguments: {' '.join(unknown)}; see {command} --help", file=sys.stderr)
        return 2
    if args.command is None:
        parser.print_help()
        return 2
    with warnings.catch_warnings():
        warnings.showwarning = warning_printer(args.command)
        try:
            prepare = getattr(args, "prepare", None)  # what a command's options need done once before it runs:
            if prepare is not None:  # the model option group's reading (cli/model_source.py)
                prepare(args)
            return args.run(args) or 0
        except (TformerError, FileNotFoundError, IsADirectoryError, PermissionError) as error:
            print(f"tformer {args.command}: error: {_one_line(error)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as interrupted:  # a TrainingInterrupted says where the run was saved; Ctrl-C, nothing
            print(f"tformer {args.command}: {str(interrupted) or 'interrupted'}", file=sys.stderr)
            return getattr(interrupted, "exit_code", 130)


def warning_printer(command: str):
    """Warnings as one line each on standard error, like the errors (no source line under them)."""
    def show(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"tformer {command}: warning: {_one_line(message) if isinstance(message, Warning) else message}",
              file=sys.stderr)

    return show


def _one_line(error: BaseException) -> str:
    if isinstance(error, OSError) and error.filename:
        return f"{error.filename}: {error.strerror}"
    return str(error).splitlines()[0] if str(error) else type(error).__name__


# ---- checks shared by the commands -------------------------------------------------------------------


def refuse_output_over_input(output: str | Path, inputs: Iterable[str | Path], option: str = "--out") -> None:
    """Refuse an output that is one of the command's inputs, however it is spelled (``./``, a
    symbolic or a hard link), or a folder the command writes into that holds one: writing it
    would destroy the input."""
    output = Path(output)
    if not output.exists():
        return  # every input exists, so a new path is none of them
    for source in map(Path, inputs):
        if not source.exists():
            continue
        if os.path.samefile(output, source):
            alias = "" if os.path.abspath(output) == os.path.abspath(source) else f" (it is {source})"
            raise UsageError(f"{option} {output} is an input of this command{alias}; writing it would destroy "
                             "the input: choose another output path")
        if output.is_dir() and output.resolve() in source.resolve().parents:
            raise UsageError(f"{option} {output} holds the input {source}, and this command replaces what is in "
                             "that folder: move the input out or choose another output folder")


def check_replaceable(path: str | Path, overwrite: bool | None, option: str = "--out",
                      written_by_tformer: Callable[[Path], bool] | None = None, what: str = "") -> None:
    """Refuse to replace an existing ``path`` unless ``overwrite`` was given, or ``written_by_tformer(path)``
    proves it is output of this command (``what`` names it: "a figure tformer wrote"); without that test every
    existing file is refused. ``overwrite`` None: the command has no --overwrite, so the message offers none."""
    path = Path(path)
    if overwrite or not (path.exists() or path.is_symlink()):
        return
    if written_by_tformer is not None and written_by_tformer(path):
        return
    kind = f" and is not {what}" if what else ""
    offer = "" if overwrite is None else ", or pass --overwrite to replace it"
    raise UsageError(f"{path} exists{kind}; choose another {option}{offer}")


def check_model_output(out: str | Path, overwrite: bool, option: str = "--out") -> None:
    """A model folder is written to ``out`` only when it is new or empty, or with ``overwrite`` when it holds a model
    folder (config.json: one tformer could have written, whose model files are then replaced); anything else is
    refused in one line, so no folder tformer did not write is written into."""
    from tformer.checkpoint import CONFIG_NAME

    out = Path(out)
    if not out.exists():
        return
    if not out.is_dir():
        raise UsageError(f"{option} {out}: exists and is not a folder")
    if any(out.iterdir()):
        if not overwrite:
            raise UsageError(f"{option} {out} is not empty; give --overwrite to replace the model files in it, or an "
                             "empty or new folder")
        if not (out / CONFIG_NAME).is_file():
            raise UsageError(f"{option} {out} holds files but no model folder (no {CONFIG_NAME}); tformer replaces "
                             "only a model folder it could have written: choose an empty or new folder")


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """``--no-progress`` (``show_progress`` reads it)."""
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (there is none either when stderr is not a terminal)")


def show_progress(args: argparse.Namespace) -> bool:
    """A progress bar on a terminal unless --no-progress; never in a log file."""
    return not args.no_progress and sys.stderr.isatty()


def check_text_option(text: str, option: str) -> str:
    """A text given on the command line, refused when it is not UTF-8 (the bytes the system could
    not decode reach Python as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raw = text[error.start:error.end].encode("utf-8", "surrogateescape")
        raise UsageError(f"{option} is not UTF-8 text (byte {raw.hex(' ')} at character {error.start}); "
                         "give the text in UTF-8") from None
    return text


def encode_prompt(tokenizer, text: str, option: str = "--prompt") -> list[int]:
    """The ids of a prompt given on the command line; it must be UTF-8 and encode to some token.
    Characters the tokenizer does not know become its unknown token, with a warning naming them."""
    ids = tokenizer.encode(check_text_option(text, option))
    if not ids:
        raise UsageError(f"{option} encodes to no tokens; give some text")
    unknown_id = tokenizer.unk_token_id
    if unknown_id is not None and unknown_id in ids and tokenizer.unk_token not in text:
        unknown = [c for c in dict.fromkeys(text) if tokenizer.encode(c, add_special_tokens=False) == [unknown_id]]
        named = f" ({', '.join(map(repr, unknown[:10]))}{', ...' if len(unknown) > 10 else ''})" if unknown else ""
        warnings.warn(f"{option}: {ids.count(unknown_id)} token(s) became {tokenizer.unk_token}: text the tokenizer "
                      f"does not know{named}; the model continues a prompt it cannot read", stacklevel=2)
    return ids
