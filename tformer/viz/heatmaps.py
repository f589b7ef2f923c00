"""Attention maps of a text model as heatmaps: one panel per layer and head, the query tokens down
the side and the key tokens along the bottom, every weight on one 0-to-1 colour scale so panels
compare. Takes what a decoder or an encoder returns with ``output_attentions=True``: one
(B, H, T, T) tensor per layer."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from tformer.errors import TformerError
from tformer.tokenizers.byte_level import token_bytes
from tformer.viz.figures import pyplot, save_figure

# Whitespace drawn as a visible mark, so a space token is not a blank label.
VISIBLE_WHITESPACE = str.maketrans({" ": "\u2423", "\n": "\u21b5", "\t": "\u2192", "\r": "\u240d"})
MAX_FIGURE_INCHES = 32.0  # the longer side of the whole grid: past this a PNG is too big to open comfortably
MIN_LABEL_POINTS = 3.0  # token labels smaller than this are left off (choose --layer / --head to read them)


def token_labels(tokenizer, ids: Sequence[int]) -> list[str]:
    """What to print for each token on a map's axes: its vocabulary string, except that a byte-level
    BPE token (GPT-2's "Ġthe") is shown as the text it stands for (a byte of a character split over
    tokens as "\ufffd"), and spaces, newlines and tabs as visible marks (␣ ↵ →)."""
    labels = []
    for token_id in ids:
        token = tokenizer.id_to_token(int(token_id))
        if token is None:
            raise TformerError(f"token id {int(token_id)} is not in the tokenizer's vocabulary")
        if getattr(tokenizer, "kind", None) == "bpe":
            token = token_bytes(token).decode("utf-8", errors="replace")
        labels.append(token.translate(VISIBLE_WHITESPACE))
    return labels


def select_maps(attentions: Sequence[Tensor], layer: int | None = None,
                head: int | None = None) -> tuple[Tensor, list[int], list[int]]:
    """The maps of the first sequence to draw, (rows, columns, T, T): every layer (rows) and head
    (columns), or the one ``layer`` / ``head`` chosen, both counted from 1; with the 1-based layer and
    head numbers of the rows and columns."""
    if not attentions:
        raise TformerError("no attention maps to draw (call the model with output_attentions=True)")
    num_layers, num_heads = len(attentions), attentions[0].shape[1]
    for name, value, count in (("layer", layer, num_layers), ("head", head, num_heads)):
        if value is not None and not 1 <= value <= count:
            raise TformerError(f"{name} {value} is out of range: this model has {count} {name}s, numbered 1 to {count}")
    layers = list(range(1, num_layers + 1)) if layer is None else [layer]
    heads = list(range(1, num_heads + 1)) if head is None else [head]
    maps = torch.stack([attentions[number - 1][0] for number in layers])  # (rows, H, T, T)
    return maps[:, [number - 1 for number in heads]].detach().float(), layers, heads  # drawn, never differentiated


def attention_heatmap_figure(maps: Tensor, tokens: Sequence[str], layers: Sequence[int], heads: Sequence[int],
                             title: str = ""):
    """A matplotlib figure with a (rows, columns) grid of heatmaps of ``maps`` (rows, columns, T, T):
    row r is layer ``layers[r]``, column c head ``heads[c]``; each panel's rows are the queries and its
    columns the keys. Token labels go on the left column and the bottom row when they fit at a
    readable size. Returns the figure and its (rows, columns) array of axes."""
    if maps.dim() != 4 or maps.shape[-2] != maps.shape[-1] or tuple(maps.shape[:2]) != (len(layers), len(heads)):
        raise TformerError(f"maps of shape {tuple(maps.shape)} for {len(layers)} layers x {len(heads)} heads; "
                           "expected (layers, heads, T, T)")
    rows, columns, length = maps.shape[0], maps.shape[1], maps.shape[-1]
    if len(tokens) != length:
        raise TformerError(f"{len(tokens)} token labels for maps over {length} tokens")
    panel = min(max(1.8, 0.1 * length + 0.8), 7.0, MAX_FIGURE_INCHES / max(rows, columns))  # inches per panel
    label_points = min(9.0, 0.7 * panel * 72 / length)
    plt = pyplot()
    figure, axes = plt.subplots(rows, columns, figsize=(panel * columns + 1.2, panel * rows + 0.6), squeeze=False,
                                layout="constrained")
    image = None
    for row, layer in enumerate(layers):
        for column, head in enumerate(heads):
            axis = axes[row][column]
            image = axis.imshow(maps[row, column].numpy(), cmap="viridis", vmin=0.0, vmax=1.0,
                                interpolation="nearest")
            axis.set_xticks([])
            axis.set_yticks([])
            if label_points >= MIN_LABEL_POINTS and column == 0:
                axis.set_yticks(range(length), labels=list(tokens), fontsize=label_points)
            if label_points >= MIN_LABEL_POINTS and row == rows - 1:
                axis.set_xticks(range(length), labels=list(tokens), fontsize=label_points, rotation=90)
            if row == 0:
                axis.set_title(f"head {head}", fontsize=9)
            if column == 0:
                axis.set_ylabel(f"layer {layer}", fontsize=9)
    figure.colorbar(image, ax=axes, fraction=0.03, pad=0.02, label="attention weight")
    if title:
        figure.suptitle(title, fontsize=10)
    return figure, axes


def plot_attention_heatmaps(maps: Tensor, tokens: Sequence[str], layers: Sequence[int], heads: Sequence[int],
                            out_png: str | Path, title: str = "") -> Path:
    """Draw ``attention_heatmap_figure`` into ``out_png`` (whole or not at all)."""
    figure, _ = attention_heatmap_figure(maps, tokens, layers, heads, title)
    return save_figure(figure, out_png)
