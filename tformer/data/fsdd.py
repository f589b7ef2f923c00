"""Connected digits from the Free Spoken Digit Dataset (FSDD): a small speech recognition corpus made
deterministically from a seed, for training and testing a speech model in minutes.

FSDD holds ``{digit}_{speaker}_{take}.wav``: one spoken digit a file, mono 16-bit PCM at 8 kHz, six speakers,
50 takes of each digit by each. An utterance here is 2-7 recordings of one speaker (drawn without
repeats) joined by 50-300 ms of silence (zeros), with 20-100 ms at both ends, kept at the source rate (a
speech model's front end resamples); its transcript is the digit words ("three one four"). Every length is
drawn uniformly in samples, from a generator seeded by ``seed`` (numpy's PCG64: the same seed gives
byte-identical files under the same numpy).

Two splits keep training and test recordings apart:

* **official** (FSDD's own): test utterances from takes 0-4, training ones from takes 5-49;
* **held-out speaker**: the named speaker's recordings (every take) make the test utterances, the other
  five speakers' the training ones, to measure how a model does on a voice it never heard.

``build_digit_corpus`` writes ``train/NNNNN.wav``, ``test/NNNNN.wav`` (16-bit PCM, written with the
standard library's ``wave``) and ``train.tsv`` / ``test.tsv`` manifests (columns ``audio``, ``text``,
``speaker``, ``recordings``; ``tformer.data.speech`` reads them) into a folder, with ``fsdd_digits.json``
recording how it was made. It replaces only a folder that it wrote (that file, and nothing else beside its
outputs); ``overwrite`` moves anything else aside into ``OUT.replaced-N``, deleting nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import wave
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tformer.data.audio import read_wav
from tformer.data.files import DataFileError
from tformer.errors import TformerError, listed
from tformer.files import clear_dead_writers, move_aside

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
OFFICIAL_TEST_TAKES = range(0, 5)  # FSDD's test set: takes 0-4 of every digit and speaker
RECORDING_NAME = re.compile(r"^(\d)_([A-Za-z]+)_(\d+)\.wav$")
MARKER_NAME = "fsdd_digits.json"
WRITTEN_BY = "tformer.data.fsdd"
SPLITS = ("train", "test")
OUTPUT_ENTRIES = frozenset({MARKER_NAME, *SPLITS, *(f"{split}.tsv" for split in SPLITS)})
UTTERANCE_FILE = re.compile(r"^\d{5,}\.wav$")
MANIFEST_COLUMNS = ("audio", "text", "speaker", "recordings")


class FsddError(TformerError):
    """The FSDD recordings or the corpus settings cannot make the corpus asked for; the message says why."""


@dataclass(frozen=True)
class Recording:
    """One FSDD file: the digit spoken, the speaker, the take (0-49) and its path."""

    digit: int
    speaker: str
    take: int
    path: Path

    @property
    def name(self) -> str:
        return self.path.stem


@dataclass(frozen=True)
class Utterance:
    """Recordings of one speaker, in order, and the silences around them in samples: before the first,
    between each two, after the last (one more than the recordings)."""

    speaker: str
    recordings: tuple[Recording, ...]
    silences: tuple[int, ...]

    @property
    def transcript(self) -> str:
        return " ".join(DIGIT_WORDS[recording.digit] for recording in self.recordings)


@dataclass(frozen=True)
class DigitSettings:
    """How many utterances of each split, which split (``held_out_speaker``: None for the official one),
    the seed, the digits an utterance holds and the silences, in milliseconds, between and around them.

    The default counts, 3,000 training and 300 test utterances (2.25 and 0.22 hours at 8 kHz with seed 0,
    143 MB of WAV in all), use each training recording about 5 times and each test recording about 4.5
    times (official split: 2,700 and 300 recordings), in different company and with different gaps each time:
    enough for a small model to learn the ten words and be tested on takes (or a voice) it never heard, and
    written in seconds."""

    train_utterances: int = 3000
    test_utterances: int = 300
    held_out_speaker: str | None = None
    seed: int = 0
    min_digits: int = 2
    max_digits: int = 7
    min_gap_ms: int = 50
    max_gap_ms: int = 300
    min_edge_ms: int = 20
    max_edge_ms: int = 100

    def __post_init__(self) -> None:
        for name in ("train_utterances", "test_utterances", "seed", "min_digits", "max_digits", "min_gap_ms",
                     "max_gap_ms", "min_edge_ms", "max_edge_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise FsddError(f"{name}={value!r} must be an integer >= 0")
        if self.train_utterances + self.test_utterances == 0:
            raise FsddError("train_utterances and test_utterances are both 0: nothing to write")
        if not 1 <= self.min_digits <= self.max_digits:
            raise FsddError(f"min_digits={self.min_digits}, max_digits={self.max_digits}: need 1 <= min <= max")
        for low, high in (("min_gap_ms", "max_gap_ms"), ("min_edge_ms", "max_edge_ms")):
            if getattr(self, low) > getattr(self, high):
                raise FsddError(f"{low}={getattr(self, low)} is above {high}={getattr(self, high)}")

    @property
    def split(self) -> str:
        return "official" if self.held_out_speaker is None else f"held-out speaker {self.held_out_speaker}"


@dataclass
class SplitSummary:
    """What one split holds: utterances, seconds of audio, utterances by digits they hold, by speaker."""

    utterances: int = 0
    seconds: float = 0.0
    digits: dict[int, int] = field(default_factory=dict)
    speakers: dict[str, int] = field(default_factory=dict)
    recordings_used: int = 0  # distinct source recordings


@dataclass
class DigitCorpus:
    """A corpus written by ``build_digit_corpus``: its folder, manifests, sample rate and summaries, and
    where the folder's old contents were moved (``overwrite``), if anywhere."""

    folder: Path
    sample_rate: int
    settings: DigitSettings
    splits: dict[str, SplitSummary]
    moved_aside: Path | None = None

    def manifest(self, split: str) -> Path:
        return self.folder / f"{split}.tsv"


# ---- the recordings ----------------------------------------------------------------------------------------


def list_recordings(folder: str | Path) -> list[Recording]:
    """The FSDD recordings in ``folder`` (its ``.wav`` files, each named ``{digit}_{speaker}_{take}.wav``),
    sorted by speaker, digit and take; other names are refused, so a wrong folder fails here."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FsddError(f"{folder}: no such folder (FSDD's recordings/ holds {{digit}}_{{speaker}}_{{take}}.wav)")
    recordings, strangers = [], []
    for entry in folder.iterdir():
        if entry.suffix.lower() != ".wav":
            continue
        match = RECORDING_NAME.match(entry.name)
        if match is None:
            strangers.append(entry.name)
            continue
        recordings.append(Recording(int(match[1]), match[2], int(match[3]), entry))
    if strangers:
        raise FsddError(f"{folder}: {len(strangers):,} .wav files are not named {{digit}}_{{speaker}}_{{take}}.wav: "
                        f"{listed(sorted(strangers))}")
    if not recordings:
        raise FsddError(f"{folder}: no FSDD recordings ({{digit}}_{{speaker}}_{{take}}.wav)")
    return sorted(recordings, key=lambda recording: (recording.speaker, recording.digit, recording.take))


def split_recordings(recordings: Sequence[Recording], held_out_speaker: str | None = None
                     ) -> tuple[list[Recording], list[Recording]]:
    """(training, test) recordings: the official split by take (test: takes 0-4) or, with
    ``held_out_speaker``, by speaker (test: every take of that speaker)."""
    if held_out_speaker is None:
        test = [recording for recording in recordings if recording.take in OFFICIAL_TEST_TAKES]
        train = [recording for recording in recordings if recording.take not in OFFICIAL_TEST_TAKES]
        return train, test
    speakers = sorted({recording.speaker for recording in recordings})
    if held_out_speaker not in speakers:
        raise FsddError(f"held-out speaker {held_out_speaker!r} is not one of the speakers: {listed(speakers)}")
    if len(speakers) < 2:
        raise FsddError(f"only one speaker ({held_out_speaker}): holding them out leaves nothing to train on")
    train = [recording for recording in recordings if recording.speaker != held_out_speaker]
    test = [recording for recording in recordings if recording.speaker == held_out_speaker]
    return train, test


# ---- planning and rendering -----------------------------------------------------------------------------


def plan_utterances(recordings: Sequence[Recording], count: int, settings: DigitSettings, sample_rate: int,
                    rng: np.random.Generator) -> list[Utterance]:
    """``count`` utterances from ``recordings``: each a speaker drawn uniformly, then 2-7 (the settings')
    distinct recordings of theirs in a random order, and the silences drawn uniformly in samples."""
    if count == 0:
        return []
    by_speaker: dict[str, list[Recording]] = {}
    for recording in recordings:
        by_speaker.setdefault(recording.speaker, []).append(recording)
    if not by_speaker:
        raise FsddError(f"no recordings to make {count:,} utterances from")
    speakers = sorted(by_speaker)
    short = [speaker for speaker in speakers if len(by_speaker[speaker]) < settings.max_digits]
    if short:
        raise FsddError(f"speakers {listed(short)} have fewer than max_digits={settings.max_digits} recordings in "
                        "this split; an utterance draws its digits without repeats")

    def samples(milliseconds: int) -> int:
        return milliseconds * sample_rate // 1000

    gap = (samples(settings.min_gap_ms), samples(settings.max_gap_ms) + 1)
    edge = (samples(settings.min_edge_ms), samples(settings.max_edge_ms) + 1)
    utterances = []
    for _ in range(count):
        speaker = speakers[int(rng.integers(len(speakers)))]
        pool = by_speaker[speaker]
        digits = int(rng.integers(settings.min_digits, settings.max_digits + 1))
        chosen = tuple(pool[int(index)] for index in rng.choice(len(pool), size=digits, replace=False))
        gaps = rng.integers(*gap, size=digits - 1).tolist()
        first, last = rng.integers(*edge, size=2).tolist()
        utterances.append(Utterance(speaker, chosen, (first, *gaps, last)))
    return utterances


class RecordingCache:
    """Recordings read once each, as int16 samples (N,), all at one sample rate (the first file's)."""

    def __init__(self) -> None:
        self.samples: dict[Path, np.ndarray] = {}
        self.sample_rate: int | None = None

    def __call__(self, recording: Recording) -> np.ndarray:
        found = self.samples.get(recording.path)
        if found is None:
            audio = read_wav(recording.path)
            if self.sample_rate is None:
                self.sample_rate = audio.sample_rate
            elif audio.sample_rate != self.sample_rate:
                raise FsddError(f"{recording.path}: {audio.sample_rate} Hz, but the recordings before it are at "
                                f"{self.sample_rate} Hz; FSDD's are all 8 kHz")
            # float32 samples of 16-bit PCM are exactly value / 32768, so this gives the file's integers back
            found = np.clip(np.rint(audio.samples * 32768.0), -32768, 32767).astype(np.int16)
            self.samples[recording.path] = found
        return found


def render(utterance: Utterance, read: RecordingCache) -> np.ndarray:
    """The utterance's int16 samples (N,): silence, a recording, a gap, ..., a recording, silence."""
    pieces = [np.zeros(utterance.silences[0], dtype=np.int16)]
    for recording, silence in zip(utterance.recordings, utterance.silences[1:], strict=True):
        pieces.append(read(recording))
        pieces.append(np.zeros(silence, dtype=np.int16))
    return np.concatenate(pieces)


def write_wav(path: Path, samples: np.ndarray, sample_rate: int) -> None:
    """Mono 16-bit PCM (``samples``: int16 (N,)) with the standard library's ``wave``."""
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(sample_rate)
        handle.writeframes(samples.astype("<i2").tobytes())


# ---- the corpus -------------------------------------------------------------------------------------------


def build_digit_corpus(source: str | Path, out: str | Path, settings: DigitSettings | None = None, *,
                       overwrite: bool = False) -> DigitCorpus:
    """Write the connected-digit corpus of ``settings`` made from the FSDD recordings in ``source`` into the
    folder ``out``: built under a temporary name beside it, then renamed into place (see the module's
    docstring for what is written and what may be replaced)."""
    settings = settings or DigitSettings()
    source, out = Path(source), Path(out)
    recordings = list_recordings(source)
    pools = dict(zip(SPLITS, split_recordings(recordings, settings.held_out_speaker), strict=True))
    read = RecordingCache()
    read(recordings[0])  # the sample rate, before any length is drawn
    sample_rate = read.sample_rate
    counts = {"train": settings.train_utterances, "test": settings.test_utterances}
    streams = np.random.SeedSequence(settings.seed).spawn(len(SPLITS))  # one independent stream a split
    plans = {split: plan_utterances(pools[split], counts[split], settings, sample_rate, np.random.default_rng(stream))
             for split, stream in zip(SPLITS, streams, strict=True)}
    out.parent.mkdir(parents=True, exist_ok=True)
    clear_dead_writers(out)  # a build killed midway: its temporary gone, a corpus it had renamed aside back
    replaced = _check_replaceable(out, overwrite)
    building = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)  # this process's own debris, from nothing but a reused pid
    try:
        building.mkdir()
        summaries = {split: _write_split(building, split, plans[split], read, sample_rate) for split in SPLITS}
        marker = {"written_by": WRITTEN_BY, "source": str(source), "sample_rate": sample_rate,
                  "settings": asdict(settings), "utterances": {split: counts[split] for split in SPLITS}}
        (building / MARKER_NAME).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
        moved = _swap_into_place(building, out, replaced)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return DigitCorpus(out, sample_rate, settings, summaries, moved)


def _write_split(folder: Path, split: str, utterances: list[Utterance], read: RecordingCache,
                 sample_rate: int) -> SplitSummary:
    """``split``'s WAV files and manifest under ``folder``; what they hold."""
    (folder / split).mkdir()
    summary, used = SplitSummary(), set()
    rows = ["\t".join(MANIFEST_COLUMNS)]
    for number, utterance in enumerate(utterances):
        samples = render(utterance, read)
        name = f"{split}/{number:05d}.wav"
        write_wav(folder / name, samples, sample_rate)
        names = " ".join(recording.name for recording in utterance.recordings)
        rows.append("\t".join((name, utterance.transcript, utterance.speaker, names)))
        summary.seconds += len(samples) / sample_rate
        used.update(recording.path for recording in utterance.recordings)
    summary.utterances = len(utterances)
    summary.digits = dict(sorted(Counter(len(u.recordings) for u in utterances).items()))
    summary.speakers = dict(sorted(Counter(u.speaker for u in utterances).items()))
    summary.recordings_used = len(used)
    (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return summary


def written_by_builder(folder: Path) -> bool:
    """Whether ``folder`` holds a corpus this module wrote and nothing else: its marker file naming this
    module, entries all among its outputs, and split folders of numbered WAV files alone."""
    try:
        marker = json.loads((folder / MARKER_NAME).read_text(encoding="utf-8"))
        if not isinstance(marker, dict) or marker.get("written_by") != WRITTEN_BY:
            return False
        for entry in folder.iterdir():
            if entry.name not in OUTPUT_ENTRIES:
                return False
            if entry.name in SPLITS and not (entry.is_dir() and not entry.is_symlink() and all(
                    UTTERANCE_FILE.match(item.name) and item.is_file() for item in entry.iterdir())):
                return False
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return True


def _check_replaceable(out: Path, overwrite: bool) -> str:
    """How ``out`` may be filled: "new" (absent or empty), "ours" (a corpus this module wrote, replaced), or
    "aside" (``overwrite``: its contents moved aside first); anything else is refused."""
    if not out.exists() and not out.is_symlink():
        return "new"
    if not out.is_dir() or out.is_symlink():
        raise DataFileError(f"{out} exists and is not a folder; choose another output folder")
    if not any(out.iterdir()):
        return "new"
    if written_by_builder(out):
        return "ours"
    if overwrite:
        return "aside"
    raise DataFileError(f"{out} holds files this builder did not write (no {MARKER_NAME}, or other files beside "
                        "its outputs); choose another output folder, or pass overwrite (--overwrite) to move them "
                        f"aside into {out.name}.replaced-N")


def _swap_into_place(building: Path, out: Path, replaced: str) -> Path | None:
    """Rename the finished ``building`` folder to ``out``: an empty ``out`` removed first, a corpus of ours
    renamed away and deleted after, anything else moved aside (the folder it went to is returned)."""
    moved = move_aside(out, [entry.name for entry in out.iterdir()]) if replaced == "aside" else None
    old = None
    if out.exists():
        if replaced == "ours":
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            shutil.rmtree(old, ignore_errors=True)  # this process's own debris, from nothing but a reused pid
            os.replace(out, old)
        else:
            out.rmdir()  # empty: nothing in it to keep
    os.replace(building, out)
    if old is not None:
        shutil.rmtree(old)
    return moved
