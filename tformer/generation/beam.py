"""Beam search with Hugging Face's semantics: length penalty, early stopping (True, False or
"never"), several returned sequences and their scores.

Each step, every beam's continuations are scored by summed log-probability; the best
``K = max(2, 1 + number of end ids) * num_beams`` are kept so that ``num_beams`` unfinished
ones remain even when the best all end. Candidates that end (an end id, a stop string, the
length limit) and rank among the top ``num_beams`` join the finished hypotheses with score
``sum log p / generated_length ** length_penalty``; the best ``num_beams`` finished are kept.
The search stops when no running beam can beat the worst finished one (the same heuristic
as Hugging Face's, per ``early_stopping``), when every candidate has ended, or at the limit.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from tformer.generation.run import DecodingRun
from tformer.generation.session import Session

EXCLUDED = -1.0e9  # the score that takes a candidate out of the running


def beam_search(
    session: Session,
    run: DecodingRun,
    logits: Tensor,
    num_beams: int,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    num_return_sequences: int = 1,
) -> tuple[Tensor, Tensor]:
    """Search from the prompts' last logits (B, V); the session holds B rows.

    Returns the best ``num_return_sequences`` sequences per prompt (B * R, T + new), best
    first, and their scores (B * R,).
    """
    batch = logits.shape[0]
    # A prompt whose search is over leaves the batch, so later steps compute only the others (not when
    # every step's scores are returned for every row).
    search = BeamSearch(run, batch, num_beams, length_penalty, early_stopping, retire=run.scores is None)
    session.reorder(torch.arange(batch, device=logits.device).repeat_interleave(num_beams))
    logits = logits.repeat_interleave(num_beams, dim=0)  # (A * nb, V)
    while (step := search.advance(logits)) is not None:
        session.reorder(step.parents, step.same_source)
        logits = session.extend(step.tokens.reshape(-1, 1), last_only=True)[:, -1]
    return search.result(num_return_sequences)


@dataclass
class BeamStep:
    """What one step of a search asks of the caller: row i of the next step continues row ``parents[i]`` of this
    one with ``tokens[i]``; ``same_source``: every row continues a row of its own prompt (no prompt retired)."""

    parents: Tensor  # (A' * nb,)
    tokens: Tensor  # (A' * nb,)
    same_source: bool


class BeamSearch:
    """The search over ``batch`` prompts of ``run`` (num_beams rows each, a prompt's rows together), one step at a
    time for whoever runs the model: ``advance`` takes the rows' logits and says which rows continue which with what
    token, until the search is over; ``result`` gives the best finished sequences. ``retire``: a prompt whose search
    is over leaves the rows (its finished hypotheses stored)."""

    def __init__(self, run: DecodingRun, batch: int, num_beams: int, length_penalty: float = 1.0,
                 early_stopping: bool | str = False, retire: bool = True) -> None:
        self.run, self.num_beams = run, num_beams
        self.length_penalty, self.early_stopping, self.retire = float(length_penalty), early_stopping, retire
        self.max_length = run.prompt_length + run.max_new_tokens
        device = run.sequences.device
        eos_count = 0 if run.stop.eos_ids is None else run.stop.eos_ids.numel()
        self.keep = max(2, 1 + eos_count) * num_beams  # candidates considered per prompt
        self.in_top_beams = torch.arange(self.keep, device=device) < num_beams  # (K,)
        self.results = _Results(batch, num_beams, self.max_length, run.pad_id, device)
        self.beams = _Beams.start(run.sequences[:, : run.prompt_length], num_beams, self.max_length, run.pad_id,
                                  device)
        self.length = run.prompt_length
        stop = run.stop
        # What a search must share with another for both to take a step as one batch (``advance_searches``).
        self.settings = (num_beams, self.keep, self.length_penalty, early_stopping, run.prompt_length,
                         run.max_new_tokens, None if stop.eos_ids is None else tuple(stop.eos_ids.tolist()),
                         stop.stop_strings, id(stop.tokenizer) if stop.stop_strings else None, str(device))

    def advance(self, logits: Tensor) -> BeamStep | None:
        """One step from the rows' logits (A * nb, V): the rows of the next step, or None when the search is over."""
        length = self.length
        active, device = self.beams.prompts.shape[0], logits.device
        beam_parents, over, ended = self._choose(self._log_probs(logits), [length] * active)
        if bool(over.all()) or bool(ended.all()):
            return None
        rows = (beam_parents + torch.arange(active, device=device)[:, None] * self.num_beams).flatten()
        same_source = True  # each beam continues a beam of its own prompt
        if self.retire and bool(over.any()):
            same_source = False
            beams = self.beams
            self.results.store(beams.prompts[over], beams.finished[over], beams.finished_scores[over],
                               beams.finished_lengths[over])
            staying = (~over).nonzero().squeeze(1)
            rows = rows.view(active, self.num_beams)[staying].flatten()
            self.beams = beams.select(staying)
        self.length = length + 1
        return BeamStep(rows, self.beams.running[:, :, length].reshape(-1), same_source)

    def _log_probs(self, logits: Tensor) -> Tensor:
        """The rows' log-probabilities (A * nb, V) through the run's rules, kept when the run keeps scores."""
        run = self.run
        log_probs = run.chooser.scores(torch.log_softmax(logits.float(), dim=-1), self.length - run.prompt_length)
        if run.scores is not None:
            run.scores.append(log_probs)
        return log_probs

    def _choose(self, log_probs: Tensor, lengths: list[int]) -> tuple[Tensor, Tensor, Tensor]:
        """The step's choice from the rows' log-probabilities, each prompt's beams holding ``lengths[a]`` tokens: the
        beams run on and the finished set takes in the candidates that ended. Returns each new beam's parent
        (A, nb), whether each prompt's search is over (A,), and whether every candidate of each prompt ended (A,)."""
        run, beams = self.run, self.beams
        generated = [length + 1 - run.prompt_length for length in lengths]  # tokens each candidate holds after it
        candidates = _Candidates.expand(beams, log_probs, self.keep, lengths, run)
        beam_parents = beams.run_on(candidates)
        beams.finish(candidates, self.in_top_beams, generated, self.length_penalty, self.early_stopping)
        beams.can_improve = beams.can_improve & _may_improve(
            beams.running_scores, beams.finished_scores, beams.is_finished, generated, run.max_new_tokens,
            self.length_penalty, self.early_stopping,
        )
        # A prompt is over when no running beam can beat its finished ones (or, with early_stopping=True,
        # when it has num_beams finished): nothing it holds changes after that.
        over = ~beams.can_improve[:, 0]
        if self.early_stopping is True:
            over = over | beams.is_finished.all(-1)
        return beam_parents, over, candidates.ends.all(-1)

    def result(self, num_return_sequences: int = 1) -> tuple[Tensor, Tensor]:
        """The best ``num_return_sequences`` finished sequences per prompt (B * R, T + new), best first, and their
        scores (B * R,)."""
        beams, results = self.beams, self.results
        results.store(beams.prompts, beams.finished, beams.finished_scores, beams.finished_lengths)
        batch = results.sequences.shape[0]
        sequences = results.sequences[:, :num_return_sequences].reshape(batch * num_return_sequences, self.max_length)
        generated = int(results.lengths[:, :num_return_sequences].max())
        return sequences[:, : self.run.prompt_length + generated], results.scores[:, :num_return_sequences].flatten()


def advance_searches(searches: list[BeamSearch], logits: Tensor) -> list[BeamStep | None]:
    """One step of each of several one-prompt searches (a serving engine's requests) from their rows of ``logits``
    (the searches' beams in order, nb rows each), as ``advance`` gives it. Searches with the same settings take
    their step as one batch, whatever their lengths (searches with stop strings only at one length: their text is
    read as long as the beams'): a step's many small tensor operations are paid once for all of them, not once a
    search; each search's choice is the one it would make alone."""
    steps: list[BeamStep | None] = [None] * len(searches)
    groups: dict[tuple, list[int]] = {}
    first_rows = [0]
    for index, search in enumerate(searches):
        first_rows.append(first_rows[-1] + search.num_beams)
        shares = search.beams.prompts.numel() == 1 and search.run.scores is None
        key = (search.settings, search.length if search.run.stop.stop_strings else None)
        groups.setdefault(key if shares else ("alone", index), []).append(index)
    for members in groups.values():
        if len(members) == 1:
            index = members[0]
            steps[index] = searches[index].advance(logits[first_rows[index] : first_rows[index + 1]])
            continue
        rows = [row for index in members for row in range(first_rows[index], first_rows[index + 1])]
        group_logits = logits.index_select(0, torch.tensor(rows, device=logits.device))
        for index, step in zip(members, _advance_together([searches[i] for i in members], group_logits),
                               strict=True):
            steps[index] = step
    return steps


def _advance_together(searches: list[BeamSearch], logits: Tensor) -> list[BeamStep | None]:
    """``advance`` for one-prompt searches of the same settings, as one search over their prompts."""
    first, num_beams = searches[0], searches[0].num_beams
    together = copy.copy(first)
    together.beams = _Beams(*(torch.cat([getattr(search.beams, field.name) for search in searches])
                              for field in fields(_Beams)))
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (G * nb, V)
    for position, search in enumerate(searches):
        if search.run.chooser.rules:  # no rules: the chooser's scores are the log-probabilities as they are
            rows = slice(position * num_beams, (position + 1) * num_beams)
            log_probs[rows] = search.run.chooser.scores(log_probs[rows], search.length - search.run.prompt_length)
    lengths = [search.length for search in searches]
    beam_parents, over, ended = together._choose(log_probs, lengths)
    columns = torch.tensor(lengths, device=logits.device)[:, None, None].expand(-1, num_beams, 1)
    tokens = together.beams.running.gather(2, columns).squeeze(2)  # (G, nb) each beam's new token
    parts = [field_values.split(1) for field_values in (getattr(together.beams, field.name)
                                                         for field in fields(_Beams))]
    steps: list[BeamStep | None] = []
    for position, (search, done) in enumerate(zip(searches, (over | ended).tolist(), strict=True)):
        search.beams = _Beams(*(values[position] for values in parts))
        if done:
            steps.append(None)
            continue
        search.length += 1
        steps.append(BeamStep(beam_parents[position], tokens[position], True))
    return steps


@dataclass
class _Beams:
    """The search's state, one row per prompt still searching (A of them): its running beams and its
    finished hypotheses, num_beams (nb) of each, sequences padded to max_length."""

    prompts: Tensor  # (A,) each active prompt's index in the batch
    running: Tensor  # (A, nb, max_length)
    running_scores: Tensor  # (A, nb) summed log-probabilities
    finished: Tensor  # (A, nb, max_length)
    finished_scores: Tensor  # (A, nb) length-penalised scores
    finished_lengths: Tensor  # (A, nb) generated tokens of each finished hypothesis
    is_finished: Tensor  # (A, nb) whether a finished slot is filled
    can_improve: Tensor  # (A, 1) whether a running beam may still beat the finished ones

    @classmethod
    def start(cls, prompts: Tensor, num_beams: int, max_length: int, pad_id: int, device: torch.device) -> _Beams:
        """num_beams copies of each prompt (B, T), of which only the first may expand at step one."""
        batch, prompt_length = prompts.shape
        running = torch.full((batch, num_beams, max_length), pad_id, dtype=torch.long, device=device)
        running[:, :, :prompt_length] = prompts[:, None, :]
        running_scores = torch.zeros(batch, num_beams, device=device)
        running_scores[:, 1:] = EXCLUDED  # all beams start equal: only the first may expand at step one
        return cls(
            prompts=torch.arange(batch, device=device),
            running=running,
            running_scores=running_scores,
            finished=running.clone(),
            finished_scores=torch.full((batch, num_beams), EXCLUDED, device=device),
            finished_lengths=torch.zeros(batch, num_beams, dtype=torch.long, device=device),
            is_finished=torch.zeros(batch, num_beams, dtype=torch.bool, device=device),
            can_improve=torch.ones(batch, 1, dtype=torch.bool, device=device),
        )

    def run_on(self, candidates: _Candidates) -> Tensor:
        """Keep the best unfinished candidates as the running beams; returns each one's parent beam (A, nb)."""
        num_beams = self.running.shape[1]
        running_candidate_scores = candidates.scores + candidates.ends.float() * EXCLUDED
        chosen = torch.topk(running_candidate_scores, num_beams).indices  # (A, nb)
        self.running = _gather(candidates.sequences, chosen)
        self.running_scores = _gather(running_candidate_scores, chosen)
        return _gather(candidates.parents, chosen)

    def finish(self, candidates: _Candidates, in_top_beams: Tensor, generated: list[int], length_penalty: float,
               early_stopping: bool | str) -> None:
        """Let the candidates that just ended among the top num_beams enter the finished set (the best
        num_beams of old and new stay), scored ``sum log p / generated ** length_penalty`` (``generated``: each
        prompt's candidates' new tokens)."""
        num_beams, device = self.running.shape[1], self.running.device
        just_finished = candidates.ends & in_top_beams
        scores = candidates.scores / _penalties(generated, length_penalty, device)
        scores += (self.is_finished.all(-1, keepdim=True) & (early_stopping is True)).float() * EXCLUDED
        scores += (~self.can_improve).float() * EXCLUDED
        scores += (~just_finished).float() * EXCLUDED
        merged_scores = torch.cat([self.finished_scores, scores], dim=1)
        best = torch.topk(merged_scores, num_beams).indices
        self.finished = _gather(torch.cat([self.finished, candidates.sequences], dim=1), best)
        self.finished_scores = _gather(merged_scores, best)
        new_lengths = torch.tensor(generated, device=device)[:, None].expand_as(candidates.tokens)  # (A, K)
        self.finished_lengths = _gather(torch.cat([self.finished_lengths, new_lengths], dim=1), best)
        self.is_finished = _gather(torch.cat([self.is_finished, just_finished], dim=1), best)

    def select(self, staying: Tensor) -> _Beams:
        """The state of the prompts at indices ``staying`` only (the others' searches are over)."""
        return _Beams(*(getattr(self, field.name)[staying] for field in fields(self)))


@dataclass
class _Candidates:
    """One step's K best continuations of each active prompt's beams (A, K)."""

    sequences: Tensor  # (A, K, max_length) the parent beam with the new token written at this step
    scores: Tensor  # (A, K) summed log-probabilities
    parents: Tensor  # (A, K) the beam each continues
    tokens: Tensor  # (A, K) the new token
    ends: Tensor  # (A, K) whether it ends there (an end id, a stop string, the length limit)

    @classmethod
    def expand(cls, beams: _Beams, log_probs: Tensor, keep: int, lengths: list[int], run: DecodingRun) -> _Candidates:
        """The ``keep`` best of every running beam's continuations by ``log_probs`` (A * nb, V), each written at its
        prompt's position ``lengths[a]``."""
        active, num_beams, max_length = beams.running.shape
        vocab = log_probs.shape[-1]
        totals = (log_probs.view(active, num_beams, vocab) + beams.running_scores[:, :, None]).view(active, -1)
        top_scores, top_indices = torch.topk(totals, keep)  # (A, K)
        parents, tokens = top_indices // vocab, top_indices % vocab
        sequences = _gather(beams.running, parents)
        columns = torch.tensor(lengths, device=tokens.device)  # (A,)
        sequences.scatter_(2, columns[:, None, None].expand(-1, keep, 1), tokens[:, :, None])
        row_lengths = [length + 1 for length in lengths for _ in range(keep)]
        ends = run.stop.hits_anywhere(sequences.view(active * keep, max_length), tokens.flatten(), row_lengths)
        ends = ends.view(active, keep) | (columns + 1 >= max_length)[:, None]  # the length limit ends every one
        return cls(sequences, top_scores, parents, tokens, ends)


class _Results:
    """Each prompt's finished hypotheses (sequences, scores, generated lengths), stored when its search ends."""

    def __init__(self, batch: int, num_beams: int, max_length: int, pad_id: int, device: torch.device) -> None:
        self.sequences = torch.full((batch, num_beams, max_length), pad_id, dtype=torch.long, device=device)
        self.scores = torch.full((batch, num_beams), EXCLUDED, device=device)
        self.lengths = torch.zeros(batch, num_beams, dtype=torch.long, device=device)

    def store(self, prompts: Tensor, sequences: Tensor, scores: Tensor, lengths: Tensor) -> None:
        self.sequences[prompts] = sequences
        self.scores[prompts] = scores
        self.lengths[prompts] = lengths


def _penalties(generated: list[int], length_penalty: float, device: torch.device) -> Tensor:
    """(A, 1) each prompt's ``generated ** length_penalty``, rounded once to float32 from Python's double: the
    divisor a Python number would be (Hugging Face divides by one), so the scores are the same to the bit."""
    return torch.tensor([[count**length_penalty] for count in generated], dtype=torch.float32, device=device)


def _gather(tensor: Tensor, indices: Tensor) -> Tensor:
    """Pick along dim 1 of (B, N, ...) with (B, M) indices -> (B, M, ...)."""
    while indices.dim() < tensor.dim():
        indices = indices.unsqueeze(-1)
    return torch.take_along_dim(tensor, indices, dim=1)


def _may_improve(
    running_scores: Tensor,
    finished_scores: Tensor,
    is_finished: Tensor,
    generated: list[int],
    max_new_tokens: int,
    length_penalty: float,
    early_stopping: bool | str,
) -> Tensor:
    """(B, 1): whether the best running beam could still beat the worst finished hypothesis.

    Its best reachable score is estimated at each prompt's current length (``generated``), or with
    ``early_stopping="never"`` and a positive length penalty at the longest allowed length. Unfilled slots always can.
    """
    best_lengths = ([max_new_tokens] * len(generated) if early_stopping == "never" and length_penalty > 0.0
                    else generated)
    best_running = running_scores[:, :1] / _penalties(best_lengths, length_penalty, running_scores.device)
    worst_finished = torch.where(is_finished, finished_scores.min(dim=1, keepdim=True).values, EXCLUDED)
    return (best_running > worst_finished).any(dim=-1, keepdim=True)
