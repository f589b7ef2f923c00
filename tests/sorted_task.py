"""A toy classification task for the Trainer's tests: is a sequence of token ids sorted?

``SortedOrNot`` draws its training examples from a generator seeded by (seed, position), half of
them sorted, so a batch is a pure function of both; its evaluation set is fixed. ``SortedClassifier``
is a tiny model with ``forward(input_ids, labels) -> ModelOutput(logits, loss)``. Run as a script
(also under torchrun) it trains one into a run folder:

    python tests/sorted_task.py RUN [--steps 12] [--batch-size 8] [--resume] [--kill-at-position N]
"""

from __future__ import annotations

import argparse
import json
import os
import signal

import torch
import torch.nn.functional as F
from torch import nn

from tformer.config import ModelConfig
from tformer.models.base import Model
from tformer.models.output import ModelOutput
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import leave_process_group
from tformer.training.tasks import Task
from tformer.training.trainer import Trainer

VOCAB, LENGTH = 16, 8


def examples(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` sequences (count, LENGTH) of ids, about half of them sorted, and whether each is."""
    ids = torch.randint(0, VOCAB, (count, LENGTH), generator=generator)
    make_sorted = torch.rand(count, generator=generator) < 0.5
    ids = torch.where(make_sorted[:, None], ids.sort(dim=1).values, ids)
    labels = (ids.diff(dim=1) >= 0).all(dim=1).long()
    return ids, labels


class SortedOrNot(Task):
    name = "sorted"
    metrics = ("eval_loss", "eval_accuracy")
    higher_is_better = frozenset({"eval_accuracy"})

    def __init__(self, num_eval: int = 64) -> None:
        self.eval_ids, self.eval_labels = examples(num_eval, torch.Generator().manual_seed(12345))

    def prepare(self, config, context, model) -> None:
        super().prepare(config, context, model)
        rows = config.batch_size * context.world_size
        if len(self.eval_ids) % rows:
            raise TrainingError(f"{len(self.eval_ids)} evaluation examples do not split into batches of {rows}")

    @property
    def can_evaluate(self) -> bool:
        return True

    def train_batch(self, position: int) -> dict[str, torch.Tensor]:
        batch, rank = self.config.batch_size, self.context.rank
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + position)
        ids, labels = examples(batch * self.context.world_size, generator)
        rows = slice(rank * batch, (rank + 1) * batch)  # this process's rows of the global batch
        return {"input_ids": ids[rows], "labels": labels[rows]}

    def eval_batches(self):
        batch, world, rank = self.config.batch_size, self.context.world_size, self.context.rank
        for index in range(len(self.eval_ids) // (batch * world)):
            first = (index * world + rank) * batch
            yield {"input_ids": self.eval_ids[first : first + batch], "labels": self.eval_labels[first : first + batch]}

    def eval_sums(self, model, batch):
        output = model(**batch)
        rows = batch["labels"].shape[0]
        return {"loss": output.loss.double() * rows, "rows": rows,
                "correct": (output.logits.argmax(dim=-1) == batch["labels"]).sum()}

    def finalise(self, totals):
        return {"eval_loss": totals["loss"] / totals["rows"], "eval_accuracy": totals["correct"] / totals["rows"]}


class SortedClassifier(Model):
    """Token and position embeddings, one hidden layer over the whole sequence, two classes."""

    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__(ModelConfig(vocab_size=VOCAB, max_seq_len=LENGTH, d_model=16, num_layers=1, num_heads=1))
        width = self.config.d_model
        self.token_embedding = nn.Embedding(VOCAB, width)
        self.position_embedding = nn.Embedding(LENGTH, width)
        self.hidden = nn.Linear(LENGTH * width, 64)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(64, 2)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> ModelOutput:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.token_embedding(input_ids) + self.position_embedding(positions)  # (B, T, D)
        logits = self.classifier(self.dropout(F.gelu(self.hidden(x.flatten(1)))))  # (B, 2)
        return ModelOutput(logits=logits, loss=None if labels is None else F.cross_entropy(logits, labels))


def config(**overrides) -> TrainingConfig:
    settings = dict(max_steps=12, batch_size=8, lr=3e-3, warmup_steps=2, eval_every=4, checkpoint_every=4,
                    keep_last=2, early_stopping_metric="eval_accuracy", threads=1, device="cpu")
    settings.update(overrides)
    return TrainingConfig(**settings)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-at-position", type=int, help="SIGKILL this process when it draws this batch")
    args = parser.parse_args()
    torch.manual_seed(0)
    task = SortedOrNot()
    if args.kill_at_position is not None:
        draw = task.train_batch

        def train_batch(position: int) -> dict[str, torch.Tensor]:
            if position == args.kill_at_position:
                os.kill(os.getpid(), signal.SIGKILL)
            return draw(position)

        task.train_batch = train_batch
    trainer = Trainer(SortedClassifier(args.dropout), config(max_steps=args.steps, batch_size=args.batch_size), task,
                      out_dir=args.out, progress=False, overwrite=not args.resume)
    if args.resume:
        print(json.dumps({"resumed_from": trainer.resume("auto")}))
    result = trainer.train()
    print(json.dumps({"stopped": result.stopped, "steps": result.steps, "unit": result.unit}))
    trainer = None  # freed before the process group goes, as tformer.training.run does
    leave_process_group()


if __name__ == "__main__":
    main()
