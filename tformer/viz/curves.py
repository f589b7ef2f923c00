"""Training curves: train/eval loss and learning rate against step, as a PNG."""

from __future__ import annotations

import json
from pathlib import Path

from tformer.errors import TformerError


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics.jsonl file, one dict per line (a last line cut short by a
    killed run is left out)."""
    records = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number != len(lines):
                raise TformerError(f"{path}:{number}: not a JSON record") from None
    return records


def plot_training_curves(records: list[dict], out_png: str | Path, title: str = "training") -> Path:
    """Draw train loss (and eval loss where present) and the learning rate into ``out_png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trained = [r for r in records if "train_loss" in r]
    evaluated = [r for r in records if "eval_loss" in r]
    with_lr = [r for r in records if "lr" in r]
    figure, (loss_axis, lr_axis) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=[3, 1])
    loss_axis.plot([r["step"] for r in trained], [r["train_loss"] for r in trained], label="train loss",
                   alpha=0.6, linewidth=1)
    if evaluated:
        loss_axis.plot([r["step"] for r in evaluated], [r["eval_loss"] for r in evaluated], "o-", label="eval loss")
    loss_axis.set_ylabel("loss (nats/token)")
    loss_axis.set_title(title)
    loss_axis.grid(alpha=0.3)
    loss_axis.legend()
    lr_axis.plot([r["step"] for r in with_lr], [r["lr"] for r in with_lr], color="tab:green")
    lr_axis.set_ylabel("learning rate")
    lr_axis.set_xlabel("step")
    lr_axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out_png, dpi=110)
    plt.close(figure)
    return Path(out_png)
