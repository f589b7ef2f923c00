"""Generation speed: tformer beside Hugging Face ``generate`` on the same weights, and speculative
decoding on a trained target/draft pair.

    python benchmarks/generate_speed.py                 # both parts
    python benchmarks/generate_speed.py --part hf       # greedy vs Hugging Face only
    python benchmarks/generate_speed.py --part speculative --pair runs/speculative-pair
    python benchmarks/generate_speed.py --part quantized --shapes a   # int8 / w8a8 / int4 beside fp32, HF, peers
    python benchmarks/generate_speed.py --part open --shapes qlm      # today's open families beside HF

Part 1 (greedy, batch 1, a 32-token prompt, 128 new tokens, fp32, CPU) runs, in this one
process, a randomly initialised Hugging Face ``GPT2LMHeadModel`` of each shape and the same
weights loaded into tformer: (a) GPT-2's 124M shape, (b) 6 layers, width 384, 6 heads,
vocabulary 8192. It prints new tokens/s for both, their ratio, tformer without its KV cache,
the matrix-vector products alone (the ceiling), whether the tokens are identical, and tformer with its static
cache (``cache_implementation="static"``, which must give the same tokens) beside its default one. Each of
``--repeats`` rounds runs every one of these once, in an order that rotates from round to round,
and the medians are reported, so all see the same machine load.

Part 3 (``--part quantized``) runs the same greedy workload with tformer's fp32 model, the same weights
quantized to int8, w8a8 and int4 (groups of 64; ``tformer.quantization``), Hugging Face fp32 ``generate``,
and the peers that are installed: torchao's int8 weight-only config (``Int8WeightOnlyConfig``) and
dynamic-activation config (``Int8DynamicActivationInt8WeightConfig``) on the Hugging Face model, and
llama.cpp (``llama-cpp-python``) on Q8_0 and Q4_0 GGUF files of the same weights (``llama_cpp_peer.py``;
``--llama-converter`` names llama.cpp's convert_hf_to_gguf.py), alternately, and prints each one's new
tokens/s and its ratios to Hugging Face and to tformer fp32, the plan each tformer backend runs on this host
(measured at load), and how many of the 128 tokens each shares with tformer fp32 before the first
difference (random weights: greedy paths part at the first near-tie; ``tests/nn/test_quantization.py`` checks
the logits).

Part 4 (``--part open``) runs random models of today's open families built by ``transformers`` (their
own classes, so Hugging Face runs its Qwen2 / Llama / Mixtral code) and the same weights in tformer: (q) Qwen2.5-0.5B's
shape, (l) Llama-3.2-1B's shape (with its llama3 RoPE scaling), each in fp32 and with tformer's int8 weights, and
(m) a tiny Mixtral (8 experts, top 2). Greedy, batch 1, ``--open-tokens`` new tokens after a 32-token prompt;
it prints each engine's tokens/s, its ratio to Hugging Face fp32 ``generate`` and whether fp32 tokens are equal.

Part 2 decodes tinyshakespeare prompts greedily with a 6-layer character-level target, alone
and with a 1-layer draft (both trained by ``speculative_pair.py`` on first use and saved in
``--pair``; their training records are printed), alternately, and prints the speed-up, the
acceptance rate and whether the output is identical.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speculative_pair import DEFAULT_DATA, SEQ_LEN, load_or_train_pair, read_text  # noqa: E402
from timing import memory_read_bandwidth  # noqa: E402

import tformer  # noqa: E402
from tformer.nn.weights import PrepackedLinear, decoding_step  # noqa: E402

SHAPES = {
    "a": ("(a) GPT-2 124M: 12 x 768, V=50257", dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257)),
    "b": ("(b) 6 x 384, 6 heads, V=8192", dict(n_embd=384, n_layer=6, n_head=6, vocab_size=8192)),
}
PROMPT_LENGTH, NEW_TOKENS = 32, 128


def timed(function) -> tuple[float, float, object]:
    """Wall-clock and CPU seconds (all threads) of one call, and its result. CPU time is what the
    call itself consumed, which other processes on a busy machine disturb much less."""
    started, started_cpu = time.perf_counter(), time.process_time()
    result = function()
    return time.perf_counter() - started, time.process_time() - started_cpu, result


def alternated(measurements: dict[str, Callable[[], object]], repeats: int) -> tuple[dict, dict, dict]:
    """Every measurement once a round for ``repeats`` rounds, the order rotating from round to
    round so that all see the same machine load: wall and CPU seconds by name, and each one's
    last result."""
    names = list(measurements)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    results = {}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            seconds, cpu_seconds, results[name] = timed(measurements[name])
            wall[name].append(seconds)
            cpu[name].append(cpu_seconds)
    return wall, cpu, results


# ---- part 1: tformer vs Hugging Face -------------------------------------------------------------


def compare_with_hugging_face(shape: str, repeats: int, no_cache: bool) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    title, sizes = SHAPES[shape]
    torch.manual_seed(0)
    config = GPT2Config(n_positions=1024, bos_token_id=0, eos_token_id=0, pad_token_id=0, **sizes)
    hf = GPT2LMHeadModel(config).eval()
    hf.generation_config.eos_token_id = None  # exactly NEW_TOKENS new tokens for both
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        ours = tformer.load(folder).eval()  # the same weights, through tformer.interop
    prompt = torch.randint(0, config.vocab_size, (1, PROMPT_LENGTH), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(prompt)

    def run_hf(new=NEW_TOKENS):
        with torch.inference_mode():
            return hf.generate(prompt, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)

    def run_ours(new=NEW_TOKENS, **options):
        return tformer.generate(ours, prompt, new, eos_token_id=[], **options)

    measurements = {"hf": run_hf, "ours": run_ours, "floor": lambda: matvec_floor(ours),
                    "static": lambda: run_ours(cache_implementation="static")}
    if no_cache:
        measurements["uncached"] = lambda: run_ours(use_cache=False)
    run_hf(8), run_ours(8), run_ours(8, use_cache=False)  # warm up (lazy initialisation, the fast decoder's layout)
    wall, cpu, tokens = alternated(measurements, repeats)
    speed = {name: NEW_TOKENS / statistics.median(values) for name, values in wall.items()}
    if no_cache:
        assert torch.equal(tokens["uncached"], tokens["ours"]), "tformer without cache gave other tokens"
    assert torch.equal(tokens["static"], tokens["ours"]), "tformer with a static cache gave other tokens"
    return dict(
        title=title, parameters=ours.num_parameters(), hf=speed["hf"], ours=speed["ours"],
        uncached=speed.get("uncached"), floor=speed["floor"], static=speed["static"],
        cpu_ratio=statistics.median(cpu["hf"]) / statistics.median(cpu["ours"]),
        identical=torch.equal(tokens["hf"], tokens["ours"]),
    )


def matvec_floor(model) -> None:
    """Only the matrix-vector products of NEW_TOKENS one-token steps, back to back: every weight
    read once per token, nothing else. Its speed is the ceiling of any batch-1 decoder here."""
    model = model.decoding_view()  # the weight backend decoding reads (prepacked on the CPU)
    layers = [module for module in model.modules() if isinstance(module, PrepackedLinear)]
    inputs = [torch.randn(1, layer.in_features) for layer in layers]
    with torch.inference_mode(), decoding_step:  # inside a step, as decoding runs them: the prepacked products
        for _ in range(NEW_TOKENS):
            for layer, x in zip(layers, inputs, strict=True):
                layer(x)


# ---- part 3: quantized weights ----------------------------------------------------------------


def compare_quantized(shape: str, repeats: int, llama_converter: Path | None) -> dict:
    """Tokens/s and the generated tokens of every engine of part 3 on ``shape`` (those whose library is
    installed), and the plan of each tformer backend."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from tformer.quantization import plans, quantize

    title, sizes = SHAPES[shape]
    torch.manual_seed(0)
    config = GPT2Config(n_positions=1024, bos_token_id=0, eos_token_id=0, pad_token_id=0, **sizes)
    hf = GPT2LMHeadModel(config).eval()
    hf.generation_config.eos_token_id = None
    prompt = torch.randint(0, config.vocab_size, (1, PROMPT_LENGTH), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(prompt)
    engines: dict[str, Callable[..., torch.Tensor]] = {}
    models = {}
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        for name, method, options in (("tformer fp32", None, {}), ("tformer int8", "int8", {}),
                                      ("tformer w8a8", "w8a8", {}), ("tformer int4", "int4", {"group_size": 64})):
            model = tformer.load(folder).eval()
            models[name] = model if method is None else quantize(model, method, **options)
        engines.update(_torchao_engines(hf, prompt, mask))
        engines.update(_llama_engines(Path(folder), prompt, llama_converter))

    def run_hf(new=NEW_TOKENS, model=hf):
        with torch.inference_mode():
            return model.generate(prompt, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)

    engines = {"HF fp32": run_hf, **{name: engine for name, engine in engines.items() if name.startswith("HF")},
               **{name: (lambda model=model, new=NEW_TOKENS: tformer.generate(model, prompt, new, eos_token_id=[]))
                  for name, model in models.items()},
               **{name: engine for name, engine in engines.items() if not name.startswith("HF")}}
    for run in engines.values():
        run(new=8)  # warm up (the kernels' plans, packed layouts, llama.cpp's buffers)
    wall, _, tokens = alternated(engines, repeats)
    reference = tokens["tformer fp32"][0, PROMPT_LENGTH:]
    rows = {}
    for name, values in wall.items():
        generated = tokens[name][0, PROMPT_LENGTH:]
        differs = (generated != reference).nonzero()
        rows[name] = {"speed": NEW_TOKENS / statistics.median(values),
                      "shared": int(differs[0]) if len(differs) else NEW_TOKENS}
    plan_text = {name: plan.describe() for model in models.values() for name, plan in plans(model).items()}
    return dict(title=title, rows=rows, plans=plan_text)


def _torchao_engines(hf, prompt: torch.Tensor, mask: torch.Tensor) -> dict[str, Callable[..., torch.Tensor]]:
    """torchao's int8 configs applied to copies of the Hugging Face model (none when torchao is missing)."""
    import copy

    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_
    except ImportError:
        print("  (torchao is not installed: pip install torchao --no-deps; its columns are left out)")
        return {}
    engines = {}
    for name, quantization in (("HF + torchao int8 weight-only", Int8WeightOnlyConfig()),
                               ("HF + torchao int8 dynamic activations", Int8DynamicActivationInt8WeightConfig())):
        model = copy.deepcopy(hf)
        quantize_(model, quantization)

        def run(new=NEW_TOKENS, model=model):
            with torch.inference_mode():
                return model.generate(prompt, attention_mask=mask, max_new_tokens=new, do_sample=False,
                                      pad_token_id=0)
        engines[name] = run
    return engines


def _llama_engines(folder: Path, prompt: torch.Tensor,
                   converter: Path | None) -> dict[str, Callable[..., torch.Tensor]]:
    """llama.cpp on Q8_0 and Q4_0 GGUF files of the Hugging Face folder's weights (none when it cannot run)."""
    import llama_cpp_peer

    converter = converter or llama_cpp_peer.DEFAULT_CONVERTER
    reason = llama_cpp_peer.available(converter)
    if reason:
        print(f"  (llama.cpp left out: {reason})")
        return {}
    files = llama_cpp_peer.gguf_files(folder, folder / "gguf", converter)
    engines = {}
    for kind in ("q8_0", "q4_0"):
        peer = llama_cpp_peer.LlamaPeer(files[kind], torch.get_num_threads())

        def run(new=NEW_TOKENS, peer=peer):
            ids = peer.generate(prompt[0].tolist(), new)
            return torch.cat([prompt, torch.tensor([ids])], dim=1)
        engines[f"llama.cpp {kind.upper()}"] = run
    return engines


# ---- part 4: today's open families -----------------------------------------------------------------

OPEN_SHAPES = {
    "q": ("(q) Qwen2.5-0.5B shape: 24 x 896, 14/2 heads, V=151936", "Qwen2Config", True, dict(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
        vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "l": ("(l) Llama-3.2-1B shape: 16 x 2048, 32/8 heads, V=128256", "LlamaConfig", True, dict(
        hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192,
        vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=131072, head_dim=64,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    "m": ("(m) tiny Mixtral: 4 x 256, 8/2 heads, 8 experts top-2, V=32000", "MixtralConfig", False, dict(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, intermediate_size=512,
        vocab_size=32000, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=4096)),
}


def compare_open_family(shape: str, repeats: int, new_tokens: int, bf16: bool = False) -> dict:
    """Tokens/s of Hugging Face fp32 ``generate``, tformer fp32 and (dense shapes) tformer int8 on one random model of
    an open family, and with ``bf16`` both libraries' bfloat16 (the same weights cast); whether tformer fp32 gave
    Hugging Face's tokens."""
    import transformers

    from tformer.quantization import quantize

    title, config_class, with_int8, sizes = OPEN_SHAPES[shape]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(bos_token_id=1, eos_token_id=2, pad_token_id=0, **sizes)
    hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # exactly new_tokens new tokens for every engine
    prompt = torch.randint(3, config.vocab_size, (1, PROMPT_LENGTH), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(prompt)
    models, peers = {}, {"HF fp32": hf}
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        if bf16:  # loaded first (tformer casts once loaded: twice the float32 bytes for a moment); int8 left out
            bf16_model = tformer.load(folder, dtype=torch.bfloat16).eval()
        models["tformer fp32"] = tformer.load(folder).eval()  # the same weights, through tformer.interop
        if with_int8 and not bf16:
            models["tformer int8"] = quantize(tformer.load(folder).eval(), "int8")
        if bf16:
            models["tformer bf16"] = bf16_model
            peers["HF bf16"] = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
            peers["HF bf16"].generation_config.eos_token_id = None

    def run_hf(new=new_tokens, model=hf):
        with torch.inference_mode():
            return model.generate(prompt, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)

    engines = {**{name: (lambda new=new_tokens, model=model: run_hf(new, model)) for name, model in peers.items()},
               **{name: (lambda new=new_tokens, model=model: tformer.generate(model, prompt, new, eos_token_id=[]))
                  for name, model in models.items()}}
    for run in engines.values():
        run(new=4)  # warm up (lazy initialisation, packed layouts, the kernels' plans)
    wall, _, tokens = alternated(engines, repeats)
    speed = {name: new_tokens / statistics.median(values) for name, values in wall.items()}
    return dict(title=title, parameters=models["tformer fp32"].num_parameters(), speed=speed,
                identical=torch.equal(tokens["HF fp32"], tokens["tformer fp32"]))


# ---- part 2: speculative decoding ----------------------------------------------------------------


def speculative(pair: Path, data: Path, repeats: int, new_tokens: int, draft_counts: list[int]) -> None:
    target, draft = load_or_train_pair(pair, data)
    tokenizer = target.tokenizer
    text = read_text(data)
    held_out = text[int(len(text) * 0.9):]  # the evaluation split the pair never trained on
    prompts = [torch.tensor([tokenizer.encode(held_out[start : start + PROMPT_LENGTH])])
               for start in (1000, 20000, 40000, 60000)]
    if PROMPT_LENGTH + new_tokens > SEQ_LEN:
        raise SystemExit(f"--speculative-tokens: at most {SEQ_LEN - PROMPT_LENGTH} (the pair's training context)")

    def greedy_all():
        return [tformer.generate(target, p, new_tokens, eos_token_id=[]) for p in prompts]

    def speculative_all(k):
        outputs = [tformer.generate(target, p, new_tokens, eos_token_id=[], draft_model=draft, num_draft_tokens=k,
                                    return_dict=True) for p in prompts]
        return outputs

    greedy_all(), speculative_all(draft_counts[0])  # warm up
    total = new_tokens * len(prompts)
    print(f"\n== speculative decoding: greedy, {len(prompts)} tinyshakespeare prompts of {PROMPT_LENGTH} characters, "
          f"{new_tokens} new each ==")
    print(f"target {target.config.num_layers} layers x {target.config.d_model} ({target.num_parameters():,} "
          f"parameters); draft {draft.config.num_layers} layer x {draft.config.d_model} "
          f"({draft.num_parameters():,} parameters)")
    print(f"{'draft tokens':>12} {'target alone tok/s':>19} {'speculative tok/s':>18} {'speed-up':>9} "
          f"{'CPU-time speed-up':>18} {'acceptance':>11} {'identical':>10}")
    for k in draft_counts:
        wall, cpu, results = alternated({"alone": greedy_all, "together": lambda k=k: speculative_all(k)}, repeats)
        greedy, outputs = results["alone"], results["together"]
        identical = all(torch.equal(g, o.sequences) for g, o in zip(greedy, outputs, strict=True))
        acceptance = sum(o.accepted_draft_tokens for o in outputs) / sum(o.draft_tokens for o in outputs)
        alone_speed = total / statistics.median(wall["alone"])
        speculative_speed = total / statistics.median(wall["together"])
        cpu_speed_up = statistics.median(cpu["alone"]) / statistics.median(cpu["together"])
        print(f"{k:>12} {alone_speed:>19.1f} {speculative_speed:>18.1f} {speculative_speed / alone_speed:>8.2f}x "
              f"{cpu_speed_up:>17.2f}x {acceptance:>10.1%} {'yes' if identical else 'NO':>10}", flush=True)
    sample = tokenizer.decode(outputs[0].sequences[0].tolist())
    print(f"sample (prompt + greedy continuation): {sample!r}")


def open_families(shapes: str, repeats: int, new_tokens: int, bf16: bool = False) -> None:
    import transformers

    print(f"\n== open families: greedy, batch 1, prompt {PROMPT_LENGTH}, {new_tokens} new tokens, CPU; transformers "
          f"{transformers.__version__}; medians of {repeats} rounds, each running every engine once, in rotating "
          "order ==")
    for shape in shapes:
        # fp32 decoding is bound by memory bandwidth, which moves with the neighbours' load: said before and after
        print(f"(memory: a float32 sum over 1 GiB reads {memory_read_bandwidth():.1f} GB/s)")
        row = compare_open_family(shape, repeats, new_tokens, bf16)
        print(f"{row['title']} ({row['parameters'] / 1e6:.0f}M parameters); fp32 tokens equal to HF's: "
              f"{'yes' if row['identical'] else 'NO'}")
        for name, speed in row["speed"].items():
            print(f"  {name:<14} {speed:>8.2f} tok/s {speed / row['speed']['HF fp32']:>6.2f}x HF fp32", flush=True)
        if "HF bf16" in row["speed"]:
            print(f"  tformer bf16 / HF bf16: {row['speed']['tformer bf16'] / row['speed']['HF bf16']:.2f}x; "
                  f"tformer bf16 / tformer fp32: {row['speed']['tformer bf16'] / row['speed']['tformer fp32']:.2f}x")
    print(f"(memory: a float32 sum over 1 GiB reads {memory_read_bandwidth():.1f} GB/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["all", "hf", "speculative", "quantized", "open"], default="all",
                        help="all: hf and speculative; quantized: int8 / w8a8 / int4 beside fp32, HF and peers; "
                             "open: Qwen2.5 / Llama 3.2 / Mixtral shapes beside HF")
    parser.add_argument("--shapes", help="which shapes to compare (default: ab; --part open: q, l, m, default qlm)")
    parser.add_argument("--open-tokens", type=int, default=32, help="--part open: new tokens per run (default: 32)")
    parser.add_argument("--bf16", action="store_true",
                        help="--part open: also both libraries in bfloat16 (the same weights cast), int8 left out "
                             "(the memory of five models)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement; the median counts")
    parser.add_argument("--no-cache", action=argparse.BooleanOptionalAction, default=True,
                        help="also time tformer without its KV cache (default: yes)")
    parser.add_argument("--pair", type=Path, default=Path("runs/speculative-pair"),
                        help="the trained target/draft pair (trained and saved here when missing)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--speculative-tokens", type=int, default=200)
    parser.add_argument("--draft-tokens", default="3,4,6", help="draft lengths to measure (default: 3,4,6)")
    parser.add_argument("--threads", type=int, help="CPU threads for both libraries (default: torch's default)")
    parser.add_argument("--llama-converter", type=Path, metavar="PY",
                        help="--part quantized: llama.cpp's convert_hf_to_gguf.py (llama.cpp's rows need it and "
                             "llama-cpp-python; default: $LLAMA_CPP_CONVERTER or llama_cpp_peer.DEFAULT_CONVERTER)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    shapes = args.shapes or ("qlm" if args.part == "open" else "ab")

    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, "
          f"load average at start {os.getloadavg()[0]:.1f}")
    if args.part in ("all", "hf"):
        import transformers

        print(f"\n== greedy decoding: batch 1, prompt {PROMPT_LENGTH}, {NEW_TOKENS} new tokens, fp32 CPU; "
              f"transformers {transformers.__version__}; medians of {args.repeats} rounds, each running every column "
              f"once, in rotating order ==")
        print(f"{'shape':<36} {'params':>8} {'HF tok/s':>9} {'tformer tok/s':>14} {'ratio':>6} {'CPU-time ratio':>15} "
              f"{'tformer no-cache tok/s':>23} {'same tokens':>12} {'matvec-only tok/s':>18} "
              f"{'static-cache tok/s':>19}")
        for shape in shapes:
            row = compare_with_hugging_face(shape, args.repeats, args.no_cache)
            uncached = "-" if row["uncached"] is None else f"{row['uncached']:.1f}"
            print(f"{row['title']:<36} {row['parameters'] / 1e6:>7.1f}M {row['hf']:>9.1f} {row['ours']:>14.1f} "
                  f"{row['ours'] / row['hf']:>5.2f}x {row['cpu_ratio']:>14.2f}x {uncached:>23} "
                  f"{'yes' if row['identical'] else 'NO':>12} "
                  f"{row['floor']:>18.1f} {row['static']:>10.1f} ({row['static'] / row['ours']:.2f}x)", flush=True)
        print("tok/s: new tokens per wall-clock second; CPU-time ratio: the same ratio in CPU seconds used by each.\n"
              "matvec-only: just the weight matrix-vector products of the same steps, nothing else; the "
              "ceiling of batch-1 decoding on this machine\n"
              "static-cache: tformer with cache_implementation='static' (its tokens checked equal to tformer's), "
              "and its ratio to tformer's default (dynamic) cache")
    if args.part == "quantized":
        print(f"\n== quantized weights: greedy, batch 1, prompt {PROMPT_LENGTH}, {NEW_TOKENS} new tokens, CPU; "
              f"medians of {args.repeats} rounds, each running every engine once, in rotating order ==")
        for shape in shapes:
            result = compare_quantized(shape, args.repeats, args.llama_converter)
            rows = result["rows"]
            print(f"{result['title']}")
            print(f"  {'engine':<40} {'tok/s':>8} {'/ HF fp32':>10} {'/ tformer fp32':>15} {'same tokens':>12}")
            for name, row in rows.items():
                print(f"  {name:<40} {row['speed']:>8.1f} {row['speed'] / rows['HF fp32']['speed']:>9.2f}x "
                      f"{row['speed'] / rows['tformer fp32']['speed']:>14.2f}x {row['shared']:>12}", flush=True)
            for name, plan in result["plans"].items():
                print(f"  tformer {name} on this host: {plan}")
        print("tok/s: new tokens per wall-clock second (the prompt's processing included); same tokens: new tokens "
              "equal to tformer fp32's before the first difference")
    if args.part == "open":
        open_families(shapes, args.repeats, args.open_tokens, args.bf16)
    if args.part in ("all", "speculative"):
        speculative(args.pair, args.data, args.repeats, args.speculative_tokens,
                    [int(k) for k in args.draft_tokens.split(",")])
    print(f"\nload average at the end {os.getloadavg()[0]:.1f} (other processes share this machine's cores)")


if __name__ == "__main__":
    main()
