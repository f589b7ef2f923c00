"""A speech model served: the engine transcribes a recording window after window, each window a request batched with
the others', and answers what ``tformer transcribe`` writes (greedy and beam search); ``/v1/audio/transcriptions``
takes a WAV upload through the real ``openai`` client under 16 concurrent clients, answers json, text and
verbose_json, and refuses what it cannot honour, or audio that is not audio, with a 400 naming it."""

import concurrent.futures
import io
import json

import numpy as np
import pytest
import torch
from speech_corpus import WORDS, tiny_model, write_tone

import tformer
from tformer.cli import main
from tformer.data.audio import load_audio
from tformer.data.log_mel import recording_features
from tformer.generation import GenerationConfig, GenerationError
from tformer.generation.transcription import transcribe_ids, transcript_budget
from tformer.serving import Engine
from tformer.tokenizers import CharTokenizer
from tformer.training.tasks.speech_recognition import SPEECH_SPECIAL_TOKENS

SECONDS = [0.3, 1.2, 0.7, 0.2, 0.9, 0.45, 1.6, 0.35]  # windows of 0.5 s: 1 to 4 a recording


def speech_model():
    """The tiny speech model of wide random weights (it writes varied text) with its character tokenizer."""
    tokenizer = CharTokenizer.train([" ".join(WORDS)], special_tokens=SPEECH_SPECIAL_TOKENS)
    model = tiny_model(tokenizer.vocab_size, initializer_range=0.5).eval()
    model.tokenizer = tokenizer
    return model


def recordings(seed=0):
    """Chirps and noise at 16 kHz, one a length of ``SECONDS``: each window hears something else."""
    generator = np.random.default_rng(seed)
    made = []
    for index, seconds in enumerate(SECONDS):
        time = np.arange(round(16000 * seconds)) / 16000
        chirp = np.sin(2 * np.pi * (150 + 120 * index) * time * (1 + 2 * time))
        made.append((0.3 * chirp + 0.05 * generator.standard_normal(len(time))).astype(np.float32))
    return made


def as_transcribe_decodes(model, samples, **options):
    """What ``tformer transcribe`` decodes: the recording's features, window after window."""
    features = recording_features(torch.from_numpy(samples), model.log_mel_settings)[None]
    budget = transcript_budget(model, tuple(options.get("decoder_prompt_ids", ())))
    return transcribe_ids(model, features, budget, **options)[0]


@pytest.mark.parametrize("beams", [1, 3])
def test_concurrent_recordings_transcribe_as_each_alone(beams):
    model = speech_model()
    engine = Engine(model, model.tokenizer, cache_tokens=1024, block_size=4, max_running=8)
    config = GenerationConfig(num_beams=beams)
    waves = recordings()
    submitted = [engine.transcribe(torch.from_numpy(samples), config) for samples in waves[:5]]
    for _ in range(3):  # later recordings join windows already decoding
        engine.step()
    submitted += [engine.transcribe(torch.from_numpy(samples), config) for samples in waves[5:]]
    engine.run_until_idle()
    assert [len(requests) for requests in submitted] == [1, 3, 2, 1, 2, 1, 4, 1]
    served = [[token for request in requests for token in request.outputs()[0] if token not in request.end_ids]
              for requests in submitted]
    expected = [as_transcribe_decodes(model, samples, num_beams=beams) for samples in waves]
    assert served == expected
    assert len({tuple(ids) for ids in expected}) >= 6  # the recordings are mostly heard apart
    assert engine.pool.blocks_in_use == 0 and sorted(engine.scheduler.free_states) == list(range(8))


def started(engine, requests) -> bool:
    """Whether every one of ``requests`` (a recording's windows) runs: admitted, prefilled or decoding."""
    running = {request.id for request, _ in engine.scheduler.running}
    return all(request.id in running for request in requests)


def test_gathered_windows_wait_a_few_steps_for_each_other_and_transcribe_as_each_alone():
    # gather_sources=3: while windows decode, new ones wait until three wait or three steps have passed, then start
    # in one step (their features encoded as one batch); every transcript stays what tformer transcribe writes.
    model = speech_model()
    engine = Engine(model, model.tokenizer, cache_tokens=1024, block_size=4, max_running=8, gather_sources=3)
    waves = recordings()
    submitted = [engine.transcribe(torch.from_numpy(waves[1]))]  # three windows; nothing runs: they start at once
    engine.step()
    assert started(engine, submitted[0])
    submitted.append(engine.transcribe(torch.from_numpy(waves[0])))  # one window, alone behind them
    waited = 0
    while not started(engine, submitted[-1]):
        engine.step()
        waited += 1
    assert waited == 4  # held three steps (the others still decoding), started by the fourth
    submitted += [engine.transcribe(torch.from_numpy(waves[index])) for index in (3, 5)]
    engine.step()
    assert not started(engine, submitted[-1]) and not started(engine, submitted[-2])  # two of three: held
    submitted.append(engine.transcribe(torch.from_numpy(waves[7])))
    engine.step()
    assert all(started(engine, requests) for requests in submitted[-3:])  # the third joined: all three start
    engine.run_until_idle()
    served = [[token for request in requests for token in request.outputs()[0] if token not in request.end_ids]
              for requests in submitted]
    assert served == [as_transcribe_decodes(model, waves[index]) for index in (1, 0, 3, 5, 7)]
    with pytest.raises(GenerationError, match="gather_sources=0 must be an integer >= 1"):
        Engine(model, model.tokenizer, cache_tokens=256, gather_sources=0)


def test_what_a_speech_engine_cannot_do_is_refused_by_name():
    model = speech_model()
    engine = Engine(model, model.tokenizer, cache_tokens=256)
    with pytest.raises(GenerationError, match=r"architecture='speech' reads log-mel features"):
        engine.submit([3, 4, 5])
    with pytest.raises(GenerationError, match=r"recording must be samples \(N >= 1,\)"):
        engine.transcribe(torch.zeros(0))
    with pytest.raises(GenerationError, match="tokenizer has no language tokens .* give no language"):
        engine.transcribe(torch.zeros(800), language="en")
    with pytest.raises(GenerationError, match="input_features"):  # a window longer than the model's
        engine.submit(torch.zeros(model.config.num_mel_bins, model.config.input_frames + 2))
    with pytest.raises(GenerationError, match="features must be floating point, not torch.int64"):
        engine.submit(torch.zeros(model.config.num_mel_bins, 10, dtype=torch.long))
    assert not engine.has_work()
    translator = tformer.build_model("transformer-multi30k", vocab_size=40, d_model=32, num_heads=4, num_layers=1,
                                     d_ff=64, max_seq_len=32).eval()
    text_engine = Engine(translator, cache_tokens=256)
    with pytest.raises(GenerationError, match=r"architecture='encoder_decoder' transcribes no audio"):
        text_engine.transcribe(torch.zeros(800))
    with pytest.raises(GenerationError, match=r"architecture='encoder_decoder' reads token ids as its source"):
        text_engine.submit(torch.zeros(4, 10))


def test_a_whisper_tokenizer_prompts_each_window_as_tformer_transcribe_does():
    """An English-only Whisper tokenizer (<|startoftranscript|>, <|notimestamps|>): every window's decoder starts
    from that prompt, as ``tformer transcribe`` starts it, and a language is refused."""
    from tformer.generation.transcription import transcription_prompt

    specials = ["<|endoftext|>", "<unk>", "<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
    tokenizer = CharTokenizer.train([" ".join(WORDS)], special_tokens=specials)
    model = tiny_model(tokenizer.vocab_size, initializer_range=0.5, eos_token_id=0, pad_token_id=0, bos_token_id=0,
                       decoder_start_token_id=2).eval()
    model.tokenizer = tokenizer
    prompt = transcription_prompt(tokenizer, model.config.vocab_size, None)
    assert prompt == (tokenizer.token_to_id("<|startoftranscript|>"), tokenizer.token_to_id("<|notimestamps|>"))
    engine = Engine(model, tokenizer, cache_tokens=512, block_size=4)
    waves = recordings()[:3]
    submitted = [engine.transcribe(torch.from_numpy(samples)) for samples in waves]
    engine.run_until_idle()
    assert all(request.prompt_ids == list(prompt) for requests in submitted for request in requests)
    served = [[token for request in requests for token in request.outputs()[0] if token not in request.end_ids]
              for requests in submitted]
    assert served == [as_transcribe_decodes(model, samples, decoder_prompt_ids=prompt) for samples in waves]
    with pytest.raises(GenerationError, match="an English-only Whisper model takes no language"):
        engine.transcribe(torch.from_numpy(waves[0]), language="en")


def test_a_hugging_face_whisper_folder_is_served_as_it_transcribes(tmp_path):
    """The speech model saved as a Hugging Face Whisper folder, with a generation_config.json holding Whisper's own
    fields (languages, tasks, the no-timestamps token, max_length): the engine starts on it (no default refused) and
    each recording's windows decode as the tformer folder's transcript."""
    model = speech_model()
    model.save(tmp_path / "whisper", format="hf")
    (tmp_path / "whisper" / "generation_config.json").write_text(json.dumps({
        "decoder_start_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "max_length": 16,
        "begin_suppress_tokens": [2], "suppress_tokens": [], "no_timestamps_token_id": 3, "is_multilingual": False,
        "lang_to_id": {}, "task_to_id": {"transcribe": 4}}))
    served = tformer.load(tmp_path / "whisper").eval()
    engine = Engine(served, served.tokenizer, cache_tokens=1024, block_size=4)
    waves = recordings()[:4]
    submitted = [engine.transcribe(torch.from_numpy(samples)) for samples in waves]
    engine.run_until_idle()
    got = [[token for request in requests for token in request.outputs()[0] if token not in request.end_ids]
           for requests in submitted]
    assert got == [as_transcribe_decodes(served, samples) for samples in waves]
    assert got == [as_transcribe_decodes(model, samples) for samples in waves]


# ---- over HTTP ----------------------------------------------------------------------------------------------------

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def speech_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-speech")
    speech_model().save(folder / "model")
    paths = [write_tone(folder / f"{index}.wav", 0.1, 100) for index in range(len(SECONDS))]
    for path, samples in zip(paths, recordings(), strict=True):  # 16-bit PCM of each recording
        with open(path, "wb") as handle:
            handle.write(wav_bytes(samples))
    return folder / "model", paths


def wav_bytes(samples: np.ndarray, rate: int = 16000) -> bytes:
    import wave

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


@pytest.fixture(scope="module")
def server(speech_folder):
    from test_serving_server import ServerThread

    served = ServerThread(speech_folder[0], "process", chat=False, cache_tokens=1024, block_size=4, max_running=16)
    yield served
    served.stop()


def transcribe_cli(folder, paths, capsys, *options):
    assert main(["transcribe", str(folder), *map(str, paths), "--json", *options]) == 0
    return [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]


@pytest.mark.slow  # the openai client against a server
@pytest.mark.parametrize("beams", [1, 3])
def test_sixteen_concurrent_clients_get_what_tformer_transcribe_writes(server, speech_folder, capsys, beams):
    folder, paths = speech_folder
    expected = transcribe_cli(folder, paths, capsys, "--beam", str(beams))
    assert len(set(expected)) >= 6 and all(expected)  # the recordings are mostly heard apart

    def ask(path):
        with open(path, "rb") as audio:
            return server.client().audio.transcriptions.create(model="tiny", file=audio,
                                                               extra_body={"num_beams": beams}).text

    with concurrent.futures.ThreadPoolExecutor(16) as pool:  # each recording twice
        assert list(pool.map(ask, paths + paths)) == expected + expected
    server.wait_idle()


@pytest.mark.slow
def test_text_and_verbose_json_answers(server, speech_folder, capsys):
    folder, paths = speech_folder
    path = paths[6]  # 1.6 s: four windows of 0.5 s
    (expected,) = transcribe_cli(folder, [path], capsys)
    client = server.client()
    with open(path, "rb") as audio:
        assert client.audio.transcriptions.create(model="tiny", file=audio, response_format="text") == expected
    with open(path, "rb") as audio:
        verbose = client.audio.transcriptions.create(model="tiny", file=audio, response_format="verbose_json",
                                                     timestamp_granularities=["segment"])
    assert verbose.text == expected and verbose.duration == pytest.approx(1.6)
    segments = verbose.segments
    assert [(segment.id, segment.start, segment.end) for segment in segments] == [
        (0, 0.0, 0.5), (1, 0.5, 1.0), (2, 1.0, 1.5), (3, 1.5, 1.6)]
    model = tformer.load(folder)
    windows = [model.tokenizer.decode(segment.tokens, skip_special_tokens=True) for segment in segments]
    assert " ".join("".join(windows).split()) == expected and all(segment.text for segment in segments)
    assert all(segment.avg_logprob < 0 and segment.compression_ratio > 0 for segment in segments)
    assert verbose.usage.seconds == 2


@pytest.mark.slow
def test_bad_requests_get_a_400_naming_the_field_and_the_server_keeps_serving(server, speech_folder):
    _, paths = speech_folder
    client = server.client()
    recording = ("0.wav", paths[0].read_bytes())
    cases = [
        (dict(file=("notes.wav", b"hello, not audio")), "notes.wav: not a RIFF/WAVE file", "file"),
        (dict(file=("empty.wav", wav_bytes(np.zeros(0, np.float32)))), "no samples", "file"),
        (dict(file=recording, response_format="srt"), "subtitles need timestamps", "response_format"),
        (dict(file=recording, timestamp_granularities=["word"]), "'word' is not supported",
         "timestamp_granularities"),
        (dict(file=recording, prompt="earlier words"), "prompt is not supported", "prompt"),
        (dict(file=recording, language="en"), "no language tokens", None),
        (dict(file=recording, extra_body={"colour": "red"}), "unknown field 'colour'", "colour"),
    ]
    for options, message, param in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            client.audio.transcriptions.create(model="tiny", **options)
        assert message in refused.value.body["message"] and refused.value.body["param"] == param, options
    with pytest.raises(openai.UnprocessableEntityError, match="temperature: Input should be less than or equal to 2"):
        client.audio.transcriptions.create(model="tiny", file=recording, temperature=5)
    with pytest.raises(openai.BadRequestError, match="is a speech model: it transcribes recordings"):
        client.completions.create(model="tiny", prompt="one two", max_tokens=3)
    assert client.audio.transcriptions.create(model="tiny", file=recording).text  # still serving
    server.wait_idle()


@pytest.mark.slow
def test_a_text_model_refuses_transcriptions(tmp_path):
    from test_serving_server import ServerThread

    tokenizer = CharTokenizer.train("abc de", special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size)
    model.tokenizer = tokenizer
    model.save(tmp_path / "gpt")
    served = ServerThread(tmp_path / "gpt", "thread", chat=False, cache_tokens=256)
    try:
        with pytest.raises(openai.BadRequestError, match="reads text, not audio"):
            served.client().audio.transcriptions.create(model="tiny", file=("a.wav", wav_bytes(np.zeros(800))))
    finally:
        served.stop()


def test_a_recording_at_another_rate_is_resampled_as_transcribe_reads_it(tmp_path):
    """The route reads an upload as ``tformer transcribe`` reads a file: the same samples at the model's rate."""
    from tformer.serving.engine_client import AudioFacts
    from tformer.serving.routes.transcriptions import _samples

    path = write_tone(tmp_path / "tone.wav", 0.4, 440, rate=8000)
    read = _samples(path.read_bytes(), "tone.wav", AudioFacts(sample_rate=16000, window_samples=8000))
    assert read.dtype == np.float32 and np.array_equal(read, load_audio(path, 16000))
