"""Log-mel features of real recordings: tformer's ``recording_features`` (what ``tformer transcribe`` and the
server compute for each upload: the STFT of the recording, its zero padding filled in) against the same function's
STFT of the whole window (``log_mel_spectrogram`` of the padded audio, as before the padding was skipped) and
Hugging Face's ``WhisperFeatureExtractor`` (numpy), on the first ``--utterances`` FSDD test recordings, in
Whisper's 30 s window and in the FSDD recipe's 7.5 s one; milliseconds a recording (medians of interleaved
rounds), and how many recordings' features are equal, bit for bit, to the whole window's.

    python benchmarks/feature_speed.py [--utterances 100] [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.timing import interleaved  # noqa: E402
from tformer.data.audio import load_audio  # noqa: E402
from tformer.data.log_mel import LogMelSettings, log_mel_spectrogram, pad_to_windows, recording_features  # noqa: E402

DATA = ROOT / "data" / "fsdd-digits"
WINDOWS = {"Whisper's 30 s": 480_000, "the FSDD recipe's 7.5 s": 120_000}


def recordings(count: int) -> list[torch.Tensor]:
    """The first ``count`` FSDD test recordings at 16 kHz."""
    manifest = DATA / "test.tsv"
    if not manifest.exists():
        raise SystemExit(f"{manifest}: not built; run python benchmarks/speech_fsdd.py --out {DATA.relative_to(ROOT)}")
    paths = [DATA / line.split("\t")[0] for line in manifest.read_text().splitlines()[1:count + 1]]
    return [torch.from_numpy(load_audio(path)) for path in paths]


def whole_window(samples: torch.Tensor, settings: LogMelSettings) -> torch.Tensor:
    """The features of the padded window, every frame transformed."""
    return log_mel_spectrogram(pad_to_windows(samples, settings.window_samples), settings)


def hugging_face(window_samples: int):
    """WhisperFeatureExtractor of Whisper's settings, for a window of ``window_samples``: recording -> features."""
    import transformers

    transformers.logging.set_verbosity_error()
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    extractor.n_samples, extractor.nb_max_frames = window_samples, window_samples // extractor.hop_length  # 7.5 s
    return lambda samples: extractor(samples.numpy(), sampling_rate=16_000, return_tensors="np").input_features


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--utterances", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    audio = recordings(args.utterances)
    seconds = sum(len(samples) for samples in audio) / 16_000
    print(f"{len(audio)} FSDD test recordings, {seconds / len(audio):.2f} s each on average; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads; ms a recording, medians of {args.rounds} rounds")
    for name, window_samples in WINDOWS.items():
        settings = LogMelSettings(window_samples=window_samples)
        extractor = hugging_face(window_samples)
        equal = sum(torch.equal(recording_features(samples, settings), whole_window(samples, settings))
                    for samples in audio)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gap = max(float(np.abs(recording_features(samples, settings).numpy() - extractor(samples)[0]).max())
                      for samples in audio)
        work = {"tformer": lambda settings=settings: [recording_features(samples, settings) for samples in audio],
                "whole window": lambda settings=settings: [whole_window(samples, settings) for samples in audio],
                "Hugging Face": lambda extractor=extractor: [extractor(samples) for samples in audio]}
        print(f"\n{name} window ({window_samples // 160} frames)")
        times = interleaved(work, args.rounds, 1)
        ours = statistics.median(times["tformer"])
        for key, values in times.items():
            median = statistics.median(values)
            print(f"  {key:<13} {median / len(audio) * 1000:6.2f} ms  ({median / ours:.2f}x tformer's time)")
        print(f"  features equal to the whole window's: {equal}/{len(audio)}; largest difference from Hugging "
              f"Face's: {gap:.2e}")


if __name__ == "__main__":
    main()
