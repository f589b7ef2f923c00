"""Which resampler turns recordings into Whisper's 16 kHz: quality and speed of the candidates.

Candidates: soxr (libsoxr, "HQ" and "VHQ"), scipy's polyphase filter (``scipy.signal.resample_poly``, its
default Kaiser window), and linear interpolation as the floor. Quality, against the analytic signal:
- passband: tones of 100 Hz to 3.6 kHz at 8 kHz (FSDD's rate) resampled to 16 kHz, error in dB below the
  signal (signal-to-error ratio; edges excluded);
- stopband: a 9 kHz tone at 44.1 kHz resampled to 16 kHz (above the new Nyquist, 8 kHz): what survives,
  in dB below the input (it should be removed, not folded to 7 kHz);
- speed: 10 minutes of 8 kHz and of 44.1 kHz audio to 16 kHz, median of 5, in x real time.

    python benchmarks/resample_quality.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np

SECONDS = 2.0
EDGE = 0.1  # seconds at each end left out of the comparison (filters' start-up)


def tone(frequency: float, rate: int, seconds: float = SECONDS) -> np.ndarray:
    return np.sin(2 * np.pi * frequency * np.arange(int(seconds * rate)) / rate).astype(np.float32)


def linear(samples: np.ndarray, source: int, target: int) -> np.ndarray:
    times = np.arange(int(len(samples) * target / source)) * source / target
    return np.interp(times, np.arange(len(samples)), samples).astype(np.float32)


def candidates() -> dict:
    import soxr
    from scipy.signal import resample_poly

    def polyphase(samples, source, target):
        divisor = np.gcd(source, target)
        return resample_poly(samples, target // divisor, source // divisor).astype(np.float32)

    return {
        "soxr HQ": lambda samples, source, target: soxr.resample(samples, source, target, quality="HQ"),
        "soxr VHQ": lambda samples, source, target: soxr.resample(samples, source, target, quality="VHQ"),
        "scipy resample_poly": polyphase,
        "linear interpolation": linear,
    }


def decibels(ratio: float) -> float:
    return 10 * np.log10(max(ratio, 1e-30))


def passband_error(resample) -> float:
    """The worst signal-to-error ratio (dB) over tones in the 8 kHz recording's band."""
    worst = np.inf
    for frequency in (100.0, 440.0, 1000.0, 2000.0, 3000.0, 3600.0):
        output = resample(tone(frequency, 8000), 8000, 16000)
        expected = tone(frequency, 16000)[: len(output)]
        inner = slice(int(EDGE * 16000), len(output) - int(EDGE * 16000))
        error = np.mean((output[inner] - expected[inner]) ** 2)
        worst = min(worst, decibels(np.mean(expected[inner] ** 2) / error))
    return worst


def stopband_leak(resample) -> float:
    """What remains of a 9 kHz tone at 44.1 kHz after resampling to 16 kHz, in dB below the input."""
    output = resample(tone(9000.0, 44100), 44100, 16000)
    inner = output[int(EDGE * 16000): len(output) - int(EDGE * 16000)]
    return -decibels(np.mean(inner ** 2) / 0.5)


def speed(resample, source: int) -> float:
    samples = np.random.default_rng(0).standard_normal(600 * source).astype(np.float32)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        resample(samples, source, 16000)
        times.append(time.perf_counter() - start)
    return 600 / statistics.median(times)


def main() -> None:
    print(f"{'resampler':<22} {'passband SER dB':>16} {'9 kHz leak dB':>14} {'8k->16k x rt':>13} "
          f"{'44.1k->16k x rt':>16}")
    for name, resample in candidates().items():
        print(f"{name:<22} {passband_error(resample):>16.1f} {stopband_leak(resample):>14.1f} "
              f"{speed(resample, 8000):>13,.0f} {speed(resample, 44100):>16,.0f}")


if __name__ == "__main__":
    main()
