"""Extractive question answering (SQuAD v1.1): the answer is a span of the context, predicted as a
start and an end token.

Each question is paired with its context and cut into windows of ``seq_len`` tokens
(``[CLS] question [SEP] context piece [SEP]``): a context too long for one window is covered by
several, consecutive windows sharing ``doc_stride`` context tokens (so an answer cut by one window's
edge lies whole in its neighbour when it is shorter than the stride). A training window points at the
first gold answer's first and last tokens when the answer lies wholly inside it, else at 0 (the [CLS]
token), as BERT and Hugging Face train; answers that lie in no window are counted in the description.

Evaluation runs every window of a question in one batch and predicts the best span over all of them:
per window the ``n_best`` highest start and end logits among the context tokens, every pair with
start <= end no longer than ``max_answer_length`` tokens, scored start + end logit; the answer is the
context's text between the pair's character offsets, scored by the official v1.1 exact match and F1.

The loss of a window is the mean of its start and end cross-entropies over its own tokens: padding
(which varies with a batch's longest window) is left out, so a window's loss does not depend on the
batch it was drawn in. It is the model's loss (``span_loss`` given the attention mask): the task
trains on ``model(**batch).loss`` and evaluates with the same function, per window.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn

from tformer.data.files import DataFileError
from tformer.data.sources import DataConfig, DataError
from tformer.data.squad import SquadData, SquadExample, read_squad, read_squad_records
from tformer.evaluation.squad import exact_match, token_f1
from tformer.nn.losses import span_loss
from tformer.tokenizers.encoding import Encoding, Offset
from tformer.tokenizers.errors import TokenizerError
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks.base import Batch, TaskData
from tformer.training.tasks.examples import (
    EVAL_WEIGHTS,
    ExampleTask,
    Rows,
    data_tokenizer,
    drop_unused_segments,
    model_inputs,
    training_count,
)

CONTEXT = 1  # the sequence id of the context in a (question, context) window
QUESTION_FIELD, CONTEXT_MASK = "question", "context_mask"  # evaluation-only batch fields the model does not read


class SpanAnswer(NamedTuple):
    """A predicted answer: its text, its score (start + end logit; -inf when no span was legal) and its
    character span ``[start_char, end_char)`` in the context."""

    text: str
    score: float
    start_char: int
    end_char: int


NO_ANSWER = SpanAnswer("", -math.inf, 0, 0)


def question_windows(tokenizer, questions: Sequence[str], contexts: Sequence[str], *, seq_len: int,
                     doc_stride: int, question_ids: Sequence[str] | None = None, padding: bool = False):
    """(question, context) pairs as windows of at most ``seq_len`` tokens, the context cut into
    overlapping pieces (neighbours share ``doc_stride`` tokens): a BatchEncoding with offsets,
    ``overflow_to_sample_mapping`` (window -> question) and one ``Encoding`` per window, padded to the
    longest window with ``padding`` (rows ready to stack into a batch). A question too
    long for a window, or a stride too large for the room its question leaves, is a TrainingError naming
    the question (by ``question_ids`` when given) and what fits."""
    try:
        return tokenizer.encode_batch(list(questions), list(contexts), truncation="only_second", max_length=seq_len,
                                      stride=doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                                      padding=padding)
    except TokenizerError as error:
        raise _window_error(tokenizer, questions, seq_len, doc_stride, question_ids, error) from None


def _window_error(tokenizer, questions, seq_len, doc_stride, question_ids, error) -> TrainingError:
    """The question that does not fit, said in the task's settings (the tokenizer's error says it in its own)."""
    lengths = [len(ids) for ids in tokenizer.encode_batch(list(questions), add_special_tokens=False,
                                                           return_attention_mask=False)["input_ids"]]
    specials = tokenizer.template.num_special_tokens(True)
    # The longest question leaves the least room for the context: it breaks any limit another question breaks.
    index = max(range(len(lengths)), key=lengths.__getitem__)
    room = seq_len - specials - lengths[index]
    name = f"question {question_ids[index]}" if question_ids is not None else f"question {index}"
    if room < 1:
        return TrainingError(f"training.seq_len={seq_len} leaves no room for the context of {name} ({lengths[index]} "
                             f"tokens + {specials} special tokens); raise seq_len")
    if doc_stride >= room:
        return TrainingError(f"task.doc_stride={doc_stride} must be smaller than the context tokens a window holds: "
                             f"seq_len {seq_len} less {name}'s {lengths[index]} tokens and {specials} special tokens "
                             f"leaves {room}; lower doc_stride or raise seq_len")
    return TrainingError(f"cannot cut the questions into windows: {error}")


def answer_positions(windows, examples: Sequence[SquadExample]) -> tuple[list[int], list[int], int]:
    """Each window's first and last token of its question's first gold answer, (0, 0) where the answer is
    not wholly inside the window; and how many questions have their answer in no window."""
    starts, ends, found = [], [], set()
    for row, question in enumerate(windows["overflow_to_sample_mapping"]):
        answer = examples[question].answers[0]
        span = windows.encodings[row].token_span(answer.start, answer.end, sequence_index=CONTEXT)
        if span is None:
            span = (0, 0)
        else:
            found.add(question)
        starts.append(span[0])
        ends.append(span[1])
    return starts, ends, len(examples) - len(found)


def best_spans(start_logits: Tensor, end_logits: Tensor, context_mask: Tensor, *, n_best: int,
               max_answer_length: int) -> tuple[Tensor, Tensor, Tensor]:
    """Each window's best legal span: logits and ``context_mask`` (W, T) -> score, start and end token
    (W,). Candidates are the ``n_best`` highest start and end logits among the context tokens; a pair is
    legal when start <= end and it spans at most ``max_answer_length`` tokens. Score -inf: none is."""
    start = start_logits.float().masked_fill(~context_mask, -math.inf)
    end = end_logits.float().masked_fill(~context_mask, -math.inf)
    k = min(n_best, start.shape[-1])
    start_scores, start_index = start.topk(k, dim=-1)  # (W, k)
    end_scores, end_index = end.topk(k, dim=-1)
    length = end_index[:, None, :] - start_index[:, :, None]  # (W, k, k): end - start per pair
    legal = (length >= 0) & (length < max_answer_length)
    legal &= start_scores.isfinite()[:, :, None] & end_scores.isfinite()[:, None, :]
    scores = (start_scores[:, :, None] + end_scores[:, None, :]).masked_fill(~legal, -math.inf)
    best, pair = scores.flatten(1).max(dim=-1)  # (W,)
    return (best, start_index.gather(1, (pair // k)[:, None]).squeeze(1),
            end_index.gather(1, (pair % k)[:, None]).squeeze(1))


def _pick(scores: Sequence[float], starts: Sequence[int], ends: Sequence[int],
          offsets: Sequence[Sequence[Offset]], context: str) -> SpanAnswer:
    """The best of one question's per-window spans (the first window on a tie) as text of the context."""
    window = max(range(len(scores)), key=lambda index: (scores[index], -index))
    if scores[window] == -math.inf:
        return NO_ANSWER
    start_char, end_char = offsets[window][starts[window]][0], offsets[window][ends[window]][1]
    return SpanAnswer(context[start_char:end_char], float(scores[window]), start_char, end_char)


def best_answer(start_logits: Tensor, end_logits: Tensor, windows: Sequence[Encoding], context: str, *,
                n_best: int = 20, max_answer_length: int = 30) -> SpanAnswer:
    """The answer a model's logits (W, T) give over the W windows of one question (``windows``: their
    Encodings, e.g. ``question_windows(...).encodings``; T may exceed a window's length by padding):
    the best legal span of any window (see ``best_spans``) as the text of ``context``."""
    if start_logits.dim() == 1:
        start_logits, end_logits = start_logits[None], end_logits[None]
    if start_logits.shape != end_logits.shape or start_logits.shape[0] != len(windows):
        raise ValueError(f"start and end logits {tuple(start_logits.shape)}, {tuple(end_logits.shape)} must both be "
                         f"(windows, tokens) for the {len(windows)} windows")
    length = start_logits.shape[-1]
    if any(len(window) > length for window in windows):
        raise ValueError(f"the logits have {length} positions, fewer than a window's tokens")
    context_mask = torch.zeros(start_logits.shape, dtype=torch.bool)
    for row, window in enumerate(windows):
        context_mask[row, : len(window)] = torch.tensor([sequence == CONTEXT for sequence in window.sequence_ids])
    scores, starts, ends = best_spans(start_logits.detach().cpu(), end_logits.detach().cpu(), context_mask,
                                      n_best=n_best, max_answer_length=max_answer_length)
    return _pick(scores.tolist(), starts.tolist(), ends.tolist(), [window.offsets for window in windows], context)


@dataclass(frozen=True)
class SpanQAOptions:
    """The span_qa task's [task] settings."""

    doc_stride: int = 128  # tokens shared by consecutive windows of a long context
    max_answer_length: int = 30  # the longest answer predicted, in tokens
    n_best: int = 20  # start and end candidates per window

    def __post_init__(self) -> None:
        for key in ("doc_stride", "max_answer_length", "n_best"):
            if getattr(self, key) < 1:
                raise TrainingError(f"task.{key}={getattr(self, key)} must be a positive integer")


class SpanQuestionAnswering(ExampleTask):
    """Extractive QA on SQuAD questions (``train`` and optional ``evaluation`` SquadData), windows of
    ``seq_len`` tokens sharing ``doc_stride`` (see the module doc). The tokenizer needs a pair template
    with a first special token ([CLS], <s>) and a pad token; the model, head ``question_answering``."""

    name = "span_qa"
    higher_is_better = frozenset({"eval_exact_match", "eval_f1"})
    Options = SpanQAOptions
    data_formats = ("squad",)
    data_settings = frozenset({"tokenizer", "skip_bad", "columns", "question_column", "context_column",
                               "answers_column"})
    metrics = ("eval_loss", "eval_exact_match", "eval_f1")

    def __init__(self, train: SquadData, evaluation: SquadData | None, tokenizer, *, seq_len: int,
                 doc_stride: int = 128, max_answer_length: int = 30, n_best: int = 20) -> None:
        super().__init__()
        needs = {"cls": "windows without their answer point at it", "pad": "windows are padded with it"}
        for role, why in needs.items():
            if tokenizer.special_token_id(role) is None:
                raise TrainingError(f"the span_qa task needs a tokenizer with a {role} token ({why}); "
                                    f"{type(tokenizer).__name__} has none (use a WordPiece or RoBERTa tokenizer)")
        self.tokenizer = tokenizer
        self.seq_len, self.doc_stride = seq_len, doc_stride
        self.max_answer_length, self.n_best = max_answer_length, n_best
        self.train_data, self.eval_data = train, evaluation
        self.train_rows, self.train_no_window = self._rows(train.examples)
        self.eval_examples: list[SquadExample] = []
        self.eval_no_window = 0
        if evaluation is not None and len(evaluation):
            self.eval_examples = evaluation.examples
            self.eval_rows, self.eval_no_window = self._rows(evaluation.examples, for_evaluation=True)

    def _rows(self, examples: list[SquadExample], for_evaluation: bool = False) -> tuple[Rows, int]:
        """The windows of ``examples`` as rows with their answer positions (+ for evaluation: each
        window's question and context mask, and its offsets kept in ``eval_offsets``)."""
        windows = question_windows(self.tokenizer, [example.question for example in examples],
                                   [example.context for example in examples], seq_len=self.seq_len,
                                   doc_stride=self.doc_stride, question_ids=[example.id for example in examples],
                                   padding=True)  # padded by the tokenizer: one tensor per field, no per-row copies
        starts, ends, no_window = answer_positions(windows, examples)
        fields = {name: torch.tensor(windows[name]) for name in ("input_ids", "token_type_ids", "attention_mask")
                  if name in windows}
        fields["start_positions"], fields["end_positions"] = torch.tensor(starts), torch.tensor(ends)
        padding = {"input_ids": self.tokenizer.pad_token_id, "token_type_ids": 0, "attention_mask": 0}
        if for_evaluation:
            fields[CONTEXT_MASK] = torch.tensor([[sequence == CONTEXT for sequence in encoding.sequence_ids]
                                                 for encoding in windows.encodings])
            padding[CONTEXT_MASK] = 0
            fields[QUESTION_FIELD] = torch.tensor(windows["overflow_to_sample_mapping"])
            self.eval_offsets = windows["offset_mapping"]
            # window -> question is non-decreasing: question q's windows are rows first[q]:first[q + 1]
            counts = torch.bincount(fields[QUESTION_FIELD], minlength=len(examples))
            self.eval_first_window = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).tolist()
        return Rows(fields, fields["attention_mask"].sum(dim=1), padding), no_window

    @classmethod
    def from_recipe(cls, data: DataConfig, *, seq_len: int | None, tokenizer=None, label_names=None,
                    doc_stride: int = 128, max_answer_length: int = 30, n_best: int = 20):
        """The task on the SQuAD file(s) a recipe's [data] names: ``eval``, else the last
        ``round(articles * eval_fraction)`` articles of ``train`` are held out."""
        if label_names:
            raise TrainingError("label_names: the span_qa task has no labels (it predicts answer spans)")
        if seq_len is None:
            raise TrainingError("training.seq_len is needed by the span_qa task: the length of a window "
                                "(question + context piece), e.g. 384 as BERT, at most the model's max_seq_len")
        tokenizer = data_tokenizer(data, cls.name, tokenizer)
        train, evaluation = read_questions(data)
        task = cls(train, evaluation, tokenizer, seq_len=seq_len, doc_stride=doc_stride,
                   max_answer_length=max_answer_length, n_best=n_best)
        return task, TaskData(tokenizer, tokenizer.vocab_size, task.describe(Path(data.train).name))

    def describe(self, name: str) -> str:
        """One line: questions, articles and windows of each split, answers that fell in no window, skips."""
        def counts(data: SquadData, rows: Rows, no_window: int) -> str:
            return (f"{len(data):,} questions, {len(data.titles):,} articles, {len(rows):,} windows of "
                    f"{self.seq_len} tokens ({no_window:,} answers in no window)")
        line = f"{name}: training {counts(self.train_data, self.train_rows, self.train_no_window)}"
        if self.eval_rows is not None:
            line += f"; evaluation {counts(self.eval_data, self.eval_rows, self.eval_no_window)}"
        skipped = len(self.train_data.skipped) + (len(self.eval_data.skipped) if self.eval_data is not None else 0)
        if skipped:
            first = (self.train_data.skipped.messages or self.eval_data.skipped.messages)[0]
            line += f"; {skipped:,} bad questions skipped (first: {first})"
        return line

    def prepare(self, config: TrainingConfig, context: ProcessContext, model: nn.Module) -> None:
        super().prepare(config, context, model)
        head = model.config.head
        if head != "question_answering":
            raise TrainingError(f"the span_qa task trains a model with head 'question_answering', not head={head!r}")
        if config.seq_len is not None and config.seq_len != self.seq_len:
            raise TrainingError(f"training.seq_len={config.seq_len} differs from the task's windows of "
                                f"{self.seq_len} tokens")
        segments = drop_unused_segments(model, self.train_rows.fields, self.eval_rows and self.eval_rows.fields)
        self.check_model_fits(model, self.tokenizer, self.seq_len, segments=segments)
        if config.label_smoothing:
            raise TrainingError("training.label_smoothing is not supported by the span_qa task (its loss is the "
                                "model's start/end cross-entropy)")

    # ---- evaluation ------------------------------------------------------------------------------

    def _packed(self, questions: range) -> list[list[int]]:
        """``questions`` packed in order into batches of whole questions, up to ``batch_size`` windows each
        (a question with more windows than that makes a batch of its own): lists of window rows."""
        first, size = self.eval_first_window, self.config.batch_size
        batches, current = [], []
        for question in questions:
            rows = list(range(first[question], first[question + 1]))
            if current and len(current) + len(rows) > size:
                batches.append(current)
                current = []
            current += rows
        if current:
            batches.append(current)
        return batches

    def eval_batches(self) -> Iterator[Batch]:
        """This process's questions (q % world_size == rank), all windows of a question in one batch;
        every process yields as many batches (fillers of weight 0), ``eval_batches`` of them at most."""
        rank, world = self.context.rank, self.context.world_size
        total = len(self.eval_examples)
        counts = [len(self._packed(range(other, total, world))) for other in range(world)]
        mine = self._packed(range(rank, total, world))
        count = max(counts)
        if self.config.eval_batches:
            count = min(count, self.config.eval_batches)
        for index in range(count):
            rows = mine[index] if index < len(mine) else [0]
            weights = torch.full((len(rows),), 1.0 if index < len(mine) else 0.0)
            yield {**self.eval_rows.select(torch.tensor(rows)), EVAL_WEIGHTS: weights}

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, Tensor | float]:
        """The windows' loss, and each question's predicted answer scored against its gold answers."""
        weights = batch[EVAL_WEIGHTS]
        output = model(**model_inputs(batch, QUESTION_FIELD, CONTEXT_MASK, "start_positions", "end_positions"))
        start_logits, end_logits = output.start_logits.float(), output.end_logits.float()  # (B, T)
        losses = span_loss(start_logits, end_logits, batch["start_positions"], batch["end_positions"],
                           batch["attention_mask"], reduction="none")  # (B,): the model's loss per window
        scores, starts, ends = best_spans(start_logits, end_logits, batch[CONTEXT_MASK], n_best=self.n_best,
                                          max_answer_length=self.max_answer_length)
        # One transfer: per window (score, start, end, question, weight), then per-question Python.
        found = torch.stack([scores.double(), starts.double(), ends.double(), batch[QUESTION_FIELD].double(),
                             weights.double()]).cpu()
        scores_list, starts_list, ends_list = found[0].tolist(), found[1].long().tolist(), found[2].long().tolist()
        questions, kept = found[3].long().tolist(), found[4].tolist()
        exact = f1 = 0.0
        count = 0
        row = 0
        while row < len(questions):
            question = questions[row]
            last = row
            while last < len(questions) and questions[last] == question:
                last += 1
            if kept[row]:
                example = self.eval_examples[question]
                window_rows = range(self.eval_first_window[question], self.eval_first_window[question + 1])
                answer = _pick(scores_list[row:last], starts_list[row:last], ends_list[row:last],
                               [self.eval_offsets[window] for window in window_rows], example.context)
                golds = [gold.text for gold in example.answers]
                exact += max(exact_match(answer.text, gold) for gold in golds)
                f1 += max(token_f1(answer.text, gold) for gold in golds)
                count += 1
            row = last
        return {"loss": (losses.double() * weights).sum(), "windows": weights.sum(), "exact_match": exact, "f1": f1,
                "questions": count}

    def finalise(self, totals: dict[str, float]) -> dict[str, float]:
        questions = max(totals["questions"], 1)
        return {"eval_loss": totals["loss"] / max(totals["windows"], 1), "eval_exact_match": 100 * totals["exact_match"]
                / questions, "eval_f1": 100 * totals["f1"] / questions}


def read_questions(data: DataConfig) -> tuple[SquadData, SquadData | None]:
    """The questions a [data] section names: ``train``, and ``eval`` or else the last
    ``round(articles * eval_fraction)`` articles of ``train`` (None: no evaluation)."""
    train = _read(data, "train")
    if data.eval:
        return train, _read(data, "eval")
    if data.eval_fraction > 0:
        return train.split_articles(training_count(len(train.titles), data.eval_fraction, "articles", data.train))
    return train, None


def _read(data: DataConfig, key: str) -> SquadData:
    """The questions of ``data.train`` or ``data.eval``: a SQuAD JSON file (a .json, unless ``data.format``
    says records) or records of question, context and answers."""
    path = getattr(data, key)
    kind = data.record_format(path, native_suffixes=(".json",))
    data.check_columns(SpanQuestionAnswering.name, path, kind)
    try:
        if kind is None:
            return read_squad(path, skip_bad=data.skip_bad)
        columns = data.columns_of(question_column="question", context_column="context", answers_column="answers")
        return read_squad_records(path, format=kind, columns=data.columns, skip_bad=data.skip_bad, **columns)
    except DataFileError as error:
        raise DataError(f"data.{key}: {error}") from None
