"""T5's span-corruption pretraining of an encoder-decoder (``tformer.data.span_corruption``).

The data is read as the lm task reads it (text, records or token files, one stream of tokens). A row is a
random crop of ``tokens_length`` tokens, where ``tokens_length`` is what T5's ``random_spans_helper`` gives
for the inputs length ``training.seq_len`` (default: the model's ``max_seq_len``): corrupted, every row's
inputs are exactly that long and its targets ``targets_length``, so no batch holds padding. The noise is
drawn for the global batch from a generator seeded by (seed, position), so a resume and N processes see
what one process sees. Evaluation: windows spread evenly over the held-out tokens, corrupted by a fixed
seed (the same inputs for every run); loss, perplexity and accuracy over the target tokens (sentinels and
the end token included). Throughput counts the text tokens the rows cover.

Sentinels are the tokenizer's ``<extra_id_k>``; a data tokenizer without them gets ``task.sentinels`` of
them (and ``</s>`` when it has no end token) added at the end of its vocabulary, as T5's numbers them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tformer.data.lm import check_token_ids, num_tokens, random_crops, spaced_windows
from tformer.data.sources import DataConfig, load_language_model_data
from tformer.data.span_corruption import (
    T5_SENTINELS,
    corrupt_spans,
    corrupted_lengths,
    noise_counts,
    random_spans_noise_mask,
    sentinel_ids,
    span_corruption_lengths,
)
from tformer.errors import TformerError
from tformer.models.base import Seq2SeqModel, shift_right
from tformer.nn.losses import token_cross_entropy
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks.base import Batch, Task, TaskData, perplexity
from tformer.training.tasks.examples import check_special_tokens_agree, seeded_generator
from tformer.training.tasks.lm import LanguageModelling

EVAL_NOISE_SEED = 0  # evaluation noise does not depend on the run's seed: runs compare on the same inputs
NOISE_STREAM = 4  # seeded_generator's stream for the noise masks


@dataclass(frozen=True)
class SpanCorruptionOptions:
    """The span_corruption task's [task] settings."""

    noise_density: float = 0.15  # the share of a row's tokens dropped (T5: 0.15)
    mean_noise_span_length: float = 3.0  # the mean length of a dropped span (T5: 3)
    sentinels: int = T5_SENTINELS  # <extra_id_k> tokens added to a data tokenizer that has none

    def __post_init__(self) -> None:
        if not 0.0 < self.noise_density < 1.0:
            raise TrainingError(f"task.noise_density={self.noise_density} must be in (0, 1)")
        if not self.mean_noise_span_length >= 1.0:
            raise TrainingError(f"task.mean_noise_span_length={self.mean_noise_span_length} must be at least 1")
        if self.sentinels < 1:
            raise TrainingError(f"task.sentinels={self.sentinels} must be at least 1")


class SpanCorruption(LanguageModelling):
    """Span corruption on ``train_tokens`` (and ``eval_tokens``): 1-D token ids of ``tokenizer``, whose
    ``sentinels`` (ids of <extra_id_0>, <extra_id_1>, ...) replace the dropped spans."""

    name = "span_corruption"
    Options = SpanCorruptionOptions
    loss = Task.loss  # the model's loss on (input_ids, decoder_input_ids, labels)

    def __init__(self, train_tokens, eval_tokens, tokenizer, sentinels: list[int], *, noise_density: float = 0.15,
                 mean_noise_span_length: float = 3.0, sources: dict[str, str] | None = None) -> None:
        super().__init__(train_tokens, eval_tokens, sources=sources)
        if tokenizer.eos_token_id is None:
            raise TrainingError("the span_corruption task needs a tokenizer with an end token (</s>)")
        self.tokenizer = tokenizer
        self.sentinels = list(sentinels)
        self.noise_density = noise_density
        self.mean_noise_span_length = mean_noise_span_length

    @classmethod
    def from_recipe(cls, data: DataConfig, *, seq_len: int | None, tokenizer=None, label_names=None,
                    noise_density: float = 0.15, mean_noise_span_length: float = 3.0,
                    sentinels: int = T5_SENTINELS):
        """The task on the tokens a recipe's [data] names; a data tokenizer gets its sentinels (and an end
        token) added, a model folder's must have them."""
        if label_names:
            raise TrainingError("label_names: the span_corruption task has no labels")
        own_tokenizer = tokenizer is None
        loaded = load_language_model_data(data, tokenizer)
        if loaded.tokenizer is None:
            raise TrainingError("the span_corruption task needs a tokenizer (its sentinel tokens): set data.tokenizer")
        tokenizer = loaded.tokenizer
        if own_tokenizer and tokenizer.eos_token_id is None:
            tokenizer.add_special_tokens({"eos": "</s>"})
        try:
            ids = sentinel_ids(tokenizer, sentinels, may_add=own_tokenizer)
        except TformerError as error:
            raise TrainingError(str(error)) from None
        task = cls(loaded.train, loaded.eval, tokenizer, ids, noise_density=noise_density,
                   mean_noise_span_length=mean_noise_span_length,
                   sources={"training": data.train, "evaluation": data.eval or data.train})
        description = f"{loaded.description}; {len(ids)} sentinels"
        return task, TaskData(tokenizer, max(tokenizer.vocab_size, loaded.vocab_size or 0), description)

    @property
    def metrics(self) -> tuple[str, ...]:
        return ("eval_loss", "eval_ppl", "eval_accuracy")

    def prepare(self, config: TrainingConfig, context: ProcessContext, model: nn.Module) -> None:
        Task.prepare(self, config, context, model)
        if not (isinstance(model, Seq2SeqModel) and model.inputs == "tokens"):
            raise TrainingError(f"the span_corruption task trains a sequence-to-sequence model over tokens "
                                f"(encoder_decoder), not architecture={model.config.architecture!r}")
        check_special_tokens_agree(self.tokenizer, model.config, ("eos",))
        self.seq_len = config.seq_len or model.config.max_seq_len
        self.vocab_size = model.config.vocab_size
        try:
            self.tokens_length, _ = span_corruption_lengths(self.seq_len, self.noise_density,
                                                            self.mean_noise_span_length)
            self.inputs_length, self.targets_length = corrupted_lengths(
                self.tokens_length, self.noise_density, self.mean_noise_span_length)
        except TformerError as error:
            raise TrainingError(f"training.seq_len={self.seq_len}: {error}") from None
        _, spans = noise_counts(self.tokens_length, self.noise_density, self.mean_noise_span_length)
        if spans > len(self.sentinels):
            raise TrainingError(f"training.seq_len={self.seq_len} makes rows of {spans} noise spans but the tokenizer "
                                f"has {len(self.sentinels)} sentinels; lower seq_len or raise task.sentinels")
        limit = model.position_limit
        if limit is not None and max(self.inputs_length, self.targets_length) > limit:
            raise TrainingError(f"training.seq_len={self.seq_len} makes rows of {self.inputs_length} inputs and "
                                f"{self.targets_length} targets; the model's max_seq_len is {limit}")
        if max(self.sentinels) >= self.vocab_size:
            raise TrainingError(f"the sentinels reach id {max(self.sentinels)} but the model's vocab_size is "
                                f"{self.vocab_size}")
        for name, tokens in (("training", self.train_tokens), ("evaluation", self.eval_tokens)):
            if tokens is None:
                continue
            source = f" ({self.sources[name]})" if name in self.sources else ""
            if num_tokens(tokens) < self.tokens_length + 1:
                raise TrainingError(f"the {name} data{source} has {num_tokens(tokens)} tokens; rows of "
                                    f"training.seq_len={self.seq_len} inputs cover {self.tokens_length} and need "
                                    f"at least {self.tokens_length + 1}")
            try:
                check_token_ids(tokens, self.vocab_size, f"the {name} data{source}")
            except ValueError as error:
                raise TrainingError(str(error)) from None
        self.start_id = model.start_token_id
        self.pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else self.start_id

    @property
    def units_per_row(self) -> int:
        return self.tokens_length

    def _batch(self, windows: Tensor, generator: torch.Generator) -> Batch:
        """The corrupted batch of this process's ``windows`` (B, tokens_length), noise drawn for the global
        batch (so every process draws the same masks and keeps its rows)."""
        size, rank, world = windows.shape[0], self.context.rank, self.context.world_size
        mask = random_spans_noise_mask(size * world, self.tokens_length, generator, self.noise_density,
                                       self.mean_noise_span_length)[rank * size : (rank + 1) * size]
        inputs, labels = corrupt_spans(windows, mask, self.sentinels, self.tokenizer.eos_token_id)
        return {"input_ids": inputs, "decoder_input_ids": shift_right(labels, self.start_id, self.pad_id),
                "labels": labels}

    def train_batch(self, position: int) -> Batch:
        inputs, targets = random_crops(self.train_tokens, self.config.batch_size, self.tokens_length - 1,
                                       self.config.seed, position, rank=self.context.rank,
                                       world_size=self.context.world_size)
        windows = torch.cat([inputs, targets[:, -1:]], dim=1)  # (B, tokens_length)
        return self._batch(windows, seeded_generator(self.config.seed, NOISE_STREAM, position))

    def eval_batches(self) -> Iterator[Batch]:
        """``eval_batches`` batches (0: enough to cover the split) of windows spread evenly over the
        evaluation tokens, each corrupted by noise of a fixed seed."""
        config, context = self.config, self.context
        rows_per_batch = config.batch_size * context.world_size
        length = self.tokens_length - 1
        num_batches = config.eval_batches or -(-(num_tokens(self.eval_tokens) - 1) // (length * rows_per_batch))
        for index in range(num_batches):
            inputs, targets = spaced_windows(self.eval_tokens, config.batch_size, length, index, num_batches,
                                             rank=context.rank, world_size=context.world_size)
            windows = torch.cat([inputs, targets[:, -1:]], dim=1)
            yield self._batch(windows, seeded_generator(EVAL_NOISE_SEED, NOISE_STREAM, index))

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, Tensor | float]:
        labels = batch["labels"]
        logits = model(batch["input_ids"], decoder_input_ids=batch["decoder_input_ids"]).logits  # (B, T, V)
        return {"loss": token_cross_entropy(logits, labels, reduction="sum").double(),
                "correct": (logits.argmax(dim=-1) == labels).sum(), "tokens": labels.numel()}

    def finalise(self, totals: dict[str, float]) -> dict[str, float]:
        loss = totals["loss"] / totals["tokens"]
        return {"eval_loss": loss, "eval_ppl": perplexity(loss), "eval_accuracy": totals["correct"] / totals["tokens"]}
