"""Served transcription beside transcription one recording at a time: ``tformer serve`` answering N concurrent
clients (``/v1/audio/transcriptions``, each request one WAV upload) against what ``tformer transcribe`` does for
each file (its features, then ``transcribe_ids`` window after window, batch of one) called on one recording after
another in this process, on FSDD connected-digit utterances, greedy and with 4 beams, in each ``--dtypes`` the
model is cast to (``--dtype`` of both commands).

Model: a trained speech run (``--run``; e.g. the FSDD recipe, ``configs/fsdd-digits.toml``, whose data
``benchmarks/speech_fsdd.py --out data/fsdd-digits`` writes). The one-at-a-time side uses ``--threads`` threads, the
server's engine ``--serve-threads`` (default: the same; its HTTP process runs beside them); the server's text is
checked against the one-at-a-time text of its dtype, and each dtype's one-at-a-time text against the first
dtype's. Each round runs every measurement once (each dtype one at a time and served, one server a dtype), in an
order that rotates from round to round, so that the host's drift falls on all of them alike. Figures: recordings
per second over the whole list (wall time), medians of ``--rounds`` rounds, and served / one-at-a-time (the ratio of
the medians, then each round's); with several dtypes, the fastest served dtype over the fastest one-at-a-time
dtype, round by round. With ``--engine-alone``, the same for the engine without HTTP (``Engine.transcribe`` in this
process, ``--clients`` recordings in flight). ``--gather-sources``: the server's (``tformer serve --gather-sources``).

    python benchmarks/served_transcription.py --run runs/fsdd-digits --data data/fsdd-digits/test.tsv \\
        --utterances 300 --clients 8 --threads 2 --dtypes fp32,bf16
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
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
from timing import rotating  # noqa: E402


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
    unfinished: list[list] = []  # the recordings in flight: each one's window requests
    waiting = list(paths)
    while waiting or engine.has_work():
        unfinished = [requests for requests in unfinished if not all(request.finished for request in requests)]
        while waiting and len(unfinished) < in_flight:
            samples = torch.from_numpy(load_audio(waiting.pop(0), model.log_mel_settings.sample_rate))
            submitted.append(engine.transcribe(samples, config))
            unfinished.append(submitted[-1])
        engine.step()
    took = time.perf_counter() - started
    texts = []
    for requests in submitted:
        ids = [token for request in requests for token in request.outputs()[0] if token not in request.end_ids]
        texts.append(" ".join(model.tokenizer.decode(ids, skip_special_tokens=True).split()))
    return took, texts


def rate(results: list[tuple[float, list[str]]]) -> float:
    """The median recordings a second of one side's rounds."""
    return statistics.median(len(texts) / seconds for seconds, texts in results)


def print_row(dtype: str, way: str, alone: list, batched: list, reference: list[str] | None) -> None:
    """One line: the one-at-a-time and batched medians, their ratio and each round's, how many batched texts equal
    the one-at-a-time texts (the fewest over the rounds), and how many one-at-a-time texts equal ``reference``'s."""
    count = len(alone[0][1])
    rounds = " ".join(f"{a / b:.2f}" for (a, _), (b, _) in zip(alone, batched, strict=True))
    equal = min(sum(x == y for x, y in zip(a, b, strict=True)) for (_, a), (_, b) in zip(alone, batched, strict=True))
    first = "-" if reference is None else f"{sum(x == y for x, y in zip(alone[0][1], reference, strict=True))}/{count}"
    print(f"{dtype:<5}  {way:<12}  {rate(alone):>21.2f}  {rate(batched):>15.2f}  {rate(batched) / rate(alone):>5.2f}x  "
          f"{rounds:>18}  {equal:>7}/{count}  {first}", flush=True)


def measure_width(args, width: int, models: dict, urls: dict[str, str], paths: list[Path]) -> None:
    """Every dtype's one-at-a-time, served (and engine-alone) rates at ``width`` beams, in rotating rounds; the
    rows, then the fastest served dtype against the fastest one-at-a-time dtype, round by round."""
    work = {}
    for dtype, model in models.items():
        work[dtype, "one at a time"] = lambda model=model: one_at_a_time(model, paths, width)
        work[dtype, "served"] = lambda url=urls[dtype]: served(url, paths, width, args.clients)
        if args.engine_alone:
            work[dtype, "engine alone"] = lambda model=model: engine_alone(model, paths, width, args.clients,
                                                                             args.gather_sources)
    results = rotating(args.rounds, work)
    print(f"\nbeams {width}\n{HEADER}")
    first = next(iter(models))
    for dtype in models:
        reference = None if dtype == first else results[first, "one at a time"][0][1]
        for way in ("served", "engine alone")[: 1 + args.engine_alone]:
            print_row(dtype, way, results[dtype, "one at a time"], results[dtype, way], reference)
    if len(models) > 1:
        alone = max(models, key=lambda dtype: rate(results[dtype, "one at a time"]))
        batched = max(models, key=lambda dtype: rate(results[dtype, "served"]))
        ratios = " ".join(f"{a / b:.2f}" for (a, _), (b, _) in zip(results[alone, "one at a time"],
                                                                    results[batched, "served"], strict=True))
        print(f"each side at its fastest dtype: served {rate(results[batched, 'served']):.2f} rec/s ({batched}) / one "
              f"at a time {rate(results[alone, 'one at a time']):.2f} rec/s ({alone}) = "
              f"{rate(results[batched, 'served']) / rate(results[alone, 'one at a time']):.2f}x; each round's "
              f"{ratios}", flush=True)


HEADER = ("dtype  way           one at a time (rec/s)  batched (rec/s)  ratio  each round's ratio  texts equal  "
          "one-at-a-time texts equal to the first dtype's")


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
    parser.add_argument("--dtypes", default="fp32", help="the model's dtypes, both sides alike, measured in the same "
                                                         "rounds: fp32, bf16, fp16 (default: fp32)")
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
    models = {dtype: tformer.load(args.run, dtype=getattr(torch, DTYPES[dtype])).eval() for dtype in dtypes}
    compiled.ready(next(iter(models.values())).device)
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as servers:
        urls = {}
        for dtype in dtypes:  # one server a dtype, all up at once: an idle one only waits on its pipe
            port = free_port()
            server = start_server(args.run, port, serve_threads, args.clients * max(beams),
                                  Path(scratch) / f"serve-{dtype}.log",
                                  ("--max-body-bytes", str(64 << 20), "--dtype", dtype,
                                   "--gather-sources", str(args.gather_sources)))
            servers.callback(stop, server)
            urls[dtype] = f"http://127.0.0.1:{port}"
            served(urls[dtype], paths[:4], 1, 4)  # warm-up: compiled kernels, first steps
            one_at_a_time(models[dtype], paths[:2], 1)
        for width in beams:
            measure_width(args, width, models, urls, paths)


def stop(server) -> None:
    """End a server started by ``start_server``."""
    server.terminate()
    server.wait(timeout=60)

if __name__ == "__main__":
    main()
