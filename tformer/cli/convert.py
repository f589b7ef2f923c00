"""``tformer convert SRC DST --to hf|tformer|gguf``: rewrite a checkpoint folder in another format; SRC may also
be a GGUF file (llama.cpp's), DST one with ``--to gguf``."""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

from tformer.cli import UsageError, refuse_output_over_input
from tformer.cli.model_source import add_model_source
from tformer.files import move_aside

FORMATS = ("hf", "tformer", "gguf")
GGUF_HINT = "pip install 'tformer[gguf]'"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert", help="convert a checkpoint between tformer's, Hugging Face's and llama.cpp's (GGUF) formats",
        description="Load SRC (either folder format, or a GGUF file) and write it to DST in the format given by "
                    "--to (gguf: a file; int8 models as Q8_0, int4 as Q4_0, float ones as F32/F16/BF16). An "
                    "existing DST is refused unless --overwrite.",
    )
    add_model_source(parser, "source", "a checkpoint folder (tformer or Hugging Face format) or a GGUF file", "SRC",
                     without=("device", "quantize", "adapter"))
    parser.add_argument("destination", metavar="DST", help="the folder to write")
    parser.add_argument("--to", required=True, choices=FORMATS, help="the format to write")
    parser.add_argument(
        "--overwrite", action="store_true",
        help="write into DST even if it exists: the files of the checkpoint it holds (weights, configs, tokenizer "
             "files, tokenizer_config.json, chat template) are moved to DST.replaced-N beside it (nothing is "
             "deleted), so none outlives the conversion; other files stay (--to gguf: the old file is moved to "
             "DST.replaced-N)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tformer.checkpoint import checkpoint_files
    from tformer.quantization import represented_parameters

    destination = Path(args.destination)
    refuse_output_over_input(destination, [args.source], option="DST")
    if args.to == "gguf":
        return _write_gguf(args, destination)
    if destination.exists() and not args.overwrite:
        raise UsageError(f"{destination} already exists; pass --overwrite to write into it (the files of the "
                         f"checkpoint there are moved to {destination.resolve().name}.replaced-N beside it)")
    if destination.exists() and not destination.is_dir():
        raise UsageError(f"{destination}: exists and is not a folder; a checkpoint is written as a folder "
                         "(give a new path or a folder)")
    model = _load(args)  # before anything moves: a source that cannot load changes nothing
    old_files = checkpoint_files(destination)
    if old_files:
        moved = move_aside(destination, old_files)
        print(f"moved the checkpoint files in {destination} ({', '.join(old_files)}) to {moved} (nothing is deleted)")
    count = represented_parameters(model)  # a quantized model's: those it stands for, its integers included
    scheme = model.quantization
    stored = f", stored quantized: {scheme.describe()}" if scheme is not None and args.to == "tformer" else ""
    model.save(destination, format=args.to)
    print(f"wrote {destination} ({args.to} format, {type(model).__name__}, {count:,} parameters{stored})")
    return 0


def _gguf():
    """tformer.interop.gguf, or a one-line UsageError when the gguf package is not installed."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise UsageError(f"GGUF files are read and written through the gguf package: {GGUF_HINT}") from None
    from tformer.interop import gguf as gguf_interop

    return gguf_interop


def _load(args: argparse.Namespace):
    """The model of SRC (a folder, a Hub name or a GGUF file), as every command loads one."""
    from tformer.cli.model_source import load_model
    from tformer.interop.gguf_layout import is_gguf

    if is_gguf(args.model_source.path):
        _gguf()  # a one-line UsageError naming the extra when the gguf package is missing
    return load_model(args.model_source).model


def _write_gguf(args: argparse.Namespace, destination: Path) -> int:
    """``--to gguf``: DST is a file, an existing one moved to DST.replaced-N (with --overwrite)."""
    from tformer.quantization import represented_parameters

    if destination.is_dir():
        raise UsageError(f"{destination}: is a folder; --to gguf writes one file (give a file path such as "
                         f"{destination / 'model.gguf'})")
    if destination.exists() and not args.overwrite:
        raise UsageError(f"{destination} already exists; pass --overwrite to replace it (the old file is moved to "
                         f"{destination.name}.replaced-N beside it)")
    interop = _gguf()
    model = _load(args)
    interop.gguf_family(model.config)  # refused before anything moves
    if destination.exists():
        moved = _moved_aside(destination)
        print(f"moved the old {destination} to {moved} (nothing is deleted)")
    written = interop.save_gguf(model, destination)
    if written.tokenizer_problem is not None:
        print(f"tformer convert: warning: the tokenizer is not written: {written.tokenizer_problem}",
              file=sys.stderr)
    kinds = ", ".join(f"{count} {kind}" for kind, count in Counter(written.tensor_types.values()).most_common())
    print(f"wrote {destination} (gguf, architecture {written.architecture}, {represented_parameters(model):,} "
          f"parameters; tensors: {kinds})")
    return 0


def _moved_aside(path: Path) -> Path:
    """Rename file ``path`` to the first free ``NAME.replaced-N`` beside it."""
    for number in range(1, 10_000):
        target = path.with_name(f"{path.name}.replaced-{number}")
        if not target.exists():
            os.replace(path, target)
            return target
    raise UsageError(f"--overwrite: {path.parent} already holds {path.name}.replaced-1 to -9999")
