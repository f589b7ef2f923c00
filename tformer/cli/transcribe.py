"""``tformer transcribe MODEL AUDIO.wav...``: the transcript of each WAV file by a speech model (a run folder,
a checkpoint, a Hugging Face Whisper folder or a Hub name), one line per file.

Each file is read (mono, resampled to 16 kHz), padded with silence to a whole number of the model's windows
and turned into log-mel features, as the speech recognition task prepares its data; audio longer than a window
is transcribed window after window (``tformer.generation.transcribe_ids``) and the pieces joined. A Whisper
checkpoint is prompted with <|startoftranscript|>, the language (``--language``; a multilingual model needs
it: tformer does no language detection), <|transcribe|> and <|notimestamps|>."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tformer.cli import add_device_option, add_model_argument, add_threads_option

WHISPER_START = "<|startoftranscript|>"
MULTILINGUAL_VOCAB = 51865  # Whisper's multilingual vocabulary; the English-only models have 51,864 tokens


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "transcribe", help="transcribe WAV files with a speech model (one line per file)",
        description="Transcribe each WAV file with the speech model of a folder (a run or checkpoint folder of a "
                    "speech_recognition run, or a Hugging Face Whisper folder), greedy or by beam search. Prints "
                    "TRANSCRIPT<tab>FILE per file, in the order given (--json: one JSON object per file with file, "
                    "text and seconds of audio). Every file is read before any is transcribed: a bad one stops the "
                    "command with nothing printed.",
    )
    add_model_argument(parser, "model", "a speech model folder (a run folder, a checkpoint, a Whisper folder)")
    parser.add_argument("audio", nargs="+", metavar="AUDIO", help="WAV files (PCM or float, any rate and channels)")
    parser.add_argument("--beam", type=int, default=1, help="beams (default: 1, greedy)")
    parser.add_argument("--language", help="a Whisper model's language code (en, de, ...); a multilingual Whisper "
                                           "model needs it")
    parser.add_argument("--max-new-tokens", type=int, metavar="N",
                        help="tokens a window's transcript may have (default: as many as the decoder's positions hold)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line: file, text, seconds")
    add_device_option(parser)
    add_threads_option(parser)
    parser.set_defaults(run=run)


def read_recordings(paths: list[str], sample_rate: int) -> list:
    """Every file's mono samples (N,) at ``sample_rate``, all read before any is used; a bad file is a one-line
    UsageError naming it."""
    from tformer.cli import UsageError
    from tformer.data.audio import AudioError, load_audio

    recordings = []
    for path in paths:
        if Path(path).is_dir():
            raise UsageError(f"{path}: is a folder; give WAV files, e.g. {Path(path) / '*.wav'}")
        try:
            recordings.append(load_audio(path, sample_rate))
        except AudioError as error:
            raise UsageError(str(error)) from None
    return recordings


def load_speech_model(folder: str, device):
    """The speech model of ``folder`` with its tokenizer, or a one-line UsageError."""
    import tformer
    from tformer.cli import UsageError

    model = tformer.load(folder, device=device)
    if getattr(model, "inputs", "tokens") != "audio":
        raise UsageError(f"{folder}: a {model.config.architecture} model does not transcribe audio; give a speech "
                         "model (architecture 'speech': a speech_recognition run, or a Whisper folder)")
    if getattr(model, "tokenizer", None) is None:
        raise UsageError(f"{folder}: the model folder has no tokenizer to write the transcripts with")
    return model


def decoder_prompt(model, language: str | None) -> tuple[int, ...]:
    """The decoder's first tokens: Whisper's prompt for a Whisper tokenizer (with ``language``), else none (the
    model's start token)."""
    from tformer.cli import UsageError
    from tformer.models.speech import whisper_prompt

    tokenizer = model.tokenizer
    if tokenizer.token_to_id(WHISPER_START) is None:
        if language is not None:
            raise UsageError(f"--language {language}: this model's tokenizer has no language tokens (it is not a "
                             "Whisper model); leave --language out")
        return ()
    multilingual = model.config.vocab_size >= MULTILINGUAL_VOCAB
    if multilingual and language is None:
        raise UsageError("a multilingual Whisper model needs --language (en, de, fr, ...): tformer does no language "
                         "detection")
    try:
        if not multilingual:
            if language is not None:
                raise UsageError(f"--language {language}: an English-only Whisper model takes no language")
            return whisper_prompt(tokenizer, None, None)
        return whisper_prompt(tokenizer, language, "transcribe")
    except ValueError as error:
        raise UsageError(f"--language {language}: {error}") from None


def transcript_budget(model, prompt: tuple[int, ...]) -> int:
    """The new tokens a window's transcript may have: what the decoder's positions hold after ``prompt``."""
    limit = model.position_limit or model.config.max_seq_len
    return max(1, limit - max(len(prompt), 1))


def run(args: argparse.Namespace) -> int:
    import torch

    from tformer.cli import UsageError, resolve_device
    from tformer.data.log_mel import LogMelSettings, recording_features
    from tformer.generation.transcription import transcribe_ids
    from tformer.nn import compiled

    device = resolve_device(args.device)
    if args.beam < 1:
        raise UsageError(f"--beam {args.beam} must be a positive integer")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens} must be a positive integer")
    recordings = read_recordings(args.audio, LogMelSettings.sample_rate)  # before the model loads
    model = load_speech_model(args.model, device)
    prompt = decoder_prompt(model, args.language)
    settings = model.log_mel_settings  # (16 kHz, as the recordings were read)
    budget = args.max_new_tokens or transcript_budget(model, prompt)
    compiled.ready(device)  # a first run builds the CPU kernels here, outside the timed part
    started = time.perf_counter()
    lines = []
    for path, samples in zip(args.audio, recordings, strict=True):
        features = recording_features(torch.from_numpy(samples), settings)[None].to(device)  # (1, M, windows x frames)
        with torch.inference_mode():
            ids = transcribe_ids(model, features, budget, decoder_prompt_ids=prompt, num_beams=args.beam)[0]
        text = " ".join(model.tokenizer.decode(ids, skip_special_tokens=True).split())  # one line, always
        seconds = len(samples) / settings.sample_rate
        lines.append(json.dumps({"file": path, "text": text, "seconds": round(seconds, 3)}, ensure_ascii=False)
                     if args.json else f"{text}\t{path}")
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    sys.stdout.flush()
    audio_seconds = sum(len(samples) for samples in recordings) / settings.sample_rate
    elapsed = time.perf_counter() - started
    print(f"transcribed {len(recordings):,} file{'s' if len(recordings) != 1 else ''} ({audio_seconds:,.1f} s of "
          f"audio) in {elapsed:.1f} s, beam {args.beam}", file=sys.stderr)
    return 0
