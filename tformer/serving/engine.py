"""Continuous batching: one loop that, at every step, admits waiting requests into the running
batch (their prompts prefilled in the same step as the others decode), samples one token for every
running sequence, and removes finished sequences at once, their cache blocks back in the pool.

A step runs the model's own blocks (its ``step`` hook) over every running sequence's new tokens at
once, their keys and values in a paged pool (``nn.attention.paged``), on the model's device.

Requests are submitted and cancelled from any thread; ``step`` runs on one (the engine process's
loop, ``engine_process``; the server's engine thread with ``--engine thread``; the caller's in
``Engine.complete``). Each request carries a ``GenerationConfig`` (the
options of ``tformer.generate``), chosen from by the same ``TokenChooser`` and read as text by the same
``IncrementalDetokenizer``, so a request alone decodes what ``generate`` would: greedy tokens
identically, and seeded sampling with the same draws. Every field of ``GenerationConfig`` is either
honoured or refused away from its default (``GENERATION_FIELDS``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from tformer.generation.detokenize import IncrementalDetokenizer
from tformer.generation.sampling import TokenChooser
from tformer.generation.session import cache_bytes_per_token, stack_session_problem
from tformer.generation.settings import GenerationConfig, GenerationError, check_call, check_model
from tformer.memory import available_memory, format_bytes
from tformer.nn.attention.paged import BlockPool, BlockTable, PagedCache, PagedLayout, blocks_for
from tformer.nn.block import LayerCache
from tformer.nn.weights import decoding_step

FINISH_REASONS = ("stop", "length", "cancelled", "timeout")
HONOURED = None
# Every GenerationConfig field: None where the engine honours it as ``generate`` does, else why it refuses
# a value other than the default (with a GenerationError naming the field). A field added to
# GenerationConfig must be entered here (a test enumerates the dataclass), so none is silently dropped.
GENERATION_FIELDS: dict[str, str | None] = {
    "max_new_tokens": HONOURED, "min_new_tokens": HONOURED, "forced_eos_token_id": HONOURED,
    "do_sample": HONOURED, "temperature": HONOURED, "top_k": HONOURED, "top_p": HONOURED, "seed": HONOURED,
    "eos_token_id": HONOURED, "stop_strings": HONOURED,
    "pad_token_id": "a sequence that ends is not padded: the server returns each one as it is",
    "num_beams": "the server decodes one token at a time per sequence (no beam search)",
    "length_penalty": "it is beam search's, and the server does no beam search",
    "early_stopping": "it is beam search's, and the server does no beam search",
    "num_return_sequences": "ask for n sequences instead",
    "num_draft_tokens": "the server decodes without a draft model",
    "output_scores": "ask for logprobs instead",
    "return_dict": "the server answers in its own format",
    "use_cache": "the server always decodes over its cache",
    "suppress_tokens": HONOURED, "begin_suppress_tokens": HONOURED,  # the TokenChooser's, as generate's
    "decoder_prompt_ids": "the server decodes decoder-only models, whose prompt is the request's",
}


@dataclass
class TokenEvent:
    """What one step produced for one sequence: its new token and the text it completes."""

    request: Request | None  # None in the copy that leaves the engine (``engine_client.detached``)
    index: int  # which of the request's ``n`` sequences
    token_id: int
    text: str  # new text (held back while it may be the start of a stop string or a character)
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    finish_reason: str | None = None  # set on the sequence's last event


@dataclass
class _Sequence:
    """One of a request's sequences while it decodes."""

    index: int
    generator: torch.Generator | None
    detokenizer: IncrementalDetokenizer | None  # its text (None: the engine has no tokenizer)
    table: BlockTable | None = None
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def text(self) -> str:
        return "" if self.detokenizer is None else self.detokenizer.text


class Request:
    """One submitted prompt and its ``n`` sequences; ``on_event`` (called on the engine's thread)
    receives every ``TokenEvent``; ``done`` is set when every sequence has finished."""

    def __init__(self, request_id: int, prompt_ids: list[int], config: GenerationConfig, n: int, chooser: TokenChooser,
                 end_ids: frozenset[int], on_event: Callable[[TokenEvent], None] | None, logprobs: int | None,
                 blocks_needed: int, device: torch.device, tokenizer=None) -> None:
        self.id = request_id
        self.prompt_ids = prompt_ids
        self.config = config
        self.chooser = chooser
        self.end_ids = end_ids
        self.on_event = on_event
        self.logprobs = logprobs
        self.blocks_needed = blocks_needed  # per sequence: prompt + longest answer
        self.submitted = time.monotonic()
        self.first_token_at: float | None = None
        self.sequences = [
            _Sequence(index, _generator(config.seed, index, device),
                      None if tokenizer is None else IncrementalDetokenizer(tokenizer, config.stop_strings))
            for index in range(n)
        ]
        self.done = threading.Event()

    @property
    def finished(self) -> bool:
        return all(sequence.finish_reason is not None for sequence in self.sequences)

    def outputs(self) -> list[list[int]]:
        """Each sequence's new token ids."""
        return [list(sequence.output_ids) for sequence in self.sequences]

    def texts(self) -> list[str]:
        return [sequence.text for sequence in self.sequences]

    def finish_reasons(self) -> list[str | None]:
        return [sequence.finish_reason for sequence in self.sequences]


def _generator(seed: int | None, index: int, device: torch.device) -> torch.Generator | None:
    """A request's draws on the model's device: ``seed`` for its first sequence (as ``generate`` would),
    ``seed + index`` after."""
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed((seed + index) % 2**64)


@dataclass
class EngineStats:
    """Counters for /metrics."""

    requests_submitted: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_timed_out: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    steps: int = 0


class Engine:
    """Continuous batching over a paged key/value cache for one decoder model, on its device.

    ``cache_tokens``: the pool's size in tokens (rounded up to whole blocks of ``block_size``);
    ``max_running``: sequences decoding at once; ``max_step_tokens``: new tokens per step (prompts
    beyond it wait for the next step; a prompt longer than it runs alone); ``queue_timeout``:
    seconds a request may wait for room before it finishes with reason ``timeout`` (None: forever).
    """

    def __init__(self, model: nn.Module, tokenizer=None, *, cache_tokens: int = 16384, block_size: int = 16,
                 max_running: int = 64, max_step_tokens: int = 4096, queue_timeout: float | None = None) -> None:
        check_model(model)
        for name, value in (("cache_tokens", cache_tokens), ("block_size", block_size), ("max_running", max_running),
                            ("max_step_tokens", max_step_tokens)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise GenerationError(f"{name}={value!r} must be an integer >= 1")
        reason = serving_problem(model)
        if reason is not None:
            raise GenerationError(f"the server cannot decode this model: {reason}")
        self.model = model.eval()
        if callable(getattr(model, "prepare_for_decoding", None)):
            model.prepare_for_decoding()
        self.tokenizer = tokenizer
        parameter = next(model.parameters())
        self.device = parameter.device
        config = model.config
        num_blocks = blocks_for(cache_tokens, block_size)
        _check_pool_fits(cache_tokens, num_blocks * block_size, cache_bytes_per_token(model, parameter.dtype),
                         self.device)
        try:
            self.pool = BlockPool(num_blocks, block_size, config.num_layers, config.num_kv_heads, config.head_dim,
                                  parameter.dtype, self.device)
        except (RuntimeError, MemoryError) as error:  # the estimate passed, the allocation did not
            raise GenerationError(f"cache_tokens={cache_tokens}: the key/value cache could not be allocated on "
                                  f"{self.device.type} ({str(error).splitlines()[0]})") from None
        self.caches = [LayerCache(PagedCache(self.pool, layer)) for layer in range(config.num_layers)]
        self.max_running = max_running
        self.max_step_tokens = max_step_tokens
        self.queue_timeout = queue_timeout
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._waiting: deque[Request] = deque()
        self._cancelled: set[int] = set()
        self._running: list[tuple[Request, _Sequence]] = []
        self._pending: dict[int, int] = {}  # id(sequence) -> its last token, not yet in the cache
        self.admitting = True

    # ---- from any thread --------------------------------------------------------------------------

    def submit(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None, *, n: int = 1,
               logprobs: int | None = None, on_event: Callable[[TokenEvent], None] | None = None) -> Request:
        """Queue ``prompt_ids`` for ``n`` sequences decoded with ``config``; a GenerationError when it can
        never run (bad ids, past the position table, more cache than the pool holds, beam search...)."""
        config = config or GenerationConfig()
        request = self._make_request(list(prompt_ids), config, n, logprobs, on_event)
        with self._work:
            if not self.admitting:
                raise GenerationError("the server is shutting down and admits no new requests")
            self._waiting.append(request)
            self.stats.requests_submitted += 1
            self._work.notify_all()
        return request

    def cancel(self, request_id: int) -> None:
        """Stop the request of ``request_id`` (a client went away): its sequences finish with reason
        ``cancelled`` at the next step and their blocks return to the pool."""
        with self._work:
            self._cancelled.add(request_id)
            self._work.notify_all()

    def stop_admitting(self) -> None:
        with self._work:
            self.admitting = False

    def wait_for_work(self, timeout: float | None = None) -> bool:
        """Block until something is waiting, running or cancelled (or ``timeout``); whether there is."""
        with self._work:
            return self._work.wait_for(self.has_work, timeout)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running or self._cancelled)

    def cancel_all(self) -> None:
        """Cancel every waiting and running request (the server is stopping)."""
        with self._work:
            self._cancelled.update(request.id for request in self._waiting)
            self._cancelled.update(request.id for request, _ in self._running)
            self._work.notify_all()

    @property
    def queue_length(self) -> int:
        return len(self._waiting)

    @property
    def tokens_stored(self) -> int:
        """Tokens whose keys and values the pool holds now."""
        return sum(sequence.table.length for _, sequence in list(self._running) if sequence.table is not None)

    @property
    def running(self) -> int:
        return len(self._running)

    # ---- the loop ---------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> int:
        """One scheduling step: cancel, admit, run every sequence one token further. New tokens made."""
        self._apply_cancellations()
        admitted = self._admit()
        self._expire_waiting()
        if not self._running:
            return 0
        tables, counts, input_ids = [], [], []
        for request, sequence in self._running:
            tokens = request.prompt_ids if id(sequence) in admitted else [self._pending[id(sequence)]]
            sequence.table.append_slots(len(tokens))
            tables.append(sequence.table)
            counts.append(len(tokens))
            input_ids.extend(tokens)
        layout = PagedLayout.build(tables, counts, self.device)
        ids = torch.tensor([input_ids], device=self.device)  # (1, N): every new token, one sequence after another
        with decoding_step:
            logits = self.model.step(ids, layout, self.caches)[0]  # (S, V) each sequence's last token
        self.stats.steps += 1
        self._sample(logits)
        return len(tables)

    def complete(self, prompts: Sequence[Sequence[int]], config: GenerationConfig | None = None,
                 n: int = 1) -> list[Request]:
        """Submit every prompt, run until all are done (on this thread), return the requests in order."""
        requests = [self.submit(prompt, config, n=n) for prompt in prompts]
        self.run_until_idle()
        return requests

    def run_until_idle(self) -> None:
        """Step (on this thread) until nothing waits or runs; a RuntimeError if requests wait with nothing
        running, since no step could ever admit them (blocks leaked or promised to no one)."""
        while self.has_work():
            if self.step() == 0 and not self._running and self._waiting:
                raise RuntimeError(f"{len(self._waiting)} request(s) wait for cache blocks with nothing running: "
                                   f"{self.pool.blocks_in_use} blocks in use, {self.pool.reserved} reserved")

    # ---- inside a step ----------------------------------------------------------------------------

    def _apply_cancellations(self) -> None:
        with self._work:
            cancelled, self._cancelled = self._cancelled, set()
            waiting = list(self._waiting)
            self._waiting = deque(r for r in waiting if r.id not in cancelled)
        for request in waiting:
            if request.id in cancelled:
                self._finish_unstarted(request, "cancelled")
        for request, sequence in list(self._running):
            if request.id in cancelled:
                self._finish(request, sequence, "cancelled")

    def _expire_waiting(self) -> None:
        """Requests still waiting for room after ``queue_timeout`` seconds finish with reason ``timeout``."""
        if self.queue_timeout is None:
            return
        now = time.monotonic()
        with self._work:
            expired = [r for r in self._waiting if now - r.submitted > self.queue_timeout]
            self._waiting = deque(r for r in self._waiting if r not in expired)
        for request in expired:
            self._finish_unstarted(request, "timeout")

    def _admit(self) -> set[int]:
        """Move waiting requests (first come, first served) into the running batch while the pool
        can promise their blocks, the batch has room and the step's token budget lasts."""
        admitted: set[int] = set()  # id() of the sequences admitted now
        budget = self.max_step_tokens - len(self._running)
        with self._work:
            while self._waiting:
                request = self._waiting[0]
                n = len(request.sequences)
                tokens = n * len(request.prompt_ids)
                if len(self._running) + n > self.max_running:
                    break
                if tokens > budget and (admitted or self._running):
                    break
                if not self.pool.reserve(n * request.blocks_needed):
                    break
                self._waiting.popleft()
                budget -= tokens
                for sequence in request.sequences:
                    sequence.table = BlockTable(self.pool, request.blocks_needed)
                    self._running.append((request, sequence))
                    admitted.add(id(sequence))
                self.stats.prompt_tokens += len(request.prompt_ids)
        return admitted

    def _sample(self, logits: Tensor) -> None:
        """Choose each running sequence's next token from its row of ``logits`` (S, V) and hand it out: one
        argmax over the rows whose choice is the plain argmax, the chooser row by row for the others."""
        running = list(self._running)
        plain = [row for row, (request, sequence) in enumerate(running)
                 if not request.chooser.alters(len(sequence.output_ids))]
        tokens: dict[int, int] = {}
        if plain:
            rows = torch.tensor(plain, device=logits.device)
            tokens = dict(zip(plain, logits.index_select(0, rows).argmax(-1).tolist(), strict=True))
        for row, (request, sequence) in enumerate(running):
            if row not in tokens:
                chooser = request.chooser
                scores = chooser.scores(logits[row : row + 1], len(sequence.output_ids))
                tokens[row] = int(chooser.choose(scores, sequence.generator))
            self._accept(request, sequence, tokens[row], logits[row] if request.logprobs is not None else None)

    def _accept(self, request: Request, sequence: _Sequence, token: int, logits: Tensor | None) -> None:
        """Record ``token`` for ``sequence``: its text, its end (end id, stop string, length), its event."""
        if request.first_token_at is None:
            request.first_token_at = time.monotonic()
        sequence.output_ids.append(token)
        self.stats.generated_tokens += 1
        ended = token in request.end_ids  # the end token is kept in the ids, not in the text
        detokenizer = sequence.detokenizer
        text = "" if detokenizer is None or ended else detokenizer.add([token])
        finish = "stop" if ended or (detokenizer is not None and detokenizer.stopped) else None
        if finish is None and len(sequence.output_ids) >= request.config.max_new_tokens:
            finish = "length"
        if finish is not None and detokenizer is not None:
            text += detokenizer.finish()
        logprob = top = None
        if logits is not None:
            logprob, top = _logprobs(logits, token, request.logprobs)
        self._pending[id(sequence)] = token
        event = TokenEvent(request, sequence.index, token, text, logprob, top, finish)
        if finish is not None:
            self._finish(request, sequence, finish, emit=False)
        self._emit(event)
        if request.finished:
            self._close(request)

    def _finish(self, request: Request, sequence: _Sequence, reason: str, emit: bool = True) -> None:
        """End ``sequence``: its blocks back to the pool, out of the running batch."""
        sequence.finish_reason = reason
        if sequence.table is not None:
            sequence.table.release()
        self._running = [(r, s) for r, s in self._running if s is not sequence]
        self._pending.pop(id(sequence), None)
        if emit:
            self._emit(TokenEvent(request, sequence.index, -1, "", finish_reason=reason))
            if request.finished:
                self._close(request)

    def _finish_unstarted(self, request: Request, reason: str) -> None:
        for sequence in request.sequences:
            sequence.finish_reason = reason
            self._emit(TokenEvent(request, sequence.index, -1, "", finish_reason=reason))
        self._close(request)

    def _close(self, request: Request) -> None:
        if request.done.is_set():
            return
        reasons = request.finish_reasons()
        if "cancelled" in reasons:
            self.stats.requests_cancelled += 1
        elif "timeout" in reasons:
            self.stats.requests_timed_out += 1
        else:
            self.stats.requests_finished += 1
        request.done.set()

    @staticmethod
    def _emit(event: TokenEvent) -> None:
        if event.request.on_event is not None:
            event.request.on_event(event)

    # ---- requests ---------------------------------------------------------------------------------

    def _make_request(self, prompt_ids: list[int], config: GenerationConfig, n: int, logprobs: int | None,
                      on_event) -> Request:
        model = self.model
        if not prompt_ids:
            raise GenerationError("the prompt has no tokens")
        vocab = model.config.vocab_size
        bad = [token for token in prompt_ids if not isinstance(token, int) or not 0 <= token < vocab]
        if bad:
            raise GenerationError(f"token id {bad[0]!r} in the prompt is outside the vocabulary [0, {vocab})")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise GenerationError(f"n={n!r} must be an integer >= 1")
        if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool)
                                     or not 0 <= logprobs <= vocab):
            raise GenerationError(f"logprobs={logprobs!r} must be an integer in [0, {vocab}]")
        refuse_unhonoured(config)
        if config.max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens={config.max_new_tokens} must be >= 1 on the server")
        check_call(config, model, torch.tensor([prompt_ids]), None, self.tokenizer, streaming=False)
        length = len(prompt_ids) + config.max_new_tokens
        limit = model.position_limit
        if limit is not None and length > limit:
            raise GenerationError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({config.max_new_tokens}) "
                                  f"exceeds the model's context of {limit} positions")
        blocks = blocks_for(length, self.pool.block_size)
        if n * blocks > self.pool.num_blocks:
            raise GenerationError(
                f"{n} x ({len(prompt_ids)} prompt + {config.max_new_tokens} new) tokens need {n * blocks} cache "
                f"blocks; the pool holds {self.pool.num_blocks} of {self.pool.block_size} tokens (raise cache_tokens)")
        chooser = TokenChooser.from_config(config, model.config, self.device)
        return Request(next(self._ids), prompt_ids, config, n, chooser, frozenset(config.end_ids(model.config)),
                       on_event, logprobs, blocks, self.device, self.tokenizer)


def serving_problem(model: nn.Module) -> str | None:
    """Why the engine cannot decode ``model``, or None: it steps a decoder-only model's own blocks (the
    ``step`` hook) over a paged layout, which must know every switch of its config (fail closed)."""
    if getattr(model, "encodes_prompt", False):
        return "it encodes a source (an encoder-decoder); the server continues prompts with a decoder"
    return stack_session_problem(model)


def _check_pool_fits(cache_tokens: int, slots: int, per_token: int, device: torch.device) -> None:
    """A GenerationError naming the memory ``cache_tokens`` would take and the most that fits, before the pool
    is allocated (an allocation that large fails with a traceback, or the kernel ends the process)."""
    available = available_memory(device)
    if available is not None and slots * per_token > available:
        raise GenerationError(f"cache_tokens={cache_tokens} needs {format_bytes(slots * per_token)} of key/value "
                              f"cache ({per_token} bytes a token); {format_bytes(available)} is available on "
                              f"{device.type}: cache_tokens must be in [1, {available // per_token}]")


def refuse_unhonoured(config: GenerationConfig) -> None:
    """A GenerationError naming the first field of ``config`` the engine does not honour set away from its
    default (``GENERATION_FIELDS``)."""
    defaults = GenerationConfig()
    for name, reason in GENERATION_FIELDS.items():
        if reason is not None and getattr(config, name) != getattr(defaults, name):
            raise GenerationError(f"{name}={getattr(config, name)!r} is not supported by the server: {reason}")


def _logprobs(logits: Tensor, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """The chosen token's log-probability under the model (before any sampling filter) and the ``top`` best."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    best = torch.topk(logprobs, top) if top else None
    pairs = list(zip(best.indices.tolist(), best.values.tolist(), strict=True)) if best is not None else []
    return float(logprobs[token]), pairs
