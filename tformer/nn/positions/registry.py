"""The positional schemes by name: the one list configs, models and kernels ask (``positional``), registered
into ``tformer.choices.POSITIONAL_SCHEMES`` (which config.py reads without importing nn/).

Adding a scheme is one file (a subclass of ``PositionalScheme``, see scheme.py) and one entry here.
"""

from __future__ import annotations

from typing import Any

from tformer.choices import POSITIONAL_SCHEMES
from tformer.nn.positions.absolute import LearnedScheme, SinusoidalScheme
from tformer.nn.positions.biases import AlibiScheme, RelativeScheme
from tformer.nn.positions.rotary import RotaryScheme
from tformer.nn.positions.scheme import PositionalScheme

POSITIONAL_SCHEMES.register(LearnedScheme, SinusoidalScheme, RotaryScheme, AlibiScheme, RelativeScheme,
                            PositionalScheme)
POSITIONALS = tuple(POSITIONAL_SCHEMES)  # the names ``positional`` may hold


def positional_from_config(config: Any, causal: bool, kind: str | None = None) -> PositionalScheme:
    """The scheme a ModelConfig asks for (``kind``: another scheme at the config's sizes, e.g. "none")."""
    name = config.positional if kind is None else kind
    try:
        scheme = POSITIONAL_SCHEMES[name]
    except KeyError:
        raise ValueError(f"positional={name!r} is not one of {', '.join(POSITIONAL_SCHEMES)}") from None
    return scheme.from_config(config, causal)
