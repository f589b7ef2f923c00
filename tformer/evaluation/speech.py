"""Speech recognition scores: word and character error rates (WER, CER) as sums that add up over batches and
processes, the way ``tformer.evaluation.translation`` sums BLEU.

An error rate is edits / reference length, where edits = substitutions + deletions + insertions of a
minimal Levenshtein alignment of the hypothesis to the reference, in words (WER) or characters (CER). Over a
corpus the edits and the lengths are summed first (``EditCounts`` add with ``+``), so the corpus WER is
total edits / total reference words, as ``jiwer.wer(list, list)`` computes it, not a mean of sentence rates.

Units, and where they match jiwer 4's defaults:

* **words**: ``text.split()``, i.e. split on any run of whitespace. jiwer's default transform collapses runs
  of two or more whitespace characters to a space, strips, then splits on " " alone, so a single tab or
  no-break space joins two words there (``"a\\tb"`` is one word to jiwer, two here). The two agree whenever
  words are separated by spaces, and always on ``normalise_transcript``'s output.
* **characters**: the code points of ``text.strip()``, spaces inside included and not collapsed (what
  jiwer's ``cer`` default does: strip, then every character).
* **an empty reference**: a pair whose reference is empty adds its hypothesis's length as insertions and
  nothing to the reference length, so it counts inside a corpus that has other words. When the whole
  reference length is 0 the rate is 0.0 if there are no edits (jiwer: 0) and otherwise refused with a
  ``TformerError``: jiwer returns the number of insertions there, a count rather than a rate.

Argument order follows this package (hypotheses first, as ``bleu_statistics``); jiwer's is reference first.

Among the minimal alignments (same number of edits) the one with the most matches is counted, which fixes
the split into substitutions, deletions and insertions (several alignments can share a minimum; jiwer's
rapidfuzz picks one of them by its own order, so its split can differ while its total is the same).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, fields

import numpy as np

from tformer.errors import TformerError

UNITS = ("word", "character")
# Past this many cells (reference length x hypothesis length) the alignment runs a row at a time in numpy
# (the same recurrence, ``_alignment_numpy``); below it, plain Python is faster than numpy's call overhead
# (measured: even at 30 x 30 items, 0.3 ms either way; 3,000 x 3,000 characters: 4.1 s in Python, 0.14 s in numpy).
NUMPY_CELLS = 1024
EDIT_STATISTICS = 4  # substitutions, deletions, insertions, reference length: the sums of one unit


@dataclass(frozen=True)
class EditCounts:
    """The edits of minimal alignments of hypotheses to references and the references' length, in one unit
    (words or characters). Counts of different pairs, batches or processes add with ``+``."""

    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0
    reference_length: int = 0

    @property
    def edits(self) -> int:
        """Substitutions + deletions + insertions: the Levenshtein distance, summed."""
        return self.substitutions + self.deletions + self.insertions

    @property
    def hits(self) -> int:
        """Reference units the hypotheses got right."""
        return self.reference_length - self.substitutions - self.deletions

    @property
    def rate(self) -> float:
        """Edits / reference length (can pass 1.0 when the hypotheses insert a lot); 0.0 for no reference and
        no edits, a TformerError for edits against no reference (see the module's docstring)."""
        if self.reference_length == 0:
            if self.edits == 0:
                return 0.0
            raise TformerError(f"the references are empty but the hypotheses add {self.insertions:,} units: an error "
                               "rate (edits / reference length) is undefined; leave out empty references")
        return self.edits / self.reference_length

    def __add__(self, other: EditCounts) -> EditCounts:
        if not isinstance(other, EditCounts):
            return NotImplemented
        return EditCounts(*(getattr(self, name.name) + getattr(other, name.name) for name in fields(self)))

    def statistics(self) -> list[int]:
        """The counts as a list (``EDIT_STATISTICS`` of them), for a Task's ``eval_sums``."""
        return [self.substitutions, self.deletions, self.insertions, self.reference_length]

    @classmethod
    def from_statistics(cls, statistics: Sequence[float]) -> EditCounts:
        """Counts from summed ``statistics()`` (floats after an all-reduce are rounded back to integers)."""
        if len(statistics) != EDIT_STATISTICS:
            raise TformerError(f"{len(statistics)} edit statistics; expected {EDIT_STATISTICS} (substitutions, "
                               "deletions, insertions, reference length)")
        return cls(*(round(value) for value in statistics))


@dataclass(frozen=True)
class TranscriptionScores:
    """Corpus WER and CER (fractions: 0.25 = 25%) of ``utterances`` pairs, with their word and character counts."""

    wer: float
    cer: float
    words: EditCounts
    characters: EditCounts
    utterances: int

    def as_dict(self) -> dict[str, object]:
        return {"wer": self.wer, "cer": self.cer, "utterances": self.utterances,
                "word_edits": self.words.edits, "reference_words": self.words.reference_length,
                "substitutions": self.words.substitutions, "deletions": self.words.deletions,
                "insertions": self.words.insertions, "character_edits": self.characters.edits,
                "reference_characters": self.characters.reference_length}


# ---- normalising -----------------------------------------------------------------------------------------

_APOSTROPHES = "'\u2019"  # ' and the typographic right single quotation mark
_WHITESPACE = re.compile(r"\s+")


def normalise_transcript(text: str) -> str:
    """``text`` as a simple ASR normaliser compares it, so that case, punctuation and spacing are no errors:

    1. Unicode NFKC (composed accents, full-width and ligature forms as their plain letters);
    2. lower case (``str.lower``);
    3. every punctuation or symbol character (Unicode categories P* and S*) becomes a space, except an
       apostrophe (' or ’) between two letters or digits, kept as ' so contractions stay one word
       ("don't", "o'clock"); so "e-mail" is two words, "3.5" is "3 5" and "$5" is "5";
    4. runs of whitespace become one space, and the ends are stripped.

    No spelling is changed (numbers stay digits, "colour" stays "colour") and bracketed words such as
    "[noise]" keep their word ("noise"); Whisper's English normaliser does both, and more, for its tables."""
    text = unicodedata.normalize("NFKC", text).lower()
    kept = []
    for index, character in enumerate(text):
        category = unicodedata.category(character)
        if category[0] not in "PS":
            kept.append(character)
        elif character in _APOSTROPHES and _word_character(text, index - 1) and _word_character(text, index + 1):
            kept.append("'")
        else:
            kept.append(" ")
    return _WHITESPACE.sub(" ", "".join(kept)).strip()


def _word_character(text: str, index: int) -> bool:
    return 0 <= index < len(text) and text[index].isalnum()


# ---- alignment -------------------------------------------------------------------------------------------


def edit_counts(reference: Sequence[Hashable], hypothesis: Sequence[Hashable]) -> EditCounts:
    """The edits of a minimal alignment of ``hypothesis`` to ``reference`` (two sequences of words, characters
    or any comparable items), the one with the most matches among them, and the reference's length."""
    n, m = len(reference), len(hypothesis)
    if n == 0 or m == 0:
        return EditCounts(deletions=n, insertions=m, reference_length=n)
    # Lexicographic costs (fewest edits, then most matches) as one integer: edits * weight - matches, with
    # weight above any number of matches, so the sums of a path order as the pairs do.
    weight = min(n, m) + 1
    aligned = _alignment_numpy if n * m > NUMPY_CELLS else _alignment_python
    cost = aligned(reference, hypothesis, weight)
    edits = -(-cost // weight)  # ceil: cost = edits * weight - matches, 0 <= matches < weight
    hits = edits * weight - cost
    substitutions = n + m - edits - 2 * hits  # from n = H + S + D, m = H + S + I, edits = S + D + I
    return EditCounts(substitutions, n - hits - substitutions, m - hits - substitutions, n)


def _alignment_python(reference: Sequence[Hashable], hypothesis: Sequence[Hashable], weight: int) -> int:
    """The cost of the best alignment: the readable dynamic programme, a row of the table per reference item.
    ``row[j]``: the cost of aligning the reference so far with ``hypothesis[:j]``."""
    row = [j * weight for j in range(len(hypothesis) + 1)]  # (m + 1,): the empty reference, j insertions
    for i, wanted in enumerate(reference, 1):
        previous, row = row, [i * weight]  # i deletions against the empty hypothesis
        for j, found in enumerate(hypothesis, 1):
            diagonal = previous[j - 1] + (-1 if found == wanted else weight)  # a match or a substitution
            row.append(min(diagonal, previous[j] + weight, row[j - 1] + weight))  # ... a deletion, an insertion
    return row[-1]


def _alignment_numpy(reference: Sequence[Hashable], hypothesis: Sequence[Hashable], weight: int) -> int:
    """``_alignment_python``'s cost with each row computed by numpy: matches, substitutions and deletions are
    elementwise over the previous row; insertions chain along the row, row[j] = min over k <= j of
    (t[k] + (j - k) * weight), which is j * weight + the running minimum of t[k] - k * weight."""
    ids: dict[Hashable, int] = {}
    reference_ids = [ids.setdefault(item, len(ids)) for item in reference]
    hypothesis_ids = np.array([ids.setdefault(item, len(ids)) for item in hypothesis], dtype=np.int64)  # (m,)
    ramp = np.arange(len(hypothesis) + 1, dtype=np.int64) * weight  # (m + 1,)
    row = ramp.copy()
    for i, wanted in enumerate(reference_ids, 1):
        step = np.where(hypothesis_ids == wanted, -1, weight)  # (m,): match or substitution
        candidate = np.empty_like(row)
        candidate[0] = i * weight
        candidate[1:] = np.minimum(row[:-1] + step, row[1:] + weight)  # diagonal, or a deletion from above
        row = ramp + np.minimum.accumulate(candidate - ramp)
    return int(row[-1])


# ---- words, characters and corpora -----------------------------------------------------------------------


def words(text: str) -> list[str]:
    """The words of a transcript: split on whitespace."""
    return text.split()


def characters(text: str) -> list[str]:
    """The characters of a transcript: its code points, the ends stripped, inner spaces kept."""
    return list(text.strip())


_SPLITTERS = {"word": words, "character": characters}


def error_counts(hypotheses: str | Sequence[str], references: str | Sequence[str], unit: str = "word",
                 *, normalise: bool = False) -> EditCounts:
    """The summed ``EditCounts`` of hypotheses against one reference each (or of one pair of strings), in
    ``unit`` ("word" or "character"), after ``normalise_transcript`` when ``normalise``."""
    if unit not in _SPLITTERS:
        raise TformerError(f"unit={unit!r} is not one of {', '.join(UNITS)}")
    hypotheses, references = _pairs(hypotheses, references)
    split = _SPLITTERS[unit]
    total = EditCounts()
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        if normalise:
            hypothesis, reference = normalise_transcript(hypothesis), normalise_transcript(reference)
        total = total + edit_counts(split(reference), split(hypothesis))
    return total


def word_error_rate(hypotheses: str | Sequence[str], references: str | Sequence[str], *,
                    normalise: bool = False) -> float:
    """Corpus WER: total word edits / total reference words (``jiwer.wer(references, hypotheses)``)."""
    return error_counts(hypotheses, references, "word", normalise=normalise).rate


def character_error_rate(hypotheses: str | Sequence[str], references: str | Sequence[str], *,
                         normalise: bool = False) -> float:
    """Corpus CER: total character edits / total reference characters (``jiwer.cer(references, hypotheses)``)."""
    return error_counts(hypotheses, references, "character", normalise=normalise).rate


def transcription_scores(hypotheses: Sequence[str], references: Sequence[str], *,
                         normalise: bool = False) -> TranscriptionScores:
    """Corpus WER and CER of ``hypotheses`` against one reference each, with their counts."""
    hypotheses, references = _pairs(hypotheses, references)
    if not hypotheses:
        raise TformerError("no transcripts to score")
    word_counts = error_counts(hypotheses, references, "word", normalise=normalise)
    character_counts = error_counts(hypotheses, references, "character", normalise=normalise)
    return TranscriptionScores(word_counts.rate, character_counts.rate, word_counts, character_counts,
                               len(hypotheses))


def _pairs(hypotheses: str | Sequence[str], references: str | Sequence[str]) -> tuple[list[str], list[str]]:
    if isinstance(hypotheses, str) != isinstance(references, str):
        raise TformerError("give a hypothesis and a reference, or a list of each (not a string and a list)")
    if isinstance(hypotheses, str):
        return [hypotheses], [references]
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise TformerError(f"{len(hypotheses):,} hypotheses but {len(references):,} references; they must align")
    for what, texts in (("hypothesis", hypotheses), ("reference", references)):
        for number, text in enumerate(texts):
            if not isinstance(text, str):
                raise TformerError(f"{what} {number} is a {type(text).__name__}, not a string")
    return hypotheses, references
