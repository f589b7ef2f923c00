"""The training loop: AdamW, warmup then decay, gradient clipping, periodic evaluation,
progress, metrics.jsonl, and a checkpoint folder at the end."""

from __future__ import annotations

import json
import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from tformer.data.lm import random_crops
from tformer.errors import TformerError
from tformer.nn.losses import token_cross_entropy
from tformer.training.optim import build_optimizer
from tformer.training.schedules import SCHEDULES, learning_rate

PRECISIONS = ("fp32", "bf16")


class TrainingError(TformerError):
    """A training setting is invalid, or training cannot go on (a non-finite loss)."""


@dataclass(frozen=True)
class TrainingConfig:
    """How to train: steps, batch, optimiser, schedule, evaluation and precision."""

    max_steps: int = 1000
    batch_size: int = 12
    seq_len: int | None = None  # defaults to the model's max_seq_len
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    schedule: str = "cosine"
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_batches: int = 20
    seed: int = 1337
    precision: str = "fp32"

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "eval_batches"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise TrainingError(f"training.{name}={getattr(self, name)!r} must be a positive integer")
        if self.schedule not in SCHEDULES:
            raise TrainingError(f"training.schedule={self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.precision not in PRECISIONS:
            raise TrainingError(f"training.precision={self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if not self.lr > 0:
            raise TrainingError(f"training.lr={self.lr!r} must be > 0")


@dataclass
class TrainingResult:
    """What a finished run reports."""

    steps: int
    final_train_loss: float
    final_eval_loss: float | None
    seconds: float
    tokens_per_second: float
    history: list[dict] = field(default_factory=list)


class Trainer:
    """Trains a language model on random crops of a token sequence.

    ``train_tokens`` / ``eval_tokens``: 1-D int64 tensors. With ``out_dir`` the run writes
    ``metrics.jsonl`` as it goes and, at the end, a checkpoint folder (config.json,
    model.safetensors, tokenizer.json) into ``out_dir`` itself.
    """

    def __init__(self, model, config: TrainingConfig, train_tokens, eval_tokens=None,
                 out_dir: str | Path | None = None, progress: bool = True) -> None:
        self.model = model
        self.config = config
        self.train_tokens = train_tokens
        self.eval_tokens = eval_tokens
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.progress = progress
        self.seq_len = config.seq_len or model.config.max_seq_len
        if self.seq_len > model.config.max_seq_len and model.positional.has_table:
            raise TrainingError(
                f"training.seq_len={self.seq_len} exceeds the model's max_seq_len={model.config.max_seq_len}"
            )
        self.optimizer = build_optimizer(
            model, config.lr, config.weight_decay, (config.beta1, config.beta2), config.eps
        )
        self.step = 0

    # ---- one step ------------------------------------------------------------------------------

    def _autocast(self):
        if self.config.precision == "bf16":
            return torch.autocast(device_type=self.model.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def loss_on(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            logits = self.model(inputs).logits
        return token_cross_entropy(logits, targets)

    def train_step(self) -> tuple[float, float]:
        """One optimisation step; returns (loss, learning rate)."""
        config = self.config
        lr = learning_rate(
            self.step, schedule=config.schedule, lr=config.lr, warmup_steps=config.warmup_steps,
            max_steps=config.max_steps, min_lr=config.min_lr, d_model=self.model.config.d_model,
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = random_crops(self.train_tokens, config.batch_size, self.seq_len, config.seed, self.step)
        inputs, targets = inputs.to(self.model.device), targets.to(self.model.device)
        self.model.train()
        loss = self.loss_on(inputs, targets)
        if not torch.isfinite(loss):
            raise TrainingError(f"loss became {loss.item()} at step {self.step}; lower training.lr or check the data")
        loss.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return loss.item(), lr

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Mean loss over ``eval_batches`` fixed random crops of the evaluation tokens."""
        if self.eval_tokens is None:
            return None
        self.model.eval()
        losses = []
        for index in range(self.config.eval_batches):
            inputs, targets = random_crops(
                self.eval_tokens, self.config.batch_size, self.seq_len, self.config.seed + 1, index
            )
            losses.append(self.loss_on(inputs.to(self.model.device), targets.to(self.model.device)).item())
        return sum(losses) / len(losses)

    # ---- the run ---------------------------------------------------------------------------------

    def train(self) -> TrainingResult:
        config = self.config
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            metrics_file = open(self.out_dir / "metrics.jsonl", "w")  # noqa: SIM115
        else:
            metrics_file = None
        history: list[dict] = []
        tokens_per_step = config.batch_size * self.seq_len
        eval_loss = None
        loss = math.nan
        start = time.perf_counter()
        bar = tqdm(total=config.max_steps, desc="training", unit="step", disable=not self.progress, dynamic_ncols=True)
        try:
            while self.step < config.max_steps:
                loss, lr = self.train_step()
                elapsed = time.perf_counter() - start
                record = {"step": self.step, "train_loss": loss, "lr": lr,
                          "tokens_per_s": self.step * tokens_per_step / elapsed}
                if self.step % config.eval_every == 0 or self.step == config.max_steps:
                    eval_loss = self.evaluate()
                    if eval_loss is not None:
                        record["eval_loss"] = eval_loss
                        bar.write(f"step {self.step:>6}  train loss {loss:.4f}  eval loss {eval_loss:.4f}")
                history.append(record)
                if metrics_file is not None:
                    metrics_file.write(json.dumps(record) + "\n")
                bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{record['tokens_per_s']:,.0f}")
                bar.update(1)
        finally:
            bar.close()
            if metrics_file is not None:
                metrics_file.close()
        seconds = time.perf_counter() - start
        if self.out_dir is not None:
            self.model.save(self.out_dir)
            (self.out_dir / "training_config.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
        return TrainingResult(
            steps=self.step, final_train_loss=loss, final_eval_loss=eval_loss, seconds=seconds,
            tokens_per_second=self.step * tokens_per_step / seconds, history=history,
        )
