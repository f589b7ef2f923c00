"""Precision, recall and F1 from counts: the one formula every classification and tagging metric uses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scores:
    """Precision, recall and F1 (fractions in [0, 1]) and the support (how many true items). A ratio
    whose denominator is zero is 0, as scikit-learn and seqeval report it."""

    precision: float
    recall: float
    f1: float
    support: int


def precision_recall_f1(true_positives: int, predicted: int, actual: int) -> Scores:
    """Scores from the number of correct predictions, of predictions and of true items."""
    precision = true_positives / predicted if predicted else 0.0
    recall = true_positives / actual if actual else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return Scores(precision, recall, f1, int(actual))
