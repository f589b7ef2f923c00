"""``generate`` and ``stream_generate``: the one entry point for decoding new tokens.

It checks the options (one ``GenerationConfig``), opens a decoding session per model
(the prompt prepared, key/value cache, positions, padding), prefills the prompts and hands
over to a strategy: one token per step (greedy or sampling), beam search, or speculative
decoding with a draft model. Strategies see only the sessions (``session.Session``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from tformer.generation.autoregressive import END_CHECK_EVERY, autoregressive_decode
from tformer.generation.beam import beam_search
from tformer.generation.checks import check_call, check_model, check_prompt
from tformer.generation.defaults import with_model_defaults
from tformer.generation.output import GenerationOutput
from tformer.generation.run import DecodingRun
from tformer.generation.sampling import TokenChooser
from tformer.generation.session import GROWTH_CHUNK, ModelSession, open_session, session_bytes
from tformer.generation.settings import SPECULATIVE, GenerationConfig, GenerationError, refuse_unsupported
from tformer.generation.speculative import speculative_decode
from tformer.memory import format_bytes, require_memory


@torch.inference_mode()
def generate(
    model: nn.Module,
    input_ids: Tensor,
    max_new_tokens: int | None = None,
    *,
    attention_mask: Tensor | None = None,
    generation_config: GenerationConfig | None = None,
    draft_model: nn.Module | None = None,
    tokenizer=None,
    streamer: Callable[[Tensor], None] | None = None,
    **options,
) -> Tensor | GenerationOutput:
    """Continue each prompt of ``input_ids`` (B, T) by up to ``max_new_tokens`` tokens.

    The options are the fields of ``GenerationConfig``: pass ``generation_config=``, keyword
    options (which override its fields), or both; ``max_new_tokens`` given here overrides both.
    What the call leaves out comes from ``model.generation_config`` (a folder's generation_config.json,
    ``tformer.generation.defaults``), as Hugging Face's ``generate`` takes it.
    Returns the prompts followed by the new tokens, (B * num_return_sequences, T + new), or a
    ``GenerationOutput`` with ``return_dict`` / ``output_scores``.

    - Greedy by default. Sampling with ``do_sample=True`` (implied by a temperature other than
      1, ``top_k`` or ``top_p``; ``temperature=0`` is greedy); ``seed`` makes it reproducible.
    - Beam search with ``num_beams > 1``: ``length_penalty``, ``early_stopping`` (True, False
      or "never") and ``num_return_sequences`` as in Hugging Face ``generate``.
    - Speculative decoding with ``draft_model`` proposing ``num_draft_tokens`` at a time: the
      same output as greedy, the same distribution as sampling (one prompt at a time).
    - Left-padded batches: ``attention_mask`` (B, T) with 0 on the padding before each prompt.
    - A row ends at ``eos_token_id`` (one id or several; default: the model config's; ``[]``
      for none), never before ``min_new_tokens``, or when its new text contains one of
      ``stop_strings`` (needs ``tokenizer`` or one attached to the model); finished rows are
      filled with ``pad_token_id`` (default: the config's, else the first end id).
    - ``streamer`` is called with each chunk of new tokens (B, n) as it is produced (then its
      ``end()`` if it has one); see also ``stream_generate``.
    - ``use_cache=False`` re-runs the whole sequence at every step (the slow reference).
    - ``cache_implementation="static"``: decoding steps of fixed shapes over caches preallocated whole, compiled
      and captured as a CUDA graph on a GPU (the same tokens as the default "dynamic").
    - An encoder–decoder model takes its source as ``input_ids``; the result holds its
      decoder's sequences (start tokens, then the new tokens).
    """
    if streamer is not None and not callable(streamer):
        raise GenerationError(
            f"streamer must be callable (it receives each (batch, n) chunk of new tokens), "
            f"got {type(streamer).__name__}"
        )
    config = _config(model, generation_config, max_new_tokens, options)
    generation = _Generation(model, input_ids, attention_mask, config, draft_model, tokenizer,
                             streaming=streamer is not None)
    for chunk in generation.chunks():
        if streamer is not None:
            streamer(chunk)
    if streamer is not None and callable(getattr(streamer, "end", None)):
        streamer.end()
    output = generation.output()
    return output if config.return_dict or config.output_scores else output.sequences


def stream_generate(
    model: nn.Module,
    input_ids: Tensor,
    max_new_tokens: int | None = None,
    *,
    attention_mask: Tensor | None = None,
    generation_config: GenerationConfig | None = None,
    draft_model: nn.Module | None = None,
    tokenizer=None,
    **options,
) -> TokenStream:
    """Like ``generate`` (the same options, no beam search), as an iterator over the chunks of
    new tokens (B, n) as they are produced; its ``output`` holds the GenerationOutput once the
    iteration has ended. Every option is checked when the stream is made."""
    config = _config(model, generation_config, max_new_tokens, options)
    with torch.inference_mode():
        generation = _Generation(model, input_ids, attention_mask, config, draft_model, tokenizer, streaming=True)
    return TokenStream(generation)


def _config(model: nn.Module, generation_config: GenerationConfig | None, max_new_tokens: int | None,
            options: dict) -> GenerationConfig:
    """The call's one config: ``generation_config`` (else the model's defaults: its folder's
    generation_config.json) with the keyword options over it; an explicit ``max_new_tokens`` replaces a default
    ``max_length``."""
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise GenerationError(
            f"generation_config must be a GenerationConfig, got {type(generation_config).__name__}"
        )
    check_model(model)
    base = with_model_defaults(model, generation_config)
    if max_new_tokens is not None:
        options = {**options, "max_new_tokens": max_new_tokens}
    if "max_new_tokens" in options:
        options = {"max_length": None, **options}
    return base.replace(**options) if options else base


class TokenStream:
    """The chunks of new tokens (B, n) of one generation, produced as they are iterated."""

    def __init__(self, generation: _Generation) -> None:
        self._generation = generation
        self._chunks = generation.chunks()
        self.output: GenerationOutput | None = None

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> Tensor:
        with torch.inference_mode():
            try:
                return next(self._chunks)
            except StopIteration:
                self.output = self._generation.output()
                raise

    def close(self) -> None:
        """Stop early: the models go back to the mode they were in; ``output`` holds what was made."""
        self._chunks.close()
        self.output = self._generation.output()


class _Generation:
    """One call: the checked config, the prepared sessions, the output buffer and the chosen strategy."""

    def __init__(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None, config: GenerationConfig,
                 draft_model: nn.Module | None, tokenizer, streaming: bool) -> None:
        check_model(model)
        check_prompt(model, input_ids, attention_mask)
        decoder_prompt = max(len(config.decoder_prompt_ids), 1) if model.encodes_prompt else None
        config = config.for_prompt(input_ids.shape[1] if decoder_prompt is None else decoder_prompt)
        tokenizer = tokenizer if tokenizer is not None else model.tokenizer
        check_call(config, model, input_ids, draft_model, tokenizer, streaming)
        if draft_model is not None:  # the options speculative decoding cannot apply, as their fields declare
            refuse_unsupported(config, SPECULATIVE)
        self.config = config
        self.streaming = streaming  # every token is read as it is made (no step is ever taken back)
        # The models as decoding runs them, for this call: the caller's are left as they are.
        model = model.decoding_view()
        draft_model = None if draft_model is None else draft_model.decoding_view()
        self.model, self.draft_model = model, draft_model
        device = next(model.parameters()).device
        # Token ids as int64; a model's own kind of prompt (a speech model's features) as it is.
        input_ids = (input_ids.to(device=device, dtype=torch.long) if model.prompt_is_tokens
                     else input_ids.to(device=device))
        attention_mask = None if attention_mask is None else attention_mask.to(device)
        if config.num_beams == 1 and config.num_return_sequences > 1:  # independent samples per prompt
            input_ids = input_ids.repeat_interleave(config.num_return_sequences, dim=0)
            if attention_mask is not None:
                attention_mask = attention_mask.repeat_interleave(config.num_return_sequences, dim=0)

        end_ids = config.end_ids(model.config)
        grow = self._check_memory(input_ids, device, may_end_early=bool(end_ids or config.stop_strings))
        # The prompts are prepared (an encoder–decoder encodes its source) once, in eval mode.
        with self._eval_mode():
            self.session, state = open_session(model, input_ids, attention_mask, config.max_new_tokens,
                                               use_cache=config.use_cache, grow=grow,
                                               decoder_prompt=config.decoder_prompt_ids,
                                               cache_implementation=config.cache_implementation)
            self.draft_session: ModelSession | None = None
            if draft_model is not None:
                self.draft_session, draft_state = open_session(draft_model, input_ids, attention_mask,
                                                               config.max_new_tokens, role="draft_model", grow=grow,
                                                               decoder_prompt=config.decoder_prompt_ids,
                                                               cache_implementation=config.cache_implementation)
                if not torch.equal(draft_state.input_ids, state.input_ids):
                    raise GenerationError("draft_model starts its decoder from other tokens than the model")
                for role, session in (("model", self.session), ("draft_model", self.draft_session)):
                    if not session.rewindable:
                        raise GenerationError(
                            f"speculative decoding forgets rejected drafts, and the {role}'s cache cannot forget "
                            "tokens (a recurrent state, or running sums such as attention_kernel='performer''s)")
        self.prompt = state.input_ids  # (B, T0) the decoder's prompt
        self.run = DecodingRun.start(self.prompt, config, model.config,
                                     TokenChooser.from_config(config, model.config, device, tokenizer), tokenizer,
                                     None if state.attention_mask is None else ~state.attention_mask.bool())
        self.beam_result: tuple[Tensor, Tensor] | None = None

    def _check_memory(self, input_ids: Tensor, device: torch.device, may_end_early: bool) -> bool:
        """Refuse, before anything is allocated, a call whose sessions and output cannot fit in the
        memory available; return whether the sessions should grow as needed (a run that may end
        early, when the memory also allows the copy a growth makes) rather than be allocated whole."""
        config, model = self.config, self.model
        # The decoder's prompt: a decoder's input_ids; an encoder-decoder's start token or decoder_prompt_ids,
        # bounded by its source's length (the source of a model with its own kind of prompt is not tokens).
        batch, prompt_length = input_ids.shape[0], max(len(config.decoder_prompt_ids), 1)
        if model.prompt_is_tokens:
            prompt_length = max(prompt_length, input_ids.shape[1])
        length = prompt_length + config.max_new_tokens
        rows = batch * max(config.num_beams, 1)  # num_return_sequences is already in the batch
        sessions = session_bytes(model, rows, length, config.use_cache)
        if self.draft_model is not None:
            sessions += session_bytes(self.draft_model, rows, length)
        # The output: sequences (int64); beam search keeps running, finished and candidate beams
        # (about 6 x num_beams rows per prompt); scores are one (rows, V) float32 tensor per new token.
        output_rows = batch * (6 * config.num_beams if config.num_beams > 1 else 1)
        output = output_rows * length * 8
        if config.output_scores:
            output += rows * config.max_new_tokens * model.config.vocab_size * 4
        needed = sessions + output
        available = require_memory(
            needed, device, f"max_new_tokens={config.max_new_tokens} for {rows} sequence(s) after a {prompt_length}-"
            f"token prompt (key/value caches {format_bytes(sessions)}, output {format_bytes(output)})", GenerationError,
        )
        growing = may_end_early and config.use_cache and config.max_new_tokens > GROWTH_CHUNK
        return growing and (available is None or needed + sessions <= available)

    def chunks(self) -> Iterator[Tensor]:
        """Decode, yielding each chunk of new tokens; the models are in eval mode meanwhile."""
        with self._eval_mode():
            yield from self._decode()

    @contextmanager
    def _eval_mode(self) -> Iterator[None]:
        """The models in eval mode (no dropout) inside, back in the mode they were in after (a ``Model``'s
        decoding view is always in eval mode; a model whose view is itself may not be)."""
        training = [m for m in (self.model, self.draft_model) if m is not None and m.training]
        for m in training:
            m.eval()
        try:
            yield
        finally:
            for m in training:
                m.train()

    def _decode(self) -> Iterator[Tensor]:
        config, run, session = self.config, self.run, self.session
        if config.max_new_tokens == 0:
            return
        if self.draft_session is not None:
            yield from speculative_decode(session, self.draft_session, run, config.num_draft_tokens)
            return
        logits = session.extend(self.prompt, last_only=True)[:, -1]  # prefill: (B, V)
        if config.num_beams > 1:
            self.beam_result = beam_search(
                session, run, logits, config.num_beams, float(config.length_penalty), config.early_stopping,
                config.num_return_sequences,
            )
            return
        end_check_every = 1 if self.streaming else END_CHECK_EVERY.get(run.sequences.device.type, 1)
        yield from autoregressive_decode(session, run, logits, end_check_every)

    def output(self) -> GenerationOutput:
        run, speculative = self.run, self.draft_model is not None
        sequences, sequences_scores = self.beam_result or (run.sequences[:, : run.length], None)
        return GenerationOutput(
            sequences=sequences,
            prompt_length=run.prompt_length,
            scores=tuple(run.scores) if run.scores is not None else None,
            sequences_scores=sequences_scores,
            draft_tokens=run.draft_tokens if speculative else None,
            accepted_draft_tokens=run.accepted_draft_tokens if speculative else None,
        )
