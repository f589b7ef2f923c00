"""Where a training step's time goes, at the shakespeare-char shape (4 layers, width 128,
context 64, batch 12, vocab 66), on this machine, now.

Three loops, interleaved round by round so machine noise hits them alike; medians reported:
  trainer     tformer's Trainer.train_step (schedule, crops, all checks, clipping, fused AdamW)
  bare        the same tformer model in a minimal loop (forward, loss, backward, clip, AdamW)
  plain-gpt   a minimal GPT of the same shape written inline (nanoGPT's layout: fused qkv,
              SDPA, exact GELU, LayerNorm without bias, tied head) in the same minimal loop

trainer - bare is the loop's own overhead; bare - plain-gpt is what the model core costs
beyond a plain implementation.

    python benchmarks/train_step_overhead.py [--steps 50] [--rounds 5] [--threads N]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tformer  # noqa: E402
from tformer.data.lm import random_crops  # noqa: E402
from tformer.training.config import TrainingConfig  # noqa: E402
from tformer.training.optim import build_optimizer  # noqa: E402
from tformer.training.tasks import LanguageModelling  # noqa: E402
from tformer.training.trainer import Trainer  # noqa: E402

VOCAB, CONTEXT, WIDTH, LAYERS, HEADS, BATCH = 66, 64, 128, 4, 4, 12


class PlainBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH, bias=False)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.ln2 = nn.LayerNorm(WIDTH, bias=False)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH, bias=False)
        self.out = nn.Linear(4 * WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, HEADS, d // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class PlainGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(PlainBlock() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(WIDTH, bias=False)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.tokens.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions.weight[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def tformer_model() -> tformer.Model:
    config = tformer.ModelConfig(vocab_size=VOCAB, max_seq_len=CONTEXT, d_model=WIDTH, num_layers=LAYERS,
                                 num_heads=HEADS, activation="gelu", bias=False, dropout=0.0)
    return tformer.build_model(config)


def bare_loop(model: nn.Module, tokens: torch.Tensor, logits_of):
    optimizer = build_optimizer(model, 1e-3, 0.1, (0.9, 0.99))
    parameters = list(model.parameters())
    position = [0]

    def step() -> None:
        inputs, targets = random_crops(tokens, BATCH, CONTEXT, 1, position[0])
        position[0] += 1
        loss = F.cross_entropy(logits_of(model, inputs).flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50, help="steps per round and loop")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (200_000,))
    config = TrainingConfig(max_steps=10**9, batch_size=BATCH, seq_len=CONTEXT, lr=1e-3, warmup_steps=100,
                            decay_embeddings=True)
    trainer = Trainer(tformer_model(), config, LanguageModelling(tokens), progress=False)
    loops = {
        "trainer": trainer.train_step,
        "bare": bare_loop(tformer_model(), tokens, lambda m, x: m(x).logits),
        "plain-gpt": bare_loop(PlainGPT(), tokens, lambda m, x: m(x)),
    }
    for step in loops.values():  # warm up allocators and kernels
        for _ in range(5):
            step()
    timings: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.rounds):
        for name, step in loops.items():
            started = time.perf_counter()
            for _ in range(args.steps):
                step()
            timings[name].append((time.perf_counter() - started) / args.steps * 1000)
    tokens_per_step = BATCH * CONTEXT
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} rounds x {args.steps} steps")
    print(f"{'loop':<10} {'ms/step (median)':>17} {'min':>8} {'max':>8} {'tokens/s':>10}")
    for name, values in timings.items():
        median = statistics.median(values)
        print(f"{name:<10} {median:>17.2f} {min(values):>8.2f} {max(values):>8.2f} "
              f"{tokens_per_step / median * 1000:>10,.0f}")
    trainer_ms, bare_ms = statistics.median(timings["trainer"]), statistics.median(timings["bare"])
    print(f"loop overhead (trainer - bare): {trainer_ms - bare_ms:+.2f} ms/step "
          f"({(trainer_ms / bare_ms - 1) * 100:+.1f}%)")
    assert math.isfinite(trainer_ms)


if __name__ == "__main__":
    main()
