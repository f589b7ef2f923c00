"""The engine's decode steps overlapped with their host work (issue 58): a step's tokens are chosen on the device (the
argmax of its logits, or a request's own draw), the next step is launched from them before the host reads them,
and the host's work on a step's tokens (their text, stop strings, ends, each request's event) is done while the next
step runs, as vLLM's asynchronous scheduling and SGLang's overlap scheduler do. On a GPU the host then never waits
for a step it could be preparing the next one beside.

A sequence's events are those of the plain loop, one step later. A sequence that ends at a token (its end id, a stop
string) has been given one more step, whose token is dropped (its slot is in its own blocks, released with them; a
later step that reuses them runs after it on the device's stream); its length limit is known ahead, so no step runs
past it. A request cancelled while a step is in flight ends without that step's token.

Where it applies: a decode-only step (no sequence starts: a step that admits one first hands out what is in flight)
whose every sequence's token is chosen from its logits alone: the argmax, or its chooser's rules and draw (sampling,
an end id held back, suppressed tokens, a bias), which read only how many tokens it has, known ahead; not a penalty
or a grammar, which read the tokens themselves, nor log-probabilities or beam search. On by
default where the device runs asynchronously to the host (CUDA); on the CPU a step runs on the host's own thread,
with nothing to overlap, and ``overlap=True`` runs the same code (how the tests check it equals the plain loop).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.nn.attention.paged import on_device
from tformer.serving.emitter import Emitter
from tformer.serving.requests import Request, RunningSequence
from tformer.serving.scheduler import Scheduler, StepBatch

ASYNCHRONOUS_DEVICES = ("cuda",)  # where ``overlap=None`` turns it on


@dataclass
class InFlightStep:
    """A launched step whose tokens the host has not read yet."""

    sequences: list[tuple[Request, RunningSequence]]  # its rows, in order
    tokens: Tensor  # (N,) each row's token, on the device
    copied: Tensor  # (N,) the same on the host once ``ready`` has passed (pinned memory on a GPU)
    ready: torch.cuda.Event | None  # recorded after the copy; None: the copy is done (the CPU)


class OverlappedSteps:
    """Decode steps launched one ahead of their host work (see the module's docstring). ``run_step(batch, input_ids)``
    runs the model's step over a decode-only ``batch`` whose tokens are ``input_ids`` (N,) on the device: logits
    (N, V)."""

    def __init__(self, scheduler: Scheduler, emitter: Emitter, device: torch.device,
                 run_step: Callable[[StepBatch, Tensor], Tensor]) -> None:
        self.scheduler, self.emitter, self.device, self.run_step = scheduler, emitter, device, run_step
        self.in_flight: InFlightStep | None = None
        self.steps = 0  # steps launched ahead of their host work

    @classmethod
    def make(cls, overlap: bool | None, scheduler: Scheduler, emitter: Emitter, device: torch.device,
             run_step: Callable[[StepBatch, Tensor], Tensor]) -> OverlappedSteps | None:
        """The engine's overlapped steps, or None: ``overlap`` None means where the device is asynchronous."""
        wanted = device.type in ASYNCHRONOUS_DEVICES if overlap is None else overlap
        return cls(scheduler, emitter, device, run_step) if wanted else None

    def takes(self, admitted: set[int]) -> bool:
        """Whether this step can be launched ahead: no sequence starts, and every running one's next token is
        chosen from its logits alone (no rule of its chooser reads its tokens so far)."""
        if admitted or not self.scheduler.running:
            return False
        return all(request.search is None and request.logprobs is None and request.config.max_new_tokens > 0
                   and not request.chooser.reads_history for request, _ in self.scheduler.running)

    def step(self) -> int:
        """Launch the next step from the tokens in flight (or the host's last ones), then hand out the previous
        step's tokens while it runs. The rows launched plus the tokens handed out: 0 only when it did nothing."""
        previous = self.in_flight
        self.in_flight = self._launch(previous)
        launched = 0 if self.in_flight is None else len(self.in_flight.sequences)
        return launched + self._hand_out(previous)

    def drain(self) -> int:
        """Hand out the step in flight, if any: afterwards every running sequence's last token is on the host
        (``Scheduler.pending``), as the plain loop leaves it. Tokens handed out."""
        previous, self.in_flight = self.in_flight, None
        return self._hand_out(previous)

    def _unread(self) -> set[int]:
        """id() of the sequences whose token in flight is unread."""
        return set() if self.in_flight is None else {id(sequence) for _, sequence in self.in_flight.sequences}

    def _launch(self, previous: InFlightStep | None) -> InFlightStep | None:
        """Run one decode step over every running sequence short of its length limit, its input the previous step's
        tokens where that step is in flight; its tokens chosen and their copy to the host started, not awaited."""
        ahead = self._unread()
        chosen = [(request, sequence) for request, sequence in self.scheduler.running
                  if len(sequence.output_ids) + (id(sequence) in ahead) < request.config.max_new_tokens]
        if not chosen:
            return None
        if previous is None:
            input_ids = on_device([self.scheduler.pending[id(sequence)] for _, sequence in chosen], self.device)
        else:
            input_ids = _rows_of(previous, chosen)
        batch = self.scheduler.batch(set(), ahead=chosen)
        tokens = _choose(self.run_step(batch, input_ids), chosen, ahead)  # (N,)
        self.steps += 1
        if self.device.type != "cuda":
            return InFlightStep(chosen, tokens, tokens, None)
        copied = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        copied.copy_(tokens, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return InFlightStep(chosen, tokens, copied, ready)

    def _hand_out(self, step: InFlightStep | None) -> int:
        """Read ``step``'s tokens (waiting for its copy only) and accept each for its sequence, unless the sequence
        has ended since the step was launched (at its token before, or cancelled): that token is dropped."""
        if step is None:
            return 0
        if step.ready is not None:
            step.ready.synchronize()
        made = 0
        for (request, sequence), token in zip(step.sequences, step.copied.tolist(), strict=True):
            if sequence.finish_reason is None:
                self.emitter.accept(request, sequence, token, None)
                made += 1
        return made


def _choose(logits: Tensor, chosen: list[tuple[Request, RunningSequence]], ahead: set[int]) -> Tensor:
    """Each sequence's token (N,) from its row of ``logits`` (N, V), on the device: one argmax over all rows, and
    for a sequence whose chooser alters its choice (sampling, a rule) the chooser's own, as the emitter's would be,
    after as many tokens as it has on the host and in flight (``ahead``: id() of those with one in flight)."""
    tokens = logits.argmax(-1)  # (N,)
    drawn = {}
    for row, (request, sequence) in enumerate(chosen):
        generated = len(sequence.output_ids) + (id(sequence) in ahead)
        chooser = request.chooser
        if chooser.alters(generated):
            drawn[row] = chooser.choose(chooser.scores(logits[row : row + 1], generated), sequence.generator)
    if not drawn:
        return tokens
    return torch.cat([drawn.get(row, tokens[row : row + 1]) for row in range(len(chosen))])


def _rows_of(previous: InFlightStep, chosen: list[tuple[Request, RunningSequence]]) -> Tensor:
    """The tokens (N,) ``previous`` chose for the ``chosen`` sequences, in their order, without reading them."""
    rows = {id(sequence): row for row, (_, sequence) in enumerate(previous.sequences)}
    try:
        order = [rows[id(sequence)] for _, sequence in chosen]
    except KeyError:
        raise RuntimeError("a sequence to step was not in the step in flight: its last token is nowhere") from None
    if order == list(range(len(previous.sequences))):
        return previous.tokens
    return previous.tokens.index_select(0, on_device(order, previous.tokens.device))  # not waiting for the step
