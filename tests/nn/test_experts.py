"""The mixture-of-experts feed-forward (nn/experts.py): grouped dispatch equals the definition (every expert on
every token, weighted by the routing), only chosen experts run, the config's expert fields are checked by name,
parameter estimates count experts, decoding with a cache equals full passes, and training adds the
load-balancing loss. Hugging Face parity lives in tests/interop/test_interop_moe.py."""

import copy

import pytest
import torch
import torch.nn.functional as F

import tformer
from tformer.config import ConfigError
from tformer.data.lm import random_crops
from tformer.generation import GenerationConfig
from tformer.nn.experts import (
    MixtureOfExperts,
    auxiliary_loss,
    load_balancing_loss,
    mixtures,
    recording_router_logits,
    route,
    router_logits,
)
from tformer.nn.stack import LAYOUT_FIELDS
from tformer.quantization import quantize
from tformer.serving import Engine
from tformer.training.config import TrainingConfig
from tformer.training.tasks import LanguageModelling
from tformer.training.trainer import Trainer

MOE = dict(vocab_size=40, max_seq_len=32, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, activation="swiglu",
           norm="rmsnorm", positional="rope", bias=False, num_experts=4, moe_d_ff=12)


def dense_reference(mixture: MixtureOfExperts, rows: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, weighted by the routing (0 for experts not chosen): the definition."""
    weights, chosen = route(mixture.router(rows), mixture.top_k, mixture.normalize)
    dense = torch.zeros(rows.shape[0], mixture.num_experts).scatter(1, chosen, weights)  # (N, E)
    outputs = torch.stack([expert(rows) for expert in mixture.experts], dim=1)  # (N, E, D)
    out = (outputs * dense[..., None]).sum(dim=1)
    if mixture.shared_expert is not None:
        shared = mixture.shared_expert(rows)
        out = out + (torch.sigmoid(mixture.shared_expert_gate(rows)) * shared if mixture.shared_expert_gate else shared)
    return out


@pytest.mark.parametrize("experts, top_k, normalize, shared, gate", [
    (4, 1, True, 0, False), (4, 2, True, 0, False), (8, 2, False, 0, False), (8, 3, False, 6, True),
    (4, 4, True, 6, False),
])
def test_grouped_dispatch_equals_every_expert_weighted_by_the_routing(experts, top_k, normalize, shared, gate):
    torch.manual_seed(0)
    mixture = MixtureOfExperts(16, 12, experts, top_k, "swiglu", normalize=normalize, shared_d_ff=shared,
                               shared_gate=gate).eval()
    x = torch.randn(3, 7, 16)
    with torch.no_grad():
        out = mixture(x)
        assert out.shape == x.shape
        torch.testing.assert_close(out.reshape(-1, 16), dense_reference(mixture, x.reshape(-1, 16)),
                                   atol=1e-6, rtol=1e-5)


def test_routing_weights_sum_to_one_only_when_renormalised():
    logits = torch.randn(5, 8)
    weights, chosen = route(logits, 2, normalize=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(5))
    plain, same = route(logits, 2, normalize=False)
    assert torch.equal(chosen, same) and (plain.sum(-1) < 1).all()
    torch.testing.assert_close(plain, F.softmax(logits, -1).gather(1, chosen))


def test_only_the_chosen_experts_run_each_once_over_their_tokens():
    torch.manual_seed(0)
    mixture = MixtureOfExperts(16, 12, 4, 1, "swiglu").eval()
    with torch.no_grad():
        mixture.router.weight.zero_()
        mixture.router.weight[2, 0] = 10.0  # feature 0 > 0 sends a token to expert 2, < 0 to expert 1
        mixture.router.weight[1, 0] = -10.0
    calls: dict[int, list[int]] = {}
    for index, expert in enumerate(mixture.experts):
        expert.register_forward_hook(lambda module, args, out, index=index: calls.setdefault(index, []).append(
            args[0].shape[0]))
    x = torch.randn(10, 16)
    x[:6, 0] = x[:6, 0].abs() + 0.1
    x[6:, 0] = -x[6:, 0].abs() - 0.1
    with torch.no_grad():
        mixture(x)
    assert calls == {1: [4], 2: [6]}  # experts 0 and 3 never run


@pytest.mark.parametrize("changes, message", [
    ({"num_experts": 0, "moe_d_ff": 8}, "moe_d_ff=8 is read only by a mixture of experts"),
    ({"num_experts": 0, "moe_d_ff": None, "norm_topk_prob": False}, "norm_topk_prob=False is read only by a mixture"),
    ({"num_experts": -1}, "num_experts=-1 must be an integer >= 0"),
    ({"num_experts_per_token": 5}, "num_experts_per_token=5 must be at most num_experts=4"),
    ({"num_experts_per_token": 0}, "num_experts_per_token=0 must be a positive integer"),
    ({"shared_expert_gate": True}, "shared_expert_gate=True gates a shared expert"),
    ({"router_aux_loss_coef": -0.1}, "router_aux_loss_coef=-0.1 must be a finite number >= 0"),
])
def test_expert_fields_are_checked_by_name(changes, message):
    with pytest.raises(ConfigError, match=message):
        tformer.ModelConfig(**{**MOE, **changes})


def test_expert_width_derives_from_d_ff_and_round_trips():
    config = tformer.ModelConfig(**{**MOE, "moe_d_ff": None, "d_ff": 24})
    assert config.moe_d_ff == 24
    assert config.replace(d_ff=32).moe_d_ff == 32  # derived, so it follows
    assert tformer.ModelConfig.from_json(config.to_json()) == config
    assert tformer.ModelConfig(**MOE).replace(d_ff=32).moe_d_ff == 12  # set, so it stays


def test_every_expert_field_is_a_layout_field():
    assert {"num_experts", "num_experts_per_token", "moe_d_ff", "norm_topk_prob", "shared_expert_d_ff",
            "shared_expert_gate", "router_aux_loss_coef"} <= LAYOUT_FIELDS


@pytest.mark.parametrize("changes", [{}, {"shared_expert_d_ff": 10, "shared_expert_gate": True},
                                     {"activation": "gelu", "shared_expert_d_ff": 6}])
def test_parameter_estimate_counts_router_experts_and_shared_expert(changes):
    model = tformer.build_model(tformer.ModelConfig(**{**MOE, **changes}))
    counted = sum(parameter.numel() for name, parameter in model.named_parameters() if "norm" not in name)
    assert model.estimated_parameters(model.config) == counted


def test_cached_decoding_equals_full_passes_on_a_left_padded_batch():
    torch.manual_seed(0)
    model = tformer.build_model(tformer.ModelConfig(**{**MOE, "num_experts_per_token": 2, "shared_expert_d_ff": 8,
                                                       "shared_expert_gate": True}))
    assert model.step_problem() is None  # decodes on the stack's own layout (and the engine serves it)
    prompt = torch.randint(1, 40, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(prompt)
    mask[0, :2] = 0
    cached = tformer.generate(model, prompt, 6, attention_mask=mask, pad_token_id=0)
    assert torch.equal(cached, tformer.generate(model, prompt, 6, attention_mask=mask, pad_token_id=0,
                                                use_cache=False))


def test_router_logits_are_kept_in_training_or_when_recorded():
    torch.manual_seed(0)
    model = tformer.build_model(tformer.ModelConfig(**MOE)).eval()
    ids = torch.randint(0, 40, (2, 6))
    model(ids)
    assert router_logits(model) == ()  # evaluation keeps none
    with recording_router_logits(model):
        model(ids)
    kept = router_logits(model)
    assert len(kept) == 2 and kept[0].shape == (12, 4)
    model.train()(ids)  # training with a coefficient keeps them, with their graph: copies drop them
    assert len(router_logits(model)) == 2 and router_logits(model)[0].requires_grad
    assert router_logits(copy.deepcopy(model)) == ()


def test_load_balancing_loss_is_one_when_perfectly_balanced_and_masks_padding():
    uniform = [torch.zeros(8, 4)]  # equal probabilities: topk picks experts 0 and 1 for every token
    assert load_balancing_loss(uniform, 4, 2).item() == pytest.approx(2.0)  # E * sum_e f_e P_e = 4 * (2 * 1/4)
    logits = torch.randn(6, 4)
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    torch.testing.assert_close(load_balancing_loss([logits], 4, 1, mask), load_balancing_loss([logits[1:]], 4, 1))


def test_a_training_step_adds_the_weighted_load_balancing_loss():
    tokens = torch.randint(0, 40, (400,), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = tformer.build_model(tformer.ModelConfig(**{**MOE, "router_aux_loss_coef": 0.5}))
    reference = copy.deepcopy(model).train()
    trainer = Trainer(model, TrainingConfig(max_steps=1, batch_size=2, seq_len=8, device="cpu"),
                      LanguageModelling(tokens), progress=False)
    assert trainer.mixtures == mixtures(model) and len(trainer.mixtures) == 2
    outcome = trainer.train_step()
    inputs, targets = random_crops(tokens, 2, 8, seed=trainer.config.seed, step=0)
    logits = reference(inputs).logits
    balance = auxiliary_loss(mixtures(reference))
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten()) + balance
    assert balance.item() > 0.4  # 0.5 x a loss of about top-k = 1 for a near-uniform router
    assert outcome.loss == pytest.approx(expected.item(), rel=1e-5)
    balance.backward()
    assert reference.stack.blocks[0].feedforward.router.weight.grad.abs().sum() > 0  # the router learns balance


def test_quantized_experts_and_the_serving_engine_decode_as_generate():
    """int8 and int4 swap every expert's projections (and the router's) like any linear layer; the engine batches
    requests of different lengths through the paged cache and each decodes what ``generate`` decodes alone."""
    torch.manual_seed(0)
    model = tformer.build_model(tformer.ModelConfig(**{**MOE, "d_model": 32, "moe_d_ff": 32, "shared_expert_d_ff": 32,
                                                       "shared_expert_gate": True}))  # int4's groups of 32 inputs
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(2))
    for method, layer in (("int8", "Int8Linear"), ("int4", "Int4Linear")):
        quantized = quantize(copy.deepcopy(model).eval(), method, group_size=32 if method == "int4" else None)
        assert type(quantized.stack.blocks[0].feedforward.experts[3].in_proj).__name__ == layer
        assert torch.equal(tformer.generate(quantized, prompt, 6),
                           tformer.generate(quantized, prompt, 6, use_cache=False))
    prompts = [torch.randint(0, 40, (length,), generator=torch.Generator().manual_seed(length)).tolist()
               for length in (3, 9, 1, 6)]
    config = GenerationConfig(max_new_tokens=6, eos_token_id=())
    requests = Engine(model.eval(), cache_tokens=256, block_size=4).complete(prompts, config)
    for prompt, request in zip(prompts, requests, strict=True):
        alone = tformer.generate(model, torch.tensor([prompt]), 6, eos_token_id=None)[0, len(prompt):].tolist()
        assert request.outputs()[0] == alone
