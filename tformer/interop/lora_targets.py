"""Which layers of a model LoRA adapters go over (linear layers, and token tables when named), named as tformer or
the model's Hugging Face family names them (``tformer.adapters`` explains the rules; ``interop/peft_adapter.py``
reads and writes PEFT's files with them): each layer with its Hugging Face module(s) and their output rows, and
the targets' resolution.

Beside the adapters, some modules may train whole (PEFT's ``modules_to_save``): a task head a fine-tune makes
afresh (the classifier, and the pooler it reads) must learn in full while the backbone stays frozen. The model
keeps their paths and their weights as they were (``trained_modules``, ``release_trained_modules``), so the
adapter's files hold them and taking the adapter off gives the base back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from tformer.checkpoint import CheckpointError
from tformer.interop.families import family_for_config
from tformer.interop.weight_map import module_parts
from tformer.nn.heads import HEADS
from tformer.nn.weights.backend import LinearBackend
from tformer.nn.weights.dora import DoraLinear
from tformer.nn.weights.lora import AdapterError, LoraEmbedding, LoraLinear
from tformer.nn.weights.table import QuantizedTable
from tformer.quantization import is_head_layer

GROUPS = ("attention", "feedforward", "head", "all-linear")
# The heads a fine-tune puts on a pretrained model (PEFT's task types SEQ_CLS, TOKEN_CLS, QUESTION_ANS train
# theirs whole by default); the pretraining heads (masked LM, next sentence) come trained with the base.
FINE_TUNING_HEADS = ("sequence_classification", "token_classification", "question_answering", "image_classification")
TRAINED_MODULES = "_adapter_trained_modules"  # the model's attribute: path -> its parameters as they were


@dataclass(frozen=True)
class AdapterTarget:
    """A layer adapters can go over (a linear layer or a token table): its tformer path, and its Hugging Face
    module(s) with the output rows of each (several for a fused matrix; none when the model has no HF family or
    the map lacks it)."""

    path: str
    layer: nn.Linear | nn.Embedding
    hf_names: tuple[str, ...] = ()
    hf_rows: tuple[tuple[int, int], ...] = ()

    @property
    def is_table(self) -> bool:
        return isinstance(self.layer, nn.Embedding)

    @property
    def inputs(self) -> int:
        """The update's inputs: a linear layer's features, a table's rows (its ids, one-hot)."""
        return self.layer.num_embeddings if self.is_table else self.layer.in_features

    @property
    def outputs(self) -> int:
        return self.layer.embedding_dim if self.is_table else self.layer.out_features


def install_lora(model: nn.Module, path: str, rank: int, alpha: float, blocks: Sequence[tuple[int, int]] | None,
                 dropout: float, rslora: bool, dora: bool = False) -> LoraLinear:
    """Put a ``LoraLinear`` (a ``DoraLinear`` with ``dora``) over the linear layer at ``path`` (rows ``blocks``,
    None: all), or a ``LoraEmbedding`` over the token table there; errors name it."""
    parent_name, _, child_name = path.rpartition(".")
    parent = model.get_submodule(parent_name)
    base = getattr(parent, child_name)
    try:
        if isinstance(base, nn.Embedding):
            _check_table(model, path, dora)
            layer = LoraEmbedding(base, rank, alpha, blocks, dropout, rslora)
        else:
            layer = (DoraLinear if dora else LoraLinear)(base, rank, alpha, blocks, dropout, rslora)
    except AdapterError as error:
        raise AdapterError(f"{path}: {error}") from None
    setattr(parent, child_name, layer)
    return layer


def _check_table(model: nn.Module, path: str, dora: bool) -> None:
    """Refuse what a table's adapter cannot be: DoRA, or the table of a tied output head (unmerged, the head
    would read the base's rows; merged, the adapted ones)."""
    if dora:
        raise AdapterError("DoRA adapts linear layers; a token table takes a LoRA adapter")
    if f"{path}.weight" in getattr(model, "tied_parameters", dict)().values():
        raise AdapterError("this table is the output head's weight too (tie_embeddings): an adapter over it would "
                           "leave the head's copy unadapted until merged; adapt other layers")


def lora_layers(model: nn.Module) -> dict[str, LoraLinear]:
    """The model's LoRA layers by path."""
    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLinear)}


def adapter_targets(model: nn.Module) -> list[AdapterTarget]:
    """Every linear layer (on any weight backend) and float token table of ``model`` with its Hugging Face
    module(s) where the model's config has a family that maps it."""
    family = hf_family(model)
    modules = None if family is None else family.module_map(model.config)
    found, bases = [], set()
    for path, layer in model.named_modules():
        if isinstance(layer, LoraLinear):  # an adapted layer: its base, under the adapter's path
            bases.add(id(layer.base))
            layer = layer.base
        elif not isinstance(layer, (nn.Linear, nn.Embedding)) or id(layer) in bases:
            continue
        rows = layer.embedding_dim if isinstance(layer, nn.Embedding) else layer.out_features
        found.append(AdapterTarget(path, layer, *_hf_parts(modules, model, path, rows)))
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
    layers = adapter_targets(model)
    if not layers:
        raise AdapterError("this model has no linear layers or token tables to adapt")
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
            _refuse_quantized_table(model, target)
            raise AdapterError(f"adapter target {target!r} matches no linear layer or token table; "
                               f"{_what_exists(model, layers)}")
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
    def match(layer: AdapterTarget):
        if name_matches(layer.path):
            return None
        blocks = [rows for name, rows in zip(layer.hf_names, layer.hf_rows, strict=True)
                  if name_matches(name) or name_matches(name.removeprefix(prefix))]
        if not blocks:
            return False
        return None if len(layer.hf_rows) == 1 else blocks
    return match


def _group_matcher(group: str, model: nn.Module):
    """A layer -> None when it is in ``group``, else False (a token table is in none: it is adapted by name)."""
    def match(layer: AdapterTarget):
        if layer.is_table:
            return False
        path = f".{layer.path}."
        head = is_head_layer(model, layer.path) and not layer.path.startswith("pooler")
        inside = {"attention": ".attention." in path or ".cross_attention." in path,
                  "feedforward": ".feedforward." in path, "head": head, "all-linear": not head}[group]
        return None if inside else False
    return match


def _refuse_quantized_table(model: nn.Module, target: str) -> None:
    """Refuse a target that names (as tformer or the HF family names it) a token table held in int8: an adapter
    over a table adds to its float rows."""
    family = hf_family(model)
    modules = None if family is None else family.module_map(model.config)
    prefix = getattr(family, "base_prefix", "")
    for path, module in model.named_modules():
        if not isinstance(module, QuantizedTable):
            continue
        names = (path, *_hf_parts(modules, model, path, module.embedding_dim)[0])
        if any(name in (target, prefix + target) or name.endswith("." + target) for name in names):
            raise AdapterError(f"adapter target {target!r} is a quantized token table ({path}, int8): an adapter over "
                               "a table needs the float table; quantize with the embeddings left float "
                               "(embeddings=False) or leave the table out of the targets")


def _what_exists(model: nn.Module, layers: list[AdapterTarget]) -> str:
    """The names a target may use: tformer's paths (layer index as {i}), the family's HF module names, groups."""
    ours = dict.fromkeys(re.sub(r"\bblocks\.\d+\.", "blocks.{i}.", layer.path) for layer in layers)
    theirs = dict.fromkeys(name.rpartition(".")[2] for layer in layers for name in layer.hf_names)
    family = hf_family(model)
    text = f"tformer's linear layers and tables: {', '.join(ours)}"
    if theirs:
        text += f"; Hugging Face ({family.model_type}) names: {', '.join(theirs)}"
    return text + f"; groups: {', '.join(GROUPS)}"


# ---- modules trained whole beside the adapters (PEFT's modules_to_save) ------------------------------------


def default_trained_modules(model: nn.Module) -> tuple[str, ...]:
    """The modules a fine-tune's new task head holds, trained whole by default (as PEFT's SEQ_CLS, TOKEN_CLS and
    QUESTION_ANS task types train theirs): the head's weighted modules, and the pooler where the head reads it;
    () for a model without such a head (a decoder, a masked-LM encoder)."""
    head = getattr(getattr(model, "config", None), "head", None)
    if head not in FINE_TUNING_HEADS:
        return ()
    names = [name for name in HEADS[head].weights if getattr(model, name, None) is not None]
    if HEADS[head].reads == "pooler" and getattr(model, "pooler", None) is not None:
        names.append("pooler")
    return tuple(names)


def resolve_trained_modules(model: nn.Module, names: Sequence[str] | None,
                            adapted: Sequence[str] = ()) -> tuple[str, ...]:
    """The module paths ``names`` choose to train whole (None: ``default_trained_modules``, less those that
    ``adapted`` layers fall in). A name matches a module whose tformer path is it or ends with "." + it, or whose
    Hugging Face module name does; a name that matches nothing, a module an adapter goes over, one holding a
    quantized layer or a weight tied to the token table is refused in one line."""
    if names is None:
        chosen = [path for path in default_trained_modules(model)
                  if not any(_inside(layer, path) for layer in adapted)]
        return _outermost(chosen)
    if isinstance(names, (str, bytes)) or not all(isinstance(name, str) and name for name in names):
        raise AdapterError(f"modules trained whole={names!r} must be a list of module names")
    family = hf_family(model)
    prefix = getattr(family, "base_prefix", "")
    hf_names = {target.path: target.hf_names for target in adapter_targets(model)}
    chosen = []
    for name in names:
        found = [path for path, module in model.named_modules() if path and module is not None and (
            path == name or path.endswith("." + name) or any(
                their == name or their.endswith("." + name) or their.removeprefix(prefix) == name
                for their in hf_names.get(path, ())))]
        if not found:
            listed_names = ", ".join(dict.fromkeys(path for path in default_trained_modules(model))) or "none"
            raise AdapterError(f"module to train whole {name!r} matches no module of this model (its task head's: "
                               f"{listed_names}; any module path or Hugging Face module name)")
        chosen += found
    chosen = _outermost(chosen)
    tied = {alias.rpartition(".")[0] for alias in getattr(model, "tied_parameters", dict)()}
    for path in chosen:
        for layer in adapted:
            if _inside(layer, path) or _inside(path, layer):
                raise AdapterError(f"{path} is both adapted (LoRA over {layer}) and trained whole: choose one "
                                   "(leave it out of the targets, or of the modules trained whole)")
        module = model.get_submodule(path)
        if any(isinstance(layer, LinearBackend) and not layer.lossless for layer in module.modules()):
            raise AdapterError(f"{path} is quantized: its weights are integers and cannot train whole; "
                               "adapt it with LoRA instead")
        shared = [alias for alias in tied if _inside(alias, path)]
        if shared:
            raise AdapterError(f"{path}'s weight is the token table (tie_embeddings): training it whole would "
                               "change the embeddings too; adapt it with LoRA instead")
        if not any(True for _ in module.parameters()):
            raise AdapterError(f"{path} has no parameters to train")
    return tuple(chosen)


def train_whole(model: nn.Module, paths: Sequence[str]) -> None:
    """Let the modules at ``paths`` train whole beside the adapters, their weights as they are now kept (so
    that ``release_trained_modules`` can give the base back)."""
    kept = getattr(model, TRAINED_MODULES, None) or {}
    for path in paths:
        module = model.get_submodule(path)
        kept[path] = {name: parameter.detach().clone() for name, parameter in module.named_parameters()}
        module.requires_grad_(True)
    object.__setattr__(model, TRAINED_MODULES, kept)


def trained_modules(model: nn.Module) -> tuple[str, ...]:
    """The paths of the modules that train whole beside the model's adapters (() when none)."""
    return tuple(getattr(model, TRAINED_MODULES, None) or ())


def release_trained_modules(model: nn.Module, restore: bool) -> None:
    """Forget which modules train whole (the model back to a plain one): with ``restore`` their weights go
    back to what they were when they began to train (the base), else they keep what they learned. Either
    way they are frozen, as the rest of the base."""
    kept = getattr(model, TRAINED_MODULES, None) or {}
    for path, weights in kept.items():
        module = model.get_submodule(path)
        if restore:
            with torch.no_grad():
                for name, parameter in module.named_parameters():
                    parameter.copy_(weights[name])
        module.requires_grad_(False)
    if hasattr(model, TRAINED_MODULES):
        object.__delattr__(model, TRAINED_MODULES)


def _inside(path: str, module: str) -> bool:
    """Whether ``path`` is ``module`` or within it."""
    return path == module or path.startswith(module + ".")


def _outermost(paths: Sequence[str]) -> list[str]:
    """The paths without those inside another of them, in order, each once."""
    unique = list(dict.fromkeys(paths))
    return [path for path in unique if not any(other != path and _inside(path, other) for other in unique)]
