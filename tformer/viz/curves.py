"""Training curves: train/eval loss and learning rate against step, as a PNG."""

from __future__ import annotations

import json
from pathlib import Path

from tformer.errors import TformerError
from tformer.viz.figures import pyplot, save_figure

PLOTTED = ("train_loss", "eval_loss", "lr")  # besides the step; null (a non-finite value) is drawn as a gap


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics.jsonl file, one dict with a numeric ``step`` per line (a last line
    cut short by a killed run is left out); anything else is a TformerError naming the line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise TformerError(f"{path}: not a metrics.jsonl file (not UTF-8 text: {error.reason} at byte "
                           f"{error.start})") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                continue
            raise TformerError(f"{path}:{number}: not a JSON record") from None
        if not isinstance(record, dict) or not _is_number(record.get("step")):
            raise TformerError(f"{path}:{number}: not a metrics record (a JSON object with a numeric \"step\")")
        for name in PLOTTED:
            if record.get(name) is not None and not _is_number(record[name]):
                raise TformerError(f"{path}:{number}: {name}={record[name]!r} is not a number")
        records.append(record)
    return records


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _values(records: list[dict], name: str) -> list[float]:
    return [float("nan") if r[name] is None else r[name] for r in records]


def plot_training_curves(records: list[dict], out_png: str | Path, title: str = "training") -> Path:
    """Draw train loss (and eval loss where present) and the learning rate into ``out_png``."""
    plt = pyplot()
    trained = [r for r in records if "train_loss" in r]
    evaluated = [r for r in records if "eval_loss" in r]
    with_lr = [r for r in records if "lr" in r]
    figure, (loss_axis, lr_axis) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=[3, 1])
    loss_axis.plot([r["step"] for r in trained], _values(trained, "train_loss"), label="train loss",
                   alpha=0.6, linewidth=1)
    if evaluated:
        loss_axis.plot([r["step"] for r in evaluated], _values(evaluated, "eval_loss"), "o-", label="eval loss")
    loss_axis.set_ylabel("loss (nats/token)")
    loss_axis.set_title(title)
    loss_axis.grid(alpha=0.3)
    loss_axis.legend()
    lr_axis.plot([r["step"] for r in with_lr], _values(with_lr, "lr"), color="tab:green")
    lr_axis.set_ylabel("learning rate")
    lr_axis.set_xlabel("step")
    lr_axis.grid(alpha=0.3)
    figure.tight_layout()
    return save_figure(figure, out_png)
