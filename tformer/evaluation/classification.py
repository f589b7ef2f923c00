"""Classification metrics from a confusion matrix: accuracy, per-class precision/recall/F1 and their
macro average. A Task sums the matrix over batches and processes (a bincount on the device), then
finalises it here; ``confusion_matrix`` builds one from label lists."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tformer.errors import TformerError
from tformer.evaluation.scores import Scores, precision_recall_f1


@dataclass(frozen=True)
class ClassificationScores:
    """Accuracy, the macro averages (over the classes that occur in the labels or the predictions, as
    scikit-learn averages by default), each class's scores by name, and the matrix they came from."""

    accuracy: float
    macro_precision: float
    macro_recall: float
    macro_f1: float
    per_class: dict[str, Scores]
    matrix: np.ndarray  # (C, C) counts, row = true class, column = predicted class

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """Flat figures for a log: accuracy, macro P/R/F1, and each class's F1."""
        figures = {f"{prefix}accuracy": self.accuracy, f"{prefix}macro_precision": self.macro_precision,
                   f"{prefix}macro_recall": self.macro_recall, f"{prefix}macro_f1": self.macro_f1}
        figures.update({f"{prefix}f1_{name}": scores.f1 for name, scores in self.per_class.items()})
        return figures


def confusion_matrix(labels: Sequence[int], predictions: Sequence[int], num_classes: int) -> np.ndarray:
    """(num_classes, num_classes) int64 counts: entry [t, p] counts the examples of true class t predicted
    as p. Accepts lists, numpy arrays or CPU tensors of class ids."""
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    predictions = np.asarray(predictions, dtype=np.int64).reshape(-1)
    if labels.shape != predictions.shape:
        raise TformerError(f"{labels.size} labels but {predictions.size} predictions")
    for name, ids in (("label", labels), ("prediction", predictions)):
        if ids.size and (ids.min() < 0 or ids.max() >= num_classes):
            bad = ids[(ids < 0) | (ids >= num_classes)][0]
            raise TformerError(f"{name} {bad} is not a class id (0..{num_classes - 1})")
    flat = np.bincount(labels * num_classes + predictions, minlength=num_classes * num_classes)
    return flat.reshape(num_classes, num_classes)


def classification_scores(matrix, label_names: Sequence[str] | None = None) -> ClassificationScores:
    """The scores of a (C, C) confusion matrix (numpy array, nested list or CPU tensor); ``label_names``
    name the classes (default "0".."C-1")."""
    matrix = np.asarray(matrix, dtype=np.int64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise TformerError(f"a confusion matrix is square, got shape {matrix.shape}")
    num_classes = matrix.shape[0]
    names = [str(number) for number in range(num_classes)] if label_names is None else [str(n) for n in label_names]
    if len(names) != num_classes:
        raise TformerError(f"{len(names)} label names for a {num_classes}-class confusion matrix")
    correct = np.diag(matrix)
    actual = matrix.sum(axis=1)
    predicted = matrix.sum(axis=0)
    per_class = {name: precision_recall_f1(int(correct[c]), int(predicted[c]), int(actual[c]))
                 for c, name in enumerate(names)}
    present = [name for c, name in enumerate(names) if actual[c] or predicted[c]]
    total = int(matrix.sum())

    def macro(metric: str) -> float:
        return float(np.mean([getattr(per_class[name], metric) for name in present])) if present else 0.0

    return ClassificationScores(
        accuracy=int(correct.sum()) / total if total else 0.0,
        macro_precision=macro("precision"), macro_recall=macro("recall"), macro_f1=macro("f1"),
        per_class=per_class, matrix=matrix,
    )


def accuracy(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """The fraction of predictions equal to their labels."""
    labels = np.asarray(labels).reshape(-1)
    predictions = np.asarray(predictions).reshape(-1)
    if labels.shape != predictions.shape:
        raise TformerError(f"{labels.size} labels but {predictions.size} predictions")
    if not labels.size:
        raise TformerError("accuracy of no examples")
    return float((labels == predictions).mean())
