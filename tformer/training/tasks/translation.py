"""Translation: an encoder-decoder trained on sentence pairs (``tformer.data.parallel``), scored by its
loss and by the corpus BLEU of its greedy (or beam) translations of the evaluation sources.

Each source is its tokens then the end token; the target is read by the decoder shifted right behind the
start token and predicted with the end token last. Pairs longer than ``seq_len`` tokens on either side are
cut (the end token kept) and counted.

Training batches are cut by a token budget (``batch_tokens``: rows x the longest side's length, padding
included) over pairs sorted by length, so a batch holds sentences of about one length and little padding;
each epoch sorts the pairs of equal length in a new seeded order and draws the batches in a new seeded
order. Where the cuts fall depends only on the sorted lengths, so every epoch has the same number of
batches and a batch is a pure function of (seed, position): resume stays bitwise. With ``batch_tokens = 0``
a batch is ``training.batch_size`` pairs drawn as the encoder tasks draw examples.

BLEU is summed as sacreBLEU's sufficient statistics (``tformer.evaluation.translation.bleu_statistics``),
which add up over batches and processes and finalise into the corpus BLEU of the whole evaluation set.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tformer.data.parallel import TRANSLATION_COLUMN, ParallelText, read_parallel, read_parallel_records
from tformer.data.sources import DataConfig
from tformer.evaluation.translation import (
    BLEU_STATISTICS,
    bleu_from_statistics,
    bleu_statistics,
    sacrebleu_installed,
)
from tformer.generation.translation import new_token_budget, translate_ids
from tformer.models.base import Seq2SeqModel, shift_right
from tformer.nn.losses import IGNORE_INDEX, token_cross_entropy
from tformer.tokenizers import BPETokenizer
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks.base import Batch, TaskData, perplexity
from tformer.training.tasks.examples import (
    EVAL_WEIGHTS,
    ExampleTask,
    Rows,
    check_special_tokens_agree,
    data_tokenizer,
    model_inputs,
    pad_rows,
    read_splits,
    seeded_generator,
)

ROW_INDEX = "row_index"  # (B,) evaluation batches: each row's pair, for its reference translation
TRANSLATION_SPECIAL_TOKENS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>"}  # ids 0, 1, 2 of a learned BPE


def learn_joint_bpe(pairs: ParallelText, vocab_size: int, progress: bool = False) -> BPETokenizer:
    """A byte-level BPE of ``vocab_size`` tokens learned from both sides of the training pairs at once
    (one vocabulary for source and target), its special tokens <pad>, <s>, </s> at ids 0, 1, 2."""
    return BPETokenizer.train(pairs.sources + pairs.targets, vocab_size, special_tokens=TRANSLATION_SPECIAL_TOKENS,
                              progress=progress)


def encode_side(tokenizer, texts: list[str], limit: int) -> tuple[Rows, int]:
    """Rows of each text's token ids and the end token (padded with the pad id), cut to ``limit`` tokens
    (the end token kept), and how many were cut."""
    end_id = tokenizer.eos_token_id
    encoded = tokenizer.encode_batch(texts, add_special_tokens=False)["input_ids"]
    cut = 0
    sequences = []
    for ids in encoded:
        if len(ids) + 1 > limit:
            ids = ids[: limit - 1]
            cut += 1
        sequences.append([*ids, end_id])
    return pad_rows({"ids": sequences}, padding={"ids": tokenizer.pad_token_id}), cut


def read_pairs(data: DataConfig, path: str) -> ParallelText:
    """The sentence pairs of ``path``: a corpus prefix (PREFIX.LANG files) or a records file whose
    ``data.translation_column`` maps languages to sentences, or whose ``data.source_column`` and
    ``data.target_column`` hold them."""
    kind = data.record_format(path)
    data.check_columns(Translation.name, path, kind)
    if kind is None:
        return read_parallel(path, data.source_language, data.target_language)
    return read_parallel_records(path, data.source_language, data.target_language, format=kind, columns=data.columns,
                                 translation_column=data.translation_column or TRANSLATION_COLUMN,
                                 source_column=data.source_column, target_column=data.target_column)


@dataclass(frozen=True)
class TranslationOptions:
    """The translation task's [task] settings."""

    batch_tokens: int = 4096  # a batch's tokens on its longer side, padding included; 0: batch_size pairs
    bpe_vocab_size: int = 8000  # with data.tokenizer = "bpe": the joint BPE's size
    eval_bleu: bool = True  # translate the evaluation sources and report BLEU (needs sacrebleu)
    eval_beams: int = 1  # beams of those evaluation translations (1: greedy)

    def __post_init__(self) -> None:
        if self.eval_beams < 1:
            raise TrainingError(f"task.eval_beams={self.eval_beams} must be a positive integer")
        if self.batch_tokens < 0:
            raise TrainingError(f"task.batch_tokens={self.batch_tokens} must be 0 (training.batch_size pairs a batch) "
                                "or a number of tokens")
        if self.bpe_vocab_size < 259:
            raise TrainingError(f"task.bpe_vocab_size={self.bpe_vocab_size} is too small: a byte-level BPE needs the "
                                "256 bytes and 3 special tokens, at least 259")


class Translation(ExampleTask):
    """Sentence pairs ``train`` (and ``evaluation``) encoded by ``tokenizer`` for an ``encoder_decoder``
    model; BLEU of ``eval_beams``-beam translations reported with the loss when ``eval_bleu``."""

    name = "translation"
    higher_is_better = frozenset({"eval_bleu"})
    metric_places = {"eval_bleu": 2}  # 0-100, as sacreBLEU prints it
    Options = TranslationOptions
    data_settings = frozenset({"tokenizer", "source_language", "target_language", "columns", "translation_column",
                               "source_column", "target_column"})
    learned_tokenizers = ("bpe",)
    unit = "tokens"  # target tokens (the end token included)

    def __init__(self, train: ParallelText, evaluation: ParallelText | None, tokenizer, *, seq_len: int = 256,
                 batch_tokens: int = 4096, eval_bleu: bool = True, eval_beams: int = 1) -> None:
        super().__init__()
        for role in ("pad", "bos", "eos"):
            if getattr(tokenizer, f"{role}_token_id") is None:
                raise TrainingError(f"the translation task needs a {role} token; {type(tokenizer).__name__} has none "
                                    "(a learned BPE, data.tokenizer = \"bpe\", has <pad>, <s> and </s>)")
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.batch_tokens = batch_tokens
        self.eval_bleu = eval_bleu
        self.eval_beams = eval_beams
        self.train_pairs, self.eval_pairs = train, evaluation
        self.train_rows, cut_sources = encode_side(tokenizer, train.sources, seq_len)
        self.train_targets, cut_targets = encode_side(tokenizer, train.targets, seq_len)
        self.train_cut = cut_sources + cut_targets
        self.eval_cut = 0
        if evaluation is not None:
            self.eval_rows, cut_sources = encode_side(tokenizer, evaluation.sources, seq_len)
            self.eval_targets, cut_targets = encode_side(tokenizer, evaluation.targets, seq_len)
            self.eval_cut = cut_sources + cut_targets
            # evaluated shortest source first: batches of like lengths decode with little padding
            self.eval_order = torch.sort(self.eval_rows.lengths, stable=True).indices
        self._batches: list[tuple[int, int]] | None = None  # (start, end) of each batch in the length order
        self._epoch_order: dict[int, tuple[Tensor, Tensor]] = {}

    @classmethod
    def check_data(cls, data: DataConfig) -> None:
        two_columns = data.source_column is not None or data.target_column is not None
        if not two_columns and not (data.source_language and data.target_language):
            raise TrainingError("the translation task reads data.train (and data.eval) as corpus prefixes: set "
                                "data.source_language and data.target_language (PREFIX.de and PREFIX.en for \"de\", "
                                "\"en\"); a records file is read by those languages too, or by data.source_column and "
                                "data.target_column")

    @classmethod
    def from_recipe(cls, data: DataConfig, *, seq_len: int | None, tokenizer=None, label_names=None,
                    batch_tokens: int = 4096, bpe_vocab_size: int = 8000, eval_bleu: bool = True,
                    eval_beams: int = 1):
        """The task on the corpora a recipe's [data] names (prefixes, with ``source_language`` and
        ``target_language``); ``data.tokenizer = "bpe"`` learns a joint BPE of ``bpe_vocab_size`` tokens."""
        if label_names:
            raise TrainingError("label_names: the translation task has no labels")
        if bpe_vocab_size != TranslationOptions.bpe_vocab_size and data.tokenizer != "bpe":
            raise TrainingError("task.bpe_vocab_size is the size of a learned BPE: it is read only with "
                                "data.tokenizer = \"bpe\"")
        train, evaluation = read_splits(data, read_pairs, hold_out, "pairs")
        if tokenizer is None and data.tokenizer == "bpe":
            tokenizer = learn_joint_bpe(train, bpe_vocab_size)
        tokenizer = data_tokenizer(data, cls.name, tokenizer)
        task = cls(train, evaluation, tokenizer, seq_len=seq_len or 256, batch_tokens=batch_tokens,
                   eval_bleu=eval_bleu, eval_beams=eval_beams)
        return task, TaskData(tokenizer, tokenizer.vocab_size, task.describe())

    def describe(self) -> str:
        """One line: pairs per split, skipped and cut ones."""
        cut = f", {self.train_cut:,} sentences cut to {self.seq_len} tokens" if self.train_cut else ""
        line = f"training {self.train_pairs.describe()}{cut}"
        if self.eval_pairs is not None:
            cut = f", {self.eval_cut:,} sentences cut to {self.seq_len} tokens" if self.eval_cut else ""
            line += f"; evaluation {self.eval_pairs.describe()}{cut}"
        return line

    def prepare(self, config: TrainingConfig, context: ProcessContext, model: nn.Module) -> None:
        super().prepare(config, context, model)
        model_config = model.config
        if not (isinstance(model, Seq2SeqModel) and model.inputs == "tokens"):
            raise TrainingError(f"the translation task trains a sequence-to-sequence model over tokens "
                                f"(encoder_decoder, rnn_seq2seq), not architecture={model_config.architecture!r}")
        self.check_model_fits(model, self.tokenizer, self.seq_len)
        check_special_tokens_agree(self.tokenizer, model_config, ("pad", "eos"))
        if model.start_token_id != self.tokenizer.bos_token_id:
            raise TrainingError(f"the model starts decoding at id {model.start_token_id} but the tokenizer's <s> is id "
                                f"{self.tokenizer.bos_token_id}; set decoder_start_token_id to it")
        if self.batch_tokens and self.batch_tokens < self.seq_len:
            raise TrainingError(f"task.batch_tokens={self.batch_tokens} is less than training.seq_len={self.seq_len}: "
                                "a batch must hold the longest pair")
        if self.eval_bleu and not sacrebleu_installed():
            raise TrainingError("task.eval_bleu needs sacrebleu: pip install 'tformer[translation]' (or set "
                                "task.eval_bleu = false)")
        self.model = model  # the plain module translates the evaluation sources (not a DDP wrapper)

    @property
    def metrics(self) -> tuple[str, ...]:
        return ("eval_loss", "eval_ppl", "eval_bleu") if self.eval_bleu else ("eval_loss", "eval_ppl")

    # ---- training batches ------------------------------------------------------------------------

    def units_per_batch(self) -> int:
        if not self.batch_tokens:
            return super().units_per_batch()
        return round(int(self.train_targets.lengths.sum()) / len(self._length_batches()))

    def describe_batch(self) -> str:
        if not self.batch_tokens:
            return f"{self.config.batch_size} pairs"
        return (f"{len(self._length_batches()):,} batches an epoch of up to {self.batch_tokens:,} tokens a side "
                "(padding included)")

    def train_batch(self, position: int) -> Batch:
        if not self.batch_tokens:
            return self._pairs(self.local({"index": self.global_indices(position, len(self.train_rows))})["index"])
        world, rank = self.context.world_size, self.context.rank
        batches = self._length_batches()
        stream = position * world + rank  # this process's batch in the run's stream of batches
        epoch, number = divmod(stream, len(batches))
        length_order, batch_order = self._epoch(epoch)
        start, end = batches[int(batch_order[number])]
        return self._pairs(length_order[start:end])

    def _pairs(self, index: Tensor) -> Batch:
        source = self.train_rows.select(index)["ids"]
        target = self.train_targets.select(index)["ids"]
        return pair_batch(source, target, self.train_rows.lengths[index], self.train_targets.lengths[index],
                          self.tokenizer.bos_token_id, self.tokenizer.pad_token_id)

    def _length_batches(self) -> list[tuple[int, int]]:
        """Where the batches of an epoch start and end in the pairs sorted by length (the same every epoch)."""
        if self._batches is None:
            longest = torch.maximum(self.train_rows.lengths, self.train_targets.lengths)
            sorted_lengths = torch.sort(longest).values.tolist()
            self._batches, start = [], 0
            for end, length in enumerate(sorted_lengths, start=1):
                if length * (end - start) > self.batch_tokens:
                    self._batches.append((start, end - 1))
                    start = end - 1
            self._batches.append((start, len(sorted_lengths)))
        return self._batches

    def _epoch(self, epoch: int) -> tuple[Tensor, Tensor]:
        """The pairs sorted by length, ties in this epoch's seeded order, and the epoch's order of batches."""
        if epoch not in self._epoch_order:
            if len(self._epoch_order) > 2:
                self._epoch_order.clear()
            longest = torch.maximum(self.train_rows.lengths, self.train_targets.lengths)
            shuffled = torch.randperm(len(longest), generator=seeded_generator(self.config.seed, 2, epoch))
            length_order = shuffled[torch.sort(longest[shuffled], stable=True).indices]
            batch_order = torch.randperm(len(self._length_batches()),
                                         generator=seeded_generator(self.config.seed, 3, epoch))
            self._epoch_order[epoch] = (length_order, batch_order)
        return self._epoch_order[epoch]

    # ---- evaluation ------------------------------------------------------------------------------

    def eval_batches(self) -> Iterator[Batch]:
        for index, weights in self.eval_row_batches():
            rows = self.eval_order[index]
            source = self.eval_rows.select(rows)["ids"]
            target = self.eval_targets.select(rows)["ids"]
            batch = pair_batch(source, target, self.eval_rows.lengths[rows], self.eval_targets.lengths[rows],
                               self.tokenizer.bos_token_id, self.tokenizer.pad_token_id)
            yield {**batch, EVAL_WEIGHTS: weights, ROW_INDEX: rows}

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, Tensor | float]:
        weights = batch[EVAL_WEIGHTS]
        labels = batch["labels"]
        logits = model(**model_inputs(batch, ROW_INDEX, "labels")).logits  # (B, T, V)
        losses = token_cross_entropy(logits, labels, reduction="none")  # (B, T), the model's loss per token
        tokens = (labels != IGNORE_INDEX).float()
        sums: dict[str, Tensor | float] = {"loss": (losses.sum(dim=1) * weights).sum().double(),
                                           "tokens": (tokens.sum(dim=1) * weights).sum()}
        if self.eval_bleu:
            real = weights > 0
            budget = new_token_budget(self.model, int(self.eval_rows.lengths.max()))
            hypotheses = translate_ids(self.model, batch["input_ids"][real], batch["attention_mask"][real],
                                       self.tokenizer, max_new_tokens=budget, num_beams=self.eval_beams)
            references = [self.eval_pairs.targets[int(row)] for row in batch[ROW_INDEX][real]]
            statistics = bleu_statistics(hypotheses, references) if hypotheses else [0] * BLEU_STATISTICS
            sums.update({f"bleu/{number}": float(value) for number, value in enumerate(statistics)})
        return sums

    def finalise(self, totals: dict[str, float]) -> dict[str, float]:
        loss = totals["loss"] / max(totals["tokens"], 1.0)
        metrics = {"eval_loss": loss, "eval_ppl": perplexity(loss)}
        if self.eval_bleu:
            metrics["eval_bleu"] = bleu_from_statistics([totals[f"bleu/{number}"] for number in range(BLEU_STATISTICS)])
        return metrics


def pair_batch(source: Tensor, target: Tensor, source_lengths: Tensor, target_lengths: Tensor, start_id: int,
               pad_id: int) -> Batch:
    """The model's inputs for padded sources (B, S) and targets (B, T): the sources and their mask, the
    targets as labels with -100 past each one's end, and the decoder's inputs: the labels shifted right
    as the model shifts them (``shift_right``: the start token, then the target but its last token)."""
    source_mask = (torch.arange(source.shape[1]) < source_lengths[:, None]).long()
    target_mask = torch.arange(target.shape[1]) < target_lengths[:, None]
    labels = target.masked_fill(~target_mask, IGNORE_INDEX)
    return {"input_ids": source, "attention_mask": source_mask,
            "decoder_input_ids": shift_right(labels, start_id, pad_id), "labels": labels}


def hold_out(pairs: ParallelText, keep: int) -> tuple[ParallelText, ParallelText]:
    """The first ``keep`` pairs, and the rest (held out for evaluation)."""
    def part(chosen: slice) -> ParallelText:
        return ParallelText(pairs.sources[chosen], pairs.targets[chosen], pairs.source_path, pairs.target_path)
    return part(slice(None, keep)), part(slice(keep, None))

