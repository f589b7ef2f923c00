"""LoRA adapters in Hugging Face PEFT's format, both ways: a folder of ``adapter_config.json`` (peft_type LORA,
r, lora_alpha, lora_dropout, use_rslora, target_modules, ...) and ``adapter_model.safetensors`` holding
``base_model.model.<HF module>.lora_A.weight`` (rank, in) and ``.lora_B.weight`` (out, rank) per adapted module,
named as the family's Hugging Face class names its modules; an adapted token table holds ``.lora_embedding_A``
(rank, V) and ``.lora_embedding_B`` (D, rank) instead, as PEFT writes them.

The module names go through the family's module map (``interop/weight_map.py``), the same one the weights do.
Where tformer fuses matrices that Hugging Face keeps apart (Llama's and BERT's q/k/v in ``qkv_proj``, a gated
feed-forward's gate/up in ``in_proj``), each HF module's adapter adapts its own rows of the fused layer: an
adapter on ``q_proj`` alone is a LoRA block over the query rows. An adapter tformer made over a whole fused
layer is written as one adapter per HF part, B split by rows and A repeated (the same function). GPT-2 fuses
c_attn itself, as tformer does: one adapter both sides. GPT-2's Conv1D layers store their weights transposed,
but PEFT's lora_A and lora_B are ordinary (rank, in) and (out, rank) matrices there too (fan_in_fan_out
transposes only the merged update): they are read and written as they are.

Modules trained whole beside the adapters (PEFT's ``modules_to_save``: a new classifier, its pooler) are written
as PEFT writes them: their tensors under ``base_model.model.<HF parameter name>`` (fused tformer matrices split, as
the family's weights are) and their Hugging Face module names in ``modules_to_save``; a file's tensors that no
``modules_to_save`` name covers are refused, and those it holds are copied into the model, their modules then
trained whole. ``task_type`` is PEFT's for the model's head (SEQ_CLS, TOKEN_CLS, QUESTION_ANS).

DoRA adapters (``use_dora: true``) hold one more tensor per module, ``<HF module>.lora_magnitude_vector`` (its
rows,): split by rows as lora_B is where a fused tformer layer holds several HF modules.

A model with no Hugging Face family is written under tformer's own module paths (auto_mapping names tformer
as the base class): tformer reads it back, PEFT does not. What PEFT can hold and tformer does not compute
(rank or alpha patterns, trained biases) is refused in one line, as is an adapter for another base:
another model class, module names the model lacks, or shapes that differ.
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from tformer.checkpoint import read_safetensors, write_checkpoint_folder
from tformer.errors import listed
from tformer.interop.lora_targets import (
    AdapterTarget,
    adapter_targets,
    hf_family,
    install_lora,
    lora_layers,
    train_whole,
    trained_modules,
)
from tformer.interop.weight_map import module_parts
from tformer.nn.weights.lora import AdapterError, LoraEmbedding, LoraLinear

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
TFORMER_CLASS = "tformer"  # auto_mapping's base_model_class of an adapter under tformer's own module paths
SUFFIXES = (".lora_A.weight", ".lora_B.weight")
TABLE_SUFFIXES = (".lora_embedding_A", ".lora_embedding_B")  # an adapted token table's, as PEFT names them
ADAPTER_SUFFIXES = SUFFIXES + TABLE_SUFFIXES
BASE_WEIGHT = ".base_layer.weight"  # the base PEFT saves beside a table's or head's adapter (save_embedding_layers)
MAGNITUDE = ".lora_magnitude_vector"  # a DoRA module's magnitude (rows,), as PEFT's state dict names it
TASK_TYPES = {"decoder": "CAUSAL_LM", "encoder_decoder": "SEQ_2_SEQ_LM", "speech": "SEQ_2_SEQ_LM"}
# PEFT's task type of an encoder's fine-tuning head (each trains its head whole by default, as tformer's does)
HEAD_TASK_TYPES = {"sequence_classification": "SEQ_CLS", "token_classification": "TOKEN_CLS",
                   "question_answering": "QUESTION_ANS"}
# Families whose weights are not a plain rename of tformer's, so an adapter of theirs is not one of tformer's.
UNMAPPED_FAMILIES = {"t5": "tformer folds T5's attention scaling into the query weights, so query adapters "
                           "would differ; T5 adapters are not translated"}
# adapter_config.json settings tformer does not compute, each with the values that mean "not used".
NOT_COMPUTED: dict[str, tuple[Any, ...]] = {
    "rank_pattern": ({}, None),
    "alpha_pattern": ({}, None), "bias": ("none",), "lora_bias": (False, None), "layers_pattern": (None, [], ""),
    "trainable_token_indices": (None, [], {}), "target_parameters": (None, []), "layer_replication": (None, []),
    "use_qalora": (False, None), "alora_invocation_tokens": (None, []), "use_bdlora": (None, False),
}


# ---- writing -----------------------------------------------------------------------------------------


def write_peft_adapter(model: nn.Module, path: str | Path, base_model_name_or_path: str | None = None) -> Path:
    """Write ``model``'s LoRA adapter into folder ``path`` in PEFT's format (adapter tensors only)."""
    layers = lora_layers(model)
    if not layers:
        raise AdapterError("this model has no LoRA adapter to save (add_lora or load_adapter puts one on)")
    settings = {(layer.rank, layer.alpha, layer.rslora, _dropout(layer), layer.kind) for layer in layers.values()}
    if len(settings) > 1:
        raise AdapterError(f"the model's adapters differ in rank, alpha, rsLoRA, dropout or kind "
                           f"({sorted(settings)}): PEFT's adapter_config.json holds one setting for all")
    (rank, alpha, rslora, dropout, kind), = settings
    family = _family_or_refuse(model)
    targets = {target.path: target for target in adapter_targets(model)}
    tensors: dict[str, Tensor] = {}
    for layer_path, layer in layers.items():
        suffix_a, suffix_b = TABLE_SUFFIXES if isinstance(layer, LoraEmbedding) else SUFFIXES
        for name, index, (low, high) in _peft_modules(layer_path, layer, targets[layer_path], family is not None):
            module = _their_name(family, model, name)
            tensors[f"{PEFT_PREFIX}{module}{suffix_a}"] = layer.lora_A[index].detach().cpu().clone()
            tensors[f"{PEFT_PREFIX}{module}{suffix_b}"] = \
                layer.lora_B[index][low:high].detach().cpu().contiguous().clone()
            if kind == "dora":  # PEFT's DoRA magnitude of the module's rows, (rows,)
                tensors[f"{PEFT_PREFIX}{module}{MAGNITUDE}"] = \
                    layer.lora_magnitude[index][low:high].detach().cpu().contiguous().clone()
    adapted = [name.removeprefix(PEFT_PREFIX).removesuffix(suffix) for name in tensors
               for suffix in (SUFFIXES[0], TABLE_SUFFIXES[0]) if name.endswith(suffix)]
    every = [_their_name(family, model, name) for target in targets.values()
             for name in (target.hf_names if family is not None else (target.path,))]
    saved: list[str] = []
    for module_path in trained_modules(model):
        whole = _whole_module_tensors(model, family, module_path)
        tensors.update({PEFT_PREFIX + name: tensor for name, tensor in whole.items()})
        saved.append(_common_module(list(whole)))
    config = {
        "peft_type": "LORA", "r": rank, "lora_alpha": int(alpha) if alpha.is_integer() else alpha,
        "lora_dropout": dropout, "use_rslora": rslora,
        "target_modules": _target_modules(adapted, every), "base_model_name_or_path": base_model_name_or_path,
        "bias": "none", "task_type": _task_type(model, bool(saved)) if family is not None else None,
        "fan_in_fan_out": bool(family is not None and family.model_type == "gpt2"), "inference_mode": True,
        "init_lora_weights": True, "modules_to_save": saved or None, "rank_pattern": {}, "alpha_pattern": {},
        "use_dora": kind == "dora", "auto_mapping": _auto_mapping(family, model),
    }

    def write(folder: Path) -> None:
        save_file(tensors, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    return write_checkpoint_folder(path, write)


def _peft_modules(path: str, layer: LoraLinear, target: AdapterTarget, by_hf_names: bool):
    """(module name, block index, its rows within the block (low, high)) of each module PEFT holds for ``layer``:
    per HF part of each block (its lora_A is the block's, its lora_B and magnitude the block's rows low:high)."""
    for index, (start, stop) in enumerate(layer.blocks):
        if not by_hf_names:
            if (start, stop) != (0, layer.out_features):
                raise AdapterError(f"{path}: an adapter on rows {start}..{stop} of a model without a Hugging Face "
                                   "family has no module name to be saved under")
            yield path, index, (0, stop - start)
            continue
        parts = [(name, rows) for name, rows in zip(target.hf_names, target.hf_rows, strict=True)
                 if start <= rows[0] and rows[1] <= stop]
        if not target.hf_names or sum(end - begin for _, (begin, end) in parts) != stop - start:
            raise AdapterError(f"{path}: its adapted rows {start}..{stop} are no Hugging Face module's "
                               f"({', '.join(target.hf_names) or 'the family maps no module to it'})")
        for name, (begin, end) in parts:
            yield name, index, (begin - start, end - start)


def _task_type(model: nn.Module, trains_whole: bool) -> str | None:
    """PEFT's task_type of the model: its head's (an encoder's classifier) where the adapter trains modules whole
    (PEFT's SEQ_CLS, TOKEN_CLS and QUESTION_ANS expect the head's tensors in the file), else its architecture's."""
    head_type = HEAD_TASK_TYPES.get(model.config.head) if trains_whole else None
    return head_type or TASK_TYPES.get(model.config.architecture)


def _whole_module_tensors(model: nn.Module, family, path: str) -> dict[str, Tensor]:
    """The tensors of the module at ``path`` (trained whole) named as the model's Hugging Face class names them
    (tformer's own names without a family), fused matrices split and transposed weights turned as the family's."""
    tensors = {}
    for name, parameter in model.get_submodule(path).named_parameters(prefix=path):
        value = parameter.detach().cpu()
        if family is None:
            tensors[name] = value.clone()
            continue
        module, _, kind = name.rpartition(".")
        parts = module_parts(family.module_map(model.config), model.config, module, value.shape[0])
        if parts is None:
            raise AdapterError(f"{path} (trained whole): the {family.model_type} family maps no Hugging Face module "
                               f"to {module}, so it has no name to be saved under")
        theirs, rows, transposed = parts
        for their, piece in zip(theirs, value.split(list(rows), dim=0), strict=True):
            piece = piece.t() if transposed and piece.dim() == 2 else piece
            tensors[f"{_their_name(family, model, their)}.{kind}"] = piece.contiguous().clone()
    return tensors


def _common_module(names: list[str]) -> str:
    """The innermost module holding every tensor of ``names`` (PEFT's modules_to_save entry for them)."""
    paths = [name.split(".")[:-1] for name in names]
    common = []
    for parts in zip(*paths, strict=False):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return ".".join(common)


def _target_modules(adapted: list[str], every: list[str]) -> list[str]:
    """PEFT's target_modules for the adapted modules: a module's last name where every module of that name is
    adapted (``q_proj``), else the adapted modules' full names."""
    chosen = set(adapted)
    names: list[str] = []
    for leaf in dict.fromkeys(name.rpartition(".")[2] for name in adapted):
        same = [name for name in every if name.rpartition(".")[2] == leaf]
        names += [leaf] if set(same) <= chosen else [name for name in adapted if name.rpartition(".")[2] == leaf]
    return sorted(names)


def _auto_mapping(family, model: nn.Module) -> dict[str, str]:
    if family is None:
        return {"base_model_class": TFORMER_CLASS, "parent_library": f"tformer.{model.config.architecture}"}
    return {"base_model_class": _model_class(family, model),
            "parent_library": f"transformers.models.{family.model_type}.modeling_{family.model_type}"}


def _model_class(family, model: nn.Module) -> str:
    return family.class_for_head(model.config.head) if family.heads else family.architecture_class


def _dropout(layer: LoraLinear) -> float:
    return float(getattr(layer.dropout, "p", 0.0))


# ---- reading -----------------------------------------------------------------------------------------


def read_peft_adapter(model: nn.Module, folder: Path) -> None:
    """Put the LoRA adapter in ``folder`` over ``model`` (frozen); everything is checked before the model is
    touched."""
    config = _read_config(folder)
    family = _family_or_refuse(model)
    _check_base_class(config, family, model, folder)
    tensors = _read_tensors(folder)
    magnitudes = _dora_magnitudes(tensors, config["use_dora"], folder)  # taken out of ``tensors``
    targets = {(_their_name(family, model, name) if family is not None else name): (target, rows)
               for target in adapter_targets(model)
               for name, rows in (zip(target.hf_names, target.hf_rows, strict=True) if family is not None
                                  else [(target.path, (0, target.outputs))])}
    _check_saved_bases(tensors, targets, family, folder)  # taken out of ``tensors`` too
    whole = _whole_module_state(model, family, config, tensors, folder)
    by_module = _adapted_modules({name: t for name, t in tensors.items() if name.endswith(ADAPTER_SUFFIXES)}, folder)
    unknown = [name for name in by_module if _lookup(targets, family, name) is None]
    if unknown:
        kind = f"this {family.model_type} model" if family is not None else "this model"
        raise AdapterError(f"{folder / ADAPTER_WEIGHTS} adapts {listed(unknown, 3)}, which {kind} has no linear layer "
                           f"or token table of (it has {listed(list(targets), 3)}): an adapter for another base")
    rank = config["r"]
    plans: dict[str, list[tuple[tuple[int, int], Tensor, Tensor, Tensor | None]]] = {}
    for name, (a, b, table) in by_module.items():
        target, (start, stop) = _lookup(targets, family, name)
        if table != target.is_table:
            held, needed = ("a token table's", "a linear layer") if table else ("a linear layer's", "a token table")
            raise AdapterError(f"{folder / ADAPTER_WEIGHTS}: {name} holds {held} adapter, and this model's {name} is "
                               f"{needed}: an adapter for another base")
        magnitude = magnitudes.pop(name, None)
        if config["use_dora"] and magnitude is None:
            raise AdapterError(f"{folder / ADAPTER_WEIGHTS}: {name} has no {MAGNITUDE.lstrip('.')} (use_dora is "
                               "true: every adapted module holds one)")
        _check_shapes(folder, name, a, b, rank, target.inputs, stop - start, magnitude, table)
        plans.setdefault(target.path, []).append(((start, stop), a, b, magnitude))
    if magnitudes:
        raise AdapterError(f"{folder / ADAPTER_WEIGHTS}: {listed(list(magnitudes), 3)} hold DoRA magnitudes "
                           "without lora_A and lora_B")
    adapted_trained = [name for name in whole if any(name.startswith(path + ".") for path in plans)]
    if adapted_trained:
        raise AdapterError(f"{folder / ADAPTER_WEIGHTS}: {adapted_trained[0]} is both adapted and trained whole")
    model.requires_grad_(False)
    for path, blocks in plans.items():
        blocks.sort(key=lambda block: block[0])
        layer = install_lora(model, path, rank, config["lora_alpha"], [rows for rows, _, _, _ in blocks],
                             config["lora_dropout"], config["use_rslora"], config["use_dora"])
        with torch.no_grad():
            for index, (_, a, b, magnitude) in enumerate(blocks):
                layer.lora_A[index].copy_(a)
                layer.lora_B[index].copy_(b)
                if magnitude is not None:
                    layer.lora_magnitude[index].copy_(magnitude)
    modules = list(dict.fromkeys(name.rpartition(".")[0] for name in whole))
    train_whole(model, modules)  # the base's weights kept first: unloading the adapter gives them back
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in whole.items():
            parameters[name].copy_(value)


def _check_saved_bases(tensors: dict[str, Tensor], targets: dict, family, folder: Path) -> None:
    """Take the base weights PEFT saves beside an adapter over a token table or an output head
    (``<module>.base_layer.weight``, save_embedding_layers: for a vocabulary that may have grown) out of
    ``tensors``: each must be this model's float weight as it is, else the adapter is for another base."""
    for name in [name for name in tensors if name.startswith(PEFT_PREFIX) and name.endswith(BASE_WEIGHT)]:
        module = name.removeprefix(PEFT_PREFIX).removesuffix(BASE_WEIGHT)
        saved, found = tensors.pop(name), _lookup(targets, family, module)
        if found is None:
            raise AdapterError(f"{folder / ADAPTER_WEIGHTS} holds {name}, the base weight of a layer this model "
                               "does not have: an adapter for another base")
        weight = getattr(found[0].layer, "weight", None)
        if not isinstance(weight, Tensor) or not weight.is_floating_point():
            raise AdapterError(f"{folder / ADAPTER_WEIGHTS} holds {module}'s base weight, which this model holds "
                               "quantized: load the adapter onto the float model, then quantize")
        if saved.shape != weight.shape or not torch.equal(saved.to(weight.dtype), weight.detach().cpu()):
            raise AdapterError(f"{folder / ADAPTER_WEIGHTS} holds {module}'s weight {tuple(saved.shape)}, which "
                               f"differs from this model's {tuple(weight.shape)} (PEFT saves a table or head whose "
                               "vocabulary changed): load it onto the base it was trained on")


def peft_trained_modules(folder: Path) -> list[str]:
    """The modules an adapter folder trains whole (its adapter_config.json's modules_to_save that its tensors
    hold); [] when none."""
    config = _read_config(folder)
    names = config.get("modules_to_save") or []
    if not names:
        return []
    held = [name.removeprefix(PEFT_PREFIX) for name in _read_tensors(folder)
            if not name.endswith((*ADAPTER_SUFFIXES, MAGNITUDE, BASE_WEIGHT))]
    return [entry for entry in names if any(_covers(entry, name) for name in held)]


def _whole_module_state(model: nn.Module, family, config: dict[str, Any], tensors: dict[str, Tensor],
                        folder: Path) -> dict[str, Tensor]:
    """tformer parameter name -> value of the tensors the file holds for modules trained whole (PEFT's
    modules_to_save), checked against the model: each covered by a modules_to_save name, each a parameter of the
    model in its shape, every part of a fused matrix there."""
    others = {name.removeprefix(PEFT_PREFIX): tensor for name, tensor in tensors.items()
              if name.startswith(PEFT_PREFIX) and not name.endswith(ADAPTER_SUFFIXES)}
    stray = [name for name in tensors if not name.startswith(PEFT_PREFIX)]
    names = config.get("modules_to_save") or []
    stray += [PEFT_PREFIX + name for name in others if not any(_covers(entry, name) for entry in names)]
    if stray:
        raise AdapterError(f"{folder / ADAPTER_WEIGHTS} holds {listed(stray, 3)}: tformer reads LoRA's lora_A and "
                           "lora_B weights (lora_embedding_A and lora_embedding_B of a token table), DoRA's magnitudes "
                           "and the tensors of modules_to_save only")
    if not others:
        return {}
    ours = _our_parameter_names(model, family)
    missing = [name for name in others if _lookup(ours, family, name) is None]
    if missing:
        raise AdapterError(f"{folder / ADAPTER_WEIGHTS} trains {listed(missing, 3)} whole (modules_to_save), which "
                           "this model has no parameter of: an adapter for a model with another head (load the base "
                           "with that head, e.g. tformer.load(BASE, head=\"sequence_classification\", num_labels=N))")
    pieces: dict[str, list[tuple[int, Tensor]]] = {}
    for name, tensor in others.items():
        our_name, index, transposed = _lookup(ours, family, name)
        pieces.setdefault(our_name, []).append((index, tensor.t() if transposed and tensor.dim() == 2 else tensor))
    parameters = dict(model.named_parameters())
    state = {}
    for our_name, parts in pieces.items():
        expected = sum(1 for entry in ours.values() if entry[0] == our_name)
        if len(parts) != expected:
            raise AdapterError(f"{folder / ADAPTER_WEIGHTS}: {our_name} is fused from {expected} Hugging Face tensors "
                               f"and the file holds {len(parts)} of them")
        parts.sort(key=lambda part: part[0])
        value = torch.cat([part for _, part in parts]) if len(parts) > 1 else parts[0][1]
        target = parameters[our_name]
        if tuple(value.shape) != tuple(target.shape) or not value.is_floating_point():
            raise AdapterError(f"{folder / ADAPTER_WEIGHTS}: {our_name} (trained whole) is {tuple(value.shape)}, this "
                               f"model's is {tuple(target.shape)}: an adapter for another base")
        state[our_name] = value
    return state


def _our_parameter_names(model: nn.Module, family) -> dict[str, tuple[str, int, bool]]:
    """HF parameter name (as the model's class names it; tformer's own without a family) -> (tformer parameter,
    its part's index in a fused matrix, whether HF stores it transposed)."""
    names = {}
    for name, parameter in model.named_parameters():
        if family is None:
            names[name] = (name, 0, False)
            continue
        module, _, kind = name.rpartition(".")
        parts = module_parts(family.module_map(model.config), model.config, module, parameter.shape[0])
        if parts is None:
            continue
        theirs, _, transposed = parts
        for index, their in enumerate(theirs):
            names[f"{_their_name(family, model, their)}.{kind}"] = (name, index, transposed)
    return names


def _covers(entry: str, name: str) -> bool:
    """Whether modules_to_save's ``entry`` names a module holding the tensor ``name`` (PEFT's match: the
    module's path is the entry or ends with "." + it)."""
    parts = name.split(".")[:-1]
    paths = (".".join(parts[:count]) for count in range(1, len(parts) + 1))
    return any(path == entry or path.endswith("." + entry) for path in paths)


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / ADAPTER_CONFIG
    if not path.is_file():
        raise AdapterError(f"{folder}: no {ADAPTER_CONFIG} (a PEFT adapter folder holds it and {ADAPTER_WEIGHTS})")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AdapterError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        found = config.get("peft_type") if isinstance(config, dict) else config
        raise AdapterError(f"{path}: peft_type={found!r}; tformer reads LoRA adapters (peft_type LORA)")
    for key, unused in NOT_COMPUTED.items():
        if key in config and config[key] not in unused:
            raise AdapterError(f"{path}: {key}={config[key]!r} is a PEFT setting tformer does not compute "
                               f"(it reads adapters with {key}={unused[0]!r})")
    rank, alpha = config.get("r"), config.get("lora_alpha", 8)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterError(f"{path}: r={rank!r} must be a positive whole number")
    if not isinstance(alpha, numbers.Real) or isinstance(alpha, bool):
        raise AdapterError(f"{path}: lora_alpha={alpha!r} must be a number")
    dropout = config.get("lora_dropout", 0.0)
    if not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1:
        raise AdapterError(f"{path}: lora_dropout={dropout!r} must be a number in [0, 1)")
    for key in ("use_rslora", "use_dora"):
        if config.get(key) is not None and not isinstance(config[key], bool):
            raise AdapterError(f"{path}: {key}={config[key]!r} must be true or false")
    return {**config, "lora_alpha": float(alpha), "lora_dropout": float(dropout),
            "use_rslora": config.get("use_rslora") or False, "use_dora": config.get("use_dora") or False}


def _check_base_class(config: dict[str, Any], family, model: nn.Module, folder: Path) -> None:
    """An adapter_config.json that names its base class (PEFT writes auto_mapping) must name one of this
    model's family (or tformer, for tformer's own names)."""
    mapping = config.get("auto_mapping")
    named = mapping.get("base_model_class") if isinstance(mapping, dict) else None
    if named is None:
        return
    if family is None:
        allowed = (TFORMER_CLASS,)
    else:
        allowed = (family.architecture_class, *family.heads)
    if named not in allowed:
        this = _model_class(family, model) if family is not None else f"tformer's {model.config.architecture}"
        raise AdapterError(f"{folder / ADAPTER_CONFIG}: an adapter for {named}; this model is {this}")


def _read_tensors(folder: Path) -> dict[str, Tensor]:
    path = folder / ADAPTER_WEIGHTS
    if not path.is_file():
        pickled = " (adapter_model.bin is a pickle, which tformer does not read: resave it with safetensors)" if (
            folder / "adapter_model.bin").is_file() else ""
        raise AdapterError(f"{folder}: no {ADAPTER_WEIGHTS}{pickled}")
    try:
        return read_safetensors(path)
    except Exception as error:  # a damaged or foreign file: one line naming it
        raise AdapterError(f"{path}: not a readable safetensors file ({error})") from None


def _adapted_modules(tensors: dict[str, Tensor], folder: Path) -> dict[str, tuple[Tensor, Tensor, bool]]:
    """Module name (without PEFT's prefix) -> (lora_A, lora_B, whether they are a token table's) of the file's
    LoRA tensors."""
    modules = {}
    for name in tensors:
        suffix = next(suffix for suffix in ADAPTER_SUFFIXES if name.endswith(suffix))
        modules.setdefault(name.removeprefix(PEFT_PREFIX).removesuffix(suffix), suffix in TABLE_SUFFIXES)
    found = {}
    for module, table in modules.items():
        pair = [tensors.get(f"{PEFT_PREFIX}{module}{suffix}") for suffix in (TABLE_SUFFIXES if table else SUFFIXES)]
        if any(tensor is None for tensor in pair):
            raise AdapterError(f"{folder / ADAPTER_WEIGHTS}: {module} has one of its two LoRA matrices, not both")
        found[module] = (pair[0], pair[1], table)
    if not found:
        raise AdapterError(f"{folder / ADAPTER_WEIGHTS} holds no adapter tensors")
    return found


def _dora_magnitudes(tensors: dict[str, Tensor], use_dora: bool, folder: Path) -> dict[str, Tensor]:
    """Module name -> DoRA magnitude (rows,) of the file, taken out of ``tensors``; magnitudes in a file whose
    config says use_dora false are refused."""
    found = {name.removeprefix(PEFT_PREFIX).removesuffix(MAGNITUDE): tensors.pop(name)
             for name in [name for name in tensors if name.startswith(PEFT_PREFIX) and name.endswith(MAGNITUDE)]}
    if found and not use_dora:
        raise AdapterError(f"{folder / ADAPTER_WEIGHTS} holds DoRA magnitudes ({listed(list(found), 3)}) but "
                           f"{ADAPTER_CONFIG} says use_dora=false")
    return found


def _check_shapes(folder: Path, name: str, a: Tensor, b: Tensor, rank: int, inputs: int, outputs: int,
                  magnitude: Tensor | None = None, table: bool = False) -> None:
    kinds = [suffix.lstrip(".") for suffix in (TABLE_SUFFIXES if table else SUFFIXES)]
    expected_shapes = [(kinds[0], a, (rank, inputs)), (kinds[1], b, (outputs, rank))]
    if magnitude is not None:
        expected_shapes.append((MAGNITUDE.lstrip("."), magnitude, (outputs,)))
    for kind, tensor, expected in expected_shapes:
        if tuple(tensor.shape) != expected or not tensor.is_floating_point():
            raise AdapterError(f"{folder / ADAPTER_WEIGHTS}: {name}.{kind} is {tuple(tensor.shape)} "
                               f"{str(tensor.dtype).removeprefix('torch.')}, this model needs {expected} float "
                               f"(r={rank}): an adapter for another base")


# ---- names -------------------------------------------------------------------------------------------


def _family_or_refuse(model: nn.Module):
    """The model's Hugging Face family (None: tformer's own names); a family whose weights are not a plain
    rename of tformer's is refused."""
    family = hf_family(model)
    if family is not None and family.model_type in UNMAPPED_FAMILIES:
        raise AdapterError(f"{family.model_type} adapters: {UNMAPPED_FAMILIES[family.model_type]}")
    return family


def _their_name(family, model: nn.Module, name: str) -> str:
    """An HF module name (the LM class's, as the module map holds it) as the model's HF class names it: a bare
    model's class (a family with heads, no head) without the base prefix, as ``Family.saved_state`` writes."""
    if family is not None and family.heads and model.config.head is None:
        return name.removeprefix(family.base_prefix)
    return name


def _lookup(targets: dict, family, name: str):
    """The (target, rows) of a module name from a file: as this model's class names it, or as the family's
    other classes do (with or without the base prefix)."""
    found = targets.get(name)
    if found is None and family is not None:
        prefix = family.base_prefix
        found = targets.get(name.removeprefix(prefix)) or targets.get(prefix + name)
    return found
