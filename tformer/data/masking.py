"""Masked-language-model inputs (BERT's rule): choose ``mask_probability`` (15%) of the eligible tokens
of each row, replace 80% of the chosen by the mask token, 10% by a random token, leave 10% unchanged;
the labels are the original ids where chosen, -100 elsewhere. Special tokens and padding are never
chosen, and a random replacement is never a special token.

Each row gets ``floor(p * eligible + u)`` chosen tokens, ``u`` uniform in [0, 1): exactly p of its
tokens in expectation, with less spread than a coin per token. With whole-word masking (``continuation``:
which ids continue the word before them, e.g. WordPiece's ``##`` pieces) whole words are chosen, in a
random order, while the middle of a word falls inside the row's count; the 80/10/10 choice stays per
token, as in BERT's and Hugging Face's whole-word masking.

Everything random comes from the caller's generator, with the same number of draws for any input of
the same shape, so a generator seeded by (seed, step) gives the same masks after a resume.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from tformer.errors import TformerError
from tformer.nn.losses import IGNORE_INDEX


def mask_tokens(
    input_ids: Tensor,
    generator: torch.Generator,
    *,
    special_ids: Sequence[int],
    vocab_size: int,
    mask_id: int,
    mask_probability: float = 0.15,
    replace_with_mask: float = 0.8,
    replace_with_random: float = 0.1,
    continuation: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Masked inputs (B, T) and labels (B, T) from ``input_ids`` (B, T), on their device (the
    generator's too). ``special_ids`` (padding included) are never chosen; ``continuation`` is an
    optional (vocab_size,) bool table for whole-word masking."""
    _check_probabilities(mask_probability, replace_with_mask, replace_with_random)
    if input_ids.dim() != 2:
        raise TformerError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
    if not 0 <= mask_id < vocab_size:
        raise TformerError(f"mask_id={mask_id} is outside the vocabulary (0..{vocab_size - 1})")
    ids = input_ids.long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise TformerError(f"token ids must lie in 0..{vocab_size - 1}, got {int(ids.min())}..{int(ids.max())}")
    if continuation is not None and (continuation.dtype != torch.bool or tuple(continuation.shape) != (vocab_size,)):
        raise TformerError(f"continuation must be a ({vocab_size},) bool table (which ids continue a word), "
                           f"got {continuation.dtype} of shape {tuple(continuation.shape)}")
    special_ids = [int(index) for index in special_ids]
    if any(not 0 <= index < vocab_size for index in special_ids):
        raise TformerError(f"special_ids={special_ids} must lie in the vocabulary (0..{vocab_size - 1})")
    special = torch.zeros(vocab_size, dtype=torch.bool, device=ids.device)
    special[torch.tensor(special_ids, dtype=torch.long, device=ids.device)] = True
    replacements = (~special).nonzero().squeeze(1)  # the ids a random replacement may take
    if replacements.numel() == 0:
        raise TformerError("every id of the vocabulary is special; no random replacement is possible")
    eligible = ~special[ids]  # (B, T)
    chosen = _choose(ids, eligible, generator, mask_probability, continuation)
    action = torch.rand(ids.shape, generator=generator, device=ids.device)  # (B, T)
    random_ids = replacements[torch.randint(replacements.numel(), ids.shape, generator=generator, device=ids.device)]
    to_mask = chosen & (action < replace_with_mask)
    to_random = chosen & (action >= replace_with_mask) & (action < replace_with_mask + replace_with_random)
    masked = torch.where(to_mask, torch.full_like(ids, mask_id), torch.where(to_random, random_ids, ids))
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    return masked, labels


def _choose(ids: Tensor, eligible: Tensor, generator: torch.Generator, probability: float,
            continuation: Tensor | None) -> Tensor:
    """(B, T) bool: the chosen tokens, whole words of them when ``continuation`` is given."""
    batch, length = ids.shape
    if continuation is None:
        starts = eligible
    else:
        continues = continuation.to(ids.device)[ids] & eligible
        previous_eligible = torch.nn.functional.pad(eligible[:, :-1], (1, 0), value=False)
        starts = eligible & ~(continues & previous_eligible)  # a piece after a special token starts a word
    # Word slots: token t belongs to word word_of[b, t]; ineligible tokens go to the spare slot ``length``.
    word_of = torch.where(eligible, starts.long().cumsum(1) - 1, torch.full_like(ids, length))  # (B, T)
    word_lengths = torch.zeros(batch, length + 1, dtype=torch.long, device=ids.device)
    word_lengths.scatter_add_(1, word_of, torch.ones_like(ids))
    word_lengths[:, length] = 0
    num_words = starts.sum(1, keepdim=True)  # (B, 1)
    slots = torch.arange(length + 1, device=ids.device)
    scores = torch.rand(batch, length + 1, generator=generator, device=ids.device)
    scores = torch.where(slots < num_words, scores, torch.full_like(scores, 2.0))  # real words first, shuffled
    order = scores.argsort(dim=1)  # (B, T + 1)
    ordered_lengths = word_lengths.gather(1, order)
    ends = ordered_lengths.cumsum(1)
    budget = (probability * eligible.sum(1, keepdim=True)
              + torch.rand(batch, 1, generator=generator, device=ids.device)).floor()  # (B, 1) tokens to choose
    chosen_in_order = ((ends - 0.5 * ordered_lengths) < budget) & (ordered_lengths > 0)
    chosen_words = torch.zeros(batch, length + 1, dtype=torch.bool, device=ids.device)
    chosen_words.scatter_(1, order, chosen_in_order)
    return chosen_words.gather(1, word_of) & eligible


def _check_probabilities(mask_probability: float, replace_with_mask: float, replace_with_random: float) -> None:
    for name, value in (("mask_probability", mask_probability), ("replace_with_mask", replace_with_mask),
                        ("replace_with_random", replace_with_random)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise TformerError(f"{name}={value!r} must be a number in [0, 1]")
    if replace_with_mask + replace_with_random > 1.0:
        raise TformerError(f"replace_with_mask + replace_with_random = {replace_with_mask + replace_with_random} "
                           "exceeds 1 (the rest of the chosen tokens stay unchanged)")


def wordpiece_continuations(vocab: Sequence[str] | Mapping[str, int], marker: str = "##") -> Tensor:
    """The (vocab_size,) bool table of ids whose token continues the previous word (starts with
    ``marker``), from a vocabulary as a list of tokens (index = id) or a token -> id mapping."""
    tokens = list(vocab) if not isinstance(vocab, Mapping) else None
    if tokens is None:
        tokens = [""] * (max(vocab.values()) + 1)
        for token, index in vocab.items():
            tokens[index] = token
    return torch.tensor([token.startswith(marker) for token in tokens], dtype=torch.bool)
