"""Checkpoint averaging: the weights of a model's last few checkpoints, averaged (the 2017 paper's base
models average the last 5), which often translates better than any one of them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from tformer.checkpoint import CheckpointError
from tformer.hub import load
from tformer.training.checkpoints import list_checkpoints


def last_checkpoints(run_dir: str | Path, count: int) -> list[Path]:
    """The newest ``count`` step checkpoints of a run folder, oldest first; fewer is an error naming how many."""
    found = [folder for _, folder in list_checkpoints(run_dir)]
    if count < 1:
        raise CheckpointError(f"--last {count}: average at least 1 checkpoint")
    if len(found) < count:
        raise CheckpointError(f"{run_dir} holds {len(found)} step checkpoints, fewer than the {count} to average "
                              "(training.keep_last keeps that many)")
    return found[-count:]


def average_checkpoints(folders: Sequence[str | Path]):
    """The model of ``folders[0]`` (and its tokenizer) with every floating-point weight the mean of that
    weight over all the folders, which must hold models of one config with the same attachments (tokenizer,
    image processing, quantization): the same weights under another tokenizer mean other tokens."""
    if not folders:
        raise CheckpointError("no checkpoints to average")
    model = load(folders[0], device="cpu")
    totals = {name: tensor.double().clone() for name, tensor in model.state_dict().items()
              if tensor.is_floating_point()}
    for folder in folders[1:]:
        other = load(folder, device="cpu")
        if other.config != model.config:
            raise CheckpointError(f"{folder}: its model's config differs from {folders[0]}'s; only checkpoints of one "
                                  "model average")
        difference = attachment_difference(model, other)
        if difference:
            raise CheckpointError(f"{folder}: {difference} differs from {folders[0]}'s; only checkpoints of one model "
                                  "with one tokenizer and preprocessing average")
        for name, tensor in other.state_dict().items():
            if name in totals:
                totals[name] += tensor.double()
    with torch.no_grad():
        state = model.state_dict()
        for name, total in totals.items():
            state[name].copy_((total / len(folders)).to(state[name].dtype))
    return model


def attachment_difference(model, other) -> str | None:
    """What ``other`` carries that differs from ``model``'s (its tokenizer, naming how many token ids
    differ; its image processing; its quantization), or None when they carry the same."""
    mine, theirs = getattr(model, "tokenizer", None), getattr(other, "tokenizer", None)
    if (mine is None) != (theirs is None):
        return f"its tokenizer ({'none' if theirs is None else 'one'} where the first has {'one' if mine else 'none'})"
    if mine is not None and mine.fingerprint() != theirs.fingerprint():
        size = max(mine.vocab_size, theirs.vocab_size)
        differing = sum(mine.id_to_token(token_id) != theirs.id_to_token(token_id) for token_id in range(size))
        what = f"{differing} of {size} token ids" if differing else "the same ids, other settings"
        return f"its tokenizer ({what})"
    for name, label in (("image_processor", "its image processing"), ("quantization", "its quantization")):
        if getattr(model, name, None) != getattr(other, name, None):
            return label
    return None
