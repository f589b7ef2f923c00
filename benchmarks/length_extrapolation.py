"""Train short, test long (the ALiBi paper's Figure 1 at laptop scale): the same character LM trained
at context 128 with each positional scheme (learned, sinusoidal, rope, alibi, relative, none), then
its held-out loss per token at contexts 128, 256, 512 and 1024.

Every model is the shakespeare-char recipe's (configs/shakespeare-char.toml: 4 layers, width 128,
4 heads, tiny Shakespeare by character, the last 10% held out) with ``positional`` switched and the
same size, steps, seed and batches: batch --batch-size of 128-character crops for --steps AdamW
steps (the recipe's schedule, warm-up 100 steps or a tenth of them). Every model is built with
max_seq_len 1024 so every scheme can be evaluated there: learned positions then have a table of
1024 rows of which training reaches only the first 128; the rest keep their random initialisation
(shrunk a little by weight decay), which is where learned positions break. Sinusoidal positions
are a fixed table, RoPE, ALiBi and T5 relative buckets (32 buckets up to distance 128, the last
bucket for everything further) have no table, and "none" has no positions (causal masking alone).

Evaluation: the model's normal forward on full windows, no sliding: the first --eval-tokens
characters of the held-out split (the same text at every length) cut into non-overlapping windows
of each length, every position's next-character loss averaged. Longer windows give later tokens
more context, so a scheme that extrapolates gets a lower (or equal) loss as the length grows. The
issue's target: ALiBi's loss at 4x the training length (512) <= its loss at 128 + 5%.

Trained models are kept in --runs/POSITIONAL (reused when their recipe matches, an unfinished one
resumed), so an interrupted benchmark continues where it stopped.

    python benchmarks/length_extrapolation.py [--steps 1000] [--batch-size 12] [--threads 2]
        [--positionals learned,alibi,...] [--runs runs/length-extrapolation]
        [--out benchmarks/logs/length_extrapolation.png] [--set model.d_model=64 ...]
    python benchmarks/length_extrapolation.py --steps 5 --eval-tokens 2048 --runs /tmp/smoke   # smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tformer  # noqa: E402
from tformer.data.sources import load_language_model_data  # noqa: E402
from tformer.nn.positions import POSITIONALS  # noqa: E402
from tformer.training.recipe import Recipe, load_recipe  # noqa: E402
from tformer.training.run import RECIPE_NAME, train_recipe  # noqa: E402

RECIPE = ROOT / "configs" / "shakespeare-char.toml"
TRAIN_LENGTH, EVAL_LENGTHS = 128, (128, 256, 512, 1024)
TARGET_RATIO = 1.05  # ALiBi at 4x the training length: at most 5% above its loss at 1x


def recipe_for(positional: str, steps: int, batch_size: int, threads: int, extra: list[str]) -> Recipe:
    """The shakespeare-char recipe with ``positional`` positions, trained at 128 and built for 1024."""
    return load_recipe(RECIPE, [
        f"model.positional={positional}", f"model.max_seq_len={EVAL_LENGTHS[-1]}",
        f"training.seq_len={TRAIN_LENGTH}", f"training.batch_size={batch_size}", f"training.max_steps={steps}",
        f"training.warmup_steps={min(100, max(steps // 10, 1))}", f"training.eval_every={steps}",
        f"training.checkpoint_every={steps}", "training.keep_last=1", f"training.threads={threads}", *extra,
    ])


def same_run(saved: Recipe, wanted: Recipe) -> bool:
    """Whether a saved run trained what ``wanted`` asks (the thread count aside; the vocabulary size
    the saved one resolved from the data)."""
    return (saved.model == wanted.model.replace(vocab_size=saved.model.vocab_size)
            and dataclasses.replace(saved.training, threads=0) == dataclasses.replace(wanted.training, threads=0))


def trained_model(recipe: Recipe, folder: Path) -> tuple[tformer.DecoderLM, dict]:
    """The model ``recipe`` trains, from ``folder`` when a finished run of it is there (else
    trained there, resuming an unfinished run), and how its training went."""
    if (folder / "model.safetensors").is_file():
        saved = load_recipe(folder / RECIPE_NAME)
        if not same_run(saved, recipe):
            raise SystemExit(f"{folder} holds a run of other settings: remove it or choose another --runs")
        return tformer.load(folder).eval(), {"reused": True}
    started = time.perf_counter()
    result = train_recipe(recipe, folder, resume="auto" if folder.exists() else None, progress=False,
                          echo=lambda line: print(f"  {line}", flush=True))
    record = {"reused": False, "seconds": time.perf_counter() - started, "steps": result.steps,
              "ms_per_step": result.seconds / max(result.steps - result.start_step, 1) * 1000,
              "final_train_loss": result.final_train_loss, "eval_loss_at_128": result.final_eval_loss}
    return tformer.load(folder).eval(), record


def held_out_loss(model, tokens: torch.Tensor, length: int, batch_tokens: int = 16384) -> float:
    """Mean next-token loss over ``tokens`` (1-D, a multiple of ``length`` plus one for the last
    target) cut into non-overlapping windows of ``length``, each run through the model's forward."""
    usable = (tokens.numel() - 1) // length * length
    inputs = tokens[:usable].view(-1, length)  # (windows, length)
    targets = tokens[1 : usable + 1].view(-1, length)
    rows = max(batch_tokens // length, 1)
    total = 0.0
    with torch.inference_mode():
        for first in range(0, inputs.shape[0], rows):
            logits = model(inputs[first : first + rows]).logits  # (rows, length, V)
            total += F.cross_entropy(logits.flatten(0, 1), targets[first : first + rows].flatten(),
                                     reduction="sum").item()
    return total / targets.numel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help="training steps per scheme (a few: a smoke run)")
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help=f"torch CPU threads (default here: {torch.get_num_threads()})")
    parser.add_argument("--positionals", default=",".join(POSITIONALS),
                        help=f"comma-separated subset of {', '.join(POSITIONALS)}, trained in this order")
    parser.add_argument("--eval-tokens", type=int, default=65536,
                        help="held-out characters evaluated at every length (a multiple of 1024; default 65536)")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "length-extrapolation",
                        help="folder of the trained models, one per scheme (reused when the settings match)")
    parser.add_argument("--out", type=Path, default=None, help="PNG of the plot; the figures go to the same "
                        "name with .json")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="another recipe setting for every scheme (e.g. model.d_model=64)")
    args = parser.parse_args()
    positionals = [name.strip() for name in args.positionals.split(",") if name.strip()]
    unknown = [name for name in positionals if name not in POSITIONALS]
    if unknown or not positionals:
        parser.error(f"--positionals {args.positionals!r}: {', '.join(unknown) or 'none given'}; "
                     f"choose from {', '.join(POSITIONALS)}")
    if args.steps < 1 or args.batch_size < 1 or args.threads < 1:
        parser.error("--steps, --batch-size and --threads must be at least 1")
    if args.eval_tokens < EVAL_LENGTHS[-1] or args.eval_tokens % EVAL_LENGTHS[-1]:
        parser.error(f"--eval-tokens {args.eval_tokens}: must be a positive multiple of {EVAL_LENGTHS[-1]}")
    if args.out is not None and args.out.suffix != ".png":
        parser.error(f"--out {args.out}: name a .png file (the figures are written beside it as .json)")
    for setting in args.overrides:
        if setting.split("=", 1)[0].strip() in ("model.positional", "model.max_seq_len", "training.seq_len",
                                                 "training.max_steps", "training.batch_size", "training.threads"):
            parser.error(f"--set {setting}: this benchmark sets that itself (see --help)")
    torch.set_num_threads(args.threads)
    recipes = {name: recipe_for(name, args.steps, args.batch_size, args.threads, args.overrides)
               for name in positionals}
    first = next(iter(recipes.values()))
    held_out = load_language_model_data(first.data).eval
    if held_out.numel() < args.eval_tokens + 1:
        parser.error(f"--eval-tokens {args.eval_tokens}: the held-out split has only {held_out.numel()} characters")
    tokens = held_out[: args.eval_tokens + 1].long()
    model_config, training = first.model, first.training
    print(f"{model_config.num_layers} layers, width {model_config.d_model}, {model_config.num_heads} heads; "
          f"{args.steps} steps of {args.batch_size} x {TRAIN_LENGTH} characters, seed {training.seed}; evaluated on "
          f"{args.eval_tokens:,} held-out characters; {args.threads} threads, torch {torch.__version__}; "
          f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", flush=True)

    losses: dict[str, dict[int, float]] = {}
    trainings: dict[str, dict] = {}
    for name, recipe in recipes.items():
        print(f"{name}:", flush=True)
        model, trainings[name] = trained_model(recipe, args.runs / name)
        started = time.perf_counter()
        losses[name] = {length: held_out_loss(model, tokens, length) for length in EVAL_LENGTHS}
        trainings[name]["eval_seconds"] = time.perf_counter() - started
        done = "reused the trained model" if trainings[name]["reused"] else (
            f"trained in {trainings[name]['seconds']:.0f} s ({trainings[name]['ms_per_step']:.0f} ms/step), "
            f"last training loss {trainings[name]['final_train_loss']:.3f}")
        print(f"  {done}; held-out loss " + ", ".join(f"{length}: {loss:.4f}" for length, loss in losses[name].items())
              + f" ({trainings[name]['eval_seconds']:.0f} s)", flush=True)

    print(f"\nheld-out loss per character (nats), trained at {TRAIN_LENGTH}")
    print(f"{'positional':<11} " + " ".join(f"{length:>7}" for length in EVAL_LENGTHS)
          + f" {'512/128':>8}  first length > 128's loss + 5%")
    losses = {name: losses[name] for name in POSITIONALS if name in losses}  # the table's order, whatever ran first
    for name, row in losses.items():
        base = row[TRAIN_LENGTH]
        breaks = next((length for length in EVAL_LENGTHS if row[length] > base * TARGET_RATIO), None)
        print(f"{name:<11} " + " ".join(f"{row[length]:>7.4f}" for length in EVAL_LENGTHS)
              + f" {row[4 * TRAIN_LENGTH] / base:>8.3f}  {breaks or 'none (holds to ' + str(EVAL_LENGTHS[-1]) + ')'}")
    if "alibi" in losses:
        ratio = losses["alibi"][4 * TRAIN_LENGTH] / losses["alibi"][TRAIN_LENGTH]
        print(f"target: alibi at {4 * TRAIN_LENGTH} / at {TRAIN_LENGTH} = {ratio:.3f} (<= {TARGET_RATIO}): "
              f"{'met' if ratio <= TARGET_RATIO else 'NOT met'}")
    print(f"load average {os.getloadavg()[0]:.2f}")

    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        settings = {"recipe": str(RECIPE.relative_to(ROOT)), "overrides": args.overrides, "steps": args.steps,
                    "batch_size": args.batch_size, "train_length": TRAIN_LENGTH, "eval_tokens": args.eval_tokens,
                    "threads": args.threads, "torch": torch.__version__, "date": f"{datetime.now(UTC):%Y-%m-%d}"}
        figures = {"settings": settings, "loss": losses, "training": trainings}
        args.out.with_suffix(".json").write_text(json.dumps(figures, indent=1) + "\n")
        plot(losses, args.out, f"{model_config.num_layers} x {model_config.d_model} char LM, tiny Shakespeare, "
                               f"{args.steps} steps at context {TRAIN_LENGTH}")
        print(f"wrote {args.out} and {args.out.with_suffix('.json')}")


def plot(losses: dict[str, dict[int, float]], out: Path, title: str) -> None:
    """Held-out loss against evaluation length (log x), a line per scheme; a loss above twice the
    lowest in the table is drawn at the top edge with its value written beside it."""
    from tformer.viz.figures import pyplot, save_figure

    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5))
    lowest = min(loss for row in losses.values() for loss in row.values())
    top = min(max(loss for row in losses.values() for loss in row.values()) * 1.02, 2 * lowest)
    for name, row in losses.items():
        lengths = list(row)
        shown = [min(row[length], top) for length in lengths]
        line, = axes.plot(lengths, shown, marker="o", label=name)
        for length in lengths:
            if row[length] > top:
                axes.annotate(f"{row[length]:.2f}", (length, top), textcoords="offset points", xytext=(4, -12),
                              color=line.get_color(), fontsize=8)
    axes.axvline(TRAIN_LENGTH, color="grey", linestyle=":", linewidth=1)
    axes.set_xscale("log", base=2)
    axes.set_xticks(EVAL_LENGTHS, [str(length) for length in EVAL_LENGTHS])
    axes.set_ylim(top=top)
    axes.set_xlabel("evaluation context (characters); trained at 128")
    axes.set_ylabel("held-out loss per character (nats)")
    axes.set_title(title, fontsize=10)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    save_figure(figure, out)


if __name__ == "__main__":
    main()
