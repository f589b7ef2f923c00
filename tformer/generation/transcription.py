"""Audio longer than a speech model's window, in consecutive windows: each window is decoded on its own (from
the same decoder prompt, with the same options) and each row's transcripts are joined in order."""

from __future__ import annotations

from torch import Tensor, nn
from torch.nn import functional as F

from tformer.generation.checks import check_model
from tformer.generation.defaults import with_model_defaults
from tformer.generation.generate import generate
from tformer.generation.settings import GenerationConfig, GenerationError


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
