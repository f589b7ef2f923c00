"""What grouped- and multi-query attention save in decoding: key/value cache bytes per token and greedy
generation speed of three variants of one model, GPT-2's 124M shape (12 layers, width 768, 12 query
heads of 64, vocabulary 50257, float32, random weights: no download) with

  MHA  12 key/value heads (every query head has its own)
  GQA   4 key/value heads (--gqa-kv-heads: each shared by 3 query heads)
  MQA   1 key/value head (shared by all 12)

Cache bytes per token: ``Model.cache_bytes_per_token`` (2 x layers x KV heads x 64 x 4
bytes), checked against the key/value tensors a decoding session of the same model really allocates
(their bytes / (rows x positions)); the script stops if the two differ. Speed: new tokens per second
of ``tformer.generate`` (greedy, the KV cache, no end token: always --new-tokens new tokens) after
the same random prompt of --prompt-length tokens, batch 1 and batch 8; the median of --rounds
interleaved rounds (benchmarks/timing.py: every variant and batch once a round). The variants also differ in their key
and value projections (fewer key/value heads, fewer weights: the table lists each one's parameters),
which the speed includes.

    python benchmarks/kv_cache_memory.py [--rounds 3] [--threads 2] [--prompt-length 32] [--new-tokens 128]
                                         [--out benchmarks/logs/kv_cache_memory.png]  # + .json beside it
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tformer  # noqa: E402
from benchmarks.timing import interleaved  # noqa: E402
from tformer.config import resolve_config  # noqa: E402
from tformer.generation import open_session  # noqa: E402
from tformer.models import build_model  # noqa: E402

BATCHES, FULL_CONTEXT = (1, 8), 1024


def variants(gqa_kv_heads: int) -> dict[str, tformer.ModelConfig]:
    """The three configs: GPT-2 124M with 12, ``gqa_kv_heads`` and 1 key/value heads."""
    base = resolve_config("gpt2")
    return {name: base.replace(num_kv_heads=heads)
            for name, heads in (("MHA", base.num_heads), ("GQA", gqa_kv_heads), ("MQA", 1))}


def allocated_cache(model, batch: int, prompt_length: int, new_tokens: int) -> tuple[int, int]:
    """Bytes of the key/value tensors a decoding session of ``batch`` rows holds, and the positions
    per row it holds room for."""
    prompt = torch.zeros(batch, prompt_length, dtype=torch.long)
    with torch.inference_mode():
        session, _ = open_session(model, prompt, None, new_tokens)
    held = sum(layer.self_attention.nbytes() for layer in session.cache)
    return held, session.capacity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help=f"torch CPU threads (default here: {torch.get_num_threads()})")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--gqa-kv-heads", type=int, default=4, help="key/value heads of the GQA variant (4)")
    parser.add_argument("--out", type=Path, default=None, help="PNG of the bar plot; the figures go to the "
                        "same name with .json")
    args = parser.parse_args()
    if min(args.rounds, args.threads, args.new_tokens, args.prompt_length) < 1:
        parser.error("--rounds, --threads, --new-tokens and --prompt-length must be at least 1")
    if args.prompt_length + args.new_tokens > FULL_CONTEXT:
        parser.error(f"--prompt-length + --new-tokens must fit GPT-2's {FULL_CONTEXT} positions")
    if args.out is not None and args.out.suffix != ".png":
        parser.error(f"--out {args.out}: name a .png file (the figures are written beside it as .json)")
    try:
        configs = variants(args.gqa_kv_heads)
    except tformer.ConfigError as error:
        parser.error(f"--gqa-kv-heads {args.gqa_kv_heads}: {error}")
    torch.set_num_threads(args.threads)
    print(f"GPT-2 124M shape, random weights, float32, {args.threads} threads, torch {torch.__version__}; "
          f"prompt {args.prompt_length} tokens, {args.new_tokens} new tokens, greedy; "
          f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC")

    models, rows = {}, {}
    generator = torch.Generator().manual_seed(0)
    prompts = {batch: torch.randint(0, 50257, (batch, args.prompt_length), generator=generator) for batch in BATCHES}
    for name, config in configs.items():
        torch.manual_seed(0)
        model = build_model(config).eval()
        formula = model.cache_bytes_per_token()
        for batch in BATCHES:
            held, positions = allocated_cache(model, batch, args.prompt_length, args.new_tokens)
            if held != formula * batch * positions:
                raise SystemExit(f"{name}: cache_bytes_per_token says {formula} bytes per token, the session's "
                                 f"cache holds {held} bytes for {batch} x {positions} positions")
        models[name] = model
        rows[name] = {"kv_heads": config.num_kv_heads, "parameters": model.num_parameters(),
                      "bytes_per_token": formula, "checked_against_allocated": True}
        heads = f"{config.num_kv_heads} key/value head{'s' if config.num_kv_heads > 1 else ''}"
        print(f"{name}: {heads}, {model.num_parameters():,} parameters, {formula:,} cache bytes per token "
              "(the session's cache tensors hold the same)", flush=True)

    def generation(model, prompt):
        def run() -> None:
            output = tformer.generate(model, prompt, args.new_tokens, eos_token_id=[])
            assert output.shape[1] == args.prompt_length + args.new_tokens
        return run

    work = {(name, batch): generation(model, prompts[batch]) for batch in BATCHES for name, model in models.items()}
    times = interleaved(work, rounds=args.rounds, steps=1)
    for (name, batch), seconds in times.items():
        rows[name][f"tokens_per_s_batch{batch}"] = batch * args.new_tokens / statistics.median(seconds)

    mha = rows["MHA"]
    speed_headers = " ".join(f"{f'tok/s b{batch}':>10} {'vs MHA':>7}" for batch in BATCHES)
    print(f"\n{'variant':<8} {'KV heads':>8} {'params':>12} {'cache B/token':>13} {'vs MHA':>7} "
          f"{f'MiB at {FULL_CONTEXT}x8':>14} {speed_headers}")
    for name, row in rows.items():
        speeds = " ".join(f"{row[f'tokens_per_s_batch{batch}']:>10.1f} "
                          f"{row[f'tokens_per_s_batch{batch}'] / mha[f'tokens_per_s_batch{batch}']:>7.2f}"
                          for batch in BATCHES)
        print(f"{name:<8} {row['kv_heads']:>8} {row['parameters']:>12,} {row['bytes_per_token']:>13,} "
              f"{mha['bytes_per_token'] / row['bytes_per_token']:>6.0f}x "
              f"{row['bytes_per_token'] * FULL_CONTEXT * 8 / 2**20:>14,.0f} {speeds}")
    print(f"tok/s: new tokens per second (all rows), median of {args.rounds} rounds; load average "
          f"{os.getloadavg()[0]:.2f}")

    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        settings = {"shape": "gpt2 (12 x 768, 12 heads, V=50257)", "dtype": "float32", "threads": args.threads,
                    "prompt_tokens": args.prompt_length, "new_tokens": args.new_tokens, "rounds": args.rounds,
                    "torch": torch.__version__, "date": f"{datetime.now(UTC):%Y-%m-%d}"}
        args.out.with_suffix(".json").write_text(json.dumps({"settings": settings, "variants": rows}, indent=1) + "\n")
        plot(rows, args.out)
        print(f"wrote {args.out} and {args.out.with_suffix('.json')}")


def plot(rows: dict, out: Path) -> None:
    """Bars: cache KiB per token, and new tokens/s at each batch size, per variant."""
    from tformer.viz.figures import pyplot, save_figure

    plt = pyplot()
    names = list(rows)
    figure, (memory_axes, speed_axes) = plt.subplots(1, 2, figsize=(10, 4))
    memory_axes.bar(names, [rows[name]["bytes_per_token"] / 1024 for name in names], color="tab:blue")
    memory_axes.set_ylabel("KV cache per token, KiB")
    width = 0.8 / len(BATCHES)
    for index, batch in enumerate(BATCHES):
        positions = [i + (index - (len(BATCHES) - 1) / 2) * width for i in range(len(names))]
        speed_axes.bar(positions, [rows[name][f"tokens_per_s_batch{batch}"] for name in names], width,
                       label=f"batch {batch}")
    speed_axes.set_xticks(range(len(names)), names)
    speed_axes.set_ylabel("new tokens / s (greedy, KV cache)")
    speed_axes.legend()
    figure.suptitle("GPT-2 124M shape: MHA, GQA and MQA variants (float32, CPU)")
    figure.tight_layout()
    save_figure(figure, out)


if __name__ == "__main__":
    main()
