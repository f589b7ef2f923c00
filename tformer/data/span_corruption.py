"""T5's span corruption (Raffel et al. 2020, section 3.1.4): a row of text tokens loses random spans, each
replaced in the inputs by a sentinel; the targets are the sentinels each followed by the span it replaced.

"Thank you for inviting me to your party last week." becomes
inputs  ``Thank you <extra_id_0> me to your party <extra_id_1> week. </s>``,
targets ``<extra_id_0> for inviting <extra_id_1> last </s>`` (T5's layout: the row always ends in noise, so
the targets close with the end token, not a further sentinel).

The noise follows T5's reference function (``random_spans_noise_mask``): a row of L tokens holds exactly
``round(L * noise_density)`` noise tokens (at least 1, at most L - 1) in ``round(noise / mean_span_length)``
spans (at least 1); noise and non-noise lengths are each a uniformly random composition of their total into
that many positive parts, interleaved non-noise first. Rounding is Python's (half to even, as ``tf.round``).
Sentinel k is the token ``<extra_id_k>``: in T5's tokenizer id ``vocab - 1 - k``, counting down from the
end of the vocabulary; ``sentinel_ids`` adds them so to a tokenizer that has none.

``span_corruption_lengths`` is T5's ``random_spans_helper``: the text length whose corrupted inputs fill a
given input length, so packed rows need no padding. Every row of one length has the same counts, so a
batch's inputs and targets are rectangular. Randomness comes from the caller's generator (one draw per
row and item, whatever the tokens), so a generator seeded by (seed, step) redraws a batch after a resume.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from tformer.errors import TformerError

SENTINEL = "<extra_id_{}>"
T5_SENTINELS = 100  # T5's tokenizer has <extra_id_0> .. <extra_id_99>


def _check_noise(noise_density: float, mean_span_length: float) -> None:
    if isinstance(noise_density, bool) or not isinstance(noise_density, (int, float)) or not 0 < noise_density < 1:
        raise TformerError(f"noise_density={noise_density!r} must be a number in (0, 1)")
    if isinstance(mean_span_length, bool) or not isinstance(mean_span_length, (int, float)) or mean_span_length < 1:
        raise TformerError(f"mean_noise_span_length={mean_span_length!r} must be a number >= 1")


def noise_counts(length: int, noise_density: float = 0.15, mean_span_length: float = 3.0) -> tuple[int, int]:
    """(noise tokens, noise spans) of a row of ``length`` (>= 2) tokens, rounded and bounded as T5 does."""
    _check_noise(noise_density, mean_span_length)
    if length < 2:
        raise TformerError(f"a row to corrupt needs at least 2 tokens (one noise, one kept), got {length}")
    noise = min(max(round(length * noise_density), 1), length - 1)
    spans = max(round(noise / mean_span_length), 1)
    if spans > length - noise:
        raise TformerError(f"{length} tokens at noise_density={noise_density} hold {spans} noise spans but only "
                           f"{length - noise} kept tokens to separate them; lower the density or lengthen the spans")
    return noise, spans


def corrupted_lengths(length: int, noise_density: float = 0.15, mean_span_length: float = 3.0) -> tuple[int, int]:
    """(inputs, targets) lengths of a corrupted row of ``length`` tokens: the kept tokens and a sentinel a
    span, then the end token; the noise tokens and a sentinel a span, then the end token."""
    noise, spans = noise_counts(length, noise_density, mean_span_length)
    return length - noise + spans + 1, noise + spans + 1


def span_corruption_lengths(inputs_length: int, noise_density: float = 0.15,
                            mean_span_length: float = 3.0) -> tuple[int, int]:
    """(tokens_length, targets_length), T5's ``random_spans_helper``: the most text tokens whose corrupted
    inputs (sentinels and end token included) fit ``inputs_length``, and the length of their targets."""
    _check_noise(noise_density, mean_span_length)
    if isinstance(inputs_length, bool) or not isinstance(inputs_length, int) or inputs_length < 3:
        raise TformerError(f"inputs_length={inputs_length!r} must be an integer >= 3 (a token, a sentinel, the end)")

    def lengths(tokens: int) -> tuple[int, int]:  # T5's rounding, without noise_counts' bounds
        noise = round(tokens * noise_density)
        spans = round(noise / mean_span_length)
        return tokens - noise + spans + 1, noise + spans + 1

    tokens = inputs_length - 1
    while lengths(tokens + 1)[0] <= inputs_length:
        tokens += 1
    targets = lengths(tokens)[1]
    if noise_density == 0.5 and targets > inputs_length:  # T5: targets as long as the (round) inputs length
        tokens, targets = tokens - 1, targets - 1
    return tokens, targets


def _random_segmentation(rows: int, items: int, segments: int, generator: torch.Generator) -> Tensor:
    """(rows, segments) positive lengths summing to ``items``, each row a uniformly random composition:
    ``segments - 1`` of the ``items - 1`` gaps chosen as cuts, all choices equally likely."""
    scores = torch.rand(rows, items - 1, generator=generator)
    cuts = scores.argsort(dim=1).argsort(dim=1) < segments - 1  # (rows, items - 1): a random subset per row
    segment = torch.nn.functional.pad(cuts.long(), (1, 0)).cumsum(dim=1)  # (rows, items): each item's segment
    lengths = torch.zeros(rows, segments, dtype=torch.long)
    return lengths.scatter_add_(1, segment, torch.ones_like(segment))


def random_spans_noise_mask(rows: int, length: int, generator: torch.Generator, noise_density: float = 0.15,
                            mean_span_length: float = 3.0) -> Tensor:
    """(rows, length) bool, True = noise: spans of noise alternating with kept spans, kept first, noise last."""
    noise, spans = noise_counts(length, noise_density, mean_span_length)
    noise_lengths = _random_segmentation(rows, noise, spans, generator)
    kept_lengths = _random_segmentation(rows, length - noise, spans, generator)
    interleaved = torch.stack([kept_lengths, noise_lengths], dim=2).reshape(rows, 2 * spans)
    starts = interleaved.cumsum(dim=1)[:, :-1]  # (rows, 2 * spans - 1): where each span after the first starts
    indicator = torch.zeros(rows, length, dtype=torch.long).scatter_(1, starts, 1)
    return indicator.cumsum(dim=1) % 2 == 1


def _replace_spans(tokens: Tensor, spans: Tensor, sentinels: Tensor, end_id: int) -> Tensor:
    """``tokens`` (B, L) with each run of ``spans`` (B, L) replaced by the next sentinel, then the end token."""
    previous = torch.nn.functional.pad(spans[:, :-1], (1, 0), value=False)
    first = spans & ~previous
    index = (first.long().cumsum(dim=1) - 1).clamp(min=0)
    replaced = torch.where(first, sentinels[index], tokens)
    kept = replaced[~(spans & previous)].view(tokens.shape[0], -1)  # every row keeps as many (equal counts)
    return torch.cat([kept, kept.new_full((tokens.shape[0], 1), end_id)], dim=1)


def corrupt_spans(tokens: Tensor, noise_mask: Tensor, sentinel_ids: Sequence[int] | Tensor,
                  end_id: int) -> tuple[Tensor, Tensor]:
    """(inputs (B, I), targets (B, T)) of ``tokens`` (B, L) under ``noise_mask`` (B, L; every row with as
    many noise tokens and spans, as ``random_spans_noise_mask`` gives): noise spans replaced by sentinels
    0, 1, ... in the inputs; the targets the sentinels each followed by its span; both closed by ``end_id``."""
    if tokens.dim() != 2 or tokens.shape != noise_mask.shape:
        raise TformerError(f"tokens {tuple(tokens.shape)} and noise_mask {tuple(noise_mask.shape)} must be one "
                           "(batch, length) shape")
    sentinels = torch.as_tensor(sentinel_ids, dtype=torch.long)
    starts = noise_mask & ~torch.nn.functional.pad(noise_mask[:, :-1], (1, 0), value=False)
    most = int(starts.sum(dim=1).max()) if tokens.numel() else 0
    if most > sentinels.numel():
        raise TformerError(f"a row holds {most} noise spans but there are {sentinels.numel()} sentinels; use "
                           "shorter rows or more sentinels")
    tokens = tokens.long()
    return _replace_spans(tokens, noise_mask, sentinels, end_id), _replace_spans(tokens, ~noise_mask, sentinels, end_id)


def sentinel_ids(tokenizer, count: int = T5_SENTINELS, *, may_add: bool = True) -> list[int]:
    """The ids of ``<extra_id_0>``, ``<extra_id_1>``, ... in ``tokenizer``: all it has (T5's: 100, id
    vocab - 1 - k), else, with ``may_add``, ``count`` of them added as special tokens at the vocabulary's
    end, ``<extra_id_0>`` last, as T5's tokenizer numbers them."""
    if tokenizer.token_to_id(SENTINEL.format(0)) is None:
        if not may_add:
            raise TformerError(f"the tokenizer has no sentinel tokens ({SENTINEL.format(0)}, ...); span corruption "
                               "needs them: train with the data's tokenizer, which gets them added")
        if count < 1:
            raise TformerError(f"sentinels={count} must be at least 1")
        tokenizer.add_special_tokens([SENTINEL.format(k) for k in reversed(range(count))])
    ids = []
    while (token_id := tokenizer.token_to_id(SENTINEL.format(len(ids)))) is not None:
        ids.append(token_id)
    return ids
