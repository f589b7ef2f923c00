"""Token-classification sentences from a CoNLL file: one token per line, its tag in the LAST column (so
CoNLL-2003's ``token POS chunk NER`` lines read as well as WNUT-17's ``token<TAB>tag``), a blank or
whitespace-only line between sentences, ``-DOCSTART-`` lines skipped. Columns are split on tabs when the
line has one, else on spaces.

Tag names come from the data (``O`` first, then the rest sorted) or from the caller, whose order then
fixes the tag ids.

The same sentences read from records (``read_tagged_records``: JSONL, TSV/CSV, Parquet, a datasets folder)
have a list of words and a list of tags per record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tformer.data.files import DataFileError, Skipped, read_data_text
from tformer.data.records import RecordFile, class_name, field_value, list_value
from tformer.errors import listed, quoted

DOCUMENT_START = "-DOCSTART-"
TOKENS_COLUMN, TAGS_COLUMN = "tokens", "ner_tags"  # Hugging Face's conll2003 / wnut_17 column names


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
        tags = found_tag_names(sentences)
    return ConllData(str(path), sentences, tags, skipped)


def found_tag_names(sentences: Sequence[TaggedSentence]) -> tuple[str, ...]:
    """The tags the sentences use: ``O`` first, then the rest sorted."""
    found = {tag for sentence in sentences for tag in sentence.tags}
    return (("O",) if "O" in found else ()) + tuple(sorted(found - {"O"}))


def read_tagged_records(path: str | Path, *, format: str | None = None, tokens_column: str = TOKENS_COLUMN,
                        tags_column: str = TAGS_COLUMN, columns: Sequence[str] | None = None,
                        tags: Sequence[str] | None = None, skip_bad: bool = False,
                        tags_from: str = "the declared tags") -> ConllData:
    """Tagged sentences from records (JSONL, TSV/CSV, Parquet, a datasets folder; ``tformer.data.records``):
    one sentence a record, its words a list in ``tokens_column`` and their tags a list as long in
    ``tags_column`` (Hugging Face's conll2003 names: ``tokens``, ``ner_tags``); a TSV/CSV cell holds the items
    separated by spaces. An integer tag is a class id, named by the file's ClassLabel names, else by
    ``tags``. A sentence without words, or that is only ``-DOCSTART-``, is no sentence, as in a CoNLL file.
    Tag names: ``tags`` when given (``tags_from`` says where they came from), else the file's ClassLabel
    names, else those found (``O`` first)."""
    if tags is not None:
        tags = tuple(tags)
        if len(set(tags)) != len(tags) or not tags:
            raise DataFileError(f"tags={list(tags)} must be distinct names, at least one")
    records = RecordFile.open(path, format, columns=columns)
    records.require(tokens_column, "tokens_column")
    records.require(tags_column, "tags_column")
    class_names = records.class_names(tags_column)
    id_names = class_names or tags
    declared = set(tags) if tags is not None else None
    skipped = Skipped()
    sentences: list[TaggedSentence] = []
    for position, where, record in records.readable([tokens_column, tags_column], skipped, skip_bad):
        try:
            sentence = _tagged_record(record, where, tokens_column, tags_column, id_names, position)
        except DataFileError as error:
            skipped.handle(str(error), skip_bad)
            continue
        if sentence is None:
            continue
        undeclared = next((tag for tag in sentence.tags if declared is not None and tag not in declared), None)
        if undeclared is not None:
            skipped.handle(f"{where}: tag {quoted(undeclared)} is not one of {tags_from}: {listed(tags)}", skip_bad)
            continue
        sentences.append(sentence)
    if not sentences:
        raise DataFileError(f"{path}: no sentences" + (f" ({skipped.summary()})" if skipped else ""))
    if tags is None:
        tags = class_names or found_tag_names(sentences)
    return ConllData(str(path), sentences, tags, skipped)


def _tagged_record(record: dict, where: str, tokens_column: str, tags_column: str, id_names, position: int):
    """The sentence of one record (None: an empty one, or a -DOCSTART- line's); a DataFileError naming it."""
    words = list_value(field_value(record, tokens_column, "tokens_column", where), where, tokens_column)
    tag_values = list_value(field_value(record, tags_column, "tags_column", where), where, tags_column)
    if len(words) != len(tag_values):
        raise DataFileError(f"{where}: {len(words)} words ({tokens_column}) but {len(tag_values)} tags ({tags_column})")
    if not words or words == [DOCUMENT_START]:
        return None
    tokens = []
    for word in words:
        if not isinstance(word, str) or not word.strip():
            raise DataFileError(f"{where}: word {word!r} of {tokens_column} is not a non-empty string")
        tokens.append(word.strip())
    if id_names is None and any(isinstance(tag, int) and not isinstance(tag, bool) for tag in tag_values):
        raise DataFileError(f"{where}: integer tags need tag names (the file declares none): declare them "
                            "([model] label_names, in id order)")
    try:
        names = tuple(class_name(tag, id_names, "tag") for tag in tag_values)
    except DataFileError as error:
        raise DataFileError(f"{where}: {error}") from None
    return TaggedSentence(tuple(tokens), names, position)
