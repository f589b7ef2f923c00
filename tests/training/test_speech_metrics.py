"""WER and CER (tformer.evaluation.speech) on hand-counted cases: the edits of minimal alignments, the
most-matches tie-break, sums that add over batches, empty sides, the normaliser's rule, and the readable
(Python) and fast (numpy) alignments agreeing. The comparison with jiwer is in test_speech_metrics_jiwer.py."""

import random

import pytest

from tformer.errors import TformerError
from tformer.evaluation import speech
from tformer.evaluation.speech import (
    EditCounts,
    character_error_rate,
    edit_counts,
    error_counts,
    normalise_transcript,
    transcription_scores,
    word_error_rate,
)


@pytest.mark.parametrize(("reference", "hypothesis", "counts"), [
    ("a b c", "a b c", EditCounts(0, 0, 0, 3)),
    ("a b c", "a x c", EditCounts(1, 0, 0, 3)),
    ("a b c", "a c", EditCounts(0, 1, 0, 3)),
    ("a b c", "a b c d", EditCounts(0, 0, 1, 3)),
    ("a b", "b c", EditCounts(0, 1, 1, 2)),  # two substitutions cost as much: the alignment matching b is kept
    ("a b c", "", EditCounts(0, 3, 0, 3)),
    ("", "a b", EditCounts(0, 0, 2, 0)),
    ("", "", EditCounts(0, 0, 0, 0)),
    ("the cat sat", "cat sat on the", EditCounts(0, 1, 2, 3)),
])
def test_word_edits_by_hand(reference, hypothesis, counts):
    assert error_counts(hypothesis, reference, "word") == counts


def test_rates_and_character_units():
    assert word_error_rate("a x c d", "a b c") == pytest.approx(2 / 3)
    # characters: the ends stripped, inner spaces count (and are not collapsed)
    assert error_counts("  ab  c ", "ab c", "character") == EditCounts(0, 0, 1, 4)
    assert character_error_rate("kitten", "sitting") == pytest.approx(3 / 7)
    assert character_error_rate("sitting", "kitten") == pytest.approx(3 / 6)  # not symmetric: by the reference


def test_corpus_rate_sums_edits_not_rates():
    hypotheses, references = ["a", "a b c d e f g h i x"], ["b", "a b c d e f g h i j"]
    # sentence rates 1.0 and 0.1 average 0.55; the corpus rate is 2 edits in 11 words
    assert word_error_rate(hypotheses, references) == pytest.approx(2 / 11)
    halves = error_counts(hypotheses[:1], references[:1]) + error_counts(hypotheses[1:], references[1:])
    assert halves == error_counts(hypotheses, references)
    assert EditCounts.from_statistics([float(x) for x in halves.statistics()]) == halves


def test_empty_references():
    # an empty reference inside a corpus: its hypothesis's words are insertions, its length nothing
    assert word_error_rate(["a b", "c"], ["a b", ""]) == pytest.approx(1 / 2)
    assert word_error_rate("", "") == 0.0
    with pytest.raises(TformerError, match="references are empty but the hypotheses add 2 units"):
        word_error_rate("a b", "")
    assert word_error_rate("", "a b") == 1.0  # an empty hypothesis deletes every word


def test_misaligned_or_mixed_inputs_are_refused():
    with pytest.raises(TformerError, match="2 hypotheses but 1 references"):
        word_error_rate(["a", "b"], ["a"])
    with pytest.raises(TformerError, match="not a string and a list"):
        word_error_rate("a", ["a"])
    with pytest.raises(TformerError, match="unit='phone'"):
        error_counts("a", "a", "phone")
    with pytest.raises(TformerError, match="no transcripts"):
        transcription_scores([], [])


def test_transcription_scores():
    scores = transcription_scores(["Three one, four!", "nine"], ["three one four", "five nine"], normalise=True)
    assert scores.wer == pytest.approx(1 / 5)
    assert scores.words == EditCounts(0, 1, 0, 5)
    assert scores.cer == pytest.approx(5 / 23)  # "five " deleted from "five nine"
    assert scores.as_dict()["reference_words"] == 5
    assert transcription_scores(["Three one"], ["three one"]).wer == pytest.approx(1 / 2)  # case counts unnormalised


@pytest.mark.parametrize(("text", "normalised"), [
    ("Hello,   World!", "hello world"),
    ("Don't stop — it's 5 o’clock.", "don't stop it's 5 o'clock"),
    ("'quoted' e-mail 3.5 $5 50%", "quoted e mail 3 5 5 50"),
    ("ﬁne Ｆｕｌｌ café caf\u00e9", "fine full café café"),
    ("cafe\u0301", "café"),  # NFKC composes the accent
    ("[noise] (laughs)\tyes\n", "noise laughs yes"),
    ("  ", ""),
])
def test_normalise_transcript(text, normalised):
    assert normalise_transcript(text) == normalised


def test_python_and_numpy_alignments_agree():
    rng = random.Random(0)
    for _ in range(200):
        reference = [rng.choice("abcd ") for _ in range(rng.randrange(1, 50))]
        hypothesis = [rng.choice("abcd ") for _ in range(rng.randrange(1, 50))]
        weight = min(len(reference), len(hypothesis)) + 1
        assert speech._alignment_python(reference, hypothesis, weight) == \
            speech._alignment_numpy(reference, hypothesis, weight)
    long_reference, long_hypothesis = "ab" * 40, "ba" * 41  # 80 x 82 cells: the numpy path
    counts = edit_counts(long_reference, long_hypothesis)
    assert counts == EditCounts(0, 0, 2, 80)  # "ba" * 41 = "b" + "ab" * 40 + "a"
