"""Weight backends: how a model's linear layers hold and multiply their weights, swapped in as modules
(``use_weights``) so that the model's code never changes. Adding a backend is one file (a subclass of
``LinearBackend``) and one entry in ``WEIGHT_BACKENDS``.

- ``plain``: ``nn.Linear`` itself (training; the default on accelerators).
- ``prepacked``: the same parameters, read at inference from a copy laid out for the CPU's matrix
  library (the default for decoding on the CPU; ``prepacked.py`` says why and what it costs).
- ``int8``, ``int4``: quantized weights (``quantized.py``), put in place by ``tformer.quantization``; they
  hold no float weight, so no other backend replaces them. ``w8a8``: int8's weights, and activations
  rounded to int8 per row where that multiplies faster (``int8.py``).
- ``lora`` (``lora.py``): a frozen layer on any of these plus a low-rank update (LoRA, QLoRA); ``dora``
  (``dora.py``): a float layer whose adapted rows are renormalised with a trained length (DoRA);
  ``multi_lora`` (``multi_lora.py``): several adapters' updates over one base, each row of a step taking one
  (serving several adapters on one model).
"""

from __future__ import annotations

import torch
from torch import nn

from tformer.nn.weights.backend import LinearBackend, decoding_step
from tformer.nn.weights.int4 import Int4Linear
from tformer.nn.weights.int8 import Int8Linear, W8A8Linear
from tformer.nn.weights.prepacked import PrepackedLinear
from tformer.nn.weights.quantized import QuantizedLinear

WEIGHT_BACKENDS: dict[str, type[nn.Linear]] = {"plain": nn.Linear, "prepacked": PrepackedLinear}
QUANTIZED_BACKENDS: dict[str, type[QuantizedLinear]] = {"int8": Int8Linear, "int4": Int4Linear,
                                                         "w8a8": W8A8Linear}


def decoding_weights(device: torch.device) -> str:
    """The weight backend decoding uses by default on ``device``: prepacked on the CPU, plain elsewhere."""
    return "prepacked" if device.type == "cpu" else "plain"


def use_weights(model: nn.Module, name: str) -> nn.Module:
    """Swap every linear layer of ``model`` to the weight backend ``name`` (in place; returned too); layers
    already on it check that what they derived from the weights still holds (``verify``). Quantized layers
    stay as they are (``tformer.quantization.dequantized`` gives float layers back)."""
    if name not in WEIGHT_BACKENDS:
        raise ValueError(f"weight backend {name!r} is not one of {', '.join(WEIGHT_BACKENDS)}")
    backend = WEIGHT_BACKENDS[name]
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            if type(child) is backend or (isinstance(child, LinearBackend) and not child.lossless):
                if isinstance(child, LinearBackend):
                    child.verify()
                continue
            linear = child.to_linear() if isinstance(child, LinearBackend) else child
            setattr(module, child_name, linear if backend is nn.Linear else backend.from_linear(linear))
    return model


def weights_in_use(model: nn.Module) -> set[str]:
    """The names of the weight backends of ``model``'s linear layers (a subclass of nn.Linear counts as plain, a
    decoding view's subclass of a backend as that backend)."""
    names = {backend: name for name, backend in {**WEIGHT_BACKENDS, **QUANTIZED_BACKENDS}.items()}
    return {next((names[cls] for cls in type(m).__mro__[:2] if cls in names), "plain")
            for m in model.modules() if isinstance(m, nn.Linear)}


__all__ = ["QUANTIZED_BACKENDS", "WEIGHT_BACKENDS", "Int4Linear", "Int8Linear", "LinearBackend", "PrepackedLinear",
           "QuantizedLinear", "W8A8Linear", "decoding_step", "decoding_weights", "use_weights", "weights_in_use"]
