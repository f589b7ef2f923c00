"""The one loader: a ``tokenizer.json`` (Hugging Face's, or tformer's which is the same format;
byte-level BPE, SentencePiece-style BPE, WordPiece, SentencePiece Unigram, characters),
GPT-2's ``encoder.json`` + ``vocab.bpe`` or ``vocab.json`` + ``merges.txt``, BERT's
``vocab.txt``, or a folder holding any of them. Every unsupported component is refused with
its name and the supported ones, never silently approximated."""

from __future__ import annotations

import json
from pathlib import Path

from tformer.tokenizers.added_tokens import AddedToken, infer_roles
from tformer.tokenizers.base import TOKENIZER_FILE, Tokenizer
from tformer.tokenizers.bpe import BPETokenizer
from tformer.tokenizers.byte_level import GPT2_PATTERN
from tformer.tokenizers.char import CHAR_SPLIT, CharTokenizer
from tformer.tokenizers.decoders import decoder_from_json
from tformer.tokenizers.errors import TokenizerError
from tformer.tokenizers.normalizers import NoNormalizer, normalizer_from_json
from tformer.tokenizers.post_processor import Template, offset_trimming
from tformer.tokenizers.pre_tokenizers import SplitPreTokenizer, pre_tokenizer_from_json
from tformer.tokenizers.sentencepiece_bpe import SentencePieceBPETokenizer
from tformer.tokenizers.unigram import Metaspace, UnigramTokenizer
from tformer.tokenizers.wordpiece import WordPieceTokenizer

# Folder layouts, in the order they are looked for.
_GPT2_PAIRS = (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe"))
_BERT_VOCAB = "vocab.txt"
_LOOKED_FOR = "tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe, vocab.txt"


def load(path: str | Path, lowercase: bool | None = None) -> Tokenizer:
    """Load a tokenizer from a file or a folder (see the module docstring for the formats).
    ``lowercase`` applies to a bare BERT ``vocab.txt``, which cannot say whether its model is
    cased; by default it is read from a ``tokenizer_config.json`` beside it, else True."""
    path = Path(path)
    if path.is_dir():
        if (path / TOKENIZER_FILE).is_file():
            return _load_json_file(path / TOKENIZER_FILE)
        for vocab_name, merges_name in _GPT2_PAIRS:
            if (path / vocab_name).is_file() and (path / merges_name).is_file():
                return BPETokenizer.from_gpt2_files(path / vocab_name, path / merges_name)
        if (path / _BERT_VOCAB).is_file():
            return WordPieceTokenizer.from_vocab_file(path / _BERT_VOCAB, *_bert_options(path / _BERT_VOCAB, lowercase))
        raise TokenizerError(f"{path}: no tokenizer in this folder (looked for {_LOOKED_FOR})")
    if not path.exists():
        raise TokenizerError(f"{path}: no such tokenizer file or folder")
    if path.name in ("merges.txt", "vocab.bpe"):
        vocab_name = "vocab.json" if path.name == "merges.txt" else "encoder.json"
        if not (path.parent / vocab_name).is_file():
            raise TokenizerError(f"{path}: BPE merges without their vocabulary ({vocab_name} beside them)")
        return BPETokenizer.from_gpt2_files(path.parent / vocab_name, path)
    if path.suffix == ".txt":
        return WordPieceTokenizer.from_vocab_file(path, *_bert_options(path, lowercase))
    if path.suffix == ".json":
        return _load_json_file(path)
    raise TokenizerError(f"{path}: unknown tokenizer file; expected one of {_LOOKED_FOR}")


def _load_json_file(path: Path) -> Tokenizer:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TokenizerError(f"{path}: not a readable tokenizer file ({error})") from None
    if isinstance(data, dict) and data and all(type(value) is int for value in data.values()):
        # A bare vocabulary (GPT-2's encoder.json / vocab.json; note "model" is one of its tokens).
        for merges_name in ("vocab.bpe", "merges.txt"):
            if (path.parent / merges_name).is_file():
                return BPETokenizer.from_gpt2_files(path, path.parent / merges_name)
        raise TokenizerError(f"{path}: a BPE vocabulary without its merges (no vocab.bpe or merges.txt beside it)")
    try:
        return from_dict(data)
    except TokenizerError as error:
        raise TokenizerError(f"{path}: {error}") from None


def from_dict(data: dict) -> Tokenizer:
    """A tokenizer from a parsed tokenizer.json document."""
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise TokenizerError("not a tokenizer.json (it has no model)")
    model = data["model"]
    kind = model.get("type") or _guess_model_type(model)
    try:
        if kind == "BPE":
            return _bpe_from_dict(data)
        if kind == "WordPiece":
            return _wordpiece_from_dict(data)
        if kind == "Unigram":
            return _unigram_from_dict(data)
        if kind in ("WordLevel", "Char"):
            if kind == "WordLevel" and data.get("pre_tokenizer") != CHAR_SPLIT:
                raise TokenizerError("WordLevel is supported only over single characters (tformer's CharTokenizer)")
            return CharTokenizer.from_dict(data)
    except KeyError as error:
        raise TokenizerError(f"a {kind} tokenizer.json lacks the field {error}") from None
    raise TokenizerError(f"unknown tokenizer model type {kind!r}; known: BPE (byte-level or SentencePiece-style), "
                         "WordPiece, Unigram (SentencePiece), WordLevel (characters), Char")


def _guess_model_type(model: dict) -> str | None:
    if "merges" in model:
        return "BPE"
    if "max_input_chars_per_word" in model:
        return "WordPiece"
    return None


def _added_and_roles(data: dict) -> tuple[dict[int, AddedToken], dict[str, str]]:
    entries = data.get("added_tokens") or []
    added = {int(entry["id"]): AddedToken.from_json(entry) for entry in entries}
    roles = {role: entry["content"] for entry in entries for role in entry.get("tformer_roles", [])}
    if not roles:
        roles = infer_roles(token.content for token in added.values() if token.special)
        unk = data["model"].get("unk_token")
        if unk and "unk" not in roles:
            roles["unk"] = unk
    return added, roles


def _bpe_from_dict(data: dict) -> BPETokenizer | SentencePieceBPETokenizer:
    """Byte-level BPE (GPT-2, Llama 3, Qwen2: a ByteLevel decoder or pre-tokenizer) or
    SentencePiece-style BPE over characters (Llama 2, Mistral, Gemma: anything else)."""
    model = data["model"]
    for name, allowed in (("dropout", (None, 0, 0.0)), ("continuing_subword_prefix", (None, "")),
                          ("end_of_word_suffix", (None, ""))):
        if model.get(name) not in allowed:
            raise TokenizerError(f"BPE with {name}={model.get(name)!r} is not supported; allowed: "
                                 f"{' or '.join(map(repr, allowed[:2]))}")
    merges = [tuple(merge.split(" ", 1)) if isinstance(merge, str) else tuple(merge) for merge in model["merges"]]
    added, roles = _added_and_roles(data)
    template = Template.from_json(data.get("post_processor"))
    if not _is_byte_level(data):
        return _sentencepiece_bpe_from_dict(data, merges, added, roles, template)
    if model.get("byte_fallback"):
        raise TokenizerError("byte-level BPE with byte_fallback=true is not supported (every byte has a token); "
                             "byte_fallback is read for SentencePiece-style BPE")
    if model.get("fuse_unk") and model.get("unk_token"):
        raise TokenizerError("byte-level BPE with fuse_unk is not supported; fuse_unk is read for SentencePiece-style "
                             "BPE")
    decoder = data.get("decoder") or {}
    if decoder.get("type") != "ByteLevel":
        raise TokenizerError(f"byte-level BPE decoder {decoder.get('type')!r} is not supported; known: ByteLevel")
    pattern, add_prefix_space = _byte_level_pre_tokenizer(data.get("pre_tokenizer"))
    trim_offsets, trim_prefix_space = offset_trimming(data.get("post_processor"))
    if trim_offsets and trim_prefix_space != add_prefix_space:
        raise TokenizerError(f"a post_processor trimming offsets with add_prefix_space={trim_prefix_space} after a "
                             f"pre_tokenizer with add_prefix_space={add_prefix_space} is not supported")
    return BPETokenizer(
        model["vocab"], merges, added_tokens=added, roles=roles, template=template, pattern=pattern,
        unk_token=model.get("unk_token"), ignore_merges=bool(model.get("ignore_merges")),
        add_prefix_space=add_prefix_space, normalizer=normalizer_from_json(data.get("normalizer")),
        trim_offsets=trim_offsets,
    )


def _is_byte_level(data: dict) -> bool:
    """Whether a BPE file is byte-level: its decoder or a step of its pre-tokenizer is ByteLevel."""
    pre_tokenizer = data.get("pre_tokenizer") or {}
    steps = (pre_tokenizer.get("pretokenizers") or []) if pre_tokenizer.get("type") == "Sequence" else [pre_tokenizer]
    return (data.get("decoder") or {}).get("type") == "ByteLevel" or any(
        isinstance(step, dict) and step.get("type") == "ByteLevel" for step in steps)


def _sentencepiece_bpe_from_dict(data: dict, merges: list, added: dict, roles: dict,
                                 template: Template) -> SentencePieceBPETokenizer:
    model = data["model"]
    if offset_trimming(data.get("post_processor"))[0]:
        raise TokenizerError("a post_processor trimming byte-level offsets is not supported with SentencePiece-style "
                             "BPE (its tokens hold no byte-level spaces)")
    pre_tokenizer = data.get("pre_tokenizer")
    kind = None if pre_tokenizer is None else pre_tokenizer.get("type")
    if kind in ("Metaspace", "Sequence"):
        pre_tokenizer = _metaspace_from_json(pre_tokenizer, model="SentencePiece-style BPE")
    elif kind == "Split":
        pre_tokenizer = SplitPreTokenizer.from_json(pre_tokenizer)
    elif kind is not None:
        raise TokenizerError(f"SentencePiece-style BPE pre_tokenizer {kind!r} is not supported; known: none, "
                             "Metaspace, Split, Sequence[WhitespaceSplit, Metaspace]")
    return SentencePieceBPETokenizer(
        model["vocab"], merges, unk_token=model.get("unk_token"), byte_fallback=bool(model.get("byte_fallback")),
        fuse_unk=bool(model.get("fuse_unk")), ignore_merges=bool(model.get("ignore_merges")),
        normalizer=normalizer_from_json(data.get("normalizer")), pre_tokenizer=pre_tokenizer,
        decoder=decoder_from_json(data.get("decoder")), added_tokens=added, roles=roles, template=template,
    )


def _byte_level_pre_tokenizer(data: dict | None) -> tuple[str, bool]:
    """(regex, add_prefix_space) from ByteLevel (GPT-2's regex) or Sequence[Split(regex), ByteLevel]."""
    kind = None if data is None else data.get("type")
    if kind == "ByteLevel" and data.get("use_regex", True):
        return GPT2_PATTERN, bool(data.get("add_prefix_space", False))
    if kind == "Sequence":
        steps = data.get("pretokenizers", [])
        if (len(steps) == 2 and steps[0].get("type") == "Split" and steps[1].get("type") == "ByteLevel"
                and not steps[1].get("use_regex", True) and "Regex" in steps[0].get("pattern", {})
                and steps[0].get("behavior") == "Isolated" and not steps[0].get("invert")):
            return steps[0]["pattern"]["Regex"], bool(steps[1].get("add_prefix_space", False))
    raise TokenizerError(f"BPE pre_tokenizer {kind!r} is not supported; known: ByteLevel, "
                         "Sequence[Split(regex, Isolated), ByteLevel(use_regex=false)]")


def _wordpiece_from_dict(data: dict) -> WordPieceTokenizer:
    model = data["model"]
    decoder = data.get("decoder") or {"type": "WordPiece", "cleanup": True}
    if decoder.get("type") != "WordPiece":
        raise TokenizerError(f"WordPiece decoder {decoder.get('type')!r} is not supported; known: WordPiece")
    added, roles = _added_and_roles(data)
    normalizer = normalizer_from_json(data.get("normalizer"))
    return WordPieceTokenizer(
        model["vocab"],
        unk_token=model.get("unk_token", "[UNK]"),
        continuing_subword_prefix=model.get("continuing_subword_prefix", "##"),
        max_input_chars_per_word=model.get("max_input_chars_per_word", 100),
        normalizer=normalizer if normalizer is not None else NoNormalizer(),
        pre_tokenizer=pre_tokenizer_from_json(data.get("pre_tokenizer")),
        added_tokens=added,
        roles=roles,
        template=Template.from_json(data.get("post_processor")),
        decoder_cleanup=bool(decoder.get("cleanup", True)),
    )


def _unigram_from_dict(data: dict) -> UnigramTokenizer:
    model = data["model"]
    if model.get("byte_fallback"):
        raise TokenizerError("Unigram with byte_fallback=true is not supported")
    vocab = model["vocab"]
    if not isinstance(vocab, list) or not all(isinstance(entry, (list, tuple)) and len(entry) == 2 for entry in vocab):
        raise TokenizerError("a Unigram vocab must be a list of [piece, score] pairs")
    if model.get("unk_id") is None:
        raise TokenizerError("a Unigram tokenizer.json without unk_id is not supported")
    metaspace = _metaspace_from_json(data.get("pre_tokenizer"))
    decoder = data.get("decoder")
    decoder_metaspace = _metaspace_from_json(decoder, "decoder") if decoder is not None else None
    if decoder_metaspace is None or (decoder_metaspace.replacement, decoder_metaspace.prepend_scheme) != (
            metaspace.replacement, metaspace.prepend_scheme):
        raise TokenizerError(f"Unigram decoder {decoder!r} is not supported; it must be the Metaspace its "
                             f"pre_tokenizer implies ({metaspace.decoder_json()})")
    added, roles = _added_and_roles(data)
    return UnigramTokenizer(
        [(piece, score) for piece, score in vocab], unk_id=model["unk_id"], metaspace=metaspace,
        normalizer=normalizer_from_json(data.get("normalizer")), added_tokens=added, roles=roles,
        template=Template.from_json(data.get("post_processor")),
    )


def _metaspace_from_json(data: dict | None, what: str = "pre_tokenizer", model: str = "Unigram") -> Metaspace:
    """Metaspace, alone or after WhitespaceSplit (T5); "add_prefix_space" of older files read as a scheme."""
    kind = None if data is None else data.get("type")
    whitespace_split = False
    if kind == "Sequence":
        steps = data.get("pretokenizers", [])
        if len(steps) == 2 and steps[0].get("type") == "WhitespaceSplit":
            whitespace_split, data, kind = True, steps[1], steps[1].get("type")
    if kind != "Metaspace":
        raise TokenizerError(f"{model} {what} {kind!r} is not supported; known: Metaspace"
                             + (", Sequence[WhitespaceSplit, Metaspace]" if what == "pre_tokenizer" else ""))
    scheme = data.get("prepend_scheme")
    if scheme is None:
        scheme = "always" if data.get("add_prefix_space", True) else "never"
    return Metaspace(data.get("replacement", "▁"), scheme, bool(data.get("split", True)), whitespace_split)


def _bert_options(vocab_file: Path, lowercase: bool | None) -> tuple[bool, bool | None]:
    """(lowercase, strip_accents) for a bare vocab.txt: ``do_lower_case`` and ``strip_accents`` of
    a ``tokenizer_config.json`` beside it; ``lowercase`` given overrides, the default is True."""
    config = vocab_file.parent / "tokenizer_config.json"
    values: dict = {}
    if config.is_file():
        try:
            values = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            values = {}
        if not isinstance(values, dict):
            values = {}
    do_lower_case = values.get("do_lower_case")
    strip_accents = values.get("strip_accents")
    if lowercase is None:
        lowercase = do_lower_case if isinstance(do_lower_case, bool) else True
    return lowercase, strip_accents if isinstance(strip_accents, bool) else None
