"""``tformer average RUN --last K --out DIR``: a model folder whose weights are the mean of a run's last K
step checkpoints (or of the checkpoint folders given)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "average", help="average the weights of a run's last checkpoints into a new model folder",
        description="Average the weights of the last --last step checkpoints of RUN (or of the checkpoint folders "
                    "given) into a new model folder --out. They must share one config and one tokenizer "
                    "(and image processing, quantization): checkpoints that differ are refused.",
    )
    parser.add_argument("folders", nargs="+", metavar="RUN|CHECKPOINT",
                        help="a run folder (with --last), or two or more checkpoint folders")
    parser.add_argument("--last", type=int, help="how many of the run's newest step checkpoints to average")
    parser.add_argument("--out", required=True, help="the new model folder (must not exist, or be empty)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tformer.cli import UsageError
    from tformer.training.averaging import average_checkpoints, last_checkpoints

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out}: exists and is not an empty folder; choose a new one")
    if args.last is not None:
        if len(args.folders) != 1:
            raise UsageError("--last takes one run folder")
        folders = last_checkpoints(args.folders[0], args.last)
    elif len(args.folders) < 2:
        raise UsageError("give a run folder with --last K, or two or more checkpoint folders")
    else:
        folders = [Path(folder) for folder in args.folders]
    model = average_checkpoints(folders)
    model.save(out)
    print(f"averaged   {len(folders)} checkpoints: {', '.join(folder.name for folder in folders)}")
    print(f"model      {out}")
    return 0
