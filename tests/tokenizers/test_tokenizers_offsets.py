"""Offsets, word ids, sequence ids, pair truncation strategies and overflowing windows, against
Hugging Face's fast tokenizers on the same inputs: BERT uncased (WordPiece), GPT-2 and a
RoBERTa-style tokenizer built by ``transformers`` from the GPT-2 files (byte-level BPE with the
``<s> A </s></s> B </s>`` template and trimmed offsets); SQuAD question/context windows; and the
answers of SQuAD mapped back to their text through offsets."""

from __future__ import annotations

import gzip
import json
import shutil
from functools import cache

import pytest
from shared_data import BERT_DIR, GPT2_DIR, SHARED_DATA, require, unicode_sample

from tformer.tokenizers import CharTokenizer, Encoding, TokenizerError, WordPieceTokenizer, from_dict, load
from tformer.tokenizers.normalizers import SequenceNormalizer, UnicodeStep

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # compares with transformers
SQUAD_DEV = SHARED_DATA / "squad-v1.1" / "dev-v1.1.json.gz"

TRICKY = [
    "Hello, world! How are you doing today?",
    "Héllo Wörld: naïve café, Ångström, façade, Crème Brûlée; ÉCOLE.",
    "The U.S.A. (United States) -- it's $3.50/hour, isn't it? [yes] {no} <maybe> #1 @home 50% off!!!",
    "中文字符测试，我爱北京天安门。日本語のテキストも。한국어도 있어요.",
    "Mixed: BERT使用了WordPiece分词器 for 中英文 mixed text.",
    "many   spaces\t\ttabs \n\n newlines   ",
    "  leading and trailing  ",
    "Emoji 😀😃 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ and e\u0301 a\u0308 combining; ΟΔΟΣ İstanbul ǅemal straße ﬁne ½",
    "Controls\x00 and\u200bzero-width, soft\u00adhyphen, \x1b[31m\x7f nbsp\u00a0here.",
    "Special tokens in text: [CLS] [SEP] [MASK] and <s> </s> <mask> <|endoftext|> stay whole.",
    "supercalifragilisticexpialidocious " + "a" * 101,
    "",
    " ",
    *unicode_sample().split("\n")[:8],
]
PAIRS = [
    ("Who was Jim Henson?", "Jim Henson was a puppeteer who created the Muppets in 1955 with Jane Nebel."),
    ("Héllo, wörld! 中文 and ünïcode question that is rather long for a question",
     "short pair"),
    ("", "empty first text, so only the pair has tokens to give"),
    ("only first has words here, several of them", ""),
    ("It's [SEP] inside the first", "and [CLS] here 😀 in the second one"),
]
STRATEGIES = ["longest_first", "only_first", "only_second"]


# ---- tokenizers under test, and Hugging Face's -------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_pairs(tmp_path_factory) -> dict:
    """(tformer's, Hugging Face's fast) tokenizer for the same files, by name. The RoBERTa-style
    ones are made by ``transformers`` from GPT-2's vocabulary and merges (without and with
    ``add_prefix_space``) and saved as tokenizer.json, which tformer loads."""
    require(BERT_DIR / "vocab.txt", GPT2_DIR / "encoder.json", GPT2_DIR / "vocab.bpe")
    pairs = {
        "bert": (load(BERT_DIR), transformers.BertTokenizerFast(str(BERT_DIR / "vocab.txt"))),
        "gpt2": (load(GPT2_DIR),
                 transformers.GPT2TokenizerFast(str(GPT2_DIR / "encoder.json"), str(GPT2_DIR / "vocab.bpe"))),
    }
    source = tmp_path_factory.mktemp("roberta-source")
    shutil.copy(GPT2_DIR / "encoder.json", source / "vocab.json")
    shutil.copy(GPT2_DIR / "vocab.bpe", source / "merges.txt")
    for name, add_prefix_space in (("roberta", False), ("roberta-prefix-space", True)):
        hf = transformers.RobertaTokenizerFast(str(source / "vocab.json"), str(source / "merges.txt"),
                                               add_prefix_space=add_prefix_space)
        folder = tmp_path_factory.mktemp(name)
        hf.save_pretrained(str(folder))
        pairs[name] = (load(folder / "tokenizer.json"), hf)
    return pairs


@pytest.fixture(params=["bert", "gpt2", "roberta", "roberta-prefix-space"])
def pair_of_tokenizers(request, tokenizer_pairs):
    return tokenizer_pairs[request.param]


@pytest.fixture
def bert(tokenizer_pairs):
    return tokenizer_pairs["bert"][0]


def _expected(hf_encoding) -> dict:
    """The fields of a ``tokenizers.Encoding`` that tformer's Encoding has."""
    return {"ids": hf_encoding.ids, "type_ids": hf_encoding.type_ids, "tokens": hf_encoding.tokens,
            "offsets": [tuple(offset) for offset in hf_encoding.offsets], "word_ids": hf_encoding.word_ids,
            "sequence_ids": hf_encoding.sequence_ids, "special_tokens_mask": hf_encoding.special_tokens_mask,
            "attention_mask": hf_encoding.attention_mask}


FIELDS = ("ids", "type_ids", "tokens", "offsets", "word_ids", "sequence_ids", "special_tokens_mask", "attention_mask")


def _fields(encoding: Encoding) -> dict:
    return {name: getattr(encoding, name) for name in FIELDS}


def _windows(encoding) -> list:
    return [encoding, *encoding.overflowing]


# ---- single texts and pairs ---------------------------------------------------------------------------


def test_single_texts_match_hugging_face(pair_of_tokenizers):
    ours, hf = pair_of_tokenizers
    backend = hf.backend_tokenizer
    backend.no_truncation()
    for text in TRICKY:
        expected = _expected(backend.encode(text))
        got = _fields(ours.encode_plus(text))
        assert got == expected, text
        assert got["ids"] == ours.encode(text), text  # the offsets path gives the ids path's ids


def test_pairs_without_truncation_match_hugging_face(pair_of_tokenizers):
    ours, hf = pair_of_tokenizers
    backend = hf.backend_tokenizer
    backend.no_truncation()
    for text, pair in PAIRS:
        assert _fields(ours.encode_plus(text, pair)) == _expected(backend.encode(text, pair)), (text, pair)
        assert _fields(ours.encode_plus(text, pair, add_special_tokens=False)) == _expected(
            backend.encode(text, pair, add_special_tokens=False))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("side", ["right", "left"])
def test_truncation_strategies_and_overflow_match_hugging_face(pair_of_tokenizers, strategy, side):
    """Every window (overflowing tokens with a stride, in Hugging Face's order), each with its
    offsets, word ids and sequence ids; or the same error where Hugging Face refuses."""
    ours, hf = pair_of_tokenizers
    backend = hf.backend_tokenizer
    for max_length, stride in ((12, 2), (16, 5), (9, 0)):
        backend.enable_truncation(max_length, stride=stride, strategy=strategy, direction=side)
        for text, pair in PAIRS:
            try:
                expected = backend.encode(text, pair)
            except BaseException as error:  # Hugging Face refuses (too short) or panics (stride too large)
                if isinstance(error, KeyboardInterrupt):
                    raise
                with pytest.raises(TokenizerError):
                    ours.encode_plus(text, pair, truncation=strategy, max_length=max_length, stride=stride,
                                     truncation_side=side)
                continue
            got = ours.encode_plus(text, pair, truncation=strategy, max_length=max_length, stride=stride,
                                   truncation_side=side)
            assert [_fields(window) for window in _windows(got)] == [
                _expected(window) for window in _windows(expected)], (text, pair, max_length, stride)
    backend.no_truncation()


def test_single_text_overflow_and_batch_rows(pair_of_tokenizers):
    ours, hf = pair_of_tokenizers
    texts = [text for text in TRICKY if text.strip()][:6]
    expected = hf(texts, truncation=True, max_length=10, stride=3, return_overflowing_tokens=True,
                  return_offsets_mapping=True, return_special_tokens_mask=True, return_token_type_ids=True)
    got = ours.encode_batch(texts, truncation=True, max_length=10, stride=3, return_overflowing_tokens=True,
                            return_offsets_mapping=True, return_special_tokens_mask=True, return_token_type_ids=True)
    for key in ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask", "overflow_to_sample_mapping"):
        assert got[key] == expected[key], key
    assert got["offset_mapping"] == [[tuple(offset) for offset in row] for row in expected["offset_mapping"]]
    for row in range(len(got["input_ids"])):
        assert got.word_ids(row) == expected.word_ids(row)
        assert got.sequence_ids(row) == expected.sequence_ids(row)


def test_encoding_path_gives_the_ids_path_ids(bert):
    """encode_batch with and without encodings: the same ids and types for every strategy."""
    ours = bert
    texts, pairs = [text for text, _ in PAIRS], [pair for _, pair in PAIRS]
    for strategy in ("longest_first", "only_first", "only_second"):
        for max_length in (8, 14, 40):
            options = {"truncation": strategy, "max_length": max_length}
            try:
                plain = ours.encode_batch(texts, pairs, **options)
            except TokenizerError:
                with pytest.raises(TokenizerError):
                    ours.encode_batch(texts, pairs, return_encodings=True, **options)
                continue
            rich = ours.encode_batch(texts, pairs, return_encodings=True, **options)
            assert {key: rich[key] for key in plain} == dict(plain)


# ---- SQuAD: question + context windows as extractive QA prepares them -------------------------------


@cache
def squad_questions(limit: int) -> list[tuple[str, str, list[dict]]]:
    """(question, context, answers) of the first ``limit`` questions of the SQuAD v1.1 dev set."""
    require(SQUAD_DEV)
    with gzip.open(SQUAD_DEV, "rt", encoding="utf-8") as handle:
        data = json.load(handle)["data"]
    questions = []
    for article in data:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                questions.append((qa["question"], paragraph["context"], qa["answers"]))
                if len(questions) == limit:
                    return questions
    return questions


QA_OPTIONS = {"truncation": "only_second", "max_length": 384, "stride": 128, "return_overflowing_tokens": True,
              "return_offsets_mapping": True, "padding": "max_length"}


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_squad_windows_match_hugging_face(name, tokenizer_pairs):
    """The first 200 dev questions, a third of them with their context
    four times over (several windows each)."""
    ours, hf = tokenizer_pairs[name]
    questions = squad_questions(200)
    texts = [question for question, _, _ in questions]
    contexts = [context if index % 3 else " ".join([context] * 4) for index, (_, context, _) in enumerate(questions)]
    expected = hf(texts, contexts, return_token_type_ids=True, **QA_OPTIONS)
    got = ours.encode_batch(texts, contexts, return_token_type_ids=True, **QA_OPTIONS)
    assert len(got["input_ids"]) > len(texts)  # some contexts did need more than one window
    for key in ("input_ids", "token_type_ids", "attention_mask", "overflow_to_sample_mapping"):
        assert got[key] == expected[key], key
    assert got["offset_mapping"] == [[tuple(offset) for offset in row] for row in expected["offset_mapping"]]
    assert all(got.sequence_ids(row) == expected.sequence_ids(row) for row in range(len(got["input_ids"])))


@pytest.mark.parametrize(("name", "max_length", "stride"), [("bert", 384, 128), ("roberta", 384, 128),
                                                            ("bert", 128, 64)])
def test_squad_answers_map_back_through_offsets(name, max_length, stride, tokenizer_pairs):
    """For every answer of the first 500 dev questions: in each window that holds it, the tokens
    covering the answer's characters read back (through offsets) as text containing the answer
    exactly; and some window holds every answer (short windows: many contexts span several)."""
    ours = tokenizer_pairs[name][0]
    questions = squad_questions(500)
    batch = ours.encode_batch([question for question, _, _ in questions], [context for _, context, _ in questions],
                              truncation="only_second", max_length=max_length, stride=stride,
                              return_overflowing_tokens=True)
    rows_of: dict[int, list[int]] = {}
    for row, sample in enumerate(batch["overflow_to_sample_mapping"]):
        rows_of.setdefault(sample, []).append(row)
    checked = 0
    for sample, (_, context, answers) in enumerate(questions):
        for answer in answers:
            start, text = answer["answer_start"], answer["text"]
            assert context[start:start + len(text)] == text
            found = 0
            for row in rows_of[sample]:
                encoding = batch.encodings[row]
                span = encoding.token_span(start, start + len(text), sequence_index=1)
                if span is None:
                    continue
                first, last = span
                recovered = context[encoding.offsets[first][0]:encoding.offsets[last][1]]
                assert text in recovered, (text, recovered)
                assert len(recovered) <= len(text) + 30, (text, recovered)  # snug: at most a word on each side
                found += 1
            assert found, text
            checked += 1
    assert checked > 1400
    if max_length == 128:
        assert len(batch["input_ids"]) > 1.5 * len(questions)


# ---- the Encoding's own helpers, padding, errors ----------------------------------------------------


def test_token_span_and_char_to_token(bert):
    ours = bert
    encoding = ours.encode_plus("Who?", "Jim Henson was here.")
    # [CLS] who ? [SEP] jim henson was here . [SEP]
    assert encoding.token_span(4, 10, sequence_index=1) == (5, 5)
    assert encoding.token_span(0, 10, sequence_index=1) == (4, 5)
    assert encoding.token_span(2, 7, sequence_index=1) == (4, 5)  # starts inside "jim"
    assert encoding.char_to_token(5, sequence_index=1) == 5
    assert encoding.char_to_token(3, sequence_index=1) is None  # a space
    assert encoding.char_to_token(3, sequence_index=0) == 2
    window = ours.encode_plus("Who?", "Jim Henson was here.", truncation="only_second", max_length=6)
    # one context token per window: jim | henson | was | here | .
    assert [part.token_span(11, 14, sequence_index=1) for part in [window, *window.overflowing]] == [
        None, None, (4, 4), None, None]


def test_left_padding_of_encodings_matches_hugging_face(tokenizer_pairs):
    ours, hf = tokenizer_pairs["bert"]
    texts, pairs = ["a short one", "a somewhat longer question here"], ["its context", "x"]
    hf.padding_side = "left"
    try:
        expected = hf(texts, pairs, padding="max_length", max_length=16, return_offsets_mapping=True,
                      return_special_tokens_mask=True)
    finally:
        hf.padding_side = "right"
    got = ours.encode_batch(texts, pairs, padding="max_length", max_length=16, padding_side="left",
                            return_offsets_mapping=True, return_special_tokens_mask=True)
    for key in ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask"):
        assert got[key] == expected[key], key
    assert got["offset_mapping"] == [[tuple(offset) for offset in row] for row in expected["offset_mapping"]]
    assert got.word_ids(0) == expected.word_ids(0) and got.sequence_ids(1) == expected.sequence_ids(1)
    assert got.tokens(0)[0] == "[PAD]"


def test_tensors_with_offsets_and_sample_mapping(bert):
    ours = bert
    batch = ours.encode_batch(["q one", "q two"], ["a long context " * 10, "short"], truncation="only_second",
                              max_length=16, stride=4, return_overflowing_tokens=True, return_offsets_mapping=True,
                              padding=True, return_tensors="pt")
    rows = batch["input_ids"].shape[0]
    assert batch["offset_mapping"].shape == (rows, 16, 2)
    assert batch["overflow_to_sample_mapping"].tolist() == [0] * (rows - 1) + [1]


def test_bad_truncation_options_are_refused(bert):
    ours = bert
    with pytest.raises(TokenizerError, match="needs text pairs"):
        ours.encode_batch(["a text"], truncation="only_second", max_length=8)
    with pytest.raises(TokenizerError, match="truncation='sideways'"):
        ours.encode_batch(["a text"], truncation="sideways", max_length=8)
    with pytest.raises(TokenizerError, match="stride=6 must be smaller"):
        ours.encode_plus("q", "one two three four five six seven", truncation="only_second", max_length=9, stride=6)
    with pytest.raises(TokenizerError, match="cannot fit max_length"):
        ours.encode_plus("a long question of many words", "x", truncation="only_second", max_length=6)
    with pytest.raises(TokenizerError, match="stride=-1"):
        ours.encode_plus("q", stride=-1)


def test_offsets_through_a_recomposing_normalizer_are_refused_where_it_changes_the_text():
    vocab = ["[UNK]", "[CLS]", "[SEP]", "a", "b", "\u00e1"]
    tokenizer = WordPieceTokenizer(vocab, normalizer=SequenceNormalizer([UnicodeStep("NFC")]))
    assert tokenizer.encode("a b") == [1, 3, 4, 2]
    assert tokenizer.encode_plus("a b \u00e1").offsets == [(0, 0), (0, 1), (2, 3), (4, 5), (0, 0)]
    with pytest.raises(TokenizerError, match="NFC normalizer on text it changes"):
        tokenizer.encode_plus("a b a\u0301")


def test_char_tokenizer_offsets_match_hugging_face(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    chars = CharTokenizer.train("hello wörld\n")
    chars.save(tmp_path / "tokenizer.json")
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in ("hello", "wörld?\nhé", ""):
        assert _fields(chars.encode_plus(text)) == _expected(hf.encode(text))


# ---- files: RoBERTa's tokenizer.json, BERT's vocab.txt ---------------------------------------------


def test_roberta_tokenizer_json_round_trip_keeps_trimmed_offsets(tokenizer_pairs, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    ours = tokenizer_pairs["roberta-prefix-space"][0]
    ours.save(tmp_path / "tokenizer.json")
    written = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))["post_processor"]
    assert written == {"type": "RobertaProcessing", "sep": ["</s>", 50258], "cls": ["<s>", 50257],
                       "trim_offsets": True, "add_prefix_space": True}
    reread = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text, pair in PAIRS:
        assert _fields(ours.encode_plus(text, pair)) == _expected(reread.encode(text, pair))


def test_gpt2_fingerprint_unchanged_by_offset_trimming_support(tokenizer_pairs):
    """GPT-2 has no trimming, so its tokenizer.json (and token files' fingerprints) stay as they were."""
    ours = tokenizer_pairs["gpt2"][0]
    assert not ours.trim_offsets
    assert ours.to_dict()["post_processor"]["type"] == "TemplateProcessing"


def test_vocab_txt_written_and_read_by_bert_tokenizer_fast(bert, tmp_path):
    ours = bert
    path = ours.save_vocabulary(tmp_path)
    assert path.read_bytes() == (BERT_DIR / "vocab.txt").read_bytes()
    hf = transformers.BertTokenizerFast.from_pretrained(str(tmp_path))
    reread = load(tmp_path)
    for text, pair in PAIRS:
        expected = hf.backend_tokenizer.encode(text, pair).ids
        assert expected == ours.encode(text, pair) == reread.encode(text, pair)
    cased = WordPieceTokenizer.from_vocab_file(BERT_DIR / "vocab.txt", lowercase=False)
    cased.save_vocabulary(tmp_path)
    hf_cased = transformers.BertTokenizerFast.from_pretrained(str(tmp_path))
    assert hf_cased("Héllo World")["input_ids"] == cased.encode("Héllo World") == load(tmp_path).encode("Héllo World")
    cased.add_tokens(["<tool>"])
    with pytest.raises(TokenizerError, match="use save"):
        cased.save_vocabulary(tmp_path)


# ---- pre-split words (CoNLL sentences) -------------------------------------------------------------

CONLL_SENTENCES = [
    (["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."], None),
    (["Peter", "Blackburn", "U.S.-based", "Héllo", "naïve", "中文", "😀", "don't", ""], None),
    (["Who", "is", "here", "?"], ["Jim", "Henson", "'s", "Muppets", "were", "here", "in", "1955", "."]),
]


@pytest.mark.parametrize("name", ["bert", "roberta-prefix-space"])
def test_split_into_words_matches_hugging_face(name, tokenizer_pairs):
    """Word ids index the given words; offsets are within each word (Hugging Face's rule), which
    is how a tagger puts a word's label on its first token."""
    ours, hf = tokenizer_pairs[name]
    for words, pair in CONLL_SENTENCES:
        expected = hf(words, pair, is_split_into_words=True, return_offsets_mapping=True, truncation=True,
                      max_length=12, return_overflowing_tokens=True, stride=2)
        got = ours.encode_batch([words], None if pair is None else [pair], is_split_into_words=True,
                                return_offsets_mapping=True, truncation=True, max_length=12,
                                return_overflowing_tokens=True, stride=2)
        assert got["input_ids"] == expected["input_ids"]
        assert got["offset_mapping"] == [[tuple(offset) for offset in row] for row in expected["offset_mapping"]]
        for row in range(len(got["input_ids"])):
            assert got.word_ids(row) == expected.word_ids(row)
            assert got.sequence_ids(row) == expected.sequence_ids(row)
        single = ours.encode_plus(words, pair, is_split_into_words=True)
        assert single.ids == hf(words, pair, is_split_into_words=True)["input_ids"]


def test_split_into_words_refusals(tokenizer_pairs):
    with pytest.raises(TokenizerError, match="add_prefix_space=True"):
        tokenizer_pairs["roberta"][0].encode_plus(["a", "b"], is_split_into_words=True)
    with pytest.raises(TokenizerError, match="list of words"):
        tokenizer_pairs["bert"][0].encode_batch(["not split"], is_split_into_words=True)


def test_byte_level_trimming_with_a_template_round_trips(tokenizer_pairs, tmp_path):
    """trim_offsets on a BPE with a (non-RoBERTa) template is written as Sequence[ByteLevel,
    TemplateProcessing], which the `tokenizers` library reads with the same offsets."""
    tokenizers = pytest.importorskip("tokenizers")
    gpt2 = tokenizer_pairs["gpt2"][0]
    data = gpt2.to_dict()
    data["pre_tokenizer"]["add_prefix_space"] = True
    data["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                                  {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
         "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                  {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}}],
         "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [50256], "tokens": ["<|endoftext|>"]}}}]}
    trimmed = from_dict(data)
    assert trimmed.trim_offsets and trimmed.add_prefix_space
    trimmed.save(tmp_path / "tokenizer.json")
    assert trimmed.to_dict()["post_processor"]["processors"][0]["type"] == "ByteLevel"
    reread = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in TRICKY[:10]:
        assert _fields(trimmed.encode_plus(text, "  a  pair ")) == _expected(reread.encode(text, "  a  pair "))
