"""Quantized models: every linear layer of a transformer family on the ``int8``, ``w8a8`` or ``int4`` weight
backend (``nn/weights``), and the scheme a checkpoint records in config.json so that ``tformer.load`` gives the same
quantized model back.

``quantize(model, "int8")`` swaps the layers in place (the output head too unless ``head=False``) and, unless
``embeddings=False``, holds the token tables as int8 rows (``nn/weights/table.py``; a table tied to an int8 head
reads the head's rows, one copy; tied to a float head it stays that head's float weight). int4 groups
``group_size`` inputs; a layer whose inputs are not a multiple of it stays in float and the scheme lists it
(``float_layers``). A quantized model is for inference: training it is refused, and a Hugging Face export
writes its dequantized weights (with a warning).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from tformer.errors import TformerError
from tformer.nn.embeddings import TokenEmbedding
from tformer.nn.weights import QUANTIZED_BACKENDS
from tformer.nn.weights.int4 import GROUP_SIZES, int4_problem
from tformer.nn.weights.int8 import Int8Linear
from tformer.nn.weights.quantized import MANY_ROWS, Plan, QuantizedLinear, plan_for
from tformer.nn.weights.table import QuantizedTable

METHODS = QUANTIZED_BACKENDS
DEFAULT_GROUP_SIZE = 64
# A quantized weight's step (``scales``) or int4 offset (``zeros``) past this is a corrupt file: a trained layer's
# steps are far below 1, and one of 1e38 overflows every product it enters (the model then gives only <unk>).
SCALE_LIMIT = 1e4


class QuantizationError(TformerError):
    """A quantization that cannot be done or read: an unknown scheme, a family it does not apply to."""


@dataclass(frozen=True)
class QuantizationScheme:
    """How a model's linear layers are quantized: ``method`` (int8: per output channel; w8a8: int8's weights,
    activations rounded to int8 per row where faster; int4: per group of ``group_size`` inputs), whether the
    output ``head`` is, whether the token tables are held as int8 rows (``embeddings``), and the layers kept
    in float (``float_layers``)."""

    method: str
    group_size: int | None = None
    head: bool = True
    float_layers: tuple[str, ...] = field(default=())
    embeddings: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise QuantizationError(f"quantization method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.method == "int4" and self.group_size not in GROUP_SIZES:
            raise QuantizationError(f"int4 group_size={self.group_size!r} is not one of "
                                    f"{', '.join(map(str, GROUP_SIZES))}")
        if self.method != "int4" and self.group_size is not None:
            raise QuantizationError(f"{self.method} is per output channel: it takes no group_size")
        for name in ("head", "embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise QuantizationError(f"quantization {name}={getattr(self, name)!r} must be true or false")

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "group_size": self.group_size, "head": self.head,
                "float_layers": list(self.float_layers), "embeddings": self.embeddings}

    @classmethod
    def from_dict(cls, raw: Any) -> QuantizationScheme:
        """The scheme config.json records; anything else is refused with the reason."""
        if not isinstance(raw, dict) or set(raw) - {"method", "group_size", "head", "float_layers", "embeddings"}:
            raise QuantizationError(f"quantization {raw!r} is not a scheme tformer knows (an object with method, "
                                    "group_size, head, float_layers, embeddings)")
        layers = raw.get("float_layers", [])
        if not isinstance(layers, list) or not all(isinstance(name, str) for name in layers):
            raise QuantizationError(f"quantization float_layers={layers!r} must be a list of layer names")
        # Folders written before token tables were quantized record no "embeddings": their tables are float.
        return cls(raw.get("method"), raw.get("group_size"), raw.get("head", True), tuple(layers),
                   raw.get("embeddings", False))

    def describe(self) -> str:
        text = self.method + (f", groups of {self.group_size}" if self.group_size else "")
        text += "" if self.head else ", head in float"
        text += "" if self.embeddings else ", token tables in float"
        return text + (f", {len(self.float_layers)} layer(s) in float" if self.float_layers else "")


def scheme_for(method: str, group_size: int | None = None, head: bool = True,
               embeddings: bool = True) -> QuantizationScheme:
    """The scheme a user asks for by name: int4's group size defaults to 64, int8 and w8a8 take none."""
    if method == "int4" and group_size is None:
        group_size = DEFAULT_GROUP_SIZE
    return QuantizationScheme(method, group_size, head, embeddings=embeddings)


def quantize(model: nn.Module, method: str | QuantizationScheme, group_size: int | None = None,
             head: bool = True, embeddings: bool = True) -> nn.Module:
    """Quantize ``model``'s linear layers (and token tables, unless ``embeddings=False``) in place (returned
    too) and record the scheme as ``model.quantization``."""
    scheme = method if isinstance(method, QuantizationScheme) else scheme_for(method, group_size, head, embeddings)
    _check_model(model)
    if getattr(model, "quantization", None) is not None:
        raise QuantizationError(f"this model is quantized already ({model.quantization.describe()}); quantize "
                                "its float checkpoint instead")
    adapted = [name for name, _, table in _token_tables(model) if not isinstance(table, nn.Embedding)]
    if scheme.embeddings and adapted:
        raise QuantizationError(f"{adapted[0]} carries a LoRA adapter over its float rows, which quantizing the table "
                                "would drop: merge the adapter first, or keep the tables float (embeddings=False)")
    kept = []
    for name, parent, child_name, linear in _linear_layers(model):
        if not scheme.head and is_head_layer(model, name):
            continue
        if scheme.method == "int4" and int4_problem(linear.in_features, linear.out_features, scheme.group_size):
            kept.append(name)
            continue
        setattr(parent, child_name, METHODS[scheme.method].from_linear(linear, **_options(scheme)))
    if scheme.embeddings:
        _quantize_tables(model, QuantizedTable.from_embedding)
    model.quantization = QuantizationScheme(scheme.method, scheme.group_size, scheme.head, tuple(kept),
                                            scheme.embeddings)
    return model


def prepare_quantized(model: nn.Module, scheme: QuantizationScheme) -> nn.Module:
    """Give a freshly built model the quantized layers of ``scheme`` (empty, for ``load_state_dict`` to fill:
    loading a quantized checkpoint)."""
    _check_model(model)
    for name, parent, child_name, linear in _linear_layers(model):
        if (not scheme.head and is_head_layer(model, name)) or name in scheme.float_layers:
            continue
        if scheme.method == "int4" and int4_problem(linear.in_features, linear.out_features, scheme.group_size):
            continue  # a scheme edited by hand: ``scheme_disagreement`` names it against the weights file
        setattr(parent, child_name, METHODS[scheme.method].empty(linear.in_features, linear.out_features,
                                                                 linear.bias is not None, **_options(scheme)))
    if scheme.embeddings:
        _quantize_tables(model, lambda table: QuantizedTable.empty(table.num_embeddings, table.embedding_dim))
    model.quantization = scheme
    return model


def scheme_disagreement(model: nn.Module, scheme: QuantizationScheme, tensors: Mapping[str, Tensor]) -> str | None:
    """How the tensors of a quantized checkpoint (name -> tensor) disagree with the ``scheme`` its config.json
    records, naming the scheme's field and what the tensors say, or None. A hand-edited config.json (a
    ``float_layers`` emptied or naming a layer the model lacks, another ``group_size``) or tensors of another
    kind (a float ``qweight``) are refused in one line instead of failing inside a layer or loading as
    garbage; ``model`` is the model ``prepare_quantized`` gave the scheme."""
    shapes = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    layers = [name for name, module in model.named_modules() if isinstance(module, (nn.Linear, QuantizedLinear))]
    unknown = [name for name in scheme.float_layers if name not in layers]
    if unknown:
        return (f"config.json's quantization float_layers names {_names(unknown)}, which the model has no linear "
                f"layer of (float_layers lists linear layers of the model, such as {layers[0]})")
    contrary: dict[tuple[str, str], list[str]] = {}  # (field, how the weights hold them) -> layers
    for name, module in model.named_modules():
        if not isinstance(module, (nn.Linear, QuantizedLinear)):
            continue
        field_name = "head" if not scheme.head and is_head_layer(model, name) else "float_layers"
        in_float = field_name == "head" or name in scheme.float_layers
        if in_float and f"{name}.qweight" in shapes:
            contrary.setdefault((field_name, "quantized"), []).append(name)
        elif not in_float and f"{name}.weight" in shapes and f"{name}.qweight" not in shapes:
            contrary.setdefault((field_name, "in float"), []).append(name)
    if contrary:
        (field_name, held), names = next(iter(contrary.items()))
        listed = scheme.float_layers
        value = "false" if field_name == "head" else list(listed) if len(listed) <= 3 else f"[{len(listed)} names]"
        return (f"config.json's quantization {field_name}={value} disagrees with the weights, which hold "
                f"{len(names)} layer(s) {held}: {_names(names)}")
    for name, expected in model.state_dict().items():  # the integers of the quantized layers and tables
        if not expected.is_floating_point() and name in tensors and tensors[name].dtype != expected.dtype:
            return (f"{name} holds {_dtype(tensors[name])} values where this {scheme.method} checkpoint holds "
                    f"{_dtype(expected)} integers; the weights are not what tformer quantize writes")
    if scheme.method == "int4":
        for name, shape in sorted(shapes.items()):
            layer = name.removesuffix(".zeros")
            if layer == name or len(shape) != 2 or len(shapes.get(f"{layer}.qweight", ())) != 2:
                continue
            inputs = 2 * shapes[f"{layer}.qweight"][1]
            if shape[1] and inputs != shape[1] * scheme.group_size:
                return (f"config.json's quantization group_size={scheme.group_size} disagrees with the weights, "
                        f"which hold {layer} ({inputs} inputs) in {shape[1]} group(s) of {inputs / shape[1]:g}")
    return None


def implausible_scales(tensors: Mapping[str, Tensor]) -> dict[str, float]:
    """The quantization steps and offsets (``*.scales``, ``*.zeros``) among ``tensors`` whose finite values pass
    ``SCALE_LIMIT`` in magnitude, each with its largest: finite, but the model's outputs will not be."""
    found = {}
    for name, tensor in sorted(tensors.items()):
        if name.endswith((".scales", ".zeros")) and tensor.is_floating_point() and tensor.numel():
            largest = float(tensor.detach().float().nan_to_num(0.0, 0.0, 0.0).abs().max())
            if largest > SCALE_LIMIT:
                found[name] = largest
    return found


def _names(names: Sequence[str]) -> str:
    return f"{', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"


def _dtype(tensor: Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def dequantized(model: nn.Module) -> nn.Module:
    """``model`` with every quantized layer back in float (in place; the quantization's error stays in the
    weights), tied heads tied again to the token table, and no scheme."""
    for _, embedding, table in _token_tables(model):
        if isinstance(table, QuantizedTable):
            embedding.token = table.to_embedding()
    for _, parent, child_name, linear in _linear_layers(model):
        if isinstance(linear, QuantizedLinear):
            setattr(parent, child_name, linear.to_linear())
    for alias, source in getattr(model, "tied_parameters", dict)().items():
        owner_name, _, attribute = alias.rpartition(".")
        setattr(model.get_submodule(owner_name), attribute, model.get_parameter(source))
    model.quantization = None
    return model


def plans(model: nn.Module) -> dict[str, Plan]:
    """How each quantized backend of ``model`` multiplies on this host (measured once per process)."""
    backends = {type(m) for m in model.modules() if isinstance(m, QuantizedLinear)}
    return {backend.name: plan_for(backend) for backend in sorted(backends, key=lambda b: b.name)}


def quantized_weights(model: nn.Module) -> int:
    """How many weights ``model`` holds as integers: every quantized layer's inputs x outputs and every token
    table's own rows."""
    layers = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, QuantizedLinear))
    return layers + sum(m.qweight.numel() for m in model.modules() if isinstance(m, QuantizedTable) and m.owned)


def represented_parameters(model: nn.Module, exclude_embeddings: bool = False) -> int:
    """The parameters of the float model ``model`` stands for, as its ``num_parameters`` counts them: the float
    parameters, each quantized layer's inputs x outputs and each token table's rows x width once (a table tied
    to a quantized head is that head's weight, as in the float model). A quantized model's own parameters are
    only what stayed float (a 28,800-parameter model counted 896)."""
    total = model.num_parameters(exclude_embeddings)
    total += sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, QuantizedLinear))
    heads = {source.rpartition(".")[0]: alias.rpartition(".")[0] for alias, source in model.tied_parameters().items()}
    for name, _, table in _token_tables(model):
        size = table.num_embeddings * table.embedding_dim
        shared = name in heads and _quantized_head(model.get_submodule(heads[name]))
        if not isinstance(table, QuantizedTable):
            total -= size if shared else 0  # counted as a float table and as the quantized head it is tied to
        elif exclude_embeddings:
            total -= size if shared else 0  # as the float model's tied head goes with its table
        elif not shared:
            total += size
    return total


def _quantized_head(head: nn.Module) -> bool:
    """Whether ``head`` is a quantized layer, or an adapter over one (QLoRA over a tied head)."""
    return any(isinstance(module, QuantizedLinear) for module in head.modules())


def _quantize_tables(model: nn.Module, own_table) -> None:
    """Put a ``QuantizedTable`` in place of every token table of ``model``: one reading the rows of the int8
    head it is tied to, else its own (``own_table(table)``: also beside an int4 head, whose groups are not a
    table's rows); a table tied to a head left in float stays float (it is that head's weight)."""
    heads = {source: alias.rpartition(".")[0] for alias, source in model.tied_parameters().items()}
    for name, embedding, table in _token_tables(model):
        head_name = heads.get(f"{name}.weight")
        if head_name is None:
            embedding.token = own_table(table)
            continue
        head = model.get_submodule(head_name)
        if isinstance(head, Int8Linear):
            embedding.token = QuantizedTable.tied_to(head)
        elif isinstance(head, QuantizedLinear):
            embedding.token = own_table(table)


def _token_tables(model: nn.Module):
    """(name, TokenEmbedding, its table) of every token table of ``model``."""
    for name, module in list(model.named_modules()):
        if isinstance(module, TokenEmbedding):
            yield (f"{name}.token" if name else "token"), module, module.token


def _options(scheme: QuantizationScheme) -> dict[str, Any]:
    """What the scheme's backend takes besides the layer: int4's group size."""
    return {"group_size": scheme.group_size} if scheme.method == "int4" else {}


def _check_model(model: nn.Module) -> None:
    config = getattr(model, "config", None)
    if getattr(config, "architecture", None) == "rnn_seq2seq":
        raise QuantizationError("quantization applies to the transformer families; the RNN baseline "
                                "(architecture rnn_seq2seq) keeps its float weights")


def _linear_layers(model: nn.Module):
    """(name, parent, attribute, layer) of every linear layer of ``model``, in module order."""
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                yield (f"{parent_name}.{child_name}" if parent_name else child_name), parent, child_name, child


def is_head_layer(model: nn.Module, name: str) -> bool:
    """Whether the linear layer ``name`` belongs to the model's output head (the LM head, a task head)."""
    top = name.split(".", 1)[0]
    return top == "lm_head" or top in getattr(model, "head_modules", ())


def cast_model(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast ``model``'s floating-point parameters and buffers to ``dtype`` in place; a QuantizationError ("quantized
    (int8) and its Int8Linear layers cannot take ...") when its quantized layers cannot run in it on this host."""
    model.to(dtype)
    problem = quantized_dtype_problem(model, dtype)
    if problem is not None:
        raise QuantizationError(f"quantized ({model.quantization.describe()}) and {problem}")


def quantized_dtype_problem(model: nn.Module, dtype: torch.dtype) -> str | None:
    """Why the quantized layers of ``model`` (cast to ``dtype``) cannot run in it, or None: one layer of each kind
    and shape is run, as decoding runs it (one row) and as a prompt does (many), and must answer in ``dtype``.
    Checked rather than assumed: which kernel a quantized layer uses is measured per host."""
    probes, seen = [], set()
    for module in model.modules():
        if isinstance(module, tuple(QUANTIZED_BACKENDS.values())):
            key = (type(module), module.in_features, module.out_features)
            probes += [] if key in seen else [(module, torch.zeros(rows, module.in_features, dtype=dtype,
                                                                   device=model.device)) for rows in (1, MANY_ROWS)]
        elif isinstance(module, QuantizedTable):
            key = QuantizedTable
            probes += [] if key in seen else [(module, torch.zeros(1, 1, dtype=torch.long, device=model.device))]
        else:
            continue
        seen.add(key)
    for module, inputs in probes:
        try:
            with torch.inference_mode():
                answer = module(inputs)
        except RuntimeError as error:
            why = str(error).splitlines()[0] if str(error) else type(error).__name__
            return (f"its {type(module).__name__} layers cannot take {str(dtype).removeprefix('torch.')} inputs "
                    f"on this host ({why})")
        if answer.dtype != dtype:
            return f"its {type(module).__name__} layers answer in {answer.dtype}, not {dtype}"
    return None
