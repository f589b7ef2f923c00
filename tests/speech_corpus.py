"""A tiny speech recognition corpus and model for tests: tones written as 8 kHz WAV files with the standard
library's ``wave``, transcripts of digit words, a manifest, and a speech model of a half-second window."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import torch

import tformer

RATE = 8000
WORDS = ("zero", "one", "two", "three")
WINDOW_POSITIONS = 25  # max_source_positions: a window of 50 frames, 0.5 s


def write_tone(path: Path, seconds: float, hertz: float, rate: int = RATE) -> Path:
    """A mono 16-bit WAV of a tone."""
    samples = 0.3 * np.sin(2 * np.pi * hertz * np.arange(round(seconds * rate)) / rate)
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes((samples * 32767).astype("<i2").tobytes())
    return path


def write_corpus(folder: Path, count: int = 8, seed: int = 0, name: str = "train.tsv") -> Path:
    """``count`` tones of 0.1-0.4 s in ``folder/clips`` with a transcript of two digit words each, listed in
    the manifest ``folder/name`` (columns audio, text); returns the manifest."""
    rng = np.random.default_rng(seed)
    clips = folder / "clips"
    clips.mkdir(parents=True, exist_ok=True)
    lines = ["audio\ttext"]
    for number in range(count):
        write_tone(clips / f"{seed}-{number}.wav", rng.uniform(0.1, 0.4), 200 + 100 * number)
        lines.append(f"clips/{seed}-{number}.wav\t{' '.join(rng.choice(WORDS, 2))}")
    manifest = folder / name
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return manifest


def tiny_model(vocab_size: int, max_seq_len: int = 16, **fields) -> tformer.Model:
    """whisper-digits cut down: width 32, one block a side, a half-second window, no dropout. With an
    ``initializer_range`` (0.5: random weights that write varied text) the stem's convolutions are drawn with
    it too (a fresh model draws them He-normal)."""
    torch.manual_seed(0)
    settings = {"d_model": 32, "num_layers": 1, "num_encoder_layers": 1, "num_heads": 2, "d_ff": 64,
                "max_source_positions": WINDOW_POSITIONS, "max_seq_len": max_seq_len, "vocab_size": vocab_size,
                "dropout": 0.0, "attention_dropout": 0.0, **fields}
    model = tformer.build_model("whisper-digits", **settings)
    if "initializer_range" in fields:
        with torch.no_grad():
            for conv in (model.audio.conv1, model.audio.conv2):
                conv.weight.normal_(0.0, fields["initializer_range"])
    return model
