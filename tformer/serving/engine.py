"""Continuous batching: one loop that, at every step, admits waiting requests into the running
batch (their prompts prefilled in the same step as the others decode), samples one token for every
running sequence, and removes finished sequences at once, their cache blocks back in the pool.

A step runs the model's own blocks (its ``step`` hook) over every running sequence's new tokens at
once, their keys and values in a paged pool (``nn.attention.paged``), on the model's device. The engine
composes the step from two parts: the ``Scheduler`` (``scheduler.py``: the queue, admission, the running batch,
cache blocks and prefixes) says which tokens run, and the ``Emitter`` (``emitter.py``: choosing, text, ends,
events) turns the step's logits into what each request receives; a request's records are ``requests.py``'s.

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
honoured or refused away from its default (``GENERATION_FIELDS``). With ``num_beams`` > 1 a request's sequences
are its beams, searched by ``generate``'s own ``BeamSearch`` one step at a time (the emitter asks it which beam
continues which; a beam taking over another copies its cached keys), the best hypothesis handed out at the end.

A request may also ask for its prompt's log-probabilities (``prompt_logprobs=k``, what evaluation clients
score continuations with): its prefill then keeps the logits of every prompt row, and only each prompt
token's log-probability and the ``k`` best leave the engine, on the sequence's first event. With
``max_new_tokens=0`` it finishes after its prefill (reason "length") without sampling.

On a GPU each decode step is launched from the last step's tokens before the host reads them, and the host hands
out those tokens (text, ends, events) while the step runs (``overlapped_steps``; ``overlap``): a request's events are
the same, one step later.

LoRA adapters (``tformer.adapters.load_adapters`` over the model before the engine is made): a request names its
adapter (``submit(..., adapter=NAME)``; None: the base model), and a step mixes adapters row by row. The engine
sets each token row's adapter around the step (``adapter_rows``, ``nn/weights/multi_lora.py``), and a prompt's
prefix keys start from its adapter's name, so no cached block is shared across adapters (their keys and values
differ).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Sequence

import torch
from torch import nn

from tformer.adapters import served_adapters
from tformer.data.log_mel import recording_features
from tformer.generation.beam import BeamSearch
from tformer.generation.checks import check_call, check_model
from tformer.generation.defaults import MODEL_FIELDS, with_model_defaults
from tformer.generation.run import DecodingRun
from tformer.generation.sampling import TokenChooser
from tformer.generation.settings import SERVER, GenerationConfig, GenerationError, refusals
from tformer.generation.transcription import audio_windows, transcript_budget, transcription_prompt
from tformer.models.embeddings import embedding_problem
from tformer.nn.attention.cache_spec import RunningSums
from tformer.nn.attention.paged import PagedLayout
from tformer.nn.attention.paged_kernel import PagedKernelError, resolve
from tformer.nn.positions.rope_scaling import ROPE_SCALINGS
from tformer.nn.weights.multi_lora import adapter_index, adapter_rows
from tformer.pooling import Pooling
from tformer.serving.block_pool import blocks_for, prefix_keys
from tformer.serving.captured_decode import CapturedDecode
from tformer.serving.embedder import Embedder, EmbeddingRequest
from tformer.serving.emitter import Emitter
from tformer.serving.engine_caches import allocate, each_spec, shares_prefixes
from tformer.serving.overlapped_steps import OverlappedSteps
from tformer.serving.requests import Request
from tformer.serving.scheduler import Scheduler, StepBatch
from tformer.serving.wire import Embeddings, EngineStats, TokenEvent

# Every GenerationConfig field: None where the engine honours it as ``generate`` does, else why it refuses a value
# other than the default (with a GenerationError naming the field); each field declares it (``refused[SERVER]``).
GENERATION_FIELDS: dict[str, str | None] = refusals(SERVER)


SERVED_MODEL_FIELDS = tuple(name for name in MODEL_FIELDS if name != "pad_token_id")  # ended sequences: unpadded


def _refuse_decoding_switches(overlap: bool | None, paged_attention: str, prefix_caching: bool | None) -> None:
    """An engine that serves embeddings only has no decode steps and no key/value cache: a switch for them set
    to anything but its default is refused, not ignored."""
    switches = (("overlap", overlap, (None, False)), ("prefix_caching", prefix_caching, (None, False)),
                ("paged_attention", paged_attention, ("auto",)))
    for name, value, defaults in switches:
        if value not in defaults:
            raise GenerationError(f"{name}={value!r}: this model writes no text (it serves embeddings only), so it has "
                                  f"no decode steps or key/value cache for it ({' or '.join(map(repr, defaults))})")


class Engine:
    """Continuous batching over a paged key/value cache for one decoder or encoder-decoder model (whose prompt is
    the source: each sequence's encoder output is computed by the step that starts it, its cross-attention keys
    kept in its row), on its device, and embeddings
    (``embed``) batched in the same steps when given a ``pooling``; a model that writes no text (an encoder)
    serves embeddings only.

    ``cache_tokens``: the pool's size in tokens (rounded up to whole blocks of ``block_size``);
    ``max_running``: sequences decoding at once; ``max_step_tokens``: new tokens per step (prompts
    beyond it wait for the next step; a prompt longer than it runs alone), and an embeddings batch's padded
    tokens; ``queue_timeout``:
    seconds a request may wait for room before it finishes with reason ``timeout`` (None: forever);
    ``paged_attention``: how decode steps read the pool, "auto", "in-place" or "gather"
    (``nn.attention.paged_kernel``; ``in_place`` the reader it chose, ``paged_attention_note`` which and why);
    ``prefix_caching``: prompts reuse the cached blocks of a prefix computed before, and a request's ``n``
    sequences share its prompt's blocks (False: every sequence computes its whole prompt; None, the default: on
    unless a layer keeps a running state, Performer's, or an encoder's keys: no prefix of those can be shared);
    ``overlap``: launch each decode step from the device's tokens before the host reads the previous step's
    (``overlapped_steps``; None, the default: where the device runs asynchronously, CUDA);
    ``pooling``: how ``embed`` pools (``tformer.pooling.Pooling``; None: no embeddings);
    ``gather_sources``: an encoder-decoder's new requests, while sequences run, wait up to this many steps for as
    many to start together, their sources encoded in one batch (1, the default: each starts at the first step it
    can). The LoRA adapters ``load_adapters`` put over ``model`` are served by name (``adapters``).
    """

    def __init__(self, model: nn.Module, tokenizer=None, *, cache_tokens: int = 16384, block_size: int = 16,
                 max_running: int = 64, max_step_tokens: int = 4096, queue_timeout: float | None = None,
                 paged_attention: str = "auto", prefix_caching: bool | None = None,
                 pooling: Pooling | None = None, overlap: bool | None = None, gather_sources: int = 1) -> None:
        for name, value in (("cache_tokens", cache_tokens), ("block_size", block_size), ("max_running", max_running),
                            ("max_step_tokens", max_step_tokens), ("gather_sources", gather_sources)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise GenerationError(f"{name}={value!r} must be an integer >= 1")
        if gather_sources > 1 and not (model.generates and model.encodes_prompt):
            raise GenerationError(f"gather_sources={gather_sources} batches an encoder-decoder's sources (its "
                                  "encoder's work); this model has none to gather: 1 (requests admitted as they come)")
        if prefix_caching is not None and not isinstance(prefix_caching, bool):
            raise GenerationError(f"prefix_caching={prefix_caching!r} must be True, False or None (on where the "
                                  "model's caches allow it)")
        if overlap is not None and not isinstance(overlap, bool):
            raise GenerationError(f"overlap={overlap!r} must be True, False or None (on where the device is "
                                  "asynchronous: CUDA)")
        self.tokenizer = tokenizer
        self.adapters = served_adapters(model)  # the names a request may choose besides the base
        self.stats = EngineStats()
        self._ids = itertools.count()
        self.pool = self.scheduler = self.emitter = self.captured = self.overlapped = None
        if model.generates or pooling is None:
            self._start_decoding(model, cache_tokens, block_size, max_running, max_step_tokens, queue_timeout,
                                 paged_attention, prefix_caching, gather_sources)
            self.overlapped = OverlappedSteps.make(overlap, self.scheduler, self.emitter, self.device, self._run_step)
            self.work = self.scheduler.work
        else:  # embeddings only
            _refuse_decoding_switches(overlap, paged_attention, prefix_caching)
            self.model, self.device, self.prefix_caching = model, model.device, False
            self.in_place, self.paged_attention_note = False, "embeddings only: no key/value cache"
            self.work = threading.Condition(threading.Lock())
        self.embedder = None
        if pooling is not None:
            problem = embedding_problem(model)
            if problem is not None:
                raise GenerationError(f"the server cannot embed with this model: {problem}")
            if model.training:
                raise GenerationError("the model is in training mode (dropout on): call model.eval() first")
            self.embedder = Embedder(model, pooling, self.stats, self.work, max_batch_tokens=max_step_tokens)

    def _start_decoding(self, model: nn.Module, cache_tokens: int, block_size: int, max_running: int,
                        max_step_tokens: int, queue_timeout: float | None, paged_attention: str,
                        prefix_caching: bool | None, gather_sources: int = 1) -> None:
        """The decoding half: the model's decoding view, the paged pool, the scheduler and the emitter."""
        check_model(model)
        reason = serving_problem(model)
        if reason is not None:
            raise GenerationError(f"the server cannot decode this model: {reason}")
        file_defaults(model)  # a default of the folder's the engine cannot honour: refused before the pool is made
        try:
            self.in_place, self.paged_attention_note = resolve(paged_attention, model)
        except PagedKernelError as error:
            raise GenerationError(str(error)) from None
        # The model as decoding runs it, for the engine's life: the caller's is left as it is.
        self.model = model = model.decoding_view()
        self.device = next(model.parameters()).device
        self.position_limit = model.position_limit  # read once: it walks the model's modules
        self._transcript_budgets: dict[tuple[int, ...], int] = {}  # a speech model's decoder prompt -> its budget
        specs = model.cache_specs()
        keeps_states = any(not spec.paged for spec in each_spec(specs))
        self.prefix_caching = shares_prefixes(prefix_caching, specs)
        self._no_sources: dict | None = None  # an encoder-decoder's step inputs when no sequence starts (no rows)
        try:
            self.pool, self.caches = allocate(specs, cache_tokens, block_size, max_running,
                                              next(model.parameters()).dtype, self.device)
        except (RuntimeError, MemoryError) as error:  # the estimate passed, the allocation did not
            raise GenerationError(f"cache_tokens={cache_tokens}: the key/value cache could not be allocated on "
                                  f"{self.device.type} ({str(error).splitlines()[0]})") from None
        # A layer keeps running sums (Performer's): a row no beam can take over, which beam search needs.
        self._keeps_sums = any(isinstance(spec, RunningSums) for spec in each_spec(specs))
        # An encoder-decoder's sequences of one request share its source's row of encoder keys, unless a layer keeps
        # running sums (each sequence's own).
        self.scheduler = Scheduler(self.pool, self.stats, max_running=max_running, max_step_tokens=max_step_tokens,
                                   queue_timeout=queue_timeout, keeps_states=keeps_states,
                                   shares_rows=model.encodes_prompt and not self._keeps_sums,
                                   gather_sources=gather_sources)
        self.emitter = Emitter(self.scheduler, self.stats)
        self.captured = CapturedDecode.make(model, self.caches, self.pool, self.device, in_place=self.in_place,
                                            keeps_states=keeps_states, adapters=bool(self.adapters))

    # ---- from any thread --------------------------------------------------------------------------

    def submit(self, prompt_ids: Sequence[int] | torch.Tensor, config: GenerationConfig | None = None, *, n: int = 1,
               logprobs: int | None = None, prompt_logprobs: int | None = None,
               on_event: Callable[[TokenEvent], None] | None = None, adapter: str | None = None) -> Request:
        """Queue ``prompt_ids`` for ``n`` sequences decoded with ``config``; a GenerationError when it can
        never run (bad ids, past the position table, more cache than the pool holds, beam search...). An
        encoder-decoder's prompt is its source: token ids, or a speech model's log-mel features (M, F) of one window
        (``transcribe`` cuts a recording into them); its decoder starts from ``config.decoder_prompt_ids``, else its
        start token.
        ``logprobs=k``: each new token's log-probability and the k best; ``prompt_logprobs=k``: the same for
        the prompt's tokens (``PromptLogprobs`` on each sequence's first event); ``adapter``: the served LoRA
        adapter it decodes with (None: the base model)."""
        if self.scheduler is None:
            raise GenerationError(self.embeds_only)
        if adapter is not None and adapter not in self.adapters:
            served = ", ".join(repr(name) for name in self.adapters) or "none"
            raise GenerationError(f"adapter {adapter!r} is not served (adapters: {served})")
        config = serving_defaults(self.model, config)
        decoder_prompt = len(config.decoder_prompt_ids) or 1 if self.model.encodes_prompt else len(prompt_ids)
        prompt = prompt_ids if isinstance(prompt_ids, torch.Tensor) else list(prompt_ids)
        request = self._make_request(prompt, config.for_prompt(decoder_prompt), n, logprobs, prompt_logprobs, on_event,
                                     adapter)
        self.scheduler.enqueue(request)
        return request

    def transcribe(self, samples: torch.Tensor, config: GenerationConfig | None = None, *, language: str | None = None,
                   logprobs: int | None = None, on_event: Callable[[TokenEvent], None] | None = None) -> list[Request]:
        """Queue a speech model's transcription of a recording, ``samples`` (N,) at its ``log_mel_settings``' rate:
        one request per window of its features, as ``tformer transcribe`` decodes them (the decoder prompted for
        ``language`` where the model is Whisper's, each window's transcript as long as its positions allow); their
        texts, in order, joined with spaces, are the transcript. ``config``'s sampling and beams are each window's,
        ``logprobs`` as ``submit``'s."""
        model = self.model
        if self.scheduler is None or model.config.architecture != "speech":
            raise GenerationError(f"architecture={model.config.architecture!r} transcribes no audio: serve a speech "
                                  "model (a speech_recognition run, or a Whisper folder)")
        samples = torch.as_tensor(samples, dtype=torch.float32)
        if samples.dim() != 1 or not samples.numel():
            raise GenerationError(f"the recording must be samples (N >= 1,), got {tuple(samples.shape)}")
        prompt = transcription_prompt(self.tokenizer, model.config.vocab_size, language)
        if prompt not in self._transcript_budgets:
            self._transcript_budgets[prompt] = transcript_budget(model, prompt)
        config = (config or GenerationConfig()).replace(decoder_prompt_ids=prompt,
                                                        max_new_tokens=self._transcript_budgets[prompt])
        features = recording_features(samples, model.log_mel_settings)[None].to(self.device)  # (1, M, W x F)
        requests: list[Request] = []
        try:
            for window in audio_windows(features, model.config.input_frames):
                requests.append(self.submit(window[0], config, logprobs=logprobs, on_event=on_event))
        except GenerationError:
            for request in requests:
                self.cancel(request.id)
            raise
        return requests

    def embed(self, sequences: Sequence[Sequence[int]],
              on_done: Callable[[Embeddings], None] | None = None) -> EmbeddingRequest:
        """Queue token-id ``sequences`` to embed in the coming steps, batched with other requests; ``on_done`` gets
        their vectors (``Embeddings``). A GenerationError when the engine has no pooling or an input cannot be
        embedded (no tokens, past the context, an id outside the vocabulary)."""
        if self.embedder is None:
            raise GenerationError("this model serves no embeddings: it has no pooling (give the engine one)")
        return self.embedder.submit(next(self._ids), sequences, on_done or (lambda answer: None))

    @property
    def embeds_only(self) -> str:
        """Why a generation request is refused by an engine that only embeds."""
        return (f"this model embeds only (architecture={self.model.config.architecture!r} writes no text): it "
                "answers embeddings requests, not completions")

    def cancel(self, request_id: int) -> None:
        """Stop the request of ``request_id`` (a client went away): its sequences finish with reason
        ``cancelled`` at the next step and their blocks return to the pool (an embeddings request is answered
        "cancelled")."""
        if not isinstance(request_id, int):  # a Request given for its id would cancel nothing, silently
            raise TypeError(f"cancel takes a request's id (Request.id), not {type(request_id).__name__}")
        for part in self._parts():
            part.cancel(request_id)

    def stop_admitting(self) -> None:
        for part in self._parts():
            part.stop_admitting()

    def wait_for_work(self, timeout: float | None = None) -> bool:
        """Block until something is waiting, running or cancelled (or ``timeout``); whether there is."""
        with self.work:
            return self.work.wait_for(self.has_work, timeout)

    def has_work(self) -> bool:
        return any(part.has_work() for part in self._parts())

    def cancel_all(self) -> None:
        """Cancel every waiting and running request (the server is stopping)."""
        for part in self._parts():
            part.cancel_all()

    def _parts(self) -> list[Scheduler | Embedder]:
        """What queues requests: the scheduler (decoding), the embedder (embeddings), where the engine has them."""
        return [part for part in (self.scheduler, self.embedder) if part is not None]

    @property
    def admitting(self) -> bool:
        return self._parts()[0].admitting

    @property
    def queue_length(self) -> int:
        return len(self.scheduler.waiting) if self.scheduler is not None else 0

    @property
    def tokens_stored(self) -> int:
        """Tokens whose keys and values the running sequences' blocks hold now, a shared block once."""
        return self.scheduler.tokens_stored if self.scheduler is not None else 0

    @property
    def running(self) -> int:
        return len(self.scheduler.running) if self.scheduler is not None else 0

    @property
    def queue_timeout(self) -> float | None:
        return self.scheduler.queue_timeout if self.scheduler is not None else None

    # ---- the loop ---------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> int:
        """One scheduling step: a batch of embeddings; cancel, admit, run every sequence one token further. New
        tokens made (and, where steps are overlapped, handed out) and inputs embedded: 0 when it could run nothing."""
        made = self.embedder.step() if self.embedder is not None else 0
        if self.scheduler is None:
            return made
        scheduler, emitter = self.scheduler, self.emitter
        unstarted, stopped = scheduler.take_cancelled()
        for request in unstarted:
            emitter.finish_unstarted(request, "cancelled")
        for request, sequence in stopped:
            emitter.finish(request, sequence, "cancelled")
        admitted, forking = scheduler.admit()
        for request in scheduler.take_expired():
            emitter.finish_unstarted(request, "timeout")
        overlapped = self.overlapped
        if overlapped is not None:
            if overlapped.takes(admitted):
                launched = overlapped.steps
                made += overlapped.step()
                self.stats.steps += overlapped.steps - launched
                return made
            made += overlapped.drain()  # every running sequence's last token on the host, for the step as it comes
        if not scheduler.running:
            return made
        batch = scheduler.batch(admitted)
        logits = self._run_step(batch, admitted=admitted)
        self.stats.steps += 1
        if any(batch.scored):
            logits = emitter.score_prompts(logits, batch.counts, batch.scored)
        scheduler.register_prompts(admitted)
        scheduler.fork(forking, batch.rows)
        emitter.sample(logits, batch.rows)
        return made + len(batch.rows)

    def _run_step(self, batch: StepBatch, input_ids: torch.Tensor | None = None,
                  admitted: set[int] = frozenset()) -> torch.Tensor:
        """The model's step over ``batch`` (its tokens ``input_ids`` (N,) on the device where given, else the
        batch's): logits (K, V), through a captured graph where the step is decode-only and captured steps apply."""
        if self.captured is not None and self.captured.takes(batch, admitted):
            return self.captured.step(batch, input_ids)  # (N, V): one token each
        return self._step_eagerly(batch, admitted, input_ids)

    def _step_eagerly(self, batch: StepBatch, admitted: set[int], input_ids: torch.Tensor | None) -> torch.Tensor:
        """The step as it comes (prompts and one-token sequences mixed): logits (K, V), the rows its layout keeps."""
        states = batch.state_slots if self.scheduler.free_states is not None else None
        layout = PagedLayout.build(batch.tables, batch.counts, self.device, in_place=self.in_place,
                                   every_row=batch.scored if any(batch.scored) else None,
                                   block_size=self.pool.block_size, state_slots=states)
        step_inputs = self._encode_sources(admitted, layout) if self.model.encodes_prompt else {}
        # (1, N): every sequence's new tokens in turn
        ids = torch.tensor([batch.input_ids], device=self.device) if input_ids is None else input_ids[None]
        with self.model.stepping, self._adapter_rows(batch.adapters, batch.counts, layout.keep):
            return self.model.step(ids, layout, self.caches, **step_inputs)[0]  # (K, V) the rows layout.keep names

    def _encode_sources(self, admitted: set[int], layout: PagedLayout) -> dict:
        """An encoder-decoder's step inputs: the encoder's output for the sequences starting in this step (right-
        padded, one row for each of their rows of the cross-attention caches, which ``layout.source_slots`` names:
        a request's sequences share one where the scheduler shares rows); without such sequences, the same inputs
        with no rows."""
        starting = [(request, sequence) for request, sequence in self.scheduler.running if id(sequence) in admitted]
        if not starting:
            return self._no_sources
        requests = list({request.id: request for request, _ in starting}.values())  # a request's beams: one source
        if self.model.prompt_is_tokens:
            step_inputs = self.model.prepare_generation(*_padded_sources([request.source for request in requests],
                                                                         self.device)).step_inputs
        else:  # a speech model's windows of features, each (M, F) of the same window
            step_inputs = self.model.prepare_generation(torch.stack([request.source for request in requests]))\
                .step_inputs
        row_of = {request.id: row for row, request in enumerate(requests)}
        source_of = {sequence.state_slot: row_of[request.id] for request, sequence in starting}  # in running order
        rows = torch.tensor(list(source_of.values()), device=self.device)
        step_inputs = {name: tensor.index_select(0, rows) for name, tensor in step_inputs.items()}
        layout.source_slots = list(source_of)
        if self._no_sources is None:
            self._no_sources = {name: tensor[:0] for name, tensor in step_inputs.items()}
        return step_inputs

    def _adapter_rows(self, adapters: list[int], counts: list[int], keep) -> contextlib.AbstractContextManager:
        """The step's context naming each token row's adapter, where the engine serves adapters."""
        if not self.adapters:
            return contextlib.nullcontext()
        return adapter_rows.use(adapter_index(adapters, counts, self.device), keep)

    def complete(self, prompts: Sequence[Sequence[int]], config: GenerationConfig | None = None,
                 n: int = 1) -> list[Request]:
        """Submit every prompt, run until all are done (on this thread), return the requests in order."""
        requests = [self.submit(prompt, config, n=n) for prompt in prompts]
        self.run_until_idle()
        return requests

    def run_until_idle(self) -> None:
        """Step (on this thread) until nothing waits or runs; a RuntimeError if requests wait with nothing
        running, since no step could ever admit them (blocks leaked or promised to no one)."""
        scheduler = self.scheduler
        while self.has_work():
            if self.step() == 0 and scheduler is not None and not scheduler.running and scheduler.waiting:
                raise RuntimeError(f"{len(scheduler.waiting)} request(s) wait for cache blocks with nothing running: "
                                   f"{self.pool.blocks_in_use} blocks in use, {self.pool.reserved} reserved")

    # ---- requests ---------------------------------------------------------------------------------

    def _make_request(self, prompt_ids: list[int], config: GenerationConfig, n: int, logprobs: int | None,
                      prompt_logprobs: int | None, on_event, adapter: str | None = None) -> Request:
        model = self.model
        vocab = model.config.vocab_size
        if not isinstance(prompt_ids, torch.Tensor):
            if not prompt_ids:
                raise GenerationError("the prompt has no tokens")
            bad = [token for token in prompt_ids if not isinstance(token, int) or not 0 <= token < vocab]
            if bad:
                raise GenerationError(f"token id {bad[0]!r} in the prompt is outside the vocabulary [0, {vocab})")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise GenerationError(f"n={n!r} must be an integer >= 1")
        for name, value in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= vocab):
                raise GenerationError(f"{name}={value!r} must be an integer in [0, {vocab}]")
        refuse_unhonoured(config)
        source, prompt_ids = self._decoder_prompt(prompt_ids, config, prompt_logprobs)
        if config.max_new_tokens < 1 and prompt_logprobs is None:
            raise GenerationError(f"max_new_tokens={config.max_new_tokens} must be >= 1 on the server (0 only scores "
                                  "a prompt: with prompt_logprobs)")
        check_call(config, model, torch.tensor([prompt_ids]), None, self.tokenizer, streaming=False)
        if config.num_beams > 1:
            self._check_beam_search(n, logprobs)
            n = config.num_beams  # the request's sequences are its beams
        length = len(prompt_ids) + config.max_new_tokens
        limit = self.position_limit
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
        chooser = TokenChooser.from_config(config, model.config, self.device, self.tokenizer)
        salt = b"" if adapter is None else b"adapter\0" + adapter.encode()  # no block shared across adapters
        keys = prefix_keys(prompt_ids, size, salt) if self.prefix_caching else None
        search = None
        if config.num_beams > 1:
            run = DecodingRun.start(torch.tensor([prompt_ids], device=self.device), config, model.config, chooser,
                                    self.tokenizer)
            search = BeamSearch(run, 1, config.num_beams, config.length_penalty, config.early_stopping, retire=False)
        return Request(next(self._ids), prompt_ids, config, n, chooser, frozenset(config.end_ids(model.config)),
                       on_event, logprobs, blocks, self.device, self.tokenizer, prompt_logprobs, keys,
                       -1 if adapter is None else self.adapters.index(adapter), source, search)

    def _check_beam_search(self, n: int, logprobs: int | None) -> None:
        """A GenerationError naming what a beam search request cannot have."""
        if n != 1:
            raise GenerationError(f"n={n} with num_beams > 1: a beam search hands out its best sequence only (n=1)")
        if logprobs is not None:
            raise GenerationError("logprobs with num_beams > 1: the tokens of a beam search's answer are known at its "
                                  "end, chosen by the beams' summed scores")
        if self._keeps_sums:
            raise GenerationError("num_beams > 1: a beam taking over another's tokens would need its running sums "
                                  "(attention_kernel='performer'), which the engine does not copy")

    def _decoder_prompt(self, prompt: list[int] | torch.Tensor, config: GenerationConfig,
                        prompt_logprobs: int | None) -> tuple[list[int] | torch.Tensor | None, list[int]]:
        """The source and the decoder's prompt of a request: for a decoder, none and the prompt; for an
        encoder-decoder, the prompt (token ids within the encoder's positions, or a speech model's features) and the
        decoder's first tokens (``config.decoder_prompt_ids``, else its start token)."""
        model = self.model
        if not model.encodes_prompt:
            if isinstance(prompt, torch.Tensor):
                raise GenerationError("a decoder's prompt is token ids, not a tensor of features")
            return None, prompt
        if prompt_logprobs is not None:
            raise GenerationError("prompt_logprobs score a decoder's prompt; an encoder-decoder's prompt is the source "
                                  "it reads, which it does not predict")
        if isinstance(prompt, torch.Tensor) != (not model.prompt_is_tokens):
            wanted = "token ids" if model.prompt_is_tokens else "log-mel features (transcribe a recording)"
            raise GenerationError(f"architecture={model.config.architecture!r} reads {wanted} as its source")
        if isinstance(prompt, torch.Tensor):
            if not prompt.is_floating_point():
                raise GenerationError(f"log-mel features must be floating point, not {prompt.dtype}")
            problem = model.check_generation_input(prompt[None], None)
            if problem is not None:
                raise GenerationError(problem)
            prompt = prompt.to(self.device)
        else:
            limit = self.position_limit
            if limit is not None and len(prompt) > limit:
                raise GenerationError(f"the source ({len(prompt)} tokens) exceeds the model's {limit} positions")
        return prompt, model.decoder_start(1, self.device, config.decoder_prompt_ids)[0].tolist()


def serving_problem(model: nn.Module) -> str | None:
    """Why the engine cannot decode ``model``, or None: it steps the model's own decoder blocks (the ``step``
    hook) over a paged layout, which must know every switch of its config (fail closed)."""
    problem = model.step_problem()
    scaling = model.config.rope_scaling
    if problem is None and scaling is not None and ROPE_SCALINGS[scaling["rope_type"]].length_dependent:
        kind = scaling["rope_type"]  # a batch's longest request would set every request's angles
        problem = (f"rope_scaling rope_type={kind!r} turns each position by the longest position of its batch, so "
                   "requests batched together would change each other's output")
    return problem


def _padded_sources(sources: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sources right-padded into one batch (B, S) and its mask (1 = token)."""
    longest = max(len(source) for source in sources)
    batch = torch.zeros(len(sources), longest, dtype=torch.long)
    mask = torch.zeros(len(sources), longest, dtype=torch.long)
    for row, source in enumerate(sources):
        batch[row, : len(source)] = torch.tensor(source)
        mask[row, : len(source)] = 1
    return batch.to(device), mask.to(device)


def serving_defaults(model: nn.Module, config: GenerationConfig | None) -> GenerationConfig:
    """A request's config with the ids it leaves to the model (end ids, forced end, suppressions) taken from the
    model's folder's generation_config.json when it has one; sampling is the request's."""
    return with_model_defaults(model, config or GenerationConfig(), SERVED_MODEL_FIELDS)


def file_defaults(model: nn.Module) -> GenerationConfig | None:
    """The model's folder's generation_config.json (None without one), the defaults of what a request leaves out
    (``openai_api``); a default the engine cannot honour (beam search, ...) is a GenerationError naming it, so the
    server refuses to start rather than drop it."""
    defaults = model.generation_config
    if not isinstance(defaults, GenerationConfig):
        return None
    base = GenerationConfig()
    for name, reason in GENERATION_FIELDS.items():
        if reason is not None and name not in MODEL_FIELDS and getattr(defaults, name) != getattr(base, name):
            raise GenerationError(f"generation_config.json: {name}={getattr(defaults, name)!r} is not supported by "
                                  f"the server: {reason}")
    return defaults


def refuse_unhonoured(config: GenerationConfig) -> None:
    """A GenerationError naming the first field of ``config`` the engine does not honour set away from its
    default (``GENERATION_FIELDS``)."""
    defaults = GenerationConfig()
    for name, reason in GENERATION_FIELDS.items():
        if reason is not None and getattr(config, name) != getattr(defaults, name):
            raise GenerationError(f"{name}={getattr(config, name)!r} is not supported by the server: {reason}")
