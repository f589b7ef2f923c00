"""WER and CER equal to jiwer's (the reference library, jiwer 4): sentence and corpus rates (total edits /
total reference length over a list of pairs) on hand cases and on random text (hypothesis, derandomized),
with empty hypotheses and empty references inside a corpus. jiwer's own split of the edits into
substitutions, deletions and insertions is one of several minimal ones; ours keeps the most matches, so the
totals are equal and our hits are never fewer."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tformer.errors import TformerError
from tformer.evaluation.speech import character_error_rate, error_counts, normalise_transcript, word_error_rate

jiwer = pytest.importorskip("jiwer")

pytestmark = pytest.mark.slow  # compares with jiwer (a reference library)

PROPERTY = settings(max_examples=200, deadline=None, derandomize=True)

# Words from a small vocabulary (so that matches happen), separated by runs of spaces (jiwer's default
# transform splits on " "; see the module docstring of tformer.evaluation.speech for other whitespace).
WORDS = ["a", "b", "the", "cat", "three", "one", "ab", "é", "don't"]
sentences = st.lists(st.sampled_from(WORDS), max_size=12).flatmap(
    lambda words: st.lists(st.sampled_from([" ", "  ", "   "]), min_size=len(words) + 1, max_size=len(words) + 1)
    .map(lambda spaces: spaces[0] + "".join(word + space for word, space in zip(words, spaces[1:], strict=True))))
# Any text at all, for the normalised comparison: punctuation, case, tabs, newlines, Unicode.
texts = st.lists(st.sampled_from(list("abAB .,'-!?\t\n\u00a0é’") + ["the", "cat"]), max_size=20).map("".join)


def jiwer_totals(output) -> tuple[int, int, int]:
    """(edits, reference length, hits) of a jiwer WordOutput / CharacterOutput."""
    edits = output.substitutions + output.deletions + output.insertions
    return edits, output.hits + output.substitutions + output.deletions, output.hits


def check_equal(hypotheses: list[str], references: list[str]) -> None:
    for unit, process, rate, reference_rate in (
            ("word", jiwer.process_words, word_error_rate, jiwer.wer),
            ("character", jiwer.process_characters, character_error_rate, jiwer.cer)):
        ours = error_counts(hypotheses, references, unit)
        edits, length, hits = jiwer_totals(process(references, hypotheses))
        assert (ours.edits, ours.reference_length) == (edits, length), unit
        assert ours.hits >= hits  # the most matches among minimal alignments
        assert ours.substitutions + ours.deletions + ours.hits == ours.reference_length
        if length:
            assert rate(hypotheses, references) == pytest.approx(reference_rate(references, hypotheses), abs=1e-12)
        elif edits:
            with pytest.raises(TformerError, match="references are empty"):
                rate(hypotheses, references)
        else:
            assert rate(hypotheses, references) == reference_rate(references, hypotheses) == 0.0


@pytest.mark.parametrize(("reference", "hypothesis"), [
    ("the cat sat on the mat", "the cat sat on mat"),
    ("the cat sat on the mat", "a cat sat on the mat and"),
    ("three one four one five", "three four one five nine"),
    ("a b", "b c"),
    ("hello world", ""),
    ("  spaced   out  ", " spaced out"),
    ("", ""),
    ("", "inserted words"),
])
def test_equal_to_jiwer_by_hand(reference, hypothesis):
    check_equal([hypothesis], [reference])


def test_corpus_equal_to_jiwer():
    references = ["three one four", "one five nine two six", "five", "", "eight nine seven nine"]
    hypotheses = ["three one for", "one five nine six", "", "seven", "eight nine seven nine three"]
    check_equal(hypotheses, references)
    assert word_error_rate(hypotheses, references) == pytest.approx(jiwer.wer(references, hypotheses))


@PROPERTY
@given(st.lists(st.tuples(sentences, sentences), min_size=1, max_size=5))
def test_random_sentences_equal_to_jiwer(pairs):
    check_equal([hypothesis for hypothesis, _ in pairs], [reference for _, reference in pairs])


@PROPERTY
@given(st.lists(st.tuples(texts, texts), min_size=1, max_size=4))
def test_random_normalised_text_equal_to_jiwer(pairs):
    """Any text after ``normalise_transcript`` (single spaces only): equal for both units."""
    hypotheses = [normalise_transcript(hypothesis) for hypothesis, _ in pairs]
    references = [normalise_transcript(reference) for _, reference in pairs]
    check_equal(hypotheses, references)
    raw_h, raw_r = [h for h, _ in pairs], [r for _, r in pairs]
    assert error_counts(raw_h, raw_r, normalise=True) == error_counts(hypotheses, references)


def test_where_jiwer_splits_words_differently():
    """A lone tab or no-break space separates words here, not in jiwer's default transform."""
    assert error_counts("a\tb", "a b").edits == 0
    assert jiwer.wer("a b", "a\tb") == 1.0  # jiwer: one word "a\tb" against two (a substitution, a deletion)
