"""Where special tokens go around one sequence or a pair, and which token_type_id each part
gets: BERT's ``[CLS] A [SEP] B [SEP]`` with types 0…0 1…1, RoBERTa's ``<s> A </s></s> B </s>``,
or nothing at all (GPT-2). Read from and written as Hugging Face's TemplateProcessing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tformer.tokenizers.errors import TokenizerError

# A template item: ("$A", type_id), ("$B", type_id) or (special token content, type_id).
Item = tuple[str, int]
SEQUENCE_A, SEQUENCE_B = "$A", "$B"


@dataclass(frozen=True)
class Template:
    """The layout of one sequence (``single``) and of a pair (``pair``). ``roberta`` marks
    Hugging Face's RobertaProcessing, which also gives a pair encoded without special tokens
    token_type_ids 0 throughout (a template gives the pair 1)."""

    single: tuple[Item, ...] = ((SEQUENCE_A, 0),)
    pair: tuple[Item, ...] = ((SEQUENCE_A, 0), (SEQUENCE_B, 1))
    roberta: bool = False

    @classmethod
    def roberta_style(cls, bos_token: str, eos_token: str) -> Template:
        """RoBERTa's ``<s> A </s>`` and ``<s> A </s></s> B </s>``, every type id 0."""
        return cls(
            single=((bos_token, 0), (SEQUENCE_A, 0), (eos_token, 0)),
            pair=((bos_token, 0), (SEQUENCE_A, 0), (eos_token, 0), (eos_token, 0), (SEQUENCE_B, 0), (eos_token, 0)),
            roberta=True,
        )

    @property
    def plain_pair_type_id(self) -> int:
        """The type id of the pair's tokens when no special tokens are added."""
        return 0 if self.roberta else 1

    @classmethod
    def bert(cls, cls_token: str, sep_token: str) -> Template:
        return cls(
            single=((cls_token, 0), (SEQUENCE_A, 0), (sep_token, 0)),
            pair=((cls_token, 0), (SEQUENCE_A, 0), (sep_token, 0), (SEQUENCE_B, 1), (sep_token, 1)),
        )

    @property
    def special_tokens(self) -> list[str]:
        return sorted({token for token, _ in (*self.single, *self.pair) if token not in (SEQUENCE_A, SEQUENCE_B)})

    @property
    def adds_tokens(self) -> bool:
        """Whether encoding one sequence with special tokens adds any (so the fast path must not skip it)."""
        return len(self.single) != 1

    def num_special_tokens(self, pair: bool) -> int:
        items = self.pair if pair else self.single
        return sum(token not in (SEQUENCE_A, SEQUENCE_B) for token, _ in items)

    def apply(
        self, ids_a: list[int], ids_b: list[int] | None, token_id: Callable[[str], int]
    ) -> tuple[list[int], list[int]]:
        """The ids with special tokens placed, and their token_type_ids."""
        ids: list[int] = []
        type_ids: list[int] = []
        for token, type_id in self.single if ids_b is None else self.pair:
            if token == SEQUENCE_A:
                part = ids_a
            elif token == SEQUENCE_B:
                part = ids_b
            else:
                part = [token_id(token)]
            ids += part
            type_ids += [type_id] * len(part)
        return ids, type_ids

    # ---- Hugging Face tokenizer.json ---------------------------------------------------------

    def to_json(self, token_id: Callable[[str], int], trim_offsets: bool = False,
                add_prefix_space: bool = False) -> dict:
        """Hugging Face's TemplateProcessing, or RobertaProcessing (which carries byte-level
        offset trimming) for a ``roberta`` template."""
        if self.roberta:
            bos, eos = self.single[0][0], self.single[-1][0]
            return {"type": "RobertaProcessing", "sep": [eos, token_id(eos)], "cls": [bos, token_id(bos)],
                    "trim_offsets": trim_offsets, "add_prefix_space": add_prefix_space}

        def items(layout: Sequence[Item]) -> list[dict]:
            out = []
            for token, type_id in layout:
                if token in (SEQUENCE_A, SEQUENCE_B):
                    out.append({"Sequence": {"id": token[1], "type_id": type_id}})
                else:
                    out.append({"SpecialToken": {"id": token, "type_id": type_id}})
            return out

        return {
            "type": "TemplateProcessing",
            "single": items(self.single),
            "pair": items(self.pair),
            "special_tokens": {
                token: {"id": token, "ids": [token_id(token)], "tokens": [token]} for token in self.special_tokens
            },
        }

    @classmethod
    def from_json(cls, data: dict | None) -> Template:
        """Any post-processor Hugging Face writes that only places special tokens (ByteLevel's
        offsets trimming changes no id, so it reads as no template)."""
        if data is None:
            return cls()
        kind = data.get("type")
        if kind == "TemplateProcessing":
            return cls(single=_items(data["single"], data), pair=_items(data["pair"], data))
        if kind == "BertProcessing":
            return cls.bert(data["cls"][0], data["sep"][0])
        if kind == "RobertaProcessing":
            return cls.roberta_style(data["cls"][0], data["sep"][0])
        if kind == "ByteLevel":
            return cls()
        if kind == "Sequence":
            templates = [p for p in data.get("processors", []) if p.get("type") != "ByteLevel"]
            if len(templates) > 1:
                raise TokenizerError("post_processor Sequence with more than one template is not supported")
            return cls.from_json(templates[0] if templates else None)
        raise TokenizerError(
            f"post_processor type {kind!r} is not supported; known: TemplateProcessing, BertProcessing, "
            "RobertaProcessing, ByteLevel, Sequence"
        )


def _items(entries: list[dict], data: dict) -> tuple[Item, ...]:
    items: list[Item] = []
    for entry in entries:
        if "Sequence" in entry:
            items.append(("$" + entry["Sequence"]["id"], int(entry["Sequence"].get("type_id", 0))))
        else:
            special = entry["SpecialToken"]
            declared = data.get("special_tokens", {}).get(special["id"], {})
            tokens = declared.get("tokens", [special["id"]])
            if len(tokens) != 1:
                raise TokenizerError(f"template special token {special['id']!r} stands for {len(tokens)} tokens; "
                                     "only single tokens are supported")
            items.append((tokens[0], int(special.get("type_id", 0))))
    return tuple(items)


def offset_trimming(data: dict | None) -> tuple[bool, bool]:
    """(trim_offsets, add_prefix_space) of the byte-level offset trimming a post-processor does:
    ByteLevel's or RobertaProcessing's (both trim by default), alone or in a Sequence."""
    kind = None if data is None else data.get("type")
    if kind in ("ByteLevel", "RobertaProcessing"):
        return bool(data.get("trim_offsets", True)), bool(data.get("add_prefix_space", True))
    if kind == "Sequence":
        for processor in data.get("processors", []):
            trim, add_prefix_space = offset_trimming(processor)
            if trim:
                return trim, add_prefix_space
    return False, False
