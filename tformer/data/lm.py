"""Language-model batches: random crops of a 1-D token sequence, drawn from a generator seeded
by (seed, step) so any step's batch can be reproduced without replaying the ones before it."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def as_token_tensor(tokens) -> Tensor:
    """A 1-D int64 tensor from a list, numpy array (a memory map too) or tensor of token ids."""
    if isinstance(tokens, Tensor):
        return tokens.long().flatten()
    return torch.from_numpy(np.asarray(tokens).astype(np.int64, copy=False)).flatten()


def random_crops(tokens: Tensor, batch_size: int, length: int, seed: int, step: int) -> tuple[Tensor, Tensor]:
    """``batch_size`` random windows of ``length + 1`` tokens -> inputs (B, length) and targets
    (B, length), the targets being the inputs shifted by one."""
    if tokens.numel() < length + 2:
        raise ValueError(
            f"the data has {tokens.numel()} tokens; a sequence length of {length} needs at least {length + 2}"
        )
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, tokens.numel() - length - 1, (batch_size,), generator=generator)
    windows = torch.stack([tokens[start : start + length + 1] for start in starts.tolist()])  # (B, length + 1)
    return windows[:, :-1], windows[:, 1:]


def split_tokens(tokens: Tensor, eval_fraction: float) -> tuple[Tensor, Tensor]:
    """The first (1 - eval_fraction) of the tokens for training, the rest for evaluation."""
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction={eval_fraction} must be in (0, 1)")
    cut = int(tokens.numel() * (1.0 - eval_fraction))
    return tokens[:cut], tokens[cut:]


def unigram_cross_entropy(train: Tensor, evaluation: Tensor, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of ``evaluation`` under the add-one-smoothed unigram
    distribution of ``train``: the loss of a model that ignores context."""
    counts = torch.bincount(train, minlength=vocab_size).double() + 1.0
    log_probabilities = (counts / counts.sum()).log()
    return float(-log_probabilities[evaluation].mean())
