"""Entity-level precision, recall and F1 for tag sequences, equal to ``seqeval``'s default mode (the
conlleval chunking rules), per entity type and micro-averaged.

Tags are ``O`` or ``P-type`` with P one of B, I (IOB2/BIO), E, S (IOBES). A chunk ends before a tag when
the previous tag is E or S, when a B or I is followed by B, S or O, or when the type changes; a chunk
starts at B or S, at an I or E that follows O, E or S, and wherever the type changes. So an I- without
a preceding B- starts an entity, and B-PER I-LOC is two entities. An entity counts as found when a
predicted one has the same type, start and end in the same sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tformer.errors import TformerError, quoted
from tformer.evaluation.scores import Scores, precision_recall_f1

PREFIXES = ("B", "I", "E", "S")


class TagError(TformerError):
    """A tag that is neither ``O`` nor ``P-type`` (P in B, I, E, S), or sequences of unequal lengths."""


def entity_spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The entities of one tag sequence as (type, start, end), ``end`` one past the last token."""
    spans = []
    previous_prefix, previous_type = "O", ""
    start = 0
    for position, tag in enumerate([*tags, "O"]):
        prefix, kind = _split(tag)
        if previous_prefix != "O" and _ends(previous_prefix, prefix, previous_type, kind):
            spans.append((previous_type, start, position))
        if prefix != "O" and _starts(previous_prefix, prefix, previous_type, kind):
            start = position
        previous_prefix, previous_type = prefix, kind
    return spans


def _split(tag: str) -> tuple[str, str]:
    if tag == "O":
        return "O", ""
    prefix, _, kind = tag.partition("-")
    if prefix not in PREFIXES or not kind:
        raise TagError(f"tag {quoted(tag)} is not O or B-/I-/E-/S- followed by an entity type")
    return prefix, kind


def _ends(previous: str, current: str, previous_type: str, current_type: str) -> bool:
    """Whether the chunk that holds the previous (non-O) tag ends before the current one."""
    return (previous in ("E", "S") or (previous in ("B", "I") and current in ("B", "S", "O"))
            or previous_type != current_type)


def _starts(previous: str, current: str, previous_type: str, current_type: str) -> bool:
    """Whether a chunk starts at the current (non-O) tag."""
    return (current in ("B", "S") or (current in ("I", "E") and previous in ("O", "E", "S"))
            or previous_type != current_type)


def entity_counts(true_sequences: Sequence[Sequence[str]],
                  predicted_sequences: Sequence[Sequence[str]]) -> dict[str, tuple[int, int, int]]:
    """Per entity type: (correct, predicted, true) entity counts, summed over the sentences. Counts of
    several shards add up to the counts of the whole."""
    if len(true_sequences) != len(predicted_sequences):
        raise TagError(f"{len(true_sequences)} true sequences but {len(predicted_sequences)} predicted")
    counts: dict[str, list[int]] = {}
    for number, (true_tags, predicted_tags) in enumerate(zip(true_sequences, predicted_sequences, strict=True)):
        if len(true_tags) != len(predicted_tags):
            raise TagError(f"sequence {number}: {len(true_tags)} true tags but {len(predicted_tags)} predicted")
        true_spans = set(entity_spans(true_tags))
        predicted_spans = set(entity_spans(predicted_tags))
        for kind, *_ in true_spans:
            counts.setdefault(kind, [0, 0, 0])[2] += 1
        for span in predicted_spans:
            entry = counts.setdefault(span[0], [0, 0, 0])
            entry[1] += 1
            entry[0] += span in true_spans
    return {kind: tuple(entry) for kind, entry in counts.items()}


@dataclass(frozen=True)
class EntityScores:
    """Scores per entity type (sorted by name) and their micro average (over all entities)."""

    per_type: dict[str, Scores]
    micro: Scores

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """Flat figures for a log: micro P/R/F1 and each type's F1."""
        figures = {f"{prefix}precision": self.micro.precision, f"{prefix}recall": self.micro.recall,
                   f"{prefix}f1": self.micro.f1}
        figures.update({f"{prefix}f1_{kind}": scores.f1 for kind, scores in self.per_type.items()})
        return figures


def scores_from_counts(counts: dict[str, tuple[int, int, int]]) -> EntityScores:
    """EntityScores of (correct, predicted, true) counts per type."""
    per_type = {kind: precision_recall_f1(*counts[kind]) for kind in sorted(counts)}
    totals = [sum(entry[index] for entry in counts.values()) for index in range(3)]
    return EntityScores(per_type, precision_recall_f1(*totals))


def entity_scores(true_sequences: Sequence[Sequence[str]],
                  predicted_sequences: Sequence[Sequence[str]]) -> EntityScores:
    """Entity-level scores of predicted tag sequences against the true ones (seqeval's default mode)."""
    return scores_from_counts(entity_counts(true_sequences, predicted_sequences))
