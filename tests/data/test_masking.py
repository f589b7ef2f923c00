"""Masked-LM inputs and pretraining rows: BERT's 15% / 80-10-10 rule measured over more than 100k
tokens, special tokens and padding never chosen, whole words kept whole, the same generator state giving
the same masks; next-sentence pairs laid out as [CLS] A [SEP] B [SEP] with half of B the true next text;
packing keeps every token in order."""

from __future__ import annotations

import random

import pytest
import torch
from shared_data import BERT_DIR, require

from tformer.data.masking import IGNORE_INDEX, mask_tokens, wordpiece_continuations
from tformer.data.pretraining import next_sentence_pairs, packed_sequences
from tformer.errors import TformerError

PAD, CLS, SEP, MASK = 0, 1, 2, 3
SPECIAL = [PAD, CLS, SEP, MASK]
VOCAB = 1000


def padded_batch(rows: int = 1500, length: int = 128, seed: int = 0) -> torch.Tensor:
    """(rows, length) ids: [CLS] text [SEP] then padding, text lengths varying."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(len(SPECIAL), VOCAB, (rows, length), generator=generator)
    lengths = torch.randint(length // 4, length - 1, (rows,), generator=generator)
    positions = torch.arange(length)
    ids[positions >= lengths[:, None] + 1] = PAD
    ids[:, 0] = CLS
    ids[torch.arange(rows), lengths] = SEP
    return ids


def mask(ids, seed=1, **kwargs):
    return mask_tokens(ids, torch.Generator().manual_seed(seed), special_ids=SPECIAL, vocab_size=VOCAB,
                       mask_id=MASK, **kwargs)


def test_masking_statistics():
    ids = padded_batch()
    eligible = ids >= len(SPECIAL)
    assert eligible.sum() > 100_000
    masked, labels = mask(ids)
    chosen = labels != IGNORE_INDEX
    assert not (chosen & ~eligible).any()  # no special token, no padding
    assert torch.equal(labels[chosen], ids[chosen]) and torch.equal(masked[~chosen], ids[~chosen])
    assert abs(chosen.sum() / eligible.sum() - 0.15) < 0.005
    num_chosen = chosen.sum()
    as_mask = (masked[chosen] == MASK).sum() / num_chosen
    unchanged = (masked[chosen] == ids[chosen]).sum() / num_chosen
    replaced = 1 - as_mask - unchanged
    assert abs(as_mask - 0.8) < 0.01 and abs(replaced - 0.1) < 0.01 and abs(unchanged - 0.1) < 0.01
    assert not (masked[chosen & (masked != MASK)] < len(SPECIAL)).any()  # a random token is never special
    # per row: floor(0.15 * eligible + u) tokens, so never more than one away from 15%
    per_row = chosen.sum(1).double() - 0.15 * eligible.sum(1)
    assert per_row.min() > -1 and per_row.max() < 1


def test_configurable_probabilities():
    ids = padded_batch(rows=200)
    masked, labels = mask(ids, mask_probability=0.3, replace_with_mask=1.0, replace_with_random=0.0)
    chosen = labels != IGNORE_INDEX
    assert abs(chosen.sum() / (ids >= len(SPECIAL)).sum() - 0.3) < 0.01
    assert torch.equal(masked[chosen], torch.full_like(masked[chosen], MASK))
    with pytest.raises(TformerError, match="replace_with_mask \\+ replace_with_random = 1.2 exceeds 1"):
        mask(ids, replace_with_mask=0.9, replace_with_random=0.3)
    with pytest.raises(TformerError, match="mask_probability=1.5 must be a number in \\[0, 1\\]"):
        mask(ids, mask_probability=1.5)
    with pytest.raises(TformerError, match="special_ids=\\[0, 1000\\] must lie in the vocabulary \\(0..999\\)"):
        mask_tokens(ids, torch.Generator(), special_ids=[0, 1000], vocab_size=VOCAB, mask_id=MASK)
    with pytest.raises(TformerError, match="token ids must lie in 0..999, got 0..1000"):
        mask(torch.tensor([[0, 1000]]))


def test_masks_are_a_function_of_the_generator_state():
    ids = padded_batch(rows=64)
    first = mask(ids, seed=5)
    again = mask(ids, seed=5)
    other = mask(ids, seed=6)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[1], other[1])
    # The draws do not depend on the content: the generator is left in the same state for any ids.
    generator_a, generator_b = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    mask_tokens(ids, generator_a, special_ids=SPECIAL, vocab_size=VOCAB, mask_id=MASK)
    mask_tokens(padded_batch(rows=64, seed=3), generator_b, special_ids=SPECIAL, vocab_size=VOCAB, mask_id=MASK)
    assert torch.equal(generator_a.get_state(), generator_b.get_state())


def test_whole_word_masking_never_splits_a_word():
    ids = padded_batch(rows=800)
    continuation = torch.zeros(VOCAB, dtype=torch.bool)
    continuation[600:] = True  # ids 600.. are "##" pieces: words of about 2.5 tokens
    masked, labels = mask(ids, continuation=continuation)
    chosen = labels != IGNORE_INDEX
    eligible = ids >= len(SPECIAL)
    assert not (chosen & ~eligible).any()
    continues = continuation[ids] & eligible & torch.nn.functional.pad(eligible[:, :-1], (1, 0))
    # a continuation piece is chosen exactly when the token before it is
    previous_chosen = torch.nn.functional.pad(chosen[:, :-1], (1, 0))
    assert torch.equal(chosen[continues], previous_chosen[continues])
    assert abs(chosen.sum() / eligible.sum() - 0.15) < 0.005
    as_mask = (masked[chosen] == MASK).double().mean()
    assert abs(as_mask - 0.8) < 0.01  # 80/10/10 per token, as BERT's whole-word masking


def test_wordpiece_continuations_from_the_bert_vocabulary():
    require(BERT_DIR / "vocab.txt")
    tokens = (BERT_DIR / "vocab.txt").read_text(encoding="utf-8").splitlines()
    table = wordpiece_continuations(tokens)
    assert table.shape == (30522,) and table[tokens.index("##ing")] and not table[tokens.index("[MASK]")]
    assert torch.equal(wordpiece_continuations({token: index for index, token in enumerate(tokens)}), table)
    with pytest.raises(TformerError, match="continuation must be a \\(1000,\\) bool table"):
        mask(padded_batch(rows=2), continuation=table)


# ---- pretraining rows -------------------------------------------------------------------------------------


def documents(seed: int = 0, count: int = 300):
    rng = random.Random(seed)
    return [[[rng.randrange(10, VOCAB) for _ in range(rng.randint(3, 25))] for _ in range(rng.randint(1, 30))]
            for _ in range(count)]


def test_next_sentence_pairs_layout_and_balance():
    docs = documents()
    rows = next_sentence_pairs(docs, 64, cls_id=CLS, sep_id=SEP, pad_id=PAD, seed=0)
    assert rows.input_ids.shape == (len(rows), 64) and len(rows) > 500
    assert abs(rows.next_sentence_label.double().mean() - 0.5) < 0.05
    for row in range(len(rows)):
        ids, types, attention = rows.input_ids[row], rows.token_type_ids[row], rows.attention_mask[row]
        length = int(attention.sum())
        separators = (ids[:length] == SEP).nonzero().squeeze(1).tolist()
        assert ids[0] == CLS and len(separators) == 2 and separators[1] == length - 1
        assert (ids[length:] == PAD).all() and not attention[length:].any()
        assert (types[: separators[0] + 1] == 0).all() and (types[separators[0] + 1 : length] == 1).all()
        assert not types[length:].any() and separators[0] >= 2 and separators[1] > separators[0] + 1
    # rows long enough that nothing is trimmed (documents hold <= 750 tokens): a "next" B continues A's text
    docs = docs[:100]
    long_rows = next_sentence_pairs(docs, 2048, cls_id=CLS, sep_id=SEP, pad_id=PAD, seed=0,
                                    short_seq_probability=0.0)
    texts = [[t for s in doc for t in s] for doc in docs]
    sentence_starts = {}  # first token -> (document, offset) of each sentence starting with it
    for d, doc in enumerate(docs):
        offset = 0
        for sentence in doc:
            sentence_starts.setdefault(sentence[0], []).append((d, offset))
            offset += len(sentence)
    for row in range(len(long_rows)):
        ids = long_rows.input_ids[row][: int(long_rows.attention_mask[row].sum())].tolist()
        cut = ids.index(SEP)
        joined = ids[1:cut] + ids[cut + 1 : -1]
        # A starts at a sentence of its document; B is "next" when A + B is that document's text from there
        contiguous = any(texts[d][offset : offset + len(joined)] == joined for d, offset in sentence_starts[ids[1]])
        assert contiguous == bool(long_rows.next_sentence_label[row])


def test_next_sentence_pairs_are_deterministic_and_refuse_bad_input():
    docs = documents(count=50)
    a = next_sentence_pairs(docs, 48, cls_id=CLS, sep_id=SEP, pad_id=PAD, seed=3)
    b = next_sentence_pairs(docs, 48, cls_id=CLS, sep_id=SEP, pad_id=PAD, seed=3)
    c = next_sentence_pairs(docs, 48, cls_id=CLS, sep_id=SEP, pad_id=PAD, seed=4)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.next_sentence_label, b.next_sentence_label)
    assert not torch.equal(a.input_ids[: len(c)], c.input_ids[: len(a)])
    short = next_sentence_pairs(docs, 48, cls_id=CLS, sep_id=SEP, pad_id=PAD, seed=3, short_seq_probability=1.0)
    assert short.attention_mask.sum(1).double().mean() < a.attention_mask.sum(1).double().mean()
    with pytest.raises(TformerError, match="need at least 2 non-empty documents, got 1"):
        next_sentence_pairs([[[5, 6]], [[]]], 16, cls_id=CLS, sep_id=SEP, pad_id=PAD, seed=0)
    with pytest.raises(TformerError, match="max_seq_len=4 is too short"):
        next_sentence_pairs(docs, 4, cls_id=CLS, sep_id=SEP, pad_id=PAD, seed=0)


def test_packing_keeps_every_token_in_order():
    docs = [[[10, 11], [12]], [], [[13, 14, 15, 16]], [[17]]]
    rows = packed_sequences(docs, 6, cls_id=CLS, sep_id=SEP, pad_id=PAD)
    assert rows.input_ids.tolist() == [[CLS, 10, 11, 12, SEP, SEP], [CLS, 13, 14, 15, 16, SEP],
                                       [CLS, SEP, 17, SEP, PAD, PAD]]
    assert rows.attention_mask.tolist() == [[1] * 6, [1] * 6, [1, 1, 1, 1, 0, 0]]
    assert not rows.token_type_ids.any() and rows.next_sentence_label is None
    big = documents(count=400)
    packed = packed_sequences(big, 128, cls_id=CLS, sep_id=SEP, pad_id=PAD)
    body = packed.input_ids[:, 1:-1][packed.attention_mask[:, 1:-1].bool()]
    expected = []
    for doc in big:
        expected += [t for s in doc for t in s] + [SEP]
    assert body.tolist()[: len(expected) - 1] == expected[:-1]
    with pytest.raises(TformerError, match="every document is empty"):
        packed_sequences([[]], 8, cls_id=CLS, sep_id=SEP, pad_id=PAD)
