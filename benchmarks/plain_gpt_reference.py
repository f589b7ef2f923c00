"""A reference for the shakespeare-char figures: the same settings trained by a plain PyTorch
loop in nanoGPT's manner (written here, not nanoGPT's code): the GPT of
``train_step_overhead.PlainGPT`` (fused qkv, SDPA, exact GELU, LayerNorm without bias, tied
head, nanoGPT's initialisation), batches drawn with the global RNG, AdamW with decay on every
2-D tensor (PyTorch's default CPU implementation, as nanoGPT picks on CPU), warmup then cosine
decay, clipping at 1.0, and nanoGPT's bookkeeping: every 250 iterations (from iteration 0) the
mean loss of 20 batches of each split, and a checkpoint (model and optimizer, ``torch.save``)
after each evaluation that improves the validation loss. It prints the final validation loss on
all of the validation split, so seed-for-seed spreads compare with ``shakespeare_char.py``, which
also times this script as a whole process (``--peer``) beside ``tformer train``.

    python benchmarks/plain_gpt_reference.py [--seed 1337] [--threads 1]
"""

from __future__ import annotations

import argparse
import gzip
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_step_overhead as shapes  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare" / "input.txt.gz"
STEPS, WARMUP, LR, MIN_LR = 2000, 100, 1e-3, 1e-4
EVAL_INTERVAL, EVAL_ITERS = 250, 20


def learning_rate(step: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / (WARMUP + 1)
    ratio = min(1.0, (step - WARMUP) / (STEPS - WARMUP))
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--full-validation", action=argparse.BooleanOptionalAction, default=True,
                        help="end with the loss on all of the validation split (not part of nanoGPT's run)")
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
    def batch(split: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(split) - shapes.CONTEXT, (shapes.BATCH,))
        x = torch.stack([split[i : i + shapes.CONTEXT] for i in starts])
        y = torch.stack([split[i + 1 : i + 1 + shapes.CONTEXT] for i in starts])
        return x, y

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        model.eval()
        means = {}
        for name, split in (("train", train), ("val", val)):
            means[name] = sum(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
                              for x, y in (batch(split) for _ in range(EVAL_ITERS))) / EVAL_ITERS
        model.train()
        return means

    best_val = math.inf
    checkpoint_dir = tempfile.TemporaryDirectory(prefix="plain-gpt-")
    started = time.perf_counter()
    for step in range(STEPS + 1):  # nanoGPT's loop runs iterations 0 .. max_iters
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step)
        if step % EVAL_INTERVAL == 0:
            losses = estimate_loss()
            if losses["val"] < best_val:
                best_val = losses["val"]
                if step > 0:
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": step,
                                "best_val_loss": best_val}, Path(checkpoint_dir.name) / "ckpt.pt")
        x, y = batch(train)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - started
    checkpoint_dir.cleanup()
    tokens_per_s = (STEPS + 1) * shapes.BATCH * shapes.CONTEXT / seconds
    summary = (f"seed {args.seed}: training {seconds:.1f} s ({tokens_per_s:,.0f} tokens/s), last train loss "
               f"{loss.item():.4f}, last 20-batch val loss {losses['val']:.4f}")
    if args.full_validation:
        model.eval()
        usable = (len(val) - 1) // shapes.CONTEXT * shapes.CONTEXT
        inputs, targets = val[:usable].view(-1, shapes.CONTEXT), val[1 : usable + 1].view(-1, shapes.CONTEXT)
        with torch.no_grad():
            total = sum(F.cross_entropy(model(inputs[i : i + 256]).flatten(0, 1), targets[i : i + 256].flatten(),
                                        reduction="sum").item() for i in range(0, len(inputs), 256))
        summary += f", full validation loss {total / targets.numel():.4f}"
    print(summary)


if __name__ == "__main__":
    main()
