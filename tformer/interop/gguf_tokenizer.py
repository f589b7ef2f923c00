"""A GGUF file's ``tokenizer.ggml.*`` metadata as a tformer tokenizer, and back.

GGUF holds a tokenizer as a token list, token types, and either BPE merges (``tokenizer.ggml.model = "gpt2"``:
byte-level BPE, its pre-tokenizer regex named by ``tokenizer.ggml.pre``) or scores (``"llama"``: SentencePiece
BPE, merged in the order of the merged piece's score). Both are rebuilt as the ``tokenizer.json`` document
Hugging Face's converters make of them (``tokenizers``' ``SentencePieceExtractor`` for the merges of scores) and
read by tformer's loader. What does not map (another tokenizer model, a pre-tokenizer regex tformer does not
know by name) is reported as a reason, never guessed: the model loads without a tokenizer, as other loaders do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tformer.tokenizers import Tokenizer, TokenizerError, from_dict
from tformer.tokenizers.byte_level import GPT2_PATTERN

_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
# tokenizer.ggml.pre -> (regex, ignore_merges, NFC normalizer), as Hugging Face's tokenizer.json of that family
PRE_TOKENIZERS: Mapping[str, tuple[str, bool, bool]] = {
    "gpt-2": (GPT2_PATTERN, False, False),
    "llama-bpe": (_LLAMA3, True, False),
    "qwen2": (_QWEN2, False, True),
}
# GGUF token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # SentencePiece's word boundary
_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")  # SentencePiece's byte-fallback pieces


def tokenizer_from_gguf(fields: Mapping[str, Any]) -> tuple[Tokenizer | None, str | None]:
    """The tokenizer of a GGUF file's metadata ``fields`` (key -> value), or (None, why not); (None, None) for a
    file without one."""
    kind = fields.get("tokenizer.ggml.model")
    tokens = fields.get("tokenizer.ggml.tokens")
    if kind in (None, "none", "no_vocab") or tokens is None:
        return None, None  # no tokenizer: nothing to report, as a folder without tokenizer files
    types = fields.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    try:
        if kind == "gpt2":
            document = _byte_level_document(fields, tokens, types)
        elif kind == "llama":
            document = _sentencepiece_document(fields, tokens, types)
        else:
            return None, f"tokenizer.ggml.model={kind!r} is not read by tformer (supported: 'gpt2', 'llama')"
        if isinstance(document, str):
            return None, document
        return from_dict(document), None
    except (TokenizerError, KeyError, ValueError) as error:
        return None, f"tokenizer.ggml.* do not make a tokenizer tformer reads: {error}"


def _added_tokens(tokens: Sequence[str], types: Sequence[int]) -> list[dict[str, Any]]:
    """tokenizer.json's ``added_tokens``: control tokens as special ones, user-defined as plain added ones."""
    return [{"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": kind == CONTROL}
            for i, (token, kind) in enumerate(zip(tokens, types, strict=True)) if kind in (CONTROL, USER_DEFINED)]


def _post_processor(fields: Mapping[str, Any], tokens: Sequence[str]) -> dict[str, Any] | None:
    """A template adding the beginning-of-sequence token where ``tokenizer.ggml.add_bos_token`` says so."""
    bos = fields.get("tokenizer.ggml.bos_token_id")
    if not fields.get("tokenizer.ggml.add_bos_token") or bos is None:
        return None
    token = tokens[bos]
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": token, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": token, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": token, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {token: {"id": token, "ids": [bos], "tokens": [token]}}}


def _byte_level_document(fields: Mapping[str, Any], tokens: Sequence[str], types: Sequence[int]) -> dict | str:
    """tokenizer.json of a ``gpt2`` GGUF tokenizer, or why there is none."""
    pre = fields.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in PRE_TOKENIZERS:
        return (f"tokenizer.ggml.pre={pre!r} names a pre-tokenizer tformer does not know "
                f"(known: {', '.join(PRE_TOKENIZERS)})")
    pattern, ignore_merges, nfc = PRE_TOKENIZERS[pre]
    pre_tokenizer: dict[str, Any] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    merges = fields.get("tokenizer.ggml.merges")
    if merges is None:
        return "a gpt2 GGUF tokenizer without tokenizer.ggml.merges"
    return {
        "version": "1.0", "added_tokens": _added_tokens(tokens, types),
        "normalizer": {"type": "NFC"} if nfc else None, "pre_tokenizer": pre_tokenizer,
        "post_processor": _post_processor(fields, tokens),
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": {token: i for i, token in enumerate(tokens)},
                  "merges": list(merges)},
    }


def merges_from_scores(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int]) -> list[str]:
    """SentencePiece BPE's merges: every split of a normal piece into two pieces of the vocabulary, ordered by the
    merged piece's score (highest first), then by the halves' ids (as ``tokenizers``' SentencePieceExtractor)."""
    vocab = {token: i for i, token in enumerate(tokens)}
    found = []
    for i, piece in enumerate(tokens):
        if types[i] != NORMAL:
            continue
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        found.extend((left, right, scores[i]) for left, right in local)
    found.sort(key=lambda merge: merge[2], reverse=True)  # stable: ties keep the order above
    return [f"{left} {right}" for left, right, _ in found]


def _sentencepiece_document(fields: Mapping[str, Any], tokens: Sequence[str], types: Sequence[int]) -> dict | str:
    """tokenizer.json of a ``llama`` (SentencePiece BPE) GGUF tokenizer, as transformers' LlamaConverter makes it."""
    scores = fields.get("tokenizer.ggml.scores")
    if scores is None:
        return "a llama GGUF tokenizer without tokenizer.ggml.scores"
    unk = fields.get("tokenizer.ggml.unknown_token_id")
    prefix = fields.get("tokenizer.ggml.add_space_prefix", True)
    normalizers = [{"type": "Prepend", "prepend": SPACE}] if prefix else []
    normalizers.append({"type": "Replace", "pattern": {"String": " "}, "content": SPACE})
    decoders = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}]
    if prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {
        "version": "1.0", "added_tokens": _added_tokens(tokens, [CONTROL if t == UNKNOWN else t for t in types]),
        "normalizer": {"type": "Sequence", "normalizers": normalizers}, "pre_tokenizer": None,
        "post_processor": _post_processor(fields, tokens),
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {"type": "BPE", "dropout": None, "unk_token": None if unk is None else tokens[unk],
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False,
                  "vocab": {token: i for i, token in enumerate(tokens)},
                  "merges": merges_from_scores(tokens, scores, types)},
    }


def tokenizer_to_gguf(tokenizer: Tokenizer) -> tuple[dict[str, Any] | None, str | None]:
    """``tokenizer.ggml.*`` metadata (key -> value) for a byte-level BPE tokenizer whose pre-tokenizer llama.cpp
    knows by name (``gpt2``) or a SentencePiece BPE one in Llama's layout (``llama``), or (None, why not): other
    tokenizers are not written (the model is, without one)."""
    document = tokenizer.to_dict()
    model = document.get("model") or {}
    if model.get("type") == "BPE" and (document.get("decoder") or {}).get("type") == "ByteLevel":
        return _byte_level_fields(document)
    if model.get("type") == "BPE" and model.get("byte_fallback"):
        return _sentencepiece_fields(document)
    return None, (f"{type(tokenizer).__name__} is neither byte-level BPE nor SentencePiece BPE with byte fallback "
                  "(the tokenizers GGUF's 'gpt2' and 'llama' models hold)")


def _token_table(document: Mapping[str, Any], unk: str | None = None) -> tuple[list[str], list[int]]:
    """Every id's token and GGUF type: special added tokens CONTROL, other added ones USER_DEFINED, SentencePiece's
    byte pieces (``<0x0A>``) BYTE, the unknown token UNKNOWN, ids nothing names UNUSED."""
    vocab: Mapping[str, int] = document["model"]["vocab"]
    added = {entry["id"]: entry for entry in document.get("added_tokens") or []}
    size = max([*vocab.values(), *added]) + 1
    tokens, types = [""] * size, [UNUSED] * size
    for token, i in vocab.items():
        tokens[i], types[i] = token, NORMAL
    for i, entry in added.items():
        tokens[i], types[i] = entry["content"], CONTROL if entry.get("special") else USER_DEFINED
    for i, token in enumerate(tokens):
        if unk is not None and token == unk:
            types[i] = UNKNOWN
        elif unk is not None and types[i] == NORMAL and _BYTE_PIECE.fullmatch(token):
            types[i] = BYTE
    return tokens, types


def _adds_bos(document: Mapping[str, Any]) -> bool:
    """Whether the tokenizer's template puts a special token before the sequence."""
    post = document.get("post_processor") or {}
    single = (post.get("single") or [{}]) if post.get("type") == "TemplateProcessing" else [{}]
    return "SpecialToken" in single[0]


def _byte_level_fields(document: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    pattern = _byte_level_pattern(document.get("pre_tokenizer"))
    pre = next((name for name, (known, _, _) in PRE_TOKENIZERS.items() if known == pattern), None)
    if pre is None:
        return None, "its pre-tokenizer regex is none of those llama.cpp names (gpt-2, llama-bpe, qwen2)"
    _, ignore_merges, nfc = PRE_TOKENIZERS[pre]
    found = (bool(document["model"].get("ignore_merges")), document.get("normalizer"))
    if found != (ignore_merges, {"type": "NFC"} if nfc else None):
        return None, (f"its regex is {pre}'s, but not with {pre}'s ignore_merges={ignore_merges} and "
                      f"{'NFC' if nfc else 'no'} normalizer (llama.cpp would tokenize it as {pre})")
    tokens, types = _token_table(document)
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in document["model"].get("merges", [])]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.add_bos_token": _adds_bos(document)}, None


def _sentencepiece_fields(document: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """A SentencePiece BPE tokenizer as GGUF's ``llama`` model: pieces, types and scores, each merged piece scored
    by its merge's rank (highest first, as llama.cpp and ``merges_from_scores`` merge), the others below them."""
    layout = next((prefix for prefix in (True, False) if (document.get("normalizer"), document.get("pre_tokenizer"),
                   document.get("decoder")) == _sentencepiece_layout(prefix)), None)
    if layout is None:
        return None, ("its normalizer, pre-tokenizer or decoder is not Llama's SentencePiece layout (Prepend + "
                      "Replace of spaces by '\u2581', no pre-tokenizer), the one GGUF's 'llama' model holds")
    model = document["model"]
    tokens, types = _token_table(document, unk=model.get("unk_token") or "<unk>")
    merges = [tuple(merge.split(" ", 1)) if isinstance(merge, str) else tuple(merge) for merge in model["merges"]]
    rank: dict[str, int] = {}
    for k, (left, right) in enumerate(merges):
        rank.setdefault(left + right, k)
    scores = [-float(rank[token]) if token in rank else (-float(len(merges)) if kind == NORMAL else 0.0)
              for token, kind in zip(tokens, types, strict=True)]
    fields: dict[str, Any] = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                              "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
                              "tokenizer.ggml.add_space_prefix": layout,
                              "tokenizer.ggml.add_bos_token": _adds_bos(document)}
    if UNKNOWN in types:
        fields["tokenizer.ggml.unknown_token_id"] = types.index(UNKNOWN)
    return fields, None


def _sentencepiece_layout(prefix: bool) -> tuple[dict[str, Any], None, dict[str, Any]]:
    """(normalizer, pre-tokenizer, decoder) of Llama's SentencePiece BPE tokenizer.json, with or without the
    dummy prefix, as ``_sentencepiece_document`` writes them."""
    document = _sentencepiece_document({"tokenizer.ggml.scores": [], "tokenizer.ggml.add_space_prefix": prefix},
                                       [], [])
    return document["normalizer"], None, document["decoder"]


def _byte_level_pattern(pre_tokenizer: Mapping[str, Any] | None) -> str | None:
    """The regex of a byte-level pre-tokenizer as tformer writes it, or None."""
    if not pre_tokenizer:
        return None
    if pre_tokenizer.get("type") == "ByteLevel" and pre_tokenizer.get("use_regex", True):
        return GPT2_PATTERN
    steps = pre_tokenizer.get("pretokenizers") or []
    if pre_tokenizer.get("type") == "Sequence" and steps and steps[0].get("type") == "Split":
        return (steps[0].get("pattern") or {}).get("Regex")
    return None
