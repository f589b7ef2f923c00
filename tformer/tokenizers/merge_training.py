"""Learning merges, the training half of BPE (and of WordPiece, which Hugging Face also trains
by merging): repeatedly join the most frequent adjacent pair of symbols across the corpus.

Pair counts are kept up to date incrementally: a merge only revisits the words that hold the
merged pair (an index from pair to words), subtracts those words' old pairs and adds their new
ones, so no merge ever recounts the corpus. The most frequent pair comes from a heap whose
entries may be stale; a popped entry whose count is out of date is pushed back with the true
count. Ties go to the smallest pair of ids, as in Hugging Face's BpeTrainer."""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable
from itertools import pairwise

Pair = tuple[int, int]


def learn_merges(
    words: list[list[int]],
    counts: list[int],
    vocab: list[str],
    vocab_size: int,
    min_frequency: int,
    join: Callable[[str, str], str],
    on_merge: Callable[[], None] | None = None,
) -> list[Pair]:
    """Merge pairs until ``vocab`` (token strings by id; new tokens are appended) holds
    ``vocab_size`` tokens or no pair occurs ``min_frequency`` times. ``words`` are symbol ids,
    each with its corpus count; they are merged in place. ``join(left, right)`` names a merged
    token. Returns the merges in the order learned (their rank)."""
    token_ids = {token: token_id for token_id, token in enumerate(vocab)}
    pair_counts: dict[Pair, int] = defaultdict(int)
    where: dict[Pair, set[int]] = defaultdict(set)
    for index, word in enumerate(words):
        count = counts[index]
        for pair in pairwise(word):
            pair_counts[pair] += count
            where[pair].add(index)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    merges: list[Pair] = []
    minimum = max(min_frequency, 1)
    while heap and len(vocab) < vocab_size:
        negative_count, pair = heapq.heappop(heap)
        count = pair_counts.get(pair, 0)
        if count != -negative_count:
            if 0 < count < -negative_count:  # counts fell since this entry: requeue the true one
                heapq.heappush(heap, (-count, pair))
            continue  # (a count that rose was pushed afresh when it rose)
        if count < minimum:
            break
        left, right = pair
        name = join(vocab[left], vocab[right])
        new_id = token_ids.get(name)
        if new_id is None:
            new_id = len(vocab)
            vocab.append(name)
            token_ids[name] = new_id
        merges.append(pair)

        risen: set[Pair] = set()
        for index in where.pop(pair):
            word = words[index]
            merged = _merge_word(word, left, right, new_id)
            if len(merged) == len(word):
                continue  # this word lost the pair in an earlier merge
            count = counts[index]
            for old in pairwise(word):
                pair_counts[old] -= count
            for new in pairwise(merged):
                pair_counts[new] += count
                if new_id in new:
                    where[new].add(index)
                    risen.add(new)
            words[index] = merged
        pair_counts.pop(pair, None)
        for new in risen:
            heapq.heappush(heap, (-pair_counts[new], new))
        if on_merge is not None:
            on_merge()
    return merges


def _merge_word(word: list[int], left: int, right: int, new_id: int) -> list[int]:
    """``word`` with every non-overlapping ``left right`` (scanning left to right) replaced."""
    merged: list[int] = []
    index, end = 0, len(word) - 1
    while index <= end:
        if index < end and word[index] == left and word[index + 1] == right:
            merged.append(new_id)
            index += 2
        else:
            merged.append(word[index])
            index += 1
    return merged
