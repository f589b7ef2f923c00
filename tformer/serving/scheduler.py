"""Which sequences run in each step of the engine: the waiting queue (first come, first served), cancellations and
time-outs, the running batch under its limits (sequences, tokens a step), and the paged pool's blocks: each
sequence's reservation, the prompts' cached prefixes, and the siblings forked from a request's first sequence.

Requests are queued and cancelled from any thread (under ``work``, a condition the engine's loop waits on);
everything else runs on the loop's thread, inside a step.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from tformer.generation.settings import GenerationError
from tformer.serving.block_pool import BlockPool, BlockTable
from tformer.serving.requests import Request, RunningSequence
from tformer.serving.wire import EngineStats


@dataclass
class StepBatch:
    """What one step computes: every running sequence's new tokens, one sequence after another."""

    tables: list[BlockTable]  # each sequence's blocks, its new tokens' slots appended
    counts: list[int]  # its new tokens
    input_ids: list[int]  # all of them, in order
    scored: list[bool]  # whether its prompt is scored (every prompt row kept)
    rows: dict[int, int]  # id() of a sequence -> its row of the step's logits
    adapters: list[int]  # each sequence's LoRA adapter (-1: the base model)
    state_slots: list[int]  # each sequence's row of the running-state layers (-1: the model has none)


class Scheduler:
    """The engine's queue, running batch and cache blocks (see the module's docstring)."""

    def __init__(self, pool: BlockPool, stats: EngineStats, *, max_running: int, max_step_tokens: int,
                 queue_timeout: float | None, keeps_states: bool = False, shares_rows: bool = False,
                 gather_sources: int = 1) -> None:
        self.pool = pool
        # An encoder-decoder's waiting requests held back while sequences run, until this many wait (or as many as
        # the batch has room for), for at most this many steps: their sources then start, and are encoded, together.
        self.gather_sources = gather_sources
        self.held_steps = 0  # steps the waiting requests have been held back so far
        # A row of every running-state layer (Performer's sums, an encoder's keys) per running sequence; None: the
        # model keeps none. ``shares_rows``: a request's sequences share one row (what it holds is its source's:
        # beams and samples of one source read the same encoder keys), freed with the last of them.
        self.free_states = list(range(max_running - 1, -1, -1)) if keeps_states else None
        self.shares_rows = shares_rows
        self.stats = stats
        self.max_running = max_running
        self.max_step_tokens = max_step_tokens
        self.queue_timeout = queue_timeout
        self.work = threading.Condition(threading.Lock())
        self.waiting: deque[Request] = deque()
        self.cancelled: set[int] = set()
        self.running: list[tuple[Request, RunningSequence]] = []
        self.pending: dict[int, int] = {}  # id(sequence) -> its last token, not yet in the cache
        self.admitting = True

    # ---- from any thread --------------------------------------------------------------------------

    def enqueue(self, request: Request) -> None:
        with self.work:
            if not self.admitting:
                raise GenerationError("the server is shutting down and admits no new requests")
            self.waiting.append(request)
            self.stats.requests_submitted += 1
            self.work.notify_all()

    def cancel(self, request_id: int) -> None:
        with self.work:
            self.cancelled.add(request_id)
            self.work.notify_all()

    def cancel_all(self) -> None:
        with self.work:
            self.cancelled.update(request.id for request in self.waiting)
            self.cancelled.update(request.id for request, _ in self.running)
            self.work.notify_all()

    def stop_admitting(self) -> None:
        with self.work:
            self.admitting = False

    def wait_for_work(self, timeout: float | None = None) -> bool:
        with self.work:
            return self.work.wait_for(self.has_work, timeout)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.cancelled)

    @property
    def tokens_stored(self) -> int:
        """Tokens whose keys and values the running sequences' blocks hold now, a shared block once."""
        size = self.pool.block_size
        held: dict[int, int] = {}  # block -> tokens it holds
        for _, sequence in list(self.running):
            table = sequence.table
            if table is not None:
                length = table.length
                for index, block in enumerate(list(table.blocks)):
                    held[block] = max(0, min(size, length - index * size))
        return sum(held.values())

    # ---- inside a step ----------------------------------------------------------------------------

    def take_cancelled(self) -> tuple[list[Request], list[tuple[Request, RunningSequence]]]:
        """The cancelled requests still waiting (out of the queue now) and the running sequences of cancelled
        requests (for the emitter to finish)."""
        with self.work:
            cancelled, self.cancelled = self.cancelled, set()
            unstarted = [request for request in self.waiting if request.id in cancelled]
            self.waiting = deque(request for request in self.waiting if request.id not in cancelled)
        return unstarted, [(request, sequence) for request, sequence in self.running if request.id in cancelled]

    def take_expired(self) -> list[Request]:
        """Requests still waiting for room after ``queue_timeout`` seconds, out of the queue."""
        if self.queue_timeout is None:
            return []
        now = time.monotonic()
        with self.work:
            expired = [request for request in self.waiting if now - request.submitted > self.queue_timeout]
            self.waiting = deque(request for request in self.waiting if request not in expired)
        return expired

    def admit(self) -> tuple[set[int], list[Request]]:
        """Move waiting requests (first come, first served) into the running batch while the pool
        can promise their blocks, the batch has room and the step's token budget lasts. Returns the
        id() of the sequences admitted now (they prefill) and the requests whose first sequence alone
        prefills, the others to be forked from it after the step (``fork``)."""
        admitted: set[int] = set()
        forking: list[Request] = []
        if self._gathering():
            return admitted, forking
        budget = self.max_step_tokens - len(self.running)
        running = len(self.running)  # sequences in the batch once the ones admitted so far are forked
        with self.work:
            while self.waiting:
                request = self.waiting[0]
                n = len(request.sequences)
                if running + n > self.max_running:
                    break
                tokens = self._reserve(request, budget, bool(admitted or self.running))
                if tokens is None:
                    break
                self.waiting.popleft()
                budget -= tokens
                running += n
                first = request.sequences[0]
                if request.block_keys is not None and n > 1:  # the others fork from the first sequence
                    forking.append(request)
                    joining = [first]
                else:
                    joining = request.sequences
                for sequence in joining:
                    if self.free_states is not None:  # running sequences never outnumber max_running rows
                        sequence.state_slot = self._row_for(request)
                    self.running.append((request, sequence))
                    admitted.add(id(sequence))
        return admitted, forking

    def _gathering(self) -> bool:
        """Whether this step admits no one, the waiting requests held back for more to join them (``gather_sources``):
        sequences are running, fewer requests wait than it asks (or than the batch has room for), and they have
        been held fewer steps in a row than it says."""
        room = self.max_running - len(self.running)
        with self.work:
            waiting = len(self.waiting)
        if (not self.running or not waiting or waiting >= min(self.gather_sources, room)
                or self.held_steps >= self.gather_sources):
            self.held_steps = 0
            return False
        self.held_steps += 1
        return True

    def _row_for(self, request: Request) -> int:
        """A joining sequence's row of the running-state layers: its request's, where the rows are shared and a
        sibling holds one already, else a free one."""
        if self.shares_rows:
            held = next((sequence.state_slot for sequence in request.sequences if sequence.state_slot >= 0), -1)
            if held >= 0:
                return held
        return self.free_states.pop()

    def _reserve(self, request: Request, budget: int, batch_busy: bool) -> int | None:
        """Promise ``request``'s blocks and give each of its joining sequences its table, returning the tokens
        its prefill computes; None (nothing reserved) when the step's ``budget`` or the pool cannot take it."""
        size, n, length = self.pool.block_size, len(request.sequences), len(request.prompt_ids)
        # The cached prefix leaves at least the prompt's last token to compute (the step needs its logits); a
        # prompt to score is computed whole (every row's logits).
        found = [] if request.block_keys is None or request.prompt_logprobs is not None else \
            self.pool.lookup(request.block_keys[: (length - 1) // size])
        shares = request.block_keys is not None and n > 1
        tokens = length - len(found) * size + (0 if shares else (n - 1) * length)
        if tokens > budget and batch_busy:
            return None
        first_blocks = request.blocks_needed - len(found)
        other_blocks = request.blocks_needed - (length // size if shares else 0)
        if not self.pool.reserve(first_blocks + (n - 1) * other_blocks, shared=found):
            return None
        first, *others = request.sequences
        first.table = BlockTable(self.pool, first_blocks, shared=found)
        for sequence in [] if shares else others:  # without prefix caching each computes the prompt
            sequence.table = BlockTable(self.pool, other_blocks)
        self.stats.prompt_tokens += length
        self.stats.prompt_tokens_computed += tokens
        self.stats.prefix_cache_hit_tokens += len(found) * size
        return tokens

    def batch(self, admitted: set[int],
              ahead: list[tuple[Request, RunningSequence]] | None = None) -> StepBatch:
        """The step's tokens: a sequence admitted now its prompt (past the cached prefix its table starts with),
        every other its last token; each table given the slots they fill. ``ahead``: a decode step over these
        sequences launched before their last tokens reached the host (``overlapped_steps``): each one's token is -1
        here, the caller has them on the device."""
        batch = StepBatch([], [], [], [], {}, [], [])
        for row, (request, sequence) in enumerate(self.running if ahead is None else ahead):
            prefill = id(sequence) in admitted
            if ahead is not None:
                tokens = [-1]
            else:
                tokens = request.prompt_ids[sequence.table.length:] if prefill else [self.pending[id(sequence)]]
            sequence.table.append(len(tokens))
            batch.tables.append(sequence.table)
            batch.counts.append(len(tokens))
            batch.input_ids.extend(tokens)
            batch.rows[id(sequence)] = row
            batch.adapters.append(request.adapter)
            batch.state_slots.append(sequence.state_slot)
            # One sequence of a request is enough to score its prompt (the first: it prefills).
            batch.scored.append(prefill and request.prompt_logprobs is not None and sequence.index == 0)
        return batch

    def register_prompts(self, admitted: set[int]) -> None:
        """Name the full prompt blocks the step just computed, so later prompts with the same prefix find them."""
        for request, sequence in self.running:
            if id(sequence) in admitted and request.block_keys is not None:
                full = len(request.block_keys)  # the table's blocks past them hold the prompt's part-filled end
                for block, key in zip(sequence.table.blocks[:full], request.block_keys, strict=True):
                    self.pool.register(block, key)

    def fork(self, forking: list[Request], rows: dict[int, int]) -> None:
        """The other sequences of each request in ``forking`` join the batch after its first, which the step
        just prefilled: its full blocks shared, its last block copied, its logits row theirs too."""
        if not forking:
            return
        if self.free_states is not None:
            raise RuntimeError("sequences keeping a running state are never forked: each prefills its prompt")
        forked = {request.id for request in forking}
        running = []
        for request, sequence in self.running:
            running.append((request, sequence))
            if request.id in forked and sequence.index == 0:
                reservation = request.blocks_needed - len(request.prompt_ids) // self.pool.block_size
                for sibling in request.sequences[1:]:
                    sibling.table = sequence.table.fork(reservation)
                    running.append((request, sibling))
                    rows[id(sibling)] = rows[id(sequence)]
        self.running = running

    def reorder_beams(self, searches: list[tuple[list[RunningSequence], list[int]]]) -> None:
        """For each search's beams and parents: beam ``i`` continues beam ``parents[i]``, taking that beam's keys and
        values (a search's beams hold as many tokens; the prompt blocks they share are the same slots, the others
        each beam's own), every search's in one copy."""
        sources, targets = [], []
        for beams, parents in searches:
            length = beams[0].table.length
            sources += [beams[parent].table.slots(0, length) for parent in parents]
            targets += [beam.table.slots(0, length) for beam in beams]
        if not sources:
            return
        sources, targets = torch.cat(sources), torch.cat(targets)
        moved = sources != targets
        if bool(moved.any()):
            self.pool.copy_slots(sources[moved], targets[moved])

    def remove(self, sequence: RunningSequence) -> None:
        """``sequence`` has finished: its blocks back to the pool, out of the running batch."""
        if sequence.table is not None:
            sequence.table.release()
        if self.free_states is not None and sequence.state_slot >= 0:
            row, sequence.state_slot = sequence.state_slot, -1
            if not any(other.state_slot == row for _, other in self.running):  # its last holder
                self.free_states.append(row)
        self.running = [(request, other) for request, other in self.running if other is not sequence]
        self.pending.pop(id(sequence), None)
