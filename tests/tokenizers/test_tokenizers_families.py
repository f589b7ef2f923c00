"""The tokenizer.json of today's decoder families, id-exact with Hugging Face ``tokenizers``:
Llama 3 (tiktoken-style byte-level BPE, its Split regex, ignore_merges), Qwen2 (NFC + byte-level
BPE) and the SentencePiece-style BPE of Llama 2 / Mistral (legacy Prepend + Replace normalizer,
or Metaspace "first") and Gemma (Replace normalizer, Split merged_with_previous): byte fallback,
fuse_unk, decoders Replace / ByteFallback / Fuse / Strip. Nothing can be downloaded, so each
file is built here with ``tokenizers`` itself, laid out as those checkpoints' files are (the
layouts of transformers' converters), over a vocabulary trained on a small corpus, with the
family's special and added tokens."""

from __future__ import annotations

import copy
import json
import unicodedata

import pytest
from shared_data import unicode_sample

from tformer.tokenizers import BPETokenizer, TokenizerError, from_dict, load
from tformer.tokenizers.decoders import decoder_from_json
from tformer.tokenizers.pre_tokenizers import SPLIT_BEHAVIORS, SplitPreTokenizer
from tformer.tokenizers.sentencepiece_bpe import SentencePieceBPETokenizer, byte_token

hf = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.slow  # compares with the tokenizers library

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                   "<|reserved_special_token_0|>"]
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_ADDED = ["<tool_call>", "</tool_call>"]  # Qwen2.5's: added, not special
LLAMA2_SPECIALS = ["<unk>", "<s>", "</s>"]
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
GEMMA_TURNS = ["<start_of_turn>", "<end_of_turn>"]

TRAINING = [
    "The quick brown fox jumps over the lazy dog. It's what they're doing, we've seen it, I'm sure you'll agree.\n",
    "def tokenize(text: str) -> list[int]:\n    return [ord(char) for char in text]  # code\n\n",
    "if (x == 1) {\n\treturn y;\n}\n",
    "日本語のテキストと中文字符，还有한국어 문장。\n",
    "Numbers 12345 and 3.14159, prices $3.50 €12.\n",
    "héllo wörld café naïve résumé — «quotes»\n",
] * 8

# Every special and added token of every family, so each file meets its own and the others'.
ALL_TOKENS = LLAMA3_SPECIALS + QWEN2_SPECIALS + QWEN2_ADDED + LLAMA2_SPECIALS + GEMMA_SPECIALS + GEMMA_TURNS


def _corpus() -> list[str]:
    """Multilingual text with emoji, CJK, code, whitespace runs and every special token."""
    texts = [
        "Hello world", " Hello", "  two leading spaces", "trailing  ", "", " ", "   ", "\t", "\n", "\n\n\n",
        "multiple    spaces\tand\t\ttabs\nand\r\nnewlines\n\n\nend", "a\u3000b\u00a0c",
        "def f(x):\n    if x:\n        return x  # comment\n\treturn None\n",
        "for (int i = 0; i < n; ++i) { sum += a[i]; }", "{'key': [1, 2, 3]}",
        "日本語のテキスト 中文字符 한국어 문장", "😀😃 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🥰",
        "Ελληνικά русский עברית العربية हिन्दी ไทย",
        "It's IT'S they're THEY'RE we've 'ſ 'quoted'", "12345678901 3.14159 1,234,567",
        "e\u0301 a\u0308 Å Å ﬁ ① ｆｕｌｌ",  # decomposed and compatibility forms (NFC changes some)
        "▁leading mark and a▁b", "<0x41> is text here", "zero\u200bwidth soft\u00adhyphen \x00\x07 ctrl",
    ]
    texts += unicode_sample().split("\n")
    texts += [f"{token}x" for token in ALL_TOKENS] + [f"x {token} y" for token in ALL_TOKENS]
    texts += [
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n你好 😀<|im_end|>\n<|im_start|>assistant\n"
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call><|im_end|><|endoftext|>",
        "<s>[INST] Hello there [/INST] General Kenobi</s><s>[INST] again [/INST]",
        "<bos><start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\nhi 👋<end_of_turn><eos>",
        "".join(ALL_TOKENS), "  ".join(ALL_TOKENS),
    ]
    return texts


CORPUS = _corpus()


def _train(model, pre_tokenizer, normalizer=None, initial_alphabet=(), special_tokens=(), vocab_size=700):
    """Vocabulary and merges trained by ``tokenizers`` on TRAINING."""
    trainer_tokenizer = hf.Tokenizer(model)
    trainer_tokenizer.normalizer = normalizer
    trainer_tokenizer.pre_tokenizer = pre_tokenizer
    trainer = hf.trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                     initial_alphabet=list(initial_alphabet), special_tokens=list(special_tokens))
    trainer_tokenizer.train_from_iterator(TRAINING, trainer)
    trained = json.loads(trainer_tokenizer.to_str())["model"]
    return trained["vocab"], [tuple(merge) for merge in trained["merges"]]


def _byte_level(pattern: str, normalizer=None):
    vocab, merges = _train(hf.models.BPE(), _split_byte_level(pattern), normalizer,
                           hf.pre_tokenizers.ByteLevel.alphabet())
    return vocab, merges


def _split_byte_level(pattern: str):
    return hf.pre_tokenizers.Sequence([hf.pre_tokenizers.Split(hf.Regex(pattern), behavior="isolated", invert=False),
                                       hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _leaf_merges(vocab: dict, merges: list, count: int) -> set[str]:
    """The ``count`` longest merged tokens that no other merge uses: dropping their merges leaves
    them in the vocabulary but unreachable by merging (as in files converted from tiktoken)."""
    parts = {part for merge in merges for part in merge}
    leaves = sorted((left + right for left, right in merges if left + right not in parts), key=len, reverse=True)
    return set(leaves[:count])


def _llama3(ignore_merges: bool = True) -> hf.Tokenizer:
    """Llama 3's layout (transformers' TikTokenConverter): byte-level BPE with ignore_merges, the
    Split regex then ByteLevel without its own regex, specials after the vocabulary, a ByteLevel
    post-processor (no trimming) then `<|begin_of_text|> $A`."""
    vocab, merges = _byte_level(LLAMA3_PATTERN)
    unreachable = _leaf_merges(vocab, merges, 12)
    merges = [merge for merge in merges if merge[0] + merge[1] not in unreachable]
    tokenizer = hf.Tokenizer(hf.models.BPE(vocab, merges, fuse_unk=False, ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = _split_byte_level(LLAMA3_PATTERN)
    tokenizer.decoder = hf.decoders.ByteLevel()
    tokenizer.add_special_tokens([hf.AddedToken(token, normalized=False, special=True) for token in LLAMA3_SPECIALS])
    bos = "<|begin_of_text|>"
    tokenizer.post_processor = hf.processors.Sequence([
        hf.processors.ByteLevel(trim_offsets=False),
        hf.processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1",
                                         special_tokens=[(bos, tokenizer.token_to_id(bos))]),
    ])
    return tokenizer


def _qwen2() -> hf.Tokenizer:
    """Qwen2's layout: NFC, the Split regex (single digits) then ByteLevel, no unknown token,
    a ByteLevel post-processor; `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` special and the
    tool-call tags added but not special."""
    vocab, merges = _byte_level(QWEN2_PATTERN, hf.normalizers.NFC())
    tokenizer = hf.Tokenizer(hf.models.BPE(vocab, merges, unk_token=None, continuing_subword_prefix="",
                                           end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = hf.normalizers.NFC()
    tokenizer.pre_tokenizer = _split_byte_level(QWEN2_PATTERN)
    tokenizer.decoder = hf.decoders.ByteLevel()
    tokenizer.post_processor = hf.processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tokenizer.add_special_tokens([hf.AddedToken(token, normalized=False, special=True) for token in QWEN2_SPECIALS])
    tokenizer.add_tokens([hf.AddedToken(token, normalized=False, special=False) for token in QWEN2_ADDED])
    return tokenizer


def _sentencepiece_vocab(specials: list[str], unreachable: int = 0) -> tuple[dict, list]:
    """A SentencePiece-style vocabulary as Llama 2's and Gemma's files hold it: the specials,
    the 256 byte tokens "<0x00>".."<0xFF>", then pieces with "▁" for spaces trained here."""
    metaspace = hf.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trained, merges = _train(hf.models.BPE(unk_token="<unk>", byte_fallback=True), metaspace, vocab_size=600)
    vocab = {token: token_id for token_id, token in enumerate(specials)}
    for byte in range(256):
        vocab[byte_token(byte)] = len(vocab)
    for token, _ in sorted(trained.items(), key=lambda item: item[1]):
        vocab.setdefault(token, len(vocab))
    if unreachable:
        dropped = _leaf_merges(vocab, merges, unreachable)
        merges = [merge for merge in merges if merge[0] + merge[1] not in dropped]
    return vocab, merges


def _llama2_decoder():
    return hf.decoders.Sequence([hf.decoders.Replace("▁", " "), hf.decoders.ByteFallback(), hf.decoders.Fuse(),
                                 hf.decoders.Strip(" ", 1, 0)])


def _llama2(layout: str = "legacy", **model_options) -> hf.Tokenizer:
    """Llama 2 / Mistral (transformers' LlamaConverter): BPE with byte fallback and fuse_unk;
    "legacy": normalizer Prepend("▁") + Replace(" ", "▁") and no pre-tokenizer (Llama 2's and
    Mistral v0.1's files); "metaspace": no normalizer, Metaspace(prepend_scheme "first", no split)
    (Mistral v0.3's); decoder Replace, ByteFallback, Fuse, Strip; `<s> $A` (`<s> $A <s> $B`)."""
    options = {"unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True, **model_options}
    missing_bytes = options.pop("missing_bytes", ())
    vocab, merges = _sentencepiece_vocab(LLAMA2_SPECIALS, options.pop("unreachable", 0))
    for byte in missing_bytes:
        del vocab[byte_token(byte)]
    vocab = {token: token_id for token_id, token in enumerate(vocab)}
    tokenizer = hf.Tokenizer(hf.models.BPE(vocab, merges, **options))
    if layout == "legacy":
        tokenizer.normalizer = hf.normalizers.Sequence([hf.normalizers.Prepend("▁"), hf.normalizers.Replace(" ", "▁")])
    elif layout == "metaspace":
        tokenizer.pre_tokenizer = hf.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    else:  # Metaspace as Unigram files use it, with a Metaspace decoder
        tokenizer.pre_tokenizer = hf.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tokenizer.decoder = _llama2_decoder() if layout != "split-metaspace" else hf.decoders.Sequence([
        hf.decoders.ByteFallback(), hf.decoders.Metaspace(replacement="▁", prepend_scheme="always"),
        hf.decoders.Fuse()])
    tokenizer.add_special_tokens([hf.AddedToken(token, normalized=False, special=True) for token in LLAMA2_SPECIALS])
    tokenizer.post_processor = hf.processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s>:1 $B:1", special_tokens=[("<s>", 1)])
    return tokenizer


def _gemma(split: bool = False) -> hf.Tokenizer:
    """Gemma (transformers' GemmaConverter): normalizer Replace(" ", "▁"), no pre-tokenizer (or,
    as transformers 5 writes it, Split(" ", merged_with_previous)), BPE with byte fallback and
    fuse_unk, decoder Replace, ByteFallback, Fuse (no Strip: nothing was prepended), `<bos> $A`,
    turn markers special and an HTML tag added but not special."""
    vocab, merges = _sentencepiece_vocab(GEMMA_SPECIALS)
    tokenizer = hf.Tokenizer(hf.models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tokenizer.normalizer = hf.normalizers.Replace(" ", "▁")
    if split:
        tokenizer.pre_tokenizer = hf.pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tokenizer.decoder = hf.decoders.Sequence([hf.decoders.Replace("▁", " "), hf.decoders.ByteFallback(),
                                              hf.decoders.Fuse()])
    tokenizer.add_special_tokens([hf.AddedToken(token, normalized=False, special=True)
                                  for token in GEMMA_SPECIALS + GEMMA_TURNS])
    tokenizer.add_tokens([hf.AddedToken("<table>", normalized=False, special=False),
                          hf.AddedToken("▁▁▁▁", normalized=True, special=False)])
    tokenizer.post_processor = hf.processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B:1", special_tokens=[("<bos>", 2)])
    return tokenizer


FAMILIES = {
    "llama3": _llama3,
    "llama3-merges": lambda: _llama3(ignore_merges=False),
    "qwen2": _qwen2,
    "llama2": _llama2,
    "mistral-v0.3": lambda: _llama2("metaspace"),
    "gemma": _gemma,
    "gemma-split": lambda: _gemma(split=True),
    # the BPE model's options over Llama 2's layout, and Metaspace as a pre-tokenizer and decoder
    "sp-no-byte-fallback": lambda: _llama2(byte_fallback=False),
    "sp-unfused-unk": lambda: _llama2(byte_fallback=False, fuse_unk=False),
    "sp-no-unk": lambda: _llama2(byte_fallback=False, unk_token=None),
    "sp-missing-bytes": lambda: _llama2(missing_bytes=(0xF0, 0xE4)),  # emoji and some CJK fall back to <unk>
    "sp-ignore-merges": lambda: _llama2("split-metaspace", ignore_merges=True, unreachable=12),
    "sp-dropped-merges": lambda: _llama2("split-metaspace", unreachable=12),
    "sp-split-metaspace": lambda: _llama2("split-metaspace"),
}
# Where decode(encode(x)) == x is promised for text without added tokens: byte-level BPE (after
# NFC for Qwen2) and SentencePiece-style BPE with every byte token to fall back on, for text
# without its space mark "▁" (which decodes as a space) and, where a Metaspace pre-tokenizer
# marks word starts, not starting with a space (Metaspace prepends no mark there, and the
# decoder drops the first one).
ROUND_TRIPS = {"llama3", "llama3-merges", "qwen2", "llama2", "mistral-v0.3", "gemma", "gemma-split",
               "sp-ignore-merges", "sp-split-metaspace"}


@pytest.fixture(scope="module")
def references() -> dict[str, hf.Tokenizer]:
    return {}


def _pair(references: dict, family: str):
    """(Hugging Face's tokenizer, tformer's from the same tokenizer.json, that json)."""
    if family not in references:
        reference = FAMILIES[family]()
        document = json.loads(reference.to_str())
        references[family] = reference, from_dict(copy.deepcopy(document)), document
    return references[family]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_ids_and_decoding_equal_hugging_face(references, family):
    reference, ours, _ = _pair(references, family)
    expected_class = BPETokenizer if family.startswith(("llama3", "qwen2")) else SentencePieceBPETokenizer
    assert isinstance(ours, expected_class)
    for text in CORPUS:
        for add_special_tokens in (True, False):
            expected = reference.encode(text, add_special_tokens=add_special_tokens).ids
            assert ours.encode(text, add_special_tokens=add_special_tokens) == expected, (text, add_special_tokens)
        for skip in (False, True):
            assert ours.decode(expected, skip_special_tokens=skip) == reference.decode(
                expected, skip_special_tokens=skip), (text, skip)
    pairs = CORPUS[:12]
    expected = [encoding.ids for encoding in reference.encode_batch(list(zip(pairs, reversed(pairs), strict=True)))]
    assert [ours.encode(text, pair) for text, pair in zip(pairs, reversed(pairs), strict=True)] == expected
    assert ours.encode_batch(CORPUS).input_ids == [encoding.ids for encoding in reference.encode_batch(CORPUS)]


@pytest.mark.parametrize("family", sorted(ROUND_TRIPS))
def test_decode_of_encode_gives_the_text_back(references, family):
    _, ours, _ = _pair(references, family)
    plain = [text for text in CORPUS if not any(token in text for token in ALL_TOKENS)]
    if isinstance(ours, SentencePieceBPETokenizer):
        plain = [text for text in plain if "▁" not in text]
        if ours.pre_tokenizer is not None and family.startswith(("mistral", "sp-")):
            plain = [text for text in plain if not text.startswith(" ")]
    assert len(plain) > 30
    for text in plain:
        expected = unicodedata.normalize("NFC", text) if family == "qwen2" else text
        assert ours.decode(ours.encode(text, add_special_tokens=False)) == expected, text
        assert ours.decode(ours.encode(text), skip_special_tokens=True) == expected, text


@pytest.mark.parametrize("family", list(FAMILIES))
def test_offsets_and_word_ids_equal_hugging_face(references, family):
    """Offsets in the text (through Prepend, Replace, Metaspace marks, byte-fallback tokens that
    split a character, fused unknown runs) and word ids; Qwen2's NFC on text already in NFC."""
    reference, ours, _ = _pair(references, family)
    texts = [text for text in CORPUS if unicodedata.is_normalized("NFC", text)] if family == "qwen2" else CORPUS
    assert len(texts) > 50
    for text in texts:
        expected = reference.encode(text)
        encoding = ours.encode_plus(text)
        assert (encoding.ids, encoding.offsets, encoding.word_ids) == (
            expected.ids, expected.offsets, expected.word_ids), text
    if isinstance(ours, SentencePieceBPETokenizer):  # words given one by one (each is a text of its own)
        for words in (["Hello", "world"], ["日本", "😀", " x", "\t"], ["a", "<s>", "b<eos>"]):
            expected = reference.encode(words, is_pretokenized=True)
            encoding = ours.encode_batch([words], is_split_into_words=True, return_encodings=True).encodings[0]
            assert (encoding.ids, encoding.offsets, encoding.word_ids) == (
                expected.ids, expected.offsets, expected.word_ids), words


def test_options_change_the_ids_they_should(references):
    """The reference files really exercise ignore_merges, byte fallback, unknown fusing and the
    "first" prepend scheme (so the equalities above are not vacuous)."""
    text = " ".join(text for text in CORPUS if not any(token in text for token in ALL_TOKENS))
    ids = {family: _pair(references, family)[0].encode(text).ids for family in FAMILIES}
    assert ids["llama3"] != ids["llama3-merges"]
    unk = _pair(references, "llama2")[0].token_to_id("<unk>")
    assert unk not in ids["llama2"] and ids["sp-no-byte-fallback"].count(unk) < ids["sp-unfused-unk"].count(unk)
    assert unk in ids["sp-missing-bytes"] and unk not in ids["sp-no-unk"]
    assert ids["sp-ignore-merges"] != ids["sp-dropped-merges"]
    mistral = _pair(references, "mistral-v0.3")[0]
    assert mistral.encode("<s>Hello").tokens[:3] != mistral.encode("Hello").tokens[:2]  # no "▁" after <s>


@pytest.mark.parametrize("family", list(FAMILIES))
def test_saved_file_reads_back_in_hugging_face_with_the_same_ids(references, family, tmp_path):
    _, ours, document = _pair(references, family)
    saved = ours.to_dict()
    for key in ("normalizer", "pre_tokenizer", "decoder"):
        assert saved[key] == document[key], key
    again = hf.Tokenizer.from_file(str(ours.save(tmp_path)))
    assert [encoding.ids for encoding in again.encode_batch(CORPUS)] == [ours.encode(text) for text in CORPUS]
    assert load(tmp_path).fingerprint() == ours.fingerprint()


def test_special_tokens_get_their_roles(references):
    llama2 = _pair(references, "llama2")[1]
    assert (llama2.bos_token, llama2.eos_token, llama2.unk_token) == ("<s>", "</s>", "<unk>")
    gemma = _pair(references, "gemma")[1]
    assert (gemma.bos_token, gemma.eos_token, gemma.pad_token, gemma.unk_token) == ("<bos>", "<eos>", "<pad>", "<unk>")
    llama3 = _pair(references, "llama3")[1]
    assert (llama3.bos_token, llama3.eos_token) == ("<|begin_of_text|>", "<|end_of_text|>")
    assert llama3.token_to_id("<|eot_id|>") in llama3.special_token_ids


# ---- the components one by one ------------------------------------------------------------------

SPLIT_TEXTS = ["", " ", "a b", "  a  b  ", "a b ", " a", "x,y,,z", "one two  three   four", "日本 語 😀 x"]


@pytest.mark.parametrize("behavior", SPLIT_BEHAVIORS)
@pytest.mark.parametrize("invert", [False, True])
@pytest.mark.parametrize(("pattern", "is_regex"), [(" ", False), (",", False), (r"\s+", True), (r"\p{L}+", True)])
def test_split_pre_tokenizer_equals_hugging_face(behavior, invert, pattern, is_regex):
    ours = SplitPreTokenizer(pattern, is_regex, behavior, invert)
    hf_behavior = {"MergedWithPrevious": "merged_with_previous", "MergedWithNext": "merged_with_next"}.get(
        behavior, behavior.lower())
    reference = hf.pre_tokenizers.Split(hf.Regex(pattern) if is_regex else pattern, behavior=hf_behavior,
                                        invert=invert)
    for text in SPLIT_TEXTS:
        assert list(zip(ours(text), ours.spans(text), strict=True)) == [
            (word, span) for word, span in reference.pre_tokenize_str(text)], text


DECODER_TOKENS = [
    [], ["▁Hello", "▁world"], ["▁▁", "a", "▁b"], ["<0xE6>", "<0x97>", "<0xA5>", "▁x"], ["<0xE6>", "<0x97>", "y"],
    ["<0xff>", "<0x+A>", "<0xZZ>", "<0x4>", "<0x41>"], ["  a  ", " ", ""], ["<s>", "▁Hi", "</s>"],
]


@pytest.mark.parametrize("decoder", [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"},
    {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    {"type": "Strip", "content": " ", "start": 2, "stop": 1},
    {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
    {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
    {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": True},
])
def test_decoders_equal_hugging_face(decoder):
    ours = decoder_from_json(decoder)
    document = json.loads(hf.Tokenizer(hf.models.BPE()).to_str())
    document["decoder"] = decoder
    reference = hf.Tokenizer.from_str(json.dumps(document)).decoder
    for tokens in DECODER_TOKENS:
        if decoder["type"] == "Strip" and any(len(token) < decoder["start"] + decoder["stop"] for token in tokens):
            continue  # Hugging Face's Strip panics on a token shorter than what it may strip
        assert ours.decode(tokens) == reference.decode(tokens), tokens
    assert ours.to_json() == decoder


@pytest.mark.parametrize(("field", "value", "message"), [
    ("decoder", {"type": "CTC"}, "decoder 'CTC' is not supported for SentencePiece-style BPE; known: Sequence"),
    ("decoder", {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"Regex": "▁+"}, "content": " "}]},
     "Replace decoder with pattern .* is not supported; only a String pattern is"),
    ("pre_tokenizer", {"type": "Whitespace"}, "SentencePiece-style BPE pre_tokenizer 'Whitespace' is not supported"),
    ("pre_tokenizer", {"type": "Split", "pattern": {"String": " "}, "behavior": "Sideways", "invert": False},
     "Split behavior 'Sideways' is not supported; known: Removed"),
    ("pre_tokenizer", {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "sometimes", "split": False},
     "Metaspace prepend_scheme 'sometimes' is not supported"),
    ("normalizer", {"type": "Prepend", "prepend": ""}, "a Prepend normalizer needs a non-empty str"),
    ("post_processor", {"type": "ByteLevel", "trim_offsets": True},
     "a post_processor trimming byte-level offsets is not supported with SentencePiece-style BPE"),
    ("model.dropout", 0.1, "BPE with dropout=0.1 is not supported"),
    ("model.end_of_word_suffix", "</w>", "BPE with end_of_word_suffix='</w>' is not supported"),
    ("model.unk_token", "<nope>", "unk_token '<nope>' is not in the vocabulary"),
])
def test_what_cannot_be_honoured_is_refused_in_one_line(references, field, value, message):
    document = copy.deepcopy(_pair(references, "llama2")[2])
    target = document
    if field.startswith("model."):
        target, field = document["model"], field.split(".", 1)[1]
    target[field] = value
    with pytest.raises(TokenizerError, match=message) as caught:
        from_dict(document)
    assert "\n" not in str(caught.value)


def test_offsets_through_a_normalizer_that_changes_the_text_are_refused(references):
    with pytest.raises(TokenizerError, match="offsets are not supported through the NFC normalizer on text it changes"):
        _pair(references, "qwen2")[1].encode_plus("cafe\u0301")
