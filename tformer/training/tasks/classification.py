"""Sequence classification (one text or a pair -> one label) from TSV, CSV, JSONL, Parquet files or datasets
folders (``tformer.data.records``).

Texts longer than ``seq_len`` tokens are truncated (the longer of a pair first) and counted in the
task's description. Evaluation sums a confusion matrix (one count per cell, so totals add up over
batches and processes) and finalises it into accuracy and macro F1; ``confusion`` keeps the last
evaluation's matrix for a plot.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from tformer.data.classification import LABEL_COLUMN, ClassificationData, read_classification
from tformer.data.files import DataFileError
from tformer.data.sources import DataConfig
from tformer.errors import listed
from tformer.evaluation.classification import classification_scores
from tformer.nn.losses import token_cross_entropy
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks.base import Batch, TaskData
from tformer.training.tasks.examples import (
    EVAL_WEIGHTS,
    ExampleTask,
    Rows,
    data_tokenizer,
    drop_unused_segments,
    model_inputs,
    pad_rows,
    training_count,
)


def encode_texts(tokenizer, data: ClassificationData, seq_len: int) -> tuple[Rows, int]:
    """Token rows of every example (label ids in ``labels`` when the data has them) and how many
    were truncated to ``seq_len``."""
    texts = [example.text for example in data.examples]
    pairs = [example.text_pair for example in data.examples]
    pairs = None if all(pair is None for pair in pairs) else [pair or "" for pair in pairs]
    encoded = tokenizer.encode_batch(texts, pairs)
    names = [name for name in ("input_ids", "token_type_ids", "attention_mask") if name in encoded]
    sequences = {name: list(encoded[name]) for name in names}
    long = [row for row, ids in enumerate(sequences["input_ids"]) if len(ids) > seq_len]
    if long:  # encoded again, truncated (the longer of a pair first): only the rows that need it
        long_pairs = None if pairs is None else [pairs[row] for row in long]
        cut = tokenizer.encode_batch([texts[row] for row in long], long_pairs, truncation=True, max_length=seq_len)
        for name in names:
            for position, row in enumerate(long):
                sequences[name][row] = cut[name][position]
    truncated = len(long)
    per_row = {"labels": data.label_ids()} if data.label_names and data.examples[0].label is not None else {}
    return pad_rows(sequences, per_row, padding={"input_ids": tokenizer.pad_token_id or 0}), truncated


class LabelEvaluation:
    """The evaluation of single-label classification over ``label_names``, for an ExampleTask whose
    batches hold ``labels`` (B,) and the model's inputs: the loss and a confusion matrix summed as one
    count per cell (so totals add up over batches and processes), finalised into accuracy and macro F1;
    ``confusion`` keeps the last evaluation's matrix for a plot."""

    metrics = ("eval_loss", "eval_accuracy", "eval_f1")
    higher_is_better = frozenset({"eval_accuracy", "eval_f1"})
    label_names: tuple[str, ...]
    confusion: np.ndarray | None = None

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, Tensor | float]:
        weights, labels = batch[EVAL_WEIGHTS], batch["labels"]
        logits = model(**model_inputs(batch, "labels")).logits  # (B, L)
        losses = token_cross_entropy(logits, labels, reduction="none")  # (B,): the models' single-label loss
        num_labels = len(self.label_names)
        cells = torch.bincount(labels * num_labels + logits.argmax(dim=-1), weights=weights,
                               minlength=num_labels * num_labels)
        sums: dict[str, Tensor | float] = {"loss": (losses * weights).sum().double(), "rows": weights.sum()}
        sums.update({f"confusion/{cell}": count for cell, count in enumerate(cells)})
        return sums

    def finalise(self, totals: dict[str, float]) -> dict[str, float]:
        num_labels = len(self.label_names)
        cells = [round(totals[f"confusion/{cell}"]) for cell in range(num_labels * num_labels)]
        self.confusion = np.asarray(cells, dtype=np.int64).reshape(num_labels, num_labels)
        scores = classification_scores(self.confusion, self.label_names)
        return {"eval_loss": totals["loss"] / totals["rows"], "eval_accuracy": scores.accuracy,
                "eval_f1": scores.macro_f1}



def read_labelled(data: DataConfig, label_names: tuple[str, ...] | None = None
                  ) -> tuple[ClassificationData, ClassificationData | None]:
    """The labelled examples a [data] section names: ``train``, and ``eval`` or else the last ``eval_fraction``
    of ``train`` (None: no evaluation); label names as declared, else the training file's."""
    options = {"format": None if data.format == "auto" else data.format, "columns": data.columns,
               "skip_bad": data.skip_bad, "text_column": data.text_column,
               "text_pair_column": data.text_pair_column, "label_column": data.label_column or LABEL_COLUMN}
    try:
        train = read_classification(data.train, labels=label_names, **options)
        if data.eval:
            source = "the declared labels" if label_names else f"the labels of the training file {data.train}"
            return train, read_classification(data.eval, labels=train.label_names, labels_from=source, **options)
        if data.eval_fraction > 0:
            return _split(train, training_count(len(train), data.eval_fraction, "examples", data.train))
        return train, None
    except DataFileError as error:
        raise TrainingError(str(error)) from None


class SequenceClassification(LabelEvaluation, ExampleTask):
    """Single-label classification of ``train`` (and ``evaluation``) examples, tokenized by
    ``tokenizer`` to at most ``seq_len`` tokens; the model's head is ``sequence_classification``
    with as many labels as ``train.label_names``."""

    name = "classification"
    data_settings = frozenset({"tokenizer", "columns", "skip_bad", "text_column", "text_pair_column", "label_column"})

    def __init__(self, train: ClassificationData, evaluation: ClassificationData | None, tokenizer, *,
                 seq_len: int = 128) -> None:
        super().__init__()
        if tokenizer.pad_token_id is None:
            raise TrainingError(f"the classification task pads batches; {type(tokenizer).__name__} has no pad token")
        self.tokenizer = tokenizer
        self.label_names = tuple(train.label_names)
        self.seq_len = seq_len
        self.train_rows, self.train_truncated = encode_texts(tokenizer, train, seq_len)
        self.eval_rows, self.eval_truncated = (None, 0) if evaluation is None else \
            encode_texts(tokenizer, evaluation, seq_len)
        self.confusion: np.ndarray | None = None

    @classmethod
    def from_recipe(cls, data: DataConfig, *, seq_len: int | None, tokenizer=None, label_names=None):
        """The task on the files a recipe's [data] names (``eval``, else the last ``eval_fraction`` of
        ``train``); label names from the recipe, else from the training file."""
        tokenizer = data_tokenizer(data, cls.name, tokenizer)
        train, evaluation = read_labelled(data, label_names)
        task = cls(train, evaluation, tokenizer, seq_len=seq_len or 128)
        return task, TaskData(tokenizer, tokenizer.vocab_size, task.describe(train, evaluation), task.label_names)

    def describe(self, train: ClassificationData, evaluation: ClassificationData | None) -> str:
        """One line: examples per split, labels, truncations and skipped rows."""
        def split(data: ClassificationData, truncated: int) -> str:
            notes = [f"{truncated:,} truncated to {self.seq_len} tokens"] if truncated else []
            notes += [data.skipped.summary()] if data.skipped else []
            return f"{Path(data.path).name}: {len(data):,} examples" + (f" ({'; '.join(notes)})" if notes else "")
        held_out = "" if evaluation is None else f"; evaluation {split(evaluation, self.eval_truncated)}"
        return (f"training {split(train, self.train_truncated)}{held_out}; {len(self.label_names)} labels: "
                f"{listed(self.label_names)}")

    def prepare(self, config: TrainingConfig, context: ProcessContext, model: nn.Module) -> None:
        super().prepare(config, context, model)
        model_config = model.config
        if model_config.head != "sequence_classification":
            raise TrainingError(f"the classification task trains head 'sequence_classification', not "
                                f"head={model_config.head!r}")
        if model_config.problem_type not in (None, "single_label_classification"):
            raise TrainingError(f"the classification task trains single-label classification; the model's "
                                f"problem_type is {model_config.problem_type!r}")
        if model_config.num_labels != len(self.label_names):
            raise TrainingError(f"the data has {len(self.label_names)} labels ({listed(self.label_names)}) but "
                                f"the model's num_labels is {model_config.num_labels}")
        segments = drop_unused_segments(model, self.train_rows.fields, self.eval_rows and self.eval_rows.fields)
        self.check_model_fits(model, self.tokenizer, self.seq_len, segments=segments)



def _split(data: ClassificationData, keep: int) -> tuple[ClassificationData, ClassificationData]:
    """The first ``keep`` examples, and the rest (held out for evaluation)."""
    head = ClassificationData(data.path, data.examples[:keep], data.label_names, data.skipped)
    return head, ClassificationData(data.path, data.examples[keep:], data.label_names)
