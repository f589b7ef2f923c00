"""Extractive-QA preprocessing speed, tformer against ``transformers``' BertTokenizerFast in one
run: every question of the SQuAD v1.1 dev set with its context, cut into 384-token windows with
a stride of 128, with offsets and the window -> question mapping, padded to 384.

    python benchmarks/qa_windows_speed.py [--repeats 3] [--data ../shared/data]

Both produce identical rows (checked here). Times are medians over the repeats, the two libraries
interleaved; the CPU column counts every thread (``tokenizers`` may use several)."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OPTIONS = {"truncation": "only_second", "max_length": 384, "stride": 128, "return_overflowing_tokens": True,
           "return_offsets_mapping": True, "padding": "max_length"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="repetitions per library (median reported)")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data", help="the shared data folder")
    args = parser.parse_args()

    import transformers

    from tformer.tokenizers import load

    squad, vocab = args.data / "squad-v1.1" / "dev-v1.1.json.gz", args.data / "tokenizers" / "bert-base-uncased"
    for needed in (squad, vocab / "vocab.txt"):
        if not needed.exists():
            print(f"missing {needed}: this benchmark needs the shared datasets", file=sys.stderr)
            return 2
    with gzip.open(squad, "rt", encoding="utf-8") as handle:
        articles = json.load(handle)["data"]
    questions, contexts = [], []
    for article in articles:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                questions.append(qa["question"])
                contexts.append(paragraph["context"])

    ours = load(vocab)
    theirs = transformers.BertTokenizerFast(str(vocab / "vocab.txt"))
    ours_batch, theirs_batch = ours.encode_batch(questions, contexts, **OPTIONS), theirs(questions, contexts, **OPTIONS)
    identical = all(ours_batch[key] == theirs_batch[key] for key in
                    ("input_ids", "token_type_ids", "attention_mask", "overflow_to_sample_mapping")) and (
        ours_batch["offset_mapping"] == [[tuple(span) for span in row] for row in theirs_batch["offset_mapping"]])

    load_before = os.getloadavg()[0]
    times: dict[str, list[tuple[float, float]]] = {"tformer": [], "transformers": []}
    for _ in range(args.repeats):
        for name, run in (("tformer", lambda: ours.encode_batch(questions, contexts, **OPTIONS)),
                          ("transformers", lambda: theirs(questions, contexts, **OPTIONS))):
            started, started_cpu = time.perf_counter(), time.process_time()
            run()
            times[name].append((time.perf_counter() - started, time.process_time() - started_cpu))
    print(f"SQuAD v1.1 dev: {len(questions):,} questions -> {len(ours_batch['input_ids']):,} windows of 384 "
          f"(stride 128, offsets, padded); median of {args.repeats}; {os.cpu_count()} CPUs, load average "
          f"{load_before:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'':14s} {'wall s':>8s} {'CPU s':>8s}")
    medians = {}
    for name, runs in times.items():
        medians[name] = (statistics.median(wall for wall, _ in runs), statistics.median(cpu for _, cpu in runs))
        print(f"{name:14s} {medians[name][0]:8.2f} {medians[name][1]:8.2f}")
    print(f"speed ratio (transformers wall / tformer wall): {medians['transformers'][0] / medians['tformer'][0]:.2f}; "
          f"CPU ratio: {medians['transformers'][1] / medians['tformer'][1]:.2f}; rows identical: {identical}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
