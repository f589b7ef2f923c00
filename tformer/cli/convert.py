"""``tformer convert SRC DST --to hf|tformer``: rewrite a checkpoint folder in the other format."""

from __future__ import annotations

import argparse
from pathlib import Path

from tformer.cli import UsageError, refuse_output_over_input
from tformer.cli.model_source import add_model_source
from tformer.files import move_aside

FORMATS = ("hf", "tformer")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert", help="convert a checkpoint between tformer's and Hugging Face's format",
        description="Load SRC (either format) and write it to DST in the format given by --to. An existing DST "
                    "is refused unless --overwrite.",
    )
    add_model_source(parser, "source", "a checkpoint folder (tformer or Hugging Face format)", "SRC",
                     without=("device", "quantize"))
    parser.add_argument("destination", metavar="DST", help="the folder to write")
    parser.add_argument("--to", required=True, choices=FORMATS, help="the format to write")
    parser.add_argument(
        "--overwrite", action="store_true",
        help="write into DST even if it exists: the files of the checkpoint it holds (weights, configs, tokenizer "
             "files, tokenizer_config.json, chat template) are moved to DST.replaced-N beside it (nothing is "
             "deleted), so none outlives the conversion; other files stay",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tformer.checkpoint import checkpoint_files
    from tformer.cli.model_source import load_model
    from tformer.quantization import represented_parameters

    destination = Path(args.destination)
    refuse_output_over_input(destination, [args.source], option="DST")
    if destination.exists() and not args.overwrite:
        raise UsageError(f"{destination} already exists; pass --overwrite to write into it (the files of the "
                         f"checkpoint there are moved to {destination.resolve().name}.replaced-N beside it)")
    if destination.exists() and not destination.is_dir():
        raise UsageError(f"{destination}: exists and is not a folder; a checkpoint is written as a folder "
                         "(give a new path or a folder)")
    model = load_model(args.model_source).model  # before anything moves: a source that cannot load changes nothing
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
