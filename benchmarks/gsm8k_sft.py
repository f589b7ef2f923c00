"""GSM8K supervised fine-tuning three ways, side by side (issue 56, part 7): full fine-tuning, LoRA and QLoRA
(LoRA over an int4 base) of the project's pretrained decoder (configs/gpt-mini-lm.toml) with
configs/gsm8k-sft.toml, over seeds, and per method: the held-out answer-token loss on the 1,319 test problems
(the run's last eval_loss), the share of greedy answers to test problems that end in "#### <number>" before
fine-tuning (the base) and after, exact-match accuracy on that number, the parameters that train, the run's
peak memory (metrics.jsonl's peak_memory_mib: RSS on the CPU) and its seconds per step.

    python benchmarks/gsm8k_sft.py --seeds 3                      # pretrain once, then 3 x 3 runs (hours)
    python benchmarks/gsm8k_sft.py pretrain                       # the base only (30 minutes)
    python benchmarks/gsm8k_sft.py costs                          # each method's step cost alone (minutes)
    python benchmarks/gsm8k_sft.py --seeds 1 --variants full lora
    python benchmarks/gsm8k_sft.py --seeds 1 --max-steps 3 --generate 4 --max-new-tokens 8 \
        --pretrain-steps 3 --runs /tmp/gsm8k-smoke                # the pipeline only (minutes)

The base pretrains once (seed 1337, configs/gpt-mini-lm.toml, 30 minutes by the clock) on
benchmarks/pretraining_helps.py's corpus of every allowed English text, built into RUNS/corpus; the seeds
vary the fine-tuning. Every run trains through the command line (`tformer train ... --resume auto`), so an
interrupted sweep continues where it stopped and a finished run is only read again; its output goes to
RUNS/<variant>/seed-S.log. The answers are generated greedily for the first --generate test problems
(default 200; all 1,319 with --generate 0), each prompt the chat template's user turn with the assistant's
turn opened, up to --max-new-tokens tokens or <|endoftext|>; they are written to RUN/gsm8k-answers.jsonl
(the base's to RUNS/gpt-mini-lm/gsm8k-answers.jsonl) and read again when there. Seconds per step: the median
over the run's steps of its tokens per step (its log's "training" line) over that step's tokens per second
(metrics.jsonl, one record a step).

Prints a Markdown table (and writes RUNS/gsm8k-sft.json), and the ratio of LoRA's and QLoRA's held-out loss
to full fine-tuning's, seed by seed. A sweep's seconds per step are those of its runs, which share the host with
whatever else runs; `costs` measures each method alone: a run of --cost-steps steps each (RUNS/costs/<variant>,
made afresh), one after another, without evaluation or checkpoints, and prints their parameters, peak memory and
median seconds per step side by side (run it on an otherwise idle host).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_roots import data_file  # noqa: E402
from pretraining_helps import build_corpus  # noqa: E402
from run_costs import peak_memory_mib, records, seconds_per_step, trained_parameters  # noqa: E402

import tformer  # noqa: E402
from tformer.adapters import adapter_parameters, load_adapter  # noqa: E402
from tformer.data.chat import chat_template, read_chat  # noqa: E402
from tformer.quantization import quantize  # noqa: E402

LORA = ("adapter.rank=32", "adapter.alpha=64", 'adapter.targets=["all-linear", "lm_head"]', "training.lr=2e-3")
VARIANTS = {"full": (), "lora": LORA, "qlora": (*LORA, "adapter.quantize=int4")}  # configs/gsm8k-sft.toml's lines
FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)\s*$")  # GSM8K's final-answer line, at the very end of the answer


def run_command(command: list[str], log: Path) -> None:
    """Run a `tformer train` command with its output appended to LOG; a failure stops the sweep naming LOG."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(f"{command[3]} exited {result.returncode}; see {log}")


def train_command(config: str, out: Path, settings: list[str],
                  start: tuple[str, ...] = ("--resume", "auto")) -> list[str]:
    """``tformer train CONFIG --out OUT`` with SETTINGS; START: continue a run there (default) or ``--overwrite``."""
    command = [sys.executable, "-m", "tformer", "train", str(ROOT / "configs" / config), "--out", str(out),
               *start, "--no-progress"]
    for setting in settings:
        command += ["--set", setting]
    return command


def cut(steps: int | None) -> list[str]:
    """Settings that cut a run to STEPS steps, evaluated (on 2 batches: a smoke test's) and saved at its end (none
    without a cut)."""
    if steps is None:
        return []
    return [f"training.max_steps={steps}", f"training.eval_every={steps}", f"training.checkpoint_every={steps}",
            "training.warmup_steps=0", "training.eval_batches=2"]


def pretrain(runs: Path, threads: int, steps: int | None) -> Path:
    """The base: configs/gpt-mini-lm.toml on the corpus (built once into RUNS/corpus)."""
    corpus = runs / "corpus" / "corpus.txt"
    if not corpus.is_file():
        build_corpus(corpus.parent)
    out = runs / "gpt-mini-lm"
    run_command(train_command("gpt-mini-lm.toml", out, [f"data.train={corpus}", f"training.threads={threads}",
                                                        *cut(steps)]), runs / "gpt-mini-lm.log")
    return out


def finetune(variant: str, seed: int, base: Path, runs: Path, threads: int, steps: int | None) -> Path:
    out = runs / variant / f"seed-{seed}"
    settings = [f"model.init_from={base}", f"training.seed={seed}", f"training.threads={threads}",
                *VARIANTS[variant], *cut(steps)]
    run_command(train_command("gsm8k-sft.toml", out, settings), runs / variant / f"seed-{seed}.log")
    return out


def costs(variants: list[str], base: Path, runs: Path, threads: int, steps: int) -> None:
    """Each variant's cost alone: STEPS steps (no evaluation, no checkpoint), one variant after another."""
    quiet = [f"training.max_steps={steps}", "training.eval_every=1000000", "training.eval_batches=1",
             "training.checkpoint_every=1000000", "training.warmup_steps=0"]
    print(f"| method | trained parameters | peak memory MiB | s / step (median of {steps}) |\n|---|---:|---:|---:|")
    for variant in variants:
        out, log = runs / "costs" / variant, runs / "costs" / f"{variant}.log"
        log.unlink(missing_ok=True)
        settings = [f"model.init_from={base}", "training.seed=1", f"training.threads={threads}",
                    *VARIANTS[variant], *quiet]
        run_command(train_command("gsm8k-sft.toml", out, settings, start=("--overwrite",)), log)
        print(f"| {variant} | {trained_parameters(out):,} | {peak_memory_mib(out):,.0f} | "
              f"{seconds_per_step(out, log):.3f} |", flush=True)


def fine_tuned_model(variant: str, run: Path, base: Path):
    """The run's model: the run folder itself (full), or the base (int4 for QLoRA) with the run's adapter."""
    if variant == "full":
        return tformer.load(run)
    model = tformer.load(base)
    if variant == "qlora":
        quantize(model, "int4")
    return load_adapter(model, run)


@torch.no_grad()
def answers(model, folder: Path, problems: list[dict], max_new_tokens: int, batch_size: int = 16) -> list[str]:
    """Greedy answers of ``model`` to ``problems`` (rows of the test file), each prompt the chat template's user
    turn with the assistant's turn opened, left-padded in batches."""
    model.eval()
    tokenizer = model.tokenizer
    template = chat_template(folder, "auto", tokenizer)
    eos = tokenizer.eos_token_id
    texts = []
    for start in range(0, len(problems), batch_size):
        prompts = [tokenizer.encode(template.render([{"role": "user", "content": problem["question"]}],
                                                    add_generation_prompt=True), add_special_tokens=False)
                   for problem in problems[start:start + batch_size]]
        width = max(map(len, prompts))
        ids = torch.tensor([[eos] * (width - len(prompt)) + prompt for prompt in prompts])  # (B, T) left-padded
        mask = torch.tensor([[0] * (width - len(prompt)) + [1] * len(prompt) for prompt in prompts])
        out = tformer.generate(model, ids, max_new_tokens, attention_mask=mask, eos_token_id=eos)
        for row in out[:, width:].tolist():
            row = row[:row.index(eos)] if eos in row else row
            texts.append(tokenizer.decode(row, skip_special_tokens=True))
    return texts


def final_number(text: str) -> str | None:
    """The number of a "#### <number>" line that ends ``text`` (commas dropped), or None."""
    match = FINAL.search(text.strip())
    return None if match is None else match.group(1).replace(",", "")


def answer_scores(model, folder: Path, out: Path, problems: list[dict], max_new_tokens: int) -> dict:
    """The share of answers in GSM8K's format and of those whose number is the reference's; the answers are kept
    in OUT (read again when it holds as many for the same settings)."""
    settings = {"problems": len(problems), "max_new_tokens": max_new_tokens}
    kept = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] if out.is_file() else []
    if not (kept and kept[0] == settings and len(kept) == len(problems) + 1):
        texts = answers(model, folder, problems, max_new_tokens)
        kept = [settings] + [{"question": problem["question"], "answer": text}
                             for problem, text in zip(problems, texts, strict=True)]
        out.write_text("".join(json.dumps(row) + "\n" for row in kept), encoding="utf-8")
    numbers = [final_number(row["answer"]) for row in kept[1:]]
    references = [final_number(problem["answer"]) for problem in problems]
    formatted = sum(number is not None for number in numbers)
    correct = sum(number is not None and number == reference for number, reference in zip(numbers, references,
                                                                                            strict=True))
    return {"format_share": formatted / len(problems), "exact_match": correct / len(problems)}


def test_problems(count: int) -> list[dict]:
    test = data_file("gsm8k/test.jsonl")
    read_chat(test)  # the rows the sft task reads, checked (question/answer, text)
    rows = [json.loads(line) for line in test.read_text(encoding="utf-8").splitlines() if line]
    return rows if count == 0 else rows[:count]


def summary(variant: str, rows: list[dict]) -> dict:
    def values(key: str) -> list[float]:
        return [row[key] for row in rows]
    return {"variant": variant, "seeds": values("seed"), "eval_loss": values("eval_loss"),
            "format_share": values("format_share"), "exact_match": values("exact_match"),
            "trained": rows[0]["trained"], "total": rows[0]["total"], "peak_memory_mib": values("peak_memory_mib"),
            "seconds_per_step": values("seconds_per_step")}


def mean(numbers: list[float]) -> float:
    return statistics.fmean(numbers)


def table(rows: list[dict], before: dict) -> str:
    lines = ["| method | seeds | held-out answer-token loss (mean, range) | answers ending in `#### <number>` "
             f"(base: {100 * before['format_share']:.1f}%) | exact match (base: {100 * before['exact_match']:.1f}%) "
             "| trained parameters | peak memory MiB | s / step |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        losses = row["eval_loss"]
        lines.append(f"| {row['variant']} | {len(losses)} | {mean(losses):.4f} ({min(losses):.4f}-{max(losses):.4f}) "
                     f"| {100 * mean(row['format_share']):.1f}% | {100 * mean(row['exact_match']):.1f}% "
                     f"| {row['trained']:,} ({100 * row['trained'] / row['total']:.2f}%) "
                     f"| {mean(row['peak_memory_mib']):,.0f} | {mean(row['seconds_per_step']):.2f} |")
    return "\n".join(lines)


def ratios(rows: list[dict]) -> list[str]:
    """Each adapter method's held-out loss over full fine-tuning's, seed by seed."""
    by_variant = {row["variant"]: dict(zip(row["seeds"], row["eval_loss"], strict=True)) for row in rows}
    full = by_variant.get("full", {})
    lines = []
    for variant in ("lora", "qlora"):
        pairs = [(seed, loss / full[seed]) for seed, loss in by_variant.get(variant, {}).items() if seed in full]
        if pairs:
            shown = ", ".join(f"seed {seed}: {ratio:.4f}" for seed, ratio in pairs)
            lines.append(f"{variant} / full held-out loss: {shown} (mean {mean([r for _, r in pairs]):.4f})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", nargs="?", choices=("pretrain", "costs"),
                        help="pretrain: the base only; costs: each method's step cost alone; left out: the sweep")
    parser.add_argument("--cost-steps", type=int, default=12, help="steps of each costs run (default: 12)")
    parser.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds 1..N (default: 3)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "gsm8k-sft", help="where the runs go")
    parser.add_argument("--threads", type=int, default=2, help="training threads (default: 2)")
    parser.add_argument("--max-steps", type=int, help="cut every fine-tuning run to this many steps (a smoke test)")
    parser.add_argument("--pretrain-steps", type=int, help="cut the pretraining to this many steps (a smoke test)")
    parser.add_argument("--generate", type=int, default=200, metavar="N",
                        help="test problems to answer for the format share and exact match (0: all 1,319)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="the longest answer generated")
    args = parser.parse_args()
    if args.seeds < 1 or args.generate < 0 or args.max_new_tokens < 1 or args.cost_steps < 1:
        parser.error("--seeds, --max-new-tokens and --cost-steps must be at least 1, --generate at least 0")
    for option, value in (("--max-steps", args.max_steps), ("--pretrain-steps", args.pretrain_steps)):
        if value is not None and value < 1:
            parser.error(f"{option} must be at least 1")
    torch.set_num_threads(args.threads)
    started = time.time()
    base = pretrain(args.runs, args.threads, args.pretrain_steps)
    if args.step == "pretrain":
        return
    if args.step == "costs":
        costs(args.variants, base, args.runs, args.threads, args.cost_steps)
        return
    problems = test_problems(args.generate)
    base_model = tformer.load(base)
    total = base_model.num_parameters()
    before = answer_scores(base_model, base, base / "gsm8k-answers.jsonl", problems, args.max_new_tokens)
    print(f"base {base}: {100 * before['format_share']:.1f}% of {len(problems)} answers end in '#### <number>', "
          f"exact match {100 * before['exact_match']:.1f}%", flush=True)
    rows = []
    for variant in args.variants:
        results = []
        for seed in range(1, args.seeds + 1):
            run = finetune(variant, seed, base, args.runs, args.threads, args.max_steps)
            model = fine_tuned_model(variant, run, base)
            trained = model.num_parameters() if variant == "full" else adapter_parameters(model)
            losses = [record["eval_loss"] for record in records(run) if "eval_loss" in record]
            result = {"variant": variant, "seed": seed, "eval_loss": losses[-1], "trained": trained, "total": total,
                      "peak_memory_mib": peak_memory_mib(run),
                      "seconds_per_step": seconds_per_step(run, args.runs / variant / f"seed-{seed}.log"),
                      **answer_scores(model, base, run / "gsm8k-answers.jsonl", problems, args.max_new_tokens)}
            print(f"{variant} seed {seed}: held-out loss {result['eval_loss']:.4f}, "
                  f"{100 * result['format_share']:.1f}% formatted, exact match {100 * result['exact_match']:.1f}%, "
                  f"{trained:,} trained, peak {result['peak_memory_mib']:,.0f} MiB, "
                  f"{result['seconds_per_step']:.2f} s/step", flush=True)
            results.append(result)
        rows.append(summary(variant, results))
    print(f"\n{len(problems)} test problems answered; {(time.time() - started) / 60:.1f} min for this call\n")
    print(table(rows, before))
    for line in ratios(rows):
        print(line)
    (args.runs / "gsm8k-sft.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d"), "max_steps": args.max_steps, "pretrain_steps": args.pretrain_steps,
         "problems": len(problems), "max_new_tokens": args.max_new_tokens, "base": before, "rows": rows},
        indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
