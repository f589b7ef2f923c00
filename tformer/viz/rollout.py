"""Where a Vision Transformer looks: attention rollout (Abnar & Zuidema, 2020), the class token's
last-layer attention and the similarity of learned position embeddings (the ViT paper's Figure 7),
as tensors and as PNGs.

Every function takes what a model returns with ``output_attentions=True``: one (B, H, T, T) tensor
per layer, T = 1 + number of patches, the class token first (a mean-pooled model has it too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from tformer.errors import TformerError
from tformer.nn.heads import POOLINGS
from tformer.viz.figures import pyplot, save_figure

HEAD_FUSIONS = ("mean", "max", "min")


def fuse_heads(attention: Tensor, head_fusion: str = "mean") -> Tensor:
    """(B, H, T, T) -> (B, T, T): the heads' mean, maximum or minimum."""
    if head_fusion not in HEAD_FUSIONS:
        raise TformerError(f"head_fusion={head_fusion!r} is not one of {', '.join(HEAD_FUSIONS)}")
    if attention.dim() != 4 or attention.shape[-1] != attention.shape[-2]:
        raise TformerError(f"an attention map of shape {tuple(attention.shape)}; expected (B, H, T, T)")
    attention = attention.float()
    if head_fusion == "mean":
        return attention.mean(dim=1)
    return attention.amax(dim=1) if head_fusion == "max" else attention.amin(dim=1)


def attention_rollout(attentions: Sequence[Tensor], head_fusion: str = "mean", residual: bool = True) -> Tensor:
    """(B, T, T): how much each token of the last layer draws on each input token, through every
    layer. Per layer the heads are fused; with ``residual`` the skip connection is added as the
    identity, A' = (A + I) / row sums (for mean fusion exactly the paper's 0.5 A + 0.5 I); the
    layers' matrices multiply from the first to the last, so every row sums to 1."""
    if not attentions:
        raise TformerError("attention rollout needs the attention maps of at least one layer "
                           "(call the model with output_attentions=True)")
    rollout = None
    for attention in attentions:
        fused = fuse_heads(attention, head_fusion)  # (B, T, T)
        if residual:
            fused = fused + torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
        fused = fused / fused.sum(dim=-1, keepdim=True)
        rollout = fused if rollout is None else fused @ rollout
    return rollout


def patch_map(matrix: Tensor, grid: tuple[int, int], pooling: str = "cls") -> Tensor:
    """(B, 1 + N, 1 + N) token-to-token weights -> (B, rows, columns) over the patch grid: what the
    pooled vector draws from each patch: the class token's row (``pooling="cls"``), or the mean of
    the patches' rows (``"mean"``)."""
    if pooling not in POOLINGS:
        raise TformerError(f"pooling={pooling!r} is not one of {', '.join(POOLINGS)}")
    rows, columns = grid
    if matrix.shape[-1] != 1 + rows * columns:
        raise TformerError(f"{matrix.shape[-1]} tokens are not a class token and a {rows} x {columns} patch grid")
    weights = matrix[:, 0, 1:] if pooling == "cls" else matrix[:, 1:, 1:].mean(dim=1)  # (B, N)
    return weights.reshape(-1, rows, columns)


def upsample_map(maps: Tensor, size: tuple[int, int]) -> Tensor:
    """(B, rows, columns) -> (B, H, W), bilinear, each map scaled to [0, 1] (for an overlay)."""
    resized = F.interpolate(maps[:, None].float(), size=size, mode="bilinear", align_corners=False)[:, 0]
    low = resized.amin(dim=(-2, -1), keepdim=True)
    high = resized.amax(dim=(-2, -1), keepdim=True)
    return (resized - low) / (high - low).clamp_min(1e-12)


def position_similarity(table: Tensor, grid: tuple[int, int]) -> Tensor:
    """(rows, columns, rows, columns): the cosine similarity of each patch's position embedding to
    every other's. ``table`` (N, D) holds the patches' rows only (no class position)."""
    rows, columns = grid
    if table.dim() != 2 or table.shape[0] != rows * columns:
        raise TformerError(f"a position table of shape {tuple(table.shape)} for a {rows} x {columns} grid")
    unit = F.normalize(table.float(), dim=-1)
    return (unit @ unit.T).reshape(rows, columns, rows, columns)


def plot_attention_maps(images: Tensor, maps: Mapping[str, Tensor], out_png: str | Path,
                        titles: Sequence[str] | None = None) -> Path:
    """One row per image: the image, then each named (N, H, W) map in [0, 1] over it. ``images``
    (N, C, H, W) with values in [0, 1] (C = 1 grey or 3 RGB)."""
    pictures = [_displayable(image) for image in images]
    plt = pyplot()
    count = len(pictures)
    figure, axes = plt.subplots(count, 1 + len(maps), figsize=(2.4 * (1 + len(maps)), 2.4 * count), squeeze=False)
    for row, picture in enumerate(pictures):
        columns = [("image", None), *maps.items()]
        for column, (name, values) in enumerate(columns):
            axis = axes[row][column]
            axis.imshow(picture, cmap="gray" if picture.ndim == 2 else None, vmin=0.0, vmax=1.0)
            if values is not None:
                axis.imshow(values[row].numpy(), cmap="jet", alpha=0.5, vmin=0.0, vmax=1.0)
            axis.set_xticks([])
            axis.set_yticks([])
            if row == 0:
                axis.set_title(name, fontsize=9)
        if titles is not None:
            axes[row][0].set_ylabel(titles[row], fontsize=8)
    figure.tight_layout()
    return save_figure(figure, out_png)


def plot_position_similarity(similarity: Tensor, out_png: str | Path, title: str = "") -> Path:
    """The ViT paper's Figure 7: for each patch position (a small panel in its place on the grid), its
    position embedding's cosine similarity to every other position's."""
    plt = pyplot()
    rows, columns = similarity.shape[:2]
    figure, axes = plt.subplots(rows, columns, figsize=(0.6 * columns + 1.2, 0.6 * rows + 0.6), squeeze=False)
    image = None
    for row in range(rows):
        for column in range(columns):
            axis = axes[row][column]
            image = axis.imshow(similarity[row, column].numpy(), cmap="viridis", vmin=-1.0, vmax=1.0)
            axis.set_xticks([])
            axis.set_yticks([])
    figure.colorbar(image, ax=axes, fraction=0.03, pad=0.02, label="cosine similarity")
    figure.suptitle(title or "position embedding similarity", fontsize=10)
    return save_figure(figure, out_png)


def _displayable(image: Tensor):
    """(C, H, W) in [0, 1] -> what imshow draws: (H, W) for one channel, (H, W, 3) for three."""
    if image.shape[0] not in (1, 3):
        raise TformerError(f"an image with {image.shape[0]} channels; 1 (grey) or 3 (RGB) can be drawn")
    image = image.float().clamp(0.0, 1.0)
    return image[0].numpy() if image.shape[0] == 1 else image.permute(1, 2, 0).numpy()
