"""The ``tformer`` command. Each subcommand lives in its own module of this package and
registers itself through ``register(subparsers)``; add its name to COMMANDS."""

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

COMMANDS = ["attention", "average", "classify", "convert", "demo", "download", "evaluate", "generate", "info", "plot",
            "predict", "quantize", "serve", "tokenize", "tokenizer", "train", "transcribe", "translate"]


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
        warnings.showwarning = _warning_printer(args.command)
        try:
            resolve_model_argument(args)
            set_threads(args)
            return args.run(args) or 0
        except (TformerError, FileNotFoundError, IsADirectoryError, PermissionError) as error:
            print(f"tformer {args.command}: error: {_one_line(error)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as interrupted:  # a TrainingInterrupted says where the run was saved; Ctrl-C, nothing
            print(f"tformer {args.command}: {str(interrupted) or 'interrupted'}", file=sys.stderr)
            return getattr(interrupted, "exit_code", 130)


def _warning_printer(command: str):
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


def add_model_argument(parser: argparse.ArgumentParser, dest: str, help: str, metavar: str | None = None,
                       nargs: str | None = None) -> None:
    """The command's model: a local folder or a Hugging Face Hub name, with ``--revision`` and
    ``--local-only``. ``main`` turns a name into its cached snapshot folder before the command runs
    (``resolve_model_argument``), so commands only ever see folders."""
    parser.add_argument(dest, metavar=metavar, nargs=nargs,
                        help=f"{help}; or a Hugging Face Hub name (org/name) when no such local path exists")
    parser.add_argument("--revision", help="with a Hub name: its branch, tag or commit (default: the main branch)")
    parser.add_argument("--local-only", action="store_true",
                        help="with a Hub name: read the Hugging Face cache only, never the network")
    parser.set_defaults(model_argument=dest)


def resolve_model_argument(args: argparse.Namespace) -> None:
    """Replace a command's model argument by the folder it names (a Hub name by its snapshot folder in
    the Hugging Face cache); ``args.hub_name`` keeps the name (None for a local folder)."""
    from tformer.hub_cache import resolve_model

    dest = getattr(args, "model_argument", None)
    args.hub_name = None
    if dest is None:
        return
    if getattr(args, dest) is None:
        if args.revision is not None:
            raise UsageError("--revision goes with a Hub model name")
        return
    source = getattr(args, dest)
    folder = resolve_model(source, args.revision, args.local_only)
    if str(folder) != str(Path(source).expanduser()):
        args.hub_name = source
        setattr(args, dest, str(folder))


def output_beside_model(args: argparse.Namespace, folder: str | Path, *default: str) -> Path:
    """``--out``, or by default the path ``default`` inside the model's folder; for a Hub model (whose
    snapshot in the cache is not ours to write) inside a folder named after it in the working directory."""
    if args.out:
        return Path(args.out)
    return (Path(args.hub_name.replace("/", "--")) if args.hub_name else Path(folder)).joinpath(*default)


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


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """``--device``: where the model runs (``resolve_device`` reads it)."""
    parser.add_argument("--device", default="cpu",
                        help="cpu, cuda, cuda:N, or auto (cuda when PyTorch sees a GPU, else cpu) (default: cpu)")


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """``--threads``: the CPU threads the command computes with (``main`` sets them before it runs)."""
    parser.add_argument("--threads", type=int, metavar="N",
                        help="CPU threads PyTorch computes with (default: PyTorch's, one a core); fewer leave cores "
                             "to other work on a shared machine")
    parser.set_defaults(sets_threads=True)


def set_threads(args: argparse.Namespace) -> None:
    """Apply a command's ``--threads`` (``add_threads_option``), checked by ``check_threads``."""
    if not getattr(args, "sets_threads", False) or args.threads is None:
        return
    check_threads(args.threads)
    import torch

    torch.set_num_threads(args.threads)


def check_threads(threads: int, option: str = "--threads") -> None:
    """Refuse in one line a thread count below 1, or above the CPUs this process may run on: threads past them
    only wait for each other (9999 on 2 cores made a 0.0 s transcription take 19 s)."""
    if threads < 1:
        raise UsageError(f"{option} {threads} must be >= 1")
    cpus = available_cpus()
    if threads > cpus:
        raise UsageError(f"{option} {threads} is more than the {cpus} CPU(s) this process may run on; give 1 to "
                         f"{cpus}")


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the system tells it; else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on macOS and Windows
        return os.cpu_count() or 1


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """``--no-progress`` (``show_progress`` reads it)."""
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (there is none either when stderr is not a terminal)")


def show_progress(args: argparse.Namespace) -> bool:
    """A progress bar on a terminal unless --no-progress; never in a log file."""
    return not args.no_progress and sys.stderr.isatty()


def add_quantize_option(parser: argparse.ArgumentParser) -> None:
    """``--quantize`` and ``--group-size``: quantize the model's weights as it loads (``quantize_option`` reads
    them)."""
    parser.add_argument("--quantize", choices=("int8", "w8a8", "int4"),
                        help="quantize the weights as they load: int8 (per output channel), w8a8 (int8 weights, "
                             "activations rounded to int8 where that is faster) or int4 (groups of --group-size "
                             "inputs); a folder written by tformer quantize loads quantized without it")
    parser.add_argument("--group-size", type=int, metavar="N", help="with --quantize int4: inputs per group, 32, 64 or "
                                                                    "128 (default: 64)")


def quantize_option(args: argparse.Namespace):
    """The ``QuantizationScheme`` that ``--quantize`` / ``--group-size`` ask for, or None."""
    from tformer.quantization import QuantizationError, scheme_for

    if args.quantize is None:
        if args.group_size is not None:
            raise UsageError("--group-size goes with --quantize int4")
        return None
    if args.quantize != "int4" and args.group_size is not None:
        raise UsageError(f"--group-size goes with --quantize int4 ({args.quantize} is per output channel)")
    try:
        return scheme_for(args.quantize, args.group_size)
    except QuantizationError as error:
        raise UsageError(f"--group-size: {error}") from None


def resolve_device(text: str, option: str = "--device"):
    """The torch.device a ``--device`` value names, refused in one line naming the devices this machine has
    when it has no such device (every command that takes ``--device`` reads it through here)."""
    import torch

    text = text.strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    kind, _, index = text.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise UsageError(f"{option} {text!r} is not a device (cpu, cuda, cuda:N or auto); this machine has: "
                         f"{available_devices()}")
    if not torch.cuda.is_available():
        build = " (a CPU-only build)" if torch.version.cuda is None else ""
        raise UsageError(f"{option} {text}: PyTorch {torch.__version__}{build} sees no CUDA device; this machine "
                         f"has: {available_devices()}")
    if index and int(index) >= torch.cuda.device_count():
        raise UsageError(f"{option} {text}: no such CUDA device; this machine has: {available_devices()}")
    return torch.device(text)


def available_devices() -> str:
    """The ``--device`` values this machine can run on, for a message: cpu, each GPU (cuda:N), auto."""
    import torch

    gpus = [f"cuda:{index}" for index in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return ", ".join(["cpu", *gpus, "auto"])


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
