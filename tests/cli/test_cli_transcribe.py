"""``tformer transcribe`` on a tiny saved speech model (one line per file, windows of long audio joined, JSON
lines, the same transcript the task's evaluation decodes; a bad WAV stops it with one line and nothing on
standard output), Whisper's prompt for a Whisper tokenizer, and a tiny speech recognition run end to end:
``tformer train`` on a manifest, then ``tformer evaluate`` printing and recording WER and CER (for a run that
reported its loss only), then ``tformer transcribe`` on the run folder."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from speech_corpus import WORDS, tiny_model, write_corpus, write_tone

import tformer
from tformer.cli import main
from tformer.data.audio import load_audio
from tformer.data.log_mel import log_mel_spectrogram, pad_to_windows
from tformer.tokenizers import CharTokenizer
from tformer.training.recipe import recipe_from_dict
from tformer.training.run import train_recipe
from tformer.training.tasks.speech_recognition import SPEECH_SPECIAL_TOKENS


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny speech model of wide random weights (it writes varied text) saved with its character tokenizer,
    and two recordings: 0.3 s (one window) and 1.2 s (three windows of 0.5 s)."""
    folder = tmp_path_factory.mktemp("speech")
    tokenizer = CharTokenizer.train([" ".join(WORDS)], special_tokens=SPEECH_SPECIAL_TOKENS)
    model = tiny_model(tokenizer.vocab_size, initializer_range=0.5)
    model.tokenizer = tokenizer
    model.save(folder / "model")
    short = write_tone(folder / "short.wav", 0.3, 300)
    long = write_tone(folder / "long.wav", 1.2, 500, rate=16000)
    return folder / "model", short, long


def test_one_line_per_file_in_order(saved, capsys):
    model, short, long = saved
    assert main(["transcribe", str(model), str(short), str(long)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert [line.split("\t")[1] for line in lines] == [str(short), str(long)]
    assert all(line.split("\t")[0] for line in lines)
    assert "transcribed 2 files (1.5 s of audio)" in err


def test_the_transcript_is_what_the_model_decodes_from_the_padded_features(saved, capsys):
    """The short file: one window of its audio padded with silence, as the task's evaluation reads it; the long
    one: its three windows decoded one by one and joined."""
    folder, short, long = saved
    model = tformer.load(folder)
    settings = model.log_mel_settings
    texts = []
    for path in (short, long):
        features = log_mel_spectrogram(pad_to_windows(torch.from_numpy(load_audio(path)), settings.window_samples),
                                       settings)[None]  # (1, M, windows x F)
        ids = []
        for window in features.split(settings.window_frames, dim=-1):
            new = tformer.generate(model, window, 15)[0, 1:].tolist()
            ids += new[: new.index(2)] if 2 in new else new
        texts.append(model.tokenizer.decode(ids, skip_special_tokens=True))
    assert main(["transcribe", str(folder), str(short), str(long), "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [record["text"] for record in records] == texts
    assert records[0] == {"file": str(short), "text": texts[0], "seconds": 0.3}
    assert records[1]["seconds"] == 1.2


def test_beam_search_gives_a_line_too(saved, capsys):
    model, short, _ = saved
    assert main(["transcribe", str(model), str(short), "--beam", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


@pytest.mark.parametrize("case, message", [
    ("bad", "bad.wav: not a RIFF/WAVE file; tformer reads WAV files (PCM or float)"),
    ("missing", "gone.wav: no such file"),
    ("device", "/dev/null: not a regular file (a character device); give a WAV file"),
    ("nan", "nan.wav: 1 float sample(s) NaN, infinite or beyond +-1000 (the first, at 0.000 s: NaN)"),
    ("beam", "--beam 0 must be a positive integer"),
    ("language", "--language en: this model's tokenizer has no language tokens"),
])
def test_errors_are_one_line_and_nothing_is_printed(saved, tmp_path, capsys, case, message):
    model, short, _ = saved
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"ID3 not audio at all")
    nan = tmp_path / "nan.wav"  # a float WAV of 8 kHz: NaN, then silence
    samples = np.array([np.nan] + [0.0] * 799, dtype="<f4").tobytes()
    chunks = b"fmt " + struct.pack("<IHHIIHH", 16, 3, 1, 8000, 4 * 8000, 4, 32)  # IEEE float, mono, 32-bit
    chunks += b"data" + struct.pack("<I", len(samples)) + samples
    nan.write_bytes(b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks)
    arguments = {"bad": [str(short), str(bad)], "missing": [str(short), str(tmp_path / "gone.wav")],
                 "device": [str(short), "/dev/null"],
                 "nan": [str(short), str(nan)],
                 "beam": [str(short), "--beam", "0"], "language": [str(short), "--language", "en"]}[case]
    assert main(["transcribe", str(model), *arguments]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and message in err


def test_a_model_that_does_not_read_audio_is_refused(tmp_path, capsys):
    tformer.build_model("gpt-nano").save(tmp_path / "gpt")
    write_tone(tmp_path / "a.wav", 0.2, 300)
    assert main(["transcribe", str(tmp_path / "gpt"), str(tmp_path / "a.wav")]) == 2
    assert "a decoder model does not transcribe audio" in capsys.readouterr().err


def test_a_whisper_tokenizer_gets_whispers_prompt_with_the_language():
    from types import SimpleNamespace

    from tformer.cli import UsageError
    from tformer.cli.model_inputs import decoder_prompt

    specials = ["<unk>", "<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|de|>", "<|transcribe|>",
                "<|notimestamps|>"]
    tokenizer = CharTokenizer("abc", special_tokens=specials)
    ids = {token: tokenizer.token_to_id(token) for token in specials}

    def model(vocab_size):
        return SimpleNamespace(tokenizer=tokenizer, config=SimpleNamespace(vocab_size=vocab_size))

    assert decoder_prompt(model(51865), "de") == tuple(ids[token] for token in (
        "<|startoftranscript|>", "<|de|>", "<|transcribe|>", "<|notimestamps|>"))
    assert decoder_prompt(model(51864), None) == (ids["<|startoftranscript|>"], ids["<|notimestamps|>"])
    for vocab_size, language, message in ((51865, None, "--language: a multilingual Whisper model needs a language"),
                                          (51865, "fr", "--language fr: the tokenizer has no <|fr|> token"),
                                          (51864, "en", "--language en: an English-only Whisper model takes no")):
        with pytest.raises(UsageError, match=message):
            decoder_prompt(model(vocab_size), language)


# ---- a run end to end -------------------------------------------------------------------------------------------


@pytest.mark.slow  # trains, saves and evaluates a run (1.3-2 s on two busy cores)
def test_train_then_evaluate_prints_and_records_wer_and_cer(tmp_path, capsys):
    write_corpus(tmp_path, count=8, seed=0)
    test = write_corpus(tmp_path, count=3, seed=1, name="test.tsv")
    recipe = recipe_from_dict({
        "model": {"preset": "whisper-digits", "d_model": 32, "num_layers": 1, "num_encoder_layers": 1,
                  "num_heads": 2, "d_ff": 64, "max_source_positions": 25, "max_seq_len": 16},
        "data": {"train": "train.tsv", "eval": "test.tsv"},
        "task": {"name": "speech_recognition", "time_masks": 1, "time_mask_frames": 5, "eval_wer": False},
        "training": {"max_steps": 2, "batch_size": 4, "eval_every": 2, "eval_batches": 0, "threads": 1,
                     "early_stopping_metric": "eval_loss"},
    }, base_dir=tmp_path)
    train_recipe(recipe, tmp_path / "run", progress=False, echo=lambda line: None)
    assert "wer " not in capsys.readouterr().out  # the run scored its loss only; evaluate transcribes
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(test)]) == 0
    out = capsys.readouterr().out
    printed = {line.split()[0]: float(line.split()[1]) for line in out.splitlines() if line.startswith("eval_")}
    assert set(printed) == {"eval_loss", "eval_wer", "eval_cer"}
    record = json.loads((tmp_path / "run" / "evaluation" / "test.json").read_text(encoding="utf-8"))
    assert record["task"] == "speech_recognition"
    assert record["eval_wer"] == pytest.approx(printed["eval_wer"], abs=1e-4)
    assert record["eval_cer"] == pytest.approx(printed["eval_cer"], abs=1e-4)
    assert main(["transcribe", str(tmp_path / "run"), str(tmp_path / "clips" / "1-0.wav")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert np.isfinite(record["eval_loss"]) and record["beam"] == 1
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(test), "--beam", "3"]) == 0  # beside, not over it
    beams = json.loads((tmp_path / "run" / "evaluation" / "test.beam3.json").read_text(encoding="utf-8"))
    assert beams["beam"] == 3 and beams["eval_loss"] == record["eval_loss"]


def test_transcribe_takes_the_option_groups_quantize(saved, capsys):
    """--quantize came to transcribe with the shared option group: the transcript is the quantized model's."""
    from tformer.data.log_mel import recording_features
    from tformer.generation.transcription import transcribe_ids, transcript_budget

    folder, short, _ = saved
    assert main(["transcribe", str(folder), str(short), "--quantize", "int8", "--json"]) == 0
    text = json.loads(capsys.readouterr().out)["text"]
    model = tformer.load(folder, quantize="int8")
    assert model.quantization.method == "int8"
    features = recording_features(torch.from_numpy(load_audio(short)), model.log_mel_settings)[None]
    with torch.inference_mode():
        ids = transcribe_ids(model, features, transcript_budget(model, ()))[0]
    assert text == " ".join(model.tokenizer.decode(ids, skip_special_tokens=True).split())


def test_transcribe_runs_the_speech_model_in_the_dtype_asked_for(saved, capsys):
    """--dtype bf16: the features (float32 log-mels) go through the bfloat16 model; the transcript is its own."""
    from tformer.data.log_mel import recording_features
    from tformer.generation.transcription import transcribe_ids, transcript_budget

    folder, short, _ = saved
    assert main(["transcribe", str(folder), str(short), "--dtype", "bf16", "--json"]) == 0
    text = json.loads(capsys.readouterr().out)["text"]
    model = tformer.load(folder).to(torch.bfloat16)
    features = recording_features(torch.from_numpy(load_audio(short)), model.log_mel_settings)[None]
    with torch.inference_mode():
        ids = transcribe_ids(model, features, transcript_budget(model, ()))[0]
    assert text == " ".join(model.tokenizer.decode(ids, skip_special_tokens=True).split())
