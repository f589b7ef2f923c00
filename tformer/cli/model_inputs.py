"""What the commands give a loaded model, read the way its folder says: images at its image processor's size and
channels, recordings at 16 kHz, and a speech model's decoder prompt (Whisper's language and task tokens). Shared
by the commands that take such inputs (classify and attention --image; transcribe and attention --audio), so that
no command imports another."""

from __future__ import annotations

from pathlib import Path

from tformer.cli import UsageError

WHISPER_START = "<|startoftranscript|>"
MULTILINGUAL_VOCAB = 51865  # Whisper's multilingual vocabulary; the English-only models have 51,864 tokens


def read_model_images(paths: list[str], processor):
    """uint8 (N, C, H, W): every image decoded (all before any is used: a bad one stops the command
    first), converted to the processor's channels and resized to its size with a warning."""
    import warnings

    import torch

    from tformer.data.images import image_tensor, open_image

    for path in paths:
        if Path(path).is_dir():
            raise UsageError(f"{path}: is a folder; give image files (PNG or JPEG), e.g. {Path(path) / '*.png'}")
        if not Path(path).is_file():
            raise UsageError(f"{path}: no such file")
    size = processor.image_size
    pixels = []
    for path in paths:
        image = open_image(path)
        if (image.height, image.width) != (size, size):
            warnings.warn(f"{path}: {image.height} x {image.width} resized to the model's {size} x {size}",
                          stacklevel=2)
        pixels.append(image_tensor(image, processor.num_channels, (size, size)))
    return torch.stack(pixels)


def read_recordings(paths: list[str], sample_rate: int) -> list:
    """Every file's mono samples (N,) at ``sample_rate``, all read before any is used; a bad file is a one-line
    UsageError naming it."""
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


def decoder_prompt(model, language: str | None) -> tuple[int, ...]:
    """The decoder's first tokens: Whisper's prompt for a Whisper tokenizer (with ``language``), else none (the
    model's start token)."""
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
