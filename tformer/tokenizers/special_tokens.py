"""Added and special tokens of a :class:`~tformer.tokenizers.base.Tokenizer`: the tokens kept whole
(``add_tokens``), the special ones dropped by ``skip_special_tokens`` (``add_special_tokens``), and
the roles they play (``pad_token``, ``eos_token_id``...). Kept apart from encoding: this is the
added vocabulary and its bookkeeping (id tables, the splitter that finds added tokens in text)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tformer.tokenizers.added_tokens import SPECIAL_ROLES, AddedToken, AddedTokenSplitter, infer_roles
from tformer.tokenizers.errors import TokenizerError


class SpecialTokensMixin:
    """The added-vocabulary part of ``Tokenizer``. It keeps ``_added`` (id -> AddedToken) and
    ``_roles`` (role -> token) and derives the lookup tables from them; it relies on the
    tokenizer's ``token_to_id``, ``_normalize``, ``_model_size`` and ``_clear_cache``."""

    _added: dict[int, AddedToken]
    _roles: dict[str, str]

    @property
    def added_tokens(self) -> dict[int, AddedToken]:
        return dict(self._added)

    @property
    def special_token_ids(self) -> frozenset[int]:
        return self._special_ids

    @property
    def special_tokens(self) -> dict[str, str]:
        """Role → token, e.g. {"pad": "[PAD]", "cls": "[CLS]", ...}."""
        return dict(self._roles)

    def special_token(self, role: str) -> str | None:
        check_role(role)
        return self._roles.get(role)

    def special_token_id(self, role: str) -> int | None:
        token = self.special_token(role)
        return None if token is None else self.token_to_id(token)

    pad_token = property(lambda self: self.special_token("pad"))
    bos_token = property(lambda self: self.special_token("bos"))
    eos_token = property(lambda self: self.special_token("eos"))
    unk_token = property(lambda self: self.special_token("unk"))
    cls_token = property(lambda self: self.special_token("cls"))
    sep_token = property(lambda self: self.special_token("sep"))
    mask_token = property(lambda self: self.special_token("mask"))
    pad_token_id = property(lambda self: self.special_token_id("pad"))
    bos_token_id = property(lambda self: self.special_token_id("bos"))
    eos_token_id = property(lambda self: self.special_token_id("eos"))
    unk_token_id = property(lambda self: self.special_token_id("unk"))
    cls_token_id = property(lambda self: self.special_token_id("cls"))
    sep_token_id = property(lambda self: self.special_token_id("sep"))
    mask_token_id = property(lambda self: self.special_token_id("mask"))

    def add_special_tokens(self, tokens: Mapping[str, str] | Iterable[str]) -> int:
        """Make tokens special (never split, dropped by ``skip_special_tokens``), giving new ones
        the next free ids. A mapping also sets roles: ``add_special_tokens({"pad": "<pad>"})``;
        a plain list gets roles from conventional names ("[PAD]", "<|endoftext|>"...).
        Returns how many new ids were created."""
        if isinstance(tokens, str):
            raise TokenizerError("add_special_tokens takes a list of tokens or a {role: token} mapping, not a str")
        roles = dict(tokens) if isinstance(tokens, Mapping) else None
        contents = list(roles.values()) if roles is not None else list(tokens)
        for role in roles or {}:
            check_role(role)
        added = self._add(contents, special=True)
        for role, content in (roles if roles is not None else infer_roles(contents)).items():
            if roles is not None or role not in self._roles:
                self._set_role(role, content)
        return added

    def add_tokens(self, tokens: Iterable[str]) -> int:
        """Add ordinary tokens that are never split (matched after normalization). Returns how
        many new ids were created."""
        if isinstance(tokens, str):
            raise TokenizerError("add_tokens takes a list of tokens, not a str")
        return self._add(list(tokens), special=False)

    def _add(self, contents: list[str], special: bool) -> int:
        for content in contents:
            if not isinstance(content, str) or not content:
                raise TokenizerError(f"an added token must be a non-empty str, got {content!r}")
        created = 0
        for content in dict.fromkeys(contents):
            token_id = self.token_to_id(content)
            if token_id is None:
                token_id = self._vocab_size + created
                created += 1
            elif token_id in self._added and self._added[token_id].special == special:
                continue
            self._added[token_id] = AddedToken(content, special=special, normalized=not special)
            self._added_ids[content] = token_id
        self._refresh_added()
        self._clear_cache()
        return created

    def _set_role(self, role: str, content: str) -> None:
        check_role(role)
        if self.token_to_id(content) is None:
            raise TokenizerError(f"special token {role}={content!r} is not in the vocabulary")
        self._roles[role] = content

    def _refresh_added(self) -> None:
        self._added_ids = {token.content: token_id for token_id, token in self._added.items()}
        self._added_text = {token_id: self._normalize(token.content) if token.normalized else token.content
                            for token_id, token in self._added.items()}
        self._special_ids = frozenset(token_id for token_id, token in self._added.items() if token.special)
        splitter = AddedTokenSplitter(self._added, self._normalize)
        self._splitter = None if splitter.empty else splitter
        self._vocab_size = max(self._model_size, max(self._added, default=-1) + 1)
        self._tokens_by_id: list[str | None] | None = None


def check_role(role: str) -> None:
    """Refuse a role that is not one of ``SPECIAL_ROLES``."""
    if role not in SPECIAL_ROLES:
        raise TokenizerError(f"unknown special token role {role!r}; known: {', '.join(SPECIAL_ROLES)}")
