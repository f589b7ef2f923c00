"""``generate`` and ``stream_generate``: the one entry point for decoding new tokens.

It checks the arguments, opens a decoding session per model (key/value cache, positions,
padding), prefills the prompts and hands over to a strategy: one token per step (greedy or
sampling), beam search, or speculative decoding with a draft model.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from tformer.generation.autoregressive import autoregressive_decode
from tformer.generation.beam import beam_search
from tformer.generation.output import GenerationOutput
from tformer.generation.run import DecodingRun
from tformer.generation.sampling import TokenChooser
from tformer.generation.session import DecoderSession
from tformer.generation.settings import (
    GenerationError,
    GenerationSettings,
    check_model,
    check_prompt,
    resolve_settings,
)
from tformer.generation.speculative import speculative_decode
from tformer.generation.stopping import StopRule


@torch.inference_mode()
def generate(
    model: nn.Module,
    input_ids: Tensor,
    max_new_tokens: int = 32,
    *,
    attention_mask: Tensor | None = None,
    do_sample: bool | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    min_new_tokens: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    stop_strings: str | Sequence[str] | None = None,
    tokenizer=None,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    num_return_sequences: int = 1,
    draft_model: nn.Module | None = None,
    num_draft_tokens: int = 4,
    streamer: Callable[[Tensor], None] | None = None,
    output_scores: bool = False,
    return_dict: bool = False,
    use_cache: bool = True,
) -> Tensor | GenerationOutput:
    """Continue each prompt of ``input_ids`` (B, T) by up to ``max_new_tokens`` tokens.

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
    """
    if streamer is not None and not callable(streamer):
        raise GenerationError(
            f"streamer must be callable (it receives each (batch, n) chunk of new tokens), "
            f"got {type(streamer).__name__}"
        )
    generation = _Generation(
        model, input_ids, attention_mask, draft_model, streaming=streamer is not None,
        max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, do_sample=do_sample,
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, eos_token_id=eos_token_id,
        pad_token_id=pad_token_id, stop_strings=stop_strings, tokenizer=tokenizer, num_beams=num_beams,
        length_penalty=length_penalty, early_stopping=early_stopping, num_return_sequences=num_return_sequences,
        num_draft_tokens=num_draft_tokens, output_scores=output_scores, use_cache=use_cache,
    )
    for chunk in generation.chunks():
        if streamer is not None:
            streamer(chunk)
    if streamer is not None and callable(getattr(streamer, "end", None)):
        streamer.end()
    output = generation.output()
    return output if return_dict or output_scores else output.sequences


def stream_generate(model: nn.Module, input_ids: Tensor, max_new_tokens: int = 32, **options) -> TokenStream:
    """Like ``generate`` (the same keyword options, no beam search), as an iterator over the
    chunks of new tokens (B, n) as they are produced; its ``output`` holds the
    GenerationOutput once the iteration has ended."""
    allowed = {name: parameter.default for name, parameter in inspect.signature(generate).parameters.items()
               if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name not in ("streamer", "return_dict")}
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"stream_generate got unknown option(s) {', '.join(unknown)}; known: {', '.join(allowed)}")
    arguments = {**allowed, **options}
    with torch.inference_mode():
        generation = _Generation(model, input_ids, arguments.pop("attention_mask"), arguments.pop("draft_model"),
                                 streaming=True, max_new_tokens=max_new_tokens, **arguments)
    return TokenStream(generation)


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
    """One call: checked settings, the output buffer, the sessions and the chosen strategy."""

    def __init__(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None,
                 draft_model: nn.Module | None, streaming: bool, **arguments) -> None:
        check_model(model)
        check_prompt(model, input_ids, attention_mask)
        self.settings: GenerationSettings = resolve_settings(
            model, input_ids, draft_model=draft_model, streaming=streaming, **arguments
        )
        settings = self.settings
        self.model, self.draft_model = model, draft_model
        device = model.lm_head.weight.device
        input_ids = input_ids.to(device=device, dtype=torch.long)
        attention_mask = None if attention_mask is None else attention_mask.to(device)
        if settings.num_beams == 1 and settings.num_return_sequences > 1:  # independent samples per prompt
            input_ids = input_ids.repeat_interleave(settings.num_return_sequences, dim=0)
            if attention_mask is not None:
                attention_mask = attention_mask.repeat_interleave(settings.num_return_sequences, dim=0)
        self.input_ids, self.attention_mask = input_ids, attention_mask
        batch, prompt_length = input_ids.shape

        sequences = torch.full((batch, prompt_length + settings.max_new_tokens), settings.pad_id,
                               dtype=torch.long, device=device)
        sequences[:, :prompt_length] = input_ids
        eos_ids = torch.tensor(settings.eos_ids, dtype=torch.long, device=device) if settings.eos_ids else None
        generator = None
        if settings.seed is not None:
            generator = torch.Generator(device=device).manual_seed(settings.seed)
        self.run = DecodingRun(
            sequences=sequences,
            prompt_length=prompt_length,
            max_new_tokens=settings.max_new_tokens,
            chooser=TokenChooser(settings.do_sample, settings.temperature, settings.top_k, settings.top_p,
                                 eos_ids, settings.min_new_tokens),
            stop=StopRule(eos_ids, settings.stop_strings, settings.tokenizer, prompt_length),
            pad_id=settings.pad_id,
            generator=generator,
            scores=[] if settings.output_scores else None,
        )
        self.beam_result: tuple[Tensor, Tensor] | None = None

    def chunks(self) -> Iterator[Tensor]:
        """Decode, yielding each chunk of new tokens; the models are in eval mode meanwhile."""
        training = [m for m in (self.model, self.draft_model) if m is not None and m.training]
        for m in training:
            m.eval()
        try:
            yield from self._decode()
        finally:
            for m in training:
                m.train()

    def _decode(self) -> Iterator[Tensor]:
        settings, run = self.settings, self.run
        if settings.max_new_tokens == 0:
            return
        session = self._session(self.model)
        if self.draft_model is not None:
            yield from speculative_decode(session, self._session(self.draft_model), run, settings.num_draft_tokens)
            return
        logits = session.extend(self.input_ids, last_only=True)[:, -1]  # prefill: (B, V)
        if settings.num_beams > 1:
            self.beam_result = beam_search(
                session, run, logits, settings.num_beams, settings.length_penalty, settings.early_stopping,
                settings.num_return_sequences,
            )
            return
        yield from autoregressive_decode(session, run, logits)

    def _session(self, model: nn.Module) -> DecoderSession:
        batch, prompt_length = self.input_ids.shape
        return DecoderSession(model, batch, prompt_length + self.settings.max_new_tokens, self.attention_mask,
                              use_cache=self.settings.use_cache)

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
