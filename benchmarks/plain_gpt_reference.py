"""A reference for the shakespeare-char figures: the same settings trained by a plain PyTorch
loop in nanoGPT's manner (written here, not nanoGPT's code): the GPT of
``train_step_overhead.PlainGPT`` (fused qkv, SDPA, exact GELU, LayerNorm without bias, tied
head, nanoGPT's initialisation), batches drawn with the global RNG, AdamW with decay on every
2-D tensor (PyTorch's default CPU implementation, as nanoGPT picks on CPU), warmup then cosine
decay, clipping at 1.0, and nanoGPT's bookkeeping: every 250 iterations (from iteration 0) the
mean loss of 20 batches of each split, and a checkpoint (model and optimizer, ``torch.save``)
after each evaluation that improves the validation loss.

With ``--nanogpt PATH`` the model and its optimizer come from nanoGPT itself: its ``GPT`` and
``GPTConfig`` imported from ``PATH/model.py`` (a checkout of github.com/karpathy/nanoGPT) and its
``configure_optimizers``, trained by the same loop.

It times the training steps (drawing the batch, forward, backward, clipping, the optimizer) apart
from the evaluations and checkpoints, and prints both with the thread count it ran on; with
``--json`` the last line is those figures as JSON, which ``shakespeare_char.py`` reads when it
times this script as a whole process beside ``tformer train``. It ends with the final
validation loss on all of the validation split.

    python benchmarks/plain_gpt_reference.py [--seed 1337] [--threads 1] [--nanogpt PATH] [--json]
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_step_overhead as shapes  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare" / "input.txt.gz"
STEPS, WARMUP, LR, MIN_LR = 2000, 100, 1e-3, 1e-4
WEIGHT_DECAY, BETAS = 0.1, (0.9, 0.99)
EVAL_INTERVAL, EVAL_ITERS = 250, 20


def learning_rate(step: int, max_steps: int) -> float:
    """nanoGPT's schedule: linear warmup, then cosine decay to MIN_LR at ``max_steps``."""
    if step < WARMUP:
        return LR * (step + 1) / (WARMUP + 1)
    ratio = min(1.0, (step - WARMUP) / max(1, max_steps - WARMUP))
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def nanogpt_model_module(checkout: Path):
    """nanoGPT's ``model.py`` from a checkout, imported as a module (its GPT, GPTConfig)."""
    source = checkout / "model.py"
    if not source.is_file():
        raise SystemExit(f"--nanogpt {checkout}: no model.py there; pass a checkout of github.com/karpathy/nanoGPT")
    spec = importlib.util.spec_from_file_location("nanogpt_model", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LossOf = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (inputs, targets), both (B, T) -> mean loss


def nanogpt_peer(checkout: Path, vocab_size: int) -> tuple[nn.Module, torch.optim.Optimizer, LossOf]:
    """nanoGPT's GPT at the shakespeare-char shape, with the optimizer its ``configure_optimizers`` builds."""
    module = nanogpt_model_module(checkout)
    config = module.GPTConfig(block_size=shapes.CONTEXT, vocab_size=vocab_size, n_layer=shapes.LAYERS,
                              n_head=shapes.HEADS, n_embd=shapes.WIDTH, dropout=0.0, bias=False)
    model = module.GPT(config)
    optimizer = model.configure_optimizers(WEIGHT_DECAY, LR, BETAS, "cpu")
    return model, optimizer, lambda inputs, targets: model(inputs, targets)[1]


def plain_peer(vocab_size: int) -> tuple[nn.Module, torch.optim.Optimizer, LossOf]:
    """``train_step_overhead.PlainGPT`` with nanoGPT's initialisation and optimizer groups."""
    shapes.VOCAB = vocab_size
    model = shapes.PlainGPT()
    for name, parameter in model.named_parameters():
        if name.endswith("proj.weight") or name.endswith("out.weight"):
            torch.nn.init.normal_(parameter, 0.0, 0.02 / math.sqrt(2 * shapes.LAYERS))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS)
    return model, optimizer, lambda inputs, targets: F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--steps", type=int, default=STEPS, help=f"max_iters (default {STEPS})")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--nanogpt", type=Path, default=None, metavar="PATH",
                        help="train nanoGPT's own GPT (PATH/model.py of a nanoGPT checkout) instead of PlainGPT")
    parser.add_argument("--full-validation", action=argparse.BooleanOptionalAction, default=True,
                        help="end with the loss on all of the validation split (not part of nanoGPT's run)")
    parser.add_argument("--json", action="store_true", help="end with the figures as one line of JSON")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps must be at least 1 (got {args.steps})")
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be at least 1 (got {args.threads})")
        torch.set_num_threads(args.threads)
    if not DATA.is_file():
        raise SystemExit(f"{DATA} is absent")
    text = gzip.decompress(DATA.read_bytes()).decode("utf-8")
    characters = sorted(set(text))
    lookup = {c: i for i, c in enumerate(characters)}
    data = torch.tensor([lookup[c] for c in text])
    cut = int(len(data) * 0.9)
    train, val = data[:cut], data[cut:]
    torch.manual_seed(args.seed)
    if args.nanogpt is not None:
        model, optimizer, loss_of = nanogpt_peer(args.nanogpt, len(characters))
    else:
        model, optimizer, loss_of = plain_peer(len(characters))
    parameters = list(model.parameters())

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
            means[name] = sum(loss_of(*batch(split)).item() for _ in range(EVAL_ITERS)) / EVAL_ITERS
        model.train()
        return means

    best_val = math.inf
    checkpoint_dir = tempfile.TemporaryDirectory(prefix="plain-gpt-")
    train_seconds = eval_seconds = 0.0
    evaluations = 0
    for step in range(args.steps + 1):  # nanoGPT's loop runs iterations 0 .. max_iters
        if step % EVAL_INTERVAL == 0:
            started = time.perf_counter()
            losses = estimate_loss()
            evaluations += 1
            if losses["val"] < best_val:
                best_val = losses["val"]
                if step > 0:
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": step,
                                "best_val_loss": best_val}, Path(checkpoint_dir.name) / "ckpt.pt")
            eval_seconds += time.perf_counter() - started
        started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps)
        x, y = batch(train)
        loss = loss_of(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        train_seconds += time.perf_counter() - started
    checkpoint_dir.cleanup()
    figures = {
        "model": f"nanoGPT's GPT ({args.nanogpt})" if args.nanogpt is not None else "PlainGPT",
        "threads": torch.get_num_threads(), "steps": args.steps + 1, "train_seconds": train_seconds,
        "tokens_per_s": (args.steps + 1) * shapes.BATCH * shapes.CONTEXT / train_seconds,
        "eval_seconds": eval_seconds, "evaluations": evaluations, "eval_batches": 2 * EVAL_ITERS,
        "train_loss": loss.item(), "val_loss": losses["val"],
    }
    summary = (f"seed {args.seed}, {figures['model']}, {figures['threads']} threads: {figures['steps']} training "
               f"steps {train_seconds:.1f} s ({figures['tokens_per_s']:,.0f} tokens/s), {evaluations} evaluations "
               f"of {2 * EVAL_ITERS} batches (both splits) and checkpoints {eval_seconds:.1f} s; last train loss "
               f"{figures['train_loss']:.4f}, last {EVAL_ITERS}-batch val loss {figures['val_loss']:.4f}")
    if args.full_validation:
        model.eval()
        usable = (len(val) - 1) // shapes.CONTEXT * shapes.CONTEXT
        inputs, targets = val[:usable].view(-1, shapes.CONTEXT), val[1 : usable + 1].view(-1, shapes.CONTEXT)
        with torch.no_grad():
            total = sum(loss_of(inputs[i : i + 256], targets[i : i + 256]).item() * targets[i : i + 256].numel()
                        for i in range(0, len(inputs), 256))
        figures["full_val_loss"] = total / targets.numel()
        summary += f", full validation loss {figures['full_val_loss']:.4f}"
    print(summary)
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
