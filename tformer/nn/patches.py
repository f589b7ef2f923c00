"""The front end of a Vision Transformer: images (B, C, H, W) -> the class token and one vector per
patch, with their positions, (B, 1 + N, D); and the resampling of a position table to another patch
grid, so a model trained at one image size runs at another."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.nn.positions import sinusoidal_table


class PatchEmbedding(nn.Module):
    """Cut images into ``patch_size`` x ``patch_size`` patches and project each to ``d_model``: one
    Conv2d whose kernel and stride are the patch size, which is a Linear applied to every flattened
    patch (C, P, P). (B, C, H, W) -> (B, N, D), N = (H / P) * (W / P), patches in row-major order."""

    def __init__(self, num_channels: int, d_model: int, patch_size: int) -> None:
        super().__init__()
        self.projection = nn.Conv2d(num_channels, d_model, kernel_size=patch_size, stride=patch_size)

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.projection(pixel_values).flatten(2).transpose(1, 2)  # (B, D, H/P, W/P) -> (B, N, D)


def sincos_2d_positions(grid_height: int, grid_width: int, dim: int) -> Tensor:
    """Fixed positions of a patch grid, (grid_height * grid_width, dim) in row-major order: the first
    dim/2 entries are the sinusoidal encoding of the patch's row, the last dim/2 that of its column."""
    rows = sinusoidal_table(grid_height, dim // 2)  # (h, dim/2)
    columns = sinusoidal_table(grid_width, dim // 2)  # (w, dim/2)
    grid = torch.cat([rows[:, None].expand(-1, grid_width, -1), columns[None].expand(grid_height, -1, -1)], dim=-1)
    return grid.reshape(grid_height * grid_width, dim)


def resize_position_table(table: Tensor, grid: tuple[int, int]) -> Tensor:
    """A (1 + N, D) table, the class token's row then a square grid of N patch rows, resampled to a
    ``grid`` = (rows, columns) of patches: (1 + rows * columns, D). The class row is kept; the patch
    rows are interpolated bicubically over the grid (to the given size, ``align_corners=False``, as
    Hugging Face's ViT does), so the same grid gives the same table back."""
    num_patches, dim = table.shape[0] - 1, table.shape[1]
    side = math.isqrt(num_patches)
    if side * side != num_patches:
        raise ValueError(f"a position table of {num_patches} patch rows is not a square grid")
    patches = table[1:].reshape(1, side, side, dim).permute(0, 3, 1, 2)  # (1, D, side, side)
    resized = F.interpolate(patches, size=grid, mode="bicubic", align_corners=False)  # (1, D, rows, columns)
    return torch.cat([table[:1], resized.permute(0, 2, 3, 1).reshape(-1, dim)])


class ImageEmbedding(nn.Module):
    """Images (B, C, H, W) -> (B, 1 + N, D): ``cls_token`` then the patch vectors, plus positions:
    a learned table (``position_embeddings``, (1, 1 + N, D), a parameter) or fixed 2D sine-cosine (a
    buffer; the class token's row is zero), by ``config.positional``. Hugging Face's ViT names and
    shapes. Dropout and any norm after it are the stack's."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_channels = config.num_channels
        self.patch_size = config.patch_size
        self.image_size = config.image_size
        self.learned = config.positional == "learned"
        self.patches = PatchEmbedding(config.num_channels, config.d_model, config.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.d_model))
        grid = config.patch_grid
        if self.learned:
            self.position_embeddings = nn.Parameter(torch.zeros(1, 1 + grid * grid, config.d_model))
        else:
            self.register_buffer("position_embeddings", self.fixed_positions(grid, grid)[None], persistent=False)

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    def fixed_positions(self, rows: int, columns: int) -> Tensor:
        """(1 + rows * columns, D) sine-cosine positions of a grid, the class token's row zero."""
        dim = self.cls_token.shape[-1]
        patches = sincos_2d_positions(rows, columns, dim)
        return torch.cat([patches.new_zeros(1, dim), patches]).to(self.cls_token.device)

    def positions(self, rows: int, columns: int) -> Tensor:
        """(1, 1 + rows * columns, D) positions for a grid of patches: the model's own for its grid,
        else resampled (learned) or computed for that grid (fixed)."""
        if (rows, columns) == (self.grid, self.grid):
            return self.position_embeddings
        if self.learned:
            return resize_position_table(self.position_embeddings[0], (rows, columns))[None]
        return self.fixed_positions(rows, columns)[None].to(self.position_embeddings.dtype)

    def resize(self, image_size: int) -> None:
        """Read images of ``image_size`` from now on: the positions become those of its grid."""
        grid = image_size // self.patch_size
        positions = self.positions(grid, grid).detach()
        self.image_size = image_size
        if self.learned:
            self.position_embeddings = nn.Parameter(positions.clone())
        else:
            self.position_embeddings = positions

    def forward(self, pixel_values: Tensor, interpolate_pos_encoding: bool = False) -> Tensor:
        """pixel_values (B, C, H, W), already normalised -> (B, 1 + N, D). Without
        ``interpolate_pos_encoding`` the images must be ``image_size`` square; with it, any multiple of
        the patch size, the positions resampled to that grid (``resize_position_table``)."""
        self._check(pixel_values, interpolate_pos_encoding)
        batch, _, height, width = pixel_values.shape
        weight = self.patches.projection.weight
        if pixel_values.dtype != weight.dtype:  # float32 images into a half-precision model
            pixel_values = pixel_values.to(weight.dtype)
        patches = self.patches(pixel_values)  # (B, N, D)
        x = torch.cat([self.cls_token.expand(batch, -1, -1).to(patches.dtype), patches], dim=1)
        return x + self.positions(height // self.patch_size, width // self.patch_size)

    def _check(self, pixel_values: Tensor, interpolate_pos_encoding: bool) -> None:
        if pixel_values.dim() != 4:
            raise ValueError(f"pixel_values must be (B, C, H, W), got shape {tuple(pixel_values.shape)}")
        if not pixel_values.is_floating_point():
            raise ValueError(f"pixel_values must be normalised floats, got {pixel_values.dtype} (uint8 images go "
                             "through the model's image_processor first)")
        _, channels, height, width = pixel_values.shape
        if channels != self.num_channels:
            raise ValueError(f"pixel_values have {channels} channels, the model reads {self.num_channels} "
                             f"(num_channels={self.num_channels})")
        size = self.image_size
        if not interpolate_pos_encoding and (height, width) != (size, size):
            raise ValueError(f"pixel_values are {height} x {width}, the model reads {size} x {size} "
                             f"(image_size={size}); pass interpolate_pos_encoding=True, or resize the model "
                             f"(model.resize_image)")
        if height % self.patch_size or width % self.patch_size:
            raise ValueError(f"pixel_values are {height} x {width}, not a multiple of patch_size={self.patch_size} "
                             "on both sides")
