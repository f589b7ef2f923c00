"""Audio in: WAV files read into float samples, channels averaged to mono, resampled to the rate a
speech model was trained at (Whisper's 16 kHz).

The RIFF/WAVE container is parsed here (``wave`` in the standard library reads integer PCM only):
integer PCM of 8 (unsigned), 16, 24 and 32 bits and IEEE float of 32 and 64 bits, plain or in a
WAVE_FORMAT_EXTENSIBLE header. Anything else (a compressed codec, a truncated or corrupt header, no
samples, a file past ``max_seconds``, a float sample that is NaN, infinite or beyond ``MAX_FLOAT_SAMPLE``)
is an ``AudioError`` naming the file and what is allowed.

Float samples are nominally in [-1, 1]; louder ones are kept (headroom) up to ``MAX_FLOAT_SAMPLE``, 60 dB
above full scale. Past it a file is corrupt or scaled as integers (a float WAV holding 16-bit values), and
its features would be off the scale a model was trained on, or overflow float32 to NaN in the spectrogram.

Resampling uses libsoxr (``pip install 'tformer[speech]'``): measured against scipy's polyphase filter
and linear interpolation (benchmarks/resample_quality.py), it kept tones up to 0.9 of the band 130 dB
above the error and removed a tone above the new Nyquist by 144 dB, where scipy's default filter gave
20 dB and 31 dB, and it ran 2-3x faster.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tformer.errors import TformerError

WHISPER_SAMPLE_RATE = 16_000
DEFAULT_MAX_SECONDS = 3600.0  # an hour: past it, a file is more likely a mistake than a recording to transcribe
MAX_FLOAT_SAMPLE = 1000.0  # |float sample| allowed: 60 dB above full scale (see the module's docstring)
PCM, IEEE_FLOAT, EXTENSIBLE = 0x0001, 0x0003, 0xFFFE
INTEGER_WIDTHS = (1, 2, 3, 4)  # bytes a sample
FLOAT_WIDTHS = (4, 8)
# The first two bytes of WAVE_FORMAT_EXTENSIBLE's SubFormat GUID carry the format tag; the other 14 are fixed.
SUBFORMAT_TAIL = bytes.fromhex("000000001000800000aa00389b71")


class AudioError(TformerError):
    """An audio file tformer cannot read; the message names the file, what is wrong and what is allowed."""


@dataclass(frozen=True)
class Audio:
    """Mono samples in [-1, 1] (float32, (N,); a float file's up to ``MAX_FLOAT_SAMPLE``) at ``sample_rate`` Hz."""

    samples: np.ndarray
    sample_rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate


@dataclass(frozen=True)
class WavFormat:
    """What a WAV file's fmt chunk says: the encoding, channels, rate and bytes a sample."""

    tag: int
    channels: int
    sample_rate: int
    sample_width: int

    def describe(self) -> str:
        kind = "float" if self.tag == IEEE_FLOAT else "PCM"
        return f"{kind} {8 * self.sample_width}-bit, {self.channels} channel(s), {self.sample_rate} Hz"


def read_wav(path: str | Path, max_seconds: float | None = DEFAULT_MAX_SECONDS) -> Audio:
    """The samples of a WAV file, mono (the mean of its channels), as float32 in [-1, 1]. The header is
    read and the length checked against ``max_seconds`` before any sample is."""
    file = Path(path)
    if not file.is_file():
        kind = _special_kind(file)
        raise AudioError(f"{file}: not a regular file ({kind}); give a WAV file" if kind else f"{file}: no such file")
    with open(file, "rb") as handle:
        return _read_wav(handle, file.stat().st_size, file, max_seconds)


def wav_from_bytes(data: bytes, name: str, max_seconds: float | None = DEFAULT_MAX_SECONDS) -> Audio:
    """``read_wav`` of a WAV file held in memory (an upload), named ``name`` in its errors."""
    return _read_wav(io.BytesIO(data), len(data), Path(name), max_seconds)


def _read_wav(handle: BinaryIO, file_size: int, file: Path, max_seconds: float | None) -> Audio:
    wav_format, data_offset, data_size = _parse_riff(handle, file_size, file)
    frame_bytes = wav_format.channels * wav_format.sample_width
    frames = data_size // frame_bytes
    if frames == 0:
        raise AudioError(f"{file}: no samples (a WAV file with an empty data chunk)")
    if max_seconds is not None and frames / wav_format.sample_rate > max_seconds:
        raise AudioError(f"{file}: {frames / wav_format.sample_rate:,.1f} s of audio, past the limit of "
                         f"{max_seconds:,.0f} s (max_seconds)")
    handle.seek(data_offset)
    payload = handle.read(frames * frame_bytes)
    samples = _decode(payload, wav_format, file).reshape(frames, wav_format.channels)
    return Audio(samples.mean(axis=1, dtype=np.float64).astype(np.float32), wav_format.sample_rate)


def _special_kind(path: Path) -> str | None:
    """What ``path`` is when it exists but is no regular file (a device such as /dev/null, a folder, a pipe that
    would block the read), or None when nothing is there."""
    for kind, test in (("a folder", path.is_dir), ("a character device", path.is_char_device),
                       ("a block device", path.is_block_device), ("a named pipe", path.is_fifo),
                       ("a socket", path.is_socket)):
        if test():
            return kind
    return "neither a file nor a folder" if path.exists() else None


def load_audio(path: str | Path, sample_rate: int = WHISPER_SAMPLE_RATE,
               max_seconds: float | None = DEFAULT_MAX_SECONDS) -> np.ndarray:
    """A WAV file's mono samples (float32, (N,)) at ``sample_rate`` Hz, resampled when it has another rate."""
    audio = read_wav(path, max_seconds)
    return resample(audio.samples, audio.sample_rate, sample_rate)


def resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """``samples`` (N,) at ``from_rate`` Hz as float32 samples at ``to_rate`` Hz (libsoxr, high quality)."""
    if from_rate == to_rate:
        return np.asarray(samples, dtype=np.float32)
    try:
        import soxr
    except ImportError:
        raise AudioError(f"audio at {from_rate} Hz must be resampled to {to_rate} Hz, which needs soxr "
                         "(pip install 'tformer[speech]')") from None
    return soxr.resample(np.asarray(samples, dtype=np.float32), from_rate, to_rate, quality="HQ").astype(np.float32)


def _parse_riff(handle: BinaryIO, file_size: int, file: Path) -> tuple[WavFormat, int, int]:
    """The fmt chunk, and the data chunk's offset and size, of a RIFF/WAVE file (chunk headers read, the
    data itself not)."""
    head = handle.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        kind = "an RF64/BW64 file" if head[:4] in (b"RF64", b"BW64") else "not a RIFF/WAVE file"
        raise AudioError(f"{file}: {kind}; tformer reads WAV files (PCM or float)")
    wav_format, offset = None, 12
    while offset + 8 <= file_size:
        handle.seek(offset)
        chunk_id, size = struct.unpack("<4sI", handle.read(8))
        if chunk_id == b"fmt ":
            wav_format = _parse_format(handle.read(size), file)
        elif chunk_id == b"data":
            if wav_format is None:
                raise AudioError(f"{file}: corrupt WAV header (the data chunk comes before the fmt chunk)")
            there = file_size - (offset + 8)
            if there < size:  # a file cut short: its header promises more than it holds
                raise AudioError(f"{file}: truncated or corrupt WAV file (its data chunk says {size:,} bytes, "
                                 f"{there:,} are there)")
            return wav_format, offset + 8, size
        offset += 8 + size + (size & 1)  # chunks are padded to an even size
    missing = "fmt" if wav_format is None else "data"
    raise AudioError(f"{file}: corrupt WAV file (no {missing} chunk)")


def _parse_format(body: bytes, file: Path) -> WavFormat:
    if len(body) < 16:
        raise AudioError(f"{file}: corrupt WAV header (a fmt chunk of {len(body)} bytes, 16 at least)")
    tag, channels, sample_rate, _, block_align, bits = struct.unpack("<HHIIHH", body[:16])
    if tag == EXTENSIBLE:
        if len(body) < 40 or body[26:40] != SUBFORMAT_TAIL:
            raise AudioError(f"{file}: a WAVE_FORMAT_EXTENSIBLE header whose sub-format is not PCM or float")
        tag = struct.unpack("<H", body[24:26])[0]
    width = bits // 8 if bits % 8 == 0 else 0
    supported = (tag == PCM and width in INTEGER_WIDTHS) or (tag == IEEE_FLOAT and width in FLOAT_WIDTHS)
    if not supported:
        codec = {PCM: f"PCM {bits}-bit", IEEE_FLOAT: f"float {bits}-bit"}.get(tag, f"codec 0x{tag:04x}")
        raise AudioError(f"{file}: {codec} is not supported; tformer reads PCM 8/16/24/32-bit and float "
                         "32/64-bit WAV (convert it, e.g. ffmpeg -i IN -c:a pcm_s16le OUT.wav)")
    if channels < 1 or sample_rate < 1 or block_align != channels * width:
        raise AudioError(f"{file}: corrupt WAV header ({channels} channels, {sample_rate} Hz, "
                         f"{block_align} bytes a frame for {bits}-bit samples)")
    return WavFormat(tag, channels, sample_rate, width)


def _decode(payload: bytes, wav_format: WavFormat, file: Path) -> np.ndarray:
    """Interleaved samples (N * channels,) as float32 in [-1, 1] (float files: finite, within
    ``MAX_FLOAT_SAMPLE``, checked before the cast, where a float64 past float32's range would become inf)."""
    width = wav_format.sample_width
    if wav_format.tag == IEEE_FLOAT:
        values = np.frombuffer(payload, dtype=f"<f{width}")
        _check_float_samples(values, wav_format, file)
        return values.astype(np.float32)
    if width == 1:  # 8-bit PCM is unsigned, centred on 128
        return (np.frombuffer(payload, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    if width == 3:  # 24-bit: three little-endian bytes, sign-extended through the top byte of an int32
        raw = np.frombuffer(payload, dtype=np.uint8).reshape(-1, 3)
        widened = np.zeros((len(raw), 4), dtype=np.uint8)
        widened[:, 1:] = raw
        return (widened.view("<i4").reshape(-1) >> 8).astype(np.float32) / float(1 << 23)
    integers = np.frombuffer(payload, dtype=f"<i{width}")
    return (integers.astype(np.float64) / float(1 << (8 * width - 1))).astype(np.float32)


def _check_float_samples(values: np.ndarray, wav_format: WavFormat, file: Path) -> None:
    """Refuse float samples that are NaN, infinite or beyond ``MAX_FLOAT_SAMPLE``, naming the first and how many."""
    bad = ~(np.abs(values) <= MAX_FLOAT_SAMPLE)  # NaN compares false: it is bad too
    count = int(np.count_nonzero(bad))
    if not count:
        return
    first = int(np.argmax(bad))
    value = float(values[first])
    what = "NaN" if np.isnan(value) else "infinite" if np.isinf(value) else f"{value:g}"
    seconds = first // wav_format.channels / wav_format.sample_rate
    raise AudioError(f"{file}: {count:,} float sample(s) NaN, infinite or beyond +-{MAX_FLOAT_SAMPLE:g} (the first, "
                     f"at {seconds:.3f} s: {what}); float WAV samples must be finite and within "
                     f"+-{MAX_FLOAT_SAMPLE:g} (nominally [-1, 1])")
