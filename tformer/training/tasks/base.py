"""A Task: what the Trainer trains on and how it is scored, so the loop itself knows no objective.

A task gives its training batches (a dict of tensors, a pure function of seed and position, this
process's rows of the global batch: resume stays bitwise and N processes see what one sees), its
loss, its evaluation as sums that the Trainer adds up over batches and processes, and the metrics
those sums finalise into, with which of them are better higher and the unit of its throughput.

A task a recipe can name also declares, beside its class, what a recipe may say to it: its ``[task]``
settings (``Options``, a frozen dataclass that checks its values), the ``[data]`` formats and settings it
reads (``data_formats``, ``data_settings``), and how its metrics print (``metric_places``). The registry
and the Trainer read these declarations; they list no task's settings or metrics themselves.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn

from tformer.nn.losses import token_cross_entropy
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext

Batch = dict[str, Tensor]

# Floats of logits one evaluation forward pass may hold (64 MiB): a task whose evaluation takes logits (B, T, V)
# over a vocabulary runs a batch in pieces of rows that fit (``eval_rows_per_pass``)
EVAL_LOGITS_BUDGET = 2**24


@dataclass
class TaskData:
    """What a task's data tells the rest of a run: the tokenizer, the vocabulary size it implies,
    the label names (None: the task has none) and a line describing the data."""

    tokenizer: object | None
    vocab_size: int | None
    description: str
    label_names: tuple[str, ...] | None = None


@dataclass(frozen=True)
class NoOptions:
    """The ``[task]`` settings of a task that has none besides its name. A task with settings declares a
    frozen dataclass like this one: a field per setting (its default, a comment saying what it does), its
    checks in ``__post_init__`` raising TrainingError("task.KEY=... must ...")."""


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
    loss_alone = False  # the prepared model gives its loss without its logits (``Model.loss_alone``): ``loss`` asks
    higher_is_better: frozenset[str] = frozenset()  # those of ``metrics`` that improve upwards (the rest: downwards)
    metric_places: ClassVar[dict[str, int]] = {}  # decimals a metric prints with besides the defaults (format_metric)
    # What a recipe may say to the task (a task that cannot be named in a recipe leaves them):
    Options: ClassVar[type] = NoOptions  # its [task] settings
    data_formats: tuple[str, ...] = ()  # the data.format values it reads besides "auto" and the record formats
    data_settings: frozenset[str] = frozenset()  # the [data] settings it reads besides train, eval, eval_fraction
    learned_tokenizers: tuple[str, ...] = ()  # data.tokenizer values it learns from its data (not files)
    reads_seq_len: bool = True  # it reads training.seq_len (a recipe giving one to a task that does not is refused)
    reads_model_folder: bool = False  # its from_recipe takes model_folder: the pretrained model's (its chat template)

    @classmethod
    def check_data(cls, data) -> None:
        """Refuse a combination of [data] settings the task cannot read (TrainingError); each setting
        alone is checked against ``data_formats`` and ``data_settings`` by the registry."""

    @classmethod
    def label_names_for(cls, num_labels: int) -> tuple[str, ...] | None:
        """The label names a recipe's ``num_labels`` implies when it names none (None: the data's)."""
        return None

    @classmethod
    def format_metric(cls, name: str, value: float) -> str:
        """A metric's value as the run's log prints it: losses to 4 places, perplexities to 2 (in powers of
        ten past a million), rates to 3, unless ``metric_places`` says otherwise."""
        if name in cls.metric_places:
            return f"{value:.{cls.metric_places[name]}f}"
        if name.endswith("_ppl"):
            return f"{value:.2f}" if not value >= 1e6 else f"{value:.3g}"
        return f"{value:.4f}" if name.endswith("_loss") else f"{value:.3f}"

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
        self.loss_alone = getattr(model, "loss_alone", False)

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
        """The batch's mean loss (a scalar), under autocast: the model's, with ``label_smoothing`` while training.
        ``model`` is the module to call (DDP-wrapped or compiled); ``model.training`` tells training from
        evaluation. A model that gives its loss alone (``Model.loss_alone``) is asked for it: its logits are never
        held whole."""
        smoothing = self.config.label_smoothing if model.training else 0.0
        if self.loss_alone:
            return model(**batch, return_logits=False, label_smoothing=smoothing).loss
        if not smoothing:
            return model(**batch).loss
        inputs = {name: tensor for name, tensor in batch.items() if name != "labels"}
        return token_cross_entropy(model(**inputs).logits, batch["labels"], smoothing)

    # ---- evaluation ------------------------------------------------------------------------------

    def eval_batches(self) -> Iterator[Batch]:
        """This process's evaluation batches, the same at every evaluation; every process must
        yield as many (a sharded model gathers its weights in each forward pass)."""
        raise NotImplementedError(f"{type(self).__name__} has no evaluation data (define eval_batches)")

    def eval_rows_per_pass(self) -> int | None:
        """Rows of an evaluation batch one forward pass takes (None: the batch whole), from the run's settings
        alone, so that every process runs as many passes (a sharded model gathers its weights in each). The
        Trainer adds up ``eval_sums`` over the pieces: a task that gives rows sums over its rows."""
        return None

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, Tensor | float]:
        """Sums over one evaluation batch (tensors stay on the device: no host sync); the
        Trainer adds them over batches and processes and hands the totals to ``finalise``."""
        rows = next(iter(batch.values())).shape[0]
        return {"loss": self.loss(model, batch).double() * rows, "rows": rows}

    def finalise(self, totals: dict[str, float]) -> dict[str, float]:
        """The named metrics (``metrics``) from the sums over the whole evaluation set."""
        return {"eval_loss": totals["loss"] / totals["rows"]}


def rows_within_logits_budget(seq_len: int, vocab_size: int) -> int:
    """Rows of ``seq_len`` positions whose logits over ``vocab_size`` fit ``EVAL_LOGITS_BUDGET`` (at least one)."""
    return max(1, EVAL_LOGITS_BUDGET // (seq_len * vocab_size))


def row_pieces(batch: Batch, rows: int | None) -> Iterator[Batch]:
    """The batch in pieces of ``rows`` rows (every value sliced along its first dimension); whole when ``rows`` is
    None or covers it."""
    total = len(next(iter(batch.values())))
    if rows is None or total <= rows:
        yield batch
        return
    for start in range(0, total, rows):
        yield {name: value[start:start + rows] for name, value in batch.items()}


def perplexity(loss: float) -> float:
    """exp(loss); inf where that overflows a float (a diverged run), NaN for a NaN loss."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf
