"""ImageProcessing: how a vision model wants its pixels (size, channels, rescale, mean and std), applied
to batches of uint8 images and kept beside the model as Hugging Face's ``preprocessor_config.json``.

A vision model carries one as ``model.image_processor``, as a text model carries ``model.tokenizer``:
checkpoint folders write it when it is set and ``tformer.load`` reads it back.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tformer.errors import TformerError
from tformer.files import write_text_atomically

PREPROCESSOR_NAME = "preprocessor_config.json"
PROCESSOR_TYPE = "ViTImageProcessor"
BILINEAR = 2  # PIL's resample code, what Hugging Face's ViTImageProcessor resizes with


class ImageProcessingError(TformerError):
    """Image-processing settings (given, or read from a preprocessor_config.json) that cannot be used."""


@dataclass(frozen=True)
class ImageProcessing:
    """Pixels in, model inputs out: ``(images * rescale - mean) / std`` per channel.

    ``image_size``: the side of the square images the model reads; ``num_channels``: 1 (grey) or 3
    (RGB) usually; ``mean`` and ``std``: one value per channel, on the rescaled pixels (0..1 with
    the default ``rescale`` of 1/255).
    """

    image_size: int
    num_channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    rescale: float = 1 / 255

    def __post_init__(self) -> None:
        for name in ("image_size", "num_channels"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ImageProcessingError(f"{name}={value!r} must be a positive integer")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if not isinstance(values, Sequence) or isinstance(values, str) or not all(
                    _is_finite_number(value) for value in values):
                raise ImageProcessingError(f"{name}={values!r} must be a list of finite numbers, one per channel")
            if len(values) != self.num_channels:
                raise ImageProcessingError(f"{name}={list(values)!r} has {len(values)} values; "
                                           f"num_channels={self.num_channels} needs one per channel")
            object.__setattr__(self, name, tuple(float(value) for value in values))
        if not all(value > 0 for value in self.std):
            raise ImageProcessingError(f"std={list(self.std)!r} must be > 0 in every channel (it divides)")
        if not (_is_finite_number(self.rescale) and self.rescale > 0):
            raise ImageProcessingError(f"rescale={self.rescale!r} must be a finite number > 0 (1/255 for 8-bit "
                                       "pixels)")
        object.__setattr__(self, "rescale", float(self.rescale))

    def __call__(self, images: Tensor) -> Tensor:
        """uint8 images (N, C, H, W), C = ``num_channels``, H = W = ``image_size`` -> float32 (N, C, H, W)."""
        if not isinstance(images, Tensor) or images.dtype != torch.uint8:
            kind = images.dtype if isinstance(images, Tensor) else type(images).__name__
            raise ValueError(f"images must be a uint8 tensor of pixel values 0..255, got {kind}")
        if images.dim() != 4:
            raise ValueError(f"images must be (N, C, H, W), got shape {tuple(images.shape)}")
        _, channels, height, width = images.shape
        if channels != self.num_channels:
            raise ValueError(f"images have {channels} channels, the model reads {self.num_channels}")
        if (height, width) != (self.image_size, self.image_size):
            raise ValueError(f"images are {height} x {width}, the model reads {self.image_size} x "
                             f"{self.image_size}: resize them first")
        mean = torch.tensor(self.mean, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
        return (images.to(torch.float32) * self.rescale - mean) / std

    # ---- preprocessor_config.json -----------------------------------------------------------

    def to_hf(self) -> dict[str, Any]:
        """The fields of Hugging Face's ViTImageProcessor ``preprocessor_config.json``."""
        return {
            "do_normalize": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": list(self.mean),
            "image_processor_type": PROCESSOR_TYPE,
            "image_std": list(self.std),
            "resample": BILINEAR,
            "rescale_factor": self.rescale,
            "size": {"height": self.image_size, "width": self.image_size},
        }

    def save(self, folder: str | Path) -> Path:
        """Write ``folder``/preprocessor_config.json (whole or not at all); the folder must exist."""
        text = json.dumps(self.to_hf(), indent=2, sort_keys=True) + "\n"
        return write_text_atomically(Path(folder) / PREPROCESSOR_NAME, text)

    @classmethod
    def from_hf(cls, raw: Mapping[str, Any], num_channels: int | None = None) -> ImageProcessing:
        """The settings of a parsed preprocessor_config.json. ``num_channels`` (the model's) is checked
        against the per-channel lists and spreads a single mean or std over the channels; without it,
        the channels are counted from the lists."""
        if not isinstance(raw, Mapping):
            raise ImageProcessingError(f"{PREPROCESSOR_NAME} must hold a JSON object, got {type(raw).__name__}")
        mean = raw.get("image_mean", 0.0) if raw.get("do_normalize", True) else 0.0
        std = raw.get("image_std", 1.0) if raw.get("do_normalize", True) else 1.0
        if num_channels is None:
            lists = [len(values) for values in (mean, std) if isinstance(values, list)]
            if not lists:
                raise ImageProcessingError(f"{PREPROCESSOR_NAME}: image_mean={mean!r} and image_std={std!r} do not "
                                           "say how many channels the images have (give num_channels)")
            num_channels = lists[0]
        rescale = raw.get("rescale_factor", 1 / 255) if raw.get("do_rescale", True) else 1.0
        return cls(image_size=_square_size(raw.get("size")), num_channels=num_channels,
                   mean=_per_channel(mean, num_channels), std=_per_channel(std, num_channels), rescale=rescale)

    @classmethod
    def read(cls, folder: str | Path, num_channels: int | None = None) -> ImageProcessing:
        """The settings in ``folder``/preprocessor_config.json (see ``from_hf``)."""
        path = Path(folder) / PREPROCESSOR_NAME
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ImageProcessingError(f"{path}: no such file") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ImageProcessingError(f"{path}: not valid JSON ({error})") from None
        try:
            return cls.from_hf(raw, num_channels)
        except ImageProcessingError as error:
            raise ImageProcessingError(f"{path}: {error}") from None


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _per_channel(values: Any, num_channels: int) -> Any:
    """One number spread over the channels; a list as it is (the constructor checks its length)."""
    return [values] * num_channels if _is_finite_number(values) else values


def _square_size(size: Any) -> int:
    """The side of the square images of a preprocessor_config.json ``size``: an int, or
    {"height": n, "width": n}; other shapes (another processor's ``shortest_edge``) are refused."""
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    if isinstance(size, Mapping) and set(size) == {"height", "width"} and size["height"] == size["width"]:
        return size["height"]
    raise ImageProcessingError(f"size={size!r} is not supported (supported: a square size, "
                               '{"height": n, "width": n} with height == width)')
