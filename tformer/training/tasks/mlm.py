"""Masked language modelling (+ next-sentence prediction with the ``pretraining`` head) on plain text.

The text is read as documents (blocks between blank lines) of sentences (lines). With the ``masked_lm``
head, documents are packed back to back into rows of ``seq_len`` tokens (RoBERTa's full sentences); with
``pretraining``, rows are BERT's sentence pairs, half of them followed by their true next segment.
Each training batch is masked afresh by BERT's rule (``tformer.data.masking``) from a generator seeded by
(seed, position); the evaluation rows are masked once, the same for every evaluation and every seed.
Throughput counts the tokens of the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from tformer.data.masking import mask_tokens, wordpiece_continuations
from tformer.data.pretraining import PretrainingRows, next_sentence_pairs, packed_sequences
from tformer.data.sources import DataConfig, read_text
from tformer.errors import TformerError
from tformer.nn.losses import IGNORE_INDEX, token_cross_entropy
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks.base import Batch, TaskData, perplexity
from tformer.training.tasks.examples import (
    EVAL_WEIGHTS,
    ExampleTask,
    Rows,
    data_tokenizer,
    model_inputs,
    seeded_generator,
    training_count,
)

MLM_HEADS = ("masked_lm", "pretraining")
EVAL_MASK_SEED = 0  # evaluation masks do not depend on the run's seed: runs compare on the same inputs


def text_documents(text: str) -> list[list[str]]:
    """Documents (blocks between blank lines) of sentences (their non-empty lines)."""
    documents, current = [], []
    for line in text.splitlines():
        if line.strip():
            current.append(line.strip())
        elif current:
            documents.append(current)
            current = []
    if current:
        documents.append(current)
    return documents


def split_documents(documents: list[list[str]], eval_fraction: float, source: str = "the training text"
                    ) -> tuple[list, list]:
    """The last ``eval_fraction`` of the sentences held out (a document cut in two where the split falls)."""
    keep = training_count(sum(len(document) for document in documents), eval_fraction, "sentences", source)
    train, held_out, seen = [], [], 0
    for document in documents:
        if seen + len(document) <= keep:
            train.append(document)
        elif seen >= keep:
            held_out.append(document)
        else:
            train.append(document[: keep - seen])
            held_out.append(document[keep - seen :])
        seen += len(document)
    return train, held_out


def _text(data: DataConfig, key: str) -> str:
    """The text of ``data.train`` or ``data.eval``: a text file, or a records file's ``data.text_column``."""
    path = getattr(data, key)
    kind = data.record_format(path)
    data.check_columns(MaskedLanguageModelling.name, path, kind)
    return read_text(path, key, kind or "text", data)


@dataclass(frozen=True)
class MLMOptions:
    """The mlm task's [task] settings."""

    mask_probability: float = 0.15  # the share of tokens chosen (80% [MASK], 10% random, 10% kept)
    whole_word_masking: bool = False  # choose whole words (WordPiece tokenizers)

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_probability < 1.0:
            raise TrainingError(f"task.mask_probability={self.mask_probability} must be in (0, 1)")


class MaskedLanguageModelling(ExampleTask):
    """BERT's pretraining objective on ``train_documents`` (and ``eval_documents``): lists of
    sentences as text, tokenized by ``tokenizer`` (which must have [CLS], [SEP], [MASK] and padding)."""

    name = "mlm"
    higher_is_better = frozenset({"eval_accuracy", "eval_nsp_accuracy"})
    Options = MLMOptions
    data_formats = ("text",)
    data_settings = frozenset({"tokenizer", "columns", "text_column"})
    unit = "tokens"

    def __init__(self, train_documents: list[list[str]], eval_documents: list[list[str]] | None, tokenizer, *,
                 mask_probability: float = 0.15, whole_word_masking: bool = False,
                 sources: dict[str, str] | None = None) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.mask_probability = mask_probability
        self.whole_word_masking = whole_word_masking
        self.sources = dict(sources or {})
        roles = {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id, "mask": tokenizer.mask_token_id,
                 "pad": tokenizer.pad_token_id}
        missing = [role for role, token_id in roles.items() if token_id is None]
        if missing:
            raise TrainingError(f"the mlm task needs a tokenizer with {', '.join(missing)} tokens; "
                                f"{type(tokenizer).__name__} has none (use a WordPiece or RoBERTa tokenizer)")
        self.ids = roles
        self.continuation = None
        if whole_word_masking:
            if getattr(tokenizer, "kind", None) != "wordpiece":
                raise TrainingError("task.whole_word_masking needs a WordPiece tokenizer (its ## pieces mark "
                                    f"word continuations); this one is {getattr(tokenizer, 'kind', '?')}")
            self.continuation = wordpiece_continuations(tokenizer.get_vocab())
        self.train_ids = self._tokenize(train_documents)
        self.eval_ids = None if not eval_documents else self._tokenize(eval_documents)

    def _tokenize(self, documents: list[list[str]]) -> list[list[list[int]]]:
        lines = [sentence for document in documents for sentence in document]
        encoded = self.tokenizer.encode_batch(lines, add_special_tokens=False, return_attention_mask=False)["input_ids"]
        result, start = [], 0
        for document in documents:
            result.append(encoded[start : start + len(document)])
            start += len(document)
        return result

    @classmethod
    def from_recipe(cls, data: DataConfig, *, seq_len: int | None, tokenizer=None, label_names=None,
                    mask_probability: float = 0.15, whole_word_masking: bool = False):
        """The task on the text files a recipe's [data] names (``eval``, else the last ``eval_fraction``
        of the training text's lines)."""
        if label_names:
            raise TrainingError("label_names: the mlm task has no labels")
        tokenizer = data_tokenizer(data, cls.name, tokenizer)
        train = text_documents(_text(data, "train"))
        if data.eval:
            evaluation = text_documents(_text(data, "eval"))
        elif data.eval_fraction > 0:
            train, evaluation = split_documents(train, data.eval_fraction, data.train)
        else:
            evaluation = None
        sources = {"training": data.train, "evaluation": data.eval or data.train}
        task = cls(train, evaluation, tokenizer, mask_probability=mask_probability,
                   whole_word_masking=whole_word_masking, sources=sources)
        return task, TaskData(tokenizer, tokenizer.vocab_size, task.describe(Path(data.train).name))

    def describe(self, name: str) -> str:
        """One line: the documents, lines and tokens of each split."""
        def counts(documents) -> str:
            lines = sum(len(document) for document in documents)
            tokens = sum(len(sentence) for document in documents for sentence in document)
            return f"{len(documents):,} documents, {lines:,} lines, {tokens:,} tokens"
        held_out = f"; evaluation {counts(self.eval_ids)}" if self.eval_ids else ""
        return f"{name}: training {counts(self.train_ids)}{held_out}"

    @property
    def metrics(self) -> tuple[str, ...]:
        base = ("eval_loss", "eval_ppl", "eval_accuracy")
        return (*base, "eval_nsp_accuracy") if getattr(self, "next_sentence", False) else base

    def prepare(self, config: TrainingConfig, context: ProcessContext, model: nn.Module) -> None:
        super().prepare(config, context, model)
        head = model.config.head
        if head not in MLM_HEADS:
            raise TrainingError(f"the mlm task trains a model with head 'masked_lm' or 'pretraining' "
                                f"(next-sentence pairs too), not head={head!r}")
        self.next_sentence = head == "pretraining"
        if config.label_smoothing:
            raise TrainingError("training.label_smoothing is not supported by the mlm task (its loss is the "
                                "model's masked-token cross-entropy)")
        self.seq_len = config.seq_len or model.config.max_seq_len
        self.check_model_fits(model, self.tokenizer, self.seq_len, segments=self.next_sentence)
        self.vocab_size = model.config.vocab_size
        self.special_ids = sorted(set(self.tokenizer.special_token_ids) | {self.ids["pad"]})
        self.train_rows = self._rows(self.train_ids, config.seed, "training")
        if self.eval_ids is not None:
            rows = self._rows(self.eval_ids, EVAL_MASK_SEED, "evaluation")
            masked, labels = self._mask(rows.fields["input_ids"], torch.Generator().manual_seed(EVAL_MASK_SEED))
            rows.fields["input_ids"], rows.fields["labels"] = masked, labels
            rows.padding["labels"] = IGNORE_INDEX
            self.eval_rows = rows

    def _rows(self, documents: list[list[list[int]]], seed: int, what: str) -> Rows:
        ids = self.ids
        try:
            if self.next_sentence:
                made: PretrainingRows = next_sentence_pairs(documents, self.seq_len, cls_id=ids["cls"],
                                                            sep_id=ids["sep"], pad_id=ids["pad"], seed=seed)
            else:
                made = packed_sequences(documents, self.seq_len, cls_id=ids["cls"], sep_id=ids["sep"],
                                        pad_id=ids["pad"])
        except TformerError as error:
            source = f" ({self.sources[what]})" if what in self.sources else ""
            raise TrainingError(f"the {what} text{source}: {error}") from None
        fields = {"input_ids": made.input_ids, "attention_mask": made.attention_mask}
        if self.next_sentence:
            fields["token_type_ids"] = made.token_type_ids
            fields["next_sentence_label"] = 1 - made.next_sentence_label  # the model's: 0 = B follows A
        padding = {"input_ids": ids["pad"], "attention_mask": 0, "token_type_ids": 0}
        return Rows(fields, made.attention_mask.sum(dim=1), padding)

    @property
    def units_per_row(self) -> int:
        return self.seq_len

    def _mask(self, input_ids: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return mask_tokens(input_ids, generator, special_ids=self.special_ids, vocab_size=self.vocab_size,
                           mask_id=self.ids["mask"], mask_probability=self.mask_probability,
                           continuation=self.continuation)

    def train_batch(self, position: int) -> Batch:
        batch = self.train_rows.select(self.global_indices(position, len(self.train_rows)))
        generator = seeded_generator(self.config.seed, 2, position)
        batch["input_ids"], batch["labels"] = self._mask(batch["input_ids"], generator)
        return self.local(batch)

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        """Cross-entropy over the masked tokens (+ the next-sentence loss), computing the vocabulary
        projection at the masked positions alone."""
        return model(**batch, labelled_logits_only=True).loss

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, Tensor | float]:
        weights = batch[EVAL_WEIGHTS]
        labels = torch.where(weights[:, None] > 0, batch["labels"], IGNORE_INDEX)
        output = model(**model_inputs(batch, "labels"), labels=labels, labelled_logits_only=True)
        targets = labels[labels != IGNORE_INDEX]  # (N,), the rows of output.logits
        sums = {
            "mlm_loss": token_cross_entropy(output.logits, targets, reduction="sum").double(),
            "correct": (output.logits.argmax(dim=-1) == targets).sum(),
            "masked": targets.numel(),
            "rows": weights.sum(),
        }
        if self.next_sentence:
            nsp_logits = output.next_sentence_logits  # (B, 2)
            nsp_labels = batch["next_sentence_label"]
            losses = token_cross_entropy(nsp_logits, nsp_labels, reduction="none")  # (B,)
            sums["nsp_loss"] = (losses * weights).sum().double()
            sums["nsp_correct"] = ((nsp_logits.argmax(dim=-1) == nsp_labels).float() * weights).sum()
        return sums

    def finalise(self, totals: dict[str, float]) -> dict[str, float]:
        mlm_loss = totals["mlm_loss"] / max(totals["masked"], 1)
        metrics = {"eval_loss": mlm_loss, "eval_ppl": perplexity(mlm_loss),
                   "eval_accuracy": totals["correct"] / max(totals["masked"], 1)}
        if self.next_sentence:
            metrics["eval_loss"] = mlm_loss + totals["nsp_loss"] / totals["rows"]
            metrics["eval_nsp_accuracy"] = totals["nsp_correct"] / totals["rows"]
        return metrics
