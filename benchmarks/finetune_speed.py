"""Fine-tuning a GPT-2-124M-shaped decoder on the CPU in float32 (issue 56's acceptance): tformer's full fine-tuning,
LoRA and QLoRA steps beside Hugging Face's GPT2LMHeadModel with a PEFT LoRA adapter, on one fixed batch.

    python benchmarks/finetune_speed.py                      # time and memory, GPT-2's default shape
    python benchmarks/finetune_speed.py --memory-only         # peak memory alone (a busy machine does not change it)
    python benchmarks/finetune_speed.py --quick               # a tiny shape: checks that every part runs

The model: transformers' ``GPT2Config()`` shape (12 layers, width 768, 12 heads, vocabulary 50257; 124M
parameters) with random weights (seed 0), saved as a Hugging Face folder that both sides load, tformer through its
interop (``tformer.load``), so both hold the same weights. The batch: 4 rows of 256 token ids (seed 0), labels = the
ids (next-token loss), dropout as GPT2Config has it (0.1), models in training mode.

The four steps (forward, loss, backward, optimizer step, gradients set to None):
  full      tformer, every parameter trains
  lora      tformer, rank 8, alpha 16 over c_attn, c_proj and c_fc (attention and feed-forward)
  qlora     as lora over tformer's int4 base (group size --group-size; the tied token table int8 beside it)
  hf-peft   GPT2LMHeadModel + peft LoraConfig(r=8, lora_alpha=16, target_modules=[c_attn, c_proj, c_fc])
Every step uses the same optimizer: torch.optim.AdamW (fused), lr 1e-4, over the parameters that train. tformer's
steps take the loss without the logits (``model(ids, labels=ids, return_logits=False)``: ``losses.head_loss``, a
frozen head's logits a few positions at a time, a trained head's whole at this size; the lm and sft tasks take their
loss the same way); hf-peft's is GPT2LMHeadModel's loss over the whole logits, as Hugging Face's Trainer takes it.

Time: one process holds all four, and runs them interleaved round by round (``timing.interleaved``: machine noise
hits them alike), each after one warm-up step; the medians of the rounds are reported, with each step's ratio to
hf-peft's (above 1: faster than hf-peft).

Memory: each step runs in a process of its own (so one model's memory does not hide another's), reading the
process's peak resident set, the figure tformer's training reports (``tformer.memory.peak_memory``: getrusage's
ru_maxrss, the kernel's high-water mark of the process's resident pages). After the model and optimizer are built,
and before the first step, the mark is reset to the memory then resident (Linux: /proc/self/clear_refs), so it
covers the step loop alone (--memory-steps steps, the optimizer's state made in the first), not a float model that
quantization replaced. The mark is read as /proc/self/status's VmHWM: ru_maxrss is the same mark but also carries the
peak of the process that started this one across exec (this script's, holding a model), which would hide smaller
peaks. The peak includes what the process holds besides the model (the interpreter and the libraries: "resident
before" shows it at the reset). Ratios are to full's peak.

glibc's malloc (the CPU allocator PyTorch calls) serves tensors of up to 32 MiB from its heap once larger blocks
have been freed (its mmap threshold moves up), and keeps freed heap memory resident: a step's activations then stay
resident after the step and the next step's are placed beside them, so the resident peak grows over the first steps
by up to the activations' size again (--glibc-default prints each step's peak: the second's is above the first's).
Each memory process therefore runs with MALLOC_MMAP_THRESHOLD_=65536 (blocks above 64 KiB mapped and unmapped one by
one), so its peak is what the step holds at once, the same in every step; --glibc-default measures with glibc's
defaults instead.

Two more memory rows run the same steps with tformer's activation checkpointing on (each block's activations
recomputed in the backward pass: ``training.activation_checkpointing``, ``nn.stack.set_activation_checkpointing``):
full-ckpt and qlora-ckpt (QLoRA as it is usually run: PEFT's prepare_model_for_kbit_training turns gradient
checkpointing on by default). They are not timed.

Acceptance (issue 56): qlora's peak <= 0.5x full's; lora's step >= 1.2x hf-peft's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import interleaved  # noqa: E402

KINDS = ("full", "lora", "qlora", "hf-peft")  # timed, and measured for memory
MEMORY_KINDS = (*KINDS, "full-ckpt", "qlora-ckpt")  # "-ckpt": with activation checkpointing
FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # glibc: blocks above 64 KiB mapped, and unmapped when freed
TARGETS = ["c_attn", "c_proj", "c_fc"]  # GPT-2's attention and feed-forward projections, by their HF names
RANK, ALPHA, LR = 8, 16, 1e-4
QUICK_SHAPE = {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512, "n_positions": 128, "bos_token_id": 511,
               "eos_token_id": 511}


def write_base(folder: Path, quick: bool) -> None:
    """A GPT-2-shaped Hugging Face folder of random weights (seed 0)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(**QUICK_SHAPE) if quick else GPT2Config()
    GPT2LMHeadModel(config).save_pretrained(folder)


def batch(folder: Path, rows: int, length: int) -> torch.Tensor:
    """The fixed batch of token ids (rows, length), seed 0."""
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    return torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(0))


def build(kind: str, folder: Path, group_size: int):
    """The model of ``kind`` in training mode, and a function running one training step on a batch."""
    kind, checkpointing = kind.removesuffix("-ckpt"), kind.endswith("-ckpt")
    if kind == "hf-peft":
        from peft import LoraConfig, get_peft_model
        from transformers import GPT2LMHeadModel

        model = get_peft_model(GPT2LMHeadModel.from_pretrained(folder),
                               LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS,
                                          fan_in_fan_out=True))

        def loss(ids: torch.Tensor) -> torch.Tensor:
            return model(input_ids=ids, labels=ids).loss
    else:
        import tformer
        from tformer.adapters import add_lora
        from tformer.quantization import scheme_for

        model = tformer.load(folder, quantize=scheme_for("int4", group_size) if kind == "qlora" else None)
        if kind != "full":
            add_lora(model, rank=RANK, alpha=ALPHA, targets=TARGETS)
        if checkpointing:
            from tformer.nn.stack import set_activation_checkpointing

            set_activation_checkpointing(model)

        def loss(ids: torch.Tensor) -> torch.Tensor:
            return model(ids, labels=ids, return_logits=False).loss
    model.train()
    trained = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=LR, fused=True)

    def step(ids: torch.Tensor) -> float:
        value = loss(ids)
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return value.item()

    return model, step, sum(parameter.numel() for parameter in trained)


def reset_peak() -> None:
    """Reset this process's peak resident set to what is resident now (Linux's /proc/self/clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_resident() -> int:
    """This process's peak resident set in bytes since the last reset (VmHWM: ru_maxrss's mark, without what it
    carries over from the process that started this one)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("/proc/self/status has no VmHWM: the memory figures need Linux")


def measure_memory(kind: str, folder: Path, rows: int, length: int, steps: int, group_size: int) -> dict:
    """Peak resident memory over ``steps`` training steps of ``kind`` (run in a process of its own), and the peak of
    each step."""
    _, step, trained = build(kind, folder, group_size)
    ids = batch(folder, rows, length)
    reset_peak()
    resident_before = peak_resident()
    losses, step_peaks = [], []
    for _ in range(steps):
        losses.append(step(ids))
        step_peaks.append(peak_resident())
    return {"kind": kind, "peak_bytes": peak_resident(), "resident_before_bytes": resident_before,
            "peak_after_each_step": step_peaks, "trained_parameters": trained, "losses": losses}


def memory_in_processes(folder: Path, args) -> dict[str, dict]:
    """Each kind's ``measure_memory`` in a fresh Python process, one after another."""
    found = {}
    environment = {**os.environ, **({} if args.glibc_default else FIXED_MMAP)}
    for kind in MEMORY_KINDS:
        command = [sys.executable, __file__, "--memory-child", kind, "--folder", str(folder),
                   "--rows", str(args.rows), "--length", str(args.length), "--memory-steps", str(args.memory_steps),
                   "--group-size", str(args.group_size), "--threads", str(args.threads)]
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
        if done.returncode != 0:
            raise SystemExit(f"the {kind} memory run failed:\n{done.stderr[-3000:]}")
        found[kind] = json.loads(done.stdout.strip().splitlines()[-1])
        steps = ", ".join(f"{peak / 2**20:,.0f}" for peak in found[kind]["peak_after_each_step"])
        print(f"memory {kind}: peak {found[kind]['peak_bytes'] / 2**20:,.0f} MiB (after each step: {steps})",
              flush=True)
    return found


def time_steps(folder: Path, args) -> dict[str, float]:
    """Median seconds per step of each kind, interleaved in this process."""
    ids = batch(folder, args.rows, args.length)
    steps = {kind: build(kind, folder, args.group_size)[1] for kind in KINDS}  # all four held at once
    times = interleaved({kind: (lambda step=step: step(ids)) for kind, step in steps.items()},
                        rounds=args.rounds, steps=args.steps)
    return {kind: statistics.median(seconds) for kind, seconds in times.items()}


def print_table(seconds: dict[str, float] | None, memory: dict[str, dict] | None) -> None:
    header = f"{'step':<10} {'trained':>11}"
    if seconds:
        header += f" {'s/step':>9} {'speed vs hf-peft':>17}"
    if memory:
        header += f" {'peak MiB':>9} {'vs full':>8} {'resident before':>16}"
    print(header)
    for kind in MEMORY_KINDS if memory else KINDS:
        line = f"{kind:<10} {memory[kind]['trained_parameters']:>11,}" if memory else f"{kind:<10} {'':>11}"
        if seconds:
            line += (f" {seconds[kind]:>9.3f} {seconds['hf-peft'] / seconds[kind]:>16.2f}x" if kind in seconds
                     else f" {'':>9} {'':>17}")
        if memory:
            peak = memory[kind]["peak_bytes"]
            line += (f" {peak / 2**20:>9,.0f} {peak / memory['full']['peak_bytes']:>7.2f}x"
                     f" {memory[kind]['resident_before_bytes'] / 2**20:>12,.0f} MiB")
        print(line)
    if memory:
        print("peak: each process's resident set over its step loop"
              + ("" if memory.get("glibc_default") else " (MALLOC_MMAP_THRESHOLD_=65536)"))
    if seconds:
        print(f"acceptance: lora {seconds['hf-peft'] / seconds['lora']:.2f}x hf-peft's speed (>= 1.2x)")
    if memory:
        full = memory["full"]["peak_bytes"]
        print(f"acceptance: qlora {memory['qlora']['peak_bytes'] / full:.2f}x full's peak memory (<= 0.5x); "
              f"qlora-ckpt {memory['qlora-ckpt']['peak_bytes'] / full:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny GPT-2 shape and batch (a smoke test)")
    parser.add_argument("--memory-only", action="store_true", help="peak memory alone, no timing")
    parser.add_argument("--time-only", action="store_true", help="timing alone, no memory processes")
    parser.add_argument("--rows", type=int, help="batch rows (default 4; 2 with --quick)")
    parser.add_argument("--length", type=int, help="tokens per row (default 256; 32 with --quick)")
    parser.add_argument("--rounds", type=int, help="timing rounds (default 5; 2 with --quick)")
    parser.add_argument("--steps", type=int, default=1, help="steps per round")
    parser.add_argument("--memory-steps", type=int, default=3, help="steps each memory process runs")
    parser.add_argument("--group-size", type=int, default=32, help="int4 group size of the QLoRA base")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (every process)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--glibc-default", action="store_true",
                        help="measure memory with glibc's malloc defaults (not MALLOC_MMAP_THRESHOLD_=65536)")
    parser.add_argument("--memory-child", choices=MEMORY_KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.rows = args.rows or (2 if args.quick else 4)
    args.length = args.length or (32 if args.quick else 256)
    args.rounds = args.rounds or (2 if args.quick else 5)
    torch.set_num_threads(args.threads)
    if args.memory_child:
        print(json.dumps(measure_memory(args.memory_child, args.folder, args.rows, args.length, args.memory_steps,
                                        args.group_size)))
        return
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work) / "gpt2"
        write_base(folder, args.quick)
        layers = json.loads((folder / "config.json").read_text())["n_layer"]
        print(f"GPT-2 shape{' (quick)' if args.quick else ''}: {layers} layers; batch {args.rows} x {args.length}; "
              f"{args.threads} threads; torch {torch.__version__}",
              flush=True)
        memory = None if args.time_only else memory_in_processes(folder, args)
        if memory is not None:
            memory["glibc_default"] = args.glibc_default
        seconds = None if args.memory_only else time_steps(folder, args)
    print_table(seconds, memory)
    if args.out:
        args.out.write_text(json.dumps({"seconds_per_step": seconds, "memory": memory, "rows": args.rows,
                                        "length": args.length, "quick": args.quick, "threads": args.threads,
                                        "group_size": args.group_size}, indent=2) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
