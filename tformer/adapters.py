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

from collections.abc import Mapping, Sequence
from pathlib import Path

from torch import nn

from tformer.interop.lora_targets import install_lora, lora_layers, resolve_targets
from tformer.interop.peft_adapter import read_peft_adapter, write_peft_adapter
from tformer.nn.weights.lora import AdapterError, LoraLinear, LoraUpdate
from tformer.nn.weights.multi_lora import MultiLoraLinear

DEFAULT_TARGETS = ("attention", "feedforward")


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


def adapter_parameters(model: nn.Module) -> int:
    """How many parameters the model's adapters hold (what trains)."""
    return sum(p.numel() for layer in lora_layers(model).values() for p in (*layer.lora_A, *layer.lora_B))


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


