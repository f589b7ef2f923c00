"""How close FAVOR+ (Performer) attention comes to exact softmax attention.

Part 1 (the default): the relative output error ||performer - exact|| / ||exact|| (median over
projection seeds; exact = ``attention_reference``) for M = 16, 32, ..., 1024 random features,
orthogonal against i.i.d. rows, bidirectional and causal, at one shape (B, H, T, Dh) = (1, 8, 512, 64).
q and k have i.i.d. N(0, s) entries, so the attention logits q.k / sqrt(Dh) have standard deviation s
(``--logit-std``, default 0.25, 0.5 and 1): the estimator's variance grows like exp(|q' + k'|^2) with
q' = q Dh**-0.25 (|q'|^2 = s sqrt(Dh) here), so the logit scale, not M alone, decides how good it is.
v has N(0, 1) entries; with v independent of the weights the relative output error is about the relative
L2 error of each row of attention weights. ``--from-run RUN`` adds the same table on a trained decoder's
own q, k, v (every layer and head, captured from its fused projection on validation windows; models with
learned or sinusoidal positions, where q and k enter attention as projected) and prints that model's
logit scale, so the Gaussian rows can be read against real ones. A table is printed and a log-log plot
written to ``--out``.

Part 2 (``--lm``): the shakespeare-char recipe (configs/shakespeare-char.toml, as benchmarks/
shakespeare_char.py runs it) trained with each kernel on the same step budget through ``tformer train
--set model.attention_kernel=...``: final validation loss (the whole validation split) side by side, and
the Performer's gap to softmax. sdpa is the default kernel, so its leg runs the recipe unchanged; the other
legs need the ``attention_kernel`` switch (tformer/config.py). Then part 1's table on the sdpa model's own
q/k/v. Each leg of 2000 steps takes minutes on a laptop CPU.

    python benchmarks/performer_error.py [--seeds 3] [--logit-std 0.25 0.5 1] [--from-run RUN]
                                         [--out docs/images/performer-error.png]
    python benchmarks/performer_error.py --lm [--kernels sdpa performer] [--features 256]
                                         [--redraw-interval 0] [--threads 2] [--set training.max_steps=500]

Measured here on 2026-11-23 with the defaults (``python benchmarks/performer_error.py``: 3 seeds, 3 scales,
181 s; 2-core CPU beside other jobs, float32; log: benchmarks/logs/performer_error-2026-11-23.log), median
relative error:

         M   bidir orth    bidir iid  causal orth   causal iid      (logit std 0.25, |q'|^2 = 2.0)
        16       1.1189       1.1830       0.7882       0.8274
        64       0.6643       0.7230       0.4940       0.5060
       256       0.4272       0.4390       0.3225       0.3288
      1024       0.2434       0.2551       0.1837       0.1891
     slope        -0.36        -0.37        -0.35        -0.35      (log error / log M over 16..1024)

At logit std 0.5 the error at M = 1024 is 1.18 (bidirectional, orthogonal) and at std 1 it is 2.97: FAVOR+
approximates only diffuse attention well, and a model trained with it adapts to it. Orthogonal and i.i.d.
features give the same medians over these 3 draws (a single earlier draw showed i.i.d. features stalling
past M = 256: the estimator's heavy tail).

``--lm --kernels sdpa performer sliding_window chunked`` (2026-11-23, 2 threads; log:
benchmarks/logs/performer_error-lm-2026-11-23.log), whole-validation loss after 2,000 steps: sdpa 1.8973,
performer (M = 256) 1.9041 (+0.4%), sliding_window (32 keys) 1.8919 (-0.3%), chunked 1.8973; training wall
216.5, 413.6, 231.1 and 233.7 s.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402

from tformer.nn.attention import attention_reference  # noqa: E402
from tformer.nn.favor import performer_attention, random_features  # noqa: E402
from tformer.viz.figures import pyplot, save_figure  # noqa: E402

FEATURES = [16, 32, 64, 128, 256, 512, 1024]
SHAPE = (1, 8, 512, 64)  # (B, H, T, Dh): 8 heads of one sequence
LEGS = [(causal, orthogonal) for causal in (False, True) for orthogonal in (True, False)]
TODAY = datetime.date.today().isoformat()


class Log:
    """Lines printed and appended to a log file under benchmarks/logs/."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        with self.path.open("a") as file:
            file.write(line + "\n")


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    return ((approx - exact).norm() / exact.norm()).item()


def error_table(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seeds: int) -> dict[tuple[bool, bool], list[float]]:
    """Median relative error over ``seeds`` projections for every M, per (causal, orthogonal) leg."""
    head_dim = q.shape[-1]
    table = {}
    for causal, orthogonal in LEGS:
        exact, _ = attention_reference(q, k, v, is_causal=causal)
        medians = []
        for num_features in FEATURES:
            errors = []
            for seed in range(seeds):
                generator = torch.Generator().manual_seed(seed)
                projection = random_features(num_features, head_dim, orthogonal=orthogonal, generator=generator)
                errors.append(relative_error(performer_attention(q, k, v, projection, causal=causal), exact))
            medians.append(statistics.median(errors))
        table[causal, orthogonal] = medians
    return table


def gaussian_inputs(logit_std: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k with N(0, logit_std) entries (logits q.k / sqrt(Dh) of that standard deviation), v with N(0, 1)."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(SHAPE, generator=generator) for _ in range(3))
    return q * logit_std ** 0.5, k * logit_std ** 0.5, v


def print_table(log: Log, title: str, table: dict[tuple[bool, bool], list[float]]) -> None:
    log(title)
    names = [f"{'causal' if causal else 'bidir'} {'orth' if orthogonal else 'iid'}" for causal, orthogonal in LEGS]
    log(f"{'M':>6} " + " ".join(f"{name:>12}" for name in names))
    for row, num_features in enumerate(FEATURES):
        log(f"{num_features:>6} " + " ".join(f"{table[leg][row]:>12.4f}" for leg in LEGS))
    slopes = [fitted_slope(table[leg]) for leg in LEGS]
    log(f"{'slope':>6} " + " ".join(f"{slope:>12.2f}" for slope in slopes) + "   (log error / log M, least squares)")
    log()


def fitted_slope(errors: list[float]) -> float:
    xs = [math.log(m) for m in FEATURES]
    ys = [math.log(e) for e in errors]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum((x - mean_x) ** 2 for x in xs)


def plot(panels: list[tuple[str, dict]], out: Path) -> Path:
    plt = pyplot()
    figure, axes = plt.subplots(1, len(panels), figsize=(max(4.2 * len(panels), 6.0), 3.8), sharey=True,
                                squeeze=False)
    for axis, (title, table) in zip(axes[0], panels, strict=True):
        for causal, orthogonal in LEGS:
            axis.loglog(FEATURES, table[causal, orthogonal], marker="o", markersize=3,
                        linestyle="-" if orthogonal else "--", color="tab:red" if causal else "tab:blue",
                        label=f"{'causal' if causal else 'bidirectional'}, {'orthogonal' if orthogonal else 'i.i.d.'}")
        reference = table[False, True][0] * (FEATURES[0] / torch.tensor(FEATURES, dtype=torch.float64)) ** 0.5
        axis.loglog(FEATURES, reference.tolist(), color="0.6", linewidth=0.8, label="M^-1/2")
        axis.set_title(title, fontsize=9)
        axis.set_xlabel("random features M")
        axis.set_xticks(FEATURES, [str(m) for m in FEATURES], fontsize=7)
        axis.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("relative output error vs softmax")
    axes[0][0].legend(fontsize=7)
    figure.suptitle("FAVOR+ against exact softmax attention (median over projection seeds)", fontsize=9)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(figure, out)


# ---- a trained model's own attention inputs -------------------------------------------------


def captured_inputs(run: Path, windows: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """q, k, v of every self-attention layer of a trained decoder on ``windows`` validation windows, layers
    stacked along the batch: (windows * layers, H, T, Dh) each, and the number of layers."""
    import tformer
    from tformer.data.sources import load_language_model_data
    from tformer.nn.attention import MultiHeadAttention
    from tformer.training.recipe import load_recipe

    model = tformer.load(run).eval()
    if model.config.positional not in ("learned", "sinusoidal", "none"):
        raise SystemExit(f"--from-run: {run} uses {model.config.positional!r} positions, which change q and k "
                         "after the projection this benchmark captures; use a model with learned or sinusoidal ones")
    recipe = load_recipe(run / "recipe.toml")
    length = recipe.training.seq_len
    tokens = load_language_model_data(recipe.data).eval
    inputs = tokens[: windows * length].view(windows, length)
    captured = []

    def keep(module, _inputs, output):
        captured.append((module, output))

    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention) and not m.cross]
    hooks = [layer.qkv_proj.register_forward_hook(keep) for layer in layers]
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for hook in hooks:
            hook.remove()
    parts = []
    for projection, output in captured:
        layer = next(m for m in layers if m.qkv_proj is projection)
        sizes = [layer.num_heads * layer.head_dim] + [layer.num_kv_heads * layer.head_dim] * 2
        q, k, v = output.split(sizes, dim=-1)
        heads = [layer.num_heads, layer.num_kv_heads, layer.num_kv_heads]
        parts.append([t.view(windows, length, h, layer.head_dim).transpose(1, 2).float()
                      for t, h in zip((q, k, v), heads, strict=True)])
    q, k, v = (torch.cat(group) for group in zip(*parts, strict=True))
    return q, k, v, len(layers)


def describe_logits(q: torch.Tensor, k: torch.Tensor, layers: int) -> str:
    """Per layer: the standard deviation of the causal attention logits and the mean |q'|^2, |k'|^2."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    head_dim, length = q.shape[-1], q.shape[-2]
    logits = q @ k.transpose(-2, -1) / math.sqrt(head_dim)  # (N, H, T, T)
    allowed = torch.ones(length, length, dtype=torch.bool).tril()
    per_layer = []
    parts = zip(q.chunk(layers), k.chunk(layers), logits.chunk(layers), strict=True)
    for layer, (q_part, k_part, logit_part) in enumerate(parts):
        spread = logit_part[..., allowed].std().item()
        q_norm = (q_part.square().sum(-1) / math.sqrt(head_dim)).mean().item()
        k_norm = (k_part.square().sum(-1) / math.sqrt(head_dim)).mean().item()
        per_layer.append(f"layer {layer}: logit std {spread:.2f}, mean |q'|^2 {q_norm:.2f}, |k'|^2 {k_norm:.2f}")
    return "; ".join(per_layer)


def real_input_table(log: Log, run: Path, seeds: int) -> tuple[str, dict]:
    q, k, v, layers = captured_inputs(run)
    log(f"{run}: {describe_logits(q, k, layers)}")
    title = f"trained model's q/k/v: {layers} layers x {tuple(q.shape[:1])[0] // layers} windows, " \
            f"(H, T, Dh) = {tuple(q.shape[1:])}"
    table = error_table(q, k, v, seeds)
    print_table(log, title, table)
    return f"trained shakespeare-char q/k/v (T={q.shape[-2]}, Dh={q.shape[-1]})", table


# ---- part 2: a character LM per kernel --------------------------------------------------------


def kernel_overrides(kernel: str, args: argparse.Namespace) -> list[str]:
    """The ``--set`` values that select ``kernel``; sdpa, the default kernel, needs none."""
    if kernel == "sdpa":
        return []
    settings = [f"model.attention_kernel={kernel}"]
    if kernel == "performer":
        settings += [f"model.performer_features={args.features}",
                     f"model.performer_redraw_interval={args.redraw_interval}"]
    if kernel == "sliding_window":
        settings.append(f"model.attention_window={args.window}")
    return settings


def train_leg(settings: list[str], threads: int, run: Path) -> dict:
    """``tformer train`` of the shakespeare-char recipe into ``run``, and what it reports."""
    import shakespeare_char

    command = [sys.executable, "-m", "tformer", "train", str(shakespeare_char.RECIPE), "--out", str(run),
               "--no-progress", *(item for setting in [*settings, f"training.threads={threads}"]
                                  for item in ("--set", setting))]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"training failed ({' '.join(command[3:])}):\n{result.stdout}\n{result.stderr}")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in records if r.get("eval_loss") is not None]
    return {"wall_s": wall, "steps": max(r.get("step", 0) for r in records),
            "val_loss": evaluated[-1]["eval_loss"], "full_val_loss": shakespeare_char.full_validation_loss(run)}


def language_models(log: Log, args: argparse.Namespace) -> None:
    import shakespeare_char

    if not shakespeare_char.DATA.is_file():
        raise SystemExit(f"{shakespeare_char.DATA} is absent: --lm needs ../shared/data/tinyshakespeare")
    log(f"character LM per kernel: {shakespeare_char.RECIPE.relative_to(REPO)} with {args.overrides or 'no'} "
        f"overrides, {args.threads} threads")
    log(f"{'kernel':<28} {'steps':>6} {'wall s':>8} {'val loss':>9} {'full val':>9} {'vs sdpa':>8}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="performer-error-") as folder:
        for kernel in args.kernels:
            settings = kernel_overrides(kernel, args)
            leg = train_leg([*args.overrides, *settings], args.threads, Path(folder) / kernel)
            results[kernel] = leg
            name = kernel + (f" M={args.features}" if kernel == "performer" else "")
            base = results.get("sdpa")
            gap = "-" if base is None else f"{(leg['full_val_loss'] / base['full_val_loss'] - 1) * 100:+.1f}%"
            log(f"{name:<28} {leg['steps']:>6} {leg['wall_s']:>8.1f} {leg['val_loss']:>9.4f} "
                f"{leg['full_val_loss']:>9.4f} {gap:>8}")
        log()
        if "sdpa" in results:
            real_input_table(log, Path(folder) / "sdpa", args.seeds)
    if "sdpa" in results and "performer" in results:
        gap = results["performer"]["full_val_loss"] / results["sdpa"]["full_val_loss"] - 1
        log(f"Performer (M={args.features}) full-validation loss {gap * 100:+.1f}% against softmax "
            f"(target: within 5%): {'met' if gap <= 0.05 else 'NOT met'}")


# ---- the command ----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="projections per point; the median is reported")
    parser.add_argument("--logit-std", type=float, nargs="+", default=[0.25, 0.5, 1.0],
                        help="standard deviations of the Gaussian inputs' attention logits, one panel each")
    parser.add_argument("--from-run", type=Path, default=None, metavar="RUN",
                        help="also measure on the q/k/v of a trained decoder run (learned or sinusoidal positions)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images" / "performer-error.png")
    parser.add_argument("--log", type=Path, default=None,
                        help="log file (default benchmarks/logs/performer_error[-lm]-DATE.log)")
    parser.add_argument("--lm", action="store_true", help="train the character LM with each kernel instead")
    parser.add_argument("--kernels", nargs="+", default=["sdpa", "performer"],
                        choices=["sdpa", "reference", "chunked", "performer", "sliding_window"])
    parser.add_argument("--features", type=int, default=256, help="--lm: model.performer_features")
    parser.add_argument("--redraw-interval", type=int, default=0, help="--lm: model.performer_redraw_interval")
    parser.add_argument("--window", type=int, default=32, help="--lm: model.attention_window (sliding_window)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="--lm: CPU threads per run")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="--lm: recipe overrides for every leg, e.g. --set training.max_steps=500")
    args = parser.parse_args()
    if args.seeds < 1 or args.threads < 1 or args.features < 1 or args.redraw_interval < 0 or args.window < 1:
        parser.error("--seeds, --threads, --features and --window must be >= 1, --redraw-interval >= 0")
    if any(s <= 0 for s in args.logit_std):
        parser.error(f"--logit-std values must be > 0, got {args.logit_std}")
    if any(item.split("=", 1)[0].strip() in ("training.threads", "model.attention_kernel") for item in args.overrides):
        parser.error("--set training.threads / model.attention_kernel: use --threads / --kernels")
    if args.from_run is not None and not (args.from_run / "recipe.toml").is_file():
        parser.error(f"--from-run {args.from_run}: not a run folder (no recipe.toml)")
    log = Log(args.log or REPO / "benchmarks" / "logs" / f"performer_error{'-lm' if args.lm else ''}-{TODAY}.log")
    log(f"# {' '.join(sys.argv)}  ({datetime.datetime.now().isoformat(timespec='seconds')}, torch {torch.__version__},"
        f" {torch.get_num_threads()} threads)")
    if args.lm:
        language_models(log, args)
        return
    started = time.perf_counter()
    batch, heads, length, head_dim = SHAPE
    panels = []
    for logit_std in args.logit_std:
        table = error_table(*gaussian_inputs(logit_std), args.seeds)
        title = f"Gaussian q/k/v, (B, H, T, Dh) = {SHAPE}, logit std {logit_std:g} (|q'|^2 = " \
                f"{logit_std * math.sqrt(head_dim):.1f}), median of {args.seeds} seeds"
        print_table(log, title, table)
        panels.append((f"Gaussian q/k, logit std {logit_std:g}, T={length}, Dh={head_dim}", table))
    if args.from_run is not None:
        panels.append(real_input_table(log, args.from_run, args.seeds))
    log(f"{time.perf_counter() - started:.0f} s; plot: {plot(panels, args.out)}")


if __name__ == "__main__":
    main()
