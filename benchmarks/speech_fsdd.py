"""Connected spoken digits from the Free Spoken Digit Dataset: a speech recognition corpus written in seconds.

Each utterance is 2-7 FSDD recordings of one speaker joined by 50-300 ms of silence (20-100 ms at the
ends), at FSDD's 8 kHz; its transcript is the digit words ("three one four"). The official split tests on
takes 0-4 and trains on takes 5-49; ``--held-out-speaker NAME`` tests on every take of one speaker and
trains on the other five. The same ``--seed`` writes byte-identical files (tformer.data.fsdd has the rules).

    python benchmarks/speech_fsdd.py [--out runs/fsdd-digits] [--train 3000] [--test 300] [--seed 0]
                                     [--held-out-speaker theo] [--source FSDD/recordings]

It writes OUT/train/NNNNN.wav, OUT/test/NNNNN.wav, OUT/train.tsv and OUT/test.tsv (columns audio, text,
speaker, recordings: a manifest tformer.data.speech reads) and OUT/fsdd_digits.json, and prints what each
split holds. It replaces a folder only if it wrote it; ``--overwrite`` moves other contents aside.

Measured here (2 AMD EPYC cores shared with a training run, load average 4): the defaults (3,300
utterances, 2.47 hours of audio, 145 MB) in 2.6-6.3 s (benchmarks/logs/speech_fsdd-2026-11-26.log).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from data_roots import data_path  # noqa: E402

from tformer.data.fsdd import SPLITS, DigitSettings, build_digit_corpus  # noqa: E402
from tformer.errors import TformerError  # noqa: E402

DEFAULT_SOURCE = data_path("fsdd/recordings")


def summary_table(corpus) -> str:
    """What each split holds: utterances, hours, speakers, source recordings used, digits an utterance."""
    settings = corpus.settings
    spans = range(settings.min_digits, settings.max_digits + 1)
    head = ["split", "utterances", "hours", "speakers", "recordings", *(f"{n} digits" for n in spans)]
    rows = [head]
    for split in SPLITS:
        summary = corpus.splits[split]
        rows.append([split, f"{summary.utterances:,}", f"{summary.seconds / 3600:.3f}", str(len(summary.speakers)),
                     f"{summary.recordings_used:,}", *(f"{summary.digits.get(n, 0):,}" for n in spans)])
    widths = [max(len(row[column]) for row in rows) for column in range(len(head))]
    lines = ["  ".join(cell.rjust(width) if column else cell.ljust(width)
                       for column, (cell, width) in enumerate(zip(row, widths, strict=True))) for row in rows]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE,
                        help="FSDD's recordings folder (default: the dataset fsdd's, from the data roots)")
    parser.add_argument("--out", type=Path, default=Path("runs/fsdd-digits"), help="output folder (runs/fsdd-digits)")
    defaults = DigitSettings()
    parser.add_argument("--train", type=int, default=defaults.train_utterances, help="training utterances (3000)")
    parser.add_argument("--test", type=int, default=defaults.test_utterances, help="test utterances (300)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="the seed of every draw (0)")
    parser.add_argument("--held-out-speaker", metavar="NAME",
                        help="test on this speaker's recordings, train on the others' (default: the official "
                             "split by take)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an output folder this script did not write, moving its contents aside")
    args = parser.parse_args()
    started = time.perf_counter()
    try:
        settings = DigitSettings(train_utterances=args.train, test_utterances=args.test, seed=args.seed,
                                 held_out_speaker=args.held_out_speaker)
        corpus = build_digit_corpus(args.source, args.out, settings, overwrite=args.overwrite)
    except TformerError as error:
        print(f"speech_fsdd: {error}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - started
    if corpus.moved_aside is not None:
        print(f"moved the old contents of {corpus.folder} to {corpus.moved_aside}")
    hours = sum(summary.seconds for summary in corpus.splits.values()) / 3600
    print(f"FSDD connected digits, {settings.split} split, seed {settings.seed}, {corpus.sample_rate:,} Hz: "
          f"{corpus.folder}")
    print(summary_table(corpus))
    print(f"{hours:.2f} hours of audio written in {seconds:.1f} s; manifests {corpus.manifest('train')} and "
          f"{corpus.manifest('test')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
