"""Training throughput: tformer's DecoderLM against Hugging Face's GPT2LMHeadModel (sdpa attention).

Both models get the same shapes, dropout 0, the same fused torch AdamW, and the same batches. Steps
alternate between the two (tformer, HF, HF, tformer, ...) so both see the same machine load; the
figures are medians over the measured steps after warm-up. The closing ratio of tformer in bf16 to
HF in fp32 (shape a) is measured the same way, the two alternating in one run of their own.
Model-FLOP utilisation (MFU) is taken against fp32 and bf16 matrix-multiply peaks measured in the
same run.

    python benchmarks/train_throughput.py                 # both shapes, fp32 and bf16
    python benchmarks/train_throughput.py --shapes b --steps 10

On a CPU without native bf16 matrix units (no AVX512-BF16 / AMX: PyTorch then multiplies bf16
matrices with a generic kernel, several times slower than fp32), bf16 rows run only a few steps,
and a shape whose estimated bf16 step exceeds --max-bf16-step-seconds is skipped with the estimate.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from tformer.training.trainer import native_bf16_matmul

SHAPES = {
    "a": dict(num_layers=12, d_model=768, num_heads=12, vocab_size=50257, seq_len=256, batch_size=4),
    "b": dict(num_layers=6, d_model=384, num_heads=6, vocab_size=8192, seq_len=256, batch_size=8),
}


@dataclass
class Shape:
    num_layers: int
    d_model: int
    num_heads: int
    vocab_size: int
    seq_len: int
    batch_size: int

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 x (non-embedding matmul parameters + LM head) plus attention
        scores and weighted sums (Kaplan et al. 2020, forward 2N + 2 n_layer n_ctx d_attn, x3 for backward)."""
        d, layers = self.d_model, self.num_layers
        matmul_parameters = layers * 12 * d * d + d * self.vocab_size
        attention = 2 * layers * self.seq_len * d  # per token, forward: QK^T and AV, causal half not discounted
        return 3 * (2 * matmul_parameters + attention)


def build_tformer(shape: Shape):
    import tformer

    return tformer.build_model(
        "gpt2", vocab_size=shape.vocab_size, max_seq_len=shape.seq_len, d_model=shape.d_model,
        num_layers=shape.num_layers, num_heads=shape.num_heads, dropout=0.0,
    )


def build_hf(shape: Shape):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=shape.vocab_size, n_positions=shape.seq_len, n_embd=shape.d_model, n_layer=shape.num_layers,
        n_head=shape.num_heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config, attn_implementation="sdpa") if _accepts_attn(GPT2LMHeadModel) else (
        GPT2LMHeadModel(config)
    )


def _accepts_attn(cls) -> bool:
    import inspect

    return "attn_implementation" in inspect.signature(cls.__init__).parameters


def matmul_peak(dtype: torch.dtype, size: int = 2048, repeats: int = 7) -> float:
    """Median GFLOP/s of a square matrix multiply on this machine."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    for _ in range(2):
        a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times) / 1e9


def make_step(model, precision: str):
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else nullcontext

    def step(input_ids: torch.Tensor) -> float:
        start = time.perf_counter()
        with autocast():
            loss = model(input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    return step


def measure(shape: Shape, runs: dict[str, tuple[Callable[[Shape], torch.nn.Module], str]], steps: int,
            warmup: int) -> dict[str, float]:
    """Tokens/s of each run (a model builder and a precision), median over ``steps`` measured
    steps after ``warmup``, the runs' steps alternating on the same batches."""
    torch.manual_seed(0)
    steppers = {name: make_step(build(shape), precision) for name, (build, precision) in runs.items()}
    times: dict[str, list[float]] = {name: [] for name in steppers}
    generator = torch.Generator().manual_seed(0)
    for index in range(warmup + steps):
        input_ids = torch.randint(0, shape.vocab_size, (shape.batch_size, shape.seq_len), generator=generator)
        order = list(steppers) if index % 2 == 0 else list(reversed(steppers))
        for name in order:
            elapsed = steppers[name](input_ids)
            if index >= warmup:
                times[name].append(elapsed)
    return {name: shape.tokens / statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="ab", help="which shapes: a, b or ab (default ab)")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--steps", type=int, default=12, help="measured steps per model (default 12)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max-bf16-step-seconds", type=float, default=120.0)
    args = parser.parse_args()

    torch.set_float32_matmul_precision("highest")
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads")
    precisions = args.precisions.split(",")
    peaks = {name: matmul_peak(dtype) for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
             if name in precisions}
    print("matmul peak: " + ", ".join(f"{name} {peak:.1f} GFLOP/s" for name, peak in peaks.items())
          + " (2048^3, median of 7)")
    native_bf16 = native_bf16_matmul()
    print(f"native bf16 matmul (oneDNN, AVX512-BF16/AMX): {'yes' if native_bf16 else 'no'}; "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}\n")
    header = (f"{'shape':<6}{'precision':<10}{'tformer tok/s':>14}{'HF tok/s':>10}{'ratio':>7}"
              f"{'tformer MFU':>13}{'HF MFU':>8}")
    print(header)
    print("-" * len(header))
    results = {}
    for key in args.shapes:
        shape = Shape(**SHAPES[key])
        for precision in precisions:
            steps, warmup = args.steps, args.warmup
            if precision == "bf16" and not native_bf16:
                estimate = shape.flops_per_token() * shape.tokens / (peaks["bf16"] * 1e9)
                if estimate > args.max_bf16_step_seconds:
                    print(f"{key:<6}{precision:<10}skipped: one step would take about {estimate:.0f} s per model "
                          f"at the measured bf16 peak (limit --max-bf16-step-seconds {args.max_bf16_step_seconds:.0f})")
                    continue
                steps, warmup = min(steps, 3), 1
            rates = measure(shape, {"tformer": (build_tformer, precision), "hf": (build_hf, precision)}, steps, warmup)
            results[key, precision] = steps, warmup
            flops = shape.flops_per_token()
            print(f"{key:<6}{precision:<10}{rates['tformer']:>14,.0f}{rates['hf']:>10,.0f}"
                  f"{rates['tformer'] / rates['hf']:>7.2f}{rates['tformer'] * flops / peaks[precision] / 1e9:>12.0%}"
                  f"{rates['hf'] * flops / peaks[precision] / 1e9:>8.0%}", flush=True)
    if ("a", "bf16") in results and ("a", "fp32") in results:
        steps, warmup = results["a", "bf16"]  # as many as the bf16 row measured
        rates = measure(Shape(**SHAPES["a"]), {"tformer bf16": (build_tformer, "bf16"), "HF fp32": (build_hf, "fp32")},
                        steps, warmup)
        print(f"\nshape a: tformer bf16 step vs HF fp32 step, {steps} alternated steps each after {warmup} warm-up: "
              f"{rates['tformer bf16'] / rates['HF fp32']:.2f}x")


if __name__ == "__main__":
    main()
