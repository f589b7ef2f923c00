"""Positional schemes have the properties that make them work."""

import pytest
import torch

from tformer.nn.positions import (
    ALiBi,
    RelativePositionBias,
    RotaryEmbedding,
    alibi_slopes,
    apply_rotary,
    positions_from_mask,
    relative_position_bucket,
    sinusoidal_table,
)


def test_sinusoidal_shift_is_a_fixed_rotation_per_frequency():
    dim, k = 16, 5
    table = sinusoidal_table(64, dim).double()
    frequencies = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    # PE(t + k) = R(k) PE(t), R(k) block-diagonal rotations by k * frequency, the same for every t.
    rotation = torch.zeros(dim, dim, dtype=torch.float64)
    for i, w in enumerate(frequencies * k):
        c, s = torch.cos(w), torch.sin(w)
        rotation[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, s], [-s, c]])
    shifted = table[:-k] @ rotation.T
    torch.testing.assert_close(shifted, table[k:], rtol=0, atol=1e-5)


def test_rope_scores_depend_only_on_the_offset():
    rope = RotaryEmbedding(8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(pq, pk):
        cq, sq = rope(torch.tensor([[pq]]))
        ck, sk = rope(torch.tensor([[pk]]))
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum()

    torch.testing.assert_close(score(3, 1), score(13, 11), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(score(40, 37), score(7, 4), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(score(3, 1), score(3, 2))


def test_rope_rotates_each_pair_counterclockwise_by_position_times_frequency():
    """Half-split pairs (x[i], x[i + Dh/2]) turn by the angle p * base^(-2i/Dh), counterclockwise:
    (a, b) -> (a cos - b sin, a sin + b cos), as a 2x2 rotation matrix per pair computes it."""
    head_dim, base = 8, 10000.0
    rope = RotaryEmbedding(head_dim, base)
    x = torch.randn(1, 2, 3, head_dim, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 7]])
    cos, sin = rope(positions, dtype=torch.float64)
    rotated = apply_rotary(x, cos, sin)
    half = head_dim // 2
    expected = torch.empty_like(x)
    for t, position in enumerate(positions[0].tolist()):
        for i in range(half):
            angle = torch.tensor(position * base ** (-2 * i / head_dim), dtype=torch.float64)
            rotation = torch.stack([torch.stack([angle.cos(), -angle.sin()]), torch.stack([angle.sin(), angle.cos()])])
            pair = torch.stack([x[..., t, i], x[..., t, i + half]], dim=-1)  # (1, 2, 2)
            turned = pair @ rotation.T
            expected[..., t, i], expected[..., t, i + half] = turned[..., 0], turned[..., 1]
    torch.testing.assert_close(rotated, expected, rtol=0, atol=1e-6)
    # A hard-coded point: (1, 0) in the first pair at position 1 turns by 1 radian.
    unit = torch.zeros(1, 1, 1, head_dim)
    unit[..., 0] = 1.0
    cos, sin = rope(torch.tensor([[1]]))
    turned = apply_rotary(unit, cos, sin)[0, 0, 0, [0, half]].tolist()
    assert turned == pytest.approx([0.5403023, 0.8414710], abs=1e-6)  # (cos 1, sin 1)


def test_rope_preserves_norms():
    rope = RotaryEmbedding(16)
    x = torch.randn(2, 3, 5, 16)
    cos, sin = rope(torch.arange(5).expand(2, 5))
    torch.testing.assert_close(apply_rotary(x, cos, sin).norm(dim=-1), x.norm(dim=-1))


def test_alibi_slopes_and_bias():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    assert len(alibi_slopes(6)) == 6
    bias = ALiBi(4)(torch.arange(3)[None], torch.arange(3)[None])
    assert bias.shape == (1, 4, 3, 3)
    assert torch.all(bias.diagonal(dim1=-2, dim2=-1) == 0) and bias[0, 0, 2, 0] == -2 * alibi_slopes(4)[0]


def test_relative_buckets_exact_near_log_far_and_direction():
    rel = torch.tensor([-3, -1, 0, 1, 3, 200])
    bidirectional = relative_position_bucket(rel, True, 32, 128)
    assert bidirectional[2] == 0 and bidirectional[3] == 17 and bidirectional[1] == 1
    assert bidirectional[5] == 31  # clipped at the last bucket
    causal = relative_position_bucket(rel, False, 32, 128)
    assert causal[3] == 0 and causal[4] == 0 and causal[0] == 3  # future offsets share bucket 0
    bias = RelativePositionBias(4, bidirectional=True)(torch.arange(5)[None], torch.arange(5)[None])
    assert bias.shape == (1, 4, 5, 5)


def test_positions_from_left_padding():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]


def test_the_split_sinusoidal_layout_is_the_interleaved_table_with_sines_first():
    interleaved = sinusoidal_table(50, 16)
    split = sinusoidal_table(50, 16, layout="split")
    torch.testing.assert_close(split, torch.cat([interleaved[:, 0::2], interleaved[:, 1::2]], dim=1))
