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

    # Running beams and finished hypotheses, per prompt: sequences (B, nb, max_length), scores (B, nb).
    running = torch.full((batch, num_beams, max_length), run.pad_id, dtype=torch.long, device=device)
    running[:, :, :prompt_length] = run.sequences[:, None, :prompt_length]
    running_scores = torch.zeros(batch, num_beams, device=device)
    running_scores[:, 1:] = EXCLUDED  # all beams start equal: only the first may expand at step one
    finished = running.clone()
    finished_scores = torch.full((batch, num_beams), EXCLUDED, device=device)
    finished_lengths = torch.zeros(batch, num_beams, dtype=torch.long, device=device)
    is_finished = torch.zeros(batch, num_beams, dtype=torch.bool, device=device)
    can_improve = torch.ones(batch, 1, dtype=torch.bool, device=device)
    row_offsets = torch.arange(batch, device=device)[:, None] * num_beams

    session.reorder(torch.arange(batch, device=device).repeat_interleave(num_beams))
    logits = logits.repeat_interleave(num_beams, dim=0)  # (B * nb, V)
    for length in range(prompt_length, max_length):
        log_probs = run.chooser.scores(torch.log_softmax(logits.float(), dim=-1), length - prompt_length)
        if run.scores is not None:
            run.scores.append(log_probs)
        totals = (log_probs.view(batch, num_beams, vocab) + running_scores[:, :, None]).view(batch, -1)
        top_scores, top_indices = torch.topk(totals, keep)  # (B, K)
        parents, tokens = top_indices // vocab, top_indices % vocab
        candidates = _gather(running, parents)
        candidates[:, :, length] = tokens
        ends = run.stop.hits(candidates.view(batch * keep, max_length), length + 1).view(batch, keep)
        if length + 1 >= max_length:
            ends = torch.ones_like(ends)

        # The best unfinished candidates run on.
        running_candidate_scores = top_scores + ends.float() * EXCLUDED
        chosen = torch.topk(running_candidate_scores, num_beams).indices  # (B, nb)
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
        if not bool(can_improve.any()) or bool(ends.all()) or (early_stopping is True and bool(is_finished.all())):
            break
        session.reorder((beam_parents + row_offsets).flatten())
        logits = session.extend(running[:, :, length].reshape(-1, 1), last_only=True)[:, -1]

    sequences = finished[:, :num_return_sequences].reshape(batch * num_return_sequences, max_length)
    generated = int(finished_lengths[:, :num_return_sequences].max())
    return sequences[:, : prompt_length + generated], finished_scores[:, :num_return_sequences].flatten()


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
