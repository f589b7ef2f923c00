"""SQuAD v1.1 exact match and F1 by the rules of the official evaluate-v1.1 script: both answers are
normalised (lowercased, ASCII punctuation removed, the articles a/an/the removed as words, whitespace
collapsed); exact match compares the normalised strings, F1 the bags of their words; a prediction gets
the best score over the question's gold answers; the totals are percentages over the gold questions.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_DELETE_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """The answer as the official script compares it."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_DELETE_PUNCTUATION)).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised answers are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """F1 of the words the normalised answers share (counted with multiplicity); 0.0 when they share
    none (two empty answers included, as in v1.1)."""
    return _words_f1(normalize_answer(prediction).split(), normalize_answer(gold).split())


def _words_f1(predicted_words: list[str], gold_words: list[str]) -> float:
    shared = sum((Counter(predicted_words) & Counter(gold_words)).values())
    if shared == 0:
        return 0.0
    precision = shared / len(predicted_words)
    recall = shared / len(gold_words)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class SquadScores:
    """Exact match and F1 in percent over ``total`` gold questions; ``missing`` of them had no
    prediction and scored 0 (as the official script scores them)."""

    exact_match: float
    f1: float
    total: int
    missing: int


def squad_scores(predictions: Mapping[str, str], gold_answers: Mapping[str, Sequence[str]]) -> SquadScores:
    """Score ``predictions`` (question id -> answer text) against ``gold_answers`` (question id -> its
    gold texts, e.g. ``SquadData.gold_answers()``). Predictions for ids not in the gold are ignored."""
    exact_total = f1_total = 0.0
    missing = 0
    for question_id, golds in gold_answers.items():
        if question_id not in predictions:
            missing += 1
            continue
        prediction = normalize_answer(predictions[question_id])
        normalised_golds = [normalize_answer(gold) for gold in golds]
        exact_total += max(float(prediction == gold) for gold in normalised_golds)
        f1_total += max(_words_f1(prediction.split(), gold.split()) for gold in normalised_golds)
    total = len(gold_answers)
    return SquadScores(100.0 * exact_total / total if total else 0.0, 100.0 * f1_total / total if total else 0.0,
                       total, missing)
