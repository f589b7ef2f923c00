"""The target/draft pair of the speculative-decoding benchmark: a 6-layer character-level GPT and
a 1-layer draft, both trained on tinyshakespeare with the project's Trainer.

The target learns the text (next-character cross-entropy). The draft learns the same text
from the target (distillation: the KL divergence from the target's next-character
distribution, Hinton et al. 2015), because speculative decoding pays off only as often as
the draft agrees with the target, and a draft trained on the characters alone agrees with
this target on the next greedy character only about 70% of the time.

    python benchmarks/speculative_pair.py [--out runs/speculative-pair] [--target-steps 1500] ...

writes ``OUT/target`` and ``OUT/draft`` (checkpoint folders with the character tokenizer);
``generate_speed.py`` trains them this way itself when they are missing. Nothing here
downloads anything: the text is read from ``../shared/data/tinyshakespeare/input.txt.gz``.
"""

from __future__ import annotations

import argparse
import gzip
import time
from pathlib import Path

import torch

import tformer
from tformer.data.lm import split_tokens
from tformer.tokenizers import CharTokenizer
from tformer.training.trainer import Trainer, TrainingConfig

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared/data/tinyshakespeare/input.txt.gz"
SEQ_LEN = 256  # training context; generation in the benchmark stays within it
TARGET = dict(num_layers=6, d_model=256, num_heads=8)
DRAFT = dict(num_layers=1, d_model=128, num_heads=4)
LEARNING_RATES = {"target": 1e-3, "draft": 3e-3}


def read_text(path: Path) -> str:
    """The corpus as text; a clear error when it is absent (a fresh clone has no ../shared)."""
    if not path.is_file():
        raise SystemExit(f"{path}: not found; pass --data with tinyshakespeare's input.txt(.gz)")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read()


class DistillationTrainer(Trainer):
    """The Trainer, with the loss replaced by KL(teacher || student) over the next token."""

    def __init__(self, model, config, train_tokens, eval_tokens, teacher, **options) -> None:
        super().__init__(model, config, train_tokens, eval_tokens, **options)
        self.teacher = teacher.eval()

    def loss_on(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            teacher_log_probs = self.teacher(inputs).logits.float().log_softmax(-1)
        student_log_probs = self.model(inputs).logits.float().log_softmax(-1)
        return torch.nn.functional.kl_div(student_log_probs.flatten(0, 1), teacher_log_probs.flatten(0, 1),
                                          log_target=True, reduction="batchmean")


def train_one(name: str, sizes: dict, tokenizer: CharTokenizer, train_tokens, eval_tokens, steps: int,
              out: Path, seed: int, teacher: tformer.DecoderLM | None = None) -> tformer.DecoderLM:
    torch.manual_seed(seed)
    model = tformer.build_model("gpt-mini", vocab_size=tokenizer.vocab_size, max_seq_len=SEQ_LEN, **sizes)
    model.tokenizer = tokenizer
    lr = LEARNING_RATES[name]
    config = TrainingConfig(max_steps=steps, batch_size=8, seq_len=SEQ_LEN, lr=lr, min_lr=lr / 10,
                            warmup_steps=min(100, steps // 10), eval_every=max(1, steps // 6), eval_batches=10,
                            seed=seed)
    started = time.perf_counter()
    if teacher is None:
        trainer = Trainer(model, config, train_tokens, eval_tokens, out_dir=out / name, progress=False)
        loss = "cross-entropy"
    else:
        trainer = DistillationTrainer(model, config, train_tokens, eval_tokens, teacher, out_dir=out / name,
                                      progress=False)
        loss = "KL divergence from the target"
    result = trainer.train()
    print(f"trained {name}: {model.num_parameters():,} parameters, {steps} steps of 8 x {SEQ_LEN} characters, "
          f"eval {loss} {result.final_eval_loss:.3f} nats/char, {time.perf_counter() - started:.0f} s")
    return model.eval()


def train_pair(out: Path, data: Path = DEFAULT_DATA, target_steps: int = 1500, draft_steps: int = 1500,
               seed: int = 1337) -> tuple[tformer.DecoderLM, tformer.DecoderLM]:
    """Train and save the pair into ``out/target`` and ``out/draft`` (an existing target is reused,
    so the draft can be retrained alone); return both models."""
    text = read_text(data)
    tokenizer = CharTokenizer.train(text)
    train_tokens, eval_tokens = split_tokens(torch.tensor(tokenizer.encode(text)), eval_fraction=0.1)
    if (out / "target" / "config.json").is_file():
        target = tformer.load(out / "target")
        print(f"using the trained target in {out / 'target'}")
    else:
        target = train_one("target", TARGET, tokenizer, train_tokens, eval_tokens, target_steps, out, seed)
    draft = train_one("draft", DRAFT, tokenizer, train_tokens, eval_tokens, draft_steps, out, seed + 1, teacher=target)
    return target, draft


def load_or_train_pair(out: Path, data: Path = DEFAULT_DATA, **steps) -> tuple[tformer.DecoderLM, tformer.DecoderLM]:
    """The pair saved in ``out`` if both checkpoints are there, else freshly trained."""
    if (out / "target" / "config.json").is_file() and (out / "draft" / "config.json").is_file():
        print(f"using the trained pair in {out}")
        return tformer.load(out / "target"), tformer.load(out / "draft")
    return train_pair(out, data, **steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/speculative-pair"))
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--target-steps", type=int, default=1500)
    parser.add_argument("--draft-steps", type=int, default=1500)
    args = parser.parse_args()
    train_pair(args.out, args.data, args.target_steps, args.draft_steps)


if __name__ == "__main__":
    main()
