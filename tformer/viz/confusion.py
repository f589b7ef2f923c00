"""A confusion matrix as a PNG: counts in each cell, shaded by the fraction of the true class (row), so
classes of different sizes read alike."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tformer.errors import TformerError
from tformer.viz.figures import pyplot, save_figure


def plot_confusion_matrix(matrix, label_names: Sequence[str], out_png: str | Path,
                          title: str = "confusion matrix") -> Path:
    """Draw the (C, C) counts ``matrix`` (row = true class, column = predicted) into ``out_png``; the
    file appears whole or not at all (written under a temporary name, then renamed)."""
    plt = pyplot()
    counts = np.asarray(matrix, dtype=np.int64)
    if counts.ndim != 2 or counts.shape[0] != counts.shape[1] or counts.shape[0] != len(label_names):
        raise TformerError(f"a confusion matrix of shape {counts.shape} for {len(label_names)} label names")
    totals = counts.sum(axis=1, keepdims=True)
    fractions = counts / np.maximum(totals, 1)
    size = max(4.0, 0.6 * len(label_names) + 2.5)
    figure, axis = plt.subplots(figsize=(size, size * 0.9))
    image = axis.imshow(fractions, cmap="Blues", vmin=0.0, vmax=1.0)
    figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04, label="fraction of the true class")
    ticks = range(len(label_names))
    axis.set_xticks(ticks, labels=list(label_names), rotation=45, ha="right")
    axis.set_yticks(ticks, labels=list(label_names))
    axis.set_xlabel("predicted")
    axis.set_ylabel("true")
    axis.set_title(f"{title} ({int(counts.sum()):,} examples)")
    for row in ticks:
        for column in ticks:
            axis.text(column, row, f"{counts[row, column]:,}", ha="center", va="center", fontsize=8,
                      color="white" if fractions[row, column] > 0.5 else "black")
    figure.tight_layout()
    return save_figure(figure, out_png)
