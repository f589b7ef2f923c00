"""Rotary settings of a Hugging Face config.json, both ways, for every family with RoPE.

transformers 5 writes one ``rope_parameters`` table (``rope_type``, ``rope_theta``, the scaling keys,
``partial_rotary_factor``); 4.x wrote ``rope_theta`` and ``partial_rotary_factor`` at the top and the scaling
in ``rope_scaling`` (``type`` or ``rope_type``), which 5 still reads first. Both are read; both are written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tformer.checkpoint import CheckpointError
from tformer.config import ModelConfig
from tformer.interop.family import hf_field, require
from tformer.nn.positions.rope_scaling import rope_scaling_problem
from tformer.nn.positions.rotary import rotary_dimensions

# The scaling types measured against a pretraining length, which HF fills from max_position_embeddings
# when the table lacks it (a top-level original_max_position_embeddings, Phi-3's, comes first).
MEASURED_FROM_ORIGINAL = ("llama3", "yarn", "longrope")


def rope_from_hf(model_type: str, raw: Mapping[str, Any], *, partial: bool = False,
                 default_theta: float = 10000.0) -> dict[str, Any]:
    """``rope_theta``, ``rope_scaling`` and ``partial_rotary_factor`` of a config.json; CheckpointError naming
    what tformer cannot run (``partial``: the family rotates a leading share of each head)."""
    table = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    if not isinstance(table, Mapping):
        raise CheckpointError(f"{model_type} rope_parameters={table!r} is not a JSON object")
    parameters = dict(table)
    theta = parameters.pop("rope_theta", None) or hf_field(raw, "rope_theta", default_theta)
    factor = parameters.pop("partial_rotary_factor", None) or hf_field(raw, "partial_rotary_factor", 1.0)
    if not partial:
        require(model_type, "partial_rotary_factor", factor, 1.0)
    if parameters.get("rope_type", parameters.get("type")) == "default":
        parameters = {}  # unscaled: HF reads no other key of the table
    try:
        scaling = normalized_rope_scaling(parameters or None)
    except ValueError as error:
        raise CheckpointError(f"{model_type} {error}") from None
    if scaling is not None and scaling["rope_type"] in MEASURED_FROM_ORIGINAL:
        original = raw.get("original_max_position_embeddings") or scaling.get("original_max_position_embeddings")
        scaling["original_max_position_embeddings"] = original or raw.get("max_position_embeddings")
    head_dim = raw.get("head_dim") or raw.get("hidden_size", 0) // max(raw.get("num_attention_heads", 1), 1)
    problem = rope_scaling_problem(scaling, rotary_dimensions(head_dim, factor))
    if problem is not None:
        raise CheckpointError(f"{model_type} {problem}")
    return {"rope_theta": float(theta), "rope_scaling": scaling, "partial_rotary_factor": factor}


def rope_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The config.json keys of ``config``'s rotary settings, as transformers 5 and 4.x read them."""
    scaling = config.rope_scaling
    parameters = {"rope_type": "default", **(scaling or {}), "rope_theta": config.rope_theta}
    raw: dict[str, Any] = {"rope_parameters": parameters, "rope_theta": config.rope_theta, "rope_scaling": scaling}
    if config.partial_rotary_factor != 1.0:
        parameters["partial_rotary_factor"] = config.partial_rotary_factor
        raw["partial_rotary_factor"] = config.partial_rotary_factor
    return raw


def normalized_rope_scaling(value: Any) -> dict[str, Any] | None:
    """A config.json's RoPE table as ``ModelConfig.rope_scaling`` holds it: None for unscaled RoPE, else a dict
    whose ``rope_type`` names the type (Hugging Face's older ``type`` key read as it). ValueError for what is not
    such a mapping."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"rope_scaling={value!r} must be a table with a rope_type (or null)")
    parameters = dict(value)
    if "type" in parameters:
        kind = parameters.pop("type")
        if parameters.setdefault("rope_type", kind) != kind:
            raise ValueError(f"rope_scaling names two types: type={kind!r}, rope_type={parameters['rope_type']!r}")
    if parameters.get("rope_type") == "default" and len(parameters) == 1:
        return None
    return {"rope_type": parameters.pop("rope_type", None), **parameters}
