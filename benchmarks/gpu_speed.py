"""tformer beside Hugging Face transformers on one CUDA GPU, in one process, interleaved round by round:
the figures of docs/gpu.md.

    python benchmarks/gpu_speed.py                       # every part
    python benchmarks/gpu_speed.py --parts train decode  # some of them

Every model is randomly initialised by Hugging Face, written with ``save_pretrained`` and read by
``tformer.load``: the same weights on both sides. Parts:
  ceilings   a bf16 8192^3 matrix product and a 2 GiB device-to-device copy: the card's measured rates
  train      GPT-2 124M shape, batch 8 x 1024, bf16 autocast, fused AdamW: tokens/s and model-FLOP utilisation
  decode     greedy batch 1, 32-token prompt, 128 new tokens, fp32 and bf16: new tokens/s, identical tokens?
  batch      64 prompts of 32 tokens, 128 new tokens each, bf16: HF generate on the batch, tformer.generate on
             the batch, and tformer's serving Engine (continuous batching over its paged cache)
  encoder    bert-base sequence classification inference, batch 64 x 128, fp32 and bf16: examples/s
  attention  one GPT-2-width layer per tformer attention kernel (and ALiBi through sdpa: FlexAttention's path),
             forward + backward in bf16 at 1024 and 4096
             tokens (no peer: the kernels against each other)
Timings wait for the GPU (``torch.cuda.synchronize``) before the clock is read; medians over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tformer  # noqa: E402
from benchmarks.timing import interleaved  # noqa: E402

PARTS = ("ceilings", "train", "decode", "encoder", "attention", "batch")


def synchronized(function):
    """``function`` timed to the end of its GPU work."""
    def call():
        result = function()
        torch.cuda.synchronize()
        return result
    return call


def median_seconds(work: dict, rounds: int, steps: int = 1) -> dict[str, float]:
    times = interleaved({name: synchronized(function) for name, function in work.items()}, rounds, steps)
    return {name: statistics.median(values) for name, values in times.items()}


def shared_weights(hf_model, **load_options):
    """tformer's model holding ``hf_model``'s weights (through save_pretrained and tformer.load)."""
    with tempfile.TemporaryDirectory() as folder:
        hf_model.save_pretrained(folder)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tformer.load(folder, **load_options)


def gpt2(dtype: torch.dtype = torch.float32, **sizes):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                        eos_token_id=0, pad_token_id=0, **sizes)
    hf = GPT2LMHeadModel(config)
    hf.generation_config.eos_token_id = None  # exactly the asked-for tokens on both sides
    ours = shared_weights(hf)
    return hf.to("cuda", dtype), ours.to("cuda", dtype)


# ---- parts -----------------------------------------------------------------------------------------------


def ceilings(rounds: int) -> dict[str, float]:
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    source = torch.randn(2 ** 29, device="cuda")  # 2 GiB of float32
    target = torch.empty_like(source)
    seconds = median_seconds({"matmul": lambda: a @ b, "copy": lambda: target.copy_(source)}, rounds, steps=10)
    rates = {"bf16 TFLOP/s": 2 * 8192 ** 3 / seconds["matmul"] / 1e12,
             "copy TB/s (read + write)": 2 * source.numel() * 4 / seconds["copy"] / 1e12}
    for name, value in rates.items():
        print(f"  {name}: {value:.1f}")
    return rates


def train(rounds: int, peak_tflops: float | None) -> None:
    batch, length = 8, 1024
    hf, ours = gpt2(n_embd=768, n_layer=12, n_head=12, vocab_size=50257)
    hf.train(), ours.train()
    tokens = torch.randint(0, 50257, (batch, length), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    optimizers = {model: torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True) for model in (hf, ours)}

    def step(model):
        def run():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(tokens, labels=tokens).loss
            loss.backward()
            optimizers[model].step()
            optimizers[model].zero_grad(set_to_none=True)
        return run

    seconds = median_seconds({"HF": step(hf), "tformer": step(ours)}, rounds, steps=3)
    parameters = sum(p.numel() for p in ours.parameters())
    flops_per_token = 6 * parameters + 12 * 12 * 768 * length  # weights, and attention's scores and mixing
    for name, value in seconds.items():
        rate = batch * length / value
        mfu = f", MFU {rate * flops_per_token / (peak_tflops * 1e12):.0%} of the measured bf16 peak" \
            if peak_tflops else ""
        print(f"  {name}: {value * 1000:.1f} ms/step, {rate:,.0f} tokens/s{mfu}")
    print(f"  tformer / HF speed: {seconds['HF'] / seconds['tformer']:.2f}x")


def decode(rounds: int) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        decode_in(dtype, rounds)


def decode_in(dtype: torch.dtype, rounds: int, new: int = 128) -> None:
    hf, ours = gpt2(dtype, n_embd=768, n_layer=12, n_head=12, vocab_size=50257)
    hf.eval(), ours.eval()
    prompt = torch.randint(0, 50257, (1, 32), generator=torch.Generator().manual_seed(1)).cuda()
    mask = torch.ones_like(prompt)

    def run_hf(count=new):
        with torch.inference_mode():
            return hf.generate(prompt, attention_mask=mask, max_new_tokens=count, min_new_tokens=count,
                               do_sample=False, pad_token_id=0)

    def run_ours(count=new):
        return tformer.generate(ours, prompt, count, eos_token_id=[])

    run_hf(8), run_ours(8)
    seconds = median_seconds({"HF": run_hf, "tformer": run_ours}, rounds)
    same = torch.equal(run_hf(), run_ours())
    print(f"  {str(dtype).removeprefix('torch.')}: HF {new / seconds['HF']:.0f} tokens/s, tformer "
          f"{new / seconds['tformer']:.0f} tokens/s, tformer / HF {seconds['HF'] / seconds['tformer']:.2f}x, "
          f"identical tokens: {same}")


def batch(rounds: int) -> None:
    from tformer.generation import GenerationConfig
    from tformer.serving.engine import Engine

    count, new = 64, 128
    hf, ours = gpt2(torch.bfloat16, n_embd=768, n_layer=12, n_head=12, vocab_size=50257)
    hf.eval(), ours.eval()
    prompts = torch.randint(0, 50257, (count, 32), generator=torch.Generator().manual_seed(2)).cuda()
    mask = torch.ones_like(prompts)
    engine = Engine(ours, cache_tokens=count * (32 + new) + 1024, block_size=16, max_running=count,
                    prefix_caching=False)
    config = GenerationConfig(max_new_tokens=new, eos_token_id=())
    as_lists = prompts.tolist()

    def run_hf():
        with torch.inference_mode():
            return hf.generate(prompts, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                               do_sample=False, pad_token_id=0)

    work = {"HF generate": run_hf,
            "tformer generate": lambda: tformer.generate(ours, prompts, new, eos_token_id=[]),
            "tformer Engine": lambda: engine.complete(as_lists, config)}
    for function in work.values():
        function()
    seconds = median_seconds(work, rounds)
    for name, value in seconds.items():
        print(f"  {name}: {count * new / value:,.0f} new tokens/s ({value:.2f} s)")
    print(f"  tformer generate / HF: {seconds['HF generate'] / seconds['tformer generate']:.2f}x, "
          f"Engine / HF: {seconds['HF generate'] / seconds['tformer Engine']:.2f}x")


def encoder(rounds: int) -> None:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    hf_float = BertForSequenceClassification(BertConfig(num_labels=2))
    ours_float = shared_weights(hf_float)
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randint(1000, 30522, (64, 128), generator=generator).cuda()
    mask = torch.ones_like(inputs)
    mask[::2, 96:] = 0  # half the rows padded after 96 tokens
    for dtype in (torch.float32, torch.bfloat16):
        hf = hf_float.to("cuda", dtype).eval()
        ours = ours_float.to("cuda", dtype).eval()

        def infer(model):
            def run():
                with torch.inference_mode():
                    return model(input_ids=inputs, attention_mask=mask).logits
            return run

        seconds = median_seconds({"HF": infer(hf), "tformer": infer(ours)}, rounds, steps=5)
        agree = (infer(hf)().float() - infer(ours)().float()).abs().max().item()
        print(f"  {str(dtype).removeprefix('torch.')}: HF {64 / seconds['HF']:,.0f} examples/s, tformer "
              f"{64 / seconds['tformer']:,.0f} examples/s, tformer / HF {seconds['HF'] / seconds['tformer']:.2f}x, "
              f"largest logit difference {agree:.1e}")


def attention(rounds: int) -> None:
    # name: the layer's settings; "alibi" and "sliding_window" reach FlexAttention (their kernels' gpu_flex path),
    # "flex" is the kernel itself over plain causality; issue 58 wants alibi and the window within 1.25x of sdpa
    kernels = {"sdpa": {}, "reference": {}, "chunked": {},
               "sliding_window": dict(attention_kernel="sliding_window", attention_window=256),
               "performer": {}, "flex": {}, "alibi": dict(attention_kernel="sdpa", positional="alibi")}
    for length in (1024, 4096):
        work = {}
        for kernel, options in kernels.items():
            torch.manual_seed(0)
            options = options or dict(attention_kernel=kernel)
            model = tformer.build_model("gpt2", num_layers=1, vocab_size=1024, max_seq_len=length, dropout=0.0,
                                        **options).to("cuda", torch.bfloat16)
            tokens = torch.randint(0, 1024, (4, length), device="cuda")

            def step(model=model, tokens=tokens):
                model(tokens, labels=tokens).loss.backward()
            work[kernel] = step
        for function in work.values():
            function()
        seconds = median_seconds(work, rounds)
        print(f"  {length} tokens x 4: " + ", ".join(f"{name} {value * 1000:.1f} ms"
                                                     for name, value in seconds.items()))
        print(f"  {length} tokens, over sdpa's step: " + ", ".join(
            f"{name} {seconds[name] / seconds['sdpa']:.2f}x" for name in ("alibi", "sliding_window", "flex")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_speed.py: PyTorch sees no CUDA device on this machine")
    import transformers
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}, transformers {transformers.__version__}; "
          f"TF32 matrix products {'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}", flush=True)
    peak = None
    for part in args.parts:
        started = time.perf_counter()
        print(f"\n== {part}", flush=True)
        if part == "ceilings":
            peak = ceilings(args.rounds)["bf16 TFLOP/s"]
        elif part == "train":
            train(args.rounds, peak)
        else:
            globals()[part](args.rounds)
        print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
