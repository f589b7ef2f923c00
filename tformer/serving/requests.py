"""A request inside the engine: its prompt, options and chooser, and each of its ``n`` sequences while they
decode (their cache blocks, tokens, text and how they ended). The scheduler moves them, the emitter writes
them; the client side sees them only through ``TokenEvent`` (``wire.py``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tformer.generation.beam import BeamSearch
from tformer.generation.detokenize import IncrementalDetokenizer
from tformer.generation.sampling import TokenChooser
from tformer.generation.settings import GenerationConfig
from tformer.serving.block_pool import BlockTable
from tformer.serving.wire import PromptLogprobs, TokenEvent

FINISH_REASONS = ("stop", "length", "cancelled", "timeout")


@dataclass
class RunningSequence:
    """One of a request's sequences while it decodes."""

    index: int
    generator: torch.Generator | None
    detokenizer: IncrementalDetokenizer | None  # its text (None: the engine has no tokenizer)
    table: BlockTable | None = None
    state_slot: int = -1  # its row of the running-state layers' storage (-1: none)
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
                 block_keys: list[bytes] | None = None, adapter: int = -1,
                 source: list[int] | torch.Tensor | None = None, search: BeamSearch | None = None) -> None:
        self.id = request_id
        self.search = search  # beam search: its sequences are the beams, and only the best is handed out, at the end
        self.answers = 1 if search is not None else n  # the sequences whose events leave the engine (the first ones)
        # an encoder-decoder's source, token ids or a speech model's features (M, F) (its prompt_ids: the decoder's)
        self.source = source
        self.adapter = adapter  # the served LoRA adapter's index (-1: the base model)
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
            RunningSequence(index, _generator(config.seed, index, device),
                      None if tokenizer is None else IncrementalDetokenizer(
                          tokenizer, config.stop_strings, config.include_stop_strings, config.skip_special_tokens))
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
