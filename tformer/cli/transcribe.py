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

from tformer.cli.model_source import add_model_source


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "transcribe", help="transcribe WAV files with a speech model (one line per file)",
        description="Transcribe each WAV file with the speech model of a folder (a run or checkpoint folder of a "
                    "speech_recognition run, or a Hugging Face Whisper folder), greedy or by beam search. Prints "
                    "TRANSCRIPT<tab>FILE per file, in the order given (--json: one JSON object per file with file, "
                    "text and seconds of audio). Every file is read before any is transcribed: a bad one stops the "
                    "command with nothing printed.",
    )
    add_model_source(parser, "model", "a speech model folder (a run folder, a checkpoint, a Whisper folder)")
    parser.add_argument("audio", nargs="+", metavar="AUDIO", help="WAV files (PCM or float, any rate and channels)")
    parser.add_argument("--beam", type=int, default=1, help="beams (default: 1, greedy)")
    parser.add_argument("--language", help="a Whisper model's language code (en, de, ...); a multilingual Whisper "
                                           "model needs it")
    parser.add_argument("--max-new-tokens", type=int, metavar="N",
                        help="tokens a window's transcript may have (default: as many as the decoder's positions hold)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line: file, text, seconds")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from tformer.cli import UsageError
    from tformer.cli.model_inputs import decoder_prompt, read_recordings
    from tformer.cli.model_source import load_speech_model
    from tformer.data.log_mel import LogMelSettings, recording_features
    from tformer.generation.transcription import transcribe_ids, transcript_budget
    from tformer.nn import compiled

    if args.beam < 1:
        raise UsageError(f"--beam {args.beam} must be a positive integer")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens} must be a positive integer")
    recordings = read_recordings(args.audio, LogMelSettings.sample_rate)  # before the model loads
    model = load_speech_model(args.model_source)
    device = model.device
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
