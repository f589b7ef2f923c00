"""Byte-level BPE: round trips, the merge algorithm, and id-exact parity with Hugging Face's
GPT-2 tokenizer on the real GPT-2 files."""

from __future__ import annotations

import json
import shutil
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shared_data import GPT2_DIR, require, tinyshakespeare, unicode_sample

from tformer.tokenizers import BPETokenizer, TokenizerError, load
from tformer.tokenizers.byte_level import BYTE_TO_CHAR, GPT2_PATTERN, PreTokenizer, to_byte_chars

# Text with no lone surrogates (those cannot be UTF-8 encoded), everything else allowed:
# emoji, combining marks, control characters, any script.
any_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200)

SMALL_CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Pack my box with five dozen liquor jugs!\n",
    "héllo wörld — ünïcödé, 日本語, emoji 😀👍🏽\n",
    "it's they're we've 12345 678.9 $$$ ... !!! \t\t tabs\n",
]


@pytest.fixture(scope="module")
def small_bpe() -> BPETokenizer:
    return BPETokenizer.train(SMALL_CORPUS * 5, vocab_size=400, min_frequency=2)


@pytest.fixture(scope="module")
def gpt2() -> BPETokenizer:
    require(GPT2_DIR / "encoder.json", GPT2_DIR / "vocab.bpe")
    return load(GPT2_DIR)


@pytest.fixture(scope="module")
def hf_gpt2():
    """Hugging Face's GPT-2 tokenizer (transformers, backed by `tokenizers`) from the same files."""
    require(GPT2_DIR / "encoder.json", GPT2_DIR / "vocab.bpe")
    transformers = pytest.importorskip("transformers")
    import tempfile

    folder = tempfile.mkdtemp()
    shutil.copy(GPT2_DIR / "encoder.json", f"{folder}/vocab.json")
    shutil.copy(GPT2_DIR / "vocab.bpe", f"{folder}/merges.txt")
    tokenizer = transformers.GPT2Tokenizer.from_pretrained(folder)
    shutil.rmtree(folder)
    return tokenizer


# ---- byte level ---------------------------------------------------------------------------------


def test_byte_alphabet_is_256_distinct_printable_characters():
    assert len(set(BYTE_TO_CHAR)) == 256
    assert BYTE_TO_CHAR[ord("A")] == "A" and BYTE_TO_CHAR[ord(" ")] == "Ġ" and BYTE_TO_CHAR[ord("\n")] == "Ċ"
    assert all(not char.isspace() and char.isprintable() for char in BYTE_TO_CHAR)
    assert to_byte_chars(" é") == "ĠÃ©"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=80))
def test_ascii_fast_path_cuts_like_the_unicode_regex(text):
    import regex

    assert PreTokenizer(GPT2_PATTERN)(text) == regex.findall(GPT2_PATTERN, text)


@settings(max_examples=200, deadline=None)
@given(any_text)
def test_pre_tokenizer_words_tile_the_text(text):
    assert "".join(PreTokenizer()(text)) == text


# ---- round trip and the merge algorithm -------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(any_text)
def test_round_trip_any_unicode(small_bpe, text):
    assert small_bpe.decode(small_bpe.encode(text)) == text


def _merge_by_scan(tokenizer: BPETokenizer, word: str) -> list[int]:
    """The textbook algorithm (GPT-2's encoder.py): merge every occurrence of the lowest-ranked
    pair, repeat. The heap-based implementation must agree with it."""
    ids = [tokenizer.token_to_id(BYTE_TO_CHAR[byte]) for byte in word.encode("utf-8")]
    ranks = {pair: rank for rank, pair in enumerate(tokenizer.merges)}
    while len(ids) > 1:
        tokens = [tokenizer.id_to_token(i) for i in ids]
        pairs = list(pairwise(tokens))
        best = min(pairs, key=lambda pair: ranks.get(pair, float("inf")))
        if best not in ranks:
            break
        merged, index = [], 0
        while index < len(ids):
            if index + 1 < len(ids) and (tokens[index], tokens[index + 1]) == best:
                merged.append(tokenizer.token_to_id(best[0] + best[1]))
                index += 2
            else:
                merged.append(ids[index])
                index += 1
        ids = merged
    return ids


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="aabbcdeé o.!\n", max_size=60) | st.text(max_size=30))
def test_heap_merging_equals_the_textbook_scan(small_bpe, word):
    assert small_bpe._encode_word(word) == _merge_by_scan(small_bpe, word)


def test_long_run_of_one_character_is_fast_and_exact(small_bpe):
    text = "a" * 20000 + " " * 20000 + "!" * 20000
    ids = small_bpe.encode(text)
    assert small_bpe.decode(ids) == text
    assert small_bpe._encode_word("!" * 501) == _merge_by_scan(small_bpe, "!" * 501)


def test_cache_does_not_change_results(small_bpe):
    text = " ".join(SMALL_CORPUS)
    first = small_bpe.encode(text)
    small_bpe._clear_cache()
    assert small_bpe.encode(text) == first


# ---- special and added tokens -------------------------------------------------------------------------


def test_special_tokens_are_never_split(small_bpe):
    eot = small_bpe.token_to_id("<|endoftext|>")
    assert eot == 0 and small_bpe.eos_token_id == 0 and small_bpe.bos_token_id == 0
    ids = small_bpe.encode("fox<|endoftext|>dog <|endoftext|><|endoftext|>")
    assert ids.count(eot) == 3
    assert small_bpe.decode(ids) == "fox<|endoftext|>dog <|endoftext|><|endoftext|>"
    assert small_bpe.decode(ids, skip_special_tokens=True) == "foxdog "


def test_added_tokens_get_new_ids_and_stay_whole():
    tokenizer = BPETokenizer.train(SMALL_CORPUS, vocab_size=300, min_frequency=1)
    size = tokenizer.vocab_size
    assert tokenizer.add_tokens(["<tool>", "fox jumps"]) == 2
    assert tokenizer.add_special_tokens({"pad": "<pad>"}) == 1
    assert tokenizer.vocab_size == size + 3 and tokenizer.pad_token_id == size + 2
    ids = tokenizer.encode("a fox jumps<tool>!")
    assert tokenizer.token_to_id("fox jumps") in ids and tokenizer.token_to_id("<tool>") in ids
    assert tokenizer.decode(ids) == "a fox jumps<tool>!"
    assert tokenizer.decode(ids + [tokenizer.pad_token_id], skip_special_tokens=True) == "a fox jumps<tool>!"


# ---- parity with Hugging Face on the real GPT-2 files ------------------------------------------------


@pytest.mark.slow  # imports transformers
def test_gpt2_ids_identical_to_hugging_face_on_tinyshakespeare(gpt2, hf_gpt2):
    text = tinyshakespeare()
    ours = gpt2.encode(text)
    theirs = hf_gpt2.backend_tokenizer.encode(text).ids
    assert len(ours) == len(theirs) == 338025
    assert ours == theirs
    lines = text.splitlines(keepends=True)[:2000]
    assert gpt2.encode_batch(lines)["input_ids"] == [e.ids for e in hf_gpt2.backend_tokenizer.encode_batch(lines)]


@pytest.mark.slow  # imports transformers
def test_gpt2_ids_identical_to_hugging_face_on_unicode(gpt2, hf_gpt2):
    sample = unicode_sample() + "<|endoftext|>" + unicode_sample()[::-1]
    assert gpt2.encode(sample) == hf_gpt2(sample)["input_ids"]
    for line in sample.split("\n"):
        assert gpt2.encode(line) == hf_gpt2(line)["input_ids"], line
    assert gpt2.decode(gpt2.encode(sample)) == sample


@pytest.mark.slow  # imports transformers
def test_gpt2_decode_identical_to_hugging_face(gpt2, hf_gpt2):
    ids = gpt2.encode(unicode_sample())
    for cut in (ids, ids[:7], ids[3:50], [50256, 31373, 50256]):
        assert gpt2.decode(cut) == hf_gpt2.backend_tokenizer.decode(cut, skip_special_tokens=False)
        assert gpt2.decode(cut, skip_special_tokens=True) == hf_gpt2.backend_tokenizer.decode(cut)
    half_emoji = gpt2.encode(" 😀")[:1]  # " " and the first bytes of the emoji: invalid UTF-8 alone
    assert gpt2.decode(half_emoji) == " \ufffd" == hf_gpt2.backend_tokenizer.decode(half_emoji)


def test_gpt2_known_ids(gpt2):
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode(" Hello world") == [18435, 995]
    assert gpt2.vocab_size == 50257 and gpt2.eos_token == "<|endoftext|>" and gpt2.pad_token is None
    assert gpt2.encode("Hello", add_special_tokens=True) == [15496]  # GPT-2 adds none


def test_gpt2_file_layouts_load_the_same(gpt2, tmp_path):
    shutil.copy(GPT2_DIR / "encoder.json", tmp_path / "vocab.json")
    shutil.copy(GPT2_DIR / "vocab.bpe", tmp_path / "merges.txt")
    from_folder = load(tmp_path)
    from_vocab_file = load(tmp_path / "vocab.json")
    from_gpt2_file = load(GPT2_DIR / "encoder.json")
    from_merges_file = load(tmp_path / "merges.txt")
    text = unicode_sample()
    assert from_folder.encode(text) == from_vocab_file.encode(text) == from_gpt2_file.encode(text) == gpt2.encode(text)
    assert from_merges_file.encode(text) == gpt2.encode(text)


@pytest.mark.slow  # imports transformers
def test_gpt2_tokenizer_json_both_directions(gpt2, hf_gpt2, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    text = unicode_sample() + tinyshakespeare()[:20000]
    # Saved here, loaded by Hugging Face.
    gpt2.save(tmp_path / "ours.json")
    theirs_from_ours = tokenizers.Tokenizer.from_file(str(tmp_path / "ours.json"))
    assert theirs_from_ours.encode(text).ids == gpt2.encode(text)
    # Saved by Hugging Face, loaded here.
    hf_gpt2.backend_tokenizer.save(str(tmp_path / "theirs.json"))
    ours_from_theirs = load(tmp_path / "theirs.json")
    assert ours_from_theirs.encode(text) == gpt2.encode(text)
    assert ours_from_theirs.eos_token == "<|endoftext|>"
    merges = json.loads((tmp_path / "theirs.json").read_text())["model"]["merges"]
    assert ours_from_theirs.merges == [tuple(pair) for pair in merges] == gpt2.merges


@pytest.mark.slow  # imports tokenizers
def test_llama3_style_pattern_and_ignore_merges_match_hugging_face(small_bpe, tmp_path):
    """A tokenizer.json with a custom Split regex + ByteLevel and ignore_merges (the Llama-3 /
    GPT-4 layout) encodes like Hugging Face."""
    tokenizers = pytest.importorskip("tokenizers")
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    document = small_bpe.to_dict()
    document["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    document["model"]["ignore_merges"] = True
    (tmp_path / "tokenizer.json").write_text(json.dumps(document))
    ours = load(tmp_path)
    theirs = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = " ".join(SMALL_CORPUS) + unicode_sample() + " 1234567 IT'S It'S\r\n\r\n x"
    assert ours.encode(text) == theirs.encode(text).ids
    assert ours.decode(ours.encode(text)) == text
    ours.save(tmp_path / "again.json")
    assert tokenizers.Tokenizer.from_file(str(tmp_path / "again.json")).encode(text).ids == ours.encode(text)


def test_bpe_from_bad_merges_names_the_merge():
    with pytest.raises(TokenizerError, match=r"merge 0 \('a' 'q'\): 'q' is not in the vocabulary"):
        BPETokenizer({"a": 0, "b": 1, "ab": 2}, [("a", "q")])


@pytest.mark.slow  # imports transformers
def test_added_tokens_match_hugging_face(gpt2, hf_gpt2, tmp_path):
    """Added tokens (plain, special, whitespace-stripping, whole-word) split text exactly as in
    `tokenizers`, and survive a tokenizer.json round trip in both directions."""
    tokenizers = pytest.importorskip("tokenizers")
    hf_gpt2.backend_tokenizer.save(str(tmp_path / "gpt2.json"))
    theirs = tokenizers.Tokenizer.from_file(str(tmp_path / "gpt2.json"))
    theirs.add_tokens(["<tool>", "fox jumps", tokenizers.AddedToken("<mask>", lstrip=True, rstrip=True),
                       tokenizers.AddedToken("cat", single_word=True)])
    theirs.add_special_tokens(["<|im_start|>"])
    theirs.save(str(tmp_path / "added.json"))
    ours = load(tmp_path / "added.json")
    text = ("the fox jumps<tool>over <mask>  dogs; a cat, concatenate cats cat\n<|im_start|>user "
            "<|endoftext|>  <mask>\t" + unicode_sample())
    assert ours.encode(text) == theirs.encode(text).ids
    lines = text.splitlines()
    assert ours.encode_batch(lines).input_ids == [encoding.ids for encoding in theirs.encode_batch(lines)]
    assert ours.decode(ours.encode(text)) == theirs.decode(theirs.encode(text).ids, skip_special_tokens=False)
    assert ours.special_token_ids == {50256, ours.token_to_id("<|im_start|>")}
    ours.save(tmp_path / "ours.json")
    assert tokenizers.Tokenizer.from_file(str(tmp_path / "ours.json")).encode(text).ids == ours.encode(text)
