"""The generation protocol: everything decoding sessions (``tformer.generation``) and the serving engine ask of a
model, declared once with its defaults. Every tformer model has it through ``Model``; a model built elsewhere
joins ``generate`` by subclassing ``GenerationProtocol`` and overriding what it has (tests/generation/
test_generation_protocol.py builds two that way). Generation reads nothing of a model but these names and
``nn.Module``'s own (``forward``, ``parameters``), so nothing there probes a model for an attribute.

What a session needs, in the order it needs it:

- ``generates``: it writes tokens (decoders, encoder-decoders, speech models); ``generate`` refuses the rest.
- ``check_generation_input``: why a prompt cannot be this model's, or None. By default the prompt is token ids
  of its vocabulary, left-padded unless ``encodes_prompt`` (a source the model encodes, padded on either side);
  ``prompt_is_tokens`` False (a speech model's log-mel features) hands the prompt to the model as it is.
- ``decoding_view()``: the model to decode through for one call or an engine's life (``Model``'s: the same
  parameters on the decoding weight backend, parts called directly; ``nn/decoding_view.py``).
- ``prepare_generation(input_ids, attention_mask)`` -> ``GenerationState``: the decoder's first tokens and
  what every step reads (an encoder's output), once per call.
- ``new_cache(batch_size, max_len)``, ``position_limit``, ``cache_bytes_per_token(dtype)``,
  ``layout_bytes_per_token()``: the cache, the longest sequence a position table allows, and the memory a
  session takes; ``cache_specs()``: what each layer's cache keeps, declared (``nn.attention.cache_spec``), which
  the serving engine allocates from.
- ``forward(input_ids, attention_mask=..., cache=..., **step_inputs)``: a step through the model's checked
  forward (``ModelSession``), or ``step(input_ids, layout, cache, **step_inputs)`` over its own blocks with a
  layout the session cuts from its tables (``StackSession``: ``step_problem()`` is None,
  ``token_positions`` and ``step_layout`` build the layout), inside ``stepping``, the context every step
  runs in (weight backends read their derived copies only there).
- ``tokenizer``, ``generation_config``: what the model's folder brought (stop strings, a folder's defaults).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

from tformer.models.output import GenerationState
from tformer.nn.attention import StepLayout
from tformer.nn.attention.cache import static_caches
from tformer.nn.attention.cache_spec import FullAttention, LayerCacheSpec
from tformer.nn.positions import POSITIONAL_SCHEMES, positions_from_mask

TOKEN_DTYPES = (torch.long, torch.int32, torch.int16, torch.uint8)


class GenerationProtocol:
    """What a model offers generation and the serving engine, with defaults (see the module's docstring)."""

    config: Any  # a ModelConfig: vocab_size, the default end and pad ids
    generates: bool = False
    encodes_prompt: bool = False
    prompt_is_tokens: bool = True
    tokenizer: Any = None
    generation_config: Any = None  # a GenerationConfig of the folder's generation_config.json, or None
    position_limit: int | None = None
    stepping: contextlib.AbstractContextManager = contextlib.nullcontext()

    def decoding_view(self) -> GenerationProtocol:
        """The model decoding runs through; by default the model itself."""
        return self

    def check_generation_input(self, inputs: object, attention_mask: object) -> str | None:
        """Why ``inputs`` (B, T) and ``attention_mask`` (B, T) or None cannot be this model's prompt, or None."""
        if not isinstance(inputs, Tensor) or inputs.dim() != 2 or inputs.shape[1] == 0:
            shape = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
            return f"input_ids must be a tensor of shape (batch, length >= 1), got {shape}"
        if inputs.shape[0] == 0:
            return "input_ids has no rows (batch size 0)"
        if inputs.dtype not in TOKEN_DTYPES:
            return f"input_ids must hold integer token ids, got dtype {inputs.dtype}"
        vocab = self.config.vocab_size
        low, high = int(inputs.min()), int(inputs.max())
        if low < 0 or high >= vocab:
            return f"token id {low if low < 0 else high} in input_ids is outside the vocabulary [0, {vocab})"
        return None if attention_mask is None else self._mask_problem(inputs, attention_mask)

    def _mask_problem(self, inputs: Tensor, attention_mask: object) -> str | None:
        """Why ``attention_mask`` cannot mark the tokens of ``inputs``, or None."""
        if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(inputs.shape):
            shape = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            return f"attention_mask must have the shape of input_ids {tuple(inputs.shape)}, got {shape}"
        mask = attention_mask.long()
        if bool(((mask != 0) & (mask != 1)).any()):
            return "attention_mask must hold only 0 (padding) and 1 (token)"
        if bool((mask.sum(-1) == 0).any()):
            return f"attention_mask row {int((mask.sum(-1) == 0).nonzero()[0])} has no token"
        if not self.encodes_prompt and bool((mask[:, 1:] < mask[:, :-1]).any()):
            row = int((mask[:, 1:] < mask[:, :-1]).any(-1).nonzero()[0])
            return f"attention_mask row {row} is not left-padded: padding (0) must come before the tokens (1)"
        return None

    def prepare_generation(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> GenerationState:
        """The decoder's prompt and what every step reads, once per call."""
        raise NotImplementedError(f"{type(self).__name__} does not prepare a prompt for generation")

    def new_cache(self, batch_size: int, max_len: int) -> Any:
        """An empty cache for ``batch_size`` rows of up to ``max_len`` decoder positions."""
        raise NotImplementedError(f"{type(self).__name__} has no decoding cache")

    def new_static_cache(self, batch_size: int, max_len: int, write_index: Tensor, captured: bool) -> Any:
        """``new_cache``'s caches whose one-token steps keep their shapes (``cache_implementation="static"``): every
        layer's keys and values a ``StaticKVCache`` writing at ``write_index`` (1,); ``captured``: its steps are
        captured (a CUDA graph), so buffers keep their addresses from call to call. A ValueError says why not."""
        return static_caches(self.new_cache(batch_size, max_len), write_index, captured)

    def step(self, input_ids: Tensor, layout: StepLayout, cache: Any, **step_inputs: Tensor) -> Tensor:
        """Logits (B, kept rows, V) of ``input_ids`` (B, T) after the cached tokens, laid out by the session."""
        raise NotImplementedError(f"{type(self).__name__} has no step hook")

    def step_problem(self) -> str | None:
        """Why a ``StackSession`` cannot lay out this model's steps, or None (by default: it has no ``step``)."""
        return f"{type(self).__name__} has no step hook"

    def token_positions(self, attend: Tensor) -> Tensor:
        """(B, L) the position of every column of a session's rows, given which are real tokens (B, L) bool."""
        return positions_from_mask(attend)

    def step_layout(self, **fields: Any) -> StepLayout:
        """A step's layout (``StepLayout``'s fields: positions, key positions, padding, the rows kept)."""
        return StepLayout(**fields)

    def cache_bytes_per_token(self, dtype: torch.dtype | None = None) -> int:
        """Bytes of key/value cache one token of one sequence takes: 2 x layers x KV heads x head size (grouped-
        and multi-query models cache only their key/value heads)."""
        config = self.config
        element = torch.empty((), dtype=dtype or next(self.parameters()).dtype).element_size()
        return 2 * config.num_layers * config.num_kv_heads * config.head_dim * element

    def cache_specs(self) -> list[LayerCacheSpec]:
        """What each layer keeps between decoding steps; by default every layer's keys and values, of the config's
        key/value heads (what ``cache_bytes_per_token`` counts)."""
        config = self.config
        return [LayerCacheSpec(FullAttention(config.num_kv_heads, config.head_dim))] * config.num_layers

    def layout_bytes_per_token(self) -> int:
        """Bytes a session's row layout adds per token beside each row's: the rotary table (cos, sin, angles)."""
        rotates = POSITIONAL_SCHEMES[self.config.positional].rotates
        return 3 * self.config.head_dim * 4 if rotates else 0
