"""Next-token language modelling: random crops of a token sequence to train on, windows spread
evenly over a held-out sequence to evaluate on (loss, perplexity and next-token accuracy from one
forward pass), throughput in tokens/s."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor, nn

from tformer.data.lm import check_token_ids, num_tokens, random_crops, spaced_windows
from tformer.data.sources import DataConfig, load_language_model_data
from tformer.nn.losses import next_token_loss, next_token_targets
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks.base import (
    EVAL_LOGITS_BUDGET,
    Batch,
    Task,
    TaskData,
    perplexity,
    rows_within_logits_budget,
)


class LanguageModelling(Task):
    """Train on random crops of ``train_tokens``; evaluate on ``eval_tokens`` (both 1-D token
    ids: a tensor, a list, or a numpy array, a memory map too). Batches are
    ``{"input_ids": (B, T), "labels": (B, T + 1)}``: crops of T + 1 tokens, the inputs their first T, so
    every position has its next token to predict (the decoder reads such labels: ``next_token_loss``), and
    ``model(**batch).loss`` is the training loss.

    A subclass that overrides ``loss`` (distillation, ...) is evaluated on that loss: it reports
    ``eval_loss`` and ``eval_ppl``, not the next-token accuracy.
    """

    name = "lm"
    higher_is_better = frozenset({"eval_accuracy"})
    data_formats = ("text", "tokens", "npy")
    data_settings = frozenset({"tokenizer", "columns", "text_column"})
    unit = "tokens"

    def __init__(self, train_tokens, eval_tokens=None, *, sources: dict[str, str] | None = None) -> None:
        self.train_tokens = _as_tokens(train_tokens)
        self.eval_tokens = None if eval_tokens is None else _as_tokens(eval_tokens)
        self.sources = dict(sources or {})  # "training"/"evaluation" -> the file the tokens came from

    @classmethod
    def from_recipe(cls, data: DataConfig, *, seq_len: int | None, tokenizer=None, label_names=None):
        """The task on the tokens a recipe's [data] names, and what they tell the model (TaskData)."""
        if label_names:
            raise TrainingError("label_names: the lm task has no labels")
        loaded = load_language_model_data(data, tokenizer)
        sources = {"training": data.train, "evaluation": data.eval or data.train}
        return cls(loaded.train, loaded.eval, sources=sources), TaskData(loaded.tokenizer, loaded.vocab_size,
                                                                          loaded.description)

    @property
    def next_token_objective(self) -> bool:
        """Whether the loss is this class's own (not a subclass's): then one forward pass gives
        the evaluation's loss and accuracy."""
        return type(self).loss is LanguageModelling.loss

    @property
    def metrics(self) -> tuple[str, ...]:
        return ("eval_loss", "eval_ppl", "eval_accuracy") if self.next_token_objective else ("eval_loss", "eval_ppl")

    def prepare(self, config: TrainingConfig, context: ProcessContext, model: nn.Module) -> None:
        super().prepare(config, context, model)
        self.seq_len = config.seq_len or model.config.max_seq_len
        self.vocab_size = model.config.vocab_size
        limit = model.position_limit
        if limit is not None and self.seq_len > limit:
            raise TrainingError(f"training.seq_len={self.seq_len} exceeds the model's max_seq_len={limit}")
        for name, tokens in (("training", self.train_tokens), ("evaluation", self.eval_tokens)):
            if tokens is not None and num_tokens(tokens) < self.seq_len + 2:
                raise TrainingError(f"the {name} data has {num_tokens(tokens)} tokens; training.seq_len="
                                    f"{self.seq_len} needs at least {self.seq_len + 2}")
            if tokens is not None:
                source = f" ({self.sources[name]})" if name in self.sources else ""
                try:
                    check_token_ids(tokens, self.vocab_size, f"the {name} data{source}")
                except ValueError as error:
                    raise TrainingError(str(error)) from None

    @property
    def units_per_row(self) -> int:
        return self.seq_len

    @property
    def can_evaluate(self) -> bool:
        return self.eval_tokens is not None

    def train_batch(self, position: int) -> Batch:
        inputs, targets = random_crops(
            self.train_tokens, self.config.batch_size, self.seq_len, self.config.seed, position,
            rank=self.context.rank, world_size=self.context.world_size,
        )
        return crop_batch(inputs, targets)

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        """Next-token cross-entropy: the model's loss, as ``Task.loss`` asks for it (defined here so that a subclass
        overriding it is seen: ``next_token_objective``)."""
        return super().loss(model, batch)

    def eval_batches(self) -> Iterator[Batch]:
        """``eval_batches`` batches of windows spread evenly over the evaluation tokens (the same
        windows at every evaluation and for every seed; ``eval_batches = 0``: enough windows to
        cover the whole split), grouped into as few forward passes as the logits budget allows;
        every process takes its rows."""
        config, context = self.config, self.context
        rows_per_batch = config.batch_size * context.world_size
        num_batches = config.eval_batches or -(-(num_tokens(self.eval_tokens) - 1) // (self.seq_len * rows_per_batch))
        per_pass = max(1, min(num_batches, EVAL_LOGITS_BUDGET // (config.batch_size * self.seq_len * self.vocab_size)))
        for first in range(0, num_batches, per_pass):
            crops = [spaced_windows(self.eval_tokens, config.batch_size, self.seq_len, index, num_batches,
                                    rank=context.rank, world_size=context.world_size)
                     for index in range(first, min(first + per_pass, num_batches))]
            yield crop_batch(torch.cat([c[0] for c in crops]), torch.cat([c[1] for c in crops]))

    def eval_rows_per_pass(self) -> int:
        return rows_within_logits_budget(self.seq_len, self.vocab_size)

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, Tensor | float]:
        """Loss x batches (each batch weighs the same; a piece of one its share), correct next tokens, and the
        counts; the loss and the accuracy from one forward pass."""
        inputs = batch["input_ids"]
        batches = inputs.shape[0] / self.config.batch_size
        counts = {"batches": batches, "tokens": inputs.numel()}
        if not self.next_token_objective:
            return {"loss": self.loss(model, batch).double() * batches, **counts}
        logits = model(inputs).logits  # (B, T, V)
        targets = next_token_targets(batch["labels"], inputs.shape[1])  # (B, T)
        return {"loss": next_token_loss(logits, batch["labels"]).double() * batches,
                "correct": (logits.argmax(dim=-1) == targets).sum(), **counts}

    def finalise(self, totals: dict[str, float]) -> dict[str, float]:
        loss = totals["loss"] / totals["batches"]
        metrics = {"eval_loss": loss, "eval_ppl": perplexity(loss)}
        if "correct" in totals:
            metrics["eval_accuracy"] = totals["correct"] / totals["tokens"]
        return metrics


def crop_batch(inputs: Tensor, targets: Tensor) -> Batch:
    """The batch of crops: ``inputs`` (B, T) and ``labels`` (B, T + 1), the inputs followed by the last
    target (``targets`` being the inputs shifted by one, as ``random_crops`` gives them)."""
    return {"input_ids": inputs, "labels": torch.cat([inputs, targets[:, -1:]], dim=1)}


def _as_tokens(tokens):
    if isinstance(tokens, (torch.Tensor, np.ndarray)):
        return tokens
    return torch.as_tensor(tokens, dtype=torch.long)
