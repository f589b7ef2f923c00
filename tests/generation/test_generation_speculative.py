"""Speculative decoding: with greedy decoding the output is the target's own greedy output token
for token; with sampling the output follows the target's distribution (a chi-square test);
the drafted and accepted tokens are counted."""

import itertools
import math

import pytest
import torch

import tformer
from tformer.generation import GenerationError


def pair(vocab_size=64, scale=0.02, shared=True):
    """A 2-layer target and a 1-layer draft over the same vocabulary: the target cut after its
    first block (so they often agree), or with ``shared=False`` an unrelated random model."""
    torch.manual_seed(1)
    target = tformer.build_model("gpt-nano", vocab_size=vocab_size, initializer_range=scale).eval()
    torch.manual_seed(2)
    draft = tformer.build_model("gpt-nano", vocab_size=vocab_size, num_layers=1, initializer_range=scale).eval()
    if shared:
        draft.load_state_dict({k: v for k, v in target.state_dict().items() if not k.startswith("stack.blocks.1.")})
    return target, draft


@pytest.mark.parametrize("num_draft_tokens", [1, 3, 6])
@pytest.mark.parametrize("prompt_length", [1, 5])
def test_speculative_greedy_output_is_the_greedy_output(num_draft_tokens, prompt_length):
    target, draft = pair(scale=0.3)
    prompt = torch.randint(0, 64, (1, prompt_length))
    greedy = tformer.generate(target, prompt, 30, eos_token_id=[])
    out = tformer.generate(target, prompt, 30, eos_token_id=[], draft_model=draft,
                           num_draft_tokens=num_draft_tokens, return_dict=True)
    assert torch.equal(out.sequences, greedy)
    assert 0 < out.accepted_draft_tokens < out.draft_tokens  # both accepting and rejecting happened


def test_speculative_greedy_keeps_end_rules_and_left_padding():
    target, draft = pair(scale=0.3)
    ids = torch.tensor([[0, 0, 7, 21, 3]])
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    free = tformer.generate(target, ids, 20, attention_mask=mask, eos_token_id=[])
    end = int(free[0, 9])
    for options in (dict(eos_token_id=end), dict(eos_token_id=end, min_new_tokens=8)):
        expected = tformer.generate(target, ids, 20, attention_mask=mask, **options)
        got = tformer.generate(target, ids, 20, attention_mask=mask, draft_model=draft, num_draft_tokens=4, **options)
        assert torch.equal(got, expected)


def test_a_draft_identical_to_the_target_is_always_accepted():
    target, _ = pair()
    out = tformer.generate(target, torch.tensor([[4, 5]]), 21, draft_model=target, num_draft_tokens=4,
                           eos_token_id=[], return_dict=True)
    assert out.acceptance_rate == 1.0 and out.draft_tokens == 16  # 4 rounds of 4 drafts + 1 token each, then 1


def chi_square_critical(dof, z=3.09):
    """Wilson-Hilferty approximation of the chi-square quantile at z standard deviations (p = 0.001)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def joint_distribution(model, prompt, new, vocab, temperature):
    """Exact probability of each continuation of ``new`` tokens, by enumeration: (vocab ** new,)."""
    continuations = torch.tensor(list(itertools.product(range(vocab), repeat=new)))
    sequences = torch.cat([prompt.expand(len(continuations), -1), continuations], 1)
    with torch.no_grad():
        log_probs = (model(sequences).logits[:, prompt.shape[1] - 1 : -1] / temperature).log_softmax(-1)
    return log_probs.gather(-1, continuations[:, :, None]).sum((1, 2)).exp()


@pytest.mark.slow  # over 2 s
def test_speculative_sampling_follows_the_target_distribution():
    """2000 sequences of 3 tokens over a vocabulary of 5 (125 outcomes), 2 drafts per round, so
    tokens come from accepted drafts, from the residual after a rejection and from the bonus
    draw. Outcomes expected fewer than 5 times are pooled; the chi-square statistic must stay
    below its 0.1% critical value. A sampler that followed the draft instead would exceed it
    many times over (checked below on the exact distributions), so the test has power."""
    vocab, new, draws, temperature = 5, 3, 2000, 1.3
    target, draft = pair(vocab_size=vocab, scale=0.6, shared=False)
    prompt = torch.tensor([[1, 3]])
    p = joint_distribution(target, prompt, new, vocab, temperature)
    q = joint_distribution(draft, prompt, new, vocab, temperature)

    counts = torch.zeros(vocab**new)
    accepted = drafted = 0
    for seed in range(draws):
        out = tformer.generate(target, prompt, new, temperature=temperature, seed=seed, eos_token_id=[],
                               draft_model=draft, num_draft_tokens=2, return_dict=True)
        tokens = out.sequences[0, 2:].tolist()
        counts[sum(t * vocab ** (new - 1 - i) for i, t in enumerate(tokens))] += 1
        accepted, drafted = accepted + out.accepted_draft_tokens, drafted + out.draft_tokens
    assert 0.1 < accepted / drafted < 0.95

    def statistic(observed, expected_probabilities):
        expected = draws * expected_probabilities
        small = expected < 5
        observed = torch.cat([observed[~small], observed[small].sum()[None]])
        expected_pooled = torch.cat([expected[~small], expected[small].sum()[None]])
        return float(((observed - expected_pooled) ** 2 / expected_pooled).sum()), len(expected_pooled) - 1

    chi2, dof = statistic(counts, p)
    assert chi2 < chi_square_critical(dof), f"chi2={chi2:.1f} with {dof} degrees of freedom"
    following_the_draft, _ = statistic(draws * q, p)
    assert following_the_draft > 5 * chi_square_critical(dof)


@pytest.mark.parametrize("arguments, message", [
    (dict(input_ids=torch.tensor([[1, 2], [3, 4]])), "takes one sequence at a time; got batch size 2"),
    (dict(num_beams=2), "cannot be combined with num_beams > 1"),
    (dict(num_draft_tokens=0), "num_draft_tokens=0 must be an integer >= 1"),
    (dict(draft_model=tformer.build_model("gpt-nano", vocab_size=65)), "draft_model has vocab_size=65"),
    (dict(use_cache=False), "needs use_cache=True"),
])
def test_speculative_argument_errors(arguments, message):
    target, draft = pair()
    arguments = {"input_ids": torch.tensor([[1, 2]]), "draft_model": draft, **arguments}
    with pytest.raises(GenerationError, match=message):
        tformer.generate(target, max_new_tokens=4, **arguments)
