"""The audio front end: log-mel frames (B, M, F) -> vectors (B, S, D) for the encoder stack, Whisper's stem."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from tformer.nn.positions import whisper_sinusoids


class AudioEmbedding(nn.Module):
    """Two 1-D convolutions of kernel 3 (``conv1`` keeps the frame rate, ``conv2`` halves it), each followed by
    exact GELU, then Whisper's fixed sinusoids added per position.

    ``positions`` is a table (max_positions, D) whose weight never trains (``requires_grad`` False), as
    Hugging Face holds it (``embed_positions``: counted among the parameters and stored in the checkpoint); a
    loaded checkpoint's table is used as it is. An input of F frames gives ceil(F / 2) positions; more frames
    than ``2 * max_positions`` are refused (``check``), never cut.
    """

    def __init__(self, num_mel_bins: int, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.num_mel_bins = num_mel_bins
        self.max_positions = max_positions
        self.conv1 = nn.Conv1d(num_mel_bins, d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d_model, d_model, kernel_size=3, stride=2, padding=1)
        self.positions = nn.Embedding(max_positions, d_model)
        self.positions.weight.requires_grad_(False)
        self.reset_positions()

    @property
    def max_frames(self) -> int:
        """The most frames one input may have (the window): two per position."""
        return 2 * self.max_positions

    def problem(self, features: object) -> str | None:
        """Why ``features`` are not log-mel frames this stem reads, or None: a float tensor (B, M, F) with
        this model's M channels, B >= 1 and 1 <= F <= ``max_frames``."""
        if not isinstance(features, Tensor):
            return f"input_features must be a tensor (batch, mels, frames), got {type(features).__name__}"
        if features.dim() != 3 or not features.is_floating_point():
            return (f"input_features must be float log-mel features (batch, mels, frames), got shape "
                    f"{tuple(features.shape)} of {features.dtype}")
        batch, mels, frames = features.shape
        if mels != self.num_mel_bins:
            return f"input_features have {mels} mel channels; this model reads num_mel_bins={self.num_mel_bins}"
        if batch == 0 or frames == 0:
            return f"input_features of shape {tuple(features.shape)} hold no audio"
        if frames > self.max_frames:
            return (f"input_features have {frames} frames; this model reads at most {self.max_frames} at once "
                    f"(max_source_positions={self.max_positions}: 2 frames each). Split longer audio into windows")
        return None

    def forward(self, features: Tensor) -> Tensor:
        """features (B, M, F) -> (B, ceil(F / 2), D): the stem's output plus the first positions."""
        problem = self.problem(features)
        if problem is not None:
            raise ValueError(problem)
        x = features.to(self.conv1.weight.dtype)
        x = F.gelu(self.conv2(F.gelu(self.conv1(x))))  # (B, D, S)
        x = x.transpose(1, 2)  # (B, S, D)
        return x + self.positions.weight[: x.shape[1]].to(x.dtype)

    def reset_positions(self) -> None:
        """Fill the position table with Whisper's sinusoids again (a fresh model's)."""
        with torch.no_grad():
            self.positions.weight.copy_(whisper_sinusoids(*self.positions.weight.shape))
