"""What a step's logits become in the engine: each running sequence's next token, chosen by the request's
``TokenChooser`` (the one ``generate`` uses, so a request alone decodes what ``generate`` would), its text (the
``IncrementalDetokenizer``, stop strings included), its end (end id, stop string, length), the log-probabilities
a request asked for, and the ``TokenEvent`` each listener receives; a finished sequence leaves the scheduler's
batch at once."""

from __future__ import annotations

import time

import torch
from torch import Tensor

from tformer.generation.beam import advance_searches
from tformer.generation.rules import apply_grammar_masks
from tformer.serving.requests import Request, RunningSequence
from tformer.serving.scheduler import Scheduler
from tformer.serving.wire import EngineStats, PromptLogprobs, TokenEvent

PROMPT_ROWS_AT_ONCE = 256  # prompt rows turned into float32 log-probabilities at a time (bounds the copy)


class Emitter:
    """Turns a step's logits into tokens, text and events (see the module's docstring)."""

    def __init__(self, scheduler: Scheduler, stats: EngineStats) -> None:
        self.scheduler = scheduler
        self.stats = stats

    def score_prompts(self, logits: Tensor, counts: list[int], scored: list[bool]) -> Tensor:
        """Score the prompts of the ``scored`` sequences from their rows of ``logits`` (K, V) (every prompt row;
        one row for the others), for every sequence of their requests; each sequence's last row (S, V). A scored
        prompt must be prefilled whole in this step: a prompt whose keys came from elsewhere has no logits."""
        last_rows, start = [], 0
        for (request, _), count, whole in zip(self.scheduler.running, counts, scored, strict=True):
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

    def sample(self, logits: Tensor, rows: dict[int, int]) -> None:
        """Choose each running sequence's next token from its row of ``logits`` (S, V) (``rows``: id() of a
        sequence -> its row) and hand it out: one argmax over the sequences whose choice is the plain argmax,
        the chooser one by one for the others. A sequence that only scores its prompt (``max_new_tokens`` 0)
        finishes without a token."""
        running = list(self.scheduler.running)
        scoring_only = {index for index, (request, _) in enumerate(running) if request.config.max_new_tokens == 0}
        searches: dict[int, tuple[Request, list[RunningSequence]]] = {}  # a beam search's request -> its beams
        for request, sequence in running:
            if request.search is not None:
                searches.setdefault(request.id, (request, []))[1].append(sequence)
        plain = [index for index, (request, sequence) in enumerate(running)
                 if index not in scoring_only and request.search is None
                 and not request.chooser.alters(len(sequence.output_ids))]
        tokens: dict[int, int] = {}
        if plain:
            plain_rows = torch.tensor([rows[id(running[index][1])] for index in plain], device=logits.device)
            tokens = dict(zip(plain, logits.index_select(0, plain_rows).argmax(-1).tolist(), strict=True))
        tokens.update(self._constrained_argmax(running, logits, rows, {*plain, *scoring_only}))
        self._advance_searches([(request, sorted(beams, key=lambda beam: beam.index))
                                for request, beams in searches.values()], logits, rows)
        for index, (request, sequence) in enumerate(running):
            if index in scoring_only:
                self.finish(request, sequence, "length")
                continue
            if request.search is not None:
                continue
            row = rows[id(sequence)]
            if index not in tokens:
                chooser = request.chooser
                history = (torch.tensor([request.prompt_ids + sequence.output_ids], device=logits.device)
                           if chooser.reads_history else None)  # a repetition penalty reads the tokens so far
                scores = chooser.scores(logits[row : row + 1], len(sequence.output_ids), history=history)
                tokens[index] = int(chooser.choose(scores, sequence.generator))
            self.accept(request, sequence, tokens[index], logits[row] if request.logprobs is not None else None)

    def _constrained_argmax(self, running: list[tuple[Request, RunningSequence]], logits: Tensor,
                            rows: dict[int, int], chosen: set[int]) -> dict[int, int]:
        """The greedy tokens of the running sequences (by index, ``chosen`` aside) whose only rule this step is a
        constraint (``TokenChooser.constraint_only``): each one's grammar mask, then one masked argmax over their
        rows; what its chooser would pick, at a fraction of the cost of one chooser call a sequence."""
        rules = {}
        for index, (request, sequence) in enumerate(running):
            if index not in chosen and request.search is None:
                rule = request.chooser.constraint_only(len(sequence.output_ids))
                if rule is not None:
                    rules[index] = rule
        if not rules:
            return {}
        masks = [rule.mask_after(tuple(running[index][1].output_ids)) for index, rule in rules.items()]
        picked = torch.tensor([rows[id(running[index][1])] for index in rules], device=logits.device)
        scores = apply_grammar_masks(logits.index_select(0, picked).float(), masks)
        return dict(zip(rules, scores.argmax(-1).tolist(), strict=True))

    def _advance_searches(self, searches: list[tuple[Request, list[RunningSequence]]], logits: Tensor,
                          rows: dict[int, int]) -> None:
        """One step of each request's beam search from its beams' rows of ``logits`` (the searches that can share a
        step take it together): each beam takes over its parent's tokens and adds its own, or, the search over, the
        best hypothesis is handed out as the first sequence's."""
        if not searches:
            return
        beam_rows = torch.tensor([rows[id(beam)] for _, beams in searches for beam in beams], device=logits.device)
        steps = advance_searches([request.search for request, _ in searches], logits.index_select(0, beam_rows))
        moves = []
        for (request, beams), step in zip(searches, steps, strict=True):
            if step is None:
                self._hand_out_best(request, beams)
                continue
            moves.append((beams, step.parents.tolist()))
            for beam, token in zip(beams, step.tokens.tolist(), strict=True):
                self.scheduler.pending[id(beam)] = token
        self.scheduler.reorder_beams(moves)

    def _hand_out_best(self, request: Request, beams: list[RunningSequence]) -> None:
        """The search is over: its best hypothesis's tokens become the first beam's, with their events; the other
        beams end without any."""
        best, _ = request.search.result(1)  # (1, prompt + generated)
        first = beams[0]
        for token in best[0, request.search.run.prompt_length:].tolist():
            self.accept(request, first, token, None)
            if first.finish_reason is not None:
                break
        if first.finish_reason is None:  # a hypothesis ended by a stop string its text had not shown yet
            self.finish(request, first, "stop")
        for beam in beams[1:]:
            self.finish(request, beam, first.finish_reason, emit=False)
        self.close(request)

    def accept(self, request: Request, sequence: RunningSequence, token: int, logits: Tensor | None) -> None:
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
        self.scheduler.pending[id(sequence)] = token
        event = TokenEvent(request, sequence.index, token, text, logprob, top, finish,
                           sequence.take_prompt_logprobs())
        if finish is not None:
            self.finish(request, sequence, finish, emit=False)
        send(event)
        if finish is not None and request.finished:  # only this sequence's end can have finished the request
            self.close(request)

    def finish(self, request: Request, sequence: RunningSequence, reason: str, emit: bool = True) -> None:
        """End ``sequence`` (its blocks back to the pool, out of the running batch), with its last event unless
        the caller sends one."""
        sequence.finish_reason = reason
        self.scheduler.remove(sequence)
        if emit:
            if sequence.index < request.answers:  # a beam search's other beams have no events
                send(TokenEvent(request, sequence.index, -1, "", finish_reason=reason,
                                prompt_logprobs=sequence.take_prompt_logprobs()))
            if request.finished:
                self.close(request)

    def finish_unstarted(self, request: Request, reason: str) -> None:
        """End a request that never ran (cancelled or timed out while waiting): one last event a sequence."""
        for sequence in request.sequences:
            sequence.finish_reason = reason
            if sequence.index < request.answers:
                send(TokenEvent(request, sequence.index, -1, "", finish_reason=reason))
        self.close(request)

    def close(self, request: Request) -> None:
        """Count ``request``'s end once and wake whoever waits on it."""
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


def send(event: TokenEvent) -> None:
    """Hand ``event`` to its request's listener (on the engine's thread)."""
    if event.request.on_event is not None:
        event.request.on_event(event)


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
