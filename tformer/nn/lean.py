"""Calling a module's parts directly in a decoding step, when no hook could see the difference.

Calling a module runs ``nn.Module.__call__``: two Python frames, a tracing check and eight hook checks
before ``forward``, about a microsecond, while a one-token decoding step of a small model calls some
sixty modules whose own work is a few microseconds each (and the time between its tensor operations is
what the step waits on). So a model checks once, when it is prepared for decoding
(``Model.prepare_for_decoding``: every ``generate`` call, the serving engine's start), whether anything
could observe its modules being called: a hook on any of them or registered for every module, or a part
compiled on its own. When nothing could, its decoding steps call each part's ``forward`` directly
(``direct`` in the stack, block and attention); every other pass, and every step of a model with hooks,
calls the modules as usual. A hook registered in the middle of a generation is seen from the next call.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules import module as _nn_module


def observed(model: nn.Module) -> bool:
    """Whether calling ``model``'s modules could run anything besides their forwards: hooks on any of them
    or for every module (``torch.nn.modules.module.register_module_*_hook``), or a module compiled on its own."""
    if (_nn_module._global_forward_pre_hooks or _nn_module._global_forward_hooks
            or _nn_module._global_backward_pre_hooks or _nn_module._global_backward_hooks):
        return True
    return any(module._forward_pre_hooks or module._forward_hooks or module._backward_pre_hooks
               or module._backward_hooks or module._compiled_call_impl is not None for module in model.modules())
