"""The target/draft pair of the speculative-decoding benchmark: a 6-layer character-level GPT and
a 1-layer draft, both trained on tinyshakespeare: the target with the project's Trainer, the
draft by distillation from it (the Trainer on a language-modelling task whose loss is replaced).

    python benchmarks/speculative_pair.py [--out runs/speculative-pair] [--target-steps 1500] ...

writes ``OUT/target`` and ``OUT/draft`` (checkpoint folders with the character tokenizer);
``generate_speed.py`` trains them this way itself when they are missing. Nothing here
downloads anything: the text is read from ``../shared/data/tinyshakespeare/input.txt.gz``.

1. The target learns the text: next-character cross-entropy.
2. The draft learns the same text from the target (distillation: the KL divergence from the
   target's next-character distribution, Hinton et al. 2015), saved as ``OUT/draft-text``.
   Speculative decoding pays off only as often as the draft agrees with the target; a draft
   trained on the characters alone agrees with it on about 71% of the target's greedy
   characters, the distilled one on about 79% (measured here).
3. The draft is then tuned, with the same loss, on the target's own greedy continuations of
   prompts from the training text: the text it will have to predict when it drafts for greedy
   decoding (what Zhou et al. 2024, DistillSpec, call on-policy data), saved as ``OUT/draft``.
   The benchmark's prompts come from the held-out tenth of the text, which no step sees.
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
from tformer.training.tasks import LanguageModelling
from tformer.training.trainer import Trainer, TrainingConfig

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared/data/tinyshakespeare/input.txt.gz"
SEQ_LEN = 256  # training context; generation in the benchmark stays within it
TARGET = dict(num_layers=6, d_model=256, num_heads=8)
DRAFT = dict(num_layers=1, d_model=128, num_heads=4)


def read_text(path: Path) -> str:
    """The corpus as text; a clear error when it is absent (a fresh clone has no ../shared)."""
    if not path.is_file():
        raise SystemExit(f"{path}: not found; pass --data with tinyshakespeare's input.txt(.gz)")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read()


class Distillation(LanguageModelling):
    """Language modelling with its objective replaced by KL(teacher || student) over the next
    token, in nats: training minimises it and ``eval_loss`` reports it."""

    def __init__(self, train_tokens, eval_tokens, teacher: tformer.DecoderLM) -> None:
        super().__init__(train_tokens, eval_tokens)
        self.teacher = teacher.eval()

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = batch["input_ids"]
        with torch.no_grad():
            teacher_log_probs = self.teacher(inputs).logits.float().log_softmax(-1).flatten(0, 1)
        student_log_probs = model(inputs).logits.float().log_softmax(-1).flatten(0, 1)
        return torch.nn.functional.kl_div(student_log_probs, teacher_log_probs, log_target=True,
                                          reduction="batchmean")


def distil(student: tformer.DecoderLM, teacher: tformer.DecoderLM, tokens: torch.Tensor, eval_tokens: torch.Tensor,
           steps: int, lr: float, seed: int, out_dir: Path) -> float:
    """Train ``student`` to match ``teacher``'s next-token distribution on random crops of
    ``tokens`` (warmup then cosine decay to lr / 10) and save it as a run folder in ``out_dir``;
    returns the final KL divergence on the held-out ``eval_tokens``."""
    config = TrainingConfig(max_steps=steps, batch_size=8, seq_len=SEQ_LEN, lr=lr, min_lr=lr / 10,
                            warmup_steps=min(100, steps // 10), eval_every=steps, eval_batches=10, seed=seed)
    trainer = Trainer(student, config, Distillation(tokens, eval_tokens, teacher), out_dir=out_dir, progress=False,
                      overwrite=True)
    return trainer.train().final_eval_loss


def train_target(tokenizer: CharTokenizer, train_tokens, eval_tokens, steps: int, out: Path,
                 seed: int) -> tformer.DecoderLM:
    """Step 1: the target learns the text with the Trainer (next-character cross-entropy)."""
    torch.manual_seed(seed)
    model = tformer.build_model("gpt-mini", vocab_size=tokenizer.vocab_size, max_seq_len=SEQ_LEN, **TARGET)
    model.tokenizer = tokenizer
    config = TrainingConfig(max_steps=steps, batch_size=8, seq_len=SEQ_LEN, lr=1e-3, min_lr=1e-4,
                            warmup_steps=min(100, steps // 10), eval_every=max(1, steps // 6), eval_batches=10,
                            seed=seed)
    started = time.perf_counter()
    result = Trainer(model, config, LanguageModelling(train_tokens, eval_tokens), out_dir=out / "target",
                     progress=False).train()
    print(f"trained target: {model.num_parameters():,} parameters, {steps} steps of 8 x {SEQ_LEN} characters, "
          f"eval cross-entropy {result.final_eval_loss:.3f} nats/char, {time.perf_counter() - started:.0f} s")
    return model.eval()


def draft_from_text(target: tformer.DecoderLM, train_tokens, eval_tokens, steps: int, out: Path,
                    seed: int) -> tformer.DecoderLM:
    """Step 2: a fresh draft distilled from the target on the text."""
    torch.manual_seed(seed)
    draft = tformer.build_model("gpt-mini", vocab_size=target.config.vocab_size, max_seq_len=SEQ_LEN, **DRAFT)
    draft.tokenizer = target.tokenizer
    started = time.perf_counter()
    kl = distil(draft, target, train_tokens, eval_tokens, steps, lr=3e-3, seed=seed, out_dir=out / "draft-text")
    print(f"distilled draft: {draft.num_parameters():,} parameters, {steps} steps of 8 x {SEQ_LEN} characters, "
          f"eval KL divergence from the target {kl:.3f} nats/char, {time.perf_counter() - started:.0f} s")
    return draft


def target_continuations(target: tformer.DecoderLM, train_tokens: torch.Tensor, count: int, seed: int,
                         prompt_length: int = 32) -> torch.Tensor:
    """The target's greedy continuations (to SEQ_LEN characters) of ``count`` prompts drawn from the
    training text, concatenated into one token sequence."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, train_tokens.numel() - prompt_length, (count,), generator=generator).tolist()
    prompts = torch.stack([train_tokens[start : start + prompt_length] for start in starts])
    sequences = [tformer.generate(target, batch, SEQ_LEN - prompt_length, eos_token_id=[])
                 for batch in prompts.split(64)]
    return torch.cat(sequences).flatten()


def tune_draft(draft: tformer.DecoderLM, target: tformer.DecoderLM, train_tokens, eval_tokens, steps: int,
               out: Path, seed: int) -> tformer.DecoderLM:
    """Step 3: distil further on the target's greedy continuations of training prompts."""
    started = time.perf_counter()
    continuations = target_continuations(target, train_tokens, count=512, seed=seed)
    kl = distil(draft, target, continuations, eval_tokens, steps, lr=1e-3, seed=seed, out_dir=out / "draft")
    print(f"tuned draft on {continuations.numel():,} characters of the target's greedy continuations: "
          f"{steps} steps, eval KL divergence from the target {kl:.3f} nats/char, "
          f"{time.perf_counter() - started:.0f} s")
    return draft


def train_pair(out: Path, data: Path = DEFAULT_DATA, target_steps: int = 1500, draft_steps: int = 1500,
               tune_steps: int = 500, seed: int = 1337) -> tuple[tformer.DecoderLM, tformer.DecoderLM]:
    """Train and save the pair into ``out/target`` and ``out/draft``, reusing the results of steps
    already done (``out/target``, ``out/draft-text``); return both models."""
    threads = torch.get_num_threads()  # the Trainer may pick another count while it trains
    try:
        return _train_pair(out, data, target_steps, draft_steps, tune_steps, seed)
    finally:
        torch.set_num_threads(threads)


def _train_pair(out: Path, data: Path, target_steps: int, draft_steps: int, tune_steps: int,
                seed: int) -> tuple[tformer.DecoderLM, tformer.DecoderLM]:
    text = read_text(data)
    tokenizer = CharTokenizer.train(text)
    train_tokens, eval_tokens = split_tokens(torch.tensor(tokenizer.encode(text)), eval_fraction=0.1)
    if (out / "target" / "config.json").is_file():
        target = tformer.load(out / "target")
        print(f"using the trained target in {out / 'target'}")
    else:
        target = train_target(tokenizer, train_tokens, eval_tokens, target_steps, out, seed)
    if (out / "draft-text" / "config.json").is_file():
        draft = tformer.load(out / "draft-text")
        print(f"using the draft distilled on the text in {out / 'draft-text'}")
    else:
        draft = draft_from_text(target, train_tokens, eval_tokens, draft_steps, out, seed + 1)
    draft = tune_draft(draft, target, train_tokens, eval_tokens, tune_steps, out, seed + 2)
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
    parser.add_argument("--tune-steps", type=int, default=500)
    args = parser.parse_args()
    train_pair(args.out, args.data, args.target_steps, args.draft_steps, args.tune_steps)


if __name__ == "__main__":
    main()
