"""What the commands give a loaded model, read the way its folder says: images at its image processor's size and
channels, recordings at 16 kHz, and a speech model's decoder prompt (Whisper's language and task tokens). Shared
by the commands that take such inputs (classify and attention --image; transcribe and attention --audio), so that
no command imports another."""

from __future__ import annotations

from pathlib import Path

from tformer.cli import UsageError


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
    model's start token); a one-line UsageError naming ``--language`` when the model cannot take it or needs it."""
    from tformer.generation.settings import GenerationError
    from tformer.generation.transcription import transcription_prompt

    try:
        return transcription_prompt(model.tokenizer, model.config.vocab_size, language)
    except GenerationError as error:
        raise UsageError(f"--language{'' if language is None else ' ' + language}: {error}") from None
