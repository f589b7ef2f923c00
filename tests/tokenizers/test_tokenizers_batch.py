"""encode_batch: padding on either side, truncation (pairs longest first, as Hugging Face),
attention masks, token_type_ids and tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tformer.tokenizers import BPETokenizer, TokenizerError, WordPieceTokenizer
from tformer.tokenizers.batch import truncate_pair

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog", "##s", ".", "!"]


@pytest.fixture
def wordpiece() -> WordPieceTokenizer:
    return WordPieceTokenizer(VOCAB)


@pytest.fixture
def bpe() -> BPETokenizer:
    return BPETokenizer.train(["the cat sat on the mat. a dog sat on a cat!"] * 10, vocab_size=300)


def test_right_padding_masks_and_types(wordpiece):
    batch = wordpiece.encode_batch(["the cat sat", "dogs!"], padding=True)
    assert batch.input_ids == [[2, 5, 6, 7, 3], [2, 11, 12, 14, 3]]
    batch = wordpiece.encode_batch(["the cat sat on the mat", "dogs"], padding="longest")
    assert batch.input_ids[1] == [2, 11, 12, 3, 0, 0, 0, 0]
    assert batch.attention_mask[1] == [1, 1, 1, 1, 0, 0, 0, 0]
    assert batch.token_type_ids[1] == [0] * 8


def test_left_padding(wordpiece):
    batch = wordpiece.encode_batch(["the cat sat", "a"], padding=True, padding_side="left")
    assert batch.input_ids == [[2, 5, 6, 7, 3], [0, 0, 2, 10, 3]]
    assert batch.attention_mask == [[1] * 5, [0, 0, 1, 1, 1]]


def test_max_length_padding_and_multiple_of(wordpiece):
    batch = wordpiece.encode_batch(["a", "the cat"], padding="max_length", max_length=6)
    assert [len(row) for row in batch.input_ids] == [6, 6]
    batch = wordpiece.encode_batch(["a", "the cat"], padding=True, pad_to_multiple_of=8)
    assert [len(row) for row in batch.input_ids] == [8, 8]


def test_truncation_counts_special_tokens(wordpiece):
    batch = wordpiece.encode_batch(["the cat sat on the mat"], truncation=True, max_length=5)
    assert batch.input_ids == [[2, 5, 6, 7, 3]]
    left = wordpiece.encode_batch(["the cat sat on the mat"], truncation=True, max_length=5, truncation_side="left")
    assert left.input_ids == [[2, 8, 5, 9, 3]]


@pytest.mark.slow  # imports tokenizers
@pytest.mark.parametrize("lengths", [(0, 0), (2, 8), (8, 2), (4, 4), (4, 8), (8, 4), (8, 8), (3, 20), (1, 1)])
@pytest.mark.parametrize("budget", [1, 4, 7, 10])
def test_pair_truncation_matches_hugging_face(lengths, budget):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"w{i}": i for i in range(40)} | {"[UNK]": 40}
    hf = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    hf.enable_truncation(max_length=budget)
    first = [f"w{i}" for i in range(lengths[0])]
    second = [f"w{i}" for i in range(20, 20 + lengths[1])]
    expected = hf.encode(" ".join(first), " ".join(second))
    ids_a, ids_b = truncate_pair(list(range(lengths[0])), list(range(20, 20 + lengths[1])), budget, "right")
    assert ids_a + ids_b == expected.ids


def test_pairs_and_token_types(wordpiece):
    batch = wordpiece.encode_batch(["the cat"], ["a dog"])
    assert batch.input_ids == [[2, 5, 6, 3, 10, 11, 3]]
    assert batch.token_type_ids == [[0, 0, 0, 0, 1, 1, 1]]
    with pytest.raises(TokenizerError, match="2 texts but 1 pairs"):
        wordpiece.encode_batch(["a", "b"], ["c"])


def test_tensors(wordpiece):
    batch = wordpiece.encode_batch(["the cat sat", "a"], padding=True, return_tensors="pt")
    assert batch.input_ids.dtype == torch.long and batch.input_ids.shape == (2, 5)
    assert batch.attention_mask.sum().item() == 8
    assert batch.to("cpu").input_ids.equal(batch.input_ids)
    arrays = wordpiece.encode_batch(["the cat sat", "a"], padding=True, return_tensors="np")
    assert isinstance(arrays["input_ids"], np.ndarray) and arrays["input_ids"].shape == (2, 5)
    with pytest.raises(TokenizerError, match="pass padding=True"):
        wordpiece.encode_batch(["the cat sat", "a"], return_tensors="pt")


def test_bpe_batch_has_no_types_and_needs_a_pad_token(bpe):
    batch = bpe.encode_batch(["the cat", "a dog sat"])
    assert set(batch) == {"input_ids", "attention_mask"}
    assert batch.input_ids == [bpe.encode("the cat"), bpe.encode("a dog sat")]
    with pytest.raises(TokenizerError, match="padding needs a pad token"):
        bpe.encode_batch(["the cat", "a dog sat"], padding=True)
    bpe.add_special_tokens({"pad": "<|endoftext|>"})
    padded = bpe.encode_batch(["the cat", "a dog sat on the mat"], padding=True, padding_side="left",
                              return_tensors="pt")
    assert padded.input_ids[0, 0].item() == bpe.pad_token_id == bpe.eos_token_id
    assert padded.input_ids.shape[1] == len(bpe.encode("a dog sat on the mat"))


def test_decode_batch_and_tensor_ids(wordpiece):
    batch = wordpiece.encode_batch(["the cat sat", "a dog"], padding=True, return_tensors="pt")
    assert wordpiece.decode_batch(batch.input_ids, skip_special_tokens=True) == ["the cat sat", "a dog"]
    assert wordpiece.decode(batch.input_ids[1]) == "[CLS] a dog [SEP] [PAD]"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"padding": "sideways"}, "padding='sideways' is not one of"),
        ({"padding_side": "middle", "padding": True}, "padding_side='middle' is not one of left, right"),
        ({"truncation": True}, "need max_length"),
        ({"truncation": True, "max_length": 2}, "leaves no room for text"),
        ({"max_length": 0}, "max_length=0 must be a positive integer"),
        ({"return_tensors": "tf"}, "return_tensors='tf' is not one of"),
        ({"pad_to_multiple_of": 0, "padding": True}, "pad_to_multiple_of=0"),
    ],
)
def test_bad_batch_options_are_named(wordpiece, options, message):
    with pytest.raises(TokenizerError, match=message):
        wordpiece.encode_batch(["the cat"], **options)


def test_bad_texts_are_named(wordpiece):
    with pytest.raises(TokenizerError, match="texts must be a list of str, got one str"):
        wordpiece.encode_batch("the cat")
    with pytest.raises(TokenizerError, match=r"texts\[1\] must be a str, got int"):
        wordpiece.encode_batch(["the cat", 3])
    with pytest.raises(TokenizerError, match="text must be a str, got bytes"):
        wordpiece.encode(b"the cat")
