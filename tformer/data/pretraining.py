"""Pretraining rows for an encoder, from documents (lists of sentences, each a list of token ids).

``next_sentence_pairs``: BERT's pairs for masked LM + next-sentence prediction, ``[CLS] A [SEP] B [SEP]``
with token types 0 for ``[CLS] A [SEP]`` and 1 for ``B [SEP]``. Sentences are gathered from a document
until they fill a target length (``max_seq_len`` - 3, or with ``short_seq_probability`` a random shorter
one, so the model also sees short inputs); A is a random number of the leading sentences; B is, half of
the time, the sentences that follow (``is_next`` = 1), else a run of sentences from another document
(``is_next`` = 0, and the unused sentences go back to be read again). This is BERT's
create_pretraining_data, with one change: a chunk of a single sentence (a long one, or a document's last)
whose coin says "next" is cut in two at a random token instead of always taking a random B, so
``is_next`` is 1 for half the pairs rather than fewer. A pair too long is trimmed one token at a time
from the longer side, at its front or back at random.

``packed_sequences``: for masked LM alone (RoBERTa's full sentences), the documents back to back with a
``[SEP]`` after each, cut into rows of ``[CLS]`` + ``max_seq_len`` - 2 tokens + ``[SEP]``, the last row
padded.

Both are deterministic functions of their ``seed`` and cost a few list operations per sentence, so a few
MB of text take about a second. Masking happens later, per batch (``tformer.data.masking``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tformer.errors import TformerError

Document = Sequence[Sequence[int]]


@dataclass(frozen=True)
class PretrainingRows:
    """Rows of equal length: ``input_ids`` (N, T) padded with the pad id, ``token_type_ids`` (N, T),
    ``attention_mask`` (N, T) (1 = a real token) and, for NSP pairs, ``next_sentence_label`` (N,):
    1 = B follows A, 0 = B comes from another document."""

    input_ids: Tensor
    token_type_ids: Tensor
    attention_mask: Tensor
    next_sentence_label: Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def next_sentence_pairs(
    documents: Sequence[Document],
    max_seq_len: int,
    *,
    cls_id: int,
    sep_id: int,
    pad_id: int,
    seed: int,
    short_seq_probability: float = 0.1,
    random_next_probability: float = 0.5,
) -> PretrainingRows:
    """MLM + NSP rows from ``documents``; at least two documents must hold a sentence."""
    if max_seq_len < 5:
        raise TformerError(f"max_seq_len={max_seq_len} is too short for [CLS] A [SEP] B [SEP] (at least 5)")
    for name, value in (("short_seq_probability", short_seq_probability),
                        ("random_next_probability", random_next_probability)):
        if not 0.0 <= value <= 1.0:
            raise TformerError(f"{name}={value} must be in [0, 1]")
    documents = [[list(sentence) for sentence in document if len(sentence)] for document in documents]
    documents = [document for document in documents if document]
    if len(documents) < 2:
        raise TformerError(f"next-sentence pairs need at least 2 non-empty documents, got {len(documents)}")
    rng = random.Random(seed)
    pairs: list[tuple[list[int], list[int], int]] = []
    for index in range(len(documents)):
        pairs.extend(_document_pairs(documents, index, max_seq_len - 3, rng, short_seq_probability,
                                     random_next_probability))
    rows = np.full((len(pairs), max_seq_len), pad_id, dtype=np.int64)
    types = np.zeros((len(pairs), max_seq_len), dtype=np.int64)
    mask = np.zeros((len(pairs), max_seq_len), dtype=np.int64)
    labels = np.zeros(len(pairs), dtype=np.int64)
    for row, (first, second, is_next) in enumerate(pairs):
        tokens = [cls_id, *first, sep_id, *second, sep_id]
        rows[row, : len(tokens)] = tokens
        types[row, len(first) + 2 : len(tokens)] = 1
        mask[row, : len(tokens)] = 1
        labels[row] = is_next
    return PretrainingRows(torch.from_numpy(rows), torch.from_numpy(types), torch.from_numpy(mask),
                           torch.from_numpy(labels))


def _document_pairs(documents: list[list[list[int]]], index: int, max_tokens: int, rng: random.Random,
                    short_seq_probability: float, random_next_probability: float):
    """(A, B, is_next) pairs from document ``index``, each fitting ``max_tokens`` (A and B together)."""
    document = documents[index]
    target = rng.randint(2, max_tokens) if rng.random() < short_seq_probability else max_tokens
    pairs = []
    chunk: list[list[int]] = []
    chunk_length = 0
    position = 0
    while position < len(document):
        chunk.append(document[position])
        chunk_length += len(document[position])
        if position == len(document) - 1 or chunk_length >= target:
            split = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            first = [token for sentence in chunk[:split] for token in sentence]
            single = len(chunk) == 1
            if rng.random() < random_next_probability or (single and len(first) < 2):
                second = _random_segment(documents, index, max(1, target - len(first)), rng)
                position -= len(chunk) - split  # the sentences B did not use are read again
                is_next = 0
            elif single:  # one sentence: A and B are its two halves, cut at a random token
                cut = rng.randint(1, len(first) - 1)
                first, second = first[:cut], first[cut:]
                is_next = 1
            else:
                second = [token for sentence in chunk[split:] for token in sentence]
                is_next = 1
            _trim_pair(first, second, max_tokens, rng)
            pairs.append((first, second, is_next))
            chunk, chunk_length = [], 0
        position += 1
    return pairs


def _random_segment(documents: list[list[list[int]]], index: int, length: int, rng: random.Random) -> list[int]:
    """At least ``length`` tokens (or to the document's end) of consecutive sentences from a random
    other document."""
    other = rng.randrange(len(documents) - 1)
    other += other >= index  # any document but this one
    document = documents[other]
    segment: list[int] = []
    for sentence in document[rng.randrange(len(document)):]:
        segment.extend(sentence)
        if len(segment) >= length:
            break
    return segment


def _trim_pair(first: list[int], second: list[int], max_tokens: int, rng: random.Random) -> None:
    """Drop tokens from the longer of the two, at its front or back at random, until both fit."""
    while len(first) + len(second) > max_tokens:
        longer = first if len(first) > len(second) else second
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def packed_sequences(
    documents: Sequence[Document],
    max_seq_len: int,
    *,
    cls_id: int,
    sep_id: int,
    pad_id: int,
) -> PretrainingRows:
    """MLM rows of contiguous text: the documents' tokens back to back, ``[SEP]`` after each document,
    cut into ``[CLS]`` + up to ``max_seq_len`` - 2 tokens + ``[SEP]``; token types all 0."""
    if max_seq_len < 3:
        raise TformerError(f"max_seq_len={max_seq_len} is too short for [CLS] text [SEP] (at least 3)")
    pieces = []
    for document in documents:
        tokens = [token for sentence in document for token in sentence]
        if tokens:
            pieces.append(np.asarray(tokens, dtype=np.int64))
            pieces.append(np.asarray([sep_id], dtype=np.int64))
    if not pieces:
        raise TformerError("no tokens to pack: every document is empty")
    stream = np.concatenate(pieces[:-1])  # no separator after the last document: the row's [SEP] ends it
    body = max_seq_len - 2
    num_rows = -(-stream.size // body)
    rows = np.full((num_rows, max_seq_len), pad_id, dtype=np.int64)
    mask = np.zeros((num_rows, max_seq_len), dtype=np.int64)
    full = stream.size // body
    rows[:full, 0] = cls_id
    rows[:full, 1:-1] = stream[: full * body].reshape(full, body)
    rows[:full, -1] = sep_id
    mask[:full] = 1
    rest = stream[full * body:]
    if rest.size:
        rows[full, : rest.size + 2] = [cls_id, *rest.tolist(), sep_id]
        mask[full, : rest.size + 2] = 1
    return PretrainingRows(torch.from_numpy(rows), torch.zeros_like(torch.from_numpy(rows)), torch.from_numpy(mask))
