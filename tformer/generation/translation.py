"""Translating sentences with an encoder-decoder: text in, text out, in the order given.

Sentences are translated in batches of like source lengths (sorted, then put back in order), so a batch
carries little padding; each source is its tokens and the end token, as the translation task trains it.
A source longer than the model can read is cut and counted; an empty line gives an empty line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tformer.generation.checks import check_model
from tformer.generation.generate import generate
from tformer.generation.settings import GenerationError
from tformer.generation.sources import encode_sources, source_end_id, translation_budget


@dataclass
class Translations:
    """The translations (one per source, "" for an empty one), how many sources were cut to fit the
    model, and how many were empty."""

    texts: list[str]
    cut: int = 0
    empty: int = 0


def new_token_budget(model: nn.Module, longest_source: int) -> int:
    """New tokens a translation may have: 1.5 x the longest source of the whole input + 10 (not of a
    batch: a sentence's translation does not depend on the sentences beside it), within what the
    decoder's positions allow."""
    return translation_budget(longest_source, model.position_limit)


@torch.no_grad()
def translate_ids(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, tokenizer, *, max_new_tokens: int,
                  num_beams: int = 1, length_penalty: float = 1.0) -> list[str]:
    """The translations of a batch of sources (B, S), right-padded with ``attention_mask``, as text (a
    line break the model writes becomes a space: one translation is one line)."""
    if not len(input_ids):
        return []
    output = generate(model, input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                      num_beams=num_beams, length_penalty=length_penalty)
    texts = [tokenizer.decode(row[1:].tolist(), skip_special_tokens=True) for row in output]
    return [" ".join(text.replace("\r", "\n").split("\n")).strip() for text in texts]  # one line each, always


def translate(model: nn.Module, sentences: Sequence[str], tokenizer=None, *, num_beams: int = 5,
              batch_size: int = 64, length_penalty: float = 1.0, max_new_tokens: int | None = None,
              progress: bool = False) -> Translations:
    """Translate ``sentences`` with an encoder-decoder ``model`` (its own tokenizer unless one is given),
    ``batch_size`` sentences at a time, by beam search with ``num_beams`` (1: greedy). A translation has
    at most ``max_new_tokens`` tokens (default: ``new_token_budget``)."""
    check_model(model)
    if not model.encodes_prompt or not model.prompt_is_tokens:
        raise GenerationError(f"translate needs an encoder-decoder model that reads text; this one is "
                              f"{model.config.architecture!r}")
    tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    if tokenizer is None:
        raise GenerationError("translate needs a tokenizer: the model has none attached; pass tokenizer=")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise GenerationError(f"batch_size={batch_size!r} must be a positive integer")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    texts = [sentence.strip() for sentence in sentences]
    wanted = [row for row, text in enumerate(texts) if text]
    encoded = encode_sources(tokenizer, [texts[row] for row in wanted], source_end_id(tokenizer, model.config))
    limit = model.position_limit  # the longest source the model reads
    cut = 0
    sources = []
    for ids in encoded:
        if limit is not None and len(ids) > limit:
            ids = [*ids[: limit - 1], ids[-1]]
            cut += 1
        sources.append(ids)
    if max_new_tokens is None and sources:
        max_new_tokens = new_token_budget(model, max(len(ids) for ids in sources))
    results = [""] * len(texts)
    order = sorted(range(len(sources)), key=lambda index: len(sources[index]))
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="translating", unit="batch", leave=False)
    device = next(model.parameters()).device
    for batch in batches:  # generate decodes each through the model's decoding view, in eval mode
        longest = max(len(sources[index]) for index in batch)
        input_ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, index in enumerate(batch):
            input_ids[row, : len(sources[index])] = torch.tensor(sources[index])
            attention_mask[row, : len(sources[index])] = 1
        hypotheses = translate_ids(model, input_ids.to(device), attention_mask.to(device), tokenizer,
                                   num_beams=num_beams, length_penalty=length_penalty, max_new_tokens=max_new_tokens)
        for index, hypothesis in zip(batch, hypotheses, strict=True):
            results[wanted[index]] = hypothesis
    return Translations(results, cut=cut, empty=len(texts) - len(wanted))

