"""Prefix caching: time to first token (TTFT) of requests that share a long system prompt, with and
without it, in tformer serve's engine and through ``tformer serve``.

    python benchmarks/prefix_cache.py --threads 2 --later 6 --out benchmarks/logs/prefix_cache.json

GPT-2's 124M shape with random weights (seed 0), the folder benchmarks/serve_load.py writes (GPT-2's
tokenizer from ../shared/data/tokenizers/gpt2; nothing is downloaded). Every prompt is one system
prompt of --system-tokens ids followed by a question of its own (8-16 ids); each request decodes
--new-tokens greedy tokens, one request at a time: the first computes the system prompt (cold), the
--later ones may find its blocks in the cache. Two paths, each with prefix caching on and off: the
``Engine`` in this process (TTFT: submit to the first token's event) and ``tformer serve`` in its own
process (TTFT: the request sent to its first streamed chunk). The hit rate is the later requests' prompt
tokens served from the cache over their prompt tokens (the engine's stats; /metrics for the server).
The answers with and without the cache are compared: greedy, they must be the same tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from statistics import median

import httpx2
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tformer  # noqa: E402
from benchmarks.serve_load import (  # noqa: E402
    GPT2_TOKENIZER,
    WORDS,
    Server,
    free_port,
    prepare_folder,
    read_metrics,
    stream_request,
)
from tformer.generation import GenerationConfig  # noqa: E402
from tformer.hub import load_tokenizer  # noqa: E402
from tformer.serving import Engine  # noqa: E402

BLOCK_SIZE = 16
CACHE_TOKENS = 4096  # room for a request and the cached system prompt several times over
QUESTION_LENGTHS = (8, 16)
WARM_UP = [464, 3290, 318, 257, 1332, 13]  # a short prompt sharing no block with the others


def make_prompts(tokenizer, system_tokens: int, count: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts: one system prompt of ``system_tokens`` ids, then a question of 8-16 ids each."""
    rng = random.Random(seed)

    def words(n: int) -> list[int]:
        return tokenizer.encode(" ".join(rng.choice(WORDS) for _ in range(n)), add_special_tokens=False)

    system = words(2 * system_tokens)[:system_tokens]
    return [system + words(QUESTION_LENGTHS[1])[: rng.randint(*QUESTION_LENGTHS)] for _ in range(count)]


def run_engine(folder: Path, prompts: list[list[int]], new_tokens: int, caching: bool) -> dict:
    """The prompts one at a time through the engine in this process."""
    model = tformer.load(folder)
    engine = Engine(model, model.tokenizer, cache_tokens=CACHE_TOKENS, block_size=BLOCK_SIZE,
                    prefix_caching=caching)
    config = GenerationConfig(max_new_tokens=new_tokens, eos_token_id=())
    engine.complete([WARM_UP], config)
    ttft, answers, before_later = [], [], None
    for index, prompt in enumerate(prompts):
        if index == 1:
            before_later = (engine.stats.prompt_tokens, engine.stats.prefix_cache_hit_tokens)
        first: list[float] = []
        sent = time.perf_counter()
        request = engine.submit(prompt, config, on_event=lambda event, f=first: f or f.append(time.perf_counter()))
        engine.run_until_idle()
        ttft.append(first[0] - sent)
        answers.append(model.tokenizer.decode(request.outputs()[0]))
    prompt_tokens = engine.stats.prompt_tokens - before_later[0]
    hits = engine.stats.prefix_cache_hit_tokens - before_later[1]
    return {"ttft": ttft, "answers": answers, "hit_rate": hits / prompt_tokens}


async def serve_requests(server: Server, prompts: list[list[int]], new_tokens: int) -> dict:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(None)) as client:
        def body(prompt: list[int]) -> dict:
            return {"model": "gpt2", "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "stream": True,
                    "ignore_eos": True}

        await stream_request(client, server.url, body(WARM_UP), len(WARM_UP))
        ttft, answers, before_later = [], [], None
        for index, prompt in enumerate(prompts):
            if index == 1:
                before_later = read_metrics((await client.get(server.url + "/metrics")).text)
            finished = await stream_request(client, server.url, body(prompt), len(prompt))
            ttft.append(finished.ttft)
            answers.append(finished.text)
        after = read_metrics((await client.get(server.url + "/metrics")).text)
    prompt_tokens = after["tformer_prompt_tokens_total"] - before_later["tformer_prompt_tokens_total"]
    hits = after["tformer_prefix_cache_hit_tokens_total"] - before_later["tformer_prefix_cache_hit_tokens_total"]
    return {"ttft": ttft, "answers": answers, "hit_rate": hits / prompt_tokens}


def run_serve(folder: Path, prompts: list[list[int]], new_tokens: int, caching: bool, args) -> dict:
    """The prompts one at a time through ``tformer serve`` (its own process), streamed."""
    port = free_port()
    command = [sys.executable, "-m", "tformer", "serve", str(folder), "--port", str(port), "--model-name", "gpt2",
               "--cache-tokens", str(CACHE_TOKENS), "--block-size", str(BLOCK_SIZE)]
    command += (["--threads", str(args.threads)] if args.threads else []) + ([] if caching else ["--no-prefix-cache"])
    server = Server(command, port, args.work / f"serve-{'on' if caching else 'off'}.log",
                    {**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        server.start(args.start_timeout)
        return asyncio.run(serve_requests(server, prompts, new_tokens))
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--later", type=int, default=6, help="requests after the first (default: 6)")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--paths", default="engine,serve", help="of engine, serve")
    parser.add_argument("--threads", type=int, help="CPU threads here and for tformer serve (default: PyTorch's)")
    parser.add_argument("--work", type=Path, help="folder for the checkpoint and server logs (default: a temporary "
                        "one; a given one keeps them and reuses the checkpoint)")
    parser.add_argument("--gpt2-tokenizer", type=Path, default=GPT2_TOKENIZER)
    parser.add_argument("--start-timeout", type=float, default=300)
    parser.add_argument("--out", type=Path, help="write every figure here as JSON")
    args = parser.parse_args()
    paths = args.paths.split(",")
    context = 1024  # GPT-2's positions
    if args.system_tokens + QUESTION_LENGTHS[1] + args.new_tokens > context or args.later < 1 \
            or set(paths) - {"engine", "serve"}:
        parser.error(f"--system-tokens + {QUESTION_LENGTHS[1]} + --new-tokens must fit GPT-2's {context} positions, "
                     "--later >= 1, --paths of engine, serve")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads here, load average {os.getloadavg()[0]:.2f}; "
          f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        args.work = args.work or Path(scratch)
        args.work.mkdir(parents=True, exist_ok=True)
        folder = prepare_folder("gpt2", args.work, args.gpt2_tokenizer)
        prompts = make_prompts(load_tokenizer(folder), args.system_tokens, 1 + args.later)
        for path in paths:
            for caching in (True, False):
                run = (run_engine(folder, prompts, args.new_tokens, caching) if path == "engine"
                       else run_serve(folder, prompts, args.new_tokens, caching, args))
                rows.append({"path": path, "prefix_cache": caching, **run})
                print(f"{path}, prefix cache {'on' if caching else 'off'}: TTFT "
                      + ", ".join(f"{seconds * 1000:.0f}" for seconds in run["ttft"]) + " ms", flush=True)
    print(f"\n== GPT-2 124M shape, a {args.system_tokens}-token system prompt + 8-16 token questions, one request at "
          f"a time, {args.new_tokens} new tokens; times in ms ==")
    print(f"{'path':<22} {'prefix cache':>12} {'first TTFT':>10} {'later TTFT p50':>14} {'mean':>7} {'hit rate':>8}")
    figures = {}
    for path in paths:
        on, off = (next(row for row in rows if (row["path"], row["prefix_cache"]) == (path, caching))
                   for caching in (True, False))
        for row in (on, off):
            later = row["ttft"][1:]
            print(f"{'the engine, no HTTP' if path == 'engine' else 'tformer serve':<22} "
                  f"{'on' if row['prefix_cache'] else 'off':>12} {row['ttft'][0] * 1000:>10.0f} "
                  f"{median(later) * 1000:>14.0f} {sum(later) / len(later) * 1000:>7.0f} {row['hit_rate']:>8.3f}")
        speedup = median(off["ttft"][1:]) / median(on["ttft"][1:])
        same = on["answers"] == off["answers"]
        figures[path] = {"later_ttft_speedup": speedup, "hit_rate": on["hit_rate"], "same_answers": same}
        print(f"{path}: later requests' TTFT {speedup:.1f}x faster with the prefix cache (target >= 5: "
              f"{'met' if speedup >= 5 else 'NOT met'}); answers {'the same' if same else 'DIFFER'} with and without")
    print(f"\nload average at the end {os.getloadavg()[0]:.2f} (other processes share this machine's cores)")
    if args.out is not None:
        settings = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"settings": settings, "date": f"{datetime.now(UTC):%Y-%m-%d}",
                                        "torch": torch.__version__, "rows": rows, "figures": figures}, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
