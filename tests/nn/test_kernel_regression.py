"""Nadaraya–Watson kernel regression is softmax attention: the Gaussian-kernel estimate equals the
library's reference attention on the same inputs, and a bandwidth learned on the leave-one-out error
beats a badly chosen one on held-out points."""

from __future__ import annotations

import math

import pytest
import torch

from tformer.nn.attention import attention_reference
from tformer.nn.kernel_regression import KernelRegression, nadaraya_watson


def toy(num: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The lectures' problem: y = 2 sin x + x^0.8 + noise, x uniform in [0, 5)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(num, generator=generator, dtype=torch.float64) * 5
    return x, 2 * torch.sin(x) + x**0.8 + 0.5 * torch.randn(num, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("bandwidth", [1.0, 0.3])
def test_the_estimate_is_reference_attention(bandwidth):
    """-(q - k)^2 / (2 h^2) = q k / h^2 - k^2 / (2 h^2) - q^2 / (2 h^2); the last term is the same for every
    key and leaves the softmax, so the estimate is dot-product attention with scale 1 / h^2 and the additive
    per-key bias -k^2 / (2 h^2), on one head with one feature: to 1e-6 at h = 1."""
    keys, values = toy(40, seed=1)
    queries = torch.linspace(-0.5, 5.5, 23, dtype=torch.float64)
    estimate, weights = nadaraya_watson(queries, keys, values, bandwidth)
    bias = (-keys.square() / (2 * bandwidth**2)).view(1, 1, 1, -1)  # (1, 1, 1, K)
    expected, expected_weights = attention_reference(queries.view(1, 1, -1, 1), keys.view(1, 1, -1, 1),
                                                     values.view(1, 1, -1, 1), mask=bias, scale=1 / bandwidth**2)
    # The reference's softmax runs in float32 on scores that grow as 1 / h^2, and so does their rounding.
    tolerance = 1e-6 / bandwidth**2
    torch.testing.assert_close(estimate, expected.view(-1), rtol=0, atol=tolerance)
    torch.testing.assert_close(weights, expected_weights.view(23, 40), rtol=0, atol=tolerance)
    torch.testing.assert_close(weights.sum(-1), torch.ones(23, dtype=torch.float64), rtol=0, atol=1e-12)
    assert estimate.shape == (23,) and weights.shape == (23, 40)


def test_vector_values_batches_and_a_mask():
    """Values (K, Dv) give (Q, Dv) estimates; leading dimensions batch; a masked key gets no weight."""
    generator = torch.Generator().manual_seed(2)
    queries, keys = torch.randn(3, 5, generator=generator), torch.randn(3, 7, generator=generator)
    values = torch.randn(3, 7, 4, generator=generator)
    mask = torch.ones(3, 5, 7, dtype=torch.bool)
    mask[..., 0] = False
    estimate, weights = nadaraya_watson(queries, keys, values, 0.5, mask)
    assert estimate.shape == (3, 5, 4) and weights.shape == (3, 5, 7)
    assert bool((weights[..., 0] == 0).all())
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 5))
    for batch in range(3):
        one, _ = nadaraya_watson(queries[batch], keys[batch, 1:], values[batch, 1:], 0.5)
        torch.testing.assert_close(estimate[batch], one)


def test_bad_bandwidths_and_shapes_are_refused():
    keys, values = toy(5, seed=0)
    for bandwidth in (0.0, -1.0, torch.tensor(0.0)):
        with pytest.raises(ValueError, match="must be positive"):
            nadaraya_watson(keys, keys, values, bandwidth)
    with pytest.raises(ValueError, match="one value per key"):
        nadaraya_watson(keys, keys, values[:4], 1.0)
    with pytest.raises(ValueError, match="must be positive"):
        KernelRegression(bandwidth=0.0)


def test_the_leave_one_out_loss_leaves_each_point_out():
    """The loss predicts each point from the others only: with its own key it would be near 0 at a
    tiny bandwidth; without it, it is the distance to the nearest neighbour's target."""
    inputs, targets = toy(30, seed=3)
    model = KernelRegression(bandwidth=1e-4)
    distances = (inputs[:, None] - inputs[None, :]).abs().masked_fill(torch.eye(30, dtype=torch.bool), math.inf)
    nearest = targets[distances.argmin(dim=1)]  # each point's nearest other point's target
    with torch.no_grad():
        loss = model.leave_one_out_loss(inputs, targets)
    torch.testing.assert_close(loss, (nearest - targets).square().mean())


def test_a_learned_bandwidth_beats_a_badly_chosen_one_on_held_out_points():
    """From h = 5 (everything averaged: a near-flat fit) gradient descent on the leave-one-out error moves
    the bandwidth to the minimum a fine grid finds, and the held-out error falls by more than half."""
    inputs, targets = toy(60, seed=0)
    held_out, truth = toy(200, seed=1)
    model = KernelRegression(bandwidth=5.0).double()

    def held_out_mse() -> float:
        with torch.no_grad():
            return float((model(held_out, inputs, targets)[0] - truth).square().mean())

    before = held_out_mse()
    losses = model.fit(inputs, targets, steps=300, lr=0.05)
    after = held_out_mse()
    grid = torch.exp(torch.linspace(math.log(0.02), math.log(5.0), 400, dtype=torch.float64))
    with torch.no_grad():
        grid_losses = torch.stack([KernelRegression(float(h)).double().leave_one_out_loss(inputs, targets)
                                   for h in grid])
    best = float(grid[grid_losses.argmin()])
    assert losses[-1] < losses[0]
    assert model.bandwidth.item() == pytest.approx(best, rel=0.05)
    assert after < 0.5 * before
