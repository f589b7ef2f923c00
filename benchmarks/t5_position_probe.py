"""Why the span-corruption recipe's model did not read its inputs: a small task where only the inputs tell the
answer, trained under each variant of the recipe's model for a few hundred steps.

The text is a chain over 200 symbols: each symbol is followed by a fixed successor (a random permutation) nine
times in ten, by a random symbol otherwise. T5's noise drops spans of it; a dropped span's first symbol is the
successor of the symbol just before its sentinel in the inputs, and nothing in the targets tells it, so the
share of first symbols the model gets right (greedy, teacher-forced, on 256 held-out rows) says whether its
decoder finds the sentinel in the inputs and reads the symbol beside it; a model that does not read its
inputs gets about 1 in 200. Each variant trains a 2-layer, width-128 encoder-decoder of the recipe's layout
(pre-norm RMS norms, no biases, ReLU feed-forward) with tformer's AdamW (``build_optimizer``, lr 1e-3) on the
same rows, over seeds:

    python benchmarks/t5_position_probe.py                     # every variant, seeds 1-3, 600 steps
    python benchmarks/t5_position_probe.py --variants recipe rope --seeds 1 --steps 300

The variants: the recipe's own (T5's relative position bias, embeddings tied to the output layer and not
scaled), token embeddings scaled by sqrt(d_model) and untied, the relative bias trained at ten times the rate
(``training.position_bias_lr_scale = 10``), and rotary positions in place of the relative bias.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tformer.config import ModelConfig  # noqa: E402
from tformer.data.span_corruption import corrupt_spans, random_spans_noise_mask  # noqa: E402
from tformer.models.registry import build_model  # noqa: E402
from tformer.nn.losses import token_cross_entropy  # noqa: E402
from tformer.training.optim import build_optimizer  # noqa: E402

SYMBOLS, SENTINELS, ROW_LENGTH = 200, 20, 64
END_ID = SYMBOLS  # </s>; the sentinels follow it, <extra_id_0> the last id as T5 numbers them
SENTINEL_IDS = [SYMBOLS + SENTINELS - k for k in range(SENTINELS)]
LAYOUT = dict(architecture="encoder_decoder", vocab_size=SYMBOLS + 1 + SENTINELS, d_model=128, num_layers=2,
              num_heads=4, d_ff=512, max_seq_len=128, dropout=0.0, pad_token_id=0, decoder_start_token_id=0,
              eos_token_id=END_ID, activation="relu", norm="rmsnorm", norm_position="pre", bias=False,
              norm_bias=False)
# name -> (model fields, position_bias_lr_scale)
VARIANTS = {
    "recipe": (dict(positional="relative"), 1.0),
    "scaled-untied": (dict(positional="relative", scale_embeddings=True, tie_embeddings=False), 1.0),
    "bias-lr-10": (dict(positional="relative"), 10.0),
    "scaled-untied-bias-lr-10": (dict(positional="relative", scale_embeddings=True, tie_embeddings=False), 10.0),
    "rope": (dict(positional="rope"), 1.0),
    "rope-scaled-untied": (dict(positional="rope", scale_embeddings=True, tie_embeddings=False), 1.0),
}


def chain_rows(rows: int, successor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """(rows, ROW_LENGTH) symbols 1..SYMBOLS-1: each the successor of the one before, or random one time in ten."""
    text = torch.empty(rows, ROW_LENGTH, dtype=torch.long)
    text[:, 0] = torch.randint(1, SYMBOLS, (rows,), generator=generator)
    for position in range(1, ROW_LENGTH):
        jump = torch.rand(rows, generator=generator) < 0.1
        random_symbols = torch.randint(1, SYMBOLS, (rows,), generator=generator)
        text[:, position] = torch.where(jump, random_symbols, successor[text[:, position - 1] - 1])
    return text


def corrupted_batch(text: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
    mask = random_spans_noise_mask(text.shape[0], ROW_LENGTH, generator)
    inputs, labels = corrupt_spans(text, mask, SENTINEL_IDS, END_ID)
    decoder_inputs = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1)
    return {"input_ids": inputs, "decoder_input_ids": decoder_inputs, "labels": labels}


@torch.no_grad()
def first_symbol_accuracy(model, batch: dict[str, torch.Tensor]) -> float:
    """The share of spans whose first symbol the model predicts after reading the span's sentinel."""
    logits = model(input_ids=batch["input_ids"], decoder_input_ids=batch["decoder_input_ids"]).logits
    after_sentinel = torch.isin(batch["decoder_input_ids"], torch.tensor(SENTINEL_IDS))
    return float((logits.argmax(-1) == batch["labels"])[after_sentinel].float().mean())


def train_variant(name: str, seed: int, steps: int, report_every: int) -> list[float]:
    """First-symbol accuracy on held-out rows every ``report_every`` steps of one variant and seed."""
    fields, bias_lr_scale = VARIANTS[name]
    torch.manual_seed(seed)
    model = build_model(ModelConfig(**LAYOUT, **fields))
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.0, fused=False, position_bias_lr_scale=bias_lr_scale)
    data = torch.Generator().manual_seed(1000 + seed)
    successor = torch.randperm(SYMBOLS - 1, generator=data) + 1
    held_out = corrupted_batch(chain_rows(256, successor, data), data)
    accuracies = []
    for step in range(1, steps + 1):
        batch = corrupted_batch(chain_rows(32, successor, data), data)
        logits = model(input_ids=batch["input_ids"], decoder_input_ids=batch["decoder_input_ids"]).logits
        loss = token_cross_entropy(logits, batch["labels"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % report_every == 0:
            model.eval()
            accuracies.append(first_symbol_accuracy(model, held_out))
            model.train()
    return accuracies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--report-every", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    checkpoints = list(range(args.report_every, args.steps + 1, args.report_every))
    print("| variant | " + " | ".join(f"step {step}" for step in checkpoints) + " | seeds |")
    print("|---|" + "---:|" * len(checkpoints) + "---|")
    for name in args.variants:
        started = time.perf_counter()
        runs = [train_variant(name, seed, args.steps, args.report_every) for seed in args.seeds]
        cells = []
        for index in range(len(checkpoints)):
            values = [run[index] for run in runs]
            cells.append(f"{100 * statistics.mean(values):.1f}% ({100 * min(values):.1f}-{100 * max(values):.1f})")
        print(f"| {name} | " + " | ".join(cells) + f" | {', '.join(map(str, args.seeds))} |", flush=True)
        print(f"  {name}: {time.perf_counter() - started:.0f} s; per seed at the last step: "
              + ", ".join(f"{100 * run[-1]:.1f}%" for run in runs), file=sys.stderr, flush=True)
    print(f"\nchance: {100 / (SYMBOLS - 1):.1f}%; first-symbol accuracy on 256 held-out rows, mean (range) over seeds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
