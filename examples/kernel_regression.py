"""Nadaraya–Watson kernel regression as attention on a 1-D toy problem (the lectures' example).

y = 2 sin(x) + x^0.8 + noise at 50 random training inputs in [0, 5]; the estimate at 50 test inputs
is attention over the training points (queries = test inputs, keys = training inputs, values =
training targets). Prints the test MSE, against the noise-free curve, of the mean of the targets (no
attention), the Gaussian kernel at a fixed bandwidth (non-parametric) and at a bandwidth learned by
gradient descent on the leave-one-out error; draws the fits and both attention-weight matrices.

    python examples/kernel_regression.py                      # -> docs/images/kernel-regression-*.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from tformer.nn.kernel_regression import KernelRegression, nadaraya_watson
from tformer.viz.figures import pyplot, save_figure


def true_function(x: torch.Tensor) -> torch.Tensor:
    return 2 * torch.sin(x) + x**0.8


def toy_data(num_train: int, noise: float, seed: int) -> tuple[torch.Tensor, ...]:
    """Sorted training inputs in [0, 5) with noisy targets; evenly spaced test inputs with exact ones."""
    generator = torch.Generator().manual_seed(seed)
    x_train = (torch.rand(num_train, generator=generator) * 5).sort().values
    y_train = true_function(x_train) + noise * torch.randn(num_train, generator=generator)
    x_test = torch.arange(0, 5, 0.1)
    return x_train, y_train, x_test, true_function(x_test)


def plot_fits(x_train, y_train, x_test, y_true, fits: dict[str, torch.Tensor], out_png: Path) -> Path:
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    axis.plot(x_test, y_true, color="black", label="truth")
    for name, y_hat in fits.items():
        axis.plot(x_test, y_hat, label=name)
    axis.scatter(x_train, y_train, s=12, color="grey", alpha=0.6, label="training points")
    axis.set_xlabel("x")
    axis.set_ylabel("y")
    axis.legend(fontsize=8)
    axis.set_title("Nadaraya–Watson regression as attention")
    figure.tight_layout()
    return save_figure(figure, out_png)


def plot_weights(x_train, x_test, weights: dict[str, torch.Tensor], out_png: Path) -> Path:
    plt = pyplot()
    figure, axes = plt.subplots(1, len(weights), figsize=(4.2 * len(weights), 4.0), squeeze=False,
                                layout="constrained")
    top = max(float(matrix.max()) for matrix in weights.values())  # one colour scale for every panel
    image = None
    for axis, (name, matrix) in zip(axes[0], weights.items(), strict=True):
        # Each cell at its training input and test input: the training inputs are not evenly spaced.
        image = axis.pcolormesh(x_train, x_test, matrix, cmap="Reds", shading="nearest", vmin=0.0, vmax=top)
        axis.invert_yaxis()
        axis.set_xlabel("training input (key)")
        axis.set_title(name, fontsize=9)
    axes[0][0].set_ylabel("test input (query)")
    figure.colorbar(image, ax=axes, fraction=0.04, label="attention weight")
    return save_figure(figure, out_png)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default="docs/images", help="where the two PNGs go (default: docs/images)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bandwidth", type=float, default=1.0, help="the fixed bandwidth (default: 1, the "
                                                                      "kernel exp(-u^2/2))")
    parser.add_argument("--steps", type=int, default=200, help="gradient steps for the learned bandwidth")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_true = toy_data(num_train=50, noise=0.5, seed=args.seed)

    fixed, fixed_weights = nadaraya_watson(x_test, x_train, y_train, args.bandwidth)
    model = KernelRegression(bandwidth=args.bandwidth)
    losses = model.fit(x_train, y_train, steps=args.steps)
    with torch.no_grad():
        learned, learned_weights = model(x_test, x_train, y_train)
    learned_bandwidth = model.bandwidth.item()

    def mse(y_hat: torch.Tensor) -> float:
        return float((y_hat - y_true).square().mean())

    print(f"mean of the targets (no attention)       test MSE {mse(y_train.mean().expand_as(y_true)):.4f}")
    print(f"fixed bandwidth {args.bandwidth:.3f}                  test MSE {mse(fixed):.4f}")
    print(f"learned bandwidth {learned_bandwidth:.3f}                test MSE {mse(learned):.4f} "
          f"(leave-one-out MSE {losses[0]:.4f} -> {losses[-1]:.4f} in {args.steps} steps)")

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = (f"fixed h = {args.bandwidth:.2f}", f"learned h = {learned_bandwidth:.2f}")
    fits = dict(zip(names, (fixed, learned), strict=True))
    print(plot_fits(x_train, y_train, x_test, y_true, fits, out_dir / "kernel-regression-fit.png"))
    weights = dict(zip(names, (fixed_weights, learned_weights), strict=True))
    print(plot_weights(x_train, x_test, weights, out_dir / "kernel-regression-weights.png"))


if __name__ == "__main__":
    main()
