"""Audio longer than a speech model's window, in consecutive windows: each window is decoded on its own (from
the same decoder prompt, with the same options) and each row's transcripts are joined in order."""

from __future__ import annotations

from torch import Tensor, nn
from torch.nn import functional as F

from tformer.generation.checks import check_model
from tformer.generation.defaults import with_model_defaults
from tformer.generation.generate import generate
from tformer.generation.settings import GenerationConfig, GenerationError
from tformer.models.speech import whisper_prompt

WHISPER_START = "<|startoftranscript|>"
MULTILINGUAL_VOCAB = 51865  # Whisper's multilingual vocabulary; the English-only models have 51,864 tokens


def audio_windows(features: Tensor, window: int, pad_value: float | None = None) -> list[Tensor]:
    """Features (B, M, F) cut into consecutive windows of ``window`` frames (B, M, <= window), in order; the
    last one shorter, or padded to ``window`` frames with ``pad_value`` when given (Whisper's checkpoints read
    whole windows: pad with the log-mel of silence)."""
    if features.dim() != 3 or features.shape[-1] == 0:
        raise GenerationError(f"input_features must be (batch, mels, frames >= 1), got {tuple(features.shape)}")
    pieces = list(features.split(window, dim=-1))
    if pad_value is not None and pieces[-1].shape[-1] < window:
        pieces[-1] = F.pad(pieces[-1], (0, window - pieces[-1].shape[-1]), value=pad_value)
    return pieces


def transcribe_ids(model: nn.Module, features: Tensor, max_new_tokens: int = 100, *, pad_value: float | None = None,
                   **options) -> list[list[int]]:
    """The new tokens of each row of ``features`` (B, M, F), any number of frames: ``generate`` on every
    window of the model's ``config.input_frames`` (``audio_windows``) with ``options`` (``decoder_prompt_ids``,
    ``num_beams``, ...), each window's tokens up to its end token (not included), joined window after window.
    Nothing is carried from one window to the next (no previous-text prompt, no timestamps)."""
    check_model(model)
    if model.config.architecture != "speech":
        raise GenerationError(f"transcribe_ids needs a speech model, not architecture={model.config.architecture!r}")
    window = model.config.input_frames
    config = with_model_defaults(model, GenerationConfig(max_new_tokens=max_new_tokens).replace(**options))
    ends = set(config.end_ids(model.config))
    prompt_length = max(len(config.decoder_prompt_ids), 1)
    rows: list[list[int]] = [[] for _ in range(features.shape[0])]
    for piece in audio_windows(features, window, pad_value):
        output = generate(model, piece, generation_config=config)
        for row, tokens in zip(rows, output[:, prompt_length:].tolist(), strict=True):
            end = next((index for index, token in enumerate(tokens) if token in ends), len(tokens))
            row.extend(tokens[:end])
    return rows


def transcription_prompt(tokenizer, vocab_size: int, language: str | None) -> tuple[int, ...]:
    """A speech model's decoder prompt for a transcript: Whisper's (<|startoftranscript|>, the ``language`` a
    multilingual model, of ``vocab_size`` tokens, needs, <|transcribe|>, <|notimestamps|>) for a Whisper
    ``tokenizer``, else none (the model's start token). A GenerationError names a language the model cannot take or
    needs."""
    if tokenizer is None or tokenizer.token_to_id(WHISPER_START) is None:
        if language is not None:
            raise GenerationError("this model's tokenizer has no language tokens (it is not a Whisper model); give no "
                                  "language")
        return ()
    multilingual = vocab_size >= MULTILINGUAL_VOCAB
    if multilingual and language is None:
        raise GenerationError("a multilingual Whisper model needs a language (en, de, fr, ...): tformer does no "
                              "language detection")
    if not multilingual and language is not None:
        raise GenerationError("an English-only Whisper model takes no language")
    try:
        if multilingual:
            return whisper_prompt(tokenizer, language, "transcribe")
        return whisper_prompt(tokenizer, None, None)
    except ValueError as error:
        raise GenerationError(str(error)) from None


def transcript_budget(model: nn.Module, prompt: tuple[int, ...]) -> int:
    """The new tokens a window's transcript may have: what the decoder's positions hold after ``prompt``."""
    limit = model.position_limit or model.config.max_seq_len
    return max(1, limit - max(len(prompt), 1))
