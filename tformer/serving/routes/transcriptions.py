"""POST /v1/audio/transcriptions: a WAV file uploaded as multipart form data, transcribed by the served speech
model as ``tformer transcribe`` transcribes it (window after window of the model's input, each a request of the
engine's, batched with the other clients'), answered as ``json``, ``text`` or ``verbose_json`` (whose segments are
those windows: tformer decodes no timestamps)."""

from __future__ import annotations

import math
import zlib
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response

from tformer.data.audio import AudioError, resample, wav_from_bytes
from tformer.generation.settings import GenerationConfig
from tformer.serving.engine_client import AudioFacts
from tformer.serving.openai_api import APIError, validate_request
from tformer.serving.served import ServedModel
from tformer.serving.submission import Submission

LIST_SUFFIX = "[]"  # a form field sent once per item (OpenAI's client: timestamp_granularities[])


class TranscriptionRequest(BaseModel):
    """The form's fields as OpenAI defines them (``file`` aside), values read from text (form fields are strings);
    ``num_beams`` and ``seed`` as tformer's extensions (``tformer transcribe --beam``)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    language: str | None = None
    prompt: str | None = None
    response_format: Literal["json", "text", "verbose_json", "srt", "vtt"] = "json"
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    timestamp_granularities: list[Literal["segment", "word"]] = Field(default_factory=list)
    stream: bool = False
    num_beams: int = Field(1, ge=1)
    seed: int | None = None

    def unsupported(self) -> None:
        """A 400 naming a field whose value tformer cannot honour."""
        if self.prompt:
            raise APIError(400, "prompt is not supported: tformer decodes each window from the model's own prompt, "
                                "without a previous text", "prompt")
        if self.response_format in ("srt", "vtt"):
            raise APIError(400, f"response_format={self.response_format!r} is not supported: subtitles need "
                                "timestamps, which tformer does not decode (json, text or verbose_json)",
                           "response_format")
        if "word" in self.timestamp_granularities:
            raise APIError(400, "timestamp_granularities 'word' is not supported: tformer decodes no timestamps "
                                "(verbose_json's segments are the model's windows)", "timestamp_granularities")
        if self.stream:
            raise APIError(400, "stream=true is not supported for transcriptions: the answer comes whole", "stream")
        if self.num_beams > 1 and self.temperature > 0:
            raise APIError(400, "num_beams > 1 searches the most likely transcript: give temperature 0", "num_beams")

    def generation_config(self) -> GenerationConfig:
        sampled = self.temperature > 0
        return GenerationConfig(do_sample=sampled, temperature=self.temperature if sampled else 1.0,
                                num_beams=self.num_beams, seed=self.seed)


async def transcriptions(served: ServedModel, http_request: HTTPRequest) -> Response:
    audio_facts = served.engine.facts.audio
    form = await _form(served, http_request)
    try:  # the upload's spooled file goes with the form
        body: TranscriptionRequest = validate_request(_fields(form), TranscriptionRequest)
        upload = form.get("file")
        data = await upload.read() if isinstance(upload, UploadFile) else None
    finally:
        await form.close()
    if served.check_model(body.model) is not None:
        raise APIError(400, f"model {body.model!r} is a LoRA adapter; transcriptions are the base model's: model "
                            f"{served.model_name!r}", "model")
    if audio_facts is None:
        raise APIError(400, f"model {served.model_name!r} reads text, not audio: transcriptions need a speech model "
                            "(POST /v1/completions for this one)", "model", "not_a_speech_model")
    if data is None:
        raise APIError(400, "file is required: the recording, uploaded as a file part (multipart/form-data)", "file")
    served.check_admitting()
    samples = _samples(data, upload.filename or "file", audio_facts)
    submission = Submission(served.flight, http_request)
    scored = body.response_format == "verbose_json" and body.num_beams == 1  # each segment's avg_logprob
    await submission.transcribe(samples, body.generation_config(), body.language, 0 if scored else None)
    try:
        windows = await _windows(served, submission)
    finally:
        submission.close()
    return _response(served, body, windows, len(samples) / audio_facts.sample_rate, audio_facts)


async def _form(served: ServedModel, http_request: HTTPRequest) -> FormData:
    """The body (within the server's size limit) parsed as multipart form data; a 400 for anything else."""
    kind = http_request.headers.get("content-type", "")
    if not kind.startswith("multipart/form-data"):
        raise APIError(400, f"the body must be multipart/form-data (a file part and form fields), not "
                            f"{kind.split(';')[0] or 'untyped'}")
    raw = await served.read_body(http_request)

    async def body():
        yield raw

    try:
        return await MultiPartParser(http_request.headers, body(), max_files=1, max_fields=32).parse()
    except MultiPartException as error:
        raise APIError(400, f"the multipart body cannot be read: {error.message}") from None


def _fields(form: FormData) -> dict[str, Any]:
    """The form's text fields by name (``name[]`` repeated: a list under ``name``); a field given twice, or a file
    where text belongs, is a 400."""
    fields: dict[str, Any] = {}
    for name, value in form.multi_items():
        if name == "file":
            continue
        if not isinstance(value, str):
            raise APIError(400, f"{name} must be a text field, not a file", name)
        if name.endswith(LIST_SUFFIX):
            fields.setdefault(name.removesuffix(LIST_SUFFIX), []).append(value)
        elif name in fields:
            raise APIError(400, f"{name} is given twice", name)
        else:
            fields[name] = value
    return fields


def _samples(data: bytes, name: str, audio: AudioFacts) -> np.ndarray:
    """The upload's mono samples at the model's rate; a 400 naming what is wrong with a file that is not WAV audio
    tformer reads."""
    try:
        recording = wav_from_bytes(data, name)
        return resample(recording.samples, recording.sample_rate, audio.sample_rate)
    except AudioError as error:
        raise APIError(400, str(error), "file", "invalid_audio") from None


class _Window:
    """One window's transcript as its events arrive: its token ids (end tokens left out) and log-probabilities."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []


async def _windows(served: ServedModel, submission: Submission) -> list[_Window]:
    """Each window's tokens, in order, once every window has ended."""
    ends = set(served.engine.facts.end_token_ids)
    windows = [_Window() for _ in submission.request_ids]
    async for index, event in submission.events():
        if event.token_id >= 0 and event.token_id not in ends:
            windows[index].token_ids.append(event.token_id)
            if event.logprob is not None:
                windows[index].logprobs.append(event.logprob)
    submission.check_answered()
    return windows


def _text(served: ServedModel, token_ids: list[int]) -> str:
    """A transcript's text as ``tformer transcribe`` prints it: special tokens left out, one line."""
    return " ".join(served.tokenizer.decode(token_ids, skip_special_tokens=True).split())


def _response(served: ServedModel, body: TranscriptionRequest, windows: list[_Window], seconds: float,
              audio: AudioFacts) -> Response:
    text = _text(served, [token for window in windows for token in window.token_ids])
    if body.response_format == "text":
        return PlainTextResponse(text)
    usage = {"type": "duration", "seconds": math.ceil(seconds)}
    if body.response_format == "json":
        return JSONResponse({"text": text, "usage": usage})
    window_seconds = audio.window_samples / audio.sample_rate
    segments = []
    for index, window in enumerate(windows):
        piece = _text(served, window.token_ids)
        segments.append({
            "id": index, "seek": round(index * window_seconds * 100),  # Whisper's seek: in 10 ms frames
            "start": round(index * window_seconds, 3), "end": round(min((index + 1) * window_seconds, seconds), 3),
            "text": piece, "tokens": window.token_ids, "temperature": body.temperature,
            "avg_logprob": sum(window.logprobs) / len(window.logprobs) if window.logprobs else None,
            "compression_ratio": _compression_ratio(piece), "no_speech_prob": None,  # tformer detects no silence
        })
    return JSONResponse({"task": "transcribe", "language": body.language, "duration": round(seconds, 3),
                         "text": text, "segments": segments, "usage": usage})


def _compression_ratio(text: str) -> float:
    """The text's bytes over their zlib-compressed bytes (Whisper's sign of a window repeating itself)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0
