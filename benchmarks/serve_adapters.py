"""Serving several LoRA adapters on one base (issue 56's acceptance): ``tformer serve BASE --adapter`` with three
adapters, requests mixing them, beside the same server with one adapter, at 16 concurrent clients; and each answer
checked against its adapter's model alone.

    python benchmarks/serve_adapters.py                      # gpt-mini, 64 new tokens, 16 clients
    python benchmarks/serve_adapters.py --model gpt2          # GPT-2's 124M shape (GPT-2's tokenizer files needed)
    python benchmarks/serve_adapters.py --quick               # a tiny model and a few tokens: checks that it runs

The base: the preset's shape (gpt-mini, or gpt2 for GPT-2's 124M shape; --quick: gpt-nano at width 64) with random
weights (seed 0), saved as a tformer folder with a byte tokenizer (gpt-mini, gpt-nano) or GPT-2's (gpt2), as
``serve_load.py`` makes it. The adapters: three LoRA adapters (rank --rank, alpha 2 x rank, attention and
feed-forward layers) over it with B drawn at random (seeds 1, 2, 3: a zero B would change nothing), saved in PEFT's
format.

The two servers, run one after the other with the same settings (``--max-running`` = clients, a paged cache that
holds every client's longest request): "3 adapters" serves a0, a1, a2 and request i asks for a(i mod 3), so every
batch mixes adapters row by row; "1 adapter" serves a0 alone and every request asks for it. Each gets the same list
of prompts (--requests of lengths drawn as ``serve_load.py`` draws them, their ids sent as they are) from --clients
concurrent clients, one request at a time each, greedy, exactly --new-tokens tokens (``ignore_eos``), after a short
warm-up request per adapter. tokens/s = completion tokens the server reports / wall time of the run; the ratio is 3
adapters' over 1 adapter's (acceptance: >= 0.8).

Outputs: every answer of both runs is compared with ``tformer.generate`` on the base with that adapter loaded alone
(``tformer.adapters.load_adapter``), greedy, decoded by the tokenizer as the server decodes it: the count of equal
answers is printed per run (acceptance: all).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx2
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tformer  # noqa: E402
from benchmarks.serve_load import (  # noqa: E402
    BLOCK_SIZE,
    GPT2_TOKENIZER,
    PROMPT_LENGTHS,
    Failed,
    Server,
    free_port,
    make_prompts,
    tokenizer_for,
)
from tformer.adapters import add_lora, load_adapter, lora_layers, save_adapter  # noqa: E402
from tformer.generation import GenerationConfig  # noqa: E402
from tformer.serving.block_pool import blocks_for  # noqa: E402

ADAPTERS = ("a0", "a1", "a2")
QUICK = {"preset": "gpt-nano", "overrides": {"d_model": 64, "num_heads": 4, "vocab_size": 256, "max_seq_len": 128},
         "lengths": (4, 24)}


def write_base(folder: Path, model: str, quick: bool, gpt2_files: Path) -> tuple[int, int]:
    """The base model folder (random weights, seed 0, with its tokenizer); returns its prompt lengths."""
    torch.manual_seed(0)
    if quick:
        base = tformer.build_model(QUICK["preset"], **QUICK["overrides"]).eval()
        base.tokenizer = tokenizer_for("gpt-mini", gpt2_files)  # the 256 bytes
        lengths = QUICK["lengths"]
    else:
        base = tformer.build_model(model).eval()
        base.tokenizer = tokenizer_for(model, gpt2_files)
        lengths = PROMPT_LENGTHS[model]
    base.save(folder)
    return lengths


def write_adapters(base: Path, work: Path, rank: int) -> dict[str, Path]:
    """Three LoRA adapters over ``base``, B drawn at random (seeds 1, 2, 3), in PEFT's format."""
    folders = {}
    for seed, name in enumerate(ADAPTERS, start=1):
        model = add_lora(tformer.load(base), rank=rank, alpha=2 * rank, targets=["attention", "feedforward"])
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for layer in lora_layers(model).values():
                for b in layer.lora_B:
                    b.copy_(0.3 * torch.randn(b.shape, generator=generator))
        folders[name] = save_adapter(model, work / f"adapter-{name}")
    return folders


async def ask(client: httpx2.AsyncClient, url: str, body: dict) -> dict:
    """One non-streaming /v1/completions request: the answer's text, adapter name and completion tokens."""
    response = await client.post(url + "/v1/completions", json=body)
    if response.status_code != 200:
        raise Failed(f"HTTP {response.status_code}: {response.text[:200]}")
    answer = response.json()
    return {"model": answer["model"], "text": answer["choices"][0]["text"],
            "tokens": answer["usage"]["completion_tokens"]}


async def run_load(server: Server, bodies: list[dict], clients: int) -> tuple[list[dict], float]:
    """``clients`` workers sending ``bodies`` one at a time each; the answers in the bodies' order, wall seconds."""
    waiting, answers = list(enumerate(bodies)), [None] * len(bodies)
    limits = httpx2.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(None), limits=limits) as client:
        async def worker() -> None:
            while waiting:
                index, body = waiting.pop(0)
                answers[index] = await ask(client, server.url, body)

        started = time.perf_counter()
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(clients):
                    group.create_task(worker())
        except* Exception as errors:  # the first client's error, not the group
            error = errors.exceptions[0]
            raise (error if isinstance(error, Failed) else Failed(f"{type(error).__name__}: {error}")) from None
        return answers, time.perf_counter() - started


def expected_texts(base: Path, folders: dict[str, Path], prompts, wanted: list[str], new_tokens: int) -> list[str]:
    """What ``tformer.generate`` gives each prompt with its adapter loaded alone (greedy, no end token)."""
    models = {name: load_adapter(tformer.load(base), folders[name]).eval() for name in dict.fromkeys(wanted)}
    config = GenerationConfig(max_new_tokens=new_tokens, eos_token_id=())
    texts = []
    for prompt, name in zip(prompts, wanted, strict=True):
        model = models[name]
        ids = tformer.generate(model, torch.tensor([prompt.ids]), generation_config=config)[0, len(prompt.ids):]
        texts.append(model.tokenizer.decode(ids.tolist()))
    return texts


def serve(base: Path, folders: dict[str, Path], served: list[str], prompts, args, cache_tokens: int) -> dict:
    """One server with the adapters ``served``, request i asking for served[i mod len]: its figures and answers."""
    port = free_port()
    command = [sys.executable, "-m", "tformer", "serve", str(base), "--host", "127.0.0.1", "--port", str(port),
               "--model-name", "base", "--max-running", str(args.clients), "--cache-tokens", str(cache_tokens),
               "--block-size", str(BLOCK_SIZE)]
    command += [item for name in served for item in ("--adapter", f"{name}={folders[name]}")]
    command += ["--threads", str(args.threads)] if args.threads else []
    server = Server(command, port, args.work / f"server-{len(served)}.log")
    wanted = [served[index % len(served)] for index in range(len(prompts))]
    bodies = [{"model": name, "prompt": prompt.ids, "max_tokens": args.new_tokens, "temperature": 0,
               "ignore_eos": True} for name, prompt in zip(wanted, prompts, strict=True)]
    try:
        server.start(args.start_timeout)
        warm_up = [{**body, "max_tokens": 2} for body in bodies[:len(served)]]
        asyncio.run(run_load(server, warm_up, len(warm_up)))
        answers, wall = asyncio.run(run_load(server, bodies, args.clients))
    except Failed:
        server.check_alive()  # a server that died: its own reason
        raise
    finally:
        server.stop()
    tokens = sum(answer["tokens"] for answer in answers)
    expected = expected_texts(base, folders, prompts, wanted, args.new_tokens)
    equal = sum(answer["text"] == text and answer["model"] == name
                for answer, text, name in zip(answers, expected, wanted, strict=True))
    short = sum(answer["tokens"] != args.new_tokens for answer in answers)
    return {"adapters": served, "requests": len(answers), "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "equal_to_alone": equal, "short_requests": short}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt-mini", choices=list(PROMPT_LENGTHS), help="the base's preset")
    parser.add_argument("--quick", action="store_true", help="a tiny model, 4 new tokens (a smoke test)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, help="requests per run (default 2 x clients)")
    parser.add_argument("--new-tokens", type=int, help="tokens per answer (default 64; 4 with --quick)")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--threads", type=int, help="tformer serve --threads (default: its own choice)")
    parser.add_argument("--gpt2-tokenizer", type=Path, default=GPT2_TOKENIZER)
    parser.add_argument("--start-timeout", type=float, default=300)
    parser.add_argument("--work", type=Path, help="folder for the model, adapters and server logs (default: temporary)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    args.requests = args.requests or 2 * args.clients
    args.new_tokens = args.new_tokens or (4 if args.quick else 64)
    with tempfile.TemporaryDirectory() as temporary:
        args.work = args.work or Path(temporary)
        args.work.mkdir(parents=True, exist_ok=True)
        base = args.work / "base"
        lengths = write_base(base, args.model, args.quick, args.gpt2_tokenizer)
        folders = write_adapters(base, args.work, args.rank)
        prompts = make_prompts(tformer.load(base).tokenizer, args.requests, lengths)
        cache_tokens = args.clients * blocks_for(lengths[1] + args.new_tokens, BLOCK_SIZE) * BLOCK_SIZE
        print(f"{'quick: gpt-nano' if args.quick else args.model}; {args.clients} clients, {args.requests} requests "
              f"of {lengths[0]}..{lengths[1]} prompt tokens, {args.new_tokens} new tokens; adapters rank {args.rank}",
              flush=True)
        runs = {}
        for label, served in (("3 adapters", list(ADAPTERS)), ("1 adapter", [ADAPTERS[0]])):
            runs[label] = serve(base, folders, served, prompts, args, cache_tokens)
            run = runs[label]
            print(f"{label}: {run['tokens_per_s']:.1f} tok/s ({run['tokens']} tokens in {run['wall_s']:.1f} s); "
                  f"{run['equal_to_alone']} of {run['requests']} answers equal to the adapter's model alone",
                  flush=True)
    ratio = runs["3 adapters"]["tokens_per_s"] / runs["1 adapter"]["tokens_per_s"]
    print(f"\n{'server':<11} {'tok/s':>8} {'requests':>8} {'equal':>6} {'short':>6}")
    for label, run in runs.items():
        print(f"{label:<11} {run['tokens_per_s']:>8.1f} {run['requests']:>8} {run['equal_to_alone']:>6} "
              f"{run['short_requests']:>6}")
    print(f"acceptance: 3 adapters at {ratio:.2f}x 1 adapter's tokens/s (>= 0.8x); answers equal to each adapter "
          f"alone: {sum(r['equal_to_alone'] for r in runs.values())} of {sum(r['requests'] for r in runs.values())}")
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "ratio": ratio, "model": "quick" if args.quick else args.model,
                                        "clients": args.clients, "new_tokens": args.new_tokens}, indent=2) + "\n")


if __name__ == "__main__":
    main()
