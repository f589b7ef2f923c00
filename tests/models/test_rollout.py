"""Attention rollout, patch maps, position similarity and their PNGs (tformer/viz/rollout.py)."""

import pytest
import torch

from tformer.errors import TformerError
from tformer.viz.rollout import (
    HEAD_FUSIONS,
    attention_rollout,
    fuse_heads,
    patch_map,
    plot_attention_maps,
    plot_position_similarity,
    position_similarity,
    upsample_map,
)


def random_attentions(layers=3, batch=2, heads=4, tokens=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, tokens, tokens, generator=generator).softmax(-1) for _ in range(layers)]


@pytest.mark.parametrize("head_fusion", HEAD_FUSIONS)
@pytest.mark.parametrize("residual", [True, False])
def test_rollout_rows_sum_to_one(head_fusion, residual):
    rollout = attention_rollout(random_attentions(), head_fusion, residual)
    assert rollout.shape == (2, 5, 5)
    torch.testing.assert_close(rollout.sum(-1), torch.ones(2, 5))
    assert bool((rollout >= 0).all())


def test_identity_attention_rolls_out_to_the_identity():
    identity = torch.eye(6).expand(1, 3, 6, 6)
    for residual in (True, False):
        torch.testing.assert_close(attention_rollout([identity] * 4, residual=residual), torch.eye(6)[None])


def test_rollout_by_hand():
    """Two layers of one head, worked on paper: A' = (A + I) / row sums, rollout = A2' @ A1'."""
    first = torch.tensor([[1.0, 0.0], [0.5, 0.5]])[None, None]
    second = torch.tensor([[0.5, 0.5], [0.0, 1.0]])[None, None]
    expected = torch.tensor([[0.8125, 0.1875], [0.25, 0.75]])[None]
    torch.testing.assert_close(attention_rollout([first, second]), expected)
    torch.testing.assert_close(attention_rollout([first, second], residual=False), second[0] @ first[0])


def test_head_fusions():
    attention = torch.stack([torch.full((3, 3), 0.1), torch.full((3, 3), 0.5)])[None]  # (1, 2, 3, 3)
    assert fuse_heads(attention, "mean")[0, 0, 0] == pytest.approx(0.3)
    assert fuse_heads(attention, "max")[0, 0, 0] == pytest.approx(0.5)
    assert fuse_heads(attention, "min")[0, 0, 0] == pytest.approx(0.1)
    with pytest.raises(TformerError, match="head_fusion='median' is not one of mean, max, min"):
        fuse_heads(attention, "median")
    with pytest.raises(TformerError, match="expected \\(B, H, T, T\\)"):
        fuse_heads(attention[0], "mean")
    with pytest.raises(TformerError, match="output_attentions=True"):
        attention_rollout([])


def test_patch_map_reads_the_class_row_or_the_mean_of_the_patch_rows():
    matrix = torch.arange(2 * 5 * 5, dtype=torch.float).reshape(2, 5, 5)
    torch.testing.assert_close(patch_map(matrix, (2, 2)), matrix[:, 0, 1:].reshape(2, 2, 2))
    torch.testing.assert_close(patch_map(matrix, (2, 2), "mean")[0, 0, 0], matrix[0, 1:, 1].mean())
    with pytest.raises(TformerError, match="5 tokens are not a class token and a 3 x 3 patch grid"):
        patch_map(matrix, (3, 3))
    with pytest.raises(TformerError, match="pooling='max' is not one of cls, mean"):
        patch_map(matrix, (2, 2), "max")


def test_upsampled_maps_span_zero_to_one():
    maps = upsample_map(torch.rand(3, 4, 4) * 0.01 + 0.2, (28, 28))
    assert maps.shape == (3, 28, 28)
    torch.testing.assert_close(maps.amin(dim=(-2, -1)), torch.zeros(3))
    torch.testing.assert_close(maps.amax(dim=(-2, -1)), torch.ones(3))


def test_position_similarity():
    table = torch.randn(6, 8)
    similarity = position_similarity(table, (2, 3))
    assert similarity.shape == (2, 3, 2, 3)
    torch.testing.assert_close(similarity.reshape(6, 6).diagonal(), torch.ones(6))
    torch.testing.assert_close(similarity.reshape(6, 6), similarity.reshape(6, 6).T)
    with pytest.raises(TformerError, match="for a 3 x 3 grid"):
        position_similarity(table, (3, 3))


def test_pngs_are_written_whole(tmp_path):
    images = torch.rand(2, 1, 28, 28)
    maps = {"rollout": torch.rand(2, 28, 28), "last layer": torch.rand(2, 28, 28)}
    out = plot_attention_maps(images, maps, tmp_path / "maps.png", titles=["seven", "two"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = plot_position_similarity(position_similarity(torch.randn(9, 4), (3, 3)), tmp_path / "positions.png")
    assert out.stat().st_size > 1000
    assert sorted(path.name for path in tmp_path.iterdir()) == ["maps.png", "positions.png"]
    with pytest.raises(TformerError, match="1 \\(grey\\) or 3 \\(RGB\\)"):
        plot_attention_maps(torch.rand(1, 2, 8, 8), {}, tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()
