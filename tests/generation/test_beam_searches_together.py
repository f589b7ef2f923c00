"""Several one-prompt beam searches advanced together (the serving engine's requests): each search's steps and
result equal the ones it takes alone, whether it shares its steps with others (at another length, with rules of
its own) or not (other settings)."""

import torch

from tformer.generation.beam import BeamSearch, advance_searches
from tformer.generation.run import DecodingRun
from tformer.generation.sampling import TokenChooser
from tformer.generation.settings import GenerationConfig

VOCAB, END = 40, 3


class ModelConfig:
    vocab_size, eos_token_id, pad_token_id, bos_token_id = VOCAB, END, 0, 1


def search(seed: int, num_beams: int = 3, **options) -> BeamSearch:
    config = GenerationConfig(max_new_tokens=7, num_beams=num_beams, eos_token_id=END, pad_token_id=0, **options)
    chooser = TokenChooser.from_config(config, ModelConfig)
    prompt = torch.tensor([[1, 5 + seed % 7, 9]])
    run = DecodingRun.start(prompt, config, ModelConfig, chooser)
    return BeamSearch(run, 1, num_beams, config.length_penalty, config.early_stopping, retire=False)


def logits_for(seed: int, step: int, rows: int) -> torch.Tensor:
    """Each search's own logits at each step, the end id likely enough that some hypotheses end early."""
    generator = torch.Generator().manual_seed(1000 * seed + step)
    logits = torch.randn(rows, VOCAB, generator=generator) * 3
    logits[:, END] += 4.0
    return logits


def alone(seed: int, **options) -> tuple[list, torch.Tensor]:
    one, steps, step = search(seed, **options), [], 0
    while (taken := one.advance(logits_for(seed, step, one.num_beams))) is not None:
        steps.append((taken.parents.tolist(), taken.tokens.tolist()))
        step += 1
    return steps, one.result(1)[0]


def test_searches_advanced_together_take_the_steps_each_takes_alone():
    # Six searches, each joining at its ``start``: five share their steps (two join later, so their lengths differ
    # from the others'; one has a rule of its own, min_new_tokens), one has another length penalty (alone).
    plans = [(0, 0, {}), (1, 0, {}), (2, 2, {}), (3, 2, {}), (4, 0, {"min_new_tokens": 4}),
             (5, 1, {"length_penalty": 0.5})]
    running: dict[int, tuple[BeamSearch, int]] = {}
    taken: dict[int, list] = {seed: [] for seed, _, _ in plans}
    results, engine_step = {}, 0
    while len(results) < len(plans):
        for seed, start, options in plans:
            if start == engine_step:
                running[seed] = (search(seed, **options), 0)
        order = sorted(running)
        logits = torch.cat([logits_for(seed, running[seed][1], running[seed][0].num_beams) for seed in order])
        for seed, step in zip(order, advance_searches([running[seed][0] for seed in order], logits), strict=True):
            searching, count = running[seed]
            if step is None:
                results[seed] = searching.result(1)[0]
                del running[seed]
                continue
            taken[seed].append((step.parents.tolist(), step.tokens.tolist()))
            running[seed] = (searching, count + 1)
        engine_step += 1
    for seed, _, options in plans:
        steps, result = alone(seed, **options)
        assert taken[seed] == steps, seed
        assert torch.equal(results[seed], result), seed
