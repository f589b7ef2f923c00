"""SentencePiece Unigram tokenizers (T5's and Marian's tokenizer.json): ids and text equal to
Hugging Face ``tokenizers`` on the same file, the precompiled normalizer equal to its
``Precompiled`` step character by character, the Viterbi cut checked by hand, saving back."""

from __future__ import annotations

import base64
import copy
import io
import json
import random

import pytest

from tformer.tokenizers import TokenizerError, from_dict, load
from tformer.tokenizers.unigram import UnigramTokenizer

spm = pytest.importorskip("sentencepiece")
hf_tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # compares with sentencepiece, tokenizers and transformers

_WORDS = ("a man woman dog two children play ball near the river street city runs across green field while "
          "Ein Mann fährt Fahrrad über die Straße zwei Hunde spielen im Schnee Mädchen läuft Bäume grüne Wiese "
          "café naïve Ärger Öl Übel weiß schönen Kaffee trinkt").split()

_EDGE_CASES = [
    "", " ", "  hello   world  ", "a\r\nb", "tab\there", "e\u0301t\u00e9", "ﬁ\u0301ve", "x\u200dy", "👨‍👩‍👧 family",
    "日本語のテキスト", "<extra_id_0> the <extra_id_1>dog</s>", "UPPER lower 123 4.5 %$#", "Ⅻ ① ｆｕｌｌ ﬁve",
    "\u00a0nbsp\u3000ideographic", "▁leading mark", "a▁b", "\x00ctrl\x07", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "``quoted''", "zzqqxx",
    "  <extra_id_0>x", "x <extra_id_0> y", "<extra_id_0>",
    "ª\u0300 º\u0301 x",  # two keys begin these graphemes ("ª" and "ª̀"): Hugging Face replaces by the first
]


def _sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 12))) + rng.choice(".!?,")
            for _ in range(count)]


@pytest.fixture(scope="module")
def t5_document(tmp_path_factory) -> dict:
    """A tokenizer.json as transformers writes T5's: SentencePiece Unigram trained here with
    T5's ids (pad 0, eos 1, unk 2) and nmt_nfkc normalization, 3 extra ids."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_sentences(3000, 0) + ["ﬁve ① Ⅻ ｆｕｌｌ"]), model_writer=model, vocab_size=250,
        model_type="unigram", normalization_rule_name="nmt_nfkc", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        character_coverage=0.99, hard_vocab_limit=False, minloglevel=2)
    source = tmp_path_factory.mktemp("t5-source")
    (source / "spiece.model").write_bytes(model.getvalue())
    saved = tmp_path_factory.mktemp("t5-tokenizer")
    transformers.T5Tokenizer.from_pretrained(source, extra_ids=3).save_pretrained(saved)
    return json.loads((saved / "tokenizer.json").read_text(encoding="utf-8"))


def _variants(document: dict) -> dict[str, dict]:
    """T5's file and the other layouts Unigram files use: Metaspace alone, not splitting, not
    prepending, prepending before the text's first piece only ("first", not after an added
    token), a normalizer sequence."""
    metaspace_only = copy.deepcopy(document)
    metaspace_only["pre_tokenizer"] = metaspace_only["pre_tokenizer"]["pretokenizers"][1]
    no_split = copy.deepcopy(metaspace_only)
    no_split["pre_tokenizer"]["split"] = False
    never = copy.deepcopy(metaspace_only)
    never["pre_tokenizer"]["prepend_scheme"] = never["decoder"]["prepend_scheme"] = "never"
    first = copy.deepcopy(metaspace_only)
    first["pre_tokenizer"]["prepend_scheme"] = first["decoder"]["prepend_scheme"] = "first"
    t5_first = copy.deepcopy(document)
    t5_first["pre_tokenizer"]["pretokenizers"][1]["prepend_scheme"] = t5_first["decoder"]["prepend_scheme"] = "first"
    sequence = copy.deepcopy(document)
    replace = {"type": "Replace", "pattern": {"String": "``"}, "content": '"'}
    steps = [document["normalizer"], replace, {"type": "Lowercase"}]
    sequence["normalizer"] = {"type": "Sequence", "normalizers": steps}
    return {"t5": document, "metaspace-only": metaspace_only, "no-split": no_split, "never": never,
            "first": first, "t5-first": t5_first, "sequence": sequence}


@pytest.mark.parametrize("variant", ["t5", "metaspace-only", "no-split", "never", "first", "t5-first",
                                     "sequence"])
def test_ids_and_text_equal_hugging_face(t5_document, variant):
    document = _variants(t5_document)[variant]
    reference = hf_tokenizers.Tokenizer.from_str(json.dumps(document))
    ours = from_dict(copy.deepcopy(document))
    assert isinstance(ours, UnigramTokenizer)
    texts = _sentences(300, 1) + _EDGE_CASES
    expected = [encoding.ids for encoding in reference.encode_batch(texts)]
    assert [ours.encode(text) for text in texts] == expected
    assert any(ours.special_token_id("unk") in ids for ids in expected)  # unknown characters were met
    for ids in expected:
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)


def test_saved_file_is_read_by_hugging_face_with_the_same_ids(t5_document, tmp_path):
    ours = from_dict(copy.deepcopy(t5_document))
    path = ours.save(tmp_path)
    again = hf_tokenizers.Tokenizer.from_file(str(path))
    texts = _sentences(100, 2) + _EDGE_CASES
    assert [encoding.ids for encoding in again.encode_batch(texts)] == [ours.encode(text) for text in texts]
    assert load(path).fingerprint() == ours.fingerprint()
    assert ours.to_dict()["normalizer"] == t5_document["normalizer"]


def test_precompiled_normalizer_equals_hugging_face_character_by_character(t5_document):
    """Every character of several Unicode blocks (Latin, compatibility forms, full width,
    ligatures, circled numbers) and some grapheme clusters, normalized both ways."""
    ours = from_dict(copy.deepcopy(t5_document)).normalizer
    charsmap = base64.b64decode(t5_document["normalizer"]["precompiled_charsmap"])
    reference = hf_tokenizers.normalizers.Precompiled(charsmap)
    code_points = [*range(0x0, 0x800), *range(0x2000, 0x2500), *range(0x3000, 0x3100), *range(0xFB00, 0xFB50),
                   *range(0xFF00, 0xFFF0), *range(0x1D400, 0x1D440)]
    characters = [chr(code) for code in code_points if not 0xD800 <= code <= 0xDFFF]
    changed = 0
    for char in characters + ["e\u0301", "ﬁ\u0301", "\r\n", "👨‍👩‍👧", "a\u0308\u0301", "ª\u0300", "º\u0301"]:
        expected = reference.normalize_str(char)
        assert ours(char) == expected, repr(char)
        changed += expected != char
    assert changed > 500  # the map did real work (full width, compatibility forms, controls)


def _hand_made(pieces: list[tuple[str, float]]) -> dict:
    metaspace = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    vocab = [list(piece) for piece in pieces]
    return {"model": {"type": "Unigram", "unk_id": 0, "vocab": vocab, "byte_fallback": False},
            "normalizer": None, "pre_tokenizer": metaspace, "decoder": dict(metaspace),
            "added_tokens": [{"id": 0, "content": "<unk>", "special": True, "normalized": False, "lstrip": False,
                              "rstrip": False, "single_word": False}]}


def test_viterbi_takes_the_best_scoring_cut_and_fuses_unknown_runs():
    pieces = [("<unk>", 0.0), ("▁", -1.0), ("▁ab", -5.0), ("▁a", -1.0), ("b", -1.5), ("c", -2.0), ("bc", -2.0),
              ("▁abc", -6.0)]
    document = _hand_made(pieces)
    ours = from_dict(copy.deepcopy(document))
    ids = {piece: token_id for token_id, (piece, _) in enumerate(pieces)}
    # "▁abc": ▁a + bc = -3.0 beats ▁a + b + c = -4.5, ▁ab + c = -7.0 and ▁abc = -6.0
    assert ours.encode("abc") == [ids["▁a"], ids["bc"]]
    # "▁ab": ▁a + b = -2.5 beats ▁ab = -5.0; x, y, z are unknown and fuse into one <unk>
    assert ours.encode("ab xyzc") == [ids["▁a"], ids["b"], ids["▁"], 0, ids["c"]]
    reference = hf_tokenizers.Tokenizer.from_str(json.dumps(document))
    for text in ("abc", "ab xyzc", "cab  bcb", "zz", "a b c"):
        assert ours.encode(text) == reference.encode(text).ids, text
    assert ours.decode(ours.encode("ab c")) == "ab c"


def test_ties_keep_the_cut_found_first_as_hugging_face_does():
    # "▁a" + "bc" and "▁ab" + "c" both score -2.0; the cut whose last piece starts earlier wins
    pieces = [("<unk>", 0.0), ("▁a", -1.0), ("bc", -1.0), ("▁ab", -1.0), ("c", -1.0), ("b", -9.0)]
    document = _hand_made(pieces)
    reference = hf_tokenizers.Tokenizer.from_str(json.dumps(document))
    assert from_dict(copy.deepcopy(document)).encode("abc") == reference.encode("abc").ids == [1, 2]


def _random_model(family: str, vocab_size: int):
    common = {"vocab_size": vocab_size, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}
    if family == "t5":
        return transformers.T5ForConditionalGeneration(transformers.T5Config(
            d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, **common))
    return transformers.MarianMTModel(transformers.MarianConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, forced_eos_token_id=None, init_std=0.2,
        **common))


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_a_folder_with_a_unigram_tokenizer_translates_text_as_hugging_face_does(t5_document, tmp_path, family):
    """A Marian / T5 folder holding a SentencePiece tokenizer.json: tformer.load attaches it, and
    text translated by beam search equals Hugging Face's generate decoded by ``tokenizers``."""
    torch = pytest.importorskip("torch")
    import tformer
    from tformer.generation.translation import translate

    vocab_size = from_dict(copy.deepcopy(t5_document)).vocab_size
    torch.manual_seed(0)
    hf = _random_model(family, vocab_size).eval()
    hf.save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps(t5_document), encoding="utf-8")
    model = tformer.load(tmp_path)
    assert isinstance(model.tokenizer, UnigramTokenizer)
    reference = hf_tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    sentences = ["Zwei Hunde spielen im Schnee.", "Ein Mann fährt Fahrrad über die Straße!", "café naïve ﬁve"]
    got = translate(model, sentences, num_beams=4, max_new_tokens=8).texts
    for sentence, text in zip(sentences, got, strict=True):
        ids = torch.tensor([reference.encode(sentence).ids])
        output = hf.generate(ids, max_new_tokens=8, num_beams=4, do_sample=False)[0, 1:].tolist()
        assert text == reference.decode(output, skip_special_tokens=True).strip()
    assert sum(bool(text) for text in got) >= 2, got  # real output, not only empty strings


@pytest.mark.parametrize("variant", ["t5", "metaspace-only", "no-split", "never", "first", "t5-first"])
def test_offsets_and_word_ids_equal_hugging_face(t5_document, variant):
    """Offsets through the precompiled map (ligatures, decomposed accents, CR LF, full width)
    and through the marks Metaspace puts in, and word ids, as Hugging Face reports them."""
    document = _variants(t5_document)[variant]
    reference = hf_tokenizers.Tokenizer.from_str(json.dumps(document))
    ours = from_dict(copy.deepcopy(document))
    for text in _sentences(100, 3) + _EDGE_CASES:
        expected = reference.encode(text)
        encoding = ours.encode_plus(text)
        assert (encoding.ids, encoding.offsets, encoding.word_ids) == (
            expected.ids, expected.offsets, expected.word_ids), repr(text)


def test_unsupported_unigram_layouts_are_refused(t5_document):
    replacing = _variants(t5_document)["sequence"]
    with pytest.raises(TokenizerError, match="offsets are not supported through the Replace normalizer"):
        from_dict(replacing).encode_plus("a man")
    wrong = copy.deepcopy(t5_document)
    wrong["pre_tokenizer"] = {"type": "ByteLevel"}
    with pytest.raises(TokenizerError, match="Unigram pre_tokenizer 'ByteLevel' is not supported; known: Metaspace"):
        from_dict(wrong)
