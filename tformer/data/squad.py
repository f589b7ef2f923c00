"""Extractive question answering from a SQuAD v1.1 JSON file (plain or .gz): each question with its
context, its gold answers (text and character start) and the article it belongs to, so a caller can split
by article (the project's "SQuAD dev-split": the first 38 articles train, the last 10 evaluate).

Every answer is checked against its context: ``context[answer_start:answer_start + len(text)]`` must be
the answer's text. SQuAD v2's unanswerable questions are refused (this reader is v1.1).

``read_squad_records`` reads the same questions from records (JSONL, TSV/CSV, Parquet, a datasets folder),
one question a record, as Hugging Face's squad dataset lays them out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tformer.data.files import DataFileError, Skipped, read_data_text
from tformer.data.records import RecordFile, field_value, json_cell
from tformer.errors import quoted


@dataclass(frozen=True)
class SquadAnswer:
    text: str
    start: int  # character offset of the answer in the context (SQuAD's answer_start)

    @property
    def end(self) -> int:
        """One past the answer's last character."""
        return self.start + len(self.text)


@dataclass(frozen=True)
class SquadExample:
    """One question: its id, text, context, gold answers (empty when read without answers) and its
    article's index and title."""

    id: str
    question: str
    context: str
    answers: tuple[SquadAnswer, ...]
    article: int
    title: str


@dataclass
class SquadData:
    """The questions of a file in file order, the article titles (index = ``SquadExample.article``) and
    the bad questions left out."""

    path: str
    examples: list[SquadExample]
    titles: list[str]
    skipped: Skipped = field(default_factory=Skipped)

    def __len__(self) -> int:
        return len(self.examples)

    def split_articles(self, first: int) -> tuple[SquadData, SquadData]:
        """The questions of the first ``first`` articles and those of the rest (article indices and
        titles renumbered in each part)."""
        if not 0 < first < len(self.titles):
            raise DataFileError(f"{self.path}: cannot split {len(self.titles)} articles after the first {first}")
        head = [example for example in self.examples if example.article < first]
        tail = [_renumbered(example, example.article - first) for example in self.examples if example.article >= first]
        return (SquadData(self.path, head, self.titles[:first], self.skipped),
                SquadData(self.path, tail, self.titles[first:], Skipped()))

    def gold_answers(self) -> dict[str, list[str]]:
        """Question id -> its gold answer texts, as the scorer takes them."""
        return {example.id: [answer.text for answer in example.answers] for example in self.examples}


def read_squad(path: str | Path, *, require_answers: bool = True, skip_bad: bool = False) -> SquadData:
    """Read a SQuAD v1.1 file. A missing field, a duplicate id, an unanswerable question or an answer
    whose text is not at its ``answer_start`` raises a DataFileError naming the file and the question id,
    or with ``skip_bad`` leaves the question out, counted in ``skipped``. ``require_answers=False``
    reads questions without answers (data to predict on)."""
    text = read_data_text(path)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise DataFileError(f"{path}:{error.lineno}: not valid JSON ({error.msg} at column {error.colno})") from None
    articles = document.get("data") if isinstance(document, dict) else None
    if not isinstance(articles, list):
        raise DataFileError(f"{path}: not a SQuAD file (expected an object with a \"data\" list of articles)")
    skipped = Skipped()
    examples: list[SquadExample] = []
    titles: list[str] = []
    seen: set[str] = set()
    for article_index, article in enumerate(articles):
        where = f"{path}: article {article_index}"
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise DataFileError(f"{where}: expected an object with a \"paragraphs\" list")
        title = article.get("title", "")
        titles.append(str(title))
        for paragraph_index, paragraph in enumerate(article["paragraphs"]):
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            questions = paragraph.get("qas") if isinstance(paragraph, dict) else None
            if not isinstance(context, str) or not isinstance(questions, list):
                raise DataFileError(f"{where}, paragraph {paragraph_index}: expected a \"context\" string and a "
                                    "\"qas\" list")
            for qa in questions:
                try:
                    example = _example(qa, context, article_index, str(title), require_answers)
                except DataFileError as error:
                    skipped.handle(f"{path}: {error}", skip_bad)
                    continue
                _keep_unique(example, str(path), seen, examples, skipped, skip_bad)
    return _squad_data(path, examples, titles, skipped)


def read_squad_records(path: str | Path, *, format: str | None = None, question_column: str = "question",
                       context_column: str = "context", answers_column: str = "answers",
                       columns: Sequence[str] | None = None, require_answers: bool = True,
                       skip_bad: bool = False) -> SquadData:
    """Questions from records (JSONL, TSV/CSV, Parquet, a datasets folder; ``tformer.data.records``), one a
    record, as Hugging Face's squad dataset has them: ``question``, ``context`` and ``answers``, either
    ``{"text": [...], "answer_start": [...]}`` or a list of ``{"text", "answer_start"}`` objects (in a
    TSV/CSV cell: as JSON). The id is the ``id`` column's (else the record's position), the title the
    ``title`` column's (else none); consecutive records of one title (without titles: of one context) are
    one article. Every check of ``read_squad`` applies, and its errors name the record."""
    records = RecordFile.open(path, format, columns=columns)
    records.require(question_column, "question_column")
    records.require(context_column, "context_column")
    if require_answers:
        records.require(answers_column, "answers_column")
    skipped = Skipped()
    examples: list[SquadExample] = []
    titles: list[str] = []
    seen: set[str] = set()
    article_key = None
    wanted = [question_column, context_column, answers_column, "id", "title"]
    for position, where, record in records.readable(wanted, skipped, skip_bad):
        try:
            question = field_value(record, question_column, "question_column", where)
            context = field_value(record, context_column, "context_column", where)
            if not isinstance(context, str):
                raise DataFileError(f"{where}: the context is not a string")
            answers = _record_answers(record.get(answers_column, []), where, answers_column)
            title = str(record.get("title") or "")
            key = title if "title" in record else context
            if key != article_key:
                article_key = key
                titles.append(title)
            qa = {"id": str(record.get("id", position)), "question": question, "answers": answers}
            example = _example(qa, context, len(titles) - 1, title, require_answers)
        except DataFileError as error:
            message = str(error)
            skipped.handle(message if message.startswith(str(records.path)) else f"{where}: {message}", skip_bad)
            continue
        _keep_unique(example, where, seen, examples, skipped, skip_bad)
    return _squad_data(path, examples, titles, skipped)


def _keep_unique(example: SquadExample, where: str, seen: set[str], examples: list[SquadExample], skipped: Skipped,
                 skip_bad: bool) -> None:
    """Add ``example`` unless its id came before (a bad row: refused, or left out with ``skip_bad``)."""
    if example.id in seen:
        skipped.handle(f"{where}: question {example.id}: the id appears twice", skip_bad)
        return
    seen.add(example.id)
    examples.append(example)


def _squad_data(path, examples: list[SquadExample], titles: list[str], skipped: Skipped) -> SquadData:
    if not examples:
        raise DataFileError(f"{path}: no questions" + (f" ({skipped.summary()})" if skipped else ""))
    return SquadData(str(path), examples, titles, skipped)


def _record_answers(value, where: str, column: str) -> list:
    """A record's answers as SQuAD's list of ``{"text", "answer_start"}`` objects."""
    value = json_cell(value, where, column)
    if isinstance(value, dict):
        texts, starts = value.get("text"), value.get("answer_start")
        if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
            raise DataFileError(f"{where}: {column} must hold \"text\" and \"answer_start\" lists of one length")
        return [{"text": text, "answer_start": start} for text, start in zip(texts, starts, strict=True)]
    if isinstance(value, list):
        return value
    raise DataFileError(f"{where}: {column} must be {{\"text\": [...], \"answer_start\": [...]}} or a list of "
                        "answers")


def _example(qa, context: str, article: int, title: str, require_answers: bool) -> SquadExample:
    """One checked question; a DataFileError (without the file's name) naming the question."""
    if not isinstance(qa, dict) or not isinstance(qa.get("id"), str):
        raise DataFileError(f"article {article}: a question without a string \"id\"")
    name = f"question {qa['id']}"
    question = qa.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DataFileError(f"{name}: no question text")
    if qa.get("is_impossible"):
        raise DataFileError(f"{name}: an unanswerable (SQuAD v2) question; this reader is SQuAD v1.1")
    raw_answers = qa.get("answers", [])
    if not isinstance(raw_answers, list):
        raise DataFileError(f"{name}: \"answers\" is not a list")
    if require_answers and not raw_answers:
        raise DataFileError(f"{name}: no answers")
    answers = []
    for number, answer in enumerate(raw_answers):
        text = answer.get("text") if isinstance(answer, dict) else None
        start = answer.get("answer_start") if isinstance(answer, dict) else None
        if not isinstance(text, str) or not text or isinstance(start, bool) or not isinstance(start, int):
            raise DataFileError(f"{name}: answer {number} needs a non-empty \"text\" and an integer \"answer_start\"")
        found = context[start:start + len(text)] if start >= 0 else ""
        if found != text:
            raise DataFileError(f"{name}: answer {number} {quoted(text)} is not at answer_start={start} of the context "
                                f"(found {quoted(found)})")
        answers.append(SquadAnswer(text, start))
    return SquadExample(qa["id"], question.strip(), context, tuple(answers), article, title)


def _renumbered(example: SquadExample, article: int) -> SquadExample:
    return SquadExample(example.id, example.question, example.context, example.answers, article, example.title)
