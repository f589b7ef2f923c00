"""Alignment plots: how a translation model's output tokens attend to the source tokens, the figure of
Bahdanau et al. (2015). A row per output token, a column per source token, weights on one 0-to-1 scale.

``alignment_weights`` turns a model's cross-attention (per layer (B, H, T, S): a transformer's; one layer
of one head: the attention RNN's) into one (T, S) map: a chosen layer and head, or their mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from tformer.errors import TformerError
from tformer.viz.figures import pyplot, save_figure
from tformer.viz.heatmaps import select_maps


def alignment_weights(cross_attentions: Sequence[Tensor], layer: int | None = None,
                      head: int | None = None) -> Tensor:
    """The first sentence's map (T, S): layer ``layer`` and head ``head`` (counted from 1), or the mean over
    the layers / heads not chosen. Each row still sums to 1."""
    maps, _, _ = select_maps(cross_attentions, layer, head)  # (layers, heads, T, S): the chosen ones
    return maps.mean(dim=(0, 1))


def plot_alignment(weights: Tensor, source_tokens: Sequence[str], output_tokens: Sequence[str],
                   out_png: str | Path, title: str = "") -> Path:
    """Draw ``weights`` (T, S): output tokens down the side, source tokens along the top."""
    rows, columns = weights.shape
    if (len(output_tokens), len(source_tokens)) != (rows, columns):
        raise TformerError(f"{len(output_tokens)} x {len(source_tokens)} token labels for a {rows} x {columns} map")
    cell = 0.32  # inches per token
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(max(3.5, cell * columns + 2.2), max(3.0, cell * rows + 1.6)),
                                layout="constrained")
    image = axis.imshow(weights.numpy(), cmap="Greys", vmin=0.0, vmax=1.0, interpolation="nearest")
    axis.set_xticks(range(columns), labels=list(source_tokens), rotation=90, fontsize=8)
    axis.set_yticks(range(rows), labels=list(output_tokens), fontsize=8)
    axis.xaxis.tick_top()
    axis.set_xlabel("source")
    axis.set_ylabel("translation")
    figure.colorbar(image, ax=axis, fraction=0.04, pad=0.02, label="attention weight")
    if title:
        figure.suptitle(title, fontsize=9)
    return save_figure(figure, out_png)
