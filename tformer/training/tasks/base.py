"""A Task: what the Trainer trains on and how it is scored, so the loop itself knows no objective.

A task gives its training batches (a dict of tensors, a pure function of seed and position, this
process's rows of the global batch: resume stays bitwise and N processes see what one sees), its
loss, its evaluation as sums that the Trainer adds up over batches and processes, and the metrics
those sums finalise into, with which of them are better higher and the unit of its throughput.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from torch import Tensor, nn

from tformer.nn.losses import token_cross_entropy
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext

Batch = dict[str, Tensor]


@dataclass
class TaskData:
    """What a task's data tells the rest of a run: the tokenizer, the vocabulary size it implies,
    the label names (None: the task has none) and a line describing the data."""

    tokenizer: object | None
    vocab_size: int | None
    description: str
    label_names: tuple[str, ...] | None = None


class Task:
    """The default objective: ``model(**batch).loss``; with ``training.label_smoothing`` the
    loss is taken from the logits and ``batch["labels"]`` instead (labels aligned with the
    logits, -100 ignored, as classification, tagging and masked LM have them), while training only.

    A subclass gives ``train_batch`` and, to be evaluated, ``eval_batches``; it may override
    ``loss``, ``eval_sums`` and ``finalise`` (and then ``metrics``). The Trainer calls
    ``prepare`` once before anything else.
    """

    name = "task"
    unit = "examples"  # what the throughput counts: examples/s (tokens/s for a language model)
    metrics: tuple[str, ...] = ("eval_loss",)  # what ``finalise`` reports
    higher_is_better: frozenset[str] = frozenset({"eval_accuracy", "eval_nsp_accuracy", "eval_precision", "eval_recall",
                                                  "eval_f1", "eval_exact_match", "eval_bleu"})

    @classmethod
    def from_recipe(cls, data, *, seq_len: int | None, tokenizer=None, label_names=None, **options):
        """The task on the data a recipe's [data] section names, and a TaskData (tokenizer, label
        names, a description) for the model; ``options``: the task's [task] settings."""
        raise TrainingError(f"the {cls.name} task cannot be named in a recipe (it has no from_recipe)")

    def prepare(self, config: TrainingConfig, context: ProcessContext, model: nn.Module) -> None:
        """Take the run's settings (batch size, seed, this process's rank); check the data fits
        the model (a TrainingError naming what does not)."""
        self.config = config
        self.context = context

    @property
    def units_per_row(self) -> int:
        """How many units (see ``unit``) one row of a batch holds: 1 example, or T tokens."""
        return 1

    def units_per_batch(self) -> int:
        """Units in one process's micro-batch: ``batch_size`` rows of ``units_per_row``; a task whose
        batches vary in size (a token budget) gives their mean over an epoch."""
        return self.config.batch_size * self.units_per_row

    def describe_batch(self) -> str:
        """A process's micro-batch, for the run's log: its rows (x the units of each)."""
        per_row = self.units_per_row
        return f"{self.config.batch_size} x {per_row}" if per_row > 1 else f"{self.config.batch_size}"

    @property
    def can_evaluate(self) -> bool:
        return False

    # ---- training -------------------------------------------------------------------------------

    def train_batch(self, position: int) -> Batch:
        """This process's rows of the global training batch at ``position`` (the micro-batch
        counter), on the CPU: a pure function of ``config.seed`` and ``position``."""
        raise NotImplementedError(f"{type(self).__name__} gives no training batches (define train_batch)")

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        """The batch's mean loss (a scalar), under autocast. ``model`` is the module to call
        (DDP-wrapped or compiled); ``model.training`` tells training from evaluation."""
        smoothing = self.config.label_smoothing if model.training else 0.0
        if not smoothing:
            return model(**batch).loss
        inputs = {name: tensor for name, tensor in batch.items() if name != "labels"}
        return token_cross_entropy(model(**inputs).logits, batch["labels"], smoothing)

    # ---- evaluation ------------------------------------------------------------------------------

    def eval_batches(self) -> Iterator[Batch]:
        """This process's evaluation batches, the same at every evaluation; every process must
        yield as many (a sharded model gathers its weights in each forward pass)."""
        raise NotImplementedError(f"{type(self).__name__} has no evaluation data (define eval_batches)")

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, Tensor | float]:
        """Sums over one evaluation batch (tensors stay on the device: no host sync); the
        Trainer adds them over batches and processes and hands the totals to ``finalise``."""
        rows = next(iter(batch.values())).shape[0]
        return {"loss": self.loss(model, batch).double() * rows, "rows": rows}

    def finalise(self, totals: dict[str, float]) -> dict[str, float]:
        """The named metrics (``metrics``) from the sums over the whole evaluation set."""
        return {"eval_loss": totals["loss"] / totals["rows"]}


def perplexity(loss: float) -> float:
    """exp(loss); inf where that overflows a float (a diverged run), NaN for a NaN loss."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf
