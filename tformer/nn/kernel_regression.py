"""Nadaraya–Watson kernel regression, the estimator attention comes from, written as attention.

The estimate at a query x is a weighted mean of the training targets y_i, the weights a softmax over
the training inputs x_i of Gaussian-kernel scores:

    f(x) = sum_i softmax_i(-(x - x_i)^2 / (2 h^2)) y_i

queries = test inputs, keys = training inputs, values = training targets, and the bandwidth h sets how
far a query looks. (The scores equal ``x x_i / h^2 - x_i^2 / (2 h^2)`` up to a term constant in i,
which the softmax drops: dot-product attention with scale 1/h^2 and a per-key bias.)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def nadaraya_watson(queries: Tensor, keys: Tensor, values: Tensor, bandwidth: float | Tensor,
                    mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The Gaussian-kernel estimate at each query and the attention weights it is made of.

    queries (..., Q) and keys (..., K) are scalar inputs; values (..., K) or (..., K, Dv) the targets;
    ``bandwidth`` > 0. ``mask`` (..., Q, K) bool, True where a query may use a key (leave-one-out
    excludes each point's own). Returns the estimate (..., Q) or (..., Q, Dv) and the weights
    (..., Q, K), each row summing to 1.
    """
    if not torch.as_tensor(bandwidth).gt(0).all():
        raise ValueError(f"bandwidth={bandwidth!r} must be positive")
    scalar_values = values.dim() == keys.dim()
    if values.shape[keys.dim() - 1] != keys.shape[-1]:
        raise ValueError(f"{keys.shape[-1]} keys but values of shape {tuple(values.shape)}: one value per key")
    differences = queries.unsqueeze(-1) - keys.unsqueeze(-2)  # (..., Q, K)
    scores = -differences.square() / (2 * bandwidth**2)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (..., Q, K)
    estimate = weights @ (values.unsqueeze(-1) if scalar_values else values)  # (..., Q, 1 or Dv)
    return (estimate.squeeze(-1) if scalar_values else estimate), weights


class KernelRegression(nn.Module):
    """Nadaraya–Watson regression with a learned bandwidth, kept positive as ``exp(log_bandwidth)``.

    ``fit`` trains it by gradient descent on the leave-one-out error of the training points: each
    point is predicted from all the others. Predicting a point from itself too would reward a bandwidth
    shrinking to 0 (every training target reproduced exactly, noise included); leaving it out makes the
    training loss an estimate of the error on new inputs while every point serves both to fit and to
    choose h (a held-out split would spend points of a small set on choosing one number).
    """

    def __init__(self, bandwidth: float = 1.0) -> None:
        super().__init__()
        if bandwidth <= 0:
            raise ValueError(f"bandwidth={bandwidth!r} must be positive")
        self.log_bandwidth = nn.Parameter(torch.tensor(math.log(bandwidth)))

    @property
    def bandwidth(self) -> Tensor:
        return self.log_bandwidth.exp()

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``nadaraya_watson`` at the current bandwidth: the estimate and the weights."""
        return nadaraya_watson(queries, keys, values, self.bandwidth, mask)

    def leave_one_out_loss(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """Mean squared error of predicting each training target from the other points; inputs and
        targets (N,)."""
        others = ~torch.eye(inputs.shape[-1], dtype=torch.bool, device=inputs.device)  # (N, N)
        estimate, _ = self(inputs, inputs, targets, others)
        return (estimate - targets).square().mean()

    def fit(self, inputs: Tensor, targets: Tensor, steps: int = 200, lr: float = 0.05) -> list[float]:
        """Adam on the log-bandwidth against the leave-one-out loss; the loss before each step."""
        optimizer = torch.optim.Adam(self.parameters(), lr=lr)
        losses = []
        for _ in range(steps):
            optimizer.zero_grad()
            loss = self.leave_one_out_loss(inputs, targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses
