"""One forward: every decoding path runs the model's own blocks, so it must agree with the full forward
for every configuration the core accepts. The configurations are enumerated from the registries, not
listed by hand, so a new value of any axis is covered the day it is added: every combination of the axes a
cache reads (positional scheme x norm position x key/value head count x attention kernel), each with one
activation (a position-wise function no cache sees), chosen in turn so that every activation meets every
value of every other axis. For each, in the decoder and the
encoder–decoder families: a cached session's logits equal the full forward's at every step of a left-
padded batch, and generation (greedy, beam search, speculative decoding) and the serving engine give
what the uncached reference gives. Kernels agree on a left-padded batch's loss and gradients, and a
decoding step runs the hooks a user registered.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import tformer
from tformer.config import NORM_POSITIONS, ConfigError, ModelConfig
from tformer.generation import GenerationConfig, GenerationError, StackSession, open_session
from tformer.nn.attention import KERNELS
from tformer.nn.feedforward import ACTIVATIONS
from tformer.nn.positions import POSITIONALS
from tformer.serving import Engine

VOCAB = 13
HEADS = 4
AXES = {"positional": POSITIONALS, "norm_position": NORM_POSITIONS, "activation": tuple(ACTIVATIONS),
        "num_kv_heads": (HEADS, HEADS // 2, 1), "attention_kernel": tuple(KERNELS)}
# What each kernel reads besides its name: a window narrower than the sequences (so the rolling cache
# forgets), few random features (tiny heads).
KERNEL_FIELDS = {"sliding_window": {"attention_window": 3}, "performer": {"performer_features": 16}}
DECODER = ModelConfig(vocab_size=VOCAB, max_seq_len=32, d_model=16, num_layers=2, num_heads=HEADS,
                      initializer_range=0.5, eos_token_id=None)
ENCODER_DECODER = DECODER.replace(architecture="encoder_decoder", num_layers=1, num_encoder_layers=1, pad_token_id=0,
                                  bos_token_id=1, decoder_start_token_id=1)


CACHED_AXES = [name for name in AXES if name != "activation"]


def enumerated_fields() -> list[dict]:
    """Every combination of the cached axes, each with the activation its value indices sum to (modulo their
    number): across any other axis's value, the sums take every residue, so every activation meets it."""
    combinations = []
    for indices in itertools.product(*(range(len(AXES[name])) for name in CACHED_AXES)):
        fields = {name: AXES[name][index] for name, index in zip(CACHED_AXES, indices, strict=True)}
        fields["activation"] = AXES["activation"][sum(indices) % len(AXES["activation"])]
        combinations.append(fields)
    return combinations


def accepted_configs(base: ModelConfig) -> tuple[list[ModelConfig], list[dict]]:
    """The enumerated configurations that the config accepts, and the ones it refuses."""
    accepted, refused = [], []
    for fields in enumerated_fields():
        fields = dict(fields)
        fields.update(KERNEL_FIELDS.get(fields["attention_kernel"], {}))
        try:
            accepted.append(base.replace(**fields))
        except ConfigError:
            refused.append(fields)
    return accepted, refused


def label(config: ModelConfig) -> str:
    return "/".join(str(getattr(config, name)) for name in AXES)


def model_for(config: ModelConfig):
    torch.manual_seed(0)
    return tformer.build_model(config).eval()


def first_difference_is_a_tie(model, prompt: torch.Tensor, got: torch.Tensor, expected: torch.Tensor,
                              step_inputs: dict | None = None) -> bool:
    """Whether greedy outputs (1, T + new) that differ part ways where the full forward's two best logits
    are within 1e-4 (rounding may pick either): a legitimate tie, not a wrong cache."""
    if torch.equal(got, expected):
        return True
    column = int((got != expected).nonzero()[0, 1])
    with torch.no_grad():
        logits = model(expected[:, :column], **(step_inputs or {})).logits[0, -1]
    best = logits.topk(2).values
    return bool(best[0] - best[1] < 1e-4)


def left_padded():
    ids = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0
    return ids, mask


# Prefill 4 columns, then a block of 3 (a speculative verification), then one at a time.
CHUNKS = [(0, 4), (4, 7), (7, 8), (8, 9), (9, 10), (10, 11)]


def session_problems(model, config) -> list[str]:
    """A StackSession's logits against the full forward, step by step, on a left-padded batch."""
    ids, mask = left_padded()
    session = StackSession(model, 2, 12, mask[:, :4])
    problems = []
    with torch.inference_mode():
        for start, end in CHUNKS:
            cached = session.extend(ids[:, start:end])
            full = model(ids[:, :end], attention_mask=mask[:, :end]).logits[:, start:end]
            real = mask[:, start:end].bool()
            error = (cached[real] - full[real]).abs().max().item()
            if error > 1e-4:
                problems.append(f"{label(config)}: session step {start}:{end} differs by {error:.2e}")
                break
    return problems


def strategy_problems(model, config) -> list[str]:
    """Greedy, beam search and speculative decoding through the session, against the uncached reference."""
    prompt = torch.randint(2, VOCAB, (1, 5), generator=torch.Generator().manual_seed(7))
    problems = []
    greedy = tformer.generate(model, prompt, 6, eos_token_id=[])
    reference = tformer.generate(model, prompt, 6, eos_token_id=[], use_cache=False)
    if not first_difference_is_a_tie(model, prompt, greedy, reference):
        problems.append(f"{label(config)}: greedy {greedy.tolist()} != uncached {reference.tolist()}")
    beams = tformer.generate(model, prompt, 4, eos_token_id=[], num_beams=2, return_dict=True)
    beams_reference = tformer.generate(model, prompt, 4, eos_token_id=[], num_beams=2, return_dict=True,
                                       use_cache=False)
    if not torch.allclose(beams.sequences_scores, beams_reference.sequences_scores, atol=1e-4):
        problems.append(f"{label(config)}: beam scores {beams.sequences_scores.tolist()} != uncached "
                        f"{beams_reference.sequences_scores.tolist()}")
    if config.attention_kernel == "performer":  # running sums cannot take back rejected drafts
        with pytest.raises(GenerationError, match="cannot forget"):
            tformer.generate(model, prompt, 6, eos_token_id=[], draft_model=model)
    else:
        draft = model_for(config.replace(num_layers=1))
        speculative = tformer.generate(model, prompt, 6, eos_token_id=[], draft_model=draft, num_draft_tokens=3)
        if not first_difference_is_a_tie(model, prompt, speculative, greedy):
            problems.append(f"{label(config)}: speculative {speculative.tolist()} != greedy {greedy.tolist()}")
    return problems


def engine_problems(model, config) -> list[str]:
    """Three requests of different lengths in the serving engine, against generate for each alone."""
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(2, VOCAB, (length,), generator=generator).tolist() for length in (3, 7, 1)]
    generation = GenerationConfig(max_new_tokens=5, eos_token_id=())
    engine = Engine(model, cache_tokens=128, block_size=4)
    problems = []
    for prompt, request in zip(prompts, engine.complete(prompts, generation), strict=True):
        alone = tformer.generate(model, torch.tensor([prompt]), generation_config=generation)
        served = torch.tensor([prompt + request.outputs()[0]])
        if not first_difference_is_a_tie(model, torch.tensor([prompt]), served, alone):
            problems.append(f"{label(config)}: engine {served.tolist()} != generate {alone.tolist()}")
    if engine.pool.blocks_in_use:
        problems.append(f"{label(config)}: the engine kept {engine.pool.blocks_in_use} blocks")
    return problems


def test_the_enumeration_covers_every_value_of_every_axis():
    accepted, refused = accepted_configs(DECODER)
    for name, values in AXES.items():
        assert {getattr(config, name) for config in accepted} == set(values), name
    # Refused: only what a kernel declares it cannot do (Performer forms no scores to add a bias to).
    assert refused and all(not KERNELS[fields["attention_kernel"]].position_bias
                           and fields["positional"] in ("alibi", "relative") for fields in refused)
    assert len(accepted) + len(refused) == len(list(itertools.product(*(AXES[name] for name in CACHED_AXES))))
    for name in CACHED_AXES:  # every activation with every value of every other axis
        pairs = {(config.activation, getattr(config, name)) for config in accepted}
        assert pairs == set(itertools.product(AXES["activation"], AXES[name])), name


@pytest.mark.slow  # minutes in all: one test per positional scheme, so parallel workers share them
@pytest.mark.parametrize("positional", POSITIONALS)
def test_every_decoder_configuration_decodes_as_its_full_forward(positional):
    problems = []
    configs = [config for config in accepted_configs(DECODER)[0] if config.positional == positional]
    for config in configs:
        model = model_for(config)
        session, _ = open_session(model, torch.zeros(1, 1, dtype=torch.long), None, 1)
        assert isinstance(session, StackSession), label(config)  # every kernel decodes on the step hook
        problems += session_problems(model, config) + strategy_problems(model, config) + engine_problems(model, config)
    assert not problems, f"{len(problems)} of {len(configs)} configurations:\n" + "\n".join(problems[:20])


@pytest.mark.slow  # minutes in all: one test per positional scheme, so parallel workers share them
@pytest.mark.parametrize("positional", POSITIONALS)
def test_every_encoder_decoder_configuration_decodes_as_its_full_forward(positional):
    source = torch.randint(2, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    source_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    problems = []
    configs = [config for config in accepted_configs(ENCODER_DECODER)[0] if config.positional == positional]
    for config in configs:
        model = model_for(config)
        with torch.inference_mode():
            session, state = open_session(model, source, source_mask, 8)
            assert isinstance(session, StackSession), label(config)
            target = torch.randint(2, VOCAB, (2, 8), generator=torch.Generator().manual_seed(9))
            target[:, 0] = config.decoder_start_token_id
            for start, end in ((0, 3), (3, 4), (4, 5), (5, 6)):
                cached = session.extend(target[:, start:end])
                full = model(source, attention_mask=source_mask, decoder_input_ids=target[:, :end]).logits
                error = (cached - full[:, start:end]).abs().max().item()
                if error > 1e-4:
                    problems.append(f"{label(config)}: session step {start}:{end} differs by {error:.2e}")
                    break
        one = source[:1]
        greedy = tformer.generate(model, one, 5)
        reference = tformer.generate(model, one, 5, use_cache=False)
        if not first_difference_is_a_tie(model, one, greedy, reference, {"input_ids": one}):
            problems.append(f"{label(config)}: greedy {greedy.tolist()} != uncached {reference.tolist()}")
        beams = tformer.generate(model, source, 4, attention_mask=source_mask, num_beams=2, return_dict=True)
        beams_reference = tformer.generate(model, source, 4, attention_mask=source_mask, num_beams=2,
                                           return_dict=True, use_cache=False)
        if not torch.allclose(beams.sequences_scores, beams_reference.sequences_scores, atol=1e-4):
            problems.append(f"{label(config)}: beam scores differ from the uncached reference")
        if config.attention_kernel != "performer":
            speculative = tformer.generate(model, one, 5, draft_model=model, num_draft_tokens=2)
            if not torch.equal(speculative, greedy):
                problems.append(f"{label(config)}: speculative {speculative.tolist()} != greedy {greedy.tolist()}")
    assert not problems, f"{len(problems)} of {len(configs)} configurations:\n" + "\n".join(problems[:20])


# ---- kernels agree where a query sees no key --------------------------------------------------------

EXACT_KERNELS = [{"attention_kernel": name} for name, kernel in KERNELS.items()
                 if kernel.exact and kernel.trains_on_cpu] + [  # flex trains on a GPU only (tests/test_cuda.py)
    {"attention_kernel": "sliding_window", "attention_window": 32}]  # a window over everything: exact


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi", "relative"])
def test_switching_the_kernel_keeps_a_left_padded_batchs_loss_and_gradients(positional):
    """Labels that reach the first real token make the last padding row's output count in the loss: every
    kernel gives such a row (which sees no key) zeros, so the loss and every gradient stay the same."""
    ids, mask = left_padded()
    labels = ids.masked_fill(mask == 0, -100)
    labels[1, 2] = ids[1, 2]  # the padding position right before the first real token predicts it
    results = {}
    for kernel in EXACT_KERNELS:
        model = model_for(DECODER.replace(positional=positional, **kernel)).train()
        loss = model(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        results[kernel["attention_kernel"]] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()})
    loss, gradients = results["sdpa"]
    for name, (other_loss, other_gradients) in results.items():
        assert abs(other_loss - loss) <= 1e-5 * abs(loss), name
        for parameter, gradient in gradients.items():
            error = (other_gradients[parameter] - gradient).norm() / gradient.norm().clamp_min(1e-12)
            assert error <= 1e-5, (name, parameter, error.item())


# ---- hooks ----------------------------------------------------------------------------------------------


def test_a_decoding_step_runs_the_hooks_a_user_registered():
    model = model_for(DECODER)
    prompt = torch.randint(2, VOCAB, (1, 4))
    plain = tformer.generate(model, prompt, 5, eos_token_id=[])
    calls = []
    handle = model.stack.blocks[1].feedforward.register_forward_hook(
        lambda module, inputs, output: calls.append(output.shape) or output * 0.0)
    try:
        steered = tformer.generate(model, prompt, 5, eos_token_id=[])
    finally:
        handle.remove()
    assert len(calls) == 5  # the prefill and four one-token steps
    assert not torch.equal(steered, plain)  # what the hook returned was used
    assert torch.equal(tformer.generate(model, prompt, 5, eos_token_id=[]), plain)  # and after it is removed


# ---- devices ---------------------------------------------------------------------------------------------

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine: the suite runs without one"))]


@pytest.mark.parametrize("device", DEVICES)
def test_generation_and_the_engine_run_on_the_models_device(device):
    """Sessions, strategies and the engine keep their tables, caches, index tensors and generators on the
    model's device, and decode there what they decode on the CPU."""
    model = model_for(DECODER.replace(positional="rope", num_kv_heads=2)).to(device)
    prompt = torch.randint(2, VOCAB, (1, 5), generator=torch.Generator().manual_seed(7)).to(device)
    greedy = tformer.generate(model, prompt, 6, eos_token_id=[])
    assert greedy.device.type == device
    assert first_difference_is_a_tie(model, prompt, greedy, tformer.generate(model, prompt, 6, eos_token_id=[],
                                                                             use_cache=False))
    sampling = GenerationConfig(max_new_tokens=6, eos_token_id=(), temperature=0.8, seed=3)
    sampled = tformer.generate(model, prompt, generation_config=sampling)
    engine = Engine(model, cache_tokens=64, block_size=4)
    assert engine.pool.keys.device.type == device
    (request,) = engine.complete([prompt[0].tolist()], sampling)
    assert request.outputs()[0] == sampled[0, 5:].tolist()  # the same draws from a generator on the device
    beams = tformer.generate(model, prompt, 4, eos_token_id=[], num_beams=2)
    assert beams.device.type == device
