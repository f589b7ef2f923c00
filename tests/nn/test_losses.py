"""The CTC loss against its definition: the probability of every frame path that reads as the target."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tformer.nn.losses import IGNORE_INDEX, ctc_frames_needed, ctc_loss

BLANK = 0


def collapsed(path: tuple[int, ...]) -> list[int]:
    """A frame path as CTC reads it: repeats merged, then blanks dropped."""
    merged = [token for place, token in enumerate(path) if place == 0 or token != path[place - 1]]
    return [token for token in merged if token != BLANK]


def enumerated_loss(logits: torch.Tensor, target: list[int]) -> float:
    """-log of the summed probability of every path over logits' frames (S, C) that collapses to ``target``."""
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    frames, classes = log_probs.shape
    total = sum(math.exp(sum(log_probs[frame, token].item() for frame, token in enumerate(path)))
                for path in itertools.product(range(classes), repeat=frames) if collapsed(path) == target)
    return -math.log(total)


def test_the_loss_is_the_negative_log_probability_of_every_path_to_the_target():
    logits = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0))  # (B, S, C)
    targets = [[1, 2], [3, 3], [2]]  # a repeat needs a blank between its tokens
    padded = torch.tensor([row + [IGNORE_INDEX] * (2 - len(row)) for row in targets])
    losses = ctc_loss(logits, padded, BLANK, reduction="none")
    for row, target in enumerate(targets):
        assert losses[row].item() * len(target) == pytest.approx(enumerated_loss(logits[row], target), rel=1e-5)
    assert ctc_loss(logits, padded, BLANK).item() == pytest.approx(losses.mean().item(), rel=1e-6)
    assert ctc_loss(logits, padded, BLANK, reduction="sum").item() == pytest.approx(losses.sum().item(), rel=1e-6)


def test_frames_needed_count_a_blank_between_repeats_and_too_few_frames_are_refused():
    targets = torch.tensor([[4, 4, 4, IGNORE_INDEX], [1, 2, 1, 1], [5, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]])
    assert ctc_frames_needed(targets).tolist() == [5, 5, 1]
    with pytest.raises(ValueError, match="a CTC target needs 5 frames .* the logits have 4"):
        ctc_loss(torch.zeros(3, 4, 6), targets, BLANK)
    assert torch.isfinite(ctc_loss(torch.zeros(3, 5, 6), targets, BLANK))


def test_the_loss_trains_in_float32_whatever_the_logits_dtype():
    logits = torch.randn(2, 6, 5, generator=torch.Generator().manual_seed(1))
    targets = torch.tensor([[1, 2, 3], [4, IGNORE_INDEX, IGNORE_INDEX]])
    half = ctc_loss(logits.bfloat16(), targets, BLANK)
    assert half.dtype == torch.float32
    assert half.item() == pytest.approx(ctc_loss(logits.bfloat16().float(), targets, BLANK).item(), rel=1e-6)
