"""tformer beside Hugging Face transformers on one CUDA GPU, in one process, interleaved round by round:
the figures of docs/gpu.md.

    python benchmarks/gpu_speed.py                       # every part
    python benchmarks/gpu_speed.py --parts train decode  # some of them
    python benchmarks/gpu_speed.py --device cpu --tiny --rounds 1   # every code path, small shapes, on the CPU

Every model is randomly initialised by Hugging Face, written with ``save_pretrained`` and read by
``tformer.load``: the same weights on both sides. Parts:
  ceilings   a bf16 8192^3 matrix product and a 2 GiB device-to-device copy: the card's measured rates
  train      GPT-2 124M shape, batch 8 x 1024, bf16 autocast, fused AdamW: tokens/s and model-FLOP utilisation of
             HF, tformer eager and compiled, and nanoGPT's model eager and compiled when benchmarks/nanogpt_model.py
             is there (nanoGPT's model.py, brought beside this file, not committed)
  decode     greedy batch 1, 32-token prompt, 128 new tokens: GPT-2 in fp32 and bf16 and a Llama-3.2-1B-shaped
             model in bf16; HF eager, HF with its static cache (compiled by generate on a GPU), tformer and tformer
             with its static cache (cache_implementation="static": captured as a CUDA graph on a GPU): new
             tokens/s, the ratios, identical tokens?, and each as a share of the copy ceiling (weight bytes x
             tokens/s over the measured copy rate)
  batch      64 prompts of 32 tokens, 128 new tokens each, bf16: HF generate on the batch, tformer.generate on
             the batch, and tformer's serving Engine (continuous batching over its paged cache), as it comes (its
             decode steps captured over the gather, each launched before the last one's tokens are read), with
             its steps not overlapped with their host work (``overlap=False``), and reading the pool in place
             (FlexAttention, uncaptured)
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
DEVICE = torch.device("cuda")  # --device
TINY = False  # --tiny: small shapes, so that every code path runs in seconds (on the CPU too)
CEILINGS: dict[str, float] = {}  # the ceilings part's rates, for the parts after it


def synchronized(function):
    """``function`` timed to the end of its GPU work."""
    def call():
        result = function()
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        return result
    return call


def shape(full: dict, tiny: dict) -> dict:
    """The sizes of a part: ``full``, or ``tiny`` with --tiny."""
    return tiny if TINY else full


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
    return hf.to(DEVICE, dtype), ours.to(DEVICE, dtype)


def llama_1b(dtype: torch.dtype):
    """A random Llama-3.2-1B-shaped model (tied embeddings), HF's and tformer's on the device in ``dtype``."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    sizes = shape(dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                       intermediate_size=8192, vocab_size=128256),
                  dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=128, vocab_size=512))
    config = LlamaConfig(max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                         pad_token_id=0, **sizes)
    hf = LlamaForCausalLM(config).to(dtype)  # made in dtype before it is saved: the 1B model's float32 is 5 GB
    hf.generation_config.eos_token_id = None
    ours = shared_weights(hf)
    return hf.to(DEVICE, dtype), ours.to(DEVICE, dtype)


def gpt2_sizes() -> dict:
    return shape(dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257),
                 dict(n_embd=64, n_layer=2, n_head=4, vocab_size=512))


def nanogpt_module():
    """nanoGPT's model.py as a module, when it lies beside this file as nanogpt_model.py; else None."""
    path = Path(__file__).resolve().parent / "nanogpt_model.py"
    if not path.is_file():
        return None
    import importlib.util
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- parts -----------------------------------------------------------------------------------------------


def ceilings(rounds: int) -> dict[str, float]:
    size = shape({"matrix": 8192, "copy": 2 ** 29}, {"matrix": 512, "copy": 2 ** 22})
    a, b = (torch.randn(size["matrix"], size["matrix"], device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    source = torch.randn(size["copy"], device=DEVICE)  # 2 GiB of float32
    target = torch.empty_like(source)
    seconds = median_seconds({"matmul": lambda: a @ b, "copy": lambda: target.copy_(source)}, rounds, steps=10)
    rates = {"bf16 TFLOP/s": 2 * size["matrix"] ** 3 / seconds["matmul"] / 1e12,
             "copy TB/s (read + write)": 2 * source.numel() * 4 / seconds["copy"] / 1e12}
    for name, value in rates.items():
        print(f"  {name}: {value:.3g}")
    CEILINGS.update(rates)
    return rates


def train(rounds: int, peak_tflops: float | None) -> None:
    batch, length = shape({"batch": 8, "length": 1024}, {"batch": 2, "length": 64}).values()
    sizes = gpt2_sizes()
    hf, ours = gpt2(**sizes)
    models = {"HF": hf, "tformer": ours, "tformer compiled": torch.compile(ours)}
    nanogpt = nanogpt_module()
    if nanogpt is not None:
        torch.manual_seed(0)
        config = nanogpt.GPTConfig(block_size=length, vocab_size=sizes["vocab_size"], n_layer=sizes["n_layer"],
                                   n_head=sizes["n_head"], n_embd=sizes["n_embd"], dropout=0.0, bias=True)
        theirs = nanogpt.GPT(config).to(DEVICE)
        models |= {"nanoGPT": theirs, "nanoGPT compiled": torch.compile(theirs)}
    else:
        print("  (no benchmarks/nanogpt_model.py: nanoGPT's model.py is not beside this file, its rows are left out)")
    tokens = torch.randint(0, sizes["vocab_size"], (batch, length), device=DEVICE,
                           generator=torch.Generator(DEVICE).manual_seed(0))
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True) for name, model in models.items()}
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # nanoGPT's: the next tokens apart

    def step(name):
        model = models[name]

        def run():
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
                if name.startswith("nanoGPT"):
                    loss = model(inputs, targets)[1]
                else:
                    loss = model(tokens, labels=tokens).loss
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
        return run

    for model in models.values():
        model.train()
    seconds = median_seconds({name: step(name) for name in models}, rounds, steps=3)
    width, layers = sizes["n_embd"], sizes["n_layer"]
    for name, value in seconds.items():
        parameters = sum(p.numel() for p in models[name].parameters())
        flops_per_token = 6 * parameters + 12 * layers * width * length  # weights, attention's scores and mixing
        rate = batch * length / value
        mfu = f", MFU {rate * flops_per_token / (peak_tflops * 1e12):.0%} of the measured bf16 peak" \
            if peak_tflops else ""
        print(f"  {name}: {value * 1000:.1f} ms/step, {rate:,.0f} tokens/s{mfu}")
    fastest_peer = min(value for name, value in seconds.items() if not name.startswith("tformer"))
    print(f"  tformer / HF speed: {seconds['HF'] / seconds['tformer']:.2f}x; tformer compiled over the fastest peer: "
          f"{fastest_peer / seconds['tformer compiled']:.2f}x")


def decode(rounds: int) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        decode_in("GPT-2 124M", *gpt2(dtype, **gpt2_sizes()), dtype, rounds)
    decode_in("Llama-3.2-1B shape", *llama_1b(torch.bfloat16), torch.bfloat16, rounds)


def decode_in(label: str, hf, ours, dtype: torch.dtype, rounds: int, new: int = 128) -> None:
    """Batch-1 greedy decoding of ``new`` tokens after 32: HF eager, HF with its static cache, tformer."""
    hf.eval(), ours.eval()
    prompt = torch.randint(0, ours.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    mask = torch.ones_like(prompt)

    def run_hf(static: bool, count: int = new):
        def run():
            with torch.inference_mode():
                return hf.generate(prompt, attention_mask=mask, max_new_tokens=count, min_new_tokens=count,
                                   do_sample=False, pad_token_id=0,
                                   cache_implementation="static" if static else None)
        return run

    work = {"HF": run_hf(False), "HF static": run_hf(True),
            "tformer": lambda: tformer.generate(ours, prompt, new, eos_token_id=[]),
            "tformer static": lambda: tformer.generate(ours, prompt, new, eos_token_id=[],
                                                       cache_implementation="static")}
    for function in work.values():  # the compiled and captured steps made before the clock runs
        function()
    seconds = median_seconds(work, rounds)
    same = torch.equal(work["HF"](), work["tformer"]()) and torch.equal(work["HF"](), work["tformer static"]())
    weight_bytes = sum(t.numel() * t.element_size() for t in ours.state_dict().values() if t.is_floating_point())
    copy = CEILINGS.get("copy TB/s (read + write)")
    rates = {name: new / value for name, value in seconds.items()}
    shares = "" if copy is None else ", of the copy ceiling " + ", ".join(
        f"{name} {rate * weight_bytes / (copy * 1e12):.1%}" for name, rate in rates.items())
    print(f"  {label}, {str(dtype).removeprefix('torch.')}, {weight_bytes / 1e9:.3g} GB of weights: "
          + ", ".join(f"{name} {rate:,.0f} tokens/s" for name, rate in rates.items())
          + f"; tformer / HF {rates['tformer'] / rates['HF']:.2f}x, tformer static / HF static "
          f"{rates['tformer static'] / rates['HF static']:.2f}x, identical tokens (HF eager): {same}{shares}")


def batch(rounds: int) -> None:
    from tformer.generation import GenerationConfig
    from tformer.serving.engine import Engine

    count, new = shape({"count": 64, "new": 128}, {"count": 8, "new": 16}).values()
    hf, ours = gpt2(torch.bfloat16, **gpt2_sizes())
    hf.eval(), ours.eval()
    prompts = torch.randint(0, ours.config.vocab_size, (count, 32), generator=torch.Generator().manual_seed(2))
    prompts = prompts.to(DEVICE)
    mask = torch.ones_like(prompts)
    engines = {(mode, overlap): Engine(ours, cache_tokens=count * (32 + new) + 1024, block_size=16,
                                       max_running=count, prefix_caching=False, paged_attention=mode, overlap=overlap)
               for mode, overlap in (("auto", None), ("auto", False), ("in-place", None))}
    config = GenerationConfig(max_new_tokens=new, eos_token_id=())
    as_lists = prompts.tolist()

    def run_hf():
        with torch.inference_mode():
            return hf.generate(prompts, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                               do_sample=False, pad_token_id=0)

    work = {"HF generate": run_hf,
            "tformer generate": lambda: tformer.generate(ours, prompts, new, eos_token_id=[]),
            "tformer Engine": lambda: engines["auto", None].complete(as_lists, config),
            "tformer Engine not overlapped": lambda: engines["auto", False].complete(as_lists, config),
            "tformer Engine in place": lambda: engines["in-place", None].complete(as_lists, config)}
    for function in work.values():
        function()
    seconds = median_seconds(work, rounds)
    for name, value in seconds.items():
        print(f"  {name}: {count * new / value:,.0f} new tokens/s ({value:.2f} s)")
    print(f"  tformer generate / HF: {seconds['HF generate'] / seconds['tformer generate']:.2f}x, "
          f"Engine / HF: {seconds['HF generate'] / seconds['tformer Engine']:.2f}x, "
          f"Engine / tformer generate: {seconds['tformer generate'] / seconds['tformer Engine']:.2f}x, "
          f"Engine in place / Engine: {seconds['tformer Engine'] / seconds['tformer Engine in place']:.2f}x, "
          f"Engine / not overlapped: {seconds['tformer Engine not overlapped'] / seconds['tformer Engine']:.2f}x")
    print(f"  {engines['auto', None].paged_attention_note}; in place: "
          f"{engines['in-place', None].paged_attention_note}; steps overlapped with their host work: "
          f"{engines['auto', None].overlapped is not None}")


def encoder(rounds: int) -> None:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    sizes = shape({}, dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128))
    hf_float = BertForSequenceClassification(BertConfig(num_labels=2, **sizes))
    ours_float = shared_weights(hf_float)
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randint(1000, 30522, (64, 128), generator=generator).to(DEVICE)
    mask = torch.ones_like(inputs)
    mask[::2, 96:] = 0  # half the rows padded after 96 tokens
    for dtype in (torch.float32, torch.bfloat16):
        hf = hf_float.to(DEVICE, dtype).eval()
        ours = ours_float.to(DEVICE, dtype).eval()

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
    window = shape({"window": 256}, {"window": 16})["window"]
    kernels = {"sdpa": {}, "reference": {}, "chunked": {},
               "sliding_window": dict(attention_kernel="sliding_window", attention_window=window),
               "performer": {}, "flex": {}, "alibi": dict(attention_kernel="sdpa", positional="alibi")}
    if DEVICE.type == "cpu":
        del kernels["flex"]  # FlexAttention has no backward pass on the CPU
    for length in shape({"lengths": (1024, 4096)}, {"lengths": (64, 128)})["lengths"]:
        work = {}
        for kernel, options in kernels.items():
            torch.manual_seed(0)
            options = options or dict(attention_kernel=kernel)
            model = tformer.build_model("gpt2", num_layers=1, vocab_size=1024, max_seq_len=length, dropout=0.0,
                                        **options).to(DEVICE, torch.bfloat16)
            tokens = torch.randint(0, 1024, (4, length), device=DEVICE)

            def step(model=model, tokens=tokens):
                model(tokens, labels=tokens).loss.backward()
            work[kernel] = step
        for function in work.values():
            function()
        seconds = median_seconds(work, rounds)
        print(f"  {length} tokens x 4: " + ", ".join(f"{name} {value * 1000:.1f} ms"
                                                     for name, value in seconds.items()))
        print(f"  {length} tokens, over sdpa's step: " + ", ".join(
            f"{name} {seconds[name] / seconds['sdpa']:.2f}x" for name in ("alibi", "sliding_window", "flex")
            if name in seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to check the code paths")
    parser.add_argument("--tiny", action="store_true", help="small shapes: every code path in seconds")
    args = parser.parse_args()
    global DEVICE, TINY
    DEVICE, TINY = torch.device(args.device), args.tiny
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_speed.py: PyTorch sees no CUDA device on this machine (--device cpu --tiny checks the paths)")
    import transformers
    name = torch.cuda.get_device_name() if DEVICE.type == "cuda" else "CPU"
    print(f"{name}{' (tiny shapes)' if TINY else ''}, PyTorch {torch.__version__}, transformers "
          f"{transformers.__version__}; TF32 matrix products "
          f"{'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}", flush=True)
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
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
