"""WordPiece: BERT's normalization and splitting, id-exact with Hugging Face's BERT tokenizer
(uncased) on the real vocabulary, pairs with token_type_ids, and tokenizer.json both ways."""

from __future__ import annotations

import pytest
from shared_data import BERT_DIR, require, tinyshakespeare, unicode_sample

from tformer.tokenizers import TokenizerError, WordPieceTokenizer, load
from tformer.tokenizers.normalizers import BertNormalizer
from tformer.tokenizers.pre_tokenizers import BertPreTokenizer

SENTENCES = [
    "Hello, world! How are you doing today?",
    "Héllo Wörld: naïve café, Ångström, façade, Crème Brûlée; ÉCOLE.",
    "The U.S.A. (United States) -- it's $3.50/hour, isn't it? [yes] {no} <maybe> #1 @home 50% off!!!",
    "中文字符测试，我爱北京天安门。日本語のテキストも。한국어도 있어요.",
    "Mixed: BERT使用了WordPiece分词器 for 中英文 mixed text.",
    "unaffable unbelievably supercalifragilisticexpialidocious antidisestablishmentarianism",
    "Controls\x00 and\u200bzero-width, soft\u00adhyphen, tabs\tand\nnewlines\r\n, nbsp\u00a0here.",
    "Special tokens in text: [CLS] [SEP] [MASK] [PAD] [UNK] stay whole; [cls] does not.",
    "ΟΔΟΣ Ελληνικά, русский ЯЗЫК, İstanbul ǅemal, straße, ﬁne, ½ ²",
    "a" * 101 + " too long for one word, " + "b" * 100 + " just fits",
    "a\u0378b \u0378 unassigned code points (Cn) are kept and become [UNK]",
    "",
    "   ",
]
PAIRS = [
    ("Who was Jim Henson?", "Jim Henson was a puppeteer."),
    ("Héllo, wörld!", "中文 and ünïcode."),
    ("", "empty first"),
    ("only first", ""),
    ("It's [SEP] inside", "and [CLS] here"),
]


@pytest.fixture(scope="module")
def bert() -> WordPieceTokenizer:
    require(BERT_DIR / "vocab.txt")
    return load(BERT_DIR)


@pytest.fixture(scope="module")
def hf_bert():
    require(BERT_DIR / "vocab.txt")
    transformers = pytest.importorskip("transformers")
    return transformers.BertTokenizer.from_pretrained(str(BERT_DIR))


# ---- the pieces ------------------------------------------------------------------------------------


def test_bert_normalizer_cleans_spaces_cjk_accents_case():
    normalize = BertNormalizer()
    assert normalize("Héllo\tWÖRLD\x00\u200b") == "hello world"
    assert normalize("中文ab") == " 中  文 ab"
    assert normalize("ΟΔΟΣ") == "οδοσ"  # accents stripped; "Σ" lowered without final-sigma context
    assert BertNormalizer(lowercase=False)("Héllo") == "Héllo"
    assert BertNormalizer(lowercase=True, strip_accents=False)("Héllo") == "héllo"


def test_unassigned_code_points_are_kept_and_become_unk():
    """U+0378 is unassigned (Cn): Hugging Face keeps it, so the word holding it is [UNK], where
    control (Cc), format (Cf) and private-use (Co) characters are removed."""
    assert BertNormalizer()("a\u0378b \u0378 c\u200bd\x07\ue000") == "a\u0378b \u0378 cd"
    tokenizer = WordPieceTokenizer(["[UNK]", "[CLS]", "[SEP]", "a", "##b"], lowercase=True)
    assert tokenizer.tokenize("a\u0378b \u0378") == ["[UNK]", "[UNK]"]
    assert tokenizer.tokenize("a\u200bb") == ["a", "##b"]


def test_bert_pre_tokenizer_splits_whitespace_and_each_punctuation():
    assert BertPreTokenizer()("it's 3.5 (ok)!!  x") == ["it", "'", "s", "3", ".", "5", "(", "ok", ")", "!", "!", "x"]
    assert BertPreTokenizer()("a\u3000b«c»") == ["a", "b", "«", "c", "»"]


def test_greedy_longest_match_with_continuations_and_unk():
    tokenizer = WordPieceTokenizer(["[UNK]", "un", "##aff", "##able", "a", "##b", "##ble", "aff"], lowercase=True)
    assert tokenizer.tokenize("unaffable") == ["un", "##aff", "##able"]
    assert tokenizer.tokenize("unaffablez affable") == ["[UNK]", "aff", "##able"]
    assert tokenizer.decode(tokenizer.encode("unaffable affable", add_special_tokens=False)) == "unaffable affable"
    with pytest.raises(TokenizerError, match="unk_token"):
        WordPieceTokenizer(["a", "b"])


# ---- parity with Hugging Face on the real BERT vocabulary -------------------------------------------------


@pytest.mark.slow  # imports transformers
def test_bert_single_sentences_identical_to_hugging_face(bert, hf_bert):
    for text in [*SENTENCES, *unicode_sample().split("\n")]:
        theirs = hf_bert(text)
        ours = bert.encode_batch([text])
        assert ours["input_ids"][0] == theirs["input_ids"], text
        assert ours["token_type_ids"][0] == theirs["token_type_ids"], text
        assert bert.encode(text) == theirs["input_ids"]
        assert bert.encode(text, add_special_tokens=False) == hf_bert(text, add_special_tokens=False)["input_ids"]


@pytest.mark.slow  # imports transformers
def test_bert_pairs_identical_to_hugging_face(bert, hf_bert):
    firsts, seconds = zip(*PAIRS, strict=True)
    theirs = hf_bert(list(firsts), list(seconds))
    ours = bert.encode_batch(list(firsts), list(seconds))
    assert ours["input_ids"] == theirs["input_ids"]
    assert ours["token_type_ids"] == theirs["token_type_ids"]
    assert ours["attention_mask"] == theirs["attention_mask"]
    assert bert.encode(*PAIRS[0]) == theirs["input_ids"][0]
    # "[CLS] who was jim henson ? [SEP]" then "jim henson was a puppet ##eer . [SEP]"
    assert ours["token_type_ids"][0] == [0] * 7 + [1] * 8


@pytest.mark.slow  # imports transformers
def test_bert_identical_to_hugging_face_on_tinyshakespeare(bert, hf_bert):
    text = tinyshakespeare()
    assert bert.encode(text) == hf_bert.backend_tokenizer.encode(text).ids
    lines = text.splitlines()[:5000]
    theirs = hf_bert.backend_tokenizer.encode_batch(list(zip(lines[::2], lines[1::2], strict=False)))
    ours = bert.encode_batch(lines[::2], lines[1::2])
    assert ours.input_ids == [encoding.ids for encoding in theirs]
    assert ours.token_type_ids == [encoding.type_ids for encoding in theirs]


def test_bert_known_ids(bert):
    assert bert.encode("Hello, world!") == [101, 7592, 1010, 2088, 999, 102]
    assert (bert.pad_token_id, bert.unk_token_id, bert.cls_token_id, bert.sep_token_id, bert.mask_token_id) == (
        0, 100, 101, 102, 103)


@pytest.mark.slow  # imports transformers
def test_bert_decode_identical_to_hugging_face(bert, hf_bert):
    backend = hf_bert.backend_tokenizer
    for text in SENTENCES[:6]:
        ids = bert.encode(text)
        assert bert.decode(ids) == backend.decode(ids, skip_special_tokens=False)
        assert bert.decode(ids, skip_special_tokens=True) == backend.decode(ids, skip_special_tokens=True)


@pytest.mark.slow  # imports transformers
def test_bert_tokenizer_json_both_directions(bert, hf_bert, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    hf_bert.backend_tokenizer.save(str(tmp_path / "theirs.json"))
    ours_from_theirs = load(tmp_path / "theirs.json")
    bert.save(tmp_path / "ours.json")
    theirs_from_ours = tokenizers.Tokenizer.from_file(str(tmp_path / "ours.json"))
    for text in SENTENCES:
        expected = bert.encode(text)
        assert ours_from_theirs.encode(text) == expected
        assert theirs_from_ours.encode(text).ids == expected
    first, second = PAIRS[1]
    encoding = theirs_from_ours.encode(first, second)
    assert encoding.ids == bert.encode(first, second)
    assert encoding.type_ids == bert.encode_batch([first], [second])["token_type_ids"][0]
    assert ours_from_theirs.special_tokens == bert.special_tokens


def test_cased_vocab_option_and_tokenizer_config(bert, tmp_path):
    (tmp_path / "vocab.txt").write_text((BERT_DIR / "vocab.txt").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": false}')
    cased = load(tmp_path)
    assert cased.tokenize("Hello") != bert.tokenize("Hello")  # "H" is not lower-cased, so not "hello"
    assert load(tmp_path, lowercase=True).encode("Hello") == bert.encode("Hello")


@pytest.mark.slow  # imports transformers
def test_added_tokens_match_hugging_face(bert, hf_bert, tmp_path):
    """Added tokens are matched after normalization (so "HELLO WORLD" finds "Hello World"),
    special ones in the raw text; ids, tokens and decoding as in `tokenizers`."""
    tokenizers = pytest.importorskip("tokenizers")
    hf_bert.backend_tokenizer.save(str(tmp_path / "bert.json"))
    theirs = tokenizers.Tokenizer.from_file(str(tmp_path / "bert.json"))
    ours = load(tmp_path / "bert.json")
    for tokenizer in (ours, theirs):
        tokenizer.add_tokens(["Hello World", "<tool>", "ünï"])
    theirs.add_special_tokens([tokenizers.AddedToken("<sp>", special=True, normalized=False)])
    ours.add_special_tokens(["<sp>"])
    for text in ["hello world and HELLO WORLD<tool> x<sp>y ÜNÏ ünïcode", *SENTENCES[:4]]:
        encoding = theirs.encode(text)
        assert ours.encode(text) == encoding.ids
        assert ours.tokenize(text, add_special_tokens=True) == encoding.tokens
        assert ours.decode(encoding.ids) == theirs.decode(encoding.ids, skip_special_tokens=False)
        assert ours.decode(encoding.ids, skip_special_tokens=True) == theirs.decode(encoding.ids)
