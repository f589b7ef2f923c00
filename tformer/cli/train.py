"""``tformer train RECIPE.toml``: train what a recipe describes, resumably, on one process or
many (``torchrun --nproc_per_node=N -m tformer train ...``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", help="train a model from a TOML recipe (resumable; DDP/FSDP under torchrun)",
        description="Train the model a recipe's [model], [data] and [training] sections describe. Writes "
                    "metrics.jsonl, checkpoints/ and the resolved recipe.toml into the run folder; at the "
                    "end the run folder is a model folder (tformer.load(RUN) works). Ctrl-C saves a "
                    "checkpoint; --resume auto continues from the newest one.",
    )
    parser.add_argument("recipe", nargs="?", help="a recipe .toml file (optional with --resume RUN: "
                                                  "the run's own recipe.toml is used)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a recipe value, e.g. --set training.lr=3e-4 (repeatable)")
    parser.add_argument("--resume", metavar="auto|DIR",
                        help="continue a run: 'auto' (newest checkpoint in --out), or a run or checkpoint folder")
    parser.add_argument("--out", help="run folder (default: runs/RECIPE_NAME); a fresh run needs it empty")
    parser.add_argument("--overwrite", action="store_true",
                        help="start afresh in a folder that is not empty: its contents are moved to OUT.replaced-N "
                             "beside it (nothing is deleted)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tformer.cli import UsageError
    from tformer.training.recipe import load_recipe
    from tformer.training.run import RECIPE_NAME, train_recipe
    from tformer.training.signals import TrainingInterrupted

    recipe_path = args.recipe
    out = args.out
    if recipe_path is None:
        if args.resume in (None, "auto"):
            raise UsageError("a recipe file is needed (or --resume RUN_FOLDER to continue a run with its recipe)")
        recipe_path = str(Path(args.resume) / RECIPE_NAME)
        out = out or args.resume
    recipe = load_recipe(recipe_path, args.overrides)
    out = Path(out or Path("runs") / Path(recipe_path).stem)
    if args.overwrite and args.resume is not None:
        raise UsageError("--overwrite starts a fresh run; it cannot be combined with --resume")
    main_process = int(os.environ.get("RANK", "0")) == 0
    try:
        result = train_recipe(recipe, out, resume=args.resume, progress=not args.no_progress,
                              overwrite=args.overwrite)
    except TrainingInterrupted as interrupted:
        if main_process:  # the resume hint; the exit status says which signal (130: SIGINT, 143: SIGTERM)
            print(interrupted, flush=True)
        return interrupted.exit_code

    if not main_process:
        return 0  # only the main process reports
    if result.steps == result.start_step:
        training = recipe.training
        if training.max_minutes and (training.sized_by_clock or result.steps < training.max_steps):
            print(f"nothing to train: the run at step {result.steps} has spent training.max_minutes="
                  f"{training.max_minutes:g} (raise it with --set training.max_minutes=M)")
        else:
            print(f"nothing to train: the run is at step {result.steps} and training.max_steps is "
                  f"{training.max_steps} (raise it with --set training.max_steps=N)")
        return 0
    evaluated = f", eval loss {result.final_eval_loss:.4f}" if result.final_eval_loss is not None else ""
    best = f" (best {result.best_eval:.4f} at step {result.best_step})" if result.best_eval is not None else ""
    print(f"{result.stopped} at step {result.steps}: train loss {result.final_train_loss:.4f}{evaluated}{best}; "
          f"{result.seconds:.1f} s, {result.throughput:,.0f} {result.unit}/s")
    if recipe.adapter is not None:
        base = recipe.init_from or "BASE"
        merge = "" if result.merge_refused else f"tformer merge {base} {out} --out MERGED, "
        print(f"run folder {out}: the adapter in PEFT's format  (tformer generate {base} --adapter {out}, "
              f"{merge}tformer plot {out})")
        if result.merge_refused:
            print(f"not mergeable: {result.merge_refused}")
    else:
        print(f"run folder {out}  (tformer.load('{out}'), tformer plot {out})")
    return 0
