"""RoPE scaling: the ways a checkpoint stretches its rotary frequencies past the context it was trained on.

Each type reads the keys of ``ModelConfig.rope_scaling`` it names (``required``, ``optional``) and computes
the inverse frequencies of the rotated dimensions with the factor that multiplies cos and sin (the attention
scaling some types apply), as Hugging Face defines them (``transformers.modeling_rope_utils``). A type whose
frequencies depend on the longest position of a pass says so (``length_dependent``). Adding a type is one
class here and its entry in ``ROPE_SCALINGS``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor


def default_frequencies(rotary_dim: int, theta: float | Tensor) -> Tensor:
    """theta^(-2i/Dr) for i < Dr/2, float32: unscaled RoPE's inverse frequencies."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (theta ** exponents)


class RopeScaling:
    """One scaling type: its keys, their checks, and the frequencies it gives."""

    name: ClassVar[str]
    required: ClassVar[tuple[str, ...]] = ("factor",)
    optional: ClassVar[tuple[str, ...]] = ()
    length_dependent: ClassVar[bool] = False

    def __init__(self, parameters: Mapping[str, Any], rotary_dim: int, theta: float, max_seq_len: int) -> None:
        self.parameters = parameters
        self.rotary_dim = rotary_dim
        self.theta = theta
        self.max_seq_len = max_seq_len

    @classmethod
    def problem(cls, parameters: Mapping[str, Any], rotary_dim: int) -> str | None:
        """Why ``parameters`` cannot be used (one phrase), or None: every value a positive number by default."""
        for key in (*cls.required, *cls.optional):
            value = parameters.get(key)
            if value is not None and not _positive_number(value):
                return f"{key}={value!r} must be a number > 0"
        return None

    def frequencies(self, seq_len: int | None = None) -> tuple[Tensor, float]:
        """Inverse frequencies (Dr/2,) and the cos/sin factor, for a pass whose longest position is
        ``seq_len - 1`` (None: the shortest pass, as a model is built)."""
        raise NotImplementedError


class LinearScaling(RopeScaling):
    """Position interpolation (Chen et al. 2023): every frequency divided by ``factor``."""

    name = "linear"

    def frequencies(self, seq_len: int | None = None) -> tuple[Tensor, float]:
        return default_frequencies(self.rotary_dim, self.theta) / self.parameters["factor"], 1.0


class DynamicScaling(RopeScaling):
    """Dynamic NTK scaling: past ``max_seq_len`` the base grows with the pass's length."""

    name = "dynamic"
    length_dependent = True

    def frequencies(self, seq_len: int | None = None) -> tuple[Tensor, float]:
        if seq_len is None or seq_len <= self.max_seq_len:
            return default_frequencies(self.rotary_dim, self.theta), 1.0
        factor, dim = self.parameters["factor"], self.rotary_dim
        # float32 tensor arithmetic, as Hugging Face's forward computes it from the positions' maximum
        stretch = factor * torch.tensor(seq_len) / self.max_seq_len - (factor - 1)
        return default_frequencies(dim, self.theta * stretch ** (dim / (dim - 2))), 1.0


class YarnScaling(RopeScaling):
    """YaRN (Peng et al. 2023): high frequencies kept, low ones interpolated by ``factor``, a linear ramp
    between the dimensions that turn ``beta_fast`` and ``beta_slow`` times over the original context; cos and
    sin scaled by 0.1 ln(factor) + 1 (or ``attention_factor``, or DeepSeek's ``mscale`` ratio)."""

    name = "yarn"
    required = ("factor", "original_max_position_embeddings")  # factor null: max_seq_len / original
    optional = ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")

    @classmethod
    def problem(cls, parameters: Mapping[str, Any], rotary_dim: int) -> str | None:
        truncate = parameters.get("truncate", True)
        if not isinstance(truncate, bool):
            return f"truncate={truncate!r} must be true or false"
        return super().problem({key: value for key, value in parameters.items() if key != "truncate"}, rotary_dim)

    def frequencies(self, seq_len: int | None = None) -> tuple[Tensor, float]:
        p, dim, theta = self.parameters, self.rotary_dim, self.theta
        original = p["original_max_position_embeddings"]
        factor = p.get("factor") or self.max_seq_len / original
        attention_factor = p.get("attention_factor")
        if attention_factor is None:
            mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
            attention_factor = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
                                if mscale and mscale_all_dim else _yarn_mscale(factor))

        def dimension_turning(turns: float) -> float:  # the dimension whose wavelength fits `turns` times
            return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

        low, high = dimension_turning(p.get("beta_fast") or 32), dimension_turning(p.get("beta_slow") or 1)
        if p.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        wavelengths = theta ** (torch.arange(0, dim, 2).float() / dim)
        kept = 1 - ramp  # 1: the original frequency (fast dimensions), 0: interpolated
        inverse = (1.0 / (factor * wavelengths)) * (1 - kept) + (1.0 / wavelengths) * kept
        return inverse, float(attention_factor)


def _yarn_mscale(scale: float, mscale: float = 1) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


class LongRopeScaling(RopeScaling):
    """LongRoPE (Phi-3's long variants): one factor per frequency, ``short_factor`` while a pass stays inside
    ``original_max_position_embeddings`` and ``long_factor`` past it; cos and sin scaled by
    sqrt(1 + ln(factor) / ln(original)) (or ``attention_factor``)."""

    name = "longrope"
    required = ("short_factor", "long_factor", "original_max_position_embeddings")
    optional = ("factor", "attention_factor")
    length_dependent = True

    @classmethod
    def problem(cls, parameters: Mapping[str, Any], rotary_dim: int) -> str | None:
        for key in ("short_factor", "long_factor"):
            value = parameters.get(key)
            if not (isinstance(value, (list, tuple)) and len(value) == rotary_dim // 2
                    and all(_positive_number(item) for item in value)):
                return f"{key} must be a list of {rotary_dim // 2} numbers > 0 (one per rotated pair)"
        scalars = {key: parameters.get(key) for key in ("original_max_position_embeddings", *cls.optional)}
        for key, value in scalars.items():
            if value is not None and not _positive_number(value):
                return f"{key}={value!r} must be a number > 0"
        return None

    def frequencies(self, seq_len: int | None = None) -> tuple[Tensor, float]:
        p = self.parameters
        original = p["original_max_position_embeddings"]
        factor = p.get("factor") or self.max_seq_len / original
        attention_factor = p.get("attention_factor")
        if attention_factor is None:
            attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        long = seq_len is not None and seq_len > original
        stretch = torch.tensor(p["long_factor"] if long else p["short_factor"], dtype=torch.float32)
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64).float() / self.rotary_dim
        return 1.0 / (stretch * self.theta ** exponents), float(attention_factor)


class Llama3Scaling(RopeScaling):
    """Llama 3.1's: wavelengths longer than original / ``low_freq_factor`` divided by ``factor``, shorter than
    original / ``high_freq_factor`` kept, and a smooth blend of the two between."""

    name = "llama3"
    required = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

    @classmethod
    def problem(cls, parameters: Mapping[str, Any], rotary_dim: int) -> str | None:
        found = super().problem(parameters, rotary_dim)
        if found is None and parameters["high_freq_factor"] <= parameters["low_freq_factor"]:
            return (f"high_freq_factor={parameters['high_freq_factor']!r} must be above "
                    f"low_freq_factor={parameters['low_freq_factor']!r}")
        return found

    def frequencies(self, seq_len: int | None = None) -> tuple[Tensor, float]:
        p = self.parameters
        factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
        original = p["original_max_position_embeddings"]
        inverse = default_frequencies(self.rotary_dim, self.theta)
        wavelengths = 2 * math.pi / inverse
        scaled = torch.where(wavelengths > original / low, inverse / factor, inverse)
        blend = (original / wavelengths - low) / (high - low)  # 0 at original / low, 1 at original / high
        smoothed = (1 - blend) * scaled / factor + blend * scaled
        between = ~(wavelengths < original / high) & ~(wavelengths > original / low)
        return torch.where(between, smoothed, scaled), 1.0


ROPE_SCALINGS: dict[str, type[RopeScaling]] = {
    scaling.name: scaling for scaling in (LinearScaling, DynamicScaling, YarnScaling, LongRopeScaling, Llama3Scaling)
}


def rope_scaling_problem(parameters: Any, rotary_dim: int) -> str | None:
    """Why ``ModelConfig.rope_scaling`` cannot be used (naming the key), or None."""
    if parameters is None:
        return None
    if not isinstance(parameters, Mapping):
        return f"rope_scaling={parameters!r} must be a table with a rope_type (or null)"
    if "rope_type" not in parameters:
        return f"rope_scaling={dict(parameters)!r} needs rope_type (one of {', '.join(ROPE_SCALINGS)})"
    kind = parameters["rope_type"]
    if not isinstance(kind, str) or kind not in ROPE_SCALINGS:
        return f"rope_scaling rope_type={kind!r} is not one of {', '.join(ROPE_SCALINGS)}"
    scaling = ROPE_SCALINGS[kind]
    keys = set(parameters) - {"rope_type"}
    missing = [key for key in scaling.required if key not in keys]
    if missing:
        return f"rope_scaling of rope_type={kind!r} needs {', '.join(missing)}"
    unknown = sorted(keys - set(scaling.required) - set(scaling.optional))
    if unknown:
        reads = ", ".join((*scaling.required, *scaling.optional))
        return f"rope_scaling {', '.join(unknown)} is not read by rope_type={kind!r} (it reads {reads})"
    problem = scaling.problem(parameters, rotary_dim)
    return None if problem is None else f"rope_scaling of rope_type={kind!r}: {problem}"


def _positive_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value > 0)
