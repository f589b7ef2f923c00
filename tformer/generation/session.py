"""The Session protocol: the only thing decoding strategies talk to. A session is opened on a model offering the
generation protocol (``tformer/models/generation_protocol.py``: what it offers, with defaults), and reads
nothing of the model beyond it.

Strategies (greedy, sampling, beam search, speculative, streaming) call four things:
``extend`` runs new tokens after what the session holds and returns their logits,
``truncate`` forgets the last tokens (rejected drafts), ``reorder`` picks and repeats rows
(beams), and ``length`` says how many tokens it holds. They never read a model's attributes.

``ModelSession`` runs any model through ``forward``; reordering moves every row-indexed piece
of state together: the self-attention caches, the cross-attention caches and the step inputs
(encoder output, encoder mask). ``StackSession`` steps through ``step`` instead: the whole row
layout ``(B, max_len)`` is known up front (the prompt's padding, then real tokens only), so each
step's positions and padding are slices of the session's tables, and nothing is checked per step.
A step of ``StackSession`` may hand the model step inputs of fewer rows than ``input_ids`` has: ``g``
rows a source, row ``r`` reading source ``r // g`` (beams sharing their source's encoder output and
cross-attention keys).

``StaticSession`` (``cache_implementation="static"``) is a ``StackSession`` whose one-token steps after the prompt
keep the same shapes and read the same buffers, so that a compiled step is captured once and replayed. Its caches
are ``StaticKVCache``: preallocated for the whole call (they never grow), read whole by each step, the keys not
written yet hidden by the step's mask, which is made inside the step from the session's tables and the step's
column (a (1,) tensor moved on in place, not a Python number a compiled step would be specialised on). On CUDA the
step is compiled once per session shape and captured as a CUDA graph (``torch.compile``'s ``reduce-overhead`` mode,
as gpt-fast and Hugging Face's static cache do): a step is one graph launch instead of hundreds of kernel launches.
On the CPU it runs as it is: the CPU's step is bound by reading the weights, which the eager step does through its
prepacked layouts and compiled kernels. A prompt, or drafts to verify, run as in ``StackSession`` over the same
buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from tformer.generation.settings import GenerationError
from tformer.models.generation_protocol import GenerationProtocol
from tformer.models.output import GenerationState


class Session(Protocol):
    """What a decoding strategy may ask of a model's decoding state."""

    length: int  # tokens held per row

    def extend(self, input_ids: Tensor, last_only: bool = False) -> Tensor:
        """Run ``input_ids`` (B, T) after what the session holds; logits (B, T, V), or (B, 1, V)."""

    def truncate(self, length: int) -> None:
        """Forget every token after the first ``length``."""

    def reorder(self, rows: Tensor, same_source: bool = False) -> None:
        """Keep the rows named by ``rows`` (B',), in that order, repeating as asked. ``same_source``:
        every row is taken from a row with the same source (beams of one sentence), so what is held
        per source (an encoder's output and cross-attention keys) may stay as it is."""


GROWTH_CHUNK = 1024  # new tokens a growing session holds room for at first


def open_session(
    model: GenerationProtocol, input_ids: Tensor, attention_mask: Tensor | None, max_new_tokens: int, *,
    use_cache: bool = True, role: str = "model", grow: bool = False, decoder_prompt: tuple[int, ...] = (),
    cache_implementation: str = "dynamic",
) -> tuple[ModelSession, GenerationState]:
    """Prepare the prompt (``prepare_generation``) and open a session for it and ``max_new_tokens`` more.

    A model whose steps the session can lay out (``step_problem()`` is None) gets a ``StackSession``; any
    other model (or ``use_cache=False``) a ``ModelSession``. With ``grow`` (a run that may end early)
    the session first holds room for ``GROWTH_CHUNK`` new tokens and doubles as needed. ``decoder_prompt``: an
    encoder-decoder's first decoder tokens in place of its start token (``check_call`` refuses it elsewhere).
    ``cache_implementation="static"``: a ``StaticSession`` (preallocated whole, never growing), refused for a model
    a ``StackSession`` cannot step."""
    if decoder_prompt:
        state = model.prepare_generation(input_ids, attention_mask, decoder_prompt=decoder_prompt)
    else:
        state = model.prepare_generation(input_ids, attention_mask)
    batch, prompt_length = state.input_ids.shape
    limit = model.position_limit
    if limit is not None and prompt_length + max_new_tokens > limit:
        raise GenerationError(
            f"prompt ({prompt_length} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
            f"max_seq_len={limit} of this {role}'s {model.config.positional} position table"
        )
    max_len = prompt_length + max_new_tokens
    capacity = min(max_len, prompt_length + GROWTH_CHUNK) if grow else max_len
    problem = model.step_problem() if use_cache else "use_cache=False re-runs the whole sequence at every step"
    if cache_implementation == "static":
        if problem is not None:
            raise GenerationError(f"cache_implementation='static' steps the model's blocks over a fixed layout, "
                                  f"which this {role} cannot take: {problem}")
        capacity = static_capacity(max_len, limit, state.input_ids.device)
        session = StaticSession(model, batch, capacity, state.attention_mask, step_inputs=state.step_inputs)
    elif problem is None:
        session = StackSession(model, batch, max_len, state.attention_mask, step_inputs=state.step_inputs,
                               capacity=capacity)
    else:
        session = ModelSession(model, batch, max_len, state.attention_mask, step_inputs=state.step_inputs,
                               use_cache=use_cache, capacity=capacity)
    return session, state


def session_bytes(model: GenerationProtocol, rows: int, length: int, use_cache: bool = True) -> int:
    """About how many bytes a session of ``rows`` sequences of ``length`` tokens holds: the
    key/value cache (without one, the token buffer) and the row layout (which columns are
    tokens, their positions, the padding mask, the rotary table)."""
    element = next(model.parameters()).element_size()
    per_token = model.cache_bytes_per_token() if use_cache else 8
    layout = rows * (1 + 8 + element)  # attend (bool), positions (int64), additive padding mask
    return length * (rows * per_token + layout + model.layout_bytes_per_token())


class ModelSession:
    """Decoding state of any model offering the generation protocol: ``batch_size`` rows of up to
    ``max_len`` decoder tokens each, stepped through the model's own forward.

    ``attention_mask`` (B, T) marks the real tokens of left-padded prompts (None: no padding);
    ``step_inputs`` go to every forward step (see ``GenerationState``). With ``use_cache=False``
    every step re-runs the whole decoder sequence (the slow reference). ``capacity`` (default
    ``max_len``) is the room held at first; a step beyond it doubles it, up to ``max_len``.
    """

    def __init__(
        self,
        model: GenerationProtocol,
        batch_size: int,
        max_len: int,
        attention_mask: Tensor | None = None,
        *,
        step_inputs: dict[str, Tensor] | None = None,
        use_cache: bool = True,
        capacity: int | None = None,
    ) -> None:
        self.model = model
        self.stepping = model.stepping  # the context every step runs in
        self.batch_size = batch_size
        self.max_len = max_len
        self.capacity = max_len if capacity is None else min(capacity, max_len)
        self.length = 0
        self.step_inputs = dict(step_inputs or {})
        device = next(model.parameters()).device
        self.cache = self._new_cache(batch_size) if use_cache else None
        self.tokens = None if use_cache else torch.zeros(batch_size, self.capacity, dtype=torch.long, device=device)
        # The row layout: which columns are real tokens (the prompt's padding is not).
        self.padded = attention_mask is not None and not bool(attention_mask.bool().all())
        attend = torch.ones(batch_size, self.capacity, dtype=torch.bool, device=device)
        if self.padded:
            attend[:, : attention_mask.shape[1]] = attention_mask.bool()
        self.attend = attend  # (B, capacity) True = a real token

    def _new_cache(self, batch_size: int):
        return self.model.new_cache(batch_size, self.capacity)

    # ---- the protocol ------------------------------------------------------------------------------

    def extend(self, input_ids: Tensor, last_only: bool = False) -> Tensor:
        """Run ``input_ids`` (B, T) after what the session holds; logits (B, T, V), or (B, 1, V)."""
        past, end = self.length, self.length + input_ids.shape[1]
        if end > self.capacity:
            self._grow(end)
        with self.stepping:
            logits = self._step(input_ids, past, end, last_only)
        self.length = end
        return logits[:, -1:] if last_only else logits

    def truncate(self, length: int) -> None:
        """Forget every token after the first ``length`` (speculative decoding's rejected drafts)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a session of {self.length} tokens to {length}")
        if self.cache is not None and not isinstance(self.cache, list):
            raise GenerationError("a recurrent model's state cannot forget tokens (speculative decoding needs a "
                                  "key/value cache)")
        for cache in self._caches():
            cache.length = length
        self.length = length

    @property
    def rewindable(self) -> bool:
        """Whether ``truncate`` can forget tokens: every cache keeps its keys (not a recurrent state or
        Performer's running sums). A sliding window's can until it has forgotten its oldest."""
        if self.cache is None:
            return True
        return isinstance(self.cache, list) and all(getattr(cache, "rewindable", True) for cache in self._caches())

    def reorder(self, rows: Tensor, same_source: bool = False) -> None:
        """Keep the rows named by ``rows`` (B',), in that order, repeating as asked (beam search):
        self- and cross-attention caches, step inputs and the row layout alike; with ``same_source``
        and the batch keeping its size, the cross-attention caches and step inputs (the same for
        every row of a source) are left as they are."""
        keeps_sources = same_source and rows.shape[0] == self.batch_size
        self.batch_size = rows.shape[0]
        for cache in self._caches():
            cache.reorder(rows)
        if self.cache is not None and not isinstance(self.cache, list):
            self.cache.reorder(rows)  # a model's own state (a recurrent one)
        if not keeps_sources:
            self._reorder_sources(rows)
        self.attend = self.attend.index_select(0, rows)
        if self.tokens is not None:
            self.tokens = self.tokens.index_select(0, rows)

    def _reorder_sources(self, rows: Tensor) -> None:
        """What is held per source (cross-attention caches, step inputs) follows the rows: one copy per row."""
        self._pick_sources(rows)

    def _pick_sources(self, sources: Tensor) -> None:
        """Keep the sources named by ``sources`` (in that order, repeating as asked): cross-attention caches
        and step inputs."""
        for layer in self._layers():
            if layer.cross_attention is not None:
                layer.cross_attention.reorder(sources)
        self.step_inputs = {name: value.index_select(0, sources) for name, value in self.step_inputs.items()}

    def _grow(self, end: int) -> None:
        """Room for at least ``end`` tokens: the capacity doubles (at most ``max_len``); what is held is kept."""
        if end > self.max_len:
            raise ValueError(f"decoding session overflow: {end} tokens exceed its length {self.max_len}")
        capacity = min(self.max_len, max(end, 2 * self.capacity))
        for cache in self._caches():
            cache.grow(capacity)
        added = capacity - self.capacity
        if self.tokens is not None:
            self.tokens = torch.cat([self.tokens, self.tokens.new_zeros(self.tokens.shape[0], added)], dim=1)
        self.attend = torch.cat([self.attend, self.attend.new_ones(self.attend.shape[0], added)], dim=1)
        self.capacity = capacity

    # ---- steps ---------------------------------------------------------------------------------------

    def _step(self, input_ids: Tensor, past: int, end: int, last_only: bool) -> Tensor:
        """Logits of ``input_ids`` (B, T) at columns past .. end through the model's own forward."""
        mask = self.attend[:, :end].long() if self.padded else None  # (B, end), or None without padding
        if self.cache is not None:
            return self.model(input_ids, attention_mask=mask, cache=self.cache, **self.step_inputs).logits
        self.tokens[:, past:end] = input_ids
        return self.model(self.tokens[:, :end], attention_mask=mask, **self.step_inputs).logits[:, past:]

    def _layers(self) -> list:
        """The per-block caches (LayerCache), or none: no cache, or a model's own state (a recurrent one)."""
        return self.cache if isinstance(self.cache, list) else []

    def _caches(self) -> list:
        """The self-attention caches, one per block."""
        return [layer.self_attention for layer in self._layers()]


class StackSession(ModelSession):
    """The session of a model with the ``step`` hook (a decoder, an encoder–decoder): each step runs the
    model's own blocks through ``step`` with a layout (``step_layout``) cut from the session's tables (every
    column's true position, which columns are real tokens), made once, so a step builds nothing but
    the slices and checks nothing (``generate`` checked the prompt once)."""

    def __init__(
        self,
        model: GenerationProtocol,
        batch_size: int,
        max_len: int,
        attention_mask: Tensor | None = None,
        *,
        step_inputs: dict[str, Tensor] | None = None,
        capacity: int | None = None,
    ) -> None:
        super().__init__(model, batch_size, max_len, attention_mask, step_inputs=step_inputs, capacity=capacity)
        self.positions = model.token_positions(self.attend)  # (B, capacity) the true position of each column
        # Columns from here on are real tokens in every row (left padding comes first).
        self.real_from = 0 if not self.padded else int(attention_mask.shape[1] - attention_mask.bool().sum(-1).min())
        self.sources, self.group = batch_size, 1  # the step inputs' rows, and the rows that read each

    def _grow(self, end: int) -> None:
        super()._grow(end)
        self.positions = self.model.token_positions(self.attend)

    def reorder(self, rows: Tensor, same_source: bool = False) -> None:
        super().reorder(rows, same_source)
        self.positions = self.positions.index_select(0, rows)

    def _reorder_sources(self, rows: Tensor) -> None:
        """The model's ``step`` lets rows share a source: the beams of one source, kept side by side, read one
        copy of its encoder output and cross-attention keys (``CrossAttentionCache``), ``group`` rows a source.
        Rows that do not come in such groups get a copy each."""
        held, group = self.sources, self.group
        source_of_row = rows // group  # (B',) which held source each new row reads
        self.group = 1
        for size in (group, rows.shape[0] // held):  # beams kept in their groups, or each source repeated
            if size > 1 and rows.shape[0] % size == 0:
                blocks = source_of_row.view(-1, size)
                if bool((blocks == blocks[:, :1]).all()):  # a host sync, once per reorder
                    self.group, source_of_row = size, blocks[:, 0]
                    break
        self.sources = source_of_row.shape[0]
        if self.sources != held or not bool((source_of_row == torch.arange(held, device=rows.device)).all()):
            self._pick_sources(source_of_row)

    def _step(self, input_ids: Tensor, past: int, end: int, last_only: bool) -> Tensor:
        layout = self.model.step_layout(
            positions=self.positions[:, past:end],
            key_positions=self.positions[:, :end],
            key_padding=self.attend[:, :end] if self.padded else None,
            real_queries=past >= self.real_from,
            keep=LAST if last_only and end - past > 1 else None,
        )
        return self.model.step(input_ids, layout, self.cache, **self.step_inputs)


LAST = slice(-1, None)  # a step that wants only the last position's logits


def _capture(step: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``step`` compiled and captured as CUDA graphs, one recorded per shape met. A size that changes from call to
    call is compiled once more as a symbol (PyTorch's automatic dynamic shapes), so that many shapes stay within
    dynamo's recompile limit; a graph break, where a part cannot be traced, leaves that part eager."""
    return torch.compile(step, mode="reduce-overhead")


# device type -> what one-token static steps are wrapped in, once per process (a device absent here runs them as they
# are); the tests put a tracing-only compiler here for the CPU, to check that a step is one graph compiled once
STEP_COMPILERS: dict[str, Callable[[Callable[..., Tensor]], Callable[..., Tensor]]] = {"cuda": _capture}
_WRAPPED_STEPS: dict[tuple[str, Callable], Callable[..., Tensor]] = {}  # (device type, compiler) -> the wrapped step
# A compiled session holds a multiple of this many positions, so that calls whose prompt and max_new_tokens differ
# a little share one captured step (a longer cache costs a GPU step next to nothing: its keys are read in parallel)
CAPTURED_LENGTH_MULTIPLE = 256


def static_step(model: GenerationProtocol, cache: list, column: Tensor, input_ids: Tensor, attend: Tensor,
                positions: Tensor, real_queries: bool, step_inputs: dict[str, Tensor]) -> Tensor:
    """One token a row at ``column`` (1,) over static caches: the mask and the position from the session's tables
    (B, capacity), then the model's step; logits (B, 1, V). What is compiled and captured."""
    columns = torch.arange(attend.shape[1], device=attend.device)
    key_padding = attend & (columns <= column)  # (B, capacity): the keys written so far and this step's
    layout = model.step_layout(positions=positions.index_select(1, column), key_positions=positions,
                               key_padding=key_padding, real_queries=real_queries)
    return model.step(input_ids, layout, cache, **step_inputs)


def wrapped_static_step(device: torch.device) -> Callable[..., Tensor] | None:
    """``static_step`` as ``STEP_COMPILERS`` wraps it for ``device`` (made once, so that dynamo's cache of compiled
    graphs serves every call), or None where it runs as it is."""
    compiler = STEP_COMPILERS.get(device.type)
    if compiler is None:
        return None
    key = (device.type, compiler)
    if key not in _WRAPPED_STEPS:
        _WRAPPED_STEPS[key] = compiler(static_step)
    return _WRAPPED_STEPS[key]


def static_capacity(max_len: int, position_limit: int | None, device: torch.device) -> int:
    """The positions a static session holds: ``max_len``, or where its steps are compiled, ``max_len`` rounded up
    to a multiple of ``CAPTURED_LENGTH_MULTIPLE`` within the model's position table."""
    if device.type not in STEP_COMPILERS:
        return max_len
    rounded = rounded_up(max_len, CAPTURED_LENGTH_MULTIPLE)
    return max(max_len, rounded if position_limit is None else min(rounded, position_limit))


def rounded_up(value: int, multiple: int) -> int:
    """The least multiple of ``multiple`` that is at least ``value``: a captured step's length bucket."""
    return -(-value // multiple) * multiple


class StaticSession(StackSession):
    """A ``StackSession`` whose one-token steps keep their shapes: see the module's docstring. It holds ``max_len``
    positions from the start (a static cache never grows)."""

    _whole = False  # whether the caches are read whole (one-token steps) or as StackSession reads them

    def _new_cache(self, batch_size: int):
        device = next(self.model.parameters()).device
        self._compiled = wrapped_static_step(device)  # a captured step's output is overwritten by the next replay
        self.write_index = torch.zeros(1, dtype=torch.long, device=device)  # the column of the step's token
        try:
            return self.model.new_static_cache(batch_size, self.capacity, self.write_index, self._compiled is not None)
        except ValueError as error:
            raise GenerationError(str(error)) from None

    def _step(self, input_ids: Tensor, past: int, end: int, last_only: bool) -> Tensor:
        """A one-token step after the prompt through ``static_step``; anything else as ``StackSession``'s."""
        whole = end - past == 1 and past > 0
        if whole != self._whole:
            for cache in self._caches():
                cache.whole = whole
            self._whole = whole
        if not whole:
            return super()._step(input_ids, past, end, last_only)
        self.write_index.fill_(past)
        arguments = (self.model, self.cache, self.write_index, input_ids, self.attend, self.positions,
                     past >= self.real_from, self.step_inputs)
        if self._compiled is None:
            logits = static_step(*arguments)
        else:
            torch.compiler.cudagraph_mark_step_begin()
            logits = self._compiled(*arguments).clone()
        for cache in self._caches():
            cache.length = end
        return logits
