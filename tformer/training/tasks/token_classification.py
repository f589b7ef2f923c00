"""Token classification (named entities, any BIO/IOBES tagging) on CoNLL files, or records of words and tags
(JSONL, CSV/TSV, Parquet, datasets folders: ``tformer.data.conll.read_tagged_records``).

Each sentence is one row: [CLS] word pieces [SEP], cut to ``seq_len`` tokens. A word's tag is the
label of its FIRST piece; its other pieces and the special tokens are -100 (ignored), as Hugging
Face's run_ner labels by default. A word cut off by ``seq_len`` (or one the tokenizer gives no piece,
a lone zero-width character) has no label: it is not trained on and cannot be predicted.

Evaluation scores whole sentences, as seqeval does: the predicted tag of each word is read at its
first piece, a word without one is predicted ``O``, and the entity counts (per type: correct,
predicted, true) are taken against the gold tags of the FULL sentence, which the task keeps per
evaluation row (``eval_gold``, looked up by the row's ``example`` index). So precision, recall and
F1 are seqeval's on the untruncated sentences, and a truncated entity counts as missed. Reading the
predictions costs one copy of the batch's tag ids to the host per evaluation batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from tformer.data.conll import TAGS_COLUMN, TOKENS_COLUMN, ConllData, TaggedSentence, read_conll, read_tagged_records
from tformer.data.files import DataFileError
from tformer.data.sources import DataConfig
from tformer.errors import TformerError, listed, quoted
from tformer.evaluation.entities import TagError, entity_counts, entity_spans, scores_from_counts
from tformer.nn.losses import IGNORE_INDEX, token_cross_entropy
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks.base import Batch, TaskData
from tformer.training.tasks.examples import (
    EVAL_WEIGHTS,
    ExampleTask,
    data_tokenizer,
    drop_unused_segments,
    model_inputs,
    pad_rows,
    training_count,
)

HEAD = "token_classification"
EXAMPLE = "example"  # (B,) evaluation rows: the sentence's index in ``eval_gold``; not a model input


def entity_types(tag_names: Sequence[str]) -> tuple[str, ...]:
    """The entity types of a tag set (``B-PER``, ``I-PER`` -> ``PER``), sorted; a TagError for a tag
    that is neither ``O`` nor B-/I-/E-/S- followed by a type."""
    return tuple(sorted({kind for name in tag_names for kind, _, _ in entity_spans([name])}))


@dataclass
class EncodedSentences:
    """Sentences as token rows: ``sequences`` (input_ids, attention_mask, token_type_ids when the
    tokenizer has them, labels), ``first_words`` (per row, the index of the word each labelled token
    starts, in order), and how many sentences were truncated, words cut off and words with no piece."""

    sequences: dict[str, list[list[int]]]
    first_words: list[list[int]]
    truncated: int
    cut_words: int
    pieceless_words: int


def encode_sentences(tokenizer, sentences: Sequence[TaggedSentence], tag_ids: Sequence[Sequence[int]],
                     max_length: int | None) -> EncodedSentences:
    """Tokenize ``sentences`` word by word ([CLS] ... [SEP], truncated to ``max_length`` tokens) and
    put each word's tag id on its first piece, -100 elsewhere."""
    batch = tokenizer.encode_batch([list(sentence.tokens) for sentence in sentences], is_split_into_words=True,
                                   truncation=max_length is not None, max_length=max_length, return_encodings=True)
    labels, first_words = [], []
    truncated = cut_words = pieceless_words = 0
    for row, (sentence, tags) in enumerate(zip(sentences, tag_ids, strict=True)):
        row_labels, row_words, previous = [], [], None
        for word in batch.word_ids(row):
            first = word is not None and word != previous
            row_labels.append(tags[word] if first else IGNORE_INDEX)
            if first:
                row_words.append(word)
            previous = word
        labels.append(row_labels)
        first_words.append(row_words)
        after_last = row_words[-1] + 1 if row_words else 0
        missing = len(sentence.tokens) - len(row_words)
        if max_length is not None and len(row_labels) == max_length and after_last < len(sentence.tokens):
            truncated += 1
            cut_words += len(sentence.tokens) - after_last
            missing -= len(sentence.tokens) - after_last
        pieceless_words += missing
    sequences = {name: batch[name] for name in ("input_ids", "attention_mask", "token_type_ids") if name in batch}
    sequences["labels"] = labels
    return EncodedSentences(sequences, first_words, truncated, cut_words, pieceless_words)


def tag_scheme_entities(tag_names: Sequence[str], path: str) -> tuple[str, ...]:
    """The entity types of BIO/IOBES ``tag_names`` (read from ``path``), or a one-line refusal."""
    try:
        return entity_types(tag_names)
    except TagError as error:
        raise TrainingError(f"{path}: the tags must be O or BIO/IOBES entity tags: {error}") from None


def held_out(data: ConllData, keep: int) -> tuple[ConllData, ConllData]:
    """The first ``keep`` sentences, and the rest (held out for evaluation)."""
    return (ConllData(data.path, data.sentences[:keep], data.tag_names, data.skipped),
            ConllData(data.path, data.sentences[keep:], data.tag_names))


def read_tagged(data: DataConfig, path: str, tags: Sequence[str] | None,
                tags_from: str = "the declared tags") -> ConllData:
    """The tagged sentences of ``path``: a CoNLL file (a .tsv too, unless ``data.format`` says records) or
    records whose ``data.tokens_column`` / ``data.tags_column`` hold each sentence's words and tags;
    ``tags_from`` says where ``tags`` came from (for the message naming a tag outside them)."""
    kind = data.record_format(path, native_suffixes=(".tsv",))
    data.check_columns(TokenClassification.name, path, kind)
    if kind is None:
        return read_conll(path, tags=tags, skip_bad=data.skip_bad, tags_from=tags_from)
    columns = data.columns_of(tokens_column=TOKENS_COLUMN, tags_column=TAGS_COLUMN)
    return read_tagged_records(path, format=kind, columns=data.columns, tags=tags, skip_bad=data.skip_bad,
                               tags_from=tags_from, **columns)


class TokenClassification(ExampleTask):
    """Tagging each word of ``train`` (and ``evaluation``) sentences with one of ``tag_names`` by a
    model with the token_classification head; ``seq_len``: the tokens a row is cut to (None: the
    model's max_seq_len, and a sentence longer than that is an error rather than a silent cut)."""

    name = "token_classification"
    higher_is_better = frozenset({"eval_precision", "eval_recall", "eval_f1", "eval_accuracy"})
    data_formats = ("conll",)
    data_settings = frozenset({"tokenizer", "skip_bad", "columns", "tokens_column", "tags_column"})
    metrics = ("eval_loss", "eval_precision", "eval_recall", "eval_f1", "eval_accuracy")

    def __init__(self, train: ConllData, evaluation: ConllData | None, tokenizer, *, seq_len: int | None = None,
                 tag_names: Sequence[str] | None = None) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.tag_names = tuple(tag_names or train.tag_names)
        self.entity_types = tag_scheme_entities(self.tag_names, train.path)
        if tokenizer.pad_token_id is None:
            raise TrainingError(f"the {self.name} task needs a tokenizer with a padding token; "
                                f"{type(tokenizer).__name__} has none (use a WordPiece or RoBERTa tokenizer)")
        self.seq_len = seq_len
        self.train_data, self.eval_data = train, evaluation
        self.train_encoded = self._encode(train)
        self.eval_encoded = None if evaluation is None else self._encode(evaluation)
        self.eval_gold: list[tuple[str, ...]] = [] if evaluation is None else [s.tags for s in evaluation.sentences]

    def _encode(self, data: ConllData) -> EncodedSentences:
        index = {name: number for number, name in enumerate(self.tag_names)}
        try:
            tag_ids = [[index[tag] for tag in sentence.tags] for sentence in data.sentences]
        except KeyError as error:
            raise TrainingError(f"{data.path}: tag {quoted(error.args[0])} is not one of {listed(self.tag_names)}") \
                from None
        try:
            return encode_sentences(self.tokenizer, data.sentences, tag_ids, self.seq_len)
        except TformerError as error:
            raise TrainingError(f"{data.path}: {error}") from None

    @classmethod
    def from_recipe(cls, data: DataConfig, *, seq_len: int | None, tokenizer=None, label_names=None):
        """The task on the CoNLL files a recipe's [data] names (``eval``, else the last ``eval_fraction``
        of the training sentences). Tags: ``label_names`` when declared, else the training data's; the
        evaluation file is read with the same tags (one it does not have is an error naming its line)."""
        tokenizer = data_tokenizer(data, cls.name, tokenizer)
        try:
            train = read_tagged(data, data.train, label_names)
            evaluation = None
            if data.eval:
                source = "the declared tags" if label_names else f"the tags of the training file {data.train}"
                evaluation = read_tagged(data, data.eval, train.tag_names, tags_from=source)
        except DataFileError as error:
            raise TrainingError(str(error)) from None
        if evaluation is None and data.eval_fraction > 0:
            tag_scheme_entities(train.tag_names, train.path)  # a file of other tags is that error, not the split's
            train, evaluation = held_out(train, training_count(len(train.sentences), data.eval_fraction,
                                                               "sentences", data.train))
        task = cls(train, evaluation, tokenizer, seq_len=seq_len, tag_names=train.tag_names)
        return task, TaskData(tokenizer, tokenizer.vocab_size, task.describe(), label_names=task.tag_names)

    def describe(self) -> str:
        """One line: sentences and words per split, the tags, truncation, skipped sentences."""
        def split(what: str, data: ConllData, encoded: EncodedSentences) -> str:
            text = f"{what} {len(data):,} sentences, {data.num_tokens:,} words ({Path(data.path).name})"
            if self.seq_len is not None:
                text += (f", {encoded.truncated:,} truncated to {self.seq_len} tokens "
                         f"({encoded.cut_words:,} words cut off)")
            if encoded.pieceless_words:
                text += f", {encoded.pieceless_words:,} words with no word piece"
            if data.skipped:
                text += f", {data.skipped.summary()}"
            return text
        parts = [split("training", self.train_data, self.train_encoded)]
        if self.eval_data is not None:
            parts.append(split("evaluation", self.eval_data, self.eval_encoded))
        return f"{'; '.join(parts)}; {len(self.tag_names)} tags, {len(self.entity_types)} entity types"

    def prepare(self, config: TrainingConfig, context: ProcessContext, model: nn.Module) -> None:
        super().prepare(config, context, model)
        head, num_labels = model.config.head, model.config.num_labels
        if head != HEAD:
            raise TrainingError(f"the {self.name} task trains a model with head={HEAD!r}, not head={head!r}")
        if num_labels != len(self.tag_names):
            raise TrainingError(f"the model's num_labels={num_labels} but the data has {len(self.tag_names)} tags "
                                f"({listed(self.tag_names)})")
        model_tags = tuple(model.config.label_names or ())
        if model_tags and model_tags != self.tag_names:
            raise TrainingError(f"the model's label_names ({listed(model_tags)}) are not the data's tags in "
                                f"their order ({listed(self.tag_names)})")
        segments = drop_unused_segments(model, self.train_encoded.sequences,
                                        self.eval_encoded and self.eval_encoded.sequences)
        self.check_model_fits(model, self.tokenizer, self.seq_len, segments=segments)
        limit = model.position_limit
        longest = max(len(ids) for encoded in (self.train_encoded, self.eval_encoded) if encoded is not None
                      for ids in encoded.sequences["input_ids"])
        if limit is not None and longest > limit:  # only without seq_len: rows are cut to it otherwise
            raise TrainingError(f"a sentence is {longest} tokens long, more than the model's max_seq_len={limit}; "
                                f"set training.seq_len (at most {limit}) to truncate the longer sentences")
        padding = {"input_ids": self.tokenizer.pad_token_id, "labels": IGNORE_INDEX}
        self.train_rows = pad_rows(self.train_encoded.sequences, padding=padding)
        if self.eval_encoded is not None:
            self.eval_rows = pad_rows(self.eval_encoded.sequences, {EXAMPLE: list(range(len(self.eval_gold)))},
                                      padding=padding)

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, Tensor | float]:
        """The summed loss over labelled tokens, word accuracy counts and, per entity type, the
        correct (``tp/T``), predicted (``predicted/T``) and true (``actual/T``) entities of the batch's
        real rows (weight-0 fillers count nothing); every batch gives the same keys."""
        weights = batch[EVAL_WEIGHTS]  # (B,)
        labels = torch.where(weights[:, None] > 0, batch["labels"], IGNORE_INDEX)  # (B, T)
        logits = model(**model_inputs(batch, "labels", EXAMPLE)).logits  # (B, T, L)
        labelled = labels != IGNORE_INDEX
        loss = token_cross_entropy(logits, labels, reduction="sum")  # the model's loss, summed
        predicted = torch.where(labelled, logits.argmax(dim=-1), IGNORE_INDEX).cpu()  # (B, T)
        gold, guessed = [], []
        for row, (example, weight) in enumerate(zip(batch[EXAMPLE].tolist(), weights.tolist(), strict=True)):
            if not weight:
                continue
            tags = ["O"] * len(self.eval_gold[example])  # a word without a first piece is predicted O
            first_pieces = predicted[row][predicted[row] != IGNORE_INDEX].tolist()
            for word, tag_id in zip(self.eval_encoded.first_words[example], first_pieces, strict=True):
                tags[word] = self.tag_names[tag_id]
            gold.append(self.eval_gold[example])
            guessed.append(tags)
        sums: dict[str, Tensor | float] = {
            "loss": loss.double(),
            "labelled": int(labelled.sum()),
            "words": sum(len(tags) for tags in gold),
            "correct_words": sum(g == p for tags, guess in zip(gold, guessed, strict=True)
                                 for g, p in zip(tags, guess, strict=True)),
        }
        counts = entity_counts(gold, guessed)
        for kind in self.entity_types:
            correct, found, actual = counts.get(kind, (0, 0, 0))
            sums[f"tp/{kind}"], sums[f"predicted/{kind}"], sums[f"actual/{kind}"] = correct, found, actual
        return sums

    def finalise(self, totals: dict[str, float]) -> dict[str, float]:
        counts = {kind: tuple(round(totals[f"{what}/{kind}"]) for what in ("tp", "predicted", "actual"))
                  for kind in self.entity_types}
        micro = scores_from_counts(counts).micro
        return {"eval_loss": totals["loss"] / max(totals["labelled"], 1), "eval_precision": micro.precision,
                "eval_recall": micro.recall, "eval_f1": micro.f1,
                "eval_accuracy": totals["correct_words"] / max(totals["words"], 1)}


@torch.no_grad()
def predict_entities(model: nn.Module, tokenizer, text: str) -> list[tuple[str, int, int, str, float]]:
    """The entities a token-classification model (in eval mode) finds in ``text``: (entity type, start
    char, end char, the text of the span, score), offsets into ``text``, end exclusive. The words are the
    tokenizer's own (its pre-tokenizer: BERT's splits punctuation off, as CoNLL data has it), each
    encoded as a word of a CoNLL sentence is in training; a word's tag is read at its first piece. A
    text longer than the model's context is read in consecutive windows of whole words. The score is
    the mean probability of the entity's words' tags; the tag names are the model's ``label_names``."""
    if model.config.head != HEAD:
        raise TformerError(f"predict_entities needs a model with head={HEAD!r}, not head={model.config.head!r}")
    tag_names = model.config.label_names
    if not tag_names:
        raise TformerError("the model has no label_names: its tags cannot be named")
    spans = word_spans(tokenizer, text)
    words = [text[start:end] for start, end in spans]
    tags, scores = ["O"] * len(words), [0.0] * len(words)
    device = next(model.parameters()).device
    for start, stop in _word_windows(tokenizer, words, model.position_limit):
        batch = tokenizer.encode_batch([words[start:stop]], is_split_into_words=True, return_encodings=True)
        inputs = {name: torch.tensor(batch[name], device=device)
                  for name in ("input_ids", "attention_mask", "token_type_ids")
                  if name in batch and (name != "token_type_ids" or getattr(model.config, "type_vocab_size", 1))}
        probabilities = model(**inputs).logits.float().softmax(dim=-1)[0]  # (T, L)
        best, chosen = (values.tolist() for values in probabilities.max(dim=-1))
        previous = None
        for position, word in enumerate(batch.word_ids(0)):
            if word is not None and word != previous:
                tags[start + word], scores[start + word] = tag_names[chosen[position]], best[position]
            previous = word
    entities = []
    for kind, first, end in entity_spans(tags):
        begin, finish = spans[first][0], spans[end - 1][1]
        entities.append((kind, begin, finish, text[begin:finish], sum(scores[first:end]) / (end - first)))
    return entities


def word_spans(tokenizer, text: str) -> list[tuple[int, int]]:
    """The (start, end) characters of the words ``tokenizer`` cuts ``text`` into (words it gives no piece
    are left out)."""
    batch = tokenizer.encode_batch([text], add_special_tokens=False, return_offsets_mapping=True)
    spans: dict[int, tuple[int, int]] = {}
    for word, (start, end) in zip(batch.word_ids(0), batch["offset_mapping"][0], strict=True):
        if word is None:
            continue
        first, _ = spans.get(word, (start, end))
        spans[word] = (first, end)
    return [spans[word] for word in sorted(spans)]


def _word_windows(tokenizer, words: list[str], limit: int | None) -> list[tuple[int, int]]:
    """Consecutive (start, stop) word ranges whose pieces, with the special tokens, fit ``limit``."""
    if not words:
        return []
    batch = tokenizer.encode_batch([words], is_split_into_words=True, return_encodings=True)
    pieces, special = [0] * len(words), 0
    for word in batch.word_ids(0):
        if word is None:
            special += 1
        else:
            pieces[word] += 1
    budget = None if limit is None else limit - special
    windows, start, used = [], 0, 0
    for index, count in enumerate(pieces):
        if budget is not None and count > budget:
            raise TformerError(f"the word {words[index][:40]!r} is {count} tokens, more than the model reads at once")
        if budget is not None and used + count > budget:
            windows.append((start, index))
            start, used = index, 0
        used += count
    windows.append((start, len(words)))
    return windows
