"""Continuous batching: one loop that, at every step, admits waiting requests into the running
batch (their prompts prefilled in the same step as the others decode), samples one token for every
running sequence, and removes finished sequences at once, their cache blocks back in the pool.

A step runs the model's own blocks (its ``step`` hook) over every running sequence's new tokens at
once, their keys and values in a paged pool (``nn.attention.paged``), on the model's device.

Prefix caching (on by default): a prompt whose first full blocks were computed before (a shared system
prompt) starts from those blocks and prefills only the rest; a request's ``n`` sequences prefill the
prompt once, the others share its full blocks and copy its part-filled last one, and each samples its
first token from the same logits with its own generator.

Requests are submitted and cancelled from any thread; ``step`` runs on one (the engine process's
loop, ``engine_process``; the server's engine thread with ``--engine thread``; the caller's in
``Engine.complete``). Each request carries a ``GenerationConfig`` (the
options of ``tformer.generate``), chosen from by the same ``TokenChooser`` and read as text by the same
``IncrementalDetokenizer``, so a request alone decodes what ``generate`` would: greedy tokens
identically, and seeded sampling with the same draws. Every field of ``GenerationConfig`` is either
honoured or refused away from its default (``GENERATION_FIELDS``).

A request may also ask for its prompt's log-probabilities (``prompt_logprobs=k``, what evaluation clients
score continuations with): its prefill then keeps the logits of every prompt row, and only each prompt
token's log-probability and the ``k`` best leave the engine, on the sequence's first event. With
``max_new_tokens=0`` it finishes after its prefill (reason "length") without sampling.
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

from tformer.generation.defaults import MODEL_FIELDS, with_model_defaults
from tformer.generation.detokenize import IncrementalDetokenizer
from tformer.generation.sampling import TokenChooser
from tformer.generation.session import cache_bytes_per_token, stack_session_problem
from tformer.generation.settings import GenerationConfig, GenerationError, check_call, check_model
from tformer.memory import available_memory, format_bytes
from tformer.nn.attention.paged import BlockPool, BlockTable, PagedCache, PagedLayout, blocks_for, prefix_keys
from tformer.nn.attention.paged_kernel import PagedKernelError, resolve
from tformer.nn.block import LayerCache
from tformer.nn.weights import decoding_step

FINISH_REASONS = ("stop", "length", "cancelled", "timeout")
HONOURED = None
# Every GenerationConfig field: None where the engine honours it as ``generate`` does, else why it refuses
# a value other than the default (with a GenerationError naming the field). A field added to
# GenerationConfig must be entered here (a test enumerates the dataclass), so none is silently dropped.
GENERATION_FIELDS: dict[str, str | None] = {
    "max_new_tokens": HONOURED, "max_length": HONOURED,
    "min_new_tokens": HONOURED, "forced_eos_token_id": HONOURED,
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


SERVED_MODEL_FIELDS = tuple(name for name in MODEL_FIELDS if name != "pad_token_id")  # ended sequences: unpadded
PROMPT_ROWS_AT_ONCE = 256  # prompt rows turned into float32 log-probabilities at a time (bounds the copy)


@dataclass
class PromptLogprobs:
    """A prompt scored by the model: for each prompt token after the first, its log-probability given the
    tokens before it, and the ``k`` most likely tokens there (id, log-probability), best first."""

    token_logprobs: list[float]  # (T - 1,) prompt tokens 1 .. T-1
    top_logprobs: list[list[tuple[int, float]]]  # (T - 1, k)


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
    prompt_logprobs: PromptLogprobs | None = None  # on the sequence's first event, when the request asked


@dataclass
class _Sequence:
    """One of a request's sequences while it decodes."""

    index: int
    generator: torch.Generator | None
    detokenizer: IncrementalDetokenizer | None  # its text (None: the engine has no tokenizer)
    table: BlockTable | None = None
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_logprobs: PromptLogprobs | None = None  # scored, not yet handed out on an event

    def take_prompt_logprobs(self) -> PromptLogprobs | None:
        """The prompt's scores for this sequence's next event, once."""
        scores, self.prompt_logprobs = self.prompt_logprobs, None
        return scores

    @property
    def text(self) -> str:
        return "" if self.detokenizer is None else self.detokenizer.text


class Request:
    """One submitted prompt and its ``n`` sequences; ``on_event`` (called on the engine's thread)
    receives every ``TokenEvent``; ``done`` is set when every sequence has finished."""

    def __init__(self, request_id: int, prompt_ids: list[int], config: GenerationConfig, n: int, chooser: TokenChooser,
                 end_ids: frozenset[int], on_event: Callable[[TokenEvent], None] | None, logprobs: int | None,
                 blocks_needed: int, device: torch.device, tokenizer=None, prompt_logprobs: int | None = None,
                 block_keys: list[bytes] | None = None) -> None:
        self.id = request_id
        self.prompt_ids = prompt_ids
        self.config = config
        self.chooser = chooser
        self.end_ids = end_ids
        self.on_event = on_event
        self.logprobs = logprobs
        self.prompt_logprobs = prompt_logprobs  # k best alternatives for each prompt token; None: not scored
        self.blocks_needed = blocks_needed  # per sequence: prompt + longest answer
        self.block_keys = block_keys  # the content keys of the prompt's full blocks; None: no prefix caching
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
    prompt_tokens: int = 0  # of admitted requests, once per request
    prompt_tokens_computed: int = 0  # prompt tokens the model ran, every sequence's
    prefix_cache_hit_tokens: int = 0  # prompt tokens whose keys and values were found in the prefix cache
    generated_tokens: int = 0
    steps: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """The share of admitted prompt tokens served from the prefix cache (0 before any)."""
        return self.prefix_cache_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Engine:
    """Continuous batching over a paged key/value cache for one decoder model, on its device.

    ``cache_tokens``: the pool's size in tokens (rounded up to whole blocks of ``block_size``);
    ``max_running``: sequences decoding at once; ``max_step_tokens``: new tokens per step (prompts
    beyond it wait for the next step; a prompt longer than it runs alone); ``queue_timeout``:
    seconds a request may wait for room before it finishes with reason ``timeout`` (None: forever);
    ``paged_attention``: how decode steps read the pool, "auto", "in-place" or "gather"
    (``nn.attention.paged_kernel``; ``paged_attention_note`` says which it chose and why);
    ``prefix_caching``: prompts reuse the cached blocks of a prefix computed before, and a request's ``n``
    sequences share its prompt's blocks (False: every sequence computes its whole prompt).
    """

    def __init__(self, model: nn.Module, tokenizer=None, *, cache_tokens: int = 16384, block_size: int = 16,
                 max_running: int = 64, max_step_tokens: int = 4096, queue_timeout: float | None = None,
                 paged_attention: str = "auto", prefix_caching: bool = True) -> None:
        check_model(model)
        for name, value in (("cache_tokens", cache_tokens), ("block_size", block_size), ("max_running", max_running),
                            ("max_step_tokens", max_step_tokens)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise GenerationError(f"{name}={value!r} must be an integer >= 1")
        if not isinstance(prefix_caching, bool):
            raise GenerationError(f"prefix_caching={prefix_caching!r} must be True or False")
        reason = serving_problem(model)
        if reason is not None:
            raise GenerationError(f"the server cannot decode this model: {reason}")
        try:
            self.in_place, self.paged_attention_note = resolve(paged_attention, model)
        except PagedKernelError as error:
            raise GenerationError(str(error)) from None
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
        self.prefix_caching = prefix_caching
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
               logprobs: int | None = None, prompt_logprobs: int | None = None,
               on_event: Callable[[TokenEvent], None] | None = None) -> Request:
        """Queue ``prompt_ids`` for ``n`` sequences decoded with ``config``; a GenerationError when it can
        never run (bad ids, past the position table, more cache than the pool holds, beam search...).
        ``logprobs=k``: each new token's log-probability and the k best; ``prompt_logprobs=k``: the same for
        the prompt's tokens (``PromptLogprobs`` on each sequence's first event)."""
        config = serving_defaults(self.model, config).for_prompt(len(prompt_ids))
        request = self._make_request(list(prompt_ids), config, n, logprobs, prompt_logprobs, on_event)
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
        if not isinstance(request_id, int):  # a Request given for its id would cancel nothing, silently
            raise TypeError(f"cancel takes a request's id (Request.id), not {type(request_id).__name__}")
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
        """Tokens whose keys and values the running sequences' blocks hold now, a shared block once."""
        size = self.pool.block_size
        held: dict[int, int] = {}  # block -> tokens it holds
        for _, sequence in list(self._running):
            table = sequence.table
            if table is not None:
                length = table.length
                for index, block in enumerate(list(table.blocks)):
                    held[block] = max(0, min(size, length - index * size))
        return sum(held.values())

    @property
    def running(self) -> int:
        return len(self._running)

    # ---- the loop ---------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> int:
        """One scheduling step: cancel, admit, run every sequence one token further. New tokens made."""
        self._apply_cancellations()
        admitted, forking = self._admit()
        self._expire_waiting()
        if not self._running:
            return 0
        tables, counts, input_ids, scored, rows = [], [], [], [], {}
        for row, (request, sequence) in enumerate(self._running):
            prefill = id(sequence) in admitted
            # a prompt runs from the end of the prefix its table starts with (blocks found in the cache)
            tokens = request.prompt_ids[sequence.table.length:] if prefill else [self._pending[id(sequence)]]
            sequence.table.append_slots(len(tokens))
            tables.append(sequence.table)
            counts.append(len(tokens))
            input_ids.extend(tokens)
            rows[id(sequence)] = row
            # One sequence of a request is enough to score its prompt (the first: it prefills).
            scored.append(prefill and request.prompt_logprobs is not None and sequence.index == 0)
        layout = PagedLayout.build(tables, counts, self.device, every_row=scored if any(scored) else None,
                                   in_place=self.in_place)
        ids = torch.tensor([input_ids], device=self.device)  # (1, N): every new token, one sequence after another
        with decoding_step:
            logits = self.model.step(ids, layout, self.caches)[0]  # (K, V) the rows layout.keep names
        self.stats.steps += 1
        if any(scored):
            logits = self._score_prompts(logits, counts, scored)
        self._register_prompts(admitted)
        self._fork(forking, rows)
        self._sample(logits, rows)
        return len(rows)

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

    def _admit(self) -> tuple[set[int], list[Request]]:
        """Move waiting requests (first come, first served) into the running batch while the pool
        can promise their blocks, the batch has room and the step's token budget lasts. Returns the
        id() of the sequences admitted now (they prefill) and the requests whose first sequence alone
        prefills, the others to be forked from it after the step (``_fork``)."""
        admitted: set[int] = set()
        forking: list[Request] = []
        budget = self.max_step_tokens - len(self._running)
        size = self.pool.block_size
        running = len(self._running)  # sequences in the batch once the ones admitted so far are forked
        with self._work:
            while self._waiting:
                request = self._waiting[0]
                n, length = len(request.sequences), len(request.prompt_ids)
                if running + n > self.max_running:
                    break
                # The cached prefix leaves at least the prompt's last token to compute (the step needs its
                # logits); a prompt to score is computed whole (every row's logits).
                found = [] if request.block_keys is None or request.prompt_logprobs is not None else \
                    self.pool.lookup(request.block_keys[: (length - 1) // size])
                shares = request.block_keys is not None and n > 1  # the others fork from the first sequence
                tokens = length - len(found) * size + (0 if shares else (n - 1) * length)
                if tokens > budget and (admitted or self._running):
                    break
                first_blocks = request.blocks_needed - len(found)
                other_blocks = request.blocks_needed - (length // size if shares else 0)
                if not self.pool.reserve(first_blocks + (n - 1) * other_blocks, shared=found):
                    break
                self._waiting.popleft()
                budget -= tokens
                running += n
                first, *others = request.sequences
                first.table = BlockTable(self.pool, first_blocks, shared=found)
                if shares:
                    forking.append(request)
                    others = []
                for sequence in others:  # without prefix caching each computes the prompt (nothing found)
                    sequence.table = BlockTable(self.pool, other_blocks)
                for sequence in [first, *others]:
                    self._running.append((request, sequence))
                    admitted.add(id(sequence))
                self.stats.prompt_tokens += length
                self.stats.prompt_tokens_computed += tokens
                self.stats.prefix_cache_hit_tokens += len(found) * size
        return admitted, forking

    def _register_prompts(self, admitted: set[int]) -> None:
        """Name the full prompt blocks the step just computed, so later prompts with the same prefix find them."""
        for request, sequence in self._running:
            if id(sequence) in admitted and request.block_keys is not None:
                full = len(request.block_keys)  # the table's blocks past them hold the prompt's part-filled end
                for block, key in zip(sequence.table.blocks[:full], request.block_keys, strict=True):
                    self.pool.register(block, key)

    def _fork(self, forking: list[Request], rows: dict[int, int]) -> None:
        """The other sequences of each request in ``forking`` join the batch after its first, which the step
        just prefilled: its full blocks shared, its last block copied, its logits row theirs too."""
        if not forking:
            return
        forked = {request.id for request in forking}
        running = []
        for request, sequence in self._running:
            running.append((request, sequence))
            if request.id in forked and sequence.index == 0:
                reservation = request.blocks_needed - len(request.prompt_ids) // self.pool.block_size
                for sibling in request.sequences[1:]:
                    sibling.table = sequence.table.fork(reservation)
                    running.append((request, sibling))
                    rows[id(sibling)] = rows[id(sequence)]
        self._running = running

    def _score_prompts(self, logits: Tensor, counts: list[int], scored: list[bool]) -> Tensor:
        """Score the prompts of the ``scored`` sequences from their rows of ``logits`` (K, V) (every prompt row;
        one row for the others), for every sequence of their requests; each sequence's last row (S, V). A scored
        prompt must be prefilled whole in this step: a prompt whose keys came from elsewhere has no logits."""
        last_rows, start = [], 0
        for (request, _), count, whole in zip(self._running, counts, scored, strict=True):
            kept = count if whole else 1
            if whole:
                prompt = request.prompt_ids
                if count != len(prompt):
                    raise RuntimeError(f"a scored prompt of {len(prompt)} tokens was prefilled from token "
                                       f"{len(prompt) - count}: its first rows have no logits")
                # Row i predicts prompt token i + 1: rows 0 .. T-2 score tokens 1 .. T-1.
                targets = torch.tensor(prompt[1:], dtype=torch.long, device=logits.device)  # (T - 1,)
                values, tops = token_logprobs(logits[start : start + count - 1], targets, request.prompt_logprobs)
                for sequence in request.sequences:
                    sequence.prompt_logprobs = PromptLogprobs(values, tops)
            start += kept
            last_rows.append(start - 1)
        return logits.index_select(0, torch.tensor(last_rows, device=logits.device))

    def _sample(self, logits: Tensor, rows: dict[int, int]) -> None:
        """Choose each running sequence's next token from its row of ``logits`` (S, V) (``rows``: id() of a
        sequence -> its row) and hand it out: one argmax over the sequences whose choice is the plain argmax,
        the chooser one by one for the others. A sequence that only scores its prompt (``max_new_tokens`` 0)
        finishes without a token."""
        running = list(self._running)
        scoring_only = {index for index, (request, _) in enumerate(running) if request.config.max_new_tokens == 0}
        plain = [index for index, (request, sequence) in enumerate(running)
                 if index not in scoring_only and not request.chooser.alters(len(sequence.output_ids))]
        tokens: dict[int, int] = {}
        if plain:
            plain_rows = torch.tensor([rows[id(running[index][1])] for index in plain], device=logits.device)
            tokens = dict(zip(plain, logits.index_select(0, plain_rows).argmax(-1).tolist(), strict=True))
        for index, (request, sequence) in enumerate(running):
            if index in scoring_only:
                self._finish(request, sequence, "length")
                continue
            row = rows[id(sequence)]
            if index not in tokens:
                chooser = request.chooser
                scores = chooser.scores(logits[row : row + 1], len(sequence.output_ids))
                tokens[index] = int(chooser.choose(scores, sequence.generator))
            self._accept(request, sequence, tokens[index], logits[row] if request.logprobs is not None else None)

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
            values, tops = token_logprobs(logits[None], torch.tensor([token], device=logits.device), request.logprobs)
            logprob, top = values[0], tops[0]
        self._pending[id(sequence)] = token
        event = TokenEvent(request, sequence.index, token, text, logprob, top, finish,
                           sequence.take_prompt_logprobs())
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
            self._emit(TokenEvent(request, sequence.index, -1, "", finish_reason=reason,
                                  prompt_logprobs=sequence.take_prompt_logprobs()))
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
                      prompt_logprobs: int | None, on_event) -> Request:
        model = self.model
        if not prompt_ids:
            raise GenerationError("the prompt has no tokens")
        vocab = model.config.vocab_size
        bad = [token for token in prompt_ids if not isinstance(token, int) or not 0 <= token < vocab]
        if bad:
            raise GenerationError(f"token id {bad[0]!r} in the prompt is outside the vocabulary [0, {vocab})")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise GenerationError(f"n={n!r} must be an integer >= 1")
        for name, value in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= vocab):
                raise GenerationError(f"{name}={value!r} must be an integer in [0, {vocab}]")
        refuse_unhonoured(config)
        if config.max_new_tokens < 1 and prompt_logprobs is None:
            raise GenerationError(f"max_new_tokens={config.max_new_tokens} must be >= 1 on the server (0 only scores "
                                  "a prompt: with prompt_logprobs)")
        check_call(config, model, torch.tensor([prompt_ids]), None, self.tokenizer, streaming=False)
        length = len(prompt_ids) + config.max_new_tokens
        limit = model.position_limit
        if limit is not None and length > limit:
            raise GenerationError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({config.max_new_tokens}) "
                                  f"exceeds the model's context of {limit} positions")
        size = self.pool.block_size
        blocks = blocks_for(length, size)
        # the most admission can reserve for it (nothing cached): siblings share the prompt's full blocks
        shared = len(prompt_ids) // size if self.prefix_caching else 0
        needed = blocks + (n - 1) * (blocks - shared)
        if needed > self.pool.num_blocks:
            raise GenerationError(
                f"{n} x ({len(prompt_ids)} prompt + {config.max_new_tokens} new) tokens need {needed} cache "
                f"blocks; the pool holds {self.pool.num_blocks} of {size} tokens (raise cache_tokens)")
        chooser = TokenChooser.from_config(config, model.config, self.device)
        keys = prefix_keys(prompt_ids, size) if self.prefix_caching else None
        return Request(next(self._ids), prompt_ids, config, n, chooser, frozenset(config.end_ids(model.config)),
                       on_event, logprobs, blocks, self.device, self.tokenizer, prompt_logprobs, keys)


def serving_problem(model: nn.Module) -> str | None:
    """Why the engine cannot decode ``model``, or None: it steps a decoder-only model's own blocks (the
    ``step`` hook) over a paged layout, which must know every switch of its config (fail closed)."""
    if getattr(model, "encodes_prompt", False):
        return "it encodes a source (an encoder-decoder); the server continues prompts with a decoder"
    problem = stack_session_problem(model)
    if problem is None and model.stack.positional.length_dependent:  # a batch's longest request sets its angles
        kind = model.config.rope_scaling["rope_type"]
        problem = (f"rope_scaling rope_type={kind!r} turns each position by the longest position of its batch, so "
                   "requests batched together would change each other's output")
    return problem


def _check_pool_fits(cache_tokens: int, slots: int, per_token: int, device: torch.device) -> None:
    """A GenerationError naming the memory ``cache_tokens`` would take and the most that fits, before the pool
    is allocated (an allocation that large fails with a traceback, or the kernel ends the process)."""
    available = available_memory(device)
    if available is not None and slots * per_token > available:
        raise GenerationError(f"cache_tokens={cache_tokens} needs {format_bytes(slots * per_token)} of key/value "
                              f"cache ({per_token} bytes a token); {format_bytes(available)} is available on "
                              f"{device.type}: cache_tokens must be in [1, {available // per_token}]")


def serving_defaults(model: nn.Module, config: GenerationConfig | None) -> GenerationConfig:
    """A request's config with the ids it leaves to the model (end ids, forced end, suppressions) taken from the
    model's folder's generation_config.json when it has one; sampling is the request's."""
    return with_model_defaults(model, config or GenerationConfig(), SERVED_MODEL_FIELDS)


def refuse_unhonoured(config: GenerationConfig) -> None:
    """A GenerationError naming the first field of ``config`` the engine does not honour set away from its
    default (``GENERATION_FIELDS``)."""
    defaults = GenerationConfig()
    for name, reason in GENERATION_FIELDS.items():
        if reason is not None and getattr(config, name) != getattr(defaults, name):
            raise GenerationError(f"{name}={getattr(config, name)!r} is not supported by the server: {reason}")


def token_logprobs(logits: Tensor, tokens: Tensor, top: int) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """For each row of ``logits`` (R, V): the log-probability of its token in ``tokens`` (R,) under the model
    (float32 log_softmax, before any sampling filter) and the ``top`` best (id, log-probability). Rows go
    ``PROMPT_ROWS_AT_ONCE`` at a time, so a long prompt's float32 copy stays bounded."""
    values: list[float] = []
    tops: list[list[tuple[int, float]]] = []
    for start in range(0, logits.shape[0], PROMPT_ROWS_AT_ONCE):
        logprobs = torch.log_softmax(logits[start : start + PROMPT_ROWS_AT_ONCE].float(), dim=-1)  # (r, V)
        chosen = tokens[start : start + PROMPT_ROWS_AT_ONCE]
        values.extend(logprobs.gather(1, chosen[:, None])[:, 0].tolist())
        if top:
            best = torch.topk(logprobs, top)
            tops.extend([list(zip(ids, scores, strict=True))
                         for ids, scores in zip(best.indices.tolist(), best.values.tolist(), strict=True)])
        else:
            tops.extend([] for _ in range(logprobs.shape[0]))
    return values, tops
