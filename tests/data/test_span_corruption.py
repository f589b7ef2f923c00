"""T5's span corruption against a reimplementation of T5's reference semantics (written here from
``t5.data.preprocessors``: ``random_spans_helper``, ``random_spans_noise_mask``, ``noise_span_to_unique_sentinel``):
the lengths for several (inputs length, density, span length) settings, the exact noise and span counts of
thousands of random lengths, the distribution of span lengths and of noise over positions, the sentinel
layout of the paper's example and of T5's tokenizer, and inputs + targets giving back the text."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from tformer.data.span_corruption import (
    corrupt_spans,
    corrupted_lengths,
    noise_counts,
    random_spans_noise_mask,
    sentinel_ids,
    span_corruption_lengths,
)
from tformer.errors import TformerError
from tformer.tokenizers import WordPieceTokenizer

# ---- T5's reference semantics, reimplemented for the comparison -------------------------------------------------

def reference_helper(inputs_length: int, density: float, mean_span: float) -> tuple[int, int]:
    def lengths(tokens):
        noise = int(round(tokens * density))
        spans = int(round(noise / mean_span))
        return tokens - noise + spans + 1, noise + spans + 1
    tokens = inputs_length - 1
    while lengths(tokens + 1)[0] <= inputs_length:
        tokens += 1
    inputs, targets = lengths(tokens)
    if density == 0.5 and targets > inputs:
        tokens, targets = tokens - 1, targets - 1
    return tokens, targets


def reference_mask(length: int, density: float, mean_span: float, rng: np.random.Generator) -> np.ndarray:
    noise = int(np.round(length * density))
    noise = min(max(noise, 1), length - 1)
    spans = max(int(np.round(noise / mean_span)), 1)

    def segmentation(items, segments):
        first = np.arange(items - 1) < segments - 1
        rng.shuffle(first)
        segment = np.cumsum(np.pad(first, [[1, 0]]))
        return np.bincount(segment, minlength=segments)

    interleaved = np.stack([segmentation(length - noise, spans), segmentation(noise, spans)], axis=1).reshape(-1)
    indicator = np.zeros(length, dtype=np.int64)
    indicator[np.cumsum(interleaved)[:-1]] = 1
    return np.cumsum(indicator) % 2 == 1


def reference_sentinels(tokens: list[int], noise: list[bool], vocab_size: int) -> list[int]:
    """T5's noise_span_to_unique_sentinel: the first token of a span becomes vocab_size - 1 - k."""
    out, span = [], 0
    for index, (token, is_noise) in enumerate(zip(tokens, noise, strict=True)):
        if is_noise and (index == 0 or not noise[index - 1]):
            out.append(vocab_size - 1 - span)
            span += 1
        elif not is_noise:
            out.append(token)
    return out


def runs(mask: torch.Tensor) -> list[tuple[bool, int]]:
    """(value, length) of each run of a 1-D bool tensor."""
    values = mask.tolist()
    result: list[tuple[bool, int]] = []
    for value in values:
        if result and result[-1][0] == value:
            result[-1] = (value, result[-1][1] + 1)
        else:
            result.append((value, 1))
    return result


# ---- lengths ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("inputs_length, density, mean_span", [
    (512, 0.15, 3.0), (128, 0.15, 3.0), (256, 0.15, 3.0), (114, 0.15, 3.0), (64, 0.3, 8.0), (512, 0.5, 3.0),
    (100, 0.5, 1.0), (1024, 0.15, 10.0), (20, 0.15, 3.0), (3, 0.15, 3.0)])
def test_lengths_equal_t5s_random_spans_helper(inputs_length, density, mean_span):
    tokens, targets = span_corruption_lengths(inputs_length, density, mean_span)
    assert (tokens, targets) == reference_helper(inputs_length, density, mean_span)
    if round(round(tokens * density) / mean_span) == 0:
        return  # a row too short for one span by T5's rounding: its mask still makes one (as T5's does)
    got_inputs, got_targets = corrupted_lengths(tokens, density, mean_span)
    if density != 0.5:  # the density-0.5 adjustment shortens the text by one (T5 pads its inputs then)
        assert (got_inputs, got_targets) == (inputs_length, targets)  # packed rows fill the inputs exactly


def test_t5s_published_lengths():
    """run_t5_mlm_flax and T5's span-corruption task: 568 text tokens make 512 inputs and 114 targets."""
    assert span_corruption_lengths(512) == (568, 114)
    assert corrupted_lengths(568) == (512, 114)


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(TformerError, match=r"noise_density=1.5 must be a number in \(0, 1\)"):
        span_corruption_lengths(128, 1.5)
    with pytest.raises(TformerError, match="mean_noise_span_length=0.5 must be a number >= 1"):
        noise_counts(100, 0.15, 0.5)
    with pytest.raises(TformerError, match="at least 2 tokens"):
        noise_counts(1)
    with pytest.raises(TformerError, match="only 1 kept tokens"):
        noise_counts(10, 0.9, 1.0)


# ---- the noise mask ------------------------------------------------------------------------------------------

@pytest.mark.slow  # 3,000 masks, each beside T5's
def test_counts_and_layout_equal_t5s_for_many_random_lengths():
    """For 3,000 random (length, density, span, seed): T5's noise and span counts exactly, spans alternating
    kept/noise, kept first and noise last, as T5's mask is."""
    rng = random.Random(0)
    numpy_rng = np.random.default_rng(0)
    for trial in range(3000):
        length = rng.randint(2, 700)
        density, mean_span = rng.choice([(0.15, 3.0), (0.15, 3.0), (0.3, 5.0), (0.1, 2.0), (0.5, 3.0)])
        try:
            noise, spans = noise_counts(length, density, mean_span)
        except TformerError:  # more spans than kept tokens: T5's own mask degenerates there
            continue
        mask = random_spans_noise_mask(1, length, torch.Generator().manual_seed(trial), density, mean_span)[0]
        expected = reference_mask(length, density, mean_span, numpy_rng)
        assert int(mask.sum()) == noise == int(expected.sum())
        pieces = runs(mask)
        assert len(pieces) == 2 * spans == len(runs(torch.from_numpy(expected)))
        assert [value for value, _ in pieces] == [False, True] * spans


def exact_part_length(items: int, parts: int, size: int) -> float:
    """P(the first part has ``size`` items) for a uniformly random composition of ``items`` into ``parts``."""
    return math.comb(items - size - 1, parts - 2) / math.comb(items - 1, parts - 1)


def test_span_lengths_follow_t5s_distribution():
    """Rows of 100 tokens (15 noise in 5 spans, 85 kept in 5 spans): the first noise span's length and the
    first kept span's, over 20,000 independent rows, within 5 standard errors of the exact probabilities
    of a uniform composition (sqrt(p(1 - p) / N), at most 0.0035 here); the mean noise span length is
    exactly 15 / 5 = 3 in every row."""
    rows = 20_000
    mask = random_spans_noise_mask(rows, 100, torch.Generator().manual_seed(1))
    assert torch.all(mask.sum(dim=1) == 15)
    starts = mask & ~torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)
    assert torch.all(starts.sum(dim=1) == 5)
    first_kept = (mask.long().argmax(dim=1))  # the kept run before the first noise token
    after = torch.where(torch.arange(100) >= first_kept[:, None], ~mask, torch.zeros_like(mask))
    first_noise = (after.long().argmax(dim=1)) - first_kept
    for observed, items in ((first_noise, 15), (first_kept, 85)):
        for size in range(1, 12):
            p = exact_part_length(items, 5, size)
            share = float((observed == size).double().mean())
            assert abs(share - p) < 5 * math.sqrt(p * (1 - p) / rows) + 1e-9, (items, size, share, p)


@pytest.mark.slow  # 20,000 rows of T5's (reimplemented) mask, one at a time
def test_noise_over_positions_equals_t5s():
    """The share of rows with noise at each of 60 positions: ours against T5's (reimplemented) over 20,000
    rows each, within 5 standard errors of a difference of two proportions (sqrt(2 p (1 - p) / N))."""
    rows, length = 20_000, 60
    ours = random_spans_noise_mask(rows, length, torch.Generator().manual_seed(2)).double().mean(dim=0).numpy()
    rng = np.random.default_rng(2)
    theirs = np.mean([reference_mask(length, 0.15, 3.0, rng) for _ in range(rows)], axis=0)
    pooled = (ours + theirs) / 2
    bound = 5 * np.sqrt(2 * pooled * (1 - pooled) / rows) + 1e-9
    assert np.all(np.abs(ours - theirs) <= bound)
    assert ours[-1] == 1.0 and ours[0] == 0.0  # T5's layout: noise last, kept first


def test_the_same_generator_state_gives_the_same_masks():
    first = random_spans_noise_mask(8, 200, torch.Generator().manual_seed(5))
    assert torch.equal(first, random_spans_noise_mask(8, 200, torch.Generator().manual_seed(5)))
    assert not torch.equal(first, random_spans_noise_mask(8, 200, torch.Generator().manual_seed(6)))


# ---- sentinels and targets -------------------------------------------------------------------------------------

VOCAB = 1000
SENTINELS = [VOCAB - 1 - k for k in range(100)]
EOS = 1


def test_inputs_equal_t5s_and_inputs_with_targets_give_back_the_text():
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(2, VOCAB - 100, (64, 568), generator=generator)
    mask = random_spans_noise_mask(64, 568, generator)
    inputs, targets = corrupt_spans(tokens, mask, SENTINELS, EOS)
    assert inputs.shape == (64, 512) and targets.shape == (64, 114)
    for row in range(64):
        text, noise = tokens[row].tolist(), mask[row].tolist()
        assert inputs[row].tolist() == reference_sentinels(text, noise, VOCAB) + [EOS]
        assert targets[row].tolist() == reference_sentinels(text, [not n for n in noise], VOCAB) + [EOS]
        spans = {}  # sentinel -> the tokens after it in the targets
        for token in targets[row, :-1].tolist():
            if token in SENTINELS:
                current = spans.setdefault(token, [])
            else:
                current.append(token)
        restored = [piece for token in inputs[row, :-1].tolist()
                    for piece in (spans[token] if token in SENTINELS else [token])]
        assert restored == text


def test_the_papers_example():
    """Raffel et al., figure 2: "Thank you <X> me to your party <Y> week." -> "<X> for inviting <Y> last <Z>"."""
    words = "Thank you for inviting me to your party last week .".split()
    ids = torch.arange(10, 10 + len(words))[None]
    noise = torch.tensor([[word in ("for", "inviting", "last") for word in words]])
    inputs, targets = corrupt_spans(ids, noise, SENTINELS, EOS)
    name = {10 + index: word for index, word in enumerate(words)} | {SENTINELS[0]: "<X>", SENTINELS[1]: "<Y>",
                                                                     SENTINELS[2]: "<Z>", EOS: "</s>"}
    assert " ".join(name[i] for i in inputs[0].tolist()) == "Thank you <X> me to your party <Y> week . </s>"
    assert " ".join(name[i] for i in targets[0].tolist()) == "<X> for inviting <Y> last <Z> </s>"


def test_too_few_sentinels_are_refused():
    mask = random_spans_noise_mask(2, 200, torch.Generator().manual_seed(0))
    with pytest.raises(TformerError, match="holds 10 noise spans but there are 3 sentinels"):
        corrupt_spans(torch.zeros(2, 200, dtype=torch.long), mask, SENTINELS[:3], EOS)


def test_sentinels_added_to_a_tokenizer_count_down_from_the_end():
    tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat"])
    ids = sentinel_ids(tokenizer, 5)
    assert ids == [11, 10, 9, 8, 7] and tokenizer.vocab_size == 12
    assert tokenizer.encode("the <extra_id_3> cat", add_special_tokens=False) == [5, 8, 6]
    assert sentinel_ids(tokenizer, 5) == ids  # found, not added twice
    with pytest.raises(TformerError, match="no sentinel tokens"):
        sentinel_ids(WordPieceTokenizer(["[PAD]", "[UNK]", "the"]), may_add=False)


@pytest.mark.slow  # trains a SentencePiece model and imports transformers
def test_sentinels_of_t5s_tokenizer(tmp_path):
    """A T5 tokenizer as transformers writes it (SentencePiece Unigram with 100 extra ids), read by
    tformer: <extra_id_k> is id len(tokenizer) - 1 - k, as run_t5_mlm_flax and T5 number them."""
    transformers = pytest.importorskip("transformers")
    spm = pytest.importorskip("sentencepiece")
    from t5_folders import t5_tokenizer_folder

    from tformer.tokenizers import load

    folder = t5_tokenizer_folder(tmp_path, transformers, spm)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ids = sentinel_ids(load(folder / "tokenizer.json"), may_add=False)
    assert len(ids) == 100
    assert ids == theirs.convert_tokens_to_ids([f"<extra_id_{k}>" for k in range(100)])
    assert ids == [len(theirs) - 1 - k for k in range(100)]
