"""A reference for the shakespeare-char figures: the same settings trained by a plain PyTorch
loop in nanoGPT's manner (written here, not nanoGPT's code): the GPT of
``train_step_overhead.PlainGPT`` (fused qkv, SDPA, exact GELU, LayerNorm without bias, tied
head, nanoGPT's initialisation), batches drawn with the global RNG, AdamW with decay on every
2-D tensor, warmup then cosine decay, clipping at 1.0. It prints the final validation loss on
all of the validation split, to compare seed-for-seed spreads with ``shakespeare_char.py``.

    python benchmarks/plain_gpt_reference.py [--seed 1337] [--threads 1]
"""

from __future__ import annotations

import argparse
import gzip
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_step_overhead as shapes  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare" / "input.txt.gz"
STEPS, WARMUP, LR, MIN_LR = 2000, 100, 1e-3, 1e-4


def learning_rate(step: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / (WARMUP + 1)
    ratio = (step - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not DATA.is_file():
        raise SystemExit(f"{DATA} is absent")
    text = gzip.decompress(DATA.read_bytes()).decode("utf-8")
    characters = sorted(set(text))
    lookup = {c: i for i, c in enumerate(characters)}
    data = torch.tensor([lookup[c] for c in text])
    cut = int(len(data) * 0.9)
    train, val = data[:cut], data[cut:]
    shapes.VOCAB = len(characters)
    torch.manual_seed(args.seed)
    model = shapes.PlainGPT()
    for name, parameter in model.named_parameters():
        if name.endswith("proj.weight") or name.endswith("out.weight"):
            torch.nn.init.normal_(parameter, 0.0, 0.02 / math.sqrt(2 * shapes.LAYERS))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=LR, betas=(0.9, 0.99))
    started = time.perf_counter()
    for step in range(STEPS):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step)
        starts = torch.randint(len(train) - shapes.CONTEXT, (shapes.BATCH,))
        x = torch.stack([train[i : i + shapes.CONTEXT] for i in starts])
        y = torch.stack([train[i + 1 : i + 1 + shapes.CONTEXT] for i in starts])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - started
    model.eval()
    usable = (len(val) - 1) // shapes.CONTEXT * shapes.CONTEXT
    inputs, targets = val[:usable].view(-1, shapes.CONTEXT), val[1 : usable + 1].view(-1, shapes.CONTEXT)
    with torch.no_grad():
        total = sum(F.cross_entropy(model(inputs[i : i + 256]).flatten(0, 1), targets[i : i + 256].flatten(),
                                    reduction="sum").item() for i in range(0, len(inputs), 256))
    print(f"seed {args.seed}: full validation loss {total / targets.numel():.4f}, training {seconds:.1f} s "
          f"({STEPS * shapes.BATCH * shapes.CONTEXT / seconds:,.0f} tokens/s), last train loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
