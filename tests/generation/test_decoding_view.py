"""Decoding never changes the caller's model: generate, stream_generate, beam search, speculative decoding and
the serving engine decode through a view (``Model.decoding_view``) over the model's own parameters, and the model
keeps its module types, attributes, training mode and state-dict keys. The view is exact (the same logits as
the model), shares the parameters (a change to the model is seen by the next view), and honours hooks."""

import pytest
import torch

import tformer
from tformer.generation import StackSession
from tformer.nn.weights import PrepackedLinear
from tformer.serving import Engine


def snapshot(model: torch.nn.Module) -> tuple:
    """What a caller can see of a model: each module's type and attributes (by identity), its training mode,
    its state-dict keys and the parameters' identities and values."""
    modules = [(name, type(module), module.training, {key: id(value) for key, value in vars(module).items()})
               for name, module in model.named_modules()]
    state = {name: value.clone() for name, value in model.state_dict().items()}
    return modules, list(state), state, [id(parameter) for parameter in model.parameters()]


def assert_unchanged(model: torch.nn.Module, before: tuple) -> None:
    modules, keys, state, parameters = snapshot(model)
    assert modules == before[0]
    assert keys == before[1] and parameters == before[3]
    assert all(torch.equal(state[name], before[2][name]) for name in keys)


def gpt(**options) -> tformer.Model:
    torch.manual_seed(0)
    return tformer.build_model("gpt-nano", dropout=0.1, **options)  # in training mode, as built


PROMPT = torch.tensor([[3, 9, 4, 1], [0, 7, 7, 2]])
MASK = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])


@pytest.mark.parametrize("call", ["generate", "stream", "beam", "speculative", "sampling"])
def test_generation_leaves_the_callers_model_as_it_was(call):
    model, draft = gpt(), gpt(num_layers=1)
    before, draft_before = snapshot(model), snapshot(draft)
    if call == "stream":
        assert len(list(tformer.stream_generate(model, PROMPT, 5, attention_mask=MASK))) == 5
    elif call == "speculative":
        tformer.generate(model, PROMPT[:1], 6, draft_model=draft, num_draft_tokens=3)
    else:
        options = {"beam": {"num_beams": 3}, "sampling": {"do_sample": True, "seed": 1}}.get(call, {})
        tformer.generate(model, PROMPT, 6, attention_mask=MASK, **options)
    assert_unchanged(model, before)
    assert_unchanged(draft, draft_before)
    assert not any(isinstance(module, PrepackedLinear) for module in model.modules())


def test_the_engine_leaves_the_callers_model_as_it_was():
    model = tformer.build_model("gpt-nano", dropout=0.5)  # in training mode: the engine's view must not be
    before = snapshot(model)
    engine = Engine(model, cache_tokens=256, block_size=8)
    [request] = engine.complete([[3, 9, 4, 1]], tformer.GenerationConfig(max_new_tokens=8))
    assert_unchanged(model, before)
    assert request.outputs()[0] == tformer.generate(model, PROMPT[:1], 8, eos_token_id=[])[0, 4:].tolist()


def test_the_view_is_exact_and_shares_the_parameters():
    model = gpt().eval()
    view = model.decoding_view()
    assert isinstance(view.lm_head, PrepackedLinear) and isinstance(view, type(model))
    assert {id(p) for p in view.parameters()} == {id(p) for p in model.parameters()}
    with torch.no_grad():
        expected = model(PROMPT, attention_mask=MASK).logits
        with view.stepping:
            torch.testing.assert_close(view(PROMPT, attention_mask=MASK).logits, expected, rtol=1e-5, atol=1e-5)
        model.lm_head.weight.mul_(2.0)  # a change to the model is the view's too
        changed = model(PROMPT).logits
        with view.stepping:
            torch.testing.assert_close(StackSession(view, 2, 4).extend(PROMPT), changed, rtol=1e-5, atol=1e-5)


def test_a_hook_on_the_model_runs_while_decoding():
    model = gpt().eval()
    seen = []
    model.stack.blocks[0].feedforward.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append("head"))
    tformer.generate(model, PROMPT[:1], 3)
    assert seen.count("head") == 3 and len(seen) == 6  # the prefill and two one-token steps
