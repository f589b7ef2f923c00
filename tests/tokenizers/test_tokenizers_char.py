"""CharTokenizer: the shared interface, its tokenizer.json (which `tokenizers` reads with the same
ids), tformer's older "Char" layout, and a checkpoint carrying it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tformer
from tformer.tokenizers import CharTokenizer, load

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\tSpeak, speak!"


@pytest.fixture
def chars() -> CharTokenizer:
    return CharTokenizer.train(TEXT)


def test_ids_are_unk_then_sorted_characters(chars):
    assert chars.id_to_token(0) == "<unk>" and chars.unk_token_id == 0
    assert [chars.id_to_token(i) for i in range(1, chars.vocab_size)] == sorted(set(TEXT))
    assert chars.encode("Speak") == [chars.token_to_id(c) for c in "Speak"]
    assert chars.encode("Speak§")[-1] == 0
    assert chars.decode(chars.encode("Speak§")) == "Speak<unk>"
    assert chars.decode(chars.encode("Speak§"), skip_special_tokens=True) == "Speak"


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=sorted(set(TEXT)), max_size=100))
def test_round_trip_over_the_alphabet(text):
    tokenizer = CharTokenizer.train(TEXT)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_batch_and_special_tokens():
    tokenizer = CharTokenizer.train(TEXT, special_tokens=["<unk>", "<pad>", "<eos>"])
    assert (tokenizer.unk_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    batch = tokenizer.encode_batch(["ab", "Speak<eos>"], padding=True, return_tensors="pt")
    assert batch.input_ids.shape == (2, 6) and batch.input_ids[1, -1].item() == 2
    assert batch.input_ids[0, 2:].tolist() == [1, 1, 1, 1]


@pytest.mark.slow  # imports tokenizers
def test_tokenizer_json_loads_in_hugging_face_with_same_ids(chars, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    chars.save(tmp_path)
    theirs = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    sample = TEXT + " ünknown\r\n\n<unk>"
    assert theirs.encode(sample).ids == chars.encode(sample)
    assert theirs.decode(chars.encode(TEXT)) == TEXT
    reloaded = load(tmp_path)
    assert isinstance(reloaded, CharTokenizer) and reloaded.encode(sample) == chars.encode(sample)
    assert reloaded.fingerprint() == chars.fingerprint()


def test_legacy_char_layout_still_loads(tmp_path):
    legacy = {"version": "1.0",
              "model": {"type": "Char", "vocab": ["<unk>", "\n", " ", "a", "b"], "unk_token": "<unk>"}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(legacy))
    tokenizer = load(tmp_path / "tokenizer.json")
    assert tokenizer.encode("ab \nz") == [3, 4, 2, 1, 0]


def test_checkpoint_carries_the_tokenizer(chars, tmp_path):
    model = tformer.build_model("gpt-nano", vocab_size=chars.vocab_size)
    model.tokenizer = chars
    model.save(tmp_path / "checkpoint")
    loaded = tformer.load(tmp_path / "checkpoint")
    assert isinstance(loaded.tokenizer, CharTokenizer)
    assert loaded.tokenizer.encode(TEXT) == chars.encode(TEXT)
