"""Served transcription beside transcription one recording at a time: ``tformer serve`` answering N concurrent
clients (``/v1/audio/transcriptions``, each request one WAV upload) against what ``tformer transcribe`` does for
each file (its features, then ``transcribe_ids`` window after window, batch of one) called on one recording after
another in this process, on FSDD connected-digit utterances, greedy and with 4 beams, in each ``--dtypes`` the
model is cast to (``--dtype`` of both commands).

Model: a trained speech run (``--run``; e.g. the FSDD recipe, ``configs/fsdd-digits.toml``, whose data
``benchmarks/speech_fsdd.py --out data/fsdd-digits`` writes). The one-at-a-time side uses ``--threads`` threads, the
server's engine ``--serve-threads`` (default: the same; its HTTP process runs beside them); the server's text is
checked against the one-at-a-time text of its dtype, and each dtype's one-at-a-time text against the first
dtype's. Figures: recordings per second over the whole list (wall time), medians of ``--rounds`` rounds (the two
sides in turn, which one first alternating), and served / one-at-a-time (the ratio of the medians, then each
round's); with several dtypes, the fastest served rate over the fastest one-at-a-time rate, each at its best
dtype. With ``--engine-alone``, the same for the engine without HTTP (``Engine.transcribe`` in this process,
``--clients`` recordings in flight). ``--gather-sources``: the server's (``tformer serve --gather-sources``).

    python benchmarks/served_transcription.py --run runs/fsdd-digits --data data/fsdd-digits/test.tsv \\
        --utterances 300 --clients 8 --threads 2 --dtypes fp32,bf16
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx2
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tformer  # noqa: E402
from tformer.cli.model_source import DTYPES  # noqa: E402
from tformer.data.audio import load_audio  # noqa: E402
from tformer.data.log_mel import recording_features  # noqa: E402
from tformer.generation import GenerationConfig  # noqa: E402
from tformer.generation.transcription import transcribe_ids, transcript_budget, transcription_prompt  # noqa: E402
from tformer.nn import compiled  # noqa: E402
from tformer.serving import Engine  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from served_translation import free_port, start_server  # noqa: E402


def manifest_paths(manifest: Path, count: int) -> list[Path]:
    """The first ``count`` recordings a speech manifest (columns audio, text, ...) lists."""
    with manifest.open(encoding="utf-8", newline="") as source:
        rows = list(csv.DictReader(source, delimiter="\t"))
    return [manifest.parent / row["audio"] for row in rows[:count]]


def one_at_a_time(model, paths: list[Path], beams: int) -> tuple[float, list[str]]:
    """``tformer transcribe``'s work for each file in turn (reading it included); the wall time and the texts."""
    prompt = transcription_prompt(model.tokenizer, model.config.vocab_size, None)
    budget = transcript_budget(model, prompt)
    texts = []
    started = time.perf_counter()
    for path in paths:
        samples = torch.from_numpy(load_audio(path, model.log_mel_settings.sample_rate))
        features = recording_features(samples, model.log_mel_settings)[None]
        with torch.inference_mode():
            ids = transcribe_ids(model, features, budget, decoder_prompt_ids=prompt, num_beams=beams)[0]
        texts.append(" ".join(model.tokenizer.decode(ids, skip_special_tokens=True).split()))
    return time.perf_counter() - started, texts


def served(url: str, paths: list[Path], beams: int, clients: int) -> tuple[float, list[str]]:
    """The recordings uploaded by ``clients`` threads over one pooled HTTP client, each thread a request at a time;
    the wall time and the texts in order."""
    uploads = [(path.name, path.read_bytes()) for path in paths]
    connections = httpx2.Limits(max_connections=clients, max_keepalive_connections=clients)
    with httpx2.Client(base_url=url, timeout=600, limits=connections) as client:
        def ask(upload: tuple[str, bytes]) -> str:
            answer = client.post("/v1/audio/transcriptions", files={"file": (*upload, "audio/wav")},
                                 data={"model": "m", "num_beams": str(beams)})
            answer.raise_for_status()
            return answer.json()["text"]

        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            texts = list(pool.map(ask, uploads))
        return time.perf_counter() - started, texts


def engine_alone(model, paths: list[Path], beams: int, in_flight: int,
                 gather_sources: int = 1) -> tuple[float, list[str]]:
    """The engine without HTTP, in this process: ``Engine.transcribe`` keeping ``in_flight`` recordings decoding,
    a new one submitted as soon as one ends; the wall time (reading the files included) and the texts in order."""
    engine = Engine(model, model.tokenizer, max_running=in_flight * beams, gather_sources=gather_sources)
    config = GenerationConfig(num_beams=beams)
    started = time.perf_counter()
    submitted: list[list] = []
    waiting = list(paths)
    while waiting or engine.has_work():
        while waiting and sum(not all(request.finished for request in requests) for requests in submitted) < in_flight:
            samples = torch.from_numpy(load_audio(waiting.pop(0), model.log_mel_settings.sample_rate))
            submitted.append(engine.transcribe(samples, config))
        engine.step()
    took = time.perf_counter() - started
    texts = []
    for requests in submitted:
        ids = [token for request in requests for token in request.outputs()[0] if token not in request.end_ids]
        texts.append(" ".join(model.tokenizer.decode(ids, skip_special_tokens=True).split()))
    return took, texts


def median_row(width: int, alone: list[tuple[float, list[str]]], batched: list[tuple[float, list[str]]],
               reference: list[str] | None) -> tuple[float, float]:
    """One line of the table: each side's median recordings a second, their ratio and each round's, how many
    served texts equal the one-at-a-time texts (every round), and how many one-at-a-time texts equal the
    ``reference`` dtype's. Returns the two medians."""
    count = len(alone[0][1])
    alone_rate = statistics.median(count / seconds for seconds, _ in alone)
    served_rate = statistics.median(count / seconds for seconds, _ in batched)
    rounds = " ".join(f"{alone_seconds / batched_seconds:.2f}" for (alone_seconds, _), (batched_seconds, _)
                      in zip(alone, batched, strict=True))
    equal = min(sum(a == b for a, b in zip(alone_texts, batched_texts, strict=True))
                for (_, alone_texts), (_, batched_texts) in zip(alone, batched, strict=True))
    first = "-" if reference is None else f"{sum(a == b for a, b in zip(alone[0][1], reference, strict=True))}/{count}"
    print(f"{width:>5}  {alone_rate:>22.2f}  {served_rate:>14.2f}  {served_rate / alone_rate:>21.2f}x  "
          f"{rounds:>18}  {equal}/{count:<10} {first}", flush=True)
    return alone_rate, served_rate


HEADER = ("beams  one at a time (rec/s)  served (rec/s)  served / one at a time  each round's ratio  texts equal  "
          "one-at-a-time texts equal to the first dtype's")


def in_turns(rounds: int, first, second) -> tuple[list, list]:
    """``first()`` and ``second()`` ``rounds`` times each, which one goes first alternating."""
    firsts, seconds = [], []
    for index in range(rounds):
        if index % 2 == 0:
            firsts.append(first())
            seconds.append(second())
        else:
            seconds.append(second())
            firsts.append(first())
    return firsts, seconds


def measure_dtype(args, dtype: str, paths: list[Path], beams: list[int], serve_threads: int,
                  reference: dict[int, list[str]]) -> dict[int, tuple[float, float]]:
    """Both sides in one dtype, every beam width: the median rates by width (one at a time, served). The first
    dtype's one-at-a-time texts become ``reference``."""
    model = tformer.load(args.run, dtype=getattr(torch, DTYPES[dtype])).eval()
    compiled.ready(model.device)
    rates = {}
    with tempfile.TemporaryDirectory() as scratch:
        port = free_port()
        server = start_server(args.run, port, serve_threads, args.clients * max(beams), Path(scratch) / "serve.log",
                              ("--max-body-bytes", str(64 << 20), "--dtype", dtype,
                               "--gather-sources", str(args.gather_sources)))
        url = f"http://127.0.0.1:{port}"
        try:
            served(url, paths[:4], 1, 4)  # warm-up: compiled kernels, first steps
            one_at_a_time(model, paths[:2], 1)
            print(f"\n{dtype}\n{HEADER}", flush=True)
            for width in beams:
                alone, batched = in_turns(args.rounds, lambda width=width: one_at_a_time(model, paths, width),
                                          lambda width=width: served(url, paths, width, args.clients))
                rates[width] = median_row(width, alone, batched, reference.get(width))
                reference.setdefault(width, alone[0][1])
            if args.engine_alone:
                print(f"the engine alone (no HTTP, {args.clients} recordings in flight, {args.threads} threads)")
                for width in beams:
                    alone, batched = in_turns(args.rounds, lambda width=width: one_at_a_time(model, paths, width),
                                              lambda width=width: engine_alone(model, paths, width, args.clients,
                                                                               args.gather_sources))
                    median_row(width, alone, batched, reference.get(width))
        finally:
            server.terminate()
            server.wait(timeout=60)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a trained speech run or model folder")
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "fsdd-digits" / "test.tsv",
                        help="a speech manifest (default: data/fsdd-digits/test.tsv)")
    parser.add_argument("--utterances", type=int, default=300, help="the manifest's first N (default: 300)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2, help="threads of the one-at-a-time side (default: 2)")
    parser.add_argument("--serve-threads", type=int, help="the server's engine threads (default: --threads; the "
                                                          "HTTP process, which reads and resamples the uploads, runs "
                                                          "beside them)")
    parser.add_argument("--beams", default="1,4", help="beam widths to measure (default: 1,4)")
    parser.add_argument("--dtypes", default="fp32", help="the model's dtypes, both sides alike, each measured in "
                                                         "turn: fp32, bf16, fp16 (default: fp32)")
    parser.add_argument("--gather-sources", type=int, default=1,
                        help="the server's (and the engine alone's) --gather-sources (default: 1, tformer serve's)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each measurement; medians (default: 3)")
    parser.add_argument("--engine-alone", action="store_true",
                        help="also time the engine without HTTP, in this process (what the server adds to it)")
    args = parser.parse_args()
    dtypes = args.dtypes.split(",")
    if unknown := [dtype for dtype in dtypes if dtype not in DTYPES]:
        parser.error(f"--dtypes: {', '.join(unknown)} is not one of {', '.join(DTYPES)}")
    serve_threads = args.serve_threads or args.threads
    torch.set_num_threads(args.threads)
    paths = manifest_paths(args.data, args.utterances)
    beams = [int(width) for width in args.beams.split(",")]
    seconds = sum(len(load_audio(path, 16000)) for path in paths) / 16000
    print(f"model {args.run}; {len(paths)} recordings of {args.data} ({seconds:.1f} s of audio); {args.clients} "
          f"clients; {args.threads} threads one at a time, the server's engine {serve_threads}, gathering "
          f"{args.gather_sources} source(s); medians of {args.rounds} rounds", flush=True)
    reference: dict[int, list[str]] = {}
    rates = {dtype: measure_dtype(args, dtype, paths, beams, serve_threads, reference) for dtype in dtypes}
    if len(dtypes) > 1:
        print("\neach side at its fastest dtype")
        for width in beams:
            alone_dtype = max(dtypes, key=lambda dtype: rates[dtype][width][0])
            served_dtype = max(dtypes, key=lambda dtype: rates[dtype][width][1])
            alone_rate, served_rate = rates[alone_dtype][width][0], rates[served_dtype][width][1]
            print(f"beams {width}: served {served_rate:.2f} rec/s ({served_dtype}) / one at a time {alone_rate:.2f} "
                  f"rec/s ({alone_dtype}) = {served_rate / alone_rate:.2f}x", flush=True)


if __name__ == "__main__":
    main()
