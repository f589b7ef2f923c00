"""The speech recognition task: batches a pure function of (seed, position), SpecAugment's masks within their
declared widths and inside each recording's audio, features equal to the log-mel of the audio padded with
silence to the window, audio longer than the window and transcripts longer than the decoder refused, WER and
CER during evaluation equal to ``tformer.evaluation.speech`` on transcripts decoded one utterance at a time,
and the recipe's [task] and [data] settings accepted or refused."""

from __future__ import annotations

import struct

import pytest
import torch
from speech_corpus import tiny_model, write_corpus, write_tone

import tformer
from tformer.data.log_mel import LogMelSettings, log_mel_spectrogram, pad_to_windows, warp_frequencies
from tformer.data.sources import DataConfig
from tformer.evaluation.speech import transcription_scores
from tformer.nn.losses import ctc_loss, token_cross_entropy
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks import TaskConfig
from tformer.training.tasks.registry import check_data_options
from tformer.training.tasks.speech_recognition import SpeechRecognition, learn_word_vocabulary, spans


def make_task(folder, *, seed: int = 3, batch_size: int = 4, rank: int = 0, world_size: int = 1, model=None,
              **options):
    manifest = write_corpus(folder)
    data = DataConfig(train=str(manifest), eval=str(manifest), tokenizer=options.pop("tokenizer", "char"))
    task, loaded = SpeechRecognition.from_recipe(data, seq_len=16, **options)
    model = model if model is not None else tiny_model(loaded.vocab_size)
    task.prepare(TrainingConfig(batch_size=batch_size, seed=seed, eval_batches=0, seq_len=16),
                 ProcessContext(rank, world_size), model)
    return task, model


def test_the_learned_vocabulary_has_the_digit_presets_special_ids(tmp_path):
    task, _ = make_task(tmp_path)
    tokenizer = task.tokenizer
    ids = (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id)
    assert ids == (0, 1, 2, 3)
    preset = tformer.PRESETS["whisper-digits"]
    assert (preset.pad_token_id, preset.decoder_start_token_id, preset.eos_token_id) == (0, 1, 2)


def test_a_word_vocabulary_writes_one_token_a_word(tmp_path):
    """data.tokenizer = "words": the training transcripts' words after the four special tokens, each one id;
    a batch's labels decode back to the transcript; a word the training transcripts never had reads as <unk>."""
    task, _ = make_task(tmp_path, tokenizer="words")
    tokenizer = task.tokenizer
    assert [tokenizer.id_to_token(index) for index in range(tokenizer.vocab_size)] == [
        "<pad>", "<s>", "</s>", "<unk>", *sorted({word for text in task.train.transcripts for word in text.split()})]
    labels = task.train_batch(0)["labels"]
    rows = task.global_indices(0, len(task.train_rows)).tolist()
    for place, row in enumerate(rows):
        ids = [token for token in labels[place].tolist() if token != -100]
        assert len(ids) == len(task.train.transcripts[row].split()) + 1  # the words and the end token
        assert tokenizer.decode(ids, skip_special_tokens=True) == task.train.transcripts[row]
    assert tokenizer.encode("zero eleven", add_special_tokens=False)[1] == tokenizer.unk_token_id


def test_learned_vocabularies_keep_punctuation_and_case_inside_words():
    tokenizer = learn_word_vocabulary(["Don't stop, ok", "ok  go\tnow"])
    assert [tokenizer.id_to_token(index) for index in range(4, tokenizer.vocab_size)] == [
        "Don't", "go", "now", "ok", "stop,"]
    ids = tokenizer.encode("Don't stop, ok", add_special_tokens=False)
    assert len(ids) == 3 and tokenizer.decode(ids) == "Don't stop, ok"


def test_a_batch_is_the_recordings_features_and_the_transcripts_ids(tmp_path):
    task, model = make_task(tmp_path)
    batch = task.train_batch(0)
    assert set(batch) == {"input_features", "decoder_input_ids", "labels"}
    features, labels = batch["input_features"], batch["labels"]
    assert features.shape == (4, 80, model.config.input_frames) and features.dtype == torch.float32
    rows = task.global_indices(0, len(task.train_rows))
    for place, row in enumerate(rows.tolist()):
        samples = torch.from_numpy(task.train.audio(row))  # the recording at 16 kHz, padded with silence
        expected = log_mel_spectrogram(pad_to_windows(samples, model.log_mel_settings.window_samples),
                                       model.log_mel_settings)
        assert torch.equal(features[place], expected)
        ids = [token for token in labels[place].tolist() if token != -100]
        assert ids[-1] == task.tokenizer.eos_token_id
        assert task.tokenizer.decode(ids, skip_special_tokens=True) == task.train.transcripts[row]
    assert torch.equal(batch["decoder_input_ids"][:, 0], torch.full((4,), task.tokenizer.bos_token_id))


def test_batches_are_a_pure_function_of_seed_and_position(tmp_path):
    masks = {"time_masks": 2, "time_mask_frames": 6, "frequency_masks": 1, "frequency_mask_bins": 12}
    first, model = make_task(tmp_path / "a", **masks)
    again, _ = make_task(tmp_path / "b", model=model, **masks)  # built afresh: nothing carried over
    for position in (0, 5, 3):
        one, two = first.train_batch(position), again.train_batch(position)
        assert all(torch.equal(one[key], two[key]) for key in one)
    assert not torch.equal(first.train_batch(1)["input_features"], first.train_batch(2)["input_features"])
    plain, _ = make_task(tmp_path / "c", model=model)  # the same rows without SpecAugment
    other_seed, _ = make_task(tmp_path / "d", model=model, seed=4, **masks)
    masked, clean = first.train_batch(0), plain.train_batch(0)
    assert torch.equal(masked["labels"], clean["labels"])
    changed = masked["input_features"] != clean["input_features"]
    assert changed.any() and bool((masked["input_features"][changed] == 0).all())  # masked to 0, nothing else
    assert not torch.equal(other_seed.train_batch(0)["input_features"], masked["input_features"])


def test_two_processes_see_the_rows_and_masks_of_one(tmp_path):
    masks = {"time_masks": 2, "time_mask_frames": 6, "frequency_masks": 1, "frequency_mask_bins": 12}
    alone, model = make_task(tmp_path / "a", batch_size=4, **masks)
    halves = [make_task(tmp_path / f"r{rank}", batch_size=2, rank=rank, world_size=2, model=model, **masks)[0]
              for rank in range(2)]
    whole = alone.train_batch(1)
    parts = [half.train_batch(1) for half in halves]
    assert torch.equal(whole["input_features"], torch.cat([part["input_features"] for part in parts]))


def test_spec_augment_spans_keep_their_declared_widths_inside_the_audio():
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 40, (500,), generator=generator)
    mask = spans(lengths, 50, 1, 7, generator)  # (500, 50)
    widths = mask.sum(dim=1)
    assert int(widths.max()) == 7 and int(widths.min()) == 0  # 0..7 frames, both ends drawn
    for row, length in enumerate(lengths.tolist()):
        places = mask[row].nonzero().flatten().tolist()
        assert places == list(range(places[0], places[0] + len(places))) if places else True  # one run
        assert all(place < length for place in places)  # inside the recording, never in its padding
    two = spans(torch.full((200,), 50), 50, 2, 5, generator)
    assert int(two.sum(dim=1).max()) <= 10 and int(two.sum(dim=1).max()) > 5  # two spans of at most 5


def test_the_frequency_masks_cover_whole_bands_of_at_most_the_declared_bins(tmp_path):
    task, _ = make_task(tmp_path, frequency_masks=1, frequency_mask_bins=12)
    plain, _ = make_task(tmp_path / "plain", model=task.model)
    for position in range(4):
        masked, clean = task.train_batch(position)["input_features"], plain.train_batch(position)["input_features"]
        zeroed = (masked == 0) & (clean != 0)  # (B, M, F)
        bands = zeroed.any(dim=2)  # (B, M): the masked mels of each row
        assert int(bands.sum(dim=1).max()) <= 12
        for row in range(len(bands)):  # a masked mel is masked at every frame
            assert bool((masked[row][bands[row]] == 0).all())


@pytest.mark.parametrize("hertz", [300.0, 1000.0, 2500.0])
@pytest.mark.parametrize("factor", [0.85, 1.12])
def test_a_warped_tone_reads_as_the_tone_at_the_warped_frequency(hertz, factor):
    """Vocal tract length perturbation on features: a tone of f Hz warped by a factor puts its peak in the
    mel filter (at its level, within 0.1 on the log-mel scale) where a tone of factor * f Hz has its own; the
    top of the band stays where it is; a factor of 1 returns the features unchanged."""
    settings = LogMelSettings(window_samples=8000)
    time = torch.arange(8000, dtype=torch.float64) / 16000

    def tone(frequency: float) -> torch.Tensor:
        return log_mel_spectrogram(torch.sin(2 * torch.pi * frequency * time).float()[None], settings)  # (1, M, F)

    warped = warp_frequencies(tone(hertz), torch.tensor([factor]), settings)[0, :, 25]  # (M,), a middle frame
    expected = tone(factor * hertz)[0, :, 25]
    peak = int(expected.argmax())
    assert int(warped.argmax()) == peak
    assert abs(float(warped[peak] - expected[peak])) < 0.1
    features = tone(hertz).repeat(2, 1, 1)
    assert torch.equal(warp_frequencies(features, torch.tensor([1.0, 1.0]), settings), features)


def test_frequency_warp_draws_a_factor_a_recording_within_its_range(tmp_path):
    plain, model = make_task(tmp_path / "plain")
    warped, _ = make_task(tmp_path / "warped", model=model, frequency_warp=0.1)
    again, _ = make_task(tmp_path / "again", model=model, frequency_warp=0.1)
    factors = torch.cat([warped._masks(position, torch.arange(4))["warp"] for position in range(50)])
    assert 0.9 <= float(factors.min()) < 0.92 and 1.08 < float(factors.max()) <= 1.1
    for position in (0, 3):
        batch = warped.train_batch(position)
        assert torch.equal(batch["input_features"], again.train_batch(position)["input_features"])  # pure
        index = warped.global_indices(position, len(warped.train_rows))
        expected = warp_frequencies(plain.train_batch(position)["input_features"],
                                    warped._masks(position, index)["warp"], model.log_mel_settings)
        assert torch.equal(batch["input_features"], expected)
        assert torch.equal(batch["labels"], plain.train_batch(position)["labels"])
    assert not torch.equal(warped.train_batch(0)["input_features"], plain.train_batch(0)["input_features"])


def test_audio_longer_than_the_window_is_refused_naming_the_file_and_its_length(tmp_path):
    manifest = write_corpus(tmp_path, count=3)
    write_tone(tmp_path / "clips" / "0-1.wav", 0.8, 440)  # the window is 0.5 s
    task, loaded = SpeechRecognition.from_recipe(DataConfig(train=str(manifest), eval=str(manifest)), seq_len=16)
    with pytest.raises(TrainingError) as caught:
        task.prepare(TrainingConfig(batch_size=2), ProcessContext(0, 1), tiny_model(loaded.vocab_size))
    message = str(caught.value)
    assert "\n" not in message
    assert f"train.tsv:3: {tmp_path / 'clips' / '0-1.wav'}: 0.80 s of audio is longer than the model's window of " \
           "0.50 s; a recording is never cut (the window is 2 x [model] max_source_positions=25" in message


def test_a_recording_with_a_nan_sample_is_refused_naming_its_manifest_line_and_file(tmp_path):
    import numpy as np

    manifest = write_corpus(tmp_path, count=3)
    samples = np.full(800, 0.1, dtype="<f4")
    samples[10] = np.nan
    fmt = struct.pack("<HHIIHH", 3, 1, 8000, 4 * 8000, 4, 32)
    data = b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", samples.nbytes) + samples.tobytes()
    (tmp_path / "clips" / "0-1.wav").write_bytes(b"RIFF" + struct.pack("<I", 4 + len(data)) + b"WAVE" + data)
    task, loaded = SpeechRecognition.from_recipe(DataConfig(train=str(manifest), eval=str(manifest)), seq_len=16)
    with pytest.raises(TrainingError) as caught:
        task.prepare(TrainingConfig(batch_size=2), ProcessContext(0, 1), tiny_model(loaded.vocab_size))
    assert str(caught.value) == (f"{manifest}:3: {tmp_path / 'clips' / '0-1.wav'}: 1 float sample(s) NaN, infinite "
                                 "or beyond +-1000 (the first, at 0.001 s: NaN); float WAV samples must be finite and "
                                 "within +-1000 (nominally [-1, 1])")


def test_a_transcript_longer_than_the_decoder_is_refused(tmp_path):
    manifest = write_corpus(tmp_path, count=3)
    with pytest.raises(TrainingError, match=r"train.tsv:2: the transcript is \d+ tokens with its end token, past "
                                            r"training.seq_len=5"):
        SpeechRecognition.from_recipe(DataConfig(train=str(manifest), eval_fraction=0.0), seq_len=5)


def test_a_ctc_head_trains_with_the_smoothed_decoder_loss(tmp_path):
    manifest = write_corpus(tmp_path, count=4)
    task, loaded = SpeechRecognition.from_recipe(DataConfig(train=str(manifest), eval_fraction=0.0), seq_len=16)
    model = tiny_model(loaded.vocab_size, ctc_weight=0.4).train()
    task.prepare(TrainingConfig(batch_size=4, label_smoothing=0.1, seq_len=16), ProcessContext(0, 1), model)
    batch = task.train_batch(0)
    with torch.no_grad():
        output = model(batch["input_features"], decoder_input_ids=batch["decoder_input_ids"])
        decoder = token_cross_entropy(output.logits, batch["labels"], 0.1)
        ctc = ctc_loss(output.ctc_logits, model.ctc_targets(batch["labels"]), model.config.pad_token_id)
        torch.testing.assert_close(task.loss(model, batch), 0.6 * decoder + 0.4 * ctc)


def test_a_ctc_head_needs_a_window_the_transcripts_fit(tmp_path):
    manifest = write_corpus(tmp_path, count=3)
    task, loaded = SpeechRecognition.from_recipe(DataConfig(train=str(manifest), eval_fraction=0.0), seq_len=16)
    model = tiny_model(loaded.vocab_size, ctc_weight=0.3, max_source_positions=4)
    with pytest.raises(TrainingError, match=r"a transcript needs \d+ encoder positions for CTC .* "
                                            "max_source_positions=4"):
        task.prepare(TrainingConfig(batch_size=2, seq_len=16), ProcessContext(0, 1), model)


def test_the_model_must_be_a_speech_model_whose_special_ids_agree(tmp_path):
    manifest = write_corpus(tmp_path, count=3)
    task, loaded = SpeechRecognition.from_recipe(DataConfig(train=str(manifest), eval=str(manifest)), seq_len=16)
    config = TrainingConfig(batch_size=2)
    with pytest.raises(TrainingError, match="trains a speech model .architecture 'speech'., not "
                                            "architecture='decoder'"):
        task.prepare(config, ProcessContext(0, 1), tformer.build_model("gpt-nano"))
    with pytest.raises(TrainingError, match="the tokenizer's eos token is id 2 but the model's eos_token_id is 5"):
        task.prepare(config, ProcessContext(0, 1), tiny_model(loaded.vocab_size, eos_token_id=5))
    with pytest.raises(TrainingError, match="the model starts decoding at id 3 but the tokenizer's start token is "
                                            "id 1"):
        task.prepare(config, ProcessContext(0, 1), tiny_model(loaded.vocab_size, decoder_start_token_id=3))


def test_wer_and_cer_during_evaluation_are_those_of_each_utterance_decoded_alone(tmp_path):
    """Random weights of a wide spread write varied text; the task's summed WER/CER (3 batches, the last short)
    equal ``transcription_scores`` of the transcripts ``generate`` writes for each recording on its own."""
    manifest = write_corpus(tmp_path, count=7)
    task, loaded = SpeechRecognition.from_recipe(DataConfig(train=str(manifest), eval=str(manifest)), seq_len=16)
    model = tiny_model(loaded.vocab_size, initializer_range=0.5).eval()
    task.prepare(TrainingConfig(batch_size=3, eval_batches=0, seq_len=16), ProcessContext(0, 1), model)
    totals: dict = {}
    with torch.no_grad():
        for batch in task.eval_batches():  # summed as the Trainer sums them (evaluate_metrics)
            for name, value in task.eval_sums(model, batch).items():
                totals[name] = totals.get(name, 0.0) + float(value)
    metrics = task.finalise(totals)
    hypotheses = []
    for row in range(len(task.evaluation)):
        features = task.eval_features.batch([row])  # (1, M, F)
        ids = tformer.generate(model, features, 15)[0, 1:].tolist()  # after the start token
        ids = ids[: ids.index(2)] if 2 in ids else ids
        hypotheses.append(task.tokenizer.decode(ids, skip_special_tokens=True))
    assert len(set(hypotheses)) > 1 and any(hypotheses)
    scores = transcription_scores(hypotheses, task.evaluation.transcripts, normalise=True)
    assert metrics["eval_wer"] == pytest.approx(100 * scores.wer, abs=1e-9)
    assert metrics["eval_cer"] == pytest.approx(100 * scores.cer, abs=1e-9)
    assert 0 < metrics["eval_cer"] and set(metrics) == {"eval_loss", "eval_wer", "eval_cer"}
    assert SpeechRecognition.format_metric("eval_wer", 12.3456) == "12.35"


def test_without_eval_wer_only_the_loss_is_reported(tmp_path):
    task, _ = make_task(tmp_path, eval_wer=False)
    assert task.metrics == ("eval_loss",)
    assert not SpeechRecognition.higher_is_better


# ---- the recipe's settings ------------------------------------------------------------------------------------


def test_the_tasks_settings_are_accepted_and_checked():
    config = TaskConfig(name="speech_recognition", time_masks=2, time_mask_frames=20, eval_beams=3)
    assert (config.time_masks, config.time_mask_frames, config.frequency_masks, config.eval_wer) == (2, 20, 0, True)
    with pytest.raises(TrainingError, match="task.batch_tokens is a setting of the translation task, not "
                                            "'speech_recognition'"):
        TaskConfig(name="speech_recognition", batch_tokens=100)
    with pytest.raises(TrainingError, match="task.time_masks is a setting of the speech_recognition task, not "
                                            "'translation'"):
        TaskConfig(name="translation", time_masks=2)
    with pytest.raises(TrainingError, match="task.time_masks=2 and task.time_mask_frames=0: SpecAugment needs both"):
        TaskConfig(name="speech_recognition", time_masks=2)
    with pytest.raises(TrainingError, match=r"task.frequency_mask_bins=-1 must be an integer >= 0"):
        TaskConfig(name="speech_recognition", frequency_mask_bins=-1)
    assert TaskConfig(name="speech_recognition", frequency_warp=0.1).frequency_warp == 0.1
    for bad in (-0.1, 0.5, True, "0.1"):
        with pytest.raises(TrainingError, match=r"task.frequency_warp=.* must be a number from 0 \(no warp\) to "
                                                r"below 0.5"):
            TaskConfig(name="speech_recognition", frequency_warp=bad)
    with pytest.raises(TrainingError, match="task.eval_beams=0 must be a positive integer"):
        TaskConfig(name="speech_recognition", eval_beams=0)


def test_the_data_settings_it_reads_and_refuses(tmp_path):
    manifest = write_corpus(tmp_path, count=3)
    check_data_options("speech_recognition", DataConfig(train=str(manifest), audio_column="file", text_column="s"))
    with pytest.raises(TrainingError, match=r"data.audio_column is not read by the translation task \(it is a "
                                            "setting of speech_recognition\\)"):
        check_data_options("translation", DataConfig(train=str(manifest), audio_column="file"))
    with pytest.raises(TrainingError, match="data.source_language is not read by the speech_recognition task"):
        check_data_options("speech_recognition", DataConfig(train=str(manifest), source_language="de"))
    renamed = tmp_path / "renamed.tsv"
    renamed.write_text(manifest.read_text().replace("audio\ttext", "file\tsentence"), encoding="utf-8")
    task, _ = SpeechRecognition.from_recipe(DataConfig(train=str(renamed), audio_column="file",
                                                       text_column="sentence", eval_fraction=0.34), seq_len=16)
    assert (len(task.train), len(task.evaluation)) == (2, 1)


def test_a_folder_of_pairs_is_read_and_a_column_setting_refused_for_it(tmp_path):
    for number, text in enumerate(["one two", "three zero"]):
        write_tone(tmp_path / f"c{number}.wav", 0.2, 300 + 100 * number)
        (tmp_path / f"c{number}.txt").write_text(text, encoding="utf-8")
    task, loaded = SpeechRecognition.from_recipe(DataConfig(train=str(tmp_path), eval=str(tmp_path)), seq_len=16)
    assert task.train.transcripts == ["one two", "three zero"]
    assert loaded.vocab_size == 4 + len(set("one two three zero"))
    with pytest.raises(Exception, match="data.audio_column names a column of a records file"):
        SpeechRecognition.from_recipe(DataConfig(train=str(tmp_path), audio_column="file"), seq_len=16)


# ---- the FSDD recipe ----------------------------------------------------------------------------------------


def fsdd_recipe(tmp_path):
    """configs/fsdd-digits.toml with its data replaced by a tiny corpus (the recipe's own is built on demand)."""
    import tomllib
    from pathlib import Path

    from tformer.training.recipe import recipe_from_dict

    raw = tomllib.loads((Path(__file__).resolve().parents[2] / "configs" / "fsdd-digits.toml").read_text())
    manifest = write_corpus(tmp_path)
    raw["data"] = {**raw["data"], "train": str(manifest), "eval": str(manifest)}
    return raw, recipe_from_dict(raw, base_dir=tmp_path)


def test_the_fsdd_recipe_reads_and_its_task_settings_are_checked(tmp_path):
    from tformer.training.recipe import RecipeError, recipe_from_dict

    raw, recipe = fsdd_recipe(tmp_path)
    assert recipe.task.name == "speech_recognition" and recipe.task.time_masks == 2
    assert recipe.model.architecture == "speech" and recipe.model.input_frames == 750
    with pytest.raises(RecipeError, match=r"\[task\] bpe_vocab_size is a setting of the translation task, not "
                                          "'speech_recognition'"):
        recipe_from_dict({**raw, "task": {**raw["task"], "bpe_vocab_size": 300}}, base_dir=tmp_path)
    with pytest.raises(RecipeError, match=r"\[task\] unknown key 'time_mask' \(did you mean 'time_masks'\?\)"):
        recipe_from_dict({**raw, "task": {**raw["task"], "time_mask": 3}}, base_dir=tmp_path)


def test_the_fsdd_recipes_window_holds_every_utterance_the_builder_writes():
    """With its default seed, in the official split and with each speaker held out (headers read, nothing
    written): the longest utterance, 6.98 s, fits the recipe's 7.5 s window."""
    import tomllib
    import wave
    from pathlib import Path

    import numpy as np
    from shared_data import SHARED_DATA, require

    from tformer.data.fsdd import SPLITS, DigitSettings, list_recordings, plan_utterances, split_recordings

    folder = SHARED_DATA / "fsdd" / "recordings"
    require(folder)
    recordings = list_recordings(folder)
    frames = {}
    for recording in recordings:
        with wave.open(str(recording.path)) as handle:
            frames[recording.path], rate = handle.getnframes(), handle.getframerate()
    longest = 0
    for held_out in (None, *sorted({recording.speaker for recording in recordings})):
        settings = DigitSettings(held_out_speaker=held_out)
        pools = split_recordings(recordings, held_out)
        streams = np.random.SeedSequence(settings.seed).spawn(len(SPLITS))  # as build_digit_corpus draws them
        for pool, stream, count in zip(pools, streams, (settings.train_utterances, settings.test_utterances),
                                       strict=True):
            for utterance in plan_utterances(pool, count, settings, rate, np.random.default_rng(stream)):
                length = sum(frames[recording.path] for recording in utterance.recordings) + sum(utterance.silences)
                longest = max(longest, length / rate)
    model = tomllib.loads((Path(__file__).resolve().parents[2] / "configs" / "fsdd-digits.toml").read_text())["model"]
    window = 2 * model["max_source_positions"] / 100  # seconds: frames of 10 ms
    assert longest == pytest.approx(6.984, abs=1e-3) and longest < window == 7.5
