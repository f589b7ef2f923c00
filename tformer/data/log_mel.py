"""Log-mel features as Whisper computes them: a 400-point periodic Hann STFT every 160 samples of 16 kHz
audio (25 ms windows, 10 ms apart), power spectra through a Slaney-style mel filter bank (80 or 128
filters from 0 Hz to 8 kHz, each of unit area), log10 with a floor of 1e-10, clipped to 8 decades below
each example's peak, then scaled as (x + 4) / 4.

A model may also normalise each recording (``LogMelSettings.normalization = "utterance"``, the speech models'
``feature_normalization``): Whisper's features keep the recording's level and its microphone's colouring, which
a model trained on a few voices learns as part of the words; ``normalize_windows`` takes them out.

Written as tensor operations over a batch (B, N), on the audio's device. The tests hold the features
equal to Hugging Face's ``WhisperFeatureExtractor`` within 1e-4 on real recordings and synthetic tones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

LOG_FLOOR = 1e-10
DYNAMIC_RANGE = 8.0  # decades kept below the peak
# The Slaney mel scale: linear (3 mels per 200 Hz) below 1 kHz, logarithmic above (27 mels per factor 6.4).
LINEAR_HERTZ_PER_MEL = 200.0 / 3.0
LOG_START_HERTZ = 1000.0
LOG_START_MEL = LOG_START_HERTZ / LINEAR_HERTZ_PER_MEL
MELS_PER_LOG_UNIT = 27.0 / math.log(6.4)


@dataclass(frozen=True)
class LogMelSettings:
    """The front end of a Whisper-style model: ``window_samples`` is its fixed input (30 s at 16 kHz),
    which the encoder sees as ``window_samples / hop_length`` frames; ``normalization`` what
    ``normalize_windows`` does to each window after ``log_mel_spectrogram`` (``NORMALIZATIONS``)."""

    num_mel_bins: int = 80
    sample_rate: int = 16_000
    n_fft: int = 400
    hop_length: int = 160
    window_samples: int = 480_000
    normalization: str = "none"

    @property
    def window_frames(self) -> int:
        return self.window_samples // self.hop_length


def hertz_to_mel(hertz: np.ndarray) -> np.ndarray:
    hertz = np.asarray(hertz, dtype=np.float64)
    logarithmic = LOG_START_MEL + np.log(np.maximum(hertz, LOG_START_HERTZ) / LOG_START_HERTZ) * MELS_PER_LOG_UNIT
    return np.where(hertz >= LOG_START_HERTZ, logarithmic, hertz / LINEAR_HERTZ_PER_MEL)


def mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    mels = np.asarray(mels, dtype=np.float64)
    logarithmic = LOG_START_HERTZ * np.exp((np.maximum(mels, LOG_START_MEL) - LOG_START_MEL) / MELS_PER_LOG_UNIT)
    return np.where(mels >= LOG_START_MEL, logarithmic, mels * LINEAR_HERTZ_PER_MEL)


def mel_edges(num_mel_bins: int, min_hertz: float, max_hertz: float) -> np.ndarray:
    """The ``num_mel_bins + 2`` points, in mels, evenly spaced from min_hertz to max_hertz: filter m of the
    bank rises from point m, peaks at point m + 1 and falls to point m + 2."""
    return np.linspace(hertz_to_mel(min_hertz), hertz_to_mel(max_hertz), num_mel_bins + 2)


@lru_cache(maxsize=8)
def mel_filter_bank(num_mel_bins: int, n_fft: int, sample_rate: int, min_hertz: float = 0.0,
                    max_hertz: float | None = None) -> np.ndarray:
    """Triangular filters (n_fft // 2 + 1, num_mel_bins), float64: filter m rises from the (m)th to the
    (m+1)th of ``num_mel_bins + 2`` points evenly spaced in mels and falls to the (m+2)th, scaled to unit
    area (2 / its width in Hz, Slaney's normalisation)."""
    max_hertz = sample_rate / 2 if max_hertz is None else max_hertz
    edges = mel_to_hertz(mel_edges(num_mel_bins, min_hertz, max_hertz))
    bins = np.linspace(0.0, sample_rate // 2, n_fft // 2 + 1)
    widths = np.diff(edges)
    offsets = edges[None, :] - bins[:, None]  # (F, M + 2): how far each edge lies above each bin
    rising = -offsets[:, :-2] / widths[:-1]
    falling = offsets[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(rising, falling))
    return filters * (2.0 / (edges[2:] - edges[:-2]))[None, :]


NORMALIZATIONS = ("none", "utterance")  # LogMelSettings.normalization: Whisper's features as they are, or per recording
NORMALIZATION_EPS = 1e-3  # added to a window's spread before dividing (a silent window has none)
WARP_BOUNDARY = 0.8  # of the Nyquist frequency: above it the warp bends back to leave the top edge in place


def warp_frequencies(features: Tensor, factors: Tensor, settings: LogMelSettings = LogMelSettings()) -> Tensor:
    """Features (B, M, F) as if each row's speaker had a vocal tract ``factors`` (B,) times shorter: vocal
    tract length perturbation (Jaitly and Hinton 2013) on log-mel features. Row b's spectrum moves up by
    factors[b] (a frequency f is heard at factors[b] * f) below WARP_BOUNDARY of the Nyquist frequency, and
    is pressed linearly above it so the band's top stays in place; each mel filter reads the original
    features at its warped source, linearly between the two nearest filters. A factor of 1 changes nothing."""
    mels = features.shape[1]
    nyquist = settings.sample_rate / 2
    edges = mel_edges(mels, 0.0, nyquist)
    centres = torch.from_numpy(mel_to_hertz(edges[1:-1]))[None, :]  # (1, M) Hz, each filter's peak
    factors = factors.to(torch.float64)[:, None]  # (B, 1)
    bend = WARP_BOUNDARY * nyquist * torch.clamp(factors, max=1.0)  # (B, 1): the bend, in the warped spectrum
    below = centres / factors
    above = bend / factors + (centres - bend) * (nyquist - bend / factors) / (nyquist - bend)
    source = torch.where(centres <= bend, below, above)  # (B, M) Hz: what each filter hears after the warp
    place = (torch.from_numpy(hertz_to_mel(source.numpy())) - edges[1]) / (edges[1] - edges[0])  # (B, M) filters
    place = place.clamp(0, mels - 1)
    lower = place.floor().long().clamp(max=mels - 2)  # (B, M)
    weight = (place - lower).to(features.dtype)[..., None]  # (B, M, 1)
    frames = features.shape[-1]
    low = features.gather(1, lower[..., None].expand(-1, -1, frames))  # (B, M, F)
    high = features.gather(1, (lower + 1)[..., None].expand(-1, -1, frames))
    return torch.lerp(low, high, weight)


def pad_or_trim(audio: Tensor, length: int) -> Tensor:
    """``audio`` (..., N) cut or zero-padded on the right to (..., length)."""
    if audio.shape[-1] >= length:
        return audio[..., :length]
    return torch.nn.functional.pad(audio, (0, length - audio.shape[-1]))


def pad_to_windows(audio: Tensor, window: int) -> Tensor:
    """``audio`` (..., N) zero-padded (silence) on the right to a whole number of ``window`` samples, at least
    one window: what a model of that window reads, window after window (nothing is cut)."""
    windows = max(1, -(-audio.shape[-1] // window))
    return torch.nn.functional.pad(audio, (0, windows * window - audio.shape[-1]))


def log_mel_spectrogram(audio: Tensor, settings: LogMelSettings = LogMelSettings(), *,
                        audio_samples: int | None = None) -> Tensor:
    """Features (B, num_mel_bins, N // hop_length) of audio (B, N) (or (N,): then (num_mel_bins, frames)) at
    ``settings.sample_rate``; the caller pads or windows the audio (``pad_or_trim``) to the model's input.
    ``audio_samples``: where the zero padding begins (in every row); the frames wholly in it, whose power is
    exactly 0, are filled in rather than transformed (the same features, without the STFT of the silence)."""
    single = audio.dim() == 1
    batch = audio.unsqueeze(0) if single else audio
    batch = batch.float()
    frames = batch.shape[-1] // settings.hop_length
    heard = frames if audio_samples is None else min(frames, heard_frames(audio_samples, settings))
    window = torch.hann_window(settings.n_fft, periodic=True, device=batch.device)
    # Frame t reads samples [t * hop - n_fft / 2, t * hop + n_fft / 2): the first `heard` frames read the same
    # samples from the audio cut here as from the whole of it.
    audible = batch if heard == frames else batch[..., : heard * settings.hop_length + settings.n_fft]
    spectrum = torch.stft(audible, settings.n_fft, settings.hop_length, window=window, center=True,
                          pad_mode="reflect", return_complex=True)  # (B, F, at least heard + 1 frames)
    power = spectrum[..., :heard].abs() ** 2  # the last frame (centred past the end) is dropped, as Whisper does
    if heard < frames:  # the silent frames' power is 0; the product below runs over every frame, as the whole
        # window's does: a matrix product's rounding may depend on its width (MKL's narrow products on an AMD EPYC)
        power = torch.nn.functional.pad(power, (0, frames - heard))  # (B, F, frames)
    filters = torch.from_numpy(mel_filter_bank(settings.num_mel_bins, settings.n_fft, settings.sample_rate))
    mel = filters.to(device=batch.device, dtype=torch.float32).T @ power  # (B, M, frames)
    log_mel = mel.clamp(min=LOG_FLOOR).log10()
    peak = log_mel.amax(dim=(1, 2), keepdim=True)
    log_mel = torch.maximum(log_mel, peak - DYNAMIC_RANGE)
    features = (log_mel + 4.0) / 4.0
    return features[0] if single else features


def heard_frames(audio_samples: int, settings: LogMelSettings) -> int:
    """How many frames from the start read at least one of the first ``audio_samples`` samples (frame t is
    centred on sample t * hop_length)."""
    return -(-(audio_samples + settings.n_fft // 2) // settings.hop_length)


def normalize_windows(features: Tensor, samples: Sequence[int], settings: LogMelSettings) -> Tensor:
    """Features (B, M, W x F) of B recordings each read in W windows of F frames (``samples[b]`` samples of
    audio, then silence), normalised as ``settings.normalization`` says: ``"none"`` leaves them as they are
    (Whisper); ``"utterance"`` takes each mel channel's mean over a window's frames of audio (those whose
    centre falls inside the recording) from every frame of the window, the silence after it included, and
    divides the window by the standard deviation of its audio frames' values (+ NORMALIZATION_EPS): the level
    and the spectral colouring of a voice and its microphone are gone, the shape of the words stays."""
    if settings.normalization == "none":
        return features
    if settings.normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization={settings.normalization!r} is not one of {', '.join(NORMALIZATIONS)}")
    batch, mels, total = features.shape
    frames = settings.window_frames
    windows = total // frames
    if windows * frames != total or len(samples) != batch:
        raise ValueError(f"features (B={batch}, M={mels}, {total} frames) are not whole windows of {frames} frames "
                         f"for {len(samples)} recordings")
    audio_frames = torch.tensor([-(-int(count) // settings.hop_length) for count in samples])  # (B,)
    starts = torch.arange(windows) * frames  # (W,)
    counts = (audio_frames[:, None] - starts[None, :]).clamp(0, frames).to(features.device)  # (B, W) frames of audio
    blocks = features.reshape(batch, mels, windows, frames).transpose(1, 2)  # (B, W, M, F)
    inside = (torch.arange(frames, device=features.device) < counts[..., None])[:, :, None, :]  # (B, W, 1, F)
    count = counts.clamp(min=1)[:, :, None, None].to(features.dtype)  # (B, W, 1, 1)
    mean = (blocks * inside).sum(-1, keepdim=True) / count  # (B, W, M, 1)
    centred = blocks - mean
    spread = ((centred * inside) ** 2).sum(dim=(-2, -1), keepdim=True) / (count * mels)  # (B, W, 1, 1)
    normalized = centred / (spread.sqrt() + NORMALIZATION_EPS)
    normalized = torch.where(counts[:, :, None, None] > 0, normalized, blocks)  # a window of silence only: as it is
    return normalized.transpose(1, 2).reshape(batch, mels, total)


def recording_features(samples: Tensor, settings: LogMelSettings) -> Tensor:
    """What a model of ``settings`` reads for one recording (N,) at ``settings.sample_rate``: the audio padded
    with silence to whole windows, its log-mel features (M, W x F), each window normalised as the settings say."""
    features = log_mel_spectrogram(pad_to_windows(samples, settings.window_samples), settings,
                                   audio_samples=samples.shape[-1])[None]  # (1, M, W x F)
    return normalize_windows(features, [samples.shape[-1]], settings)[0]
