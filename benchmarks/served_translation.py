"""Served translation beside translation one sentence at a time: ``tformer serve`` answering N concurrent clients
(``/v1/completions``, each prompt a source sentence) against ``translate`` called on one sentence after another in
this process (``tformer translate`` with a batch of one), on Multi30k's test sentences, greedy and with 4 beams.

Model: a trained run when given (``--run runs/multi30k-de-en-transformer``), else the Multi30k recipe's shape
(3 + 3 layers, width 256) with random weights (seed 0) and a joint BPE of 8,000 tokens learned on the first 5,000
training pairs: its translations then seldom meet the end token and run to ``--max-new-tokens``, the same work on
both sides. Both sides use ``--threads`` threads; the server's text is checked against the one-at-a-time text
(``skip_special_tokens``, as ``translate`` prints). Each round runs every measurement once (each width one at a
time and served), in an order that rotates from round to round, so that the host's drift falls on all of them
alike. Figures: sentences per second over the whole list (wall time), medians of ``--rounds`` rounds, and served /
one-at-a-time (the ratio of the medians, then each round's). With ``--engine-alone``, the same for the engine without
HTTP (``Engine.submit`` in this process, ``--clients`` sentences in flight, a new one as soon as one ends).

    python benchmarks/served_translation.py --sentences 128 --clients 16 --max-new-tokens 24 --threads 2 --rounds 3
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_roots import data_path  # noqa: E402
from timing import rotating  # noqa: E402

import tformer  # noqa: E402
from tformer.data.parallel import ParallelText  # noqa: E402
from tformer.generation import GenerationConfig  # noqa: E402
from tformer.generation.sources import encode_sources, source_end_id  # noqa: E402
from tformer.generation.translation import translate  # noqa: E402
from tformer.serving import Engine  # noqa: E402
from tformer.training.tasks.translation import learn_joint_bpe  # noqa: E402

DATA = data_path("multi30k")


def lines(name: str, count: int | None = None) -> list[str]:
    with gzip.open(DATA / name, "rt", encoding="utf-8") as source:
        read = [line.strip() for line in source]
    return read[:count] if count is not None else read


def untrained_folder(work: Path) -> Path:
    """The recipe's shape with random weights and a BPE learned on the first 5,000 training pairs, saved."""
    folder = work / "multi30k-untrained"
    pairs = ParallelText(lines("train.de.gz", 5000), lines("train.en.gz", 5000), "train.de.gz", "train.en.gz")
    torch.manual_seed(0)
    model = tformer.build_model("transformer-multi30k").eval()
    model.tokenizer = learn_joint_bpe(pairs, 8000)
    model.save(folder)
    return folder


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def one_at_a_time(model, sentences: list[str], beams: int, new_tokens: int) -> tuple[float, list[str]]:
    started = time.perf_counter()
    texts = [translate(model, [sentence], num_beams=beams, max_new_tokens=new_tokens).texts[0]
             for sentence in sentences]
    return time.perf_counter() - started, texts


def served(url: str, sentences: list[str], beams: int, new_tokens: int, clients: int) -> tuple[float, list[str]]:
    """The sentences sent by ``clients`` threads over one pooled HTTP client (as an ``openai`` client keeps its
    connections), each thread a request at a time; the wall time and the texts in order."""
    connections = httpx2.Limits(max_connections=clients, max_keepalive_connections=clients)
    with httpx2.Client(base_url=url, timeout=600, limits=connections) as client:
        def ask(sentence: str) -> str:
            body = {"model": "m", "prompt": sentence, "max_tokens": new_tokens, "temperature": 0, "num_beams": beams,
                    "skip_special_tokens": True}
            answer = client.post("/v1/completions", json=body)
            answer.raise_for_status()
            return answer.json()["choices"][0]["text"].strip()

        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            texts = list(pool.map(ask, sentences))
        return time.perf_counter() - started, texts


def engine_alone(model, sentences: list[str], beams: int, new_tokens: int, in_flight: int) -> tuple[float, list[str]]:
    """The engine without HTTP, in this process: ``in_flight`` sentences decoding (each read as the server reads a
    source), a new one submitted as soon as one ends; the wall time and the texts in order."""
    engine = Engine(model, model.tokenizer, cache_tokens=65536, max_running=in_flight * beams)
    config = GenerationConfig(max_new_tokens=new_tokens, num_beams=beams, skip_special_tokens=True)
    end_id = source_end_id(model.tokenizer, model.config)
    started = time.perf_counter()
    requests, running, waiting = [], [], list(sentences)
    while waiting or engine.has_work():
        running = [request for request in running if not request.finished]
        while waiting and len(running) < in_flight:
            (ids,) = encode_sources(model.tokenizer, [waiting.pop(0)], end_id)
            requests.append(engine.submit(ids, config))
            running.append(requests[-1])
        engine.step()
    return time.perf_counter() - started, [request.texts()[0].strip() for request in requests]


def print_row(width: int, way: str, alone: list, batched: list) -> None:
    """One line: the one-at-a-time and batched medians (sentences a second), their ratio and each round's, and how
    many batched texts equal the one-at-a-time texts (the fewest over the rounds)."""
    count = len(alone[0][1])
    alone_rate, batched_rate = (statistics.median(count / seconds for seconds, _ in side) for side in (alone, batched))
    each = " ".join(f"{a / b:.2f}" for (a, _), (b, _) in zip(alone, batched, strict=True))
    equal = min(sum(x == y for x, y in zip(a, b, strict=True)) for (_, a), (_, b) in zip(alone, batched, strict=True))
    print(f"{width:>5}  {way:<12}  {alone_rate:>22.2f}  {batched_rate:>16.2f}  {batched_rate / alone_rate:>4.2f}x  "
          f"{each:>18}  {equal:>7}/{count}", flush=True)


def start_server(folder: Path, port: int, threads: int, running: int, log: Path,
                 options: tuple[str, ...] = ("--cache-tokens", "65536")) -> subprocess.Popen:
    """``tformer serve FOLDER`` (model name "m") with ``options``, once its /health answers."""
    command = [sys.executable, "-m", "tformer", "serve", str(folder), "--port", str(port), "--model-name", "m",
               "--threads", str(threads), "--max-running", str(running), *options]
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"tformer serve exited {process.returncode}; see {log}")
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx2.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise SystemExit(f"tformer serve was not ready after 300 s; see {log}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="a trained translation run (default: random weights)")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--beams", default="1,4", help="beam widths to measure (default: 1,4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each measurement; medians (default: 3)")
    parser.add_argument("--engine-alone", action="store_true", help="measure the engine without HTTP too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sentences = lines("test_2016_flickr.de.gz", args.sentences)
    beams = [int(width) for width in args.beams.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.run or untrained_folder(Path(scratch))
        model = tformer.load(folder).eval()
        print(f"model {folder if args.run else 'transformer-multi30k, random weights (seed 0)'}; "
              f"{len(sentences)} sentences of test_2016_flickr.de; {args.clients} clients; "
              f"at most {args.max_new_tokens} new tokens; {args.threads} threads; medians of {args.rounds} rounds",
              flush=True)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = start_server(folder, port, args.threads, args.clients * max(beams), Path(scratch) / "serve.log")
        try:
            served(url, sentences[:4], 1, 4, 4)  # warm-up: compiled kernels, first steps
            one_at_a_time(model, sentences[:2], 1, 4)
            work = {}
            for width in beams:
                work["alone", width] = lambda width=width: one_at_a_time(model, sentences, width, args.max_new_tokens)
                work["served", width] = lambda width=width: served(url, sentences, width, args.max_new_tokens,
                                                                   args.clients)
                if args.engine_alone:
                    work["engine alone", width] = lambda width=width: engine_alone(
                        model, sentences, width, args.max_new_tokens, args.clients)
            results = rotating(args.rounds, work)
            print("beams  way           one at a time (sent/s)  batched (sent/s)  ratio  each round's ratio  "
                  "texts equal")
            for width in beams:
                for way in ("served", "engine alone") if args.engine_alone else ("served",):
                    print_row(width, way, results["alone", width], results[way, width])
        finally:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    main()
