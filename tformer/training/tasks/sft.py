"""Supervised fine-tuning of a decoder on instruction and chat data (``tformer.data.chat``): the loss on the
answers only (the assistant turns, the completions) unless ``task.loss_on = "all"``, and examples packed
several to a row of ``training.seq_len`` tokens.

A packed row holds whole examples one after another, each with its own positions from 0, and no attention
mask: the stack reads positions that restart as a boundary (Hugging Face's convention for packed rows,
``nn.attention.mask.packed_segments``), so no token attends across one and each example's loss is what it
would be alone. The first token of every example is no target (the token before it belongs to another example);
the padding after a row's last example counts from 0 at every token, each its own segment, and is no target.
Rows are packed once, best fit by decreasing length, and drawn epoch by epoch like any example task's rows.
An example longer than ``seq_len`` is truncated (``task.too_long = "truncate"``, the default) or refused
(``"refuse"``); one whose answer starts past the cut is left out. Both are counted in the data's line.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor, nn

from tformer.data.chat import LOSS_ON, ChatData, ChatEncoder, chat_template, read_chat
from tformer.data.files import DataFileError
from tformer.data.sources import LEARNED_TOKENIZERS, DataConfig
from tformer.nn.attention import MultiHeadAttention
from tformer.nn.losses import IGNORE_INDEX, next_token_loss, next_token_targets
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks.base import Batch, TaskData, perplexity, rows_within_logits_budget
from tformer.training.tasks.examples import (
    EVAL_WEIGHTS,
    ExampleTask,
    Rows,
    data_tokenizer,
    model_inputs,
    pad_rows,
    read_splits,
)

TOO_LONG = ("truncate", "refuse")
TEMPLATES = ("auto", "plain")

Encoded = tuple[list[int], list[bool]]  # an example's ids, and which of them the loss reads


@dataclass(frozen=True)
class SFTOptions:
    """The sft task's [task] settings."""

    loss_on: str = "answers"  # answers: the assistant turns and completions; all: every token
    packing: bool = True  # several examples to a row, attention kept inside each
    too_long: str = "truncate"  # an example past training.seq_len: truncate, or refuse the data
    template: str = "auto"  # auto: the model folder's chat template, else the plain one; plain: always it

    def __post_init__(self) -> None:
        for name, allowed in (("loss_on", LOSS_ON), ("too_long", TOO_LONG), ("template", TEMPLATES)):
            if getattr(self, name) not in allowed:
                raise TrainingError(f"task.{name}={getattr(self, name)!r} is not one of {', '.join(allowed)}")
        if not isinstance(self.packing, bool):
            raise TrainingError(f"task.packing={self.packing!r} must be true or false")


@dataclass
class Prepared:
    """One split's examples as rows, and what became of them: how many were truncated, and left out because
    truncation cut their whole answer."""

    rows: Rows
    examples: int
    truncated: int
    dropped: int
    skipped: str | None = None

    def describe(self, name: str, seq_len: int, packing: bool) -> str:
        notes = [f"{self.truncated:,} truncated to {seq_len} tokens"] if self.truncated else []
        notes += [f"{self.dropped:,} left out (nothing to train on after the cut)"] if self.dropped else []
        notes += [self.skipped] if self.skipped else []
        shape = f" in {len(self.rows):,} rows of up to {seq_len} tokens" if packing else ""
        return f"{name}: {self.examples:,} examples{shape}" + (f" ({'; '.join(notes)})" if notes else "")


def fit_examples(encoded: list[Encoded], seq_len: int, too_long: str, source: str) -> tuple[list[Encoded], int, int]:
    """The examples cut to ``seq_len`` (or, with ``too_long = "refuse"``, a TrainingError naming how many are
    longer), those left with no token to train on after the first left out; with the counts of both."""
    long = [index for index, (ids, _) in enumerate(encoded) if len(ids) > seq_len]
    if long and too_long == "refuse":
        longest = max(len(encoded[index][0]) for index in long)
        raise TrainingError(f"{source}: {len(long):,} examples are longer than training.seq_len={seq_len} tokens (the "
                            f"longest {longest:,}); raise training.seq_len or set task.too_long = \"truncate\"")
    kept, dropped = [], 0
    for ids, trained in encoded:
        ids, trained = ids[:seq_len], trained[:seq_len]
        if not any(trained[1:]):  # the first token is never a target
            dropped += 1
            continue
        kept.append((ids, trained))
    return kept, len(long), dropped


def example_labels(ids: list[int], trained: list[bool]) -> list[int]:
    """Labels aligned with ``ids`` (the decoder shifts them): the token where the loss reads it, else -100;
    the first token never (in a packed row it would be the target of the example before)."""
    return [IGNORE_INDEX] + [token if keep else IGNORE_INDEX for token, keep in zip(ids[1:], trained[1:], strict=True)]


def pack(lengths: list[int], capacity: int) -> list[list[int]]:
    """Example indices grouped into rows of at most ``capacity`` tokens: best fit, longest first (each example
    goes into the fullest row it fits, or a new one), each row's examples in the order they came."""
    order = sorted(range(len(lengths)), key=lambda index: (-lengths[index], index))
    free: list[tuple[int, int]] = []  # (room left, row), sorted
    rows: list[list[int]] = []
    for index in order:
        spot = bisect.bisect_left(free, (lengths[index], -1))
        if spot == len(free):
            rows.append([index])
            room, row = capacity - lengths[index], len(rows) - 1
        else:
            room, row = free.pop(spot)
            rows[row].append(index)
            room -= lengths[index]
        if room > 0:
            bisect.insort(free, (room, row))
    return [sorted(row) for row in rows]


def example_rows(examples: list[Encoded], seq_len: int, packing: bool, pad_id: int) -> Rows:
    """Rows of ``input_ids`` and ``labels``: packed (with ``position_ids`` restarting at each example) or one
    example a row (with an ``attention_mask``)."""
    if not packing:
        ids = [example[0] for example in examples]
        return pad_rows({"input_ids": ids, "labels": [example_labels(*example) for example in examples],
                         "attention_mask": [[1] * len(row) for row in ids]},
                        padding={"input_ids": pad_id, "labels": IGNORE_INDEX})
    sequences: dict[str, list[list[int]]] = {"input_ids": [], "labels": [], "position_ids": []}
    for row in pack([len(ids) for ids, _ in examples], seq_len):
        sequences["input_ids"].append([token for index in row for token in examples[index][0]])
        sequences["labels"].append([label for index in row for label in example_labels(*examples[index])])
        sequences["position_ids"].append([position for index in row for position in range(len(examples[index][0]))])
    return pad_rows(sequences, padding={"input_ids": pad_id, "labels": IGNORE_INDEX, "position_ids": 0})


class SupervisedFineTuning(ExampleTask):
    """Fine-tune a decoder on ``train`` (and ``evaluation``) examples rendered and tokenized by ``encoder``, in
    rows of ``seq_len`` tokens (see the module doc). Evaluation: the loss per trained token, its perplexity and
    the share of those tokens predicted exactly."""

    name = "sft"
    unit = "tokens"
    metrics = ("eval_loss", "eval_ppl", "eval_accuracy")
    higher_is_better = frozenset({"eval_accuracy"})
    Options = SFTOptions
    data_settings = frozenset({"tokenizer", "skip_bad"})
    reads_model_folder = True

    def __init__(self, train: ChatData, evaluation: ChatData | None, encoder: ChatEncoder, *, seq_len: int,
                 packing: bool = True, too_long: str = "truncate") -> None:
        super().__init__()
        tokenizer = encoder.tokenizer
        self.tokenizer, self.seq_len, self.packing = tokenizer, seq_len, packing
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        self.prepared = {}
        for split, data in (("training", train), ("evaluation", evaluation)):
            if data is None:
                continue
            try:
                encoded = [encoder.encode(example) for example in data.examples]
            except DataFileError as error:
                raise TrainingError(str(error)) from None
            kept, truncated, dropped = fit_examples(encoded, seq_len, too_long, f"the {split} data ({data.path})")
            if not kept:
                raise TrainingError(f"the {split} data ({data.path}): no example keeps a token to train on within "
                                    f"training.seq_len={seq_len}")
            skipped = data.skipped.summary() if data.skipped else None
            self.prepared[split] = Prepared(example_rows(kept, seq_len, packing, pad_id), len(data), truncated,
                                            dropped, skipped)
        self.train_rows = self.prepared["training"].rows
        self.eval_rows = self.prepared["evaluation"].rows if "evaluation" in self.prepared else None

    @classmethod
    def from_recipe(cls, data: DataConfig, *, seq_len: int | None, tokenizer=None, label_names=None,
                    model_folder: str | None = None, loss_on: str = "answers", packing: bool = True,
                    too_long: str = "truncate", template: str = "auto"):
        """The task on the records a recipe's [data] names (``eval``, else the last ``eval_fraction`` of
        ``train``); the chat template from ``model_folder`` (a pretrained model's), else the folder of
        ``data.tokenizer``."""
        if label_names:
            raise TrainingError("label_names: the sft task has no labels")
        tokenizer = data_tokenizer(data, cls.name, tokenizer)
        if model_folder is None and data.tokenizer not in LEARNED_TOKENIZERS:
            model_folder = str(Path(data.tokenizer).parent)
        encoder = ChatEncoder(tokenizer, chat_template(model_folder, template, tokenizer), loss_on)
        options = {"format": None if data.format == "auto" else data.format, "skip_bad": data.skip_bad}
        train, evaluation = read_splits(data, lambda config, path: read_chat(path, **options), _hold_out, "examples")
        task = cls(train, evaluation, encoder, seq_len=seq_len or 512, packing=packing, too_long=too_long)
        return task, TaskData(tokenizer, tokenizer.vocab_size, task.describe())

    def describe(self) -> str:
        """One line: each split's examples, rows, truncations and what was left out."""
        lines = [prepared.describe(split, self.seq_len, self.packing) for split, prepared in self.prepared.items()]
        return "; ".join(lines)

    def prepare(self, config: TrainingConfig, context: ProcessContext, model: nn.Module) -> None:
        super().prepare(config, context, model)
        if not getattr(model, "generates", False) or getattr(model, "encodes_prompt", False):
            raise TrainingError(f"the sft task trains a decoder (a text generator); this model is "
                                f"architecture={model.config.architecture!r}")
        if config.seq_len is not None and config.seq_len != self.seq_len:
            raise TrainingError(f"training.seq_len={config.seq_len} differs from the {self.seq_len} the examples "
                                "were cut and packed to")
        self.check_model_fits(model, self.tokenizer, self.seq_len)
        self.vocab_size = model.config.vocab_size
        if self.packing:
            unable = [module.kernel.name for module in model.modules()
                      if isinstance(module, MultiHeadAttention) and not module.kernel.segments]
            if unable:
                raise TrainingError(f"attention_kernel={unable[0]!r} cannot keep packed examples apart; set "
                                    "task.packing = false, or use the sdpa or reference kernel")

    def units_per_batch(self) -> int:
        """Tokens in a micro-batch: ``batch_size`` rows of the mean row's real tokens."""
        return max(1, round(self.config.batch_size * float(self.train_rows.lengths.float().mean())))

    def describe_batch(self) -> str:
        return f"{self.config.batch_size} x up to {self.seq_len}"

    def eval_rows_per_pass(self) -> int:
        return rows_within_logits_budget(self.seq_len, self.vocab_size)

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, Tensor | float]:
        """The summed loss, correct predictions and count of the trained tokens (rows weighted: a filler row
        that evens out processes counts 0)."""
        weights, labels = batch[EVAL_WEIGHTS], batch["labels"]
        logits = model(**model_inputs(batch, "labels")).logits  # (B, T, V)
        targets = next_token_targets(labels, logits.shape[1])  # (B, T)
        valid = targets != IGNORE_INDEX
        losses = next_token_loss(logits, labels, reduction="none")  # (B, T), 0 where ignored
        correct = (logits.argmax(dim=-1) == targets) & valid
        return {"loss": (losses.double().sum(-1) * weights).sum(), "tokens": (valid.sum(-1) * weights).sum(),
                "correct": (correct.sum(-1) * weights).sum()}

    def finalise(self, totals: dict[str, float]) -> dict[str, float]:
        loss = totals["loss"] / max(totals["tokens"], 1.0)
        return {"eval_loss": loss, "eval_ppl": perplexity(loss),
                "eval_accuracy": totals["correct"] / max(totals["tokens"], 1.0)}


def _hold_out(train: ChatData, keep: int) -> tuple[ChatData, ChatData]:
    """The first ``keep`` examples, and the rest (held out for evaluation)."""
    return (ChatData(train.path, train.examples[:keep], train.skipped),
            ChatData(train.path, train.examples[keep:]))

