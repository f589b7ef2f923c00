"""The target/draft pair of the speculative-decoding benchmark: a 6-layer character-level GPT and
a 1-layer draft, both trained on tinyshakespeare: the target with the project's Trainer, the
draft by distillation from it (the Trainer on a language-modelling task whose loss is replaced).

    python benchmarks/speculative_pair.py [--out runs/speculative-pair] [--target-steps 1500] ...

writes ``OUT/target`` and ``OUT/draft`` (checkpoint folders with the character tokenizer);
``generate_speed.py`` trains them this way itself when they are missing. Nothing here
downloads anything: the text is tinyshakespeare's ``input.txt.gz``, from the data roots (``data_roots.py``).

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

Each step's folder gets ``pair-stage.json`` (the steps run, the final evaluation, the seconds)
only when its training ran to the end. A later run reuses a folder with that record and the
same step count, and refuses one without it (training there was interrupted) unless given
``--resume``, which continues it from its newest checkpoint (one every 100 steps, and one on
Ctrl-C). Ctrl-C stops the whole script after the Trainer has saved its checkpoint; nothing is
printed as trained that was not.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import torch
from data_roots import data_path

import tformer
from tformer.data.lm import split_tokens
from tformer.tokenizers import CharTokenizer
from tformer.training.tasks import LanguageModelling
from tformer.training.trainer import Trainer, TrainingConfig, TrainingInterrupted, TrainingResult

DEFAULT_DATA = data_path("tinyshakespeare/input.txt.gz")
SEQ_LEN = 256  # training context; generation in the benchmark stays within it
TARGET = dict(num_layers=6, d_model=256, num_heads=8)
DRAFT = dict(num_layers=1, d_model=128, num_heads=4)
BATCH_SIZE = 8
STAGE_RECORD = "pair-stage.json"  # written into a step's folder once its training has run to the end
CHECKPOINT_EVERY = 100  # steps; what an interrupted or killed stage resumes from (--resume)


def read_text(path: Path) -> str:
    """The corpus as text; a clear error when it is absent (a fresh clone that has not fetched it)."""
    if not path.is_file():
        raise SystemExit(f"{path}: not found; `tformer data fetch tinyshakespeare`, or pass --data with its "
                         "input.txt(.gz)")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read()


def finished_stage(folder: Path, steps: int | None, resume: bool = False) -> dict | None:
    """The record of a step trained to the end in ``folder`` (``steps`` of them, or any count
    when None), or None when it is still to train: ``folder`` holds nothing yet, or (with
    ``resume``) a run without a record, to continue. Otherwise a folder with a run but no
    record (interrupted, or written by an older version of this script) or with another step
    count is refused: it is never silently reused."""
    record_path = folder / STAGE_RECORD
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if steps is not None and record["steps"] != steps:
            raise SystemExit(f"{folder}: trained for {record['steps']} steps, not the {steps} asked for; ask for "
                             f"{record['steps']}, remove the folder to train it again, or choose another --out")
        return record
    if folder.exists() and any(folder.iterdir()) and not resume:
        raise SystemExit(f"{folder}: an incomplete run (no {STAGE_RECORD}: its training was interrupted, or an older "
                         f"version of this script wrote it); continue it with --resume, remove the folder to train "
                         f"it again, or choose another --out")
    return None


def finish_stage(folder: Path, result, requested_steps: int, seconds: float, **facts) -> dict:
    """Stop the script unless ``result`` (a TrainingResult) ran all ``requested_steps``;
    otherwise record the step in ``folder`` and return the record."""
    if result.stopped != "completed" or result.steps != requested_steps:
        print(f"{folder.name}: stopped ({result.stopped}) after {result.steps} of {requested_steps} steps; "
              f"{folder} is incomplete: continue it with --resume (this script's), or remove it to train again",
              file=sys.stderr)
        raise SystemExit(130 if result.stopped == "interrupted" else 1)
    record = dict(steps=result.steps, resumed_at=result.start_step, eval_loss=result.final_eval_loss,
                  seconds=round(seconds, 1), **facts)
    (folder / STAGE_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


def train_to_the_end(trainer: Trainer) -> TrainingResult:
    """``trainer.train()``; a run interrupted by Ctrl-C or SIGTERM (saved, then ``TrainingInterrupted``)
    comes back as its result, which ``finish_stage`` refuses, stopping the script."""
    try:
        return trainer.train()
    except TrainingInterrupted as interrupted:
        print(interrupted, file=sys.stderr, flush=True)
        return interrupted.result


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
           steps: int, lr: float, seed: int, out_dir: Path, resume: bool) -> TrainingResult:
    """Train ``student`` to match ``teacher``'s next-token distribution on random crops of
    ``tokens`` (warmup then cosine decay to lr / 10) and save it as a run folder in ``out_dir``;
    its result's ``final_eval_loss`` is the KL divergence on the held-out ``eval_tokens``. With
    ``resume``, training continues from the newest checkpoint in ``out_dir`` when there is one."""
    config = TrainingConfig(max_steps=steps, batch_size=BATCH_SIZE, seq_len=SEQ_LEN, lr=lr, min_lr=lr / 10,
                            warmup_steps=min(100, steps // 10), eval_every=steps, eval_batches=10,
                            checkpoint_every=CHECKPOINT_EVERY, seed=seed)
    trainer = Trainer(student, config, Distillation(tokens, eval_tokens, teacher), out_dir=out_dir, progress=False,
                      overwrite=True)
    if resume:
        trainer.resume("auto")
    return train_to_the_end(trainer)


def report(title: str, folder: Path, record: dict, reused: bool) -> None:
    """One line on a step, every figure from its record: what ran, not what was asked for."""
    where = f"reused from {folder}" if reused else f"saved in {folder}"
    resumed = record.get("resumed_at")
    resumed = f" (resumed at step {resumed}: the seconds are the rest's)" if resumed else ""
    print(f"{title}: {record['parameters']:,} parameters, {record['steps']} steps of {record['batch']} characters "
          f"of {record['data']}, eval {record['eval_metric']} {record['eval_loss']:.3f} nats/char, "
          f"{record['seconds']:.0f} s{resumed}; {where}", flush=True)


def train_target(tokenizer: CharTokenizer, train_tokens, eval_tokens, steps: int, folder: Path, seed: int,
                 resume: bool) -> tuple[tformer.DecoderLM, dict]:
    """Step 1: the target learns the text with the Trainer (next-character cross-entropy)."""
    torch.manual_seed(seed)
    model = tformer.build_model("gpt-mini", vocab_size=tokenizer.vocab_size, max_seq_len=SEQ_LEN, **TARGET)
    model.tokenizer = tokenizer
    config = TrainingConfig(max_steps=steps, batch_size=BATCH_SIZE, seq_len=SEQ_LEN, lr=1e-3, min_lr=1e-4,
                            warmup_steps=min(100, steps // 10), eval_every=max(1, steps // 6), eval_batches=10,
                            checkpoint_every=CHECKPOINT_EVERY, seed=seed)
    started = time.perf_counter()
    trainer = Trainer(model, config, LanguageModelling(train_tokens, eval_tokens), out_dir=folder, progress=False)
    if resume:
        trainer.resume("auto")
    result = train_to_the_end(trainer)
    record = finish_stage(folder, result, steps, time.perf_counter() - started, parameters=model.num_parameters(),
                          batch=f"{BATCH_SIZE} x {SEQ_LEN}", data="the text", eval_metric="cross-entropy")
    return model.eval(), record


def draft_from_text(target: tformer.DecoderLM, train_tokens, eval_tokens, steps: int, folder: Path, seed: int,
                    resume: bool) -> tuple[tformer.DecoderLM, dict]:
    """Step 2: a fresh draft distilled from the target on the text."""
    torch.manual_seed(seed)
    draft = tformer.build_model("gpt-mini", vocab_size=target.config.vocab_size, max_seq_len=SEQ_LEN, **DRAFT)
    draft.tokenizer = target.tokenizer
    started = time.perf_counter()
    result = distil(draft, target, train_tokens, eval_tokens, steps, lr=3e-3, seed=seed, out_dir=folder,
                    resume=resume)
    record = finish_stage(folder, result, steps, time.perf_counter() - started, parameters=draft.num_parameters(),
                          batch=f"{BATCH_SIZE} x {SEQ_LEN}", data="the text",
                          eval_metric="KL divergence from the target")
    return draft, record


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
               folder: Path, seed: int, resume: bool) -> tuple[tformer.DecoderLM, dict]:
    """Step 3: distil further on the target's greedy continuations of training prompts."""
    started = time.perf_counter()
    continuations = target_continuations(target, train_tokens, count=512, seed=seed)
    result = distil(draft, target, continuations, eval_tokens, steps, lr=1e-3, seed=seed, out_dir=folder,
                    resume=resume)
    record = finish_stage(folder, result, steps, time.perf_counter() - started, parameters=draft.num_parameters(),
                          batch=f"{BATCH_SIZE} x {SEQ_LEN}",
                          data=f"{continuations.numel():,} characters of the target's greedy continuations",
                          eval_metric="KL divergence from the target")
    return draft, record


def train_pair(out: Path, data: Path = DEFAULT_DATA, target_steps: int = 1500, draft_steps: int = 1500,
               tune_steps: int = 500, seed: int = 1337,
               resume: bool = False) -> tuple[tformer.DecoderLM, tformer.DecoderLM]:
    """Train and save the pair into ``out/target`` and ``out/draft``, reusing the steps already
    trained to the end with the same step counts (``out/target``, ``out/draft-text``,
    ``out/draft``) and, with ``resume``, continuing those interrupted; return both models."""
    threads = torch.get_num_threads()  # the Trainer may pick another count while it trains
    try:
        return _train_pair(out, data, target_steps, draft_steps, tune_steps, seed, resume)
    finally:
        torch.set_num_threads(threads)


def _train_pair(out: Path, data: Path, target_steps: int, draft_steps: int, tune_steps: int, seed: int,
                resume: bool) -> tuple[tformer.DecoderLM, tformer.DecoderLM]:
    folders = {name: out / name for name in ("target", "draft-text", "draft")}
    records = {"target": finished_stage(folders["target"], target_steps, resume),  # refused before any work
               "draft-text": finished_stage(folders["draft-text"], draft_steps, resume),
               "draft": finished_stage(folders["draft"], tune_steps, resume)}
    reused = {name: record is not None for name, record in records.items()}
    text = read_text(data)
    tokenizer = CharTokenizer.train(text)
    train_tokens, eval_tokens = split_tokens(torch.tensor(tokenizer.encode(text)), eval_fraction=0.1)
    if reused["target"]:
        target = tformer.load(folders["target"]).eval()
    else:
        target, records["target"] = train_target(tokenizer, train_tokens, eval_tokens, target_steps,
                                                 folders["target"], seed, resume)
    report("target", folders["target"], records["target"], reused["target"])
    if reused["draft"]:
        draft = tformer.load(folders["draft"])
    else:
        if reused["draft-text"]:
            draft = tformer.load(folders["draft-text"])
        else:
            draft, records["draft-text"] = draft_from_text(target, train_tokens, eval_tokens, draft_steps,
                                                           folders["draft-text"], seed + 1, resume)
        report("draft distilled on the text", folders["draft-text"], records["draft-text"], reused["draft-text"])
        draft, records["draft"] = tune_draft(draft, target, train_tokens, eval_tokens, tune_steps, folders["draft"],
                                             seed + 2, resume)
    report("draft tuned on the target's continuations", folders["draft"], records["draft"], reused["draft"])
    return target, draft


def load_or_train_pair(out: Path, data: Path = DEFAULT_DATA) -> tuple[tformer.DecoderLM, tformer.DecoderLM]:
    """The pair saved in ``out`` when both were trained to the end there (whatever their step
    counts), else ``train_pair`` with its default step counts."""
    target, draft = finished_stage(out / "target", None), finished_stage(out / "draft", None)
    if target is None or draft is None:
        return train_pair(out, data)
    report("target", out / "target", target, reused=True)
    report("draft tuned on the target's continuations", out / "draft", draft, reused=True)
    return tformer.load(out / "target").eval(), tformer.load(out / "draft")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/speculative-pair"))
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--target-steps", type=int, default=1500)
    parser.add_argument("--draft-steps", type=int, default=1500)
    parser.add_argument("--tune-steps", type=int, default=500)
    parser.add_argument("--resume", action="store_true",
                        help="continue interrupted steps (folders without pair-stage.json) from their newest "
                             "checkpoint")
    args = parser.parse_args()
    for name in ("target_steps", "draft_steps", "tune_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})")
    train_pair(args.out, args.data, args.target_steps, args.draft_steps, args.tune_steps, resume=args.resume)


if __name__ == "__main__":
    main()
