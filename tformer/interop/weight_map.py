"""Translating weights between tformer's names and layouts and a Hugging Face family's.

A family describes, per tformer module, the Hugging Face module(s) it corresponds to
(``ModuleMap``). From that and a model, ``weight_rules`` derives one ``WeightRule`` per
tformer tensor; the rules then translate whole state dicts either way. tformer fuses some
projections that Hugging Face keeps apart: the attention's ``qkv_proj`` holds the query,
key and value rows in that order (cross-attention's ``kv_proj`` the key and value rows), and
a gated feed-forward's ``in_proj`` holds the gate rows, then the up rows; without key biases
(Whisper), self-attention's ``keyless_bias`` holds the query biases, then the value biases. GPT-2 stores its
linear weights transposed, as (in, out).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.checkpoint import check_weights
from tformer.config import ModelConfig

FUSIONS = ("qkv", "kv", "qv", "gate_up")


@dataclass(frozen=True)
class ModuleMap:
    """The Hugging Face module(s) behind one tformer module.

    ``theirs`` holds name templates (``{i}`` is the layer index); with ``fused`` set they are
    the parts of a fused tformer matrix in row order. ``transposed``: HF stores weights (in, out).
    """

    theirs: tuple[str, ...]
    fused: str | None = None
    transposed: bool = False

    def __post_init__(self) -> None:
        if self.fused is not None and self.fused not in FUSIONS:
            raise ValueError(f"fused={self.fused!r} is not one of {', '.join(FUSIONS)}")
        if (self.fused is None) != (len(self.theirs) == 1):
            raise ValueError("a ModuleMap names one HF module, or several with a fusion kind")


@dataclass(frozen=True)
class WeightRule:
    """One tformer tensor and the Hugging Face tensors it is made of.

    The HF tensors are stacked along dim 0 in order (``rows`` each when there are several);
    ``transposed`` means each HF tensor is stored as the transpose of its tformer rows.
    """

    ours: str
    theirs: tuple[str, ...]
    rows: tuple[int, ...]
    transposed: bool = False

    def their_shapes(self, our_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The shape each HF tensor must have for a tformer tensor of ``our_shape``."""
        shapes = [(rows, *our_shape[1:]) for rows in self.rows]
        return [shape[::-1] for shape in shapes] if self.transposed else shapes


_BLOCK = re.compile(r"\bblocks\.(\d+)\.")  # the layer index of a per-layer module, in any stack


def weight_rules(modules: Mapping[str, ModuleMap], model) -> list[WeightRule]:
    """One rule per stored tensor of ``model`` (tied aliases excluded), from a family's module map.

    ``modules`` is keyed by tformer module paths with ``blocks.{i}.`` for per-layer modules
    (``stack.blocks.{i}.attention.qkv_proj``).
    """
    config: ModelConfig = model.config
    tied = model.tied_parameters()
    rules = []
    for name, tensor in model.state_dict().items():
        if name in tied:
            continue
        module, _, parameter = name.rpartition(".")
        parts = module_parts(modules, config, module, tensor.shape[0])
        if parts is None:
            raise KeyError(f"the key map has no entry for tformer module {_module_key(module)!r} (tensor {name})")
        theirs, rows, transposed = parts
        rules.append(WeightRule(name, tuple(f"{their}.{parameter}" for their in theirs), rows,
                                transposed and tensor.dim() == 2))
    return rules


def module_parts(modules: Mapping[str, ModuleMap], config: ModelConfig, module: str,
                 rows: int) -> tuple[tuple[str, ...], tuple[int, ...], bool] | None:
    """The Hugging Face module(s) behind tformer's ``module`` (a path such as ``stack.blocks.3.attention.qkv_proj``)
    whose tensors have ``rows`` rows: their names, the rows of each (a fused matrix's parts in order) and whether
    HF stores the weights transposed; None when the family's map has no entry for it."""
    entry = modules.get(_module_key(module))
    if entry is None:
        return None
    match = _BLOCK.search(module)
    layer = match.group(1) if match else None
    rows_of_parts = _fused_rows(entry.fused, config, rows) if entry.fused else (rows,)
    return tuple(template.format(i=layer) for template in entry.theirs), rows_of_parts, entry.transposed


def _module_key(module: str) -> str:
    """The module map's key of a tformer module path: its (first) layer index as ``{i}``."""
    return _BLOCK.sub("blocks.{i}.", module, count=1)


def _fused_rows(fused: str, config: ModelConfig, rows: int) -> tuple[int, ...]:
    """Row counts of the parts of tformer's fused matrices of ``rows`` rows (their layout is fixed by the core)."""
    kv_rows = config.num_kv_heads * config.head_dim
    if fused == "qkv":
        return (config.num_heads * config.head_dim, kv_rows, kv_rows)
    if fused == "kv":  # cross-attention: keys and values of the encoder's output
        return (kv_rows, kv_rows)
    if fused == "qv":  # the query and value biases of a projection whose keys have none
        return (config.num_heads * config.head_dim, kv_rows)
    return (rows // 2, rows // 2)  # gate_up: a feed-forward's, or an expert's (moe_d_ff) or a shared one's


def hf_to_tformer(
    hf_state: Mapping[str, Tensor], rules: list[WeightRule], our_shapes: Mapping[str, tuple[int, ...]], source: str
) -> dict[str, Tensor]:
    """tformer's state dict from a Hugging Face one, after checking every HF name and shape.

    Raises CheckpointError naming missing or unexpected HF tensors, or the first HF tensor
    whose shape differs from what the config implies; nothing is translated before that.
    """
    expected = {
        their_name: shape
        for rule in rules
        for their_name, shape in zip(rule.theirs, rule.their_shapes(tuple(our_shapes[rule.ours])), strict=True)
    }
    check_weights(expected, {name: tensor.shape for name, tensor in hf_state.items()}, source)
    state = {}
    for rule in rules:
        parts = [hf_state[name] for name in rule.theirs]
        if rule.transposed:
            parts = [part.t() for part in parts]
        state[rule.ours] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
    return state


def tformer_to_hf(state: Mapping[str, Tensor], rules: list[WeightRule]) -> dict[str, Tensor]:
    """A Hugging Face state dict from tformer's: fused matrices split, GPT-2 weights transposed.

    Every tensor is its own contiguous copy (safetensors refuses tensors that share memory).
    """
    hf_state = {}
    for rule in rules:
        parts = state[rule.ours].detach().split(list(rule.rows), dim=0)
        for name, part in zip(rule.theirs, parts, strict=True):
            hf_state[name] = (part.t() if rule.transposed else part).clone(memory_format=torch.contiguous_format)
    return hf_state
