"""LoRA adapters on a model: ``add_lora`` puts a ``LoraLinear`` (``nn/weights/lora.py``) over each targeted
linear layer and freezes everything else; ``save_adapter`` / ``load_adapter`` write and read Hugging Face
PEFT's format (``interop/peft_adapter.py``); ``merge_adapter`` / ``unmerge_adapter`` fold the update into the
float weights and take it out again bit for bit; ``unload_adapter`` gives the plain model back.

Targets name linear layers the way PEFT's ``target_modules`` does: a name matches a module whose path is it or
ends with "." + it, a single string is a regular expression the whole path must match. A name may be
tformer's (``qkv_proj``, ``attention.out_proj``, ``lm_head``), Hugging Face's for the model's family
(``q_proj``, ``c_attn``, ``query``: through the interop module maps; one part of a fused tformer matrix adapts
its rows only), or a group: ``attention``, ``feedforward``, ``head`` (the output head and task heads) and
``all-linear`` (every linear layer but the head, as PEFT's). A name that matches nothing is refused, listing
what exists.

``load_adapters`` puts several adapters over one model at once, for serving: each is chosen row by row
(``nn/weights/multi_lora.py``), the base held once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from tformer.nn.weights.lora import AdapterError, LoraLinear, LoraUpdate
from tformer.nn.weights.multi_lora import MultiLoraLinear
from tformer.quantization import is_head_layer

GROUPS = ("attention", "feedforward", "head", "all-linear")
DEFAULT_TARGETS = ("attention", "feedforward")


@dataclass(frozen=True)
class LinearTarget:
    """A linear layer adapters can go over: its tformer path, and its Hugging Face module(s) with the output
    rows of each (several for a fused matrix; none when the model has no HF family or the map lacks it)."""

    path: str
    layer: nn.Linear
    hf_names: tuple[str, ...] = ()
    hf_rows: tuple[tuple[int, int], ...] = ()


def add_lora(model: nn.Module, rank: int = 8, alpha: float = 16, targets: Sequence[str] | str = DEFAULT_TARGETS,
             dropout: float = 0.0, rslora: bool = False) -> nn.Module:
    """Freeze ``model`` and put a LoRA adapter of ``rank`` over each linear layer ``targets`` names (in place;
    returned too); scale alpha / rank (alpha / sqrt(rank) with ``rslora``)."""
    if lora_layers(model):
        raise AdapterError("this model has a LoRA adapter already; add one to the base model (unload_adapter)")
    chosen = resolve_targets(model, targets)
    model.requires_grad_(False)
    for path, blocks in chosen.items():
        install_lora(model, path, rank, alpha, blocks, dropout, rslora)
    return model


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


def adapter_parameters(model: nn.Module) -> int:
    """How many parameters the model's adapters hold (what trains)."""
    return sum(p.numel() for layer in lora_layers(model).values() for p in (*layer.lora_A, *layer.lora_B))


def save_adapter(model: nn.Module, path: str | Path, base_model_name_or_path: str | None = None) -> Path:
    """Write the model's adapter as PEFT does: adapter_config.json + adapter_model.safetensors (adapter tensors
    only, under Hugging Face module names)."""
    from tformer.interop.peft_adapter import write_peft_adapter

    return write_peft_adapter(model, path, base_model_name_or_path)


def load_adapter(model: nn.Module, path: str | Path) -> nn.Module:
    """Put the PEFT LoRA adapter in folder ``path`` over ``model`` (its base, frozen; in place, returned)."""
    from tformer.interop.peft_adapter import read_peft_adapter

    if lora_layers(model):
        raise AdapterError(f"{path}: this model has a LoRA adapter already; load an adapter onto the base model")
    read_peft_adapter(model, Path(path))
    return model


def load_adapters(model: nn.Module, folders: Mapping[str, str | Path]) -> nn.Module:
    """Put the PEFT LoRA adapters of ``folders`` (name -> folder) over ``model`` together, each row of a batch to
    take one of them or none (``adapter_rows``, ``nn/weights/multi_lora.py``): every linear layer one of them
    adapts becomes a ``MultiLoraLinear`` holding each one's update, adapter ``i`` the ``i``-th name (in place;
    returned). An adapter for another base is refused naming it, the model left as it was."""
    if not folders:
        raise AdapterError("no adapters to load")
    if lora_layers(model) or served_adapters(model):
        raise AdapterError("this model has LoRA adapters already; load adapters onto the base model")
    names = list(folders)
    updates: list[dict[str, LoraUpdate]] = []
    for name, folder in folders.items():
        try:
            load_adapter(model, folder)
        except AdapterError as error:
            raise AdapterError(f"adapter {name!r}: {error}") from None
        layers = lora_layers(model)
        unload_adapter(model, merge=False)  # the base as it was: the next adapter goes over it alone
        experts = [path for path in layers if ".experts." in f".{path}"]
        if experts:  # an expert's layer reads the rows routed to it, not the step's: no adapter per row there
            raise AdapterError(f"adapter {name!r} ({folder}) adapts mixture-of-experts projections ({experts[0]}); "
                               "served adapters may adapt attention, dense feed-forward and head layers only")
        updates.append({path: LoraUpdate.of(layer) for path, layer in layers.items()})
    for path in dict.fromkeys(path for adapter in updates for path in adapter):
        parent_name, _, child_name = path.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child_name, MultiLoraLinear(getattr(parent, child_name),
                                                    [adapter.get(path) for adapter in updates], names))
    return model


def served_adapters(model: nn.Module) -> tuple[str, ...]:
    """The names of the adapters ``load_adapters`` put over ``model``, in index order (() when none)."""
    layer = next((module for module in model.modules() if isinstance(module, MultiLoraLinear)), None)
    return () if layer is None else layer.names


def merge_adapter(model: nn.Module) -> nn.Module:
    """Add every adapter's update into its base weight (in place; ``unmerge_adapter`` undoes it exactly). A
    quantized base, or a head whose weight is the token table, is refused before anything changes."""
    layers = _layers_or_refuse(model)
    tied = {alias.rpartition(".")[0] for alias in getattr(model, "tied_parameters", dict)()}
    for path, layer in layers.items():
        if path in tied:
            raise AdapterError(f"{path}'s weight is the token table (tie_embeddings): merging would change the "
                               "embeddings too; keep the adapter unmerged, or adapt other layers")
        layer.float_weight()  # refuses a quantized base
    for layer in layers.values():
        layer.merge()
    return model


def unmerge_adapter(model: nn.Module) -> nn.Module:
    """Take every merged update out of its base weight: the weights as before ``merge_adapter``, bit for bit."""
    for layer in _layers_or_refuse(model).values():
        layer.unmerge()
    return model


def unload_adapter(model: nn.Module, merge: bool = True) -> nn.Module:
    """The model without LoRA layers (in place, returned): each replaced by its base, the update merged in
    first unless ``merge=False`` (the base as it was). The base's parameters stay frozen."""
    if merge:
        merge_adapter(model)
    for path, layer in _layers_or_refuse(model).items():
        parent_name, _, child_name = path.rpartition(".")
        setattr(model.get_submodule(parent_name), child_name, layer.base)
    return model


def _layers_or_refuse(model: nn.Module) -> dict[str, LoraLinear]:
    layers = lora_layers(model)
    if not layers:
        raise AdapterError("this model has no LoRA adapter (add_lora or load_adapter puts one on)")
    return layers


# ---- targets -----------------------------------------------------------------------------------------


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
    from tformer.checkpoint import CheckpointError
    from tformer.interop import family_for_config

    config = getattr(model, "config", None)
    if config is None:
        return None
    try:
        return family_for_config(config)
    except CheckpointError:
        return None


def _hf_parts(modules, model: nn.Module, path: str, rows: int) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...]]:
    """The HF module names behind ``path`` and the output rows of each (start, stop)."""
    from tformer.interop.weight_map import module_parts

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
