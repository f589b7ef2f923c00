"""Which linear layers of a model LoRA adapters go over, named as tformer or the model's Hugging Face family names
them (``tformer.adapters`` explains the rules; ``interop/peft_adapter.py`` reads and writes PEFT's files with
them): each linear layer with its Hugging Face module(s) and their output rows, and the targets' resolution.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from tformer.checkpoint import CheckpointError
from tformer.interop.families import family_for_config
from tformer.interop.weight_map import module_parts
from tformer.nn.weights.lora import AdapterError, LoraLinear
from tformer.quantization import is_head_layer

GROUPS = ("attention", "feedforward", "head", "all-linear")


@dataclass(frozen=True)
class LinearTarget:
    """A linear layer adapters can go over: its tformer path, and its Hugging Face module(s) with the output
    rows of each (several for a fused matrix; none when the model has no HF family or the map lacks it)."""

    path: str
    layer: nn.Linear
    hf_names: tuple[str, ...] = ()
    hf_rows: tuple[tuple[int, int], ...] = ()


def install_lora(model: nn.Module, path: str, rank: int, alpha: float, blocks: Sequence[tuple[int, int]] | None,
                 dropout: float, rslora: bool) -> LoraLinear:
    """Put a ``LoraLinear`` over the linear layer at ``path`` (rows ``blocks``, None: all); errors name it."""
    parent_name, _, child_name = path.rpartition(".")
    parent = model.get_submodule(parent_name)
    try:
        layer = LoraLinear(getattr(parent, child_name), rank, alpha, blocks, dropout, rslora)
    except AdapterError as error:
        raise AdapterError(f"{path}: {error}") from None
    setattr(parent, child_name, layer)
    return layer


def lora_layers(model: nn.Module) -> dict[str, LoraLinear]:
    """The model's LoRA layers by path."""
    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLinear)}


def linear_targets(model: nn.Module) -> list[LinearTarget]:
    """Every linear layer of ``model`` (on any weight backend) with its Hugging Face module(s) where the model's
    config has a family that maps it."""
    family = hf_family(model)
    modules = None if family is None else family.module_map(model.config)
    found, bases = [], set()
    for path, layer in model.named_modules():
        if isinstance(layer, LoraLinear):  # an adapted layer: its base, under the adapter's path
            bases.add(id(layer.base))
            layer = layer.base
        elif not isinstance(layer, nn.Linear) or id(layer) in bases:
            continue
        found.append(LinearTarget(path, layer, *_hf_parts(modules, model, path, layer.out_features)))
    return found


def hf_family(model: nn.Module):
    """The Hugging Face family that holds ``model``'s config, or None (a model tformer alone describes)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    try:
        return family_for_config(config)
    except CheckpointError:
        return None


def _hf_parts(modules, model: nn.Module, path: str, rows: int) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...]]:
    """The HF module names behind ``path`` and the output rows of each (start, stop)."""
    parts = None if modules is None else module_parts(modules, model.config, path, rows)
    if parts is None:
        return (), ()
    names, sizes, _ = parts
    starts = [sum(sizes[:index]) for index in range(len(sizes))]
    return names, tuple((start, start + size) for start, size in zip(starts, sizes, strict=True))


def resolve_targets(model: nn.Module, targets: Sequence[str] | str) -> dict[str, list[tuple[int, int]] | None]:
    """Path -> the output row blocks to adapt (None: the whole layer) of every layer ``targets`` names; a
    target that names no layer is refused with the names that exist."""
    layers = linear_targets(model)
    if not layers:
        raise AdapterError("this model has no linear layers to adapt")
    prefix = getattr(hf_family(model), "base_prefix", "")
    if isinstance(targets, str) and targets in GROUPS:  # PEFT's target_modules="all-linear", and the other groups
        targets = [targets]
    if isinstance(targets, str):
        try:
            pattern = re.compile(targets)
        except re.error as error:
            raise AdapterError(f"adapter targets {targets!r} is not a regular expression ({error})") from None
        matchers = {targets: _layer_matcher(lambda name: pattern.fullmatch(name) is not None, prefix)}
    else:
        if isinstance(targets, bytes) or not targets or not all(isinstance(t, str) and t for t in targets):
            raise AdapterError(f"adapter targets={targets!r} must be module names or one regular expression")
        matchers = {t: _group_matcher(t, model) if t in GROUPS else
                    _layer_matcher(lambda name, t=t: name == t or name.endswith("." + t), prefix) for t in targets}
    hits = {target: [match(layer) for layer in layers] for target, match in matchers.items()}
    for target, found in hits.items():
        if all(hit is False for hit in found):
            raise AdapterError(f"adapter target {target!r} matches no linear layer; {_what_exists(model, layers)}")
    chosen: dict[str, list[tuple[int, int]] | None] = {}
    for index, layer in enumerate(layers):
        found = [hit[index] for hit in hits.values() if hit[index] is not False]
        if found:
            whole = any(hit is None for hit in found)
            chosen[layer.path] = None if whole else sorted({block for hit in found for block in hit})
    return chosen


def _layer_matcher(name_matches, prefix: str):
    """A layer -> None when its tformer path matches (the whole layer), the row blocks of its HF parts whose
    names match (with or without the family's base prefix), or False."""
    def match(layer: LinearTarget):
        if name_matches(layer.path):
            return None
        blocks = [rows for name, rows in zip(layer.hf_names, layer.hf_rows, strict=True)
                  if name_matches(name) or name_matches(name.removeprefix(prefix))]
        if not blocks:
            return False
        return None if len(layer.hf_rows) == 1 else blocks
    return match


def _group_matcher(group: str, model: nn.Module):
    """A layer -> None when it is in ``group``, else False."""
    def match(layer: LinearTarget):
        path = f".{layer.path}."
        head = is_head_layer(model, layer.path) and not layer.path.startswith("pooler")
        inside = {"attention": ".attention." in path or ".cross_attention." in path,
                  "feedforward": ".feedforward." in path, "head": head, "all-linear": not head}[group]
        return None if inside else False
    return match


def _what_exists(model: nn.Module, layers: list[LinearTarget]) -> str:
    """The names a target may use: tformer's paths (layer index as {i}), the family's HF module names, groups."""
    ours = dict.fromkeys(re.sub(r"\bblocks\.\d+\.", "blocks.{i}.", layer.path) for layer in layers)
    theirs = dict.fromkeys(name.rpartition(".")[2] for layer in layers for name in layer.hf_names)
    family = hf_family(model)
    text = f"tformer's linear layers: {', '.join(ours)}"
    if theirs:
        text += f"; Hugging Face ({family.model_type}) names: {', '.join(theirs)}"
    return text + f"; groups: {', '.join(GROUPS)}"
