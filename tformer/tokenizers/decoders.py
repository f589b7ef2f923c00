"""Decoders: how token strings become text again, as Hugging Face chains them for
SentencePiece-style BPE (Llama 2, Mistral, Gemma): ``Replace`` ("▁" back to " "),
``ByteFallback`` (runs of "<0xE6>" tokens back to their UTF-8 text), ``Fuse`` (one string),
``Strip`` (the space a word-start mark left before the text) and ``Metaspace``. Each step maps
a list of strings to a list of strings; the text is the final list joined."""

from __future__ import annotations

import re

from tformer.tokenizers.errors import TokenizerError

# A byte-fallback token: "<0x" + two characters Rust's u8::from_str_radix(_, 16) reads + ">".
_BYTE_TOKEN = re.compile(r"<0x(\+[0-9A-Fa-f]|[0-9A-Fa-f]{2})>")
KNOWN = ("Sequence", "Replace", "ByteFallback", "Fuse", "Strip", "Metaspace")


class DecoderStep:
    """One step of a decoder chain."""

    def __call__(self, tokens: list[str]) -> list[str]:
        raise NotImplementedError

    def to_json(self) -> dict:
        raise NotImplementedError


class ReplaceDecoder(DecoderStep):
    """Every occurrence of ``pattern`` in each token becomes ``content``."""

    def __init__(self, pattern: str, content: str) -> None:
        if not isinstance(pattern, str) or not pattern or not isinstance(content, str):
            raise TokenizerError(f"a Replace decoder needs a non-empty str pattern and a str content, got "
                                 f"{pattern!r} -> {content!r}")
        self.pattern, self.content = pattern, content

    def __call__(self, tokens: list[str]) -> list[str]:
        return [token.replace(self.pattern, self.content) for token in tokens]

    def to_json(self) -> dict:
        return {"type": "Replace", "pattern": {"String": self.pattern}, "content": self.content}


class ByteFallbackDecoder(DecoderStep):
    """Each run of byte tokens becomes its UTF-8 text, or one "\ufffd" per byte when the run is
    not valid UTF-8 (Hugging Face's rule, not Python's "replace")."""

    def __call__(self, tokens: list[str]) -> list[str]:
        out: list[str] = []
        pending = bytearray()
        for token in tokens:
            match = _BYTE_TOKEN.fullmatch(token) if token.startswith("<0x") else None
            if match is not None:
                pending.append(int(match.group(1), 16))
                continue
            if pending:
                out.append(_bytes_text(pending))
                pending.clear()
            out.append(token)
        if pending:
            out.append(_bytes_text(pending))
        return out

    def to_json(self) -> dict:
        return {"type": "ByteFallback"}


def _bytes_text(data: bytearray) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(data)


class FuseDecoder(DecoderStep):
    """All tokens joined into one string."""

    def __call__(self, tokens: list[str]) -> list[str]:
        return ["".join(tokens)]

    def to_json(self) -> dict:
        return {"type": "Fuse"}


class StripDecoder(DecoderStep):
    """Up to ``start`` leading and ``stop`` trailing ``content`` characters cut from each token."""

    def __init__(self, content: str, start: int, stop: int) -> None:
        if not isinstance(content, str) or len(content) != 1:
            raise TokenizerError(f"a Strip decoder strips one character, got content={content!r}")
        for name, value in (("start", start), ("stop", stop)):
            if type(value) is not int or value < 0:
                raise TokenizerError(f"a Strip decoder's {name} must be an integer >= 0, got {value!r}")
        self.content, self.start, self.stop = content, start, stop

    def __call__(self, tokens: list[str]) -> list[str]:
        out = []
        for token in tokens:
            begin = 0
            while begin < min(self.start, len(token)) and token[begin] == self.content:
                begin += 1
            end = len(token)
            while len(token) - end < self.stop and end > begin and token[end - 1] == self.content:
                end -= 1
            out.append(token[begin:end])
        return out

    def to_json(self) -> dict:
        return {"type": "Strip", "content": self.content, "start": self.start, "stop": self.stop}


class MetaspaceDecoder(DecoderStep):
    """``replacement`` back to spaces; in the first token it is dropped unless nothing was
    prepended (``prepend_scheme`` "never"), as Hugging Face's Metaspace decoder does."""

    def __init__(self, replacement: str, prepend_scheme: str, split: bool) -> None:
        if not isinstance(replacement, str) or len(replacement) != 1:
            raise TokenizerError(f"a Metaspace decoder's replacement is one character, got {replacement!r}")
        if prepend_scheme not in ("always", "first", "never"):
            raise TokenizerError(f"Metaspace prepend_scheme {prepend_scheme!r} is not supported; known: always, "
                                 "first, never")
        self.replacement, self.prepend_scheme, self.split = replacement, prepend_scheme, bool(split)

    def __call__(self, tokens: list[str]) -> list[str]:
        out = [token.replace(self.replacement, " ") for token in tokens]
        if out and self.prepend_scheme != "never":
            out[0] = tokens[0].replace(self.replacement, "")
        return out

    def to_json(self) -> dict:
        return {"type": "Metaspace", "replacement": self.replacement, "prepend_scheme": self.prepend_scheme,
                "split": self.split}


class DecoderChain:
    """Steps applied in order, then joined; ``sequence`` says whether the file wrote them as a
    Sequence (kept so the json written back is the json read)."""

    def __init__(self, steps: list[DecoderStep], sequence: bool = True) -> None:
        if not sequence and len(steps) != 1:
            raise TokenizerError("a decoder that is not a Sequence has exactly one step")
        self.steps, self.sequence = steps, sequence

    def decode(self, tokens: list[str]) -> str:
        for step in self.steps:
            tokens = step(tokens)
        return "".join(tokens)

    def to_json(self) -> dict:
        if not self.sequence:
            return self.steps[0].to_json()
        return {"type": "Sequence", "decoders": [step.to_json() for step in self.steps]}


def decoder_from_json(data: dict | None) -> DecoderChain:
    """The chain a tokenizer.json ``decoder`` describes; any other decoder is refused."""
    kind = None if data is None else data.get("type")
    if kind == "Sequence":
        return DecoderChain([_step_from_json(step) for step in data.get("decoders") or []])
    return DecoderChain([_step_from_json(data)], sequence=False)


def _step_from_json(data: dict | None) -> DecoderStep:
    kind = data.get("type") if isinstance(data, dict) else None
    if kind == "Replace":
        pattern = data.get("pattern") or {}
        if "String" not in pattern:
            raise TokenizerError(f"Replace decoder with pattern {pattern!r} is not supported; only a String pattern is")
        return ReplaceDecoder(pattern["String"], data.get("content"))
    if kind == "ByteFallback":
        return ByteFallbackDecoder()
    if kind == "Fuse":
        return FuseDecoder()
    if kind == "Strip":
        return StripDecoder(data.get("content"), data.get("start", 0), data.get("stop", 0))
    if kind == "Metaspace":
        scheme = data.get("prepend_scheme")
        if scheme is None:  # older files: add_prefix_space
            scheme = "always" if data.get("add_prefix_space", True) else "never"
        return MetaspaceDecoder(data.get("replacement", "▁"), scheme, data.get("split", True))
    raise TokenizerError(f"decoder {kind!r} is not supported for SentencePiece-style BPE; known: {', '.join(KNOWN)}")
