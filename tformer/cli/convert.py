"""``tformer convert SRC DST --to hf|tformer``: rewrite a checkpoint folder in the other format."""

from __future__ import annotations

import argparse
from pathlib import Path

from tformer.cli import UsageError, add_model_argument, refuse_output_over_input

FORMATS = ("hf", "tformer")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert", help="convert a checkpoint between tformer's and Hugging Face's format",
        description="Load SRC (either format) and write it to DST in the format given by --to.",
    )
    add_model_argument(parser, "source", "a checkpoint folder (tformer or Hugging Face format)", "SRC")
    parser.add_argument("destination", metavar="DST", help="the folder to write")
    parser.add_argument("--to", required=True, choices=FORMATS, help="the format to write")
    parser.add_argument(
        "--overwrite", action="store_true",
        help="write into DST even if it exists (its checkpoint files are replaced, other files kept)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import tformer

    destination = Path(args.destination)
    refuse_output_over_input(destination, [args.source], option="DST")
    if destination.exists() and not args.overwrite:
        raise UsageError(f"{destination} already exists; pass --overwrite to write into it")
    model = tformer.load(args.source)
    model.save(destination, format=args.to)
    print(f"wrote {destination} ({args.to} format, {type(model).__name__}, {model.num_parameters():,} parameters)")
    return 0
