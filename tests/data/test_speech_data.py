"""Speech recognition data: manifests and folders of (WAV, transcript) pairs (tformer.data.speech), and the
FSDD connected-digit corpus (tformer.data.fsdd): deterministic from its seed, splits that share no
recording, transcripts that name the recordings used, silences within their bounds, manifests that read
back, and an output folder replaced only when the builder wrote it.

The corpus tests build from a small fake FSDD folder whose every recording is a constant, distinct sample
value, so an utterance's audio can be taken apart again into its recordings and silences; one test reads a
few real FSDD files (skipped without ../shared/data)."""

import json
import re
import wave
from pathlib import Path

import numpy as np
import pytest
import torch
from shared_data import SHARED_DATA, require

from tformer.data.audio import AudioError
from tformer.data.files import DataFileError
from tformer.data.fsdd import (
    DIGIT_WORDS,
    MARKER_NAME,
    DigitSettings,
    FsddError,
    build_digit_corpus,
    list_recordings,
    split_recordings,
)
from tformer.data.log_mel import LogMelSettings, recording_features
from tformer.data.speech import read_speech, read_speech_folder, read_speech_manifest, window_features

FSDD_RECORDINGS = SHARED_DATA / "fsdd" / "recordings"
RATE = 8000


def write_wav(path: Path, samples, rate: int = RATE) -> Path:
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes(np.asarray(samples, dtype="<i2").tobytes())
    return path


def read_samples(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as handle:
        assert (handle.getnchannels(), handle.getsampwidth(), handle.getframerate()) == (1, 2, RATE)
        return np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2")


# ---- manifests and folders ----------------------------------------------------------------------------------


@pytest.fixture
def clips(tmp_path):
    """Three short WAV files in tmp_path/clips."""
    folder = tmp_path / "clips"
    folder.mkdir()
    for number in range(3):
        write_wav(folder / f"c{number}.wav", np.full(80 * (number + 1), 1000 * (number + 1)))
    return folder


def test_tsv_manifest_reads_paths_relative_to_it(tmp_path, clips):
    manifest = tmp_path / "train.tsv"
    manifest.write_text("audio\ttext\tspeaker\nclips/c0.wav\t three one \tx\nclips/c1.wav\tfour\ty\n"
                        f"{clips / 'c2.wav'}\tone five nine\tz\n", encoding="utf-8")
    data = read_speech_manifest(manifest)
    assert data.audio_paths == [clips / "c0.wav", clips / "c1.wav", clips / "c2.wav"]
    assert data.transcripts == ["three one", "four", "one five nine"]
    assert data.origins == [f"{manifest}:2", f"{manifest}:3", f"{manifest}:4"]
    assert data.describe() == f"{manifest}: 3 recordings"
    samples = data.audio(1, sample_rate=RATE)  # read only now, at the file's own rate
    assert samples.shape == (160,) and samples[0] == pytest.approx(2000 / 32768)


@pytest.mark.parametrize("normalization", ["none", "utterance"])
def test_training_features_are_what_transcription_reads(tmp_path, normalization):
    """The task's features (every recording of a split, read once) equal the ones ``tformer transcribe`` and
    ``tformer attention`` compute for a file alone, normalised or not: a model hears in use what it trained on."""
    time = np.arange(RATE * 3 // 4) / RATE
    for number, hertz in enumerate((300, 700)):
        level = 3000 * (number + 1)
        write_wav(tmp_path / f"t{number}.wav", level * np.sin(2 * np.pi * hertz * time[: len(time) - 900 * number]))
    manifest = tmp_path / "train.tsv"
    manifest.write_text("audio\ttext\nt0.wav\tone\nt1.wav\ttwo\n", encoding="utf-8")
    data = read_speech_manifest(manifest)
    settings = LogMelSettings(window_samples=16_000, normalization=normalization)  # 1 s windows of 16 kHz
    stored = window_features(data, settings).batch([0, 1])  # (2, M, 100)
    for row in range(2):
        alone = recording_features(torch.from_numpy(data.audio(row, settings.sample_rate)), settings)
        torch.testing.assert_close(stored[row], alone, atol=1e-6, rtol=0)


def test_jsonl_and_csv_manifests_with_named_columns(tmp_path, clips):
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text('{"file": "clips/c0.wav", "sentence": "zero"}\n\n{"file": "clips/c2.wav", "sentence": "two"}\n',
                     encoding="utf-8")
    data = read_speech(jsonl, audio_column="file", text_column="sentence")
    assert data.transcripts == ["zero", "two"] and data.origins[1] == f"{jsonl}:3"
    csv = tmp_path / "m.csv"
    csv.write_text('path,words\nclips/c1.wav,"one, two"\n', encoding="utf-8")
    assert read_speech(csv, audio_column="path", text_column="words").transcripts == ["one, two"]
    headless = tmp_path / "headless.tsv"
    headless.write_text("clips/c1.wav\tone\n", encoding="utf-8")
    with pytest.raises(DataFileError, match=r"headless.tsv:1: the first row \['clips/c1.wav', 'one'\] is not a header"):
        read_speech(headless)
    assert read_speech(headless, columns=["audio", "text"]).transcripts == ["one"]


def test_parquet_manifest(tmp_path, clips):
    pyarrow = pytest.importorskip("pyarrow")
    from pyarrow import parquet

    table = pyarrow.table({"audio": ["clips/c0.wav", "clips/c1.wav"], "text": ["a", "b"], "n": [1, 2]})
    parquet.write_table(table, tmp_path / "m.parquet")
    data = read_speech_manifest(tmp_path / "m.parquet")
    assert data.transcripts == ["a", "b"] and data.origins == [f"{tmp_path / 'm.parquet'}: row {n}" for n in (1, 2)]


def test_bad_rows_name_the_line_or_are_skipped(tmp_path, clips):
    manifest = tmp_path / "m.tsv"
    manifest.write_text("audio\ttext\nclips/c0.wav\tzero\nclips/gone.wav\tone\nclips/c1.wav\t  \n"
                        "clips/c2.flac\ttwo\nclips/c2.wav\ttwo\n", encoding="utf-8")
    gone = clips / "gone.wav"
    with pytest.raises(DataFileError, match="^" + re.escape(f"{manifest}:3: audio file {gone}: no such file") + "$"):
        read_speech_manifest(manifest)
    data = read_speech_manifest(manifest, skip_bad=True)
    assert data.transcripts == ["zero", "two"] and len(data.skipped) == 3
    assert data.skipped.messages[1] == f"{manifest}:4: empty transcript (text)"
    assert "tformer reads WAV audio (.wav); convert it to WAV (e.g. ffmpeg" in data.skipped.messages[2]
    assert data.describe().endswith("2 recordings (3 bad rows skipped)")
    # check_audio=False: the paths are taken as they are, so a huge manifest costs no stat per row
    assert len(read_speech_manifest(manifest, skip_bad=True, check_audio=False)) == 3


def test_missing_column_and_audio_that_is_no_path(tmp_path, clips):
    manifest = tmp_path / "m.tsv"
    manifest.write_text("audio\tsentence\nclips/c0.wav\tzero\n", encoding="utf-8")
    with pytest.raises(DataFileError, match=r"m.tsv: no column 'text' \(text_column\); the columns are: audio, "
                                            "sentence"):
        read_speech_manifest(manifest, skip_bad=True)
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text('{"audio": "clips/c0.wav", "text": "a"}\n{"audio": "clips/c1.wav"}\n'
                     '{"audio": {"bytes": "UklGRg==", "path": null}, "text": "b"}\n', encoding="utf-8")
    with pytest.raises(DataFileError, match=r"m.jsonl:2: no column 'text' \(text_column\); the columns are: audio"):
        read_speech_manifest(jsonl)
    jsonl.write_text('{"audio": {"bytes": "UklGRg==", "path": null}, "text": "b"}\n{"audio": 7, "text": "c"}\n',
                     encoding="utf-8")
    with pytest.raises(DataFileError, match="m.jsonl:1: audio holds audio itself .a Hugging Face Audio feature"):
        read_speech_manifest(jsonl)
    with pytest.raises(DataFileError, match=r"m.jsonl: no \(audio, transcript\) pairs \(2 bad records skipped "
                                            r"\(first: .*m.jsonl:1: audio holds"):
        read_speech_manifest(jsonl, skip_bad=True)  # both rows bad


def test_audio_error_names_the_manifest_row(tmp_path, clips):
    (clips / "bad.wav").write_bytes(b"not a wav file at all")
    manifest = tmp_path / "m.tsv"
    manifest.write_text("audio\ttext\nclips/bad.wav\tzero\n", encoding="utf-8")
    data = read_speech_manifest(manifest)  # nothing read yet
    with pytest.raises(AudioError, match="^" + re.escape(f"{manifest}:2: {clips / 'bad.wav'}: not a RIFF/WAVE file")):
        data.audio(0)


def test_folder_of_pairs(clips):
    (clips / "c0.txt").write_text("zero one\n", encoding="utf-8")
    (clips / "c1.txt").write_text("\ufefftwo\n", encoding="utf-8")
    (clips / "README.txt").write_text("not a transcript", encoding="utf-8")
    with pytest.raises(DataFileError, match=f"^{re.escape(str(clips / 'c2.wav'))}: no transcript c2.txt beside it$"):
        read_speech(clips)
    data = read_speech_folder(clips, skip_bad=True)
    assert [path.name for path in data.audio_paths] == ["c0.wav", "c1.wav"]
    assert data.transcripts == ["zero one", "two"] and data.origins == [str(clips / "c0.txt"), str(clips / "c1.txt")]
    (clips / "c2.txt").write_text(" \n", encoding="utf-8")
    empty = re.escape(f"{clips / 'c2.txt'}: the file is empty (the transcript of c2.wav)")
    with pytest.raises(DataFileError, match=empty):
        read_speech_folder(clips)
    (clips / "c2.txt").write_text("two", encoding="utf-8")
    (clips / "c3.flac").write_bytes(b"fLaC")
    with pytest.raises(DataFileError, match=r"c3.flac: tformer reads WAV audio, not .flac; convert it"):
        read_speech_folder(clips)
    (clips / "c3.flac").unlink()
    assert read_speech(clips).transcripts == ["zero one", "two", "two"]
    with pytest.raises(DataFileError, match="has no columns to name .text_column"):
        read_speech(clips, text_column="words")


def test_an_empty_folder_says_what_it_wants(tmp_path):
    with pytest.raises(DataFileError, match="no NAME.wav [+] NAME.txt pairs; a folder of speech data holds"):
        read_speech_folder(tmp_path)


# ---- FSDD connected digits -----------------------------------------------------------------------------------

SPEAKERS = ("ann", "bob", "cyd")
TAKES = range(10)  # takes 0-4 are the official test takes, 5-9 train


@pytest.fixture(scope="module")
def fake_fsdd(tmp_path_factory):
    """FSDD-named recordings, each a run of one distinct, non-zero sample value (its identity) of 40-99 samples."""
    folder = tmp_path_factory.mktemp("fsdd") / "recordings"
    folder.mkdir()
    identity = {}
    for number, (speaker, digit, take) in enumerate(
            (speaker, digit, take) for speaker in SPEAKERS for digit in range(10) for take in TAKES):
        value = number + 1
        write_wav(folder / f"{digit}_{speaker}_{take}.wav", np.full(40 + number % 60, value))
        identity[value] = f"{digit}_{speaker}_{take}"
    (folder / "README.md").write_text("not a recording", encoding="utf-8")
    return folder, identity


def pieces(samples: np.ndarray) -> tuple[list[int], list[int]]:
    """(the values of the non-zero runs, the lengths of the zero runs) of an utterance's samples."""
    edges = np.flatnonzero(np.diff(samples) != 0) + 1
    runs = np.split(samples, edges)
    return [int(run[0]) for run in runs if run[0] != 0], [len(run) for run in runs if run[0] == 0]


def manifest_rows(path: Path) -> list[dict[str, str]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


def test_utterances_are_their_recordings_and_silences(fake_fsdd, tmp_path):
    source, identity = fake_fsdd
    corpus = build_digit_corpus(source, tmp_path / "out", DigitSettings(train_utterances=40, test_utterances=20))
    assert corpus.sample_rate == RATE
    digits_seen = set()
    for split, takes in (("train", range(5, 10)), ("test", range(0, 5))):
        rows = manifest_rows(corpus.manifest(split))
        assert len(rows) == corpus.splits[split].utterances
        for row in rows:
            values, silences = pieces(read_samples(corpus.folder / row["audio"]))
            names = [identity[value] for value in values]
            assert names == row["recordings"].split()
            parsed = [name.split("_") for name in names]
            assert row["text"] == " ".join(DIGIT_WORDS[int(digit)] for digit, _, _ in parsed)
            assert {speaker for _, speaker, _ in parsed} == {row["speaker"]}
            assert all(int(take) in takes for _, _, take in parsed)  # official split: no test take in training
            assert len(set(names)) == len(names) and 2 <= len(names) <= 7
            digits_seen.add(len(names))
            assert len(silences) == len(names) + 1
            assert all(400 <= gap <= 2400 for gap in silences[1:-1])  # 50-300 ms at 8 kHz
            assert all(160 <= edge <= 800 for edge in (silences[0], silences[-1]))  # 20-100 ms
    assert digits_seen == set(range(2, 8))
    summary = corpus.splits["train"]
    assert sum(summary.digits.values()) == 40 and set(summary.speakers) == set(SPEAKERS)
    marker = json.loads((corpus.folder / MARKER_NAME).read_text(encoding="utf-8"))
    assert marker["settings"]["train_utterances"] == 40 and marker["sample_rate"] == RATE


def test_manifest_reads_back(fake_fsdd, tmp_path):
    corpus = build_digit_corpus(fake_fsdd[0], tmp_path / "out", DigitSettings(train_utterances=6, test_utterances=3))
    data = read_speech_manifest(corpus.manifest("test"))
    assert len(data) == 3 and all(path.is_file() for path in data.audio_paths)
    assert data.transcripts == [row["text"] for row in manifest_rows(corpus.manifest("test"))]
    assert data.audio_paths[0] == corpus.folder / "test" / "00000.wav"
    assert data.audio(0, sample_rate=RATE).dtype == np.float32


def test_same_seed_same_bytes(fake_fsdd, tmp_path):
    settings = DigitSettings(train_utterances=12, test_utterances=6, seed=3)

    def contents(folder: Path) -> dict[str, bytes]:
        files = sorted(path for path in folder.rglob("*") if path.is_file())
        return {str(path.relative_to(folder)): path.read_bytes() for path in files}

    first = contents(build_digit_corpus(fake_fsdd[0], tmp_path / "a", settings).folder)
    assert first == contents(build_digit_corpus(fake_fsdd[0], tmp_path / "b", settings).folder)
    assert len(first) == 12 + 6 + 3
    other = contents(build_digit_corpus(fake_fsdd[0], tmp_path / "c", DigitSettings(12, 6, seed=4)).folder)
    assert other["train.tsv"] != first["train.tsv"]


def test_held_out_speaker_split(fake_fsdd, tmp_path):
    source, _ = fake_fsdd
    settings = DigitSettings(train_utterances=30, test_utterances=10, held_out_speaker="bob")
    corpus = build_digit_corpus(source, tmp_path / "out", settings)
    train, test = manifest_rows(corpus.manifest("train")), manifest_rows(corpus.manifest("test"))
    assert all("_bob_" not in row["recordings"] and row["speaker"] != "bob" for row in train)
    assert all(row["speaker"] == "bob" and row["recordings"].count("_bob_") == len(row["recordings"].split())
               for row in test)
    takes = {int(name.split("_")[2]) for row in test for name in row["recordings"].split()}
    assert takes & set(range(0, 5)) and takes & set(range(5, 10))  # every take of the held-out speaker
    recordings = list_recordings(source)
    train_pool, test_pool = split_recordings(recordings, "bob")
    assert len(train_pool) == 200 and len(test_pool) == 100 and not set(train_pool) & set(test_pool)
    with pytest.raises(FsddError, match="held-out speaker 'dan' is not one of the speakers: ann, bob, cyd"):
        split_recordings(recordings, "dan")


def test_output_folder_replaced_only_when_ours(fake_fsdd, tmp_path):
    source, _ = fake_fsdd
    out = tmp_path / "out"
    build_digit_corpus(source, out, DigitSettings(4, 2))
    build_digit_corpus(source, out, DigitSettings(3, 2))  # ours: replaced
    assert len(list((out / "train").iterdir())) == 3
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(DataFileError, match="holds files this builder did not write"):
        build_digit_corpus(source, out, DigitSettings(3, 2))
    corpus = build_digit_corpus(source, out, DigitSettings(3, 2), overwrite=True)
    assert corpus.moved_aside == tmp_path / "out.replaced-1"
    assert (tmp_path / "out.replaced-1" / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert sorted(path.name for path in out.iterdir()) == [MARKER_NAME, "test", "test.tsv", "train", "train.tsv"]
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []  # no temporary folder left
    (tmp_path / "empty").mkdir()
    build_digit_corpus(source, tmp_path / "empty", DigitSettings(2, 1))


def test_a_build_clears_the_temporary_folder_of_one_killed_midway(fake_fsdd, tmp_path):
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # its pid now names no process
    debris, look_alike = tmp_path / f".out.tmp-{child.pid}", tmp_path / ".out.tmp-mine"
    for folder in (debris, look_alike):
        (folder / "train").mkdir(parents=True)
    build_digit_corpus(fake_fsdd[0], tmp_path / "out", DigitSettings(2, 1))
    assert not debris.exists() and look_alike.is_dir()


def test_bad_settings_and_sources(fake_fsdd, tmp_path):
    with pytest.raises(FsddError, match="min_digits=5, max_digits=3"):
        DigitSettings(min_digits=5, max_digits=3)
    with pytest.raises(FsddError, match="min_gap_ms=400 is above max_gap_ms=300"):
        DigitSettings(min_gap_ms=400)
    with pytest.raises(FsddError, match="train_utterances=-1 must be an integer >= 0"):
        DigitSettings(train_utterances=-1)
    (tmp_path / "odd").mkdir()
    write_wav(tmp_path / "odd" / "hello.wav", [1, 2])
    with pytest.raises(FsddError, match=r"1 .wav files are not named \{digit\}_\{speaker\}_\{take\}.wav: hello.wav"):
        list_recordings(tmp_path / "odd")
    with pytest.raises(FsddError, match="fewer than max_digits=60 recordings"):
        build_digit_corpus(fake_fsdd[0], tmp_path / "out", DigitSettings(2, 1, max_digits=60))  # 50 a speaker


def silences_between(samples: np.ndarray, parts: list[np.ndarray], start: int = 0) -> list[int] | None:
    """The zero runs that, with ``parts`` in order, make up ``samples[start:]`` (lead 160-800 samples, gaps
    400-2400, tail 160-800), or None when no such split exists (a part may itself begin or end with zeros,
    so every length in range is tried)."""
    if not parts:
        tail = len(samples) - start
        return [tail] if 160 <= tail <= 800 and not samples[start:].any() else None
    low, high = (160, 800) if start == 0 else (400, 2400)
    part = parts[0]
    for silence in range(low, high + 1):
        at = start + silence
        if samples[start:at].any():
            return None
        if np.array_equal(samples[at : at + len(part)], part):
            rest = silences_between(samples, parts[1:], at + len(part))
            if rest is not None:
                return [silence, *rest]
    return None


def test_real_fsdd(tmp_path):
    """The shared FSDD: 3,000 recordings of six speakers, 2,700 training and 300 test ones; an utterance's
    samples are its recordings' samples (read with the standard library's wave) between silences."""
    require(FSDD_RECORDINGS)
    recordings = list_recordings(FSDD_RECORDINGS)
    assert len(recordings) == 3000 and {recording.take for recording in recordings} == set(range(50))
    assert sorted({recording.speaker for recording in recordings}) == \
        ["george", "jackson", "lucas", "nicolas", "theo", "yweweler"]
    train, test = split_recordings(recordings)
    assert (len(train), len(test)) == (2700, 300)
    corpus = build_digit_corpus(FSDD_RECORDINGS, tmp_path / "out", DigitSettings(train_utterances=2, test_utterances=1))
    for split in ("train", "test"):
        for row in manifest_rows(corpus.manifest(split)):
            parts = [read_samples(FSDD_RECORDINGS / f"{name}.wav") for name in row["recordings"].split()]
            silences = silences_between(read_samples(corpus.folder / row["audio"]), parts)
            assert silences is not None and len(silences) == len(parts) + 1
