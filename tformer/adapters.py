"""LoRA adapters on a model: ``add_lora`` puts a ``LoraLinear`` (``nn/weights/lora.py``) over each targeted
linear layer (a ``LoraEmbedding`` over a token table named as a target) and freezes everything else;
``save_adapter`` / ``load_adapter`` write and read Hugging Face PEFT's format (``interop/peft_adapter.py``);
``merge_adapter`` / ``unmerge_adapter`` fold the update into the float weights and take it out again bit for
bit; ``unload_adapter`` gives the plain model back.

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

from collections.abc import Mapping, Sequence
from pathlib import Path

from torch import nn

from tformer.interop.lora_targets import (
    default_trained_modules,
    install_lora,
    lora_layers,
    release_trained_modules,
    resolve_targets,
    resolve_trained_modules,
    train_whole,
    trained_modules,
)
from tformer.interop.peft_adapter import peft_trained_modules, read_peft_adapter, write_peft_adapter
from tformer.nn.weights.lora import AdapterError, LoraEmbedding, LoraLinear, LoraUpdate
from tformer.nn.weights.multi_lora import MultiLoraLinear

DEFAULT_TARGETS = ("attention", "feedforward")
__all__ = ["DEFAULT_TARGETS", "AdapterError", "adapted_tables", "add_lora", "adapter_parameters",
           "default_trained_modules", "load_adapter", "load_adapters", "lora_layers", "merge_adapter", "merge_refusal",
           "save_adapter",
           "served_adapters", "trained_modules", "trained_with_adapter", "unload_adapter", "unmerge_adapter"]


def add_lora(model: nn.Module, rank: int = 8, alpha: float = 16, targets: Sequence[str] | str = DEFAULT_TARGETS,
             dropout: float = 0.0, rslora: bool = False, train_modules: Sequence[str] | None = None,
             dora: bool = False) -> nn.Module:
    """Freeze ``model`` and put a LoRA adapter of ``rank`` over each linear layer ``targets`` names (in place;
    returned too); scale alpha / rank (alpha / sqrt(rank) with ``rslora``). ``train_modules`` (PEFT's
    modules_to_save) train whole beside the adapters: module names, () for none; None, the default, trains a
    fine-tune's new task head (the classifier, and the pooler it reads; nothing on a decoder or a pretraining
    head), as PEFT does for its classification and question-answering task types. ``dora``: DoRA adapters
    (``nn/weights/dora.py``: a magnitude per adapted row trains too; float bases only)."""
    if lora_layers(model):
        raise AdapterError("this model has a LoRA adapter already; add one to the base model (unload_adapter)")
    chosen = resolve_targets(model, targets)
    whole = resolve_trained_modules(model, train_modules, list(chosen))
    model.requires_grad_(False)
    for path, blocks in chosen.items():
        install_lora(model, path, rank, alpha, blocks, dropout, rslora, dora)
    train_whole(model, whole)
    return model


def adapted_tables(model: nn.Module, targets: Sequence[str] | str = DEFAULT_TARGETS) -> list[str]:
    """The token tables among the layers ``targets`` names on ``model`` (their paths): what QLoRA keeps float."""
    return [path for path in resolve_targets(model, targets) if isinstance(model.get_submodule(path), nn.Embedding)]


def trained_with_adapter(model: nn.Module) -> list[nn.Parameter]:
    """The parameters that train with the model's adapters: the adapters' own, then those of the modules trained
    whole beside them (``trained_modules``)."""
    adapters = [p for layer in lora_layers(model).values() for name, p in layer.named_parameters()
                if not name.startswith("base.")]  # lora_A, lora_B (and a DoRA layer's magnitudes)
    return adapters + [p for path in trained_modules(model) for p in model.get_submodule(path).parameters()]


def adapter_parameters(model: nn.Module) -> int:
    """How many parameters train with the model's adapters (``trained_with_adapter``)."""
    return sum(p.numel() for p in trained_with_adapter(model))


def save_adapter(model: nn.Module, path: str | Path, base_model_name_or_path: str | None = None) -> Path:
    """Write the model's adapter as PEFT does: adapter_config.json + adapter_model.safetensors (adapter tensors
    only, under Hugging Face module names)."""
    return write_peft_adapter(model, path, base_model_name_or_path)


def load_adapter(model: nn.Module, path: str | Path) -> nn.Module:
    """Put the PEFT LoRA adapter in folder ``path`` over ``model`` (its base, frozen; in place, returned)."""
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
        whole = peft_trained_modules(Path(folder))
        if whole:  # a module trained whole replaces the base's for every row: no adapter per row there
            raise AdapterError(f"adapter {name!r} ({folder}) trains {', '.join(whole)} whole (modules_to_save); "
                               "served adapters may hold LoRA updates only")
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
        dora = [path for path, layer in layers.items() if layer.kind != "lora"]
        if dora:  # a DoRA row rescales the base's output too: not an update added to the rows that take it
            raise AdapterError(f"adapter {name!r} ({folder}) is a DoRA adapter (use_dora); served adapters are LoRA "
                               "only: merge it into its base (tformer merge) and serve that model")
        tables = [path for path, layer in layers.items() if isinstance(layer, LoraEmbedding)]
        if tables:  # a table's update is a lookup, not a product the rows' adapters can share
            raise AdapterError(f"adapter {name!r} ({folder}) adapts the token table {tables[0]}; served adapters "
                               "adapt linear layers only: merge it into its base (tformer merge) and serve that model")
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
    refusal = merge_refusal(model)
    if refusal is not None:
        raise AdapterError(refusal)
    for layer in layers.values():
        layer.float_weight()  # refuses a quantized base
    for layer in layers.values():
        layer.merge()
    return model


def merge_refusal(model: nn.Module) -> str | None:
    """Why ``merge_adapter`` refuses the adapter over ``model`` whatever its base's precision (an adapted head whose
    weight is the token table); None when it can merge (into a float base: a quantized one merges in its float
    checkpoint)."""
    tied = {alias.rpartition(".")[0] for alias in getattr(model, "tied_parameters", dict)()}
    path = next((path for path in lora_layers(model) if path in tied), None)
    if path is None:
        return None
    return (f"{path}'s weight is the token table (tie_embeddings): merging would change the embeddings too; keep "
            "the adapter unmerged, or adapt other layers")


def unmerge_adapter(model: nn.Module) -> nn.Module:
    """Take every merged update out of its base weight: the weights as before ``merge_adapter``, bit for bit."""
    for layer in _layers_or_refuse(model).values():
        layer.unmerge()
    return model


def unload_adapter(model: nn.Module, merge: bool = True) -> nn.Module:
    """The model without LoRA layers (in place, returned): each replaced by its base, the update merged in
    first unless ``merge=False`` (the base as it was: modules trained whole get their base weights back too).
    The base's parameters stay frozen."""
    if merge:
        merge_adapter(model)
    for path, layer in _layers_or_refuse(model).items():
        parent_name, _, child_name = path.rpartition(".")
        setattr(model.get_submodule(parent_name), child_name, layer.base)
    release_trained_modules(model, restore=not merge)
    return model


def _layers_or_refuse(model: nn.Module) -> dict[str, LoraLinear]:
    layers = lora_layers(model)
    if not layers:
        raise AdapterError("this model has no LoRA adapter (add_lora or load_adapter puts one on)")
    return layers


