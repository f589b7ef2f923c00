"""Text embeddings: a model's final hidden states pooled into one vector a text, the one implementation behind
``tformer.embed``, ``tformer embed`` and the server's ``/v1/embeddings``.

An encoder (BERT, RoBERTa) pools as its checkpoint says: a sentence-transformers folder's ``modules.json`` and
``1_Pooling/config.json`` (mean, [CLS] or last-token pooling, and a ``Normalize`` module), else its config's
``pooling`` (``"cls"``: the [CLS] token's vector, BERT's; ``"mean"``). A decoder pools its last token (the only
one that has read the whole text) unless told otherwise. The vectors are the final hidden states (after the
final norm), never a head's or the tanh pooler's output, as sentence-transformers reads them. Texts of different
lengths are padded on the right and masked, so a batch gives each text the vector it gets alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from tformer.nn.heads import pool
from tformer.nn.inputs import check_token_ids
from tformer.pooling import EmbeddingError, Pooling, folder_pooling

DEFAULT_BATCH_SIZE = 32

def embedding_problem(model) -> str | None:
    """Why ``model`` gives no text embeddings (it reads no tokens, or encodes a source for a decoder), or None."""
    architecture = model.config.architecture
    if getattr(model, "inputs", "tokens") != "tokens" or architecture not in ("encoder", "decoder"):
        return (f"a {architecture} model has no text embeddings; embed with an encoder (BERT, RoBERTa) or a "
                "decoder (GPT-2, Llama, ...)")
    return None


def default_pooling(model) -> Pooling:
    """The family's pooling: an encoder's config's (``pooling``, "cls" unless the checkpoint says "mean"), a
    decoder's last token."""
    if model.config.architecture == "encoder":
        return Pooling(model.config.pooling, False, f"the encoder's config (pooling={model.config.pooling!r})")
    return Pooling("last", False, "a decoder's default (the last token)")


def choose_pooling(model, folder: str | Path | None = None, mode: str | None = None,
                   normalize: bool | None = None) -> Pooling:
    """The pooling a model embeds with: ``mode`` and ``normalize`` where given, else the folder's
    sentence-transformers config, else the family's default (``default_pooling``)."""
    problem = embedding_problem(model)
    if problem is not None:
        raise EmbeddingError(problem)
    base = (folder_pooling(folder) if folder is not None else None) or default_pooling(model)
    if mode is None and normalize is None:
        return base
    return Pooling(base.mode if mode is None else mode, base.normalize if normalize is None else normalize,
                   "as asked" if mode is not None else base.source)


def max_input_tokens(model) -> int | None:
    """The most tokens one text may have: the position table's size (less RoBERTa's offset), None: unbounded."""
    limit = model.position_limit
    return None if limit is None else limit - getattr(model.config, "position_offset", 0)


def token_states(model, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """The final hidden states (B, T, D) of ``input_ids`` (B, T) under ``attention_mask`` (B, T), 1 = token: an
    encoder's without its head, a decoder's before its LM head."""
    if model.config.architecture == "encoder":
        return model.forward_features(input_ids, attention_mask)[0].hidden
    check_token_ids(input_ids, model.config.vocab_size)
    return model.stack(model.embedding(input_ids), attention_mask=attention_mask).hidden


@torch.inference_mode()
def embed_ids(model, sequences: Sequence[Sequence[int]], pooling: Pooling) -> Tensor:
    """One forward: ``sequences`` of token ids padded on the right into one batch, their vectors (N, D) in
    float32. Padding uses the model's pad id (RoBERTa numbers positions by it) and is masked out."""
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    longest = max(len(ids) for ids in sequences)
    input_ids = torch.full((len(sequences), longest), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
    device = model.device
    hidden = token_states(model, input_ids.to(device), attention_mask.to(device))
    vectors = pool(hidden, pooling.mode, attention_mask.to(device)).float()  # (N, D)
    return torch.nn.functional.normalize(vectors, dim=-1) if pooling.normalize else vectors


def text_ids(tokenizer, inputs: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
             limit: int | None = None, vocab_size: int | None = None) -> list[list[int]]:
    """The token ids of ``inputs`` (a text, texts, one list of ids or lists of ids, as OpenAI's ``input``): texts
    encoded with the tokenizer's special tokens ([CLS] ... [SEP]), each checked non-empty, within ``limit``
    tokens and, given ``vocab_size``, of ids in the vocabulary."""
    if isinstance(inputs, str) or (isinstance(inputs, Sequence) and inputs and isinstance(inputs[0], int)):
        inputs = [inputs]
    if not inputs:
        raise EmbeddingError("no input to embed")
    sequences = []
    for index, item in enumerate(inputs):
        if isinstance(item, str):
            if tokenizer is None:
                raise EmbeddingError("the model has no tokenizer to read texts with; give token ids")
            ids = tokenizer.encode(item)
        else:
            ids = list(item)
        check_ids(ids, index, limit, vocab_size)
        sequences.append(ids)
    return sequences


def check_ids(ids: Sequence[int], index: int, limit: int | None, vocab_size: int | None) -> None:
    """An EmbeddingError naming input ``index`` when it has no tokens, more than ``limit``, or an id that is not
    an integer in [0, ``vocab_size``)."""
    if not ids:
        raise EmbeddingError(f"input {index} has no tokens")
    if limit is not None and len(ids) > limit:
        raise EmbeddingError(f"input {index} has {len(ids):,} tokens; the model reads at most {limit:,}")
    if vocab_size is not None:
        bad = next((token for token in ids if not isinstance(token, int) or isinstance(token, bool)
                    or not 0 <= token < vocab_size), None)
        if bad is not None:
            raise EmbeddingError(f"input {index}: token id {bad!r} is outside the vocabulary [0, {vocab_size})")


def embed(model, inputs: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]], *,
          pooling: str | Pooling | None = None, normalize: bool | None = None,
          batch_size: int = DEFAULT_BATCH_SIZE, folder: str | Path | None = None) -> Tensor:
    """Embeddings (N, D), float32, one row per input: ``model`` a loaded encoder or decoder (``folder``, the one it
    was loaded from, holds its sentence-transformers pooling config when it has one; ``tformer.embed`` takes the
    folder itself); ``inputs`` a text, texts, or token ids. ``pooling`` ("cls", "mean", "last", or a ``Pooling``
    chosen already) and ``normalize`` replace the checkpoint's choice (``choose_pooling``); ``batch_size`` texts run
    at once."""
    problem = embedding_problem(model)
    if problem is not None:
        raise EmbeddingError(problem)
    if isinstance(pooling, Pooling):
        if normalize is not None:
            raise EmbeddingError("normalize goes with a pooling mode's name; a Pooling carries its own")
        chosen = pooling
    else:
        chosen = choose_pooling(model, folder, pooling, normalize)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise EmbeddingError(f"batch_size={batch_size!r} must be an integer >= 1")
    sequences = text_ids(getattr(model, "tokenizer", None), inputs, max_input_tokens(model), model.config.vocab_size)
    was_training = model.training
    model.eval()
    try:
        parts = [embed_ids(model, sequences[start: start + batch_size], chosen)
                 for start in range(0, len(sequences), batch_size)]
    finally:
        model.train(was_training)
    return torch.cat(parts)
