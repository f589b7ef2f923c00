"""Structured outputs: a ``Constraint`` says what the new text must be (a JSON object, JSON matching a schema, a
regular expression's match, one of a list of strings, or a Lark grammar's sentence), and ``GenerationConfig``'s
``constraint`` field carries it to the one token chooser (``rules.Constrained``), so ``generate``, the command line
and the serving engine all honour it.

The grammar engine is llguidance (``pip install 'tformer[structured]'``), imported only when a constraint is made:
it is one wheel with no dependencies (xgrammar brings triton and apache-tvm-ffi; outlines-core builds an index per
schema before the first token), computes a token mask from a grammar in tens of microseconds on large vocabularies
(``benchmarks/structured_outputs.py`` measures all three on tformer's), and reads JSON Schema, regular expressions
and Lark grammars. This module imports no torch: the serving process that only speaks HTTP checks a request's
constraint with it (``Constraint``'s constructors compile the grammar, so a bad schema, regex or grammar is refused
where it enters).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tformer.generation.errors import GenerationError
from tformer.tokenizers.byte_level import token_bytes as byte_level_bytes

KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")
# JSON as Python's json.dumps writes it: ", " and ": " between items, no other whitespace (a schema's "x-guidance"
# object may ask for another layout), so a model's JSON cannot run on in blank space.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
INSTALL = ("structured outputs need the llguidance package: pip install 'tformer[structured]' (or pip install "
           "llguidance)")


def grammar_engine() -> Any:
    """The llguidance module (with its GBNF converter); a GenerationError saying what to install without it."""
    try:
        import llguidance
        import llguidance.gbnf_to_lark  # noqa: F401  (the module, read as llguidance.gbnf_to_lark)
    except ImportError:
        raise GenerationError(INSTALL) from None
    return llguidance


@dataclass(frozen=True)
class Constraint:
    """What the new text must be: ``kind`` (one of ``KINDS``) and its ``value`` as canonical text (a JSON schema or
    a choice list as compact JSON, keys in their given order: an object's properties are written in its schema's
    order; a regex or grammar as given; "" for ``json_object``), so equal constraints compare and hash equal. Made
    through the constructors, which check and compile it."""

    kind: str
    value: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GenerationError(f"constraint kind {self.kind!r} is unknown; known: {', '.join(KINDS)}")
        if not isinstance(self.value, str):
            raise GenerationError(f"a {self.kind} constraint's value must be text, not {type(self.value).__name__}")
        problem = grammar_engine().LLMatcher.validate_grammar(self.grammar_text())
        if problem:
            raise GenerationError(f"{self.describe()} cannot be compiled: {_first_line(problem)}")

    # ---- constructors --------------------------------------------------------------------------------

    @classmethod
    def json_object(cls) -> Constraint:
        """Any JSON object (OpenAI's ``response_format`` ``json_object``)."""
        return cls("json_object")

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> Constraint:
        """JSON text valid under ``schema`` (a JSON Schema as a dict: objects, arrays, enums, bounds, ``$ref``...)."""
        if isinstance(schema, bool) or not isinstance(schema, dict):
            raise GenerationError(f"json_schema must be a JSON Schema object (a dict), not {type(schema).__name__}")
        try:
            text = json.dumps(schema, separators=(",", ":"), allow_nan=False)  # key order kept: properties come in it
        except (TypeError, ValueError) as error:
            raise GenerationError(f"json_schema is not JSON: {error}") from None
        return cls("json_schema", text)

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        """Text matching ``pattern`` whole (Rust ``regex`` syntax, as llguidance reads it: no look-around or
        back-references)."""
        if not isinstance(pattern, str) or not pattern:
            raise GenerationError(f"regex must be a non-empty string, not {pattern!r}")
        return cls("regex", pattern)

    @classmethod
    def choice(cls, options: list[str]) -> Constraint:
        """Exactly one of ``options`` (non-empty strings)."""
        if (isinstance(options, str) or not isinstance(options, (list, tuple)) or not options
                or not all(isinstance(option, str) and option for option in options)):
            raise GenerationError(f"choice must be a non-empty list of non-empty strings, not {options!r}")
        return cls("choice", json.dumps(list(options), separators=(",", ":")))

    @classmethod
    def grammar(cls, text: str) -> Constraint:
        """A sentence of the grammar ``text``: Lark (llguidance's dialect: rules from ``start``, string and
        ``/regex/`` terminals, ``%json {schema}`` inside), or GBNF (llama.cpp's, rules from ``root`` written with
        ``::=``; llguidance converts it to Lark)."""
        if not isinstance(text, str) or not text.strip():
            raise GenerationError(f"grammar must be a non-empty Lark grammar, not {text!r}")
        return cls("grammar", text)

    # ---- what the engine reads -----------------------------------------------------------------------

    def grammar_text(self) -> str:
        """The constraint as an llguidance grammar (its JSON form)."""
        matcher = grammar_engine().LLMatcher
        if self.kind == "json_object":
            return matcher.grammar_from_json_schema({"type": "object"}, JSON_LAYOUT)
        if self.kind == "json_schema":
            try:
                return matcher.grammar_from_json_schema(self.value, JSON_LAYOUT)
            except (ValueError, TypeError) as error:
                raise GenerationError(f"json_schema cannot be compiled: {_first_line(str(error))}") from None
        if self.kind == "regex":
            return matcher.grammar_from_regex(self.value)
        if self.kind == "choice":
            options = json.loads(self.value)
            return matcher.grammar_from_lark("start: " + " | ".join(json.dumps(option) for option in options))
        try:
            lark = grammar_engine().gbnf_to_lark.any_to_lark(self.value)  # GBNF converted; Lark as it is
        except Exception as error:  # the converter's own parse errors (ValueError, AssertionError, ...)
            raise GenerationError(f"{self.describe()} cannot be read as Lark or GBNF: {_first_line(str(error))}") \
                from None
        return matcher.grammar_from_lark(lark)

    def __repr__(self) -> str:
        value = "" if self.kind == "json_object" else self.value if self.kind in ("json_schema", "choice") \
            else repr(self.value)
        return f"Constraint.{self.kind}({value if len(value) <= 80 else value[:77] + '...'})"

    def describe(self) -> str:
        """A short name for messages: "json_schema", "regex '...'", ..."""
        if self.kind in ("regex", "grammar", "choice"):
            shown = self.value if len(self.value) <= 60 else self.value[:57] + "..."
            return f"{self.kind} {shown!r}"
        return self.kind


def _first_line(message: str) -> str:
    """The grammar engine's message on one line: its "error: ..." line where it has one (a regex's), else its
    first line."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "unknown error"
    reason = next((line for line in lines if line.startswith("error:")), None)
    return lines[0] if reason is None else f"{lines[0]} {reason[len('error:'):].strip()}"


# ---- the vocabulary as the grammar engine reads it ----------------------------------------------------

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # a SentencePiece byte-fallback token
# (id of a tokenizer, vocabulary size, end ids) -> (that tokenizer, kept so that its id stays its own; its
# llguidance tokenizer). By identity: a fingerprint would serialise a whole vocabulary on every request.
_TOKENIZERS: dict[tuple[int, int, tuple[int, ...]], tuple[Any, Any]] = {}


def token_bytes_table(tokenizer, vocab_size: int) -> list[bytes]:
    """Each id's bytes (the text it adds), ``vocab_size`` of them: a byte-level token's bytes (GPT-2, Llama 3), a
    SentencePiece piece with its word-start mark as a space and a byte-fallback token as its byte, a character
    tokenizer's character; a special token as 0xFF then its text (llguidance's mark: never text); ids past the
    tokenizer (a model's padded embedding table) as nothing."""
    decoder = tokenizer.to_dict().get("decoder") or {}
    steps = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    byte_level = any(step.get("type") == "ByteLevel" for step in steps)
    replaced = [(step["pattern"]["String"], step["content"]) for step in steps
                if step.get("type") == "Replace" and "String" in step.get("pattern", {})]
    replaced += [(step.get("replacement", "\u2581"), " ") for step in steps if step.get("type") == "Metaspace"]
    special = tokenizer.special_token_ids
    table = []
    for token_id in range(vocab_size):
        piece = tokenizer.id_to_token(token_id) if token_id < tokenizer.vocab_size else None
        if piece is None:
            table.append(b"")
        elif token_id in special:
            table.append(b"\xff" + piece.encode("utf-8"))
        elif byte_level:
            table.append(byte_level_bytes(piece))
        elif (match := _BYTE_TOKEN.fullmatch(piece)) is not None:
            table.append(bytes([int(match.group(1), 16)]))
        else:
            for pattern, content in replaced:
                piece = piece.replace(pattern, content)
            table.append(piece.encode("utf-8"))
    return table


class _Vocabulary:
    """What llguidance's ``TokenizerWrapper`` reads of a tokenizer: each token's bytes, the end and special ids,
    and text -> ids (it tokenizes the grammar's literal strings with it)."""

    def __init__(self, tokenizer, vocab_size: int, end_ids: tuple[int, ...]) -> None:
        self.tokenizer = tokenizer
        self.tokens = token_bytes_table(tokenizer, vocab_size)
        self.eos_token_id = end_ids[0]
        self.bos_token_id = None
        self.special_token_ids = sorted(tokenizer.special_token_ids)

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self.tokenizer.encode(text, add_special_tokens=False)


def grammar_tokenizer(tokenizer, vocab_size: int, end_ids: tuple[int, ...]) -> Any:
    """The llguidance tokenizer of ``tokenizer`` for a model of ``vocab_size`` ids ending at ``end_ids``, built once
    per tokenizer object and ends (reading a large vocabulary takes about a second: a serving engine's requests
    share one)."""
    if tokenizer is None:
        raise GenerationError("a constraint needs the model's tokenizer (the grammar is over text), and there is none")
    if not end_ids:
        raise GenerationError("a constraint needs an end-of-sequence id to end the text once it is complete; the "
                              "model has none and eos_token_id gives none")
    key = (id(tokenizer), vocab_size, tuple(end_ids))
    held = _TOKENIZERS.get(key)
    if held is None:
        llguidance = grammar_engine()
        wrapper = llguidance.TokenizerWrapper(_Vocabulary(tokenizer, vocab_size, tuple(end_ids)))
        held = _TOKENIZERS[key] = (tokenizer, llguidance.LLTokenizer(wrapper, n_vocab=vocab_size,
                                                                     eos_token=list(end_ids)))
    return held[1]


def matcher(constraint: Constraint, tokenizer: Any) -> Any:
    """A fresh llguidance matcher of ``constraint`` over ``tokenizer`` (``grammar_tokenizer``'s), at the text's
    start; a GenerationError when the grammar does not compile with this vocabulary."""
    made = grammar_engine().LLMatcher(tokenizer, constraint.grammar_text(), log_level=0)
    if made.is_error():
        raise GenerationError(f"{constraint.describe()} cannot be compiled: {_first_line(made.get_error())}")
    return made
