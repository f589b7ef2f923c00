"""Speech recognition data: (audio file, transcript) pairs, from a manifest or from a folder of pairs.

* A **manifest** is records (``tformer.data.records``: TSV, CSV, JSONL, Parquet, a datasets folder) with an
  ``audio`` column (a WAV file's path, relative to the manifest's folder unless absolute) and a ``text``
  column (its transcript); ``audio_column`` and ``text_column`` name others, and other columns are ignored.
* A **folder of pairs** holds ``NAME.wav`` beside ``NAME.txt`` (UTF-8, the transcript), read in name order,
  not recursively. A ``.txt`` with no ``.wav`` of its stem is not a pair and is left alone (a README);
  audio in another format (``.flac``, ``.mp3``, ...) is refused, as tformer reads WAV.

Only paths are kept: no sample is read until ``SpeechData.audio(i)`` (a batch) asks, so a manifest of a
million rows costs a list of paths. Each audio file is checked to exist (``check_audio=False`` skips even
that) and to be named ``.wav``. A bad row (a missing file, an empty transcript, a path that is no string)
stops the reader with one line naming ``manifest:line`` (``manifest: row N`` for Parquet), or with
``skip_bad`` is left out and kept in ``skipped``; a missing column stops it either way.

``window_features`` turns recordings into the log-mel features a model of a given window reads (each padded
with silence to the window, never cut) and keeps them without their padding (``WindowFeatures``), for a
training task that reads every recording many times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from tformer.data.audio import WHISPER_SAMPLE_RATE, AudioError, load_audio
from tformer.data.files import DataFileError, Skipped, read_data_text
from tformer.data.log_mel import LogMelSettings, log_mel_spectrogram, normalize_windows
from tformer.data.records import RecordFile, field_value, record_format
from tformer.errors import quoted

AUDIO_COLUMN = "audio"
TEXT_COLUMN = "text"
WAV_SUFFIXES = (".wav", ".wave")
# Audio that read_wav does not decode: refused by name, so a folder of FLAC files is not read as empty.
OTHER_AUDIO_SUFFIXES = (".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aac", ".wma", ".webm", ".aiff", ".aif")
CONVERT_HINT = "convert it to WAV (e.g. ffmpeg -i IN -ar 16000 -ac 1 -c:a pcm_s16le OUT.wav)"


class LongerThanWindow(AudioError):
    """A recording longer than the model's window (never cut): what names the window's setting catches it."""


@dataclass
class SpeechData:
    """Audio files and their transcripts (as many of each), where each pair came from (``origins``:
    ``manifest:line``, or the transcript file of a folder's pair), the manifest or folder they were read
    from (``source``), and the bad rows left out with ``skip_bad``."""

    audio_paths: list[Path]
    transcripts: list[str]
    origins: list[str]
    source: str
    skipped: Skipped = field(default_factory=Skipped)

    def __len__(self) -> int:
        return len(self.audio_paths)

    def describe(self) -> str:
        skipped = f" ({len(self.skipped):,} bad rows skipped)" if len(self.skipped) else ""
        return f"{self.source}: {len(self):,} recordings{skipped}"

    def audio(self, index: int, sample_rate: int = WHISPER_SAMPLE_RATE) -> np.ndarray:
        """Recording ``index`` read now: mono float32 samples (N,) at ``sample_rate`` Hz; an AudioError names
        the row that listed the file."""
        try:
            return load_audio(self.audio_paths[index], sample_rate)
        except AudioError as error:
            raise AudioError(f"{self.origins[index]}: {error}") from None


    def subset(self, rows: slice) -> SpeechData:
        """The pairs at ``rows`` (a slice), from the same source."""
        return SpeechData(self.audio_paths[rows], self.transcripts[rows], self.origins[rows], self.source,
                          self.skipped)


# ---- features ---------------------------------------------------------------------------------------------

FEATURE_CHUNK = 32  # recordings whose features are computed in one batch of tensor operations


@dataclass
class WindowFeatures:
    """Log-mel features of recordings each padded with silence to one window of ``frames`` frames, stored
    without their padding: ``heads[i]`` (M, K_i) is recording i's frames up to where the columns of the
    padding begin (all equal to the last column, ``tails[i]`` (M,)), so ``batch`` rebuilds the features of the
    whole window exactly while memory holds only the audio's share of it (in the dtype they were stored in)."""

    heads: list[Tensor]
    tails: list[Tensor]
    frames: int

    def __len__(self) -> int:
        return len(self.heads)

    def batch(self, index: Tensor | Sequence[int]) -> Tensor:
        """float32 features (B, M, frames) of the recordings at ``index`` (B,)."""
        rows = [int(row) for row in index]
        mels = self.heads[rows[0]].shape[0] if rows else 0
        features = torch.empty(len(rows), mels, self.frames, dtype=torch.float32)
        for place, row in enumerate(rows):
            head = self.heads[row]
            features[place, :, head.shape[1]:] = self.tails[row][:, None]
            features[place, :, : head.shape[1]] = head
        return features

    def nbytes(self) -> int:
        return sum(head.nbytes + tail.nbytes for head, tail in zip(self.heads, self.tails, strict=True))


def window_features(data: SpeechData, settings: LogMelSettings, *, dtype: torch.dtype = torch.float32,
                    known: dict[Path, tuple[Tensor, Tensor]] | None = None) -> WindowFeatures:
    """The features of every recording of ``data``: read (mono, ``settings.sample_rate``), zero-padded to
    ``settings.window_samples`` and turned into log-mel frames (``log_mel_spectrogram``, a chunk of recordings
    at a time, then ``normalize_windows``), stored as ``dtype``. A recording longer than the window is an
    AudioError naming it and its length (it is never cut). ``known``: features already computed, by path
    (another split that lists the same files), filled in as more are computed."""
    known = {} if known is None else known
    window = settings.window_samples
    missing = list(dict.fromkeys(path for path in data.audio_paths if path not in known))
    first_row = {path: row for row, path in reversed(list(enumerate(data.audio_paths)))}
    for start in range(0, len(missing), FEATURE_CHUNK):
        chunk = missing[start : start + FEATURE_CHUNK]
        audio = np.zeros((len(chunk), window), dtype=np.float32)  # (B, window): silence, then each recording
        lengths = []
        for row, path in enumerate(chunk):
            samples = data.audio(first_row[path], settings.sample_rate)
            if len(samples) > window:
                rate = settings.sample_rate
                raise LongerThanWindow(f"{data.origins[first_row[path]]}: {path}: {len(samples) / rate:.2f} s of "
                                       f"audio is longer than the model's window of {window / rate:.2f} s; a "
                                       "recording is never cut")
            audio[row, : len(samples)] = samples  # (numpy: on a busy machine a torch op a row costs a thread wait)
            lengths.append(len(samples))
        features = log_mel_spectrogram(torch.from_numpy(audio), settings, audio_samples=max(lengths))  # (B, M, F)
        features = normalize_windows(features, lengths, settings)
        same_as_last = (features == features[:, :, -1:]).all(dim=1)  # (B, F): a column equal to the last one
        trailing = same_as_last.flip(-1).int().cumprod(dim=-1).sum(dim=-1)  # (B,) columns equal to the last, at the end
        for row, path in enumerate(chunk):
            keep = max(features.shape[-1] - int(trailing[row]), 0)
            known[path] = (features[row, :, :keep].to(dtype).clone(), features[row, :, -1].to(dtype).clone())
    pairs = [known[path] for path in data.audio_paths]
    return WindowFeatures([head for head, _ in pairs], [tail for _, tail in pairs], settings.window_frames)


def read_speech(path: str | Path, **options) -> SpeechData:
    """Pairs from a manifest (``read_speech_manifest``) or, for a folder that is not a datasets folder, from
    its ``NAME.wav`` + ``NAME.txt`` files (``read_speech_folder``, which takes ``skip_bad`` alone;
    ``check_audio`` is moot there: its files were found by listing the folder)."""
    path = Path(path)
    if path.is_dir() and record_format(path) is None:
        unknown = set(options) - {"skip_bad", "check_audio"}
        if unknown:
            raise DataFileError(f"{path}: a folder of NAME.wav + NAME.txt pairs has no columns to name "
                                f"({', '.join(sorted(unknown))})")
        return read_speech_folder(path, skip_bad=options.get("skip_bad", False))
    return read_speech_manifest(path, **options)


def read_speech_manifest(path: str | Path, *, format: str | None = None, audio_column: str = AUDIO_COLUMN,
                         text_column: str = TEXT_COLUMN, columns: Sequence[str] | None = None,
                         skip_bad: bool = False, check_audio: bool = True) -> SpeechData:
    """The (audio path, transcript) pairs a manifest lists, in order: ``audio_column`` holds paths (relative to
    the manifest's folder unless absolute), ``text_column`` the transcripts (stripped; an empty one is a
    bad row). ``columns`` names the columns of a TSV/CSV file without a header row."""
    path = Path(path)
    records = RecordFile.open(path, format, columns=columns, header_names=(audio_column, text_column))
    records.require(audio_column, "audio_column")
    records.require(text_column, "text_column")
    folder = path.parent if records.format != "datasets" else path
    audio_paths, transcripts, origins, skipped = [], [], [], Skipped()
    for _, where, record in records.readable([audio_column, text_column], skipped, skip_bad):
        value = field_value(record, audio_column, "audio_column", where)
        text = field_value(record, text_column, "text_column", where)
        try:
            audio = _audio_path(value, folder, audio_column, check_audio)
            transcript = _transcript(text, text_column)
        except DataFileError as error:
            skipped.handle(f"{where}: {error}", skip_bad)
            continue
        audio_paths.append(audio)
        transcripts.append(transcript)
        origins.append(where)
    if not audio_paths:
        raise DataFileError(f"{path}: no (audio, transcript) pairs" + (f" ({skipped.summary()})" if skipped else ""))
    return SpeechData(audio_paths, transcripts, origins, str(path), skipped)


def read_speech_folder(folder: str | Path, *, skip_bad: bool = False) -> SpeechData:
    """The ``NAME.wav`` + ``NAME.txt`` pairs of ``folder`` (not its subfolders), in name order. A ``.wav``
    without its ``.txt``, an empty transcript or audio in another format is a bad pair (``skip_bad``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataFileError(f"{folder}: no such folder")
    files = {entry.name: entry for entry in folder.iterdir() if entry.is_file()}
    audio_paths, transcripts, origins, skipped = [], [], [], Skipped()
    for name in sorted(files):
        entry = files[name]
        suffix = entry.suffix.lower()
        if suffix in OTHER_AUDIO_SUFFIXES:
            skipped.handle(f"{entry}: tformer reads WAV audio, not {suffix}; {CONVERT_HINT}", skip_bad)
            continue
        if suffix not in WAV_SUFFIXES:
            continue
        text_file = entry.with_suffix(".txt")
        if not text_file.is_file():
            skipped.handle(f"{entry}: no transcript {text_file.name} beside it", skip_bad)
            continue
        try:
            transcript = read_data_text(text_file).strip()
        except DataFileError as error:
            skipped.handle(f"{error} (the transcript of {entry.name})", skip_bad)
            continue
        audio_paths.append(entry)
        transcripts.append(transcript)
        origins.append(str(text_file))
    if not audio_paths:
        found = f" ({skipped.summary()})" if skipped else ""
        raise DataFileError(f"{folder}: no NAME.wav + NAME.txt pairs{found}; a folder of speech data holds each "
                            "recording beside its transcript, or give a manifest (audio and text columns)")
    return SpeechData(audio_paths, transcripts, origins, str(folder), skipped)


def _audio_path(value, folder: Path, column: str, check_audio: bool) -> Path:
    """A manifest's audio cell as a path: a string, relative to ``folder`` unless absolute, naming a WAV file."""
    if isinstance(value, dict) and ("bytes" in value or "array" in value):
        raise DataFileError(f"{column} holds audio itself (a Hugging Face Audio feature), not a file's path; "
                            "tformer reads audio files lazily: write them out and list their paths")
    if not isinstance(value, str) or not value.strip():
        raise DataFileError(f"{column} {quoted(value)} is not the path of an audio file")
    audio = Path(value.strip())
    audio = audio if audio.is_absolute() else folder / audio
    if audio.suffix.lower() not in WAV_SUFFIXES:
        raise DataFileError(f"audio file {audio}: tformer reads WAV audio (.wav); {CONVERT_HINT}")
    if check_audio and not audio.is_file():
        raise DataFileError(f"audio file {audio}: no such file")
    return audio


def _transcript(value, column: str) -> str:
    if not isinstance(value, str):
        raise DataFileError(f"{column} {quoted(value)} is not a string")
    text = value.strip()
    if not text:
        raise DataFileError(f"empty transcript ({column})")
    return text
