"""Tasks over a fixed set of tokenized examples (the encoder's tasks): rows of padded tensors,
drawn for training epoch by epoch in an order seeded by (seed, epoch), and read in order for
evaluation. Each batch is cut to its longest row, so short sentences cost what they hold.

Training batches are a pure function of (seed, position) and are drawn as the global batch of
every process, each keeping its rows: N processes see what one process with N times the batch
sees, and a resumed run the batches it would have seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.data.files import DataFileError
from tformer.data.sources import DataConfig
from tformer.tokenizers import load as load_tokenizer
from tformer.tokenizers.errors import TokenizerError
from tformer.training.config import TrainingError
from tformer.training.tasks.base import Batch, Task

EVAL_WEIGHTS = "weights"  # (B,) float: 1 for a real evaluation row, 0 for a filler that evens out processes


def seeded_generator(seed: int, stream: int, index: int) -> torch.Generator:
    """A CPU generator for (seed, stream, index): torch seeds are 64-bit, so the mix is taken mod 2**64."""
    return torch.Generator().manual_seed((seed * 1_000_003 + stream * 7_919 + index) % 2**64)


def training_count(total: int, fraction: float, items: str, source: str) -> int:
    """How many of ``total`` items (the first ones) train when the last ``fraction`` of them is held out
    for evaluation (``data.eval_fraction``); refused when either side would be empty."""
    held = round(total * fraction)
    if not 0 < held < total:
        raise TrainingError(f"data.eval_fraction={fraction} of the {total:,} {items} of {source} holds out {held}: "
                            "training and evaluation need at least one each (set data.eval to a file, or "
                            "eval_fraction = 0 for no evaluation)")
    return total - held


def read_splits(data: DataConfig, read: Callable, hold_out: Callable, items: str) -> tuple:
    """(training, evaluation) for a task whose data ``read(data, path)`` reads: ``data.train``, and ``data.eval``
    or else the last ``data.eval_fraction`` of the training data (``hold_out(training, keep)`` splits it),
    or no evaluation (None). A file's error becomes the task's one-line TrainingError."""
    try:
        train = read(data, data.train)
        if data.eval:
            return train, read(data, data.eval)
        if data.eval_fraction > 0:
            return hold_out(train, training_count(len(train), data.eval_fraction, items, data.train))
        return train, None
    except DataFileError as error:
        raise TrainingError(str(error)) from None


def data_tokenizer(data: DataConfig, task: str, tokenizer=None):
    """The tokenizer an encoder task reads its data with: a pretrained folder's (given), else the
    file ``data.tokenizer`` names (a task of whole words and [CLS]/[SEP] has no use for "char")."""
    if tokenizer is not None:
        return tokenizer
    if data.tokenizer == "char":
        raise TrainingError(f"data.tokenizer: the {task} task needs a tokenizer file (BERT's vocab.txt, a "
                            "tokenizer.json) or a pretrained model folder ([model] init_from)")
    try:
        return load_tokenizer(data.tokenizer)
    except TokenizerError as error:
        raise TrainingError(f"data.tokenizer: {error}") from None


@dataclass
class Rows:
    """Examples as tensors: ``fields`` maps a name to (N, T) per-token values (padded) or (N,) per-row
    values; ``lengths`` (N,) is each row's real length; ``padding`` the value each (N, T) field is
    padded with (input ids: the pad id, labels: -100, masks and segments: 0)."""

    fields: dict[str, Tensor]
    lengths: Tensor
    padding: dict[str, int]

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def select(self, index: Tensor) -> Batch:
        """The rows at ``index`` (B,), each (N, T) field cut to the longest of them."""
        longest = int(self.lengths[index].max()) if index.numel() else 1
        return {name: values[index, :longest] if values.dim() == 2 else values[index]
                for name, values in self.fields.items()}


def check_special_tokens_agree(tokenizer, model_config, roles: tuple[str, ...]) -> None:
    """Refuse a model whose ``{role}_token_id``s differ from the tokenizer's (a sequence-to-sequence task pads
    and ends its targets with the tokenizer's ids, which the model must read as such)."""
    for role in roles:
        ours, theirs = getattr(tokenizer, f"{role}_token_id"), getattr(model_config, f"{role}_token_id")
        if ours != theirs:
            raise TrainingError(f"the tokenizer's {role} token is id {ours} but the model's {role}_token_id is "
                                f"{theirs}; they must agree")


def pad_rows(sequences: dict[str, list[list[int]]], per_row: dict[str, list] | None = None,
             padding: dict[str, int] | None = None) -> Rows:
    """Rows from lists of per-token sequences (every field's i-th sequence as long as the others')
    and per-row values; ``padding`` gives each sequence field's pad value (default 0)."""
    padding = {name: (padding or {}).get(name, 0) for name in sequences}
    first = next(iter(sequences.values()))
    lengths = torch.tensor([len(sequence) for sequence in first], dtype=torch.long)
    longest = int(lengths.max()) if len(first) else 1
    fields = {}
    for name, values in sequences.items():
        table = torch.full((len(values), longest), padding[name], dtype=torch.long)
        for row, sequence in enumerate(values):
            table[row, : len(sequence)] = torch.as_tensor(sequence, dtype=torch.long)
        fields[name] = table
    for name, values in (per_row or {}).items():
        fields[name] = torch.as_tensor(values)
    return Rows(fields, lengths, padding)


class ExampleTask(Task):
    """A task whose training and evaluation data are ``Rows``. Subclasses build the rows (in
    ``prepare``, where the model's limits are known, or before) and give the loss and evaluation."""

    unit = "examples"

    def __init__(self) -> None:
        self.train_rows: Rows | None = None
        self.eval_rows: Rows | None = None
        self._permutations: dict[int, Tensor] = {}

    @property
    def can_evaluate(self) -> bool:
        return self.eval_rows is not None and len(self.eval_rows) > 0

    @staticmethod
    def check_model_fits(model, tokenizer, seq_len: int | None, *, segments: bool = False) -> None:
        """Rows of ``seq_len`` tokens (None: not cut) of ``tokenizer``'s ids fit the model, and rows of two
        segments (``segments``: see ``drop_unused_segments``) a model with segment embeddings: a TrainingError
        before any step, not an index error in the middle of one."""
        limit = model.position_limit
        if limit is not None and seq_len is not None and seq_len > limit:
            raise TrainingError(f"training.seq_len={seq_len} exceeds the model's max_seq_len={limit}")
        if tokenizer.vocab_size > model.config.vocab_size:
            raise TrainingError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's "
                                f"vocab_size is {model.config.vocab_size}")
        if segments and getattr(model.config, "type_vocab_size", None) == 0:
            raise TrainingError("the data's rows hold two segments (a text pair, or a question and its context: "
                                "token_type_ids 1 on the second) but the model has no segment embeddings "
                                "(type_vocab_size=0): set [model] type_vocab_size = 2, or start from a model with them")

    def global_indices(self, position: int, num_rows: int) -> Tensor:
        """Indices (world_size * batch_size,) of the global batch at ``position``: the stream of
        training examples, one seeded permutation per epoch, read a batch at a time."""
        size = self.config.batch_size * self.context.world_size
        start = position * size
        stream = torch.arange(start, start + size)
        epochs = stream // num_rows
        index = torch.empty(size, dtype=torch.long)
        for epoch in epochs.unique().tolist():
            chosen = epochs == epoch
            index[chosen] = self._permutation(epoch, num_rows)[stream[chosen] % num_rows]
        return index

    def _permutation(self, epoch: int, num_rows: int) -> Tensor:
        if epoch not in self._permutations:
            if len(self._permutations) > 2:
                self._permutations.clear()
            self._permutations[epoch] = torch.randperm(num_rows, generator=seeded_generator(self.config.seed, 1, epoch))
        return self._permutations[epoch]

    def local(self, global_batch: Batch) -> Batch:
        """This process's rows of a global batch."""
        size, rank = self.config.batch_size, self.context.rank
        return {name: values[rank * size : (rank + 1) * size] for name, values in global_batch.items()}

    def train_batch(self, position: int) -> Batch:
        return self.local(self.train_rows.select(self.global_indices(position, len(self.train_rows))))

    def eval_row_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        """(row indices (B,), weights (B,)) of this process's evaluation batches: the rows in order,
        rank r taking every world_size-th; a process with fewer rows than another repeats its first
        with weight 0, so every process runs as many forward passes."""
        rank, world = self.context.rank, self.context.world_size
        total = len(self.eval_rows)
        mine = torch.arange(rank, total, world)
        per_process = -(-total // world)
        if self.config.eval_batches:
            per_process = min(per_process, self.config.eval_batches * self.config.batch_size)
            mine = mine[:per_process]
        for start in range(0, per_process, self.config.batch_size):
            index = mine[start : start + self.config.batch_size]
            wanted = min(self.config.batch_size, per_process - start)
            weights = torch.ones(wanted)
            if index.numel() < wanted:
                weights[index.numel():] = 0.0
                filler = int(mine[0]) if mine.numel() else 0
                index = torch.cat([index, index.new_full((wanted - index.numel(),), filler)])
            yield index, weights

    def eval_batches(self) -> Iterator[Batch]:
        for index, weights in self.eval_row_batches():
            yield {**self.eval_rows.select(index), EVAL_WEIGHTS: weights}


def drop_unused_segments(model, *fields: dict | None) -> bool:
    """Whether rows with these ``fields`` (a Rows' tensors, or a task's per-row lists; None: none) hold a second
    segment (a token_type_id other than 0). For a model without segment embeddings (type_vocab_size=0) the
    all-zero ids of single texts are dropped here, so it reads them as it reads any text."""
    no_segments = getattr(model.config, "type_vocab_size", None) == 0
    second_segment = False
    for values in fields:
        ids = None if values is None else values.get("token_type_ids")
        if ids is None:
            continue
        if bool(ids.any()) if isinstance(ids, Tensor) else any(any(row) for row in ids):
            second_segment = True
        elif no_segments:
            del values["token_type_ids"]
    return second_segment


def model_inputs(batch: Batch, *exclude: str) -> Batch:
    """The batch without its evaluation weights and the named fields (labels the caller reads itself)."""
    return {name: values for name, values in batch.items() if name != EVAL_WEIGHTS and name not in exclude}
