"""Added tokens: strings the tokenizer must keep whole ("<|endoftext|>", "[CLS]", a user's
"<tool>"), found in the text before the model ever sees it, exactly like Hugging Face's
added vocabulary (longest match first, optional whitespace stripping, optional whole-word)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from tformer.tokenizers.errors import TokenizerError

SPECIAL_ROLES = ("pad", "bos", "eos", "unk", "cls", "sep", "mask")
_JSON_ORDER = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")


@dataclass(frozen=True)
class AddedToken:
    """One added token and how it is matched. ``special`` tokens are the ones
    ``decode(skip_special_tokens=True)`` drops; ``normalized`` ones are matched after the
    normalizer (so "[cls]" finds "[CLS]" in a lower-casing tokenizer), the others in raw text."""

    content: str
    special: bool = True
    normalized: bool = False
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False

    def to_json(self, token_id: int, roles: Iterable[str] = ()) -> dict:
        fields = asdict(self)
        entry = {"id": token_id, **{key: fields[key] for key in _JSON_ORDER}}
        roles = list(roles)
        if roles:
            # An extra key the `tokenizers` library ignores: which role (pad, eos...) the token plays.
            entry["tformer_roles"] = roles
        return entry

    @classmethod
    def from_json(cls, entry: dict) -> AddedToken:
        return cls(
            content=entry["content"],
            special=bool(entry.get("special", False)),
            normalized=bool(entry.get("normalized", not entry.get("special", False))),
            lstrip=bool(entry.get("lstrip", False)),
            rstrip=bool(entry.get("rstrip", False)),
            single_word=bool(entry.get("single_word", False)),
        )


class AddedTokenSplitter:
    """Cuts text into pieces that are either an added token (with its id) or plain text."""

    def __init__(self, tokens: dict[int, AddedToken], normalize: Callable[[str], str]) -> None:
        raw = {token.content: token_id for token_id, token in tokens.items() if not token.normalized}
        normalized = {normalize(token.content): token_id for token_id, token in tokens.items() if token.normalized}
        by_id = dict(tokens)
        normalized = {text: token_id for text, token_id in normalized.items() if text}
        self._normalize = normalize
        self._raw = _compile(raw, by_id)
        self._raw_contents = tuple(raw)
        self._normalized = _compile(normalized, by_id)
        self._normalized_contents = tuple(normalized)

    def could_match(self, text: str) -> bool:
        """False when ``text`` surely holds no added token (the common case, checked cheaply)."""
        if self._normalized is not None:
            return True
        for content in self._raw_contents:
            if content in text:
                return True
        return False

    @property
    def empty(self) -> bool:
        return self._raw is None and self._normalized is None

    def split_raw(self, text: str) -> list[tuple[str, int | None]]:
        """Raw ``text`` cut at the tokens matched before normalization; the pieces tile it."""
        return _split(self._raw, self._raw_contents, text)

    def split_normalized(self, normalized: str) -> list[tuple[str, int | None]]:
        """Normalized text cut at the tokens matched after normalization; the pieces tile it."""
        return _split(self._normalized, self._normalized_contents, normalized)

    def split(self, text: str) -> list[tuple[str, int | None]]:
        """``[(piece, token_id or None)]``; plain pieces come back normalized, ready for the model."""
        pieces: list[tuple[str, int | None]] = []
        for raw_piece, token_id in _split(self._raw, self._raw_contents, text):
            if token_id is not None:
                pieces.append((raw_piece, token_id))
                continue
            normalized = self._normalize(raw_piece)
            pieces.extend(_split(self._normalized, self._normalized_contents, normalized))
        return pieces


def _compile(contents: dict[str, int], tokens: dict[int, AddedToken]):
    """One regex for all tokens, longest first so "<a><b>" beats "<a>" where both start."""
    if not contents:
        return None
    alternatives = []
    for content in sorted(contents, key=len, reverse=True):
        token_id = contents[content]
        token = tokens[token_id]
        body = re.escape(content)
        if token.single_word:
            body = rf"(?<!\w){body}(?!\w)"
        if token.lstrip:
            body = rf"\s*{body}"
        if token.rstrip:
            body = rf"{body}\s*"
        alternatives.append(f"(?P<t{token_id}>{body})")
    return re.compile("|".join(alternatives))


def _split(pattern, contents: tuple[str, ...], text: str) -> list[tuple[str, int | None]]:
    if pattern is None or not any(content in text for content in contents):  # the usual case, kept cheap
        return [(text, None)] if text else []
    pieces: list[tuple[str, int | None]] = []
    start = 0
    for match in pattern.finditer(text):
        if match.start() > start:
            pieces.append((text[start:match.start()], None))
        pieces.append((match.group(), int(match.lastgroup[1:])))
        start = match.end()
    if start < len(text):
        pieces.append((text[start:], None))
    return pieces


# Roles implied by the names the ecosystem uses, for files that do not say (tokenizer.json has
# no place for roles; tformer writes them in an extra key of each added token).
_CONVENTIONAL_ROLES: dict[str, tuple[str, ...]] = {
    "[PAD]": ("pad",), "<pad>": ("pad",), "<|pad|>": ("pad",),
    "[UNK]": ("unk",), "<unk>": ("unk",), "<|unk|>": ("unk",),
    "[CLS]": ("cls",), "<cls>": ("cls",),
    "[SEP]": ("sep",), "<sep>": ("sep",),
    "[MASK]": ("mask",), "<mask>": ("mask",), "<|mask|>": ("mask",),
    "[BOS]": ("bos",), "<bos>": ("bos",), "<|bos|>": ("bos",), "<|startoftext|>": ("bos",),
    "<|begin_of_text|>": ("bos",),
    "[EOS]": ("eos",), "<eos>": ("eos",), "<|eos|>": ("eos",), "<|end_of_text|>": ("eos",),
    "<s>": ("bos", "cls"), "</s>": ("eos", "sep"),
    "<|endoftext|>": ("bos", "eos"),
}


def infer_roles(contents: Iterable[str]) -> dict[str, str]:
    """Role → token for tokens with a conventional name; the first token claiming a role wins."""
    roles: dict[str, str] = {}
    for content in contents:
        for role in _CONVENTIONAL_ROLES.get(content, ()):
            roles.setdefault(role, content)
    return roles


def parse_special_tokens(special_tokens: Iterable[str] | dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """(contents in order, role → content) from a list of tokens (roles from conventional
    names) or a {role: token} mapping, as trainers accept them."""
    if isinstance(special_tokens, str):
        raise TokenizerError(f"special_tokens must be a list of str or a {{role: token}} dict, got the str "
                             f"{special_tokens!r}")
    if isinstance(special_tokens, dict):
        for role in special_tokens:
            if role not in SPECIAL_ROLES:
                raise TokenizerError(f"unknown special token role {role!r}; known: {', '.join(SPECIAL_ROLES)}")
        contents = list(dict.fromkeys(special_tokens.values()))
        roles = dict(special_tokens)
    else:
        contents = list(dict.fromkeys(special_tokens))
        roles = infer_roles(contents)
    for content in contents:
        if not isinstance(content, str) or not content:
            raise TokenizerError(f"a special token must be a non-empty str, got {content!r}")
    return contents, roles
