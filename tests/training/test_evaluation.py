"""Evaluation metrics against outside references: classification scores equal scikit-learn's, entity
scores equal seqeval's default mode on random tag sequences (broken I- starts, type switches, IOBES),
and SQuAD v1.1 exact match / F1 follow the official rules on hand-made cases and the shared dev file."""

from __future__ import annotations

import random

import numpy as np
import pytest
from shared_data import SHARED_DATA, require

from tformer.data.squad import read_squad
from tformer.evaluation import (
    TagError,
    accuracy,
    classification_scores,
    confusion_matrix,
    entity_counts,
    entity_scores,
    entity_spans,
    exact_match,
    normalize_answer,
    precision_recall_f1,
    squad_scores,
    token_f1,
)
from tformer.evaluation.entities import scores_from_counts
from tformer.viz.confusion import plot_confusion_matrix

SQUAD_DEV = SHARED_DATA / "squad-v1.1" / "dev-v1.1.json.gz"

# ---- classification ---------------------------------------------------------------------------------------


@pytest.mark.slow  # imports scikit-learn
def test_classification_scores_equal_scikit_learn():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for trial in range(20):
        num_classes = int(rng.integers(2, 7))
        labels = rng.integers(0, num_classes, 200)
        predictions = np.where(rng.random(200) < 0.6, labels, rng.integers(0, num_classes, 200))
        if trial % 3 == 0:  # a class that never occurs in the labels, one that is never predicted
            labels[labels == num_classes - 1] = 0
            predictions[predictions == 1] = 0
        matrix = confusion_matrix(labels, predictions, num_classes)
        assert np.array_equal(matrix, metrics.confusion_matrix(labels, predictions, labels=range(num_classes)))
        scores = classification_scores(matrix, [f"c{c}" for c in range(num_classes)])
        assert scores.accuracy == pytest.approx(metrics.accuracy_score(labels, predictions), abs=1e-12)
        assert accuracy(labels, predictions) == pytest.approx(scores.accuracy, abs=1e-12)
        precision, recall, f1, support = metrics.precision_recall_fscore_support(
            labels, predictions, labels=range(num_classes), zero_division=0)
        for c in range(num_classes):
            got = scores.per_class[f"c{c}"]
            assert (got.precision, got.recall, got.f1, got.support) == pytest.approx(
                (precision[c], recall[c], f1[c], support[c]), abs=1e-12)
        macro = metrics.precision_recall_fscore_support(labels, predictions, average="macro", zero_division=0)
        assert (scores.macro_precision, scores.macro_recall, scores.macro_f1) == pytest.approx(macro[:3], abs=1e-12)


def test_classification_by_hand_and_bad_input():
    matrix = confusion_matrix([0, 0, 1, 1, 1], [0, 1, 1, 1, 0], 3)
    assert matrix.tolist() == [[1, 1, 0], [1, 2, 0], [0, 0, 0]]
    scores = classification_scores(matrix, ["neg", "pos", "neutral"])
    assert scores.accuracy == 0.6 and scores.per_class["pos"].precision == pytest.approx(2 / 3)
    assert scores.macro_f1 == pytest.approx((0.5 + 2 / 3) / 2)  # "neutral" occurs nowhere: not averaged
    assert scores.as_dict("eval_")["eval_f1_pos"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match=r"prediction 3 is not a class id \(0..2\)"):
        confusion_matrix([0], [3], 3)
    with pytest.raises(ValueError, match="2 label names for a 3-class confusion matrix"):
        classification_scores(matrix, ["a", "b"])
    assert precision_recall_f1(0, 0, 0).f1 == 0.0


def test_confusion_matrix_png(tmp_path):
    matrix = confusion_matrix([0, 0, 1, 1, 2], [0, 1, 1, 1, 2], 3)
    out = plot_confusion_matrix(matrix, ["negative", "positive", "neutral"], tmp_path / "confusion.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["confusion.png"]  # no temporary file left
    with pytest.raises(ValueError, match="a confusion matrix of shape"):
        plot_confusion_matrix(matrix, ["a", "b"], tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


# ---- entities ---------------------------------------------------------------------------------------------


def test_entity_spans_by_hand():
    assert entity_spans(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 2), ("LOC", 3, 4)]
    assert entity_spans(["I-PER", "I-PER", "O"]) == [("PER", 0, 2)]  # an I- without B- starts an entity
    assert entity_spans(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 1), ("LOC", 1, 3)]  # the type switch splits
    assert entity_spans(["B-PER", "B-PER"]) == [("PER", 0, 1), ("PER", 1, 2)]
    assert entity_spans(["S-X", "B-X", "E-X", "E-X", "I-creative-work"]) == [
        ("X", 0, 1), ("X", 1, 3), ("X", 3, 4), ("creative-work", 4, 5)]
    with pytest.raises(TagError, match="tag 'PER' is not O or B-/I-/E-/S- followed by an entity type"):
        entity_spans(["PER"])
    with pytest.raises(TagError, match="sequence 0: 2 true tags but 1 predicted"):
        entity_scores([["O", "O"]], [["O"]])


def random_tags(rng: random.Random, length: int, prefixes: str) -> list[str]:
    types = ["PER", "LOC", "creative-work"]
    return ["O" if rng.random() < 0.4 else f"{rng.choice(prefixes)}-{rng.choice(types)}" for _ in range(length)]


def perturbed(rng: random.Random, tags: list[str], prefixes: str) -> list[str]:
    """A prediction that keeps most tags, so many entities match and some do not."""
    return [random_tags(rng, 1, prefixes)[0] if rng.random() < 0.25 else tag for tag in tags]


@pytest.mark.slow  # imports seqeval
@pytest.mark.parametrize("prefixes", ["BI", "BIES"])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_entity_scores_equal_seqeval(prefixes):
    seqeval = pytest.importorskip("seqeval.metrics.sequence_labeling")
    rng = random.Random(len(prefixes))
    for _ in range(50):
        truth = [random_tags(rng, rng.randint(1, 15), prefixes) for _ in range(rng.randint(1, 20))]
        predicted = [perturbed(rng, tags, prefixes) for tags in truth]
        ours = entity_scores(truth, predicted)
        precision, recall, f1, support = seqeval.precision_recall_fscore_support(truth, predicted, zero_division=0)
        assert list(ours.per_type) == sorted(ours.per_type)
        for index, kind in enumerate(ours.per_type):
            got = ours.per_type[kind]
            assert abs(got.precision - precision[index]) < 1e-12 and abs(got.recall - recall[index]) < 1e-12
            assert abs(got.f1 - f1[index]) < 1e-12 and got.support == support[index]
        micro = seqeval.precision_recall_fscore_support(truth, predicted, average="micro", zero_division=0)
        assert all(abs(a - b) < 1e-12 for a, b in zip((ours.micro.precision, ours.micro.recall, ours.micro.f1),
                                                       micro[:3], strict=True))
        assert abs(ours.micro.f1 - seqeval.f1_score(truth, predicted)) < 1e-12
        report = seqeval.classification_report(truth, predicted, output_dict=True, zero_division=0)
        for kind, got in ours.per_type.items():
            assert abs(report[kind]["f1-score"] - got.f1) < 1e-12 and report[kind]["support"] == got.support
        assert abs(report["micro avg"]["precision"] - ours.micro.precision) < 1e-12
        assert abs(report["micro avg"]["recall"] - ours.micro.recall) < 1e-12


def test_entity_counts_add_up_over_shards():
    rng = random.Random(7)
    truth = [random_tags(rng, 10, "BI") for _ in range(40)]
    predicted = [perturbed(rng, tags, "BI") for tags in truth]
    whole = entity_counts(truth, predicted)
    parts = [entity_counts(truth[:15], predicted[:15]), entity_counts(truth[15:], predicted[15:])]
    summed = {kind: tuple(sum(part.get(kind, (0, 0, 0))[i] for part in parts) for i in range(3)) for kind in whole}
    assert summed == whole
    assert scores_from_counts(summed) == entity_scores(truth, predicted)


# ---- SQuAD ------------------------------------------------------------------------------------------------


def test_squad_normalisation_and_scores_by_hand():
    assert normalize_answer("The Cat.") == "cat"
    assert normalize_answer("  An   apple, a day!  ") == "apple day"
    assert normalize_answer("Theatre and ANother") == "theatre and another"  # articles only as whole words
    assert exact_match("The Cat.", "cat") == 1.0 and exact_match("cats", "cat") == 0.0
    assert token_f1("the Denver Broncos team", "Denver Broncos") == pytest.approx(0.8)  # p 2/3, r 1
    assert token_f1("x b b c", "b b b d") == pytest.approx(0.5)  # shared {b, b}: p 2/4, r 2/4
    assert token_f1("a b b c", "b b b d") == pytest.approx(4 / 7)  # "a" is an article: p 2/3, r 2/4
    assert token_f1("the", "a") == 0.0 and exact_match("the", "a") == 1.0  # both normalise to ""
    scores = squad_scores({"q1": "Denver Broncos", "q2": "the Denver Broncos team", "q4": "ignored"},
                          {"q1": ["Broncos", "denver broncos."], "q2": ["Denver Broncos"], "q3": ["Panthers"]})
    assert (scores.total, scores.missing) == (3, 1)
    assert scores.exact_match == pytest.approx(100 / 3) and scores.f1 == pytest.approx(100 * 1.8 / 3)


def test_squad_dev_gold_against_itself_and_perturbed():
    require(SQUAD_DEV)
    gold = read_squad(SQUAD_DEV).gold_answers()
    first = {question: answers[0] for question, answers in gold.items()}
    perfect = squad_scores(first, gold)
    assert (perfect.exact_match, perfect.f1, perfect.total, perfect.missing) == (100.0, 100.0, 10570, 0)
    # Every 4th question unanswered (0), every 4th + 1 a word no answer has (0), the rest exact (100).
    ids = list(gold)
    perturbed_predictions = {}
    for index, question in enumerate(ids):
        if index % 4 == 1:
            perturbed_predictions[question] = "zzyzx"
        elif index % 4 != 0:
            perturbed_predictions[question] = f"The {first[question]}."  # an article and punctuation: ignored
    scores = squad_scores(perturbed_predictions, gold)
    exact = sum(1 for index in range(len(ids)) if index % 4 in (2, 3))
    assert scores.missing == len(range(0, len(ids), 4)) == 2643
    assert scores.exact_match == pytest.approx(100 * exact / 10570, abs=1e-9) == pytest.approx(50.0, abs=0.01)
    assert scores.f1 == pytest.approx(scores.exact_match, abs=1e-9)
