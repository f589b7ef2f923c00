"""DoRA adapters (nn/weights/dora.py): an adapter starts equal to its base; its output is the layer whose adapted
rows are m * V / ||V|| (V = W + scale * B @ A, the norm over each row's inputs) with the norm a constant to the
gradient, as Liu et al. 2024 and PEFT define it; merged equals unmerged and unmerging restores the base bit for bit;
what DoRA cannot go over or into (a quantized base, served adapters) is refused by name."""

import pytest
import torch
from torch import nn

import tformer
from tformer.adapters import adapter_parameters, add_lora, load_adapter, load_adapters, lora_layers, save_adapter
from tformer.nn.weights import Int4Linear, Int8Linear, PrepackedLinear
from tformer.nn.weights.dora import DoraLinear
from tformer.nn.weights.lora import AdapterError

BLOCKS = [None, [(0, 16), (32, 48)]]


def base_layer(backend: str = "plain") -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(64, 48)
    return PrepackedLinear.from_linear(layer) if backend == "prepacked" else layer


def randomised(layer: DoraLinear) -> DoraLinear:
    """``layer`` with nonzero B and magnitudes moved off the base's norms (either would hide a wrong formula)."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for b, m in zip(layer.lora_B, layer.lora_magnitude, strict=True):
            b.copy_(0.1 * torch.randn(b.shape, generator=generator))
            m.mul_(1 + 0.3 * torch.rand(m.shape, generator=generator))
    return layer


def reference_weight(layer: DoraLinear, detach_norm: bool = True) -> torch.Tensor:
    """The DoRA weight written out: rows of each block m * V / ||V||, other rows W (out, in)."""
    rows = []
    weight, position = layer.base.weight, 0
    for (start, stop), a, b, m in zip(layer.blocks, layer.lora_A, layer.lora_B, layer.lora_magnitude, strict=True):
        rows.append(weight[position:start])
        v = weight[start:stop] + layer.scale * b @ a
        norm = v.norm(dim=1, keepdim=True)
        rows.append(m.unsqueeze(1) * v / (norm.detach() if detach_norm else norm))
        position = stop
    rows.append(weight[position:])
    return torch.cat(rows)


def x() -> torch.Tensor:
    return torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("backend", ["plain", "prepacked"])
@pytest.mark.parametrize("blocks", BLOCKS)
@torch.no_grad()
def test_a_fresh_dora_adapter_equals_its_base_bit_for_bit(backend, blocks):
    base = base_layer(backend)
    want = base(x())
    layer = DoraLinear(base, rank=4, alpha=8, blocks=blocks)
    assert torch.equal(layer(x()), want)
    for (start, stop), m in zip(layer.blocks, layer.lora_magnitude, strict=True):  # m starts at the rows' norms
        assert torch.allclose(m, base.weight[start:stop].norm(dim=1))


@pytest.mark.parametrize("blocks", BLOCKS)
def test_the_output_is_the_renormalised_weight_and_the_norm_takes_no_gradient(blocks):
    layer = randomised(DoraLinear(base_layer(), rank=4, alpha=8, blocks=blocks))
    got = layer(x())
    want = nn.functional.linear(x(), reference_weight(layer), layer.base.bias)
    assert (got - want).abs().max() < 1e-5 and (got - layer.base(x())).abs().max() > 1e-2
    trained = [*layer.lora_A, *layer.lora_B, *layer.lora_magnitude]
    ours = torch.autograd.grad(got.square().sum(), trained)
    theirs = torch.autograd.grad(want.square().sum(), trained)
    for a, b in zip(ours, theirs, strict=True):
        assert (a - b).abs().max() < 1e-4 * max(1.0, b.abs().max().item())
    # a norm that took gradients would give other gradients: the check above can tell them apart
    undetached = nn.functional.linear(x(), reference_weight(layer, detach_norm=False), layer.base.bias)
    other = torch.autograd.grad(undetached.square().sum(), trained)
    assert max((a - b).abs().max().item() for a, b in zip(ours, other, strict=True)) > 1e-3
    assert layer.base.weight.grad is None and all(not p.requires_grad for p in layer.base.parameters())


@pytest.mark.parametrize("backend", ["plain", "prepacked"])
@pytest.mark.parametrize("blocks", BLOCKS)
@torch.no_grad()
def test_merged_equals_unmerged_and_unmerge_restores_the_base_bit_for_bit(backend, blocks):
    layer = randomised(DoraLinear(base_layer(backend), rank=4, alpha=8, blocks=blocks))
    before = layer.base.weight.clone()
    unmerged = layer(x())
    layer.merge()
    assert layer.merged and (layer(x()) - unmerged).abs().max() < 1e-5
    layer.unmerge()
    assert torch.equal(layer.base.weight, before) and torch.equal(layer(x()), unmerged)


def test_the_merged_weight_is_the_renormalised_one():
    layer = randomised(DoraLinear(base_layer(), rank=4, alpha=8, blocks=[(8, 40)]))
    with torch.no_grad():
        want = reference_weight(layer)
        layer.merge()
        assert (layer.base.weight - want).abs().max() < 1e-6 and (want - layer.base.weight).abs().max() >= 0
        assert (want[8:40] - layer._replaced_rows[0][1]).abs().max() > 1e-3  # the rows did change


def test_dropout_drops_the_input_of_both_extra_terms_in_training():
    layer = randomised(DoraLinear(base_layer(), rank=4, alpha=8, dropout=0.5)).train()
    torch.manual_seed(7)
    got = layer(x())
    torch.manual_seed(7)
    dropped = layer.dropout(x())
    factors = layer.row_factors().detach()
    weight = layer.base.weight
    want = layer.base(x()) + (factors - 1) * (dropped @ weight.T) + factors * layer.product(dropped)
    assert (got - want).abs().max() < 1e-5
    with torch.no_grad():  # in evaluation the dropout is off: the renormalised weight itself
        assert (layer.eval()(x()) - nn.functional.linear(x(), reference_weight(layer), layer.base.bias)).abs().max() \
            < 1e-5


@pytest.mark.parametrize("quantized", [lambda: Int8Linear.from_linear(base_layer()),
                                       lambda: Int4Linear.from_linear(base_layer(), group_size=32)],
                         ids=["int8", "int4"])
def test_a_quantized_base_is_refused_by_name(quantized):
    with pytest.raises(AdapterError, match=r"DoRA over a int[48] base.*quantized.*QLoRA"):
        DoraLinear(quantized(), rank=4, alpha=8)


def gpt():
    torch.manual_seed(0)
    return tformer.build_model("gpt-nano", d_model=64, num_heads=4).eval()


def test_a_model_trains_dora_adapters_and_saves_and_loads_them(tmp_path):
    model = add_lora(gpt(), rank=4, alpha=8, targets=["attention", "feedforward"], dora=True)
    layers = lora_layers(model)
    assert layers and all(isinstance(layer, DoraLinear) for layer in layers.values())
    trained = [p for p in model.parameters() if p.requires_grad]
    magnitudes = sum(m.numel() for layer in layers.values() for m in layer.lora_magnitude)
    lora = sum(p.numel() for layer in layers.values() for p in (*layer.lora_A, *layer.lora_B))
    assert magnitudes > 0 and sum(p.numel() for p in trained) == adapter_parameters(model) == lora + magnitudes
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(trained, lr=1e-2)
    before = {id(p): p.detach().clone() for p in trained}
    for _ in range(2):
        model.train()(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all(not torch.equal(p, before[id(p)]) for layer in layers.values() for p in layer.lora_magnitude)
    save_adapter(model.eval(), tmp_path / "dora")
    loaded = load_adapter(gpt(), tmp_path / "dora").eval()
    assert all(isinstance(layer, DoraLinear) for layer in lora_layers(loaded).values())
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_served_adapters_refuse_a_dora_adapter_by_name(tmp_path):
    save_adapter(add_lora(gpt(), rank=4, alpha=8, dora=True), tmp_path / "dora")
    save_adapter(add_lora(gpt(), rank=4, alpha=8), tmp_path / "lora")
    model = gpt()
    before = {name: p.clone() for name, p in model.state_dict().items()}
    with pytest.raises(AdapterError, match=r"adapter 'shiny' .* is a DoRA adapter .*served adapters are LoRA only"):
        load_adapters(model, {"plain": tmp_path / "lora", "shiny": tmp_path / "dora"})
    assert not lora_layers(model) and all(torch.equal(p, before[n]) for n, p in model.state_dict().items())


def test_decoding_with_a_dora_adapter_equals_decoding_its_merged_model():
    """Generation's decoding view puts the bases on the prepacked backend under the adapters: DoRA still reads the
    same float weight for its norms, so greedy tokens equal the merged model's."""
    from tformer.adapters import unload_adapter
    from tformer.generation import GenerationConfig

    model = randomised_model(add_lora(gpt(), rank=4, alpha=8, dora=True))
    config = GenerationConfig(max_new_tokens=16, eos_token_id=())
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    adapted = tformer.generate(model, prompt, generation_config=config)
    merged = tformer.generate(unload_adapter(model), prompt, generation_config=config)
    assert torch.equal(adapted, merged)
    assert not torch.equal(adapted, tformer.generate(gpt(), prompt, generation_config=config))


def randomised_model(model):
    for layer in lora_layers(model).values():
        randomised(layer)
    return model.eval()
