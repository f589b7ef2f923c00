"""Text-to-text multi-task training (T5's fine-tuning): an encoder-decoder learns every source of a mixture
(``tformer.data.text_to_text``) as (input text, target text), and is scored by decoding its answers and
scoring each source with its own metric: accuracy, corpus sacreBLEU, or SQuAD exact match and F1.

Training rows are drawn from the sources at ``source_rates``: for each position the source of every row
of the global batch (or, with ``task.source_per_batch``, of the whole batch: rows of like lengths, where a
long source would pad every batch it shares to its length) is drawn from a generator seeded by (seed,
position), and a source's rows are read in
its own seeded order, epoch after epoch, counting the draws of the positions before (a batch stays a pure
function of (seed, position), so a resume and N processes see what one process sees). Inputs and targets
end with the end token and are cut to ``training.seq_len`` tokens (counted). A data tokenizer gets
``task.sentinels`` T5 sentinels (and ``</s>``) added as span corruption adds them, so a model trained from
scratch has the vocabulary of one pretrained by span corruption on the same tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tformer.data.sources import DataConfig, DataError
from tformer.data.span_corruption import T5_SENTINELS, sentinel_ids
from tformer.data.text_to_text import (
    MIXING,
    TextPairs,
    TextSource,
    check_source_files,
    classification_pairs,
    parse_sources,
    source_rates,
    squad_pairs,
    translation_pairs,
)
from tformer.errors import TformerError
from tformer.evaluation.squad import exact_match, token_f1
from tformer.evaluation.translation import (
    BLEU_STATISTICS,
    bleu_from_statistics,
    bleu_statistics,
    sacrebleu_installed,
)
from tformer.generation.translation import translate_ids
from tformer.models.base import Seq2SeqModel
from tformer.nn.losses import IGNORE_INDEX, token_cross_entropy
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks.base import Batch, TaskData, perplexity
from tformer.training.tasks.classification import read_labelled
from tformer.training.tasks.examples import (
    EVAL_WEIGHTS,
    ExampleTask,
    check_special_tokens_agree,
    data_tokenizer,
    model_inputs,
    read_splits,
    seeded_generator,
)
from tformer.training.tasks.span_qa import read_questions
from tformer.training.tasks.translation import ROW_INDEX, encode_side, hold_out, pair_batch, read_pairs

MIX_STREAM = 5  # seeded_generator's stream for the sources of each position's rows
ORDER_STREAM = 6  # ... and for each source's order of examples, epoch by epoch (index: epoch * sources + source)


@dataclass(frozen=True)
class TextToTextOptions:
    """The text_to_text task's [task] settings."""

    mixing: str = "proportional"  # proportional (to each source's examples), temperature, equal, or rates
    mixing_temperature: float = 1.0  # with mixing = "temperature": T of T5's temperature-scaled mixing
    rate_limit: int = 0  # a source counts as at most this many examples in the rates (T5's K; 0: no limit)
    source_per_batch: bool = False  # draw a source per global batch, not per row: rows of one source pad alike
    eval_generate: bool = True  # decode the evaluation inputs and score each source (else loss only)
    eval_beams: int = 1  # beams of those answers (1: greedy)
    sentinels: int = T5_SENTINELS  # <extra_id_k> tokens added to a data tokenizer that has none (0: none)

    def __post_init__(self) -> None:
        if self.mixing not in MIXING:
            raise TrainingError(f"task.mixing={self.mixing!r} is not one of {', '.join(MIXING)}")
        if not self.mixing_temperature >= 1.0:
            raise TrainingError(f"task.mixing_temperature={self.mixing_temperature} must be at least 1 (1: "
                                "proportional; larger: closer to equal)")
        if self.mixing_temperature != 1.0 and self.mixing != "temperature":
            raise TrainingError("task.mixing_temperature is read only with mixing = \"temperature\"")
        if self.rate_limit < 0:
            raise TrainingError(f"task.rate_limit={self.rate_limit} must be 0 (no limit) or a number of examples")
        if self.rate_limit and self.mixing in ("equal", "rates"):
            raise TrainingError(f"task.rate_limit limits a source's count in proportional or temperature mixing; "
                                f"mixing = \"{self.mixing}\" counts no examples")
        if self.eval_beams < 1:
            raise TrainingError(f"task.eval_beams={self.eval_beams} must be a positive integer")
        if self.sentinels < 0:
            raise TrainingError(f"task.sentinels={self.sentinels} must be 0 or more")


def read_source(source: TextSource) -> tuple[TextPairs, TextPairs | None]:
    """A source's training and evaluation examples as text (evaluation None when it holds none out)."""
    data = source.data
    try:
        if source.kind == "classification":
            splits = read_labelled(data)
            return tuple(None if split is None else classification_pairs(source, split) for split in splits)
        if source.kind == "translation":
            splits = read_splits(data, read_pairs, hold_out, "pairs")
            return tuple(None if split is None else translation_pairs(source, split) for split in splits)
        splits = read_questions(data)
        return tuple(None if split is None else squad_pairs(source, split) for split in splits)
    except (TformerError, DataError) as error:
        raise TrainingError(f"data.sources ({source.name}): {error}") from None


class TextToText(ExampleTask):
    """The sources' examples (``train`` and ``evaluation``: a TextPairs per source, an evaluation None where a
    source holds none out) encoded by ``tokenizer`` for an ``encoder_decoder`` model, drawn at ``rates``."""

    name = "text_to_text"
    Options = TextToTextOptions
    data_settings = frozenset({"tokenizer", "sources"})

    def __init__(self, sources: list[TextSource], train: list[TextPairs], evaluation: list[TextPairs | None],
                 tokenizer, rates: list[float], *, seq_len: int = 512, source_per_batch: bool = False,
                 eval_generate: bool = True, eval_beams: int = 1) -> None:
        super().__init__()
        for role in ("pad", "eos"):
            if getattr(tokenizer, f"{role}_token_id") is None:
                raise TrainingError(f"the text_to_text task needs a {role} token; {type(tokenizer).__name__} has none")
        self.sources, self.tokenizer, self.seq_len = sources, tokenizer, seq_len
        self.rates = torch.tensor(rates, dtype=torch.double)
        self.source_per_batch = source_per_batch
        self.eval_generate, self.eval_beams = eval_generate, eval_beams
        self.train_sizes = [len(pairs) for pairs in train]
        self.train_starts = torch.tensor([0, *torch.tensor(self.train_sizes).cumsum(0).tolist()[:-1]])
        self.train_rows, self.train_targets, self.train_cut = self._encode(train)
        held = [(number, pairs) for number, pairs in enumerate(evaluation) if pairs is not None]
        self.eval_pairs = [pairs for _, pairs in held]
        self.eval_cut = 0
        if held:
            self.eval_rows, self.eval_targets, self.eval_cut = self._encode(self.eval_pairs)
            self.eval_source = torch.cat([torch.full((len(pairs),), number) for number, pairs in held])
            self.eval_references = [references for pairs in self.eval_pairs for references in pairs.references]
            # the whole evaluation: like lengths together (prepare spreads the sources when eval_batches cuts it)
            self.eval_order = torch.sort(self.eval_rows.lengths, stable=True).indices
        self.higher_is_better = frozenset(self.metrics[2:])
        self._cumulative: list[Tensor] = [torch.zeros(len(sources), dtype=torch.long)]  # draws before each position
        self._orders: dict[tuple[int, int], Tensor] = {}

    def _encode(self, splits: list[TextPairs]):
        inputs, cut_inputs = encode_side(self.tokenizer, [text for pairs in splits for text in pairs.inputs],
                                         self.seq_len)
        targets, cut_targets = encode_side(self.tokenizer, [text for pairs in splits for text in pairs.targets],
                                           self.seq_len)
        return inputs, targets, cut_inputs + cut_targets

    @classmethod
    def check_data(cls, data: DataConfig) -> None:
        if data.sources is None:
            raise TrainingError("the text_to_text task reads data.sources: a list of tables, one a source (name, "
                                "kind, train, template, ...; see docs/t5.md)")
        check_source_files(parse_sources(data.sources), data.tokenizer)

    @classmethod
    def from_recipe(cls, data: DataConfig, *, seq_len: int | None, tokenizer=None, label_names=None,
                    mixing: str = "proportional", mixing_temperature: float = 1.0, rate_limit: int = 0,
                    source_per_batch: bool = False, eval_generate: bool = True, eval_beams: int = 1,
                    sentinels: int = T5_SENTINELS):
        """The task on the sources a recipe's [data] lists; a data tokenizer gets an end token and
        ``sentinels`` sentinels added where it has none."""
        if label_names:
            raise TrainingError("label_names: the text_to_text task writes its labels as text (a classification "
                                "source's label_names)")
        own_tokenizer = tokenizer is None
        tokenizer = data_tokenizer(data, cls.name, tokenizer)
        if own_tokenizer:
            if tokenizer.eos_token_id is None:
                tokenizer.add_special_tokens({"eos": "</s>"})
            if sentinels:
                sentinel_ids(tokenizer, sentinels, may_add=True)
        sources = parse_sources(data.sources)
        splits = [read_source(source) for source in sources]
        train = [split[0] for split in splits]
        rates = source_rates(sources, [len(pairs) for pairs in train], mixing, temperature=mixing_temperature,
                             rate_limit=rate_limit)
        task = cls(sources, train, [split[1] for split in splits], tokenizer, rates, seq_len=seq_len or 512,
                   source_per_batch=source_per_batch, eval_generate=eval_generate, eval_beams=eval_beams)
        return task, TaskData(tokenizer, tokenizer.vocab_size, task.describe())

    def describe(self) -> str:
        """One line: each source's examples and rate, and the texts cut."""
        held = iter(self.eval_pairs)
        parts = []
        for source, size, rate in zip(self.sources, self.train_sizes, self.rates.tolist(), strict=True):
            evaluation = f" + {len(next(held)):,} evaluation" if self._evaluated(source) else ""
            parts.append(f"{source.name} ({source.kind}, {source.metric}): {size:,} training{evaluation}, rate "
                         f"{rate:.3f}")
        cut = self.train_cut + self.eval_cut
        return "; ".join(parts) + (f"; {cut:,} texts cut to {self.seq_len} tokens" if cut else "")

    @classmethod
    def format_metric(cls, name: str, value: float) -> str:
        if name.endswith(("_bleu", "_em", "_f1")):
            return f"{value:.2f}"  # 0-100, as sacreBLEU and SQuAD's script print them
        return super().format_metric(name, value)

    def prepare(self, config: TrainingConfig, context: ProcessContext, model: nn.Module) -> None:
        super().prepare(config, context, model)
        if not (isinstance(model, Seq2SeqModel) and model.inputs == "tokens"):
            raise TrainingError(f"the text_to_text task trains an encoder-decoder over tokens, not "
                                f"architecture={model.config.architecture!r}")
        self.check_model_fits(model, self.tokenizer, self.seq_len)
        check_special_tokens_agree(self.tokenizer, model.config, ("pad", "eos"))
        if self.eval_generate and any(source.metric == "bleu" for source in self.sources) and not sacrebleu_installed():
            raise TrainingError("a bleu source needs sacrebleu: pip install 'tformer[translation]' (or set "
                                "task.eval_generate = false)")
        self.model = model  # the plain module decodes the evaluation inputs (not a DDP wrapper)
        if config.eval_batches and self.eval_pairs:  # a cut evaluation: each source's first rows, in proportion
            shares = [(torch.arange(len(pairs)) + 0.5) / len(pairs) for pairs in self.eval_pairs]
            self.eval_order = torch.sort(torch.cat(shares), stable=True).indices

    @property
    def can_evaluate(self) -> bool:
        return bool(self.eval_pairs)

    @property
    def metrics(self) -> tuple[str, ...]:
        scores = {"accuracy": ("accuracy",), "bleu": ("bleu",), "squad": ("em", "f1")}
        named = [f"eval_{source.name}_{score}" for source in self.sources if self._evaluated(source)
                 for score in scores[source.metric]] if self.eval_generate else []
        return ("eval_loss", "eval_ppl", *named)

    def _evaluated(self, source: TextSource) -> bool:
        return bool(source.data.eval) or source.data.eval_fraction > 0

    # ---- training batches ------------------------------------------------------------------------

    def source_draws(self, position: int) -> Tensor:
        """The source (index) of each row of the global batch at ``position`` (world_size * batch_size,)."""
        rows = self.config.batch_size * self.context.world_size
        generator = seeded_generator(self.config.seed, MIX_STREAM, position)
        if self.source_per_batch:
            return torch.multinomial(self.rates, 1, generator=generator).expand(rows).clone()
        return torch.multinomial(self.rates, rows, replacement=True, generator=generator)

    def _draws_before(self, position: int) -> Tensor:
        """How many rows each source gave the positions before ``position`` (S,)."""
        while len(self._cumulative) <= position:
            before = len(self._cumulative) - 1
            counts = torch.bincount(self.source_draws(before), minlength=len(self.sources))
            self._cumulative.append(self._cumulative[-1] + counts)
        return self._cumulative[position]

    def _source_examples(self, source: int, draws: Tensor) -> Tensor:
        """Training rows of the ``draws``-th examples (numbers over the run) of one source."""
        size = self.train_sizes[source]
        epochs = draws // size
        index = torch.empty_like(draws)
        for epoch in epochs.unique().tolist():
            key = (source, epoch)
            if key not in self._orders:
                if len(self._orders) > 4 * len(self.sources):
                    self._orders.clear()
                stream_index = epoch * len(self.sources) + source
                self._orders[key] = torch.randperm(size, generator=seeded_generator(self.config.seed, ORDER_STREAM,
                                                                                    stream_index))
            chosen = epochs == epoch
            index[chosen] = self._orders[key][draws[chosen] % size]
        return self.train_starts[source] + index

    def global_rows(self, position: int) -> Tensor:
        """Training rows (world_size * batch_size,) of the global batch at ``position``."""
        sources = self.source_draws(position)
        before = self._draws_before(position)
        rows = torch.empty_like(sources)
        for source in sources.unique().tolist():
            chosen = (sources == source).nonzero().squeeze(1)
            rows[chosen] = self._source_examples(source, before[source] + torch.arange(len(chosen)))
        return rows

    def train_batch(self, position: int) -> Batch:
        size, rank = self.config.batch_size, self.context.rank
        return self._pairs(self.global_rows(position)[rank * size : (rank + 1) * size], self.train_rows,
                           self.train_targets)

    def _pairs(self, index: Tensor, inputs, targets) -> Batch:
        return pair_batch(inputs.select(index)["ids"], targets.select(index)["ids"], inputs.lengths[index],
                          targets.lengths[index], self.model.start_token_id, self.tokenizer.pad_token_id)

    # ---- evaluation ------------------------------------------------------------------------------

    def eval_batches(self) -> Iterator[Batch]:
        for index, weights in self.eval_row_batches():
            rows = self.eval_order[index]
            yield {**self._pairs(rows, self.eval_rows, self.eval_targets), EVAL_WEIGHTS: weights, ROW_INDEX: rows}

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, Tensor | float]:
        weights, labels = batch[EVAL_WEIGHTS], batch["labels"]
        logits = model(**model_inputs(batch, ROW_INDEX, "labels")).logits  # (B, T, V)
        losses = token_cross_entropy(logits, labels, reduction="none")  # (B, T)
        tokens = (labels != IGNORE_INDEX).float()
        sums: dict[str, Tensor | float] = {"loss": (losses.sum(dim=1) * weights).sum().double(),
                                           "tokens": (tokens.sum(dim=1) * weights).sum()}
        if self.eval_generate:
            sums.update(self._scores(batch["input_ids"], batch["attention_mask"], batch[ROW_INDEX], weights > 0))
        return sums

    def _answer_budget(self) -> int:
        """New tokens an answer may have: 1.5 x the longest training target + 10, within the decoder's positions."""
        budget = int(self.train_targets.lengths.max()) * 3 // 2 + 10
        limit = self.model.position_limit
        return budget if limit is None else max(1, min(budget, limit - 1))

    def _scores(self, input_ids: Tensor, attention_mask: Tensor, rows: Tensor, real: Tensor) -> dict[str, float]:
        """Each source's score sums over this batch's real rows (every source's keys, zeros included)."""
        answers = translate_ids(self.model, input_ids[real], attention_mask[real], self.tokenizer,
                                max_new_tokens=self._answer_budget(), num_beams=self.eval_beams)
        rows = rows[real].tolist()
        sums: dict[str, float] = {}
        for number, source in enumerate(self.sources):
            mine = [(answer, self.eval_references[row]) for answer, row in zip(answers, rows, strict=True)
                    if int(self.eval_source[row]) == number]
            sums[f"{source.name}/rows"] = float(len(mine))
            if source.metric == "bleu":
                statistics = bleu_statistics([answer for answer, _ in mine], [golds[0] for _, golds in mine],
                                             lowercase=source.lowercase) if mine else [0] * BLEU_STATISTICS
                sums.update({f"{source.name}/bleu/{order}": float(value) for order, value in enumerate(statistics)})
            elif source.metric == "accuracy":
                sums[f"{source.name}/correct"] = float(sum(_same(answer, golds[0], source.lowercase)
                                                           for answer, golds in mine))
            else:
                for score, measure in (("em", exact_match), ("f1", token_f1)):
                    sums[f"{source.name}/{score}"] = sum(max(measure(answer, gold) for gold in golds)
                                                         for answer, golds in mine)
        return sums

    def finalise(self, totals: dict[str, float]) -> dict[str, float]:
        loss = totals["loss"] / max(totals["tokens"], 1.0)
        metrics = {"eval_loss": loss, "eval_ppl": perplexity(loss)}
        if not self.eval_generate:
            return metrics
        for source in filter(self._evaluated, self.sources):
            name, rows = source.name, max(totals[f"{source.name}/rows"], 1.0)
            if source.metric == "bleu":
                metrics[f"eval_{name}_bleu"] = bleu_from_statistics([totals[f"{name}/bleu/{order}"]
                                                                     for order in range(BLEU_STATISTICS)])
            elif source.metric == "accuracy":
                metrics[f"eval_{name}_accuracy"] = totals[f"{name}/correct"] / rows
            else:
                metrics[f"eval_{name}_em"] = 100 * totals[f"{name}/em"] / rows
                metrics[f"eval_{name}_f1"] = 100 * totals[f"{name}/f1"] / rows
        return metrics


def _same(answer: str, target: str, lowercase: bool) -> bool:
    """Whether an answer is the target, whitespace runs and ends aside (and case, when ``lowercase``)."""
    if lowercase:
        answer, target = answer.lower(), target.lower()
    return answer.split() == target.split()
