"""How a model pools its final hidden states into one vector a text (``models.embeddings`` computes it): the modes,
and the choice a sentence-transformers folder declares (``modules.json``, ``1_Pooling/config.json``, a
``Normalize`` module). Imports nothing heavy, so the command line and the HTTP process read it without torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tformer.errors import TformerError

EMBEDDING_POOLINGS = ("cls", "mean", "last")  # the first token's vector, the mean of the tokens', the last token's
# sentence-transformers' Pooling config: the modes tformer pools by, and those it refuses
SENTENCE_TRANSFORMERS_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                               "pooling_mode_lasttoken": "last"}
REFUSED_MODES = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
MODULE_KINDS = {"sentence_transformers.models.Transformer": "transformer",
                "sentence_transformers.models.Pooling": "pooling",
                "sentence_transformers.models.Normalize": "normalize"}


class EmbeddingError(TformerError):
    """A model that cannot embed, a pooling tformer does not do, or texts it cannot read."""


@dataclass(frozen=True)
class Pooling:
    """How hidden states become one vector: ``mode`` (``EMBEDDING_POOLINGS``), then scaled to unit length when
    ``normalize``; ``source`` says where the choice came from, for messages and logs."""

    mode: str
    normalize: bool = False
    source: str = "as asked"

    def __post_init__(self) -> None:
        if self.mode not in EMBEDDING_POOLINGS:
            raise EmbeddingError(f"pooling={self.mode!r} is not one of {', '.join(EMBEDDING_POOLINGS)}")
        if not isinstance(self.normalize, bool):
            raise EmbeddingError(f"normalize={self.normalize!r} must be True or False")


def folder_pooling(folder: str | Path) -> Pooling | None:
    """A sentence-transformers folder's pooling (``modules.json`` naming the Transformer, a Pooling module whose
    ``config.json`` sets one mode, and optionally Normalize), or None for a folder without ``modules.json``. A
    module or mode tformer does not compute (Dense, max pooling, ...) is an EmbeddingError naming it."""
    folder = Path(folder)
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
        kinds = {MODULE_KINDS.get(module["type"], module["type"]): module.get("path", "") for module in modules}
    except (json.JSONDecodeError, TypeError, KeyError) as error:
        raise EmbeddingError(f"{modules_file}: not a sentence-transformers module list ({error})") from None
    unknown = [kind for kind in kinds if kind not in MODULE_KINDS.values()]
    if unknown:
        raise EmbeddingError(f"{modules_file}: module {unknown[0]!r} is not supported (tformer embeds with "
                             "Transformer, Pooling and Normalize only)")
    if kinds.get("transformer", "") != "" or "pooling" not in kinds:
        raise EmbeddingError(f"{modules_file}: tformer reads a Transformer at the folder's root followed by a "
                             "Pooling module")
    config_file = folder / kinds["pooling"] / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise EmbeddingError(f"{config_file}: cannot read the pooling config ({error})") from None
    refused = [name for name in REFUSED_MODES if config.get(name)]
    modes = [mode for name, mode in SENTENCE_TRANSFORMERS_MODES.items() if config.get(name)]
    if refused or len(modes) != 1:
        what = f"{refused[0]} is not supported" if refused else f"{len(modes)} pooling modes are set"
        raise EmbeddingError(f"{config_file}: {what}; tformer pools by exactly one of "
                             f"{', '.join(SENTENCE_TRANSFORMERS_MODES)}")
    return Pooling(modes[0], "normalize" in kinds, f"{config_file.parent.name}/config.json")
