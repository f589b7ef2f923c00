"""The decoding view of a model: the same parameters, laid out and called the way decoding steps run fastest,
without changing the caller's model.

Two things make a small model's decoding step faster, and both would change a model if done to it:
- **Weights laid out for reading** (``nn.weights``): on the CPU every linear layer becomes a
  ``PrepackedLinear`` over the very same ``weight`` and ``bias`` parameters.
- **Parts called without ``nn.Module.__call__``**: calling a module runs two Python frames, a tracing
  check and eight hook checks before ``forward`` (about a microsecond), while a one-token step of a small
  model calls some sixty modules whose own work is a few microseconds each. When nothing could observe
  the calls (no hook on any module nor registered for every module, no part compiled on its own), each
  part of the view is an instance of a subclass whose ``__call__`` is its ``forward``, so the model's one
  forward runs unchanged and simply skips the wrapper.

The view is a structural copy: one new object per module, sharing the original's parameter, buffer and
hook dictionaries (a hook registered later is still seen, and a buffer a part grows is grown for both),
with the linear layers swapped. Generation and the serving engine make one for the length of a call or
of the engine's life and decode through it; the caller's model keeps its module types, attributes and
``state_dict`` keys. A backend's derived copy of a layer (the prepacked layout) is kept per layer while
the layer lives, so consecutive calls reuse it; ``verify`` drops it when the weights changed.
"""

from __future__ import annotations

import weakref

from torch import nn
from torch.nn.modules import module as _nn_module

from tformer.nn.weights import WEIGHT_BACKENDS, LinearBackend

# (backend class, direct) -> {layer: its backend layer} (made once while the layer lives)
_BACKENDS: dict[tuple[type, bool], weakref.WeakKeyDictionary] = {}
_DIRECT_CLASSES: dict[type, type] = {}  # a module class -> its subclass whose __call__ is forward
HOOK_DICTIONARIES = tuple(name for name in vars(nn.Module()) if "hooks" in name)


def observed(model: nn.Module) -> bool:
    """Whether calling ``model``'s modules could run anything besides their forwards: hooks on any of them
    or for every module (``torch.nn.modules.module.register_module_*_hook``), or a module compiled on its own."""
    if (_nn_module._global_forward_pre_hooks or _nn_module._global_forward_hooks
            or _nn_module._global_backward_pre_hooks or _nn_module._global_backward_hooks):
        return True
    return any(module._forward_pre_hooks or module._forward_hooks or module._backward_pre_hooks
               or module._backward_hooks or module._compiled_call_impl is not None for module in model.modules())


def decoding_view(model: nn.Module, weights: str) -> nn.Module:
    """A view of ``model`` in inference mode over its own parameters: linear layers on the weight backend
    ``weights`` (quantized layers as they are), parts called directly when nothing observes them. The model
    itself is left as it was."""
    if weights not in WEIGHT_BACKENDS:
        raise ValueError(f"weight backend {weights!r} is not one of {', '.join(WEIGHT_BACKENDS)}")
    return _view(model, WEIGHT_BACKENDS[weights], not observed(model), {})


def _view(module: nn.Module, backend: type[nn.Linear], direct: bool, made: dict[int, nn.Module]) -> nn.Module:
    """``module``'s copy in the view (one per module, however often it is reached: tied parts stay tied)."""
    found = made.get(id(module))
    if found is not None:
        return found
    layer = _backend_layer(module, backend, direct)
    if layer is not None:
        for name in HOOK_DICTIONARIES:  # the layer's hooks are the original's, registered before or after
            layer.__dict__[name] = module.__dict__[name]
        made[id(module)] = layer
        return layer
    cls = _own_class(module)
    view = object.__new__(_direct_class(cls) if direct else cls)
    state = dict(module.__dict__)  # shares the parameter, buffer and hook dictionaries
    state["training"] = False
    object.__setattr__(view, "__dict__", state)
    made[id(module)] = view
    state["_modules"] = {name: None if child is None else _view(child, backend, direct, made)
                         for name, child in module._modules.items()}
    return view


def _backend_layer(module: nn.Module, backend: type[nn.Linear], direct: bool) -> nn.Module | None:
    """The view's layer for a float linear ``module`` on ``backend``, made once per layer and kept while the
    layer lives (its derived copy of the weights with it), checked by ``verify`` each time; None for anything
    else (a module to copy: plain layers when ``backend`` is plain, quantized layers, other modules)."""
    if backend is nn.Linear or not isinstance(module, nn.Linear) or (
            isinstance(module, LinearBackend) and not module.lossless):
        return None
    made = _BACKENDS.setdefault((backend, direct), weakref.WeakKeyDictionary())
    layer = made.get(module)
    if layer is None or layer.weight is not module.weight or layer.bias is not module.bias:
        layer = backend.from_linear(module)
        if direct:
            layer.__class__ = _direct_class(backend)
        layer.training = False
        # The entry must not hold the layer it is keyed by (it would never be dropped): the view needs no
        # way back to it.
        del layer.__dict__["_source"]
        made[module] = layer
    else:
        layer.verify()
    return layer


def _own_class(module: nn.Module) -> type:
    """The class of ``module``, or the class a view's direct subclass was made from (a view of a view)."""
    cls = type(module)
    return cls.__bases__[0] if _DIRECT_CLASSES.get(cls.__bases__[0]) is cls else cls


def _direct_class(cls: type) -> type:
    """``cls`` with ``__call__`` = its ``forward``: calling an instance skips ``nn.Module.__call__``."""
    direct = _DIRECT_CLASSES.get(cls)
    if direct is None:
        direct = _DIRECT_CLASSES[cls] = type(cls.__name__, (cls,), {"__call__": cls.forward,
                                                                   "__module__": cls.__module__,
                                                                   "__qualname__": cls.__qualname__})
    return direct
