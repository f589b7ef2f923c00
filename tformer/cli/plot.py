"""``tformer plot RUN``: draw a run's train/eval loss and learning rate into a PNG."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plot", help="plot a run's loss curves and learning rate (PNG)",
        description="Read RUN/metrics.jsonl (written by tformer train) and draw train loss, eval loss and "
                    "the learning rate against the step into a PNG (default: RUN/loss_curve.png). A PNG there that "
                    "tformer did not draw is kept unless --overwrite is given.",
    )
    parser.add_argument("run_dir", metavar="RUN", help="a run folder (or its metrics.jsonl)")
    parser.add_argument("--out", help="PNG file to write (default: RUN/loss_curve.png)")
    parser.add_argument("--title", help="figure title (default: the run folder's name)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --out even when it is not a figure tformer wrote (a figure of tformer's is "
                             "replaced without it)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tformer.cli import UsageError, check_replaceable, refuse_output_over_input
    from tformer.training.reporting import METRICS_NAME
    from tformer.viz.curves import plot_training_curves, read_metrics
    from tformer.viz.figures import written_by_tformer

    source = Path(args.run_dir)
    metrics = source if source.is_file() else source / METRICS_NAME
    if not metrics.is_file():
        raise UsageError(f"{source}: no {METRICS_NAME} (is it a run folder written by tformer train?)")
    records = read_metrics(metrics)
    if not records:
        raise UsageError(f"{metrics}: no records yet")
    out = Path(args.out) if args.out else metrics.parent / "loss_curve.png"
    if out.suffix.lower() != ".png":
        raise UsageError(f"--out {out}: the plot is written as PNG; give a .png file name")
    refuse_output_over_input(out, [metrics])
    check_replaceable(out, args.overwrite, written_by_tformer=written_by_tformer, what="a figure tformer wrote")
    title = args.title or metrics.parent.resolve().name
    plot_training_curves(records, out, title=title)
    last = records[-1]
    evaluated = [r for r in records if "eval_loss" in r]
    summary = f"step {last['step']}"
    if evaluated:
        last_eval = evaluated[-1]["eval_loss"]
        summary += f", last eval loss {'not finite' if last_eval is None else format(last_eval, '.4f')}"
    print(f"wrote {out} ({len(records)} records, {summary})")
    return 0
