"""Language-model batches: random crops of a 1-D token sequence, drawn from a generator seeded
by (seed, position) so any batch can be reproduced without replaying the ones before it.

Under ``world_size`` processes the generator draws the *global* batch and each rank keeps its
own rows, so N processes with batch b see exactly the crops one process with batch N*b sees.
The token sequence may be a torch tensor or a numpy array (a read-only memory map too): only
the rows of a batch are read from it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

Tokens = Tensor | np.ndarray


def as_token_tensor(tokens) -> Tensor:
    """A 1-D int64 tensor from a list, numpy array (a memory map too) or tensor of token ids."""
    if isinstance(tokens, Tensor):
        return tokens.long().flatten()
    return torch.from_numpy(np.asarray(tokens).astype(np.int64, copy=False)).flatten()


def num_tokens(tokens: Tokens) -> int:
    return int(tokens.numel()) if isinstance(tokens, Tensor) else int(tokens.shape[0])


def crop_starts(num: int, batch_size: int, length: int, seed: int, position: int, world_size: int = 1) -> Tensor:
    """Start offsets (world_size * batch_size,) of the global batch at ``position``."""
    generator = torch.Generator().manual_seed((seed * 1_000_003 + position) % 2**64)  # torch seeds are 64-bit
    return torch.randint(0, num - length - 1, (world_size * batch_size,), generator=generator)


def random_crops(
    tokens: Tokens, batch_size: int, length: int, seed: int, step: int, *, rank: int = 0, world_size: int = 1
) -> tuple[Tensor, Tensor]:
    """``batch_size`` random windows of ``length + 1`` tokens -> inputs (B, length) and targets
    (B, length), the targets being the inputs shifted by one. ``step`` is the batch's position
    in the stream (the micro-batch counter); ``rank`` picks this process's rows of the global batch."""
    num = num_tokens(tokens)
    if num < length + 2:
        raise ValueError(f"the data has {num} tokens; a sequence length of {length} needs at least {length + 2}")
    starts = crop_starts(num, batch_size, length, seed, step, world_size)[rank * batch_size : (rank + 1) * batch_size]
    offsets = torch.arange(length + 1)
    index = starts[:, None] + offsets  # (B, length + 1)
    if isinstance(tokens, Tensor):
        windows = tokens[index].long()
    else:
        windows = torch.from_numpy(np.asarray(tokens[index.numpy()]).astype(np.int64, copy=False))
    return windows[:, :-1], windows[:, 1:]


def spaced_windows(
    tokens: Tokens, batch_size: int, length: int, index: int, num_batches: int, *, rank: int = 0,
    world_size: int = 1,
) -> tuple[Tensor, Tensor]:
    """Batch ``index`` of ``num_batches`` (global) batches of windows spread evenly over the
    whole sequence: an evaluation set that represents all of a held-out split and does not
    depend on any seed. Like ``random_crops``, N processes with batch b get the rows one
    process with batch N*b gets."""
    num = num_tokens(tokens)
    if num < length + 2:
        raise ValueError(f"the data has {num} tokens; a sequence length of {length} needs at least {length + 2}")
    total_rows = num_batches * world_size * batch_size
    first = (index * world_size + rank) * batch_size
    rows = torch.arange(first, first + batch_size)
    starts = rows * (num - length - 1) // max(total_rows - 1, 1)
    index_tensor = starts[:, None] + torch.arange(length + 1)  # (B, length + 1)
    if isinstance(tokens, Tensor):
        windows = tokens[index_tensor].long()
    else:
        windows = torch.from_numpy(np.asarray(tokens[index_tensor.numpy()]).astype(np.int64, copy=False))
    return windows[:, :-1], windows[:, 1:]


def check_token_ids(tokens: Tokens, vocab_size: int, what: str, chunk: int = 1 << 24) -> None:
    """Refuse (ValueError) ids outside 0..vocab_size-1, naming the first and where it is, before
    training starts rather than at the batch that meets it; a memory map is read a chunk at a time."""
    for start in range(0, num_tokens(tokens), chunk):
        piece = tokens[start : start + chunk]
        piece = piece.numpy() if isinstance(piece, Tensor) else np.asarray(piece)
        if piece.size and (piece.min() < 0 or piece.max() >= vocab_size):
            offset = int(np.flatnonzero((piece < 0) | (piece >= vocab_size))[0])
            raise ValueError(f"{what} holds token id {int(piece[offset])} at position {start + offset:,}, outside "
                             f"the model's vocabulary (ids 0..{vocab_size - 1})")


def split_tokens(tokens: Tokens, eval_fraction: float) -> tuple[Tokens, Tokens]:
    """The first (1 - eval_fraction) of the tokens for training, the rest for evaluation."""
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction={eval_fraction} must be in (0, 1)")
    cut = int(num_tokens(tokens) * (1.0 - eval_fraction))
    return tokens[:cut], tokens[cut:]


def unigram_cross_entropy(train: Tensor, evaluation: Tensor, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of ``evaluation`` under the add-one-smoothed unigram
    distribution of ``train``: the loss of a model that ignores context."""
    train, evaluation = as_token_tensor(train), as_token_tensor(evaluation)
    counts = torch.bincount(train, minlength=vocab_size).double() + 1.0
    log_probabilities = (counts / counts.sum()).log()
    return float(-log_probabilities[evaluation].mean())
