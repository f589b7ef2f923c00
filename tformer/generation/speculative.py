"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a small draft model proposes
``k`` tokens one by one, the target model scores all of them in one forward pass, and the
longest acceptable prefix is kept plus one token from the target.

Greedy: a draft token is accepted when it is the target's argmax at its position, so the
output is token for token the target's own greedy output. Sampling: draft token d drawn
from the draft's distribution q is accepted with probability min(1, p(d) / q(d)), p being
the target's; on rejection the token is drawn from normalize(max(0, p - q)); after k
acceptances one more comes from p. Each emitted token is then distributed exactly as p.
Both p and q are the processed distributions (min-length, temperature, top-k, top-p).

Both models keep every committed token in their caches except the newest, which is fed
with the next round's drafts, so a round costs ``k`` draft steps and one target pass.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from tformer.generation.run import DecodingRun
from tformer.generation.session import Session


def speculative_decode(
    target: Session, draft: Session, run: DecodingRun, num_draft_tokens: int
) -> Iterator[Tensor]:
    """Decode one sequence (batch size 1); yield each round's committed tokens (1, n)."""
    chooser, generator = run.chooser, run.generator
    prompt = run.sequences[:, : run.prompt_length]
    if run.prompt_length > 1:
        target.extend(prompt[:, :-1], last_only=True)
        draft.extend(prompt[:, :-1], last_only=True)
    target_pending = draft_pending = prompt[:, -1:]  # committed tokens each model has yet to see

    while run.remaining > 0:
        k = min(num_draft_tokens, run.remaining - 1)
        drafts: list[Tensor] = []  # (1,) each
        draft_probabilities: list[Tensor] = []  # (1, V) each, sampling only
        feed = draft_pending
        for i in range(k):
            scores = chooser.scores(draft.extend(feed, last_only=True)[:, -1], run.generated + i)
            token = chooser.choose(scores, generator)
            drafts.append(token)
            if chooser.do_sample:
                draft_probabilities.append(scores.softmax(-1))
            feed = token[:, None]

        verify = torch.cat([target_pending, *(d[:, None] for d in drafts)], dim=1)  # (1, k + 1)
        target_scores = chooser.scores(target.extend(verify)[0], run.generated, consecutive=True)  # (k + 1, V)
        if chooser.do_sample:
            accepted, new_token = _accept_sampled(drafts, draft_probabilities, target_scores, generator)
        else:
            accepted, new_token = _accept_greedy(drafts, target_scores)
        run.draft_tokens += k
        run.accepted_draft_tokens += accepted

        # Forget rejected drafts; the new token is pending for both models.
        target.truncate(target.length - (k - accepted))
        if k and accepted == k:
            draft_pending = torch.stack([drafts[-1], new_token], dim=1)  # the draft never saw its last one
        else:
            draft.truncate(draft.length - max(k - 1 - accepted, 0))
            draft_pending = new_token[:, None] if k else torch.cat([draft_pending, new_token[:, None]], dim=1)
        target_pending = new_token[:, None]

        committed = [*drafts[:accepted], new_token]
        start = run.length
        finished = False
        for i, token in enumerate(committed):
            run.sequences[:, run.length] = token
            run.length += 1
            if run.scores is not None:
                run.scores.append(target_scores[i : i + 1])
            if run.stop.active and bool(run.stop.hits(run.sequences, run.length)[0]):
                finished = True
                break
        yield run.sequences[:, start : run.length]
        if finished:
            return


def _accept_greedy(drafts: list[Tensor], target_scores: Tensor) -> tuple[int, Tensor]:
    """Accept drafts while they are the target's argmax; the target's argmax follows."""
    choices = target_scores.argmax(-1)  # (k + 1,)
    if drafts:
        matches = (torch.cat(drafts) == choices[:-1]).long()
        accepted = int(matches.cumprod(0).sum())
    else:
        accepted = 0
    return accepted, choices[accepted : accepted + 1]


def _accept_sampled(
    drafts: list[Tensor],
    draft_probabilities: list[Tensor],
    target_scores: Tensor,
    generator: torch.Generator | None,
) -> tuple[int, Tensor]:
    """The accept / reject rule: keep draft d with probability min(1, p(d) / q(d)); on the first
    rejection draw from normalize(max(0, p - q)); after k acceptances draw from p."""
    device = target_scores[0].device
    for i, (token, q) in enumerate(zip(drafts, draft_probabilities, strict=True)):
        p = target_scores[i : i + 1].softmax(-1)  # (1, V)
        u = torch.rand(1, generator=generator, device=device)
        if bool(u * q[0, token] < p[0, token]):
            continue
        residual = (p - q).clamp(min=0)
        total = residual.sum()
        weights = residual / total if bool(total > 0) else p
        return i, torch.multinomial(weights, 1, generator=generator)[:, 0]
    bonus = target_scores[len(drafts) :].softmax(-1)
    return len(drafts), torch.multinomial(bonus, 1, generator=generator)[:, 0]
