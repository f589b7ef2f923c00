"""tformer's tokenizers against Hugging Face's `tokenizers`, side by side, in one run:
byte-level BPE training on tinyshakespeare (vocab 8192) and GPT-2 encoding throughput over
the whole text (one string, and encode_batch over its lines).

    python benchmarks/tokenizer_speed.py [--repeats 5] [--data ../shared/data]

Times are wall-clock medians over the repeats; ratios compare speeds measured in this same run
(> 1 means tformer is faster). "cold" runs start with empty word caches in both libraries (a
first pass over new text); "warm" runs encode the same text again. `tokenizers` uses every core
for encode_batch and training; tformer uses one. The last column compares process CPU time
(all threads), which a busy shared machine disturbs less than wall-clock time."""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TRAIN_VOCAB = 8192


def median_seconds(run, repeats: int, before=None) -> tuple[float, float]:
    """Median wall and CPU seconds of ``run()``, calling ``before()`` (untimed) ahead of each."""
    wall, cpu = [], []
    for _ in range(repeats):
        if before is not None:
            before()
        started, started_cpu = time.perf_counter(), time.process_time()
        run()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="repetitions per measurement (median reported)")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data", help="the shared data folder")
    args = parser.parse_args()

    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from tformer.tokenizers import BPETokenizer, load

    corpus_gz = args.data / "tinyshakespeare" / "input.txt.gz"
    gpt2_dir = args.data / "tokenizers" / "gpt2"
    for needed in (corpus_gz, gpt2_dir / "encoder.json", gpt2_dir / "vocab.bpe"):
        if not needed.exists():
            print(f"missing {needed}: this benchmark needs the shared datasets", file=sys.stderr)
            return 2
    with gzip.open(corpus_gz, "rt", encoding="utf-8") as handle:
        text = handle.read()
    lines = text.splitlines(keepends=True)
    megabytes = len(text.encode("utf-8")) / 1e6
    load_before = os.getloadavg()[0]
    rows = []

    # ---- training: both read the same plain-text file ---------------------------------------------
    with tempfile.TemporaryDirectory() as folder:
        corpus = Path(folder) / "input.txt"
        corpus.write_text(text, encoding="utf-8")

        def train_tformer():
            return BPETokenizer.train(corpus, vocab_size=TRAIN_VOCAB, min_frequency=2, special_tokens=["<|endoftext|>"])

        def train_tokenizers():
            tokenizer = tokenizers.Tokenizer(models.BPE())
            tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tokenizer.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(vocab_size=TRAIN_VOCAB, min_frequency=2, special_tokens=["<|endoftext|>"],
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
            tokenizer.train([str(corpus)], trainer)
            return tokenizer

        ours_trained, theirs_trained = train_tformer(), train_tokenizers()
        same_vocab = ours_trained.get_vocab() == theirs_trained.get_vocab()
        (ours_s, ours_cpu), (theirs_s, theirs_cpu) = (median_seconds(train_tformer, args.repeats),
                                                      median_seconds(train_tokenizers, args.repeats))
        rows.append((f"BPE training, vocab {TRAIN_VOCAB} (s)", ours_s, theirs_s, theirs_s / ours_s,
                     theirs_cpu / ours_cpu))

    # ---- encoding with the GPT-2 vocabulary ---------------------------------------------------------
    ours = load(gpt2_dir)
    theirs = tokenizers.Tokenizer(models.BPE.from_file(str(gpt2_dir / "encoder.json"), str(gpt2_dir / "vocab.bpe")))
    theirs.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    theirs.decoder = decoders.ByteLevel()
    theirs.add_special_tokens(["<|endoftext|>"])
    identical = ours.encode(text) == theirs.encode(text).ids and (
        ours.encode_batch(lines)["input_ids"] == [encoding.ids for encoding in theirs.encode_batch(lines)])

    def clear_both():
        ours._clear_cache()
        theirs.model._clear_cache()

    for label, ours_run, theirs_run in (
        ("encode one string", lambda: ours.encode(text), lambda: theirs.encode(text)),
        (f"encode_batch, {len(lines):,} lines", lambda: ours.encode_batch(lines), lambda: theirs.encode_batch(lines)),
    ):
        for state, before in (("cold", clear_both), ("warm", None)):
            ours_s, ours_cpu = median_seconds(ours_run, args.repeats, before)
            theirs_s, theirs_cpu = median_seconds(theirs_run, args.repeats, before)
            rows.append((f"{label}, {state} (MB/s)", megabytes / ours_s, megabytes / theirs_s, theirs_s / ours_s,
                         theirs_cpu / ours_cpu))

    print(f"tformer vs tokenizers {tokenizers.__version__} on tinyshakespeare ({megabytes * 1e6:,.0f} bytes); "
          f"median of {args.repeats}; {os.cpu_count()} CPUs, load average {load_before:.1f} -> "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'':42s} {'tformer':>10s} {'tokenizers':>11s} {'speed ratio':>12s} {'CPU ratio':>10s}")
    for label, ours_value, theirs_value, ratio, cpu_ratio in rows:
        print(f"{label:42s} {ours_value:10.3f} {theirs_value:11.3f} {ratio:12.2f} {cpu_ratio:10.2f}")
    print(f"trained vocabularies identical: {same_vocab}; GPT-2 ids identical (string and batch): {identical}")
    print("speed ratio = tokenizers wall time / tformer wall time (> 1: tformer faster); CPU ratio = the same "
          "with CPU time; targets: training <= 5 s, encoding speed ratio >= 1.0")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
