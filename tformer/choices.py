"""The named choices a ModelConfig field may hold, each registered by the module that implements it.

``ATTENTION_KERNELS`` (filled by nn/attention/registry.py), ``POSITIONAL_SCHEMES`` (nn/positions/registry.py),
``ACTIVATIONS`` (nn/feedforward.py) and ``HEADS`` (nn/heads.py) map each name to what its module declares: a
class or a small record whose attributes say what the choice honours (the fields it reads, whether it is exact,
gated, pooled, ...). Like families.py this module imports nothing of tformer's, so config.py validates against
the registries without importing the layers that fill them: the config is the floor they stand on. A config
being made first makes sure every implementing module has registered (``families.ensure_declared``).
"""

from __future__ import annotations

from typing import Any


class Choices(dict[str, Any]):
    """Name -> declaration for the ModelConfig field ``field``, filled by ``register``."""

    def __init__(self, field: str) -> None:
        super().__init__()
        self.field = field

    def register(self, *entries: Any) -> None:
        """Add each entry under its ``name`` (registering again, as a module reload does, replaces it)."""
        for entry in entries:
            self[entry.name] = entry

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not one of the choices (one line naming the field and every choice), or None."""
        if isinstance(value, str) and value in self:
            return None
        return f"{self.field}={value!r} is not one of {', '.join(self)}"


ATTENTION_KERNELS = Choices("attention_kernel")
POSITIONAL_SCHEMES = Choices("positional")
ACTIVATIONS = Choices("activation")
HEADS = Choices("head")
