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
    batch, vocab = logits.shape
    prompt_length, max_length = run.prompt_length, run.prompt_length + run.max_new_tokens
    device = logits.device
    eos_count = 0 if run.stop.eos_ids is None else run.stop.eos_ids.numel()
    keep = max(2, 1 + eos_count) * num_beams  # candidates considered per prompt
    in_top_beams = torch.arange(keep, device=device) < num_beams  # (K,)
    # A prompt whose search is over leaves the batch, so later steps compute only the others (not when
    # every step's scores are returned for every row).
    retire = run.scores is None
    prompts = torch.arange(batch, device=device)  # each active prompt's index in the batch
    results = _Results(batch, num_beams, max_length, run.pad_id, device)

    # Running beams and finished hypotheses, per active prompt: sequences (A, nb, max_length), scores (A, nb).
    running = torch.full((batch, num_beams, max_length), run.pad_id, dtype=torch.long, device=device)
    running[:, :, :prompt_length] = run.sequences[:, None, :prompt_length]
    running_scores = torch.zeros(batch, num_beams, device=device)
    running_scores[:, 1:] = EXCLUDED  # all beams start equal: only the first may expand at step one
    finished = running.clone()
    finished_scores = torch.full((batch, num_beams), EXCLUDED, device=device)
    finished_lengths = torch.zeros(batch, num_beams, dtype=torch.long, device=device)
    is_finished = torch.zeros(batch, num_beams, dtype=torch.bool, device=device)
    can_improve = torch.ones(batch, 1, dtype=torch.bool, device=device)

    session.reorder(torch.arange(batch, device=device).repeat_interleave(num_beams))
    logits = logits.repeat_interleave(num_beams, dim=0)  # (A * nb, V)
    for length in range(prompt_length, max_length):
        active = prompts.shape[0]
        log_probs = run.chooser.scores(torch.log_softmax(logits.float(), dim=-1), length - prompt_length)
        if run.scores is not None:
            run.scores.append(log_probs)
        totals = (log_probs.view(active, num_beams, vocab) + running_scores[:, :, None]).view(active, -1)
        top_scores, top_indices = torch.topk(totals, keep)  # (A, K)
        parents, tokens = top_indices // vocab, top_indices % vocab
        candidates = _gather(running, parents)
        candidates[:, :, length] = tokens
        ends = run.stop.hits_anywhere(candidates.view(active * keep, max_length), length + 1).view(active, keep)
        if length + 1 >= max_length:
            ends = torch.ones_like(ends)

        # The best unfinished candidates run on.
        running_candidate_scores = top_scores + ends.float() * EXCLUDED
        chosen = torch.topk(running_candidate_scores, num_beams).indices  # (A, nb)
        running = _gather(candidates, chosen)
        running_scores = _gather(running_candidate_scores, chosen)
        beam_parents = _gather(parents, chosen)

        # Candidates that just ended among the top num_beams may enter the finished set.
        just_finished = ends & in_top_beams
        scores = top_scores / ((length + 1 - prompt_length) ** length_penalty)
        scores += (is_finished.all(-1, keepdim=True) & (early_stopping is True)).float() * EXCLUDED
        scores += (~can_improve).float() * EXCLUDED
        scores += (~just_finished).float() * EXCLUDED
        merged_scores = torch.cat([finished_scores, scores], dim=1)
        best = torch.topk(merged_scores, num_beams).indices
        finished = _gather(torch.cat([finished, candidates], dim=1), best)
        finished_scores = _gather(merged_scores, best)
        finished_lengths = _gather(
            torch.cat([finished_lengths, torch.full_like(tokens, length + 1 - prompt_length)], dim=1), best
        )
        is_finished = _gather(torch.cat([is_finished, just_finished], dim=1), best)

        can_improve = can_improve & _may_improve(
            running_scores, finished_scores, is_finished, length + 1 - prompt_length, run.max_new_tokens,
            length_penalty, early_stopping,
        )
        # A prompt is over when no running beam can beat its finished ones (or, with early_stopping=True,
        # when it has num_beams finished): nothing it holds changes after that.
        over = ~can_improve[:, 0]
        if early_stopping is True:
            over = over | is_finished.all(-1)
        if bool(over.all()) or bool(ends.all()):
            break
        rows = (beam_parents + torch.arange(active, device=device)[:, None] * num_beams).flatten()
        same_source = True  # each beam continues a beam of its own prompt
        if retire and bool(over.any()):
            same_source = False
            results.store(prompts[over], finished[over], finished_scores[over], finished_lengths[over])
            staying = (~over).nonzero().squeeze(1)
            rows = rows.view(active, num_beams)[staying].flatten()
            prompts, running, running_scores, can_improve = (
                prompts[staying], running[staying], running_scores[staying], can_improve[staying])
            finished, finished_scores = finished[staying], finished_scores[staying]
            finished_lengths, is_finished = finished_lengths[staying], is_finished[staying]
        session.reorder(rows, same_source)
        logits = session.extend(running[:, :, length].reshape(-1, 1), last_only=True)[:, -1]

    results.store(prompts, finished, finished_scores, finished_lengths)
    sequences = results.sequences[:, :num_return_sequences].reshape(batch * num_return_sequences, max_length)
    generated = int(results.lengths[:, :num_return_sequences].max())
    return sequences[:, : prompt_length + generated], results.scores[:, :num_return_sequences].flatten()


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


def _gather(tensor: Tensor, indices: Tensor) -> Tensor:
    """Pick along dim 1 of (B, N, ...) with (B, M) indices -> (B, M, ...)."""
    while indices.dim() < tensor.dim():
        indices = indices.unsqueeze(-1)
    return torch.take_along_dim(tensor, indices, dim=1)


def _may_improve(
    running_scores: Tensor,
    finished_scores: Tensor,
    is_finished: Tensor,
    generated: int,
    max_new_tokens: int,
    length_penalty: float,
    early_stopping: bool | str,
) -> Tensor:
    """(B, 1): whether the best running beam could still beat the worst finished hypothesis.

    Its best reachable score is estimated at the current length, or with ``early_stopping="never"``
    and a positive length penalty at the longest allowed length. Unfilled slots always can.
    """
    best_length = max_new_tokens if early_stopping == "never" and length_penalty > 0.0 else generated
    best_running = running_scores[:, :1] / (best_length**length_penalty)
    worst_finished = torch.where(is_finished, finished_scores.min(dim=1, keepdim=True).values, EXCLUDED)
    return (best_running > worst_finished).any(dim=-1, keepdim=True)
