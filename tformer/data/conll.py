"""Token-classification sentences from a CoNLL file: one token per line, its tag in the LAST column (so
CoNLL-2003's ``token POS chunk NER`` lines read as well as WNUT-17's ``token<TAB>tag``), a blank or
whitespace-only line between sentences, ``-DOCSTART-`` lines skipped. Columns are split on tabs when the
line has one, else on spaces.

Tag names come from the data (``O`` first, then the rest sorted) or from the caller, whose order then
fixes the tag ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tformer.data.files import DataFileError, Skipped, read_data_text
from tformer.errors import listed, quoted

DOCUMENT_START = "-DOCSTART-"


@dataclass(frozen=True)
class TaggedSentence:
    """One sentence: its tokens, their tags, and the file line of its first token."""

    tokens: tuple[str, ...]
    tags: tuple[str, ...]
    line: int


@dataclass
class ConllData:
    """The sentences of one file, the tag names (index = tag id) and the bad sentences left out."""

    path: str
    sentences: list[TaggedSentence]
    tag_names: tuple[str, ...]
    skipped: Skipped = field(default_factory=Skipped)

    def __len__(self) -> int:
        return len(self.sentences)

    @property
    def num_tokens(self) -> int:
        return sum(len(sentence.tokens) for sentence in self.sentences)

    def tag_ids(self) -> list[list[int]]:
        """Each sentence's tags as indices into ``tag_names``."""
        index = {name: number for number, name in enumerate(self.tag_names)}
        return [[index[tag] for tag in sentence.tags] for sentence in self.sentences]


def read_conll(path: str | Path, *, tags: Sequence[str] | None = None, skip_bad: bool = False,
               tags_from: str = "the declared tags") -> ConllData:
    """Read ``path`` (plain or .gz). ``tags`` declares the tag names (a tag outside them is an error;
    ``tags_from`` says where they came from, e.g. the training file).
    A malformed line (a token without a tag) or an undeclared tag raises a DataFileError naming the file
    and line, or with ``skip_bad`` leaves its whole sentence out, counted in ``skipped``."""
    if tags is not None:
        tags = tuple(tags)
        if len(set(tags)) != len(tags) or not tags:
            raise DataFileError(f"tags={list(tags)} must be distinct names, at least one")
    declared = set(tags) if tags is not None else None
    skipped = Skipped()
    sentences: list[TaggedSentence] = []
    tokens: list[str] = []
    sentence_tags: list[str] = []
    first_line = 0
    problem = None  # the first bad line of the current sentence

    def close_sentence() -> None:
        nonlocal problem
        if problem is not None:
            skipped.handle(problem, skip_bad)
        elif tokens:
            sentences.append(TaggedSentence(tuple(tokens), tuple(sentence_tags), first_line))
        tokens.clear()
        sentence_tags.clear()
        problem = None

    for number, line in enumerate(read_data_text(path).split("\n"), 1):
        if not line.strip():
            close_sentence()
            continue
        fields = line.split("\t") if "\t" in line else line.split(" ")
        fields = [part.strip() for part in fields if part.strip()]
        if fields[0] == DOCUMENT_START:
            close_sentence()
            continue
        if not tokens and problem is None:
            first_line = number
        if problem is not None:
            continue
        if len(fields) < 2:
            problem = f"{path}:{number}: expected a token and its tag, got {quoted(line.strip())}"
        elif declared is not None and fields[-1] not in declared:
            problem = f"{path}:{number}: tag {quoted(fields[-1])} is not one of {tags_from}: {listed(tags)}"
        else:
            tokens.append(fields[0])
            sentence_tags.append(fields[-1])
    close_sentence()
    if not sentences:
        raise DataFileError(f"{path}: no sentences" + (f" ({skipped.summary()})" if skipped else ""))
    if tags is None:
        found = {tag for sentence in sentences for tag in sentence.tags}
        tags = (("O",) if "O" in found else ()) + tuple(sorted(found - {"O"}))
    return ConllData(str(path), sentences, tags, skipped)
