"""Alignment plots: how a translation model's output tokens attend to the source tokens, the figure of
Bahdanau et al. (2015). A row per output token, a column per source token, weights on one 0-to-1 scale.

``alignment_weights`` turns a model's cross-attention (per layer (B, H, T, S): a transformer's; one layer
of one head: the attention RNN's) into one (T, S) map: a chosen layer and head, or their mean.
"""

from __future__ import annotations

import math
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


def plot_audio_alignment(spectrogram: Tensor, weights: Tensor, output_tokens: Sequence[str], seconds: float,
                         window_seconds: float, out_png: str | Path, title: str = "") -> Path:
    """A speech model's transcript over its audio: the log-mel ``spectrogram`` (M, F) of one window on top and,
    below it on the same time axis, ``weights`` (T, S): each output token's cross-attention over the S encoder
    frames that cover the window (Whisper's stem halves the F mel frames). Both span ``window_seconds`` and are
    drawn up to ``seconds`` of audio (the recording; the silence padding the window is left off, and the title
    says how much weight fell there)."""
    mels = spectrogram.shape[0]
    rows, columns = weights.shape
    if len(output_tokens) != rows:
        raise TformerError(f"{len(output_tokens)} token labels for {rows} rows of weights")
    seconds = min(seconds, window_seconds)
    shown = max(1, min(columns, math.ceil(columns * seconds / window_seconds)))  # the frames holding audio
    padding_weight = float(weights[:, shown:].sum(-1).mean()) if shown < columns else 0.0
    plt = pyplot()
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, layout="constrained",
                                         figsize=(min(16.0, max(6.0, 2.2 * seconds + 2.0)), 2.4 + 0.2 * rows),
                                         height_ratios=(2.0, max(1.5, 0.2 * rows)))
    top.imshow(spectrogram.numpy(), origin="lower", aspect="auto", cmap="magma", interpolation="nearest",
               extent=(0.0, window_seconds, 0, mels))
    top.set_ylabel("mel bin")
    image = bottom.imshow(weights.numpy(), aspect="auto", cmap="Greys", vmin=0.0, vmax=float(weights.max()),
                          interpolation="nearest", extent=(0.0, window_seconds, rows - 0.5, -0.5))
    bottom.set_yticks(range(rows), labels=list(output_tokens), fontsize=8)
    bottom.set_ylabel("transcript")
    bottom.set_xlabel("seconds")
    bottom.set_xlim(0.0, seconds)
    figure.colorbar(image, ax=bottom, fraction=0.04, pad=0.02, label="cross-attention")
    note = (f" ({padding_weight:.0%} of the weight on the silence after the recording)"
            if padding_weight >= 0.005 else "")
    figure.suptitle(f"{title}{note}" if title else note.strip(), fontsize=9)
    return save_figure(figure, out_png)
