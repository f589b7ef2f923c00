"""Several LoRA adapters over one base, chosen row by row (nn/weights/multi_lora.py, tformer.adapters.load_adapters):
a mixed batch's rows equal each row's adapter alone (LoraLinear over the same base, 1e-6), on every base backend,
with the adapters' products stacked (inference) or run adapter by adapter (training mode), for the step's token
rows and its kept rows; rows of no adapter, and every row outside a step, are the base's;
a model with adapters loaded together decodes each row as that adapter's model alone."""

import pytest
import torch
from test_lora import base_layer, randomised, with_random_adapter

import tformer
from tformer.adapters import load_adapter, load_adapters, lora_layers, save_adapter, served_adapters
from tformer.nn.weights.lora import AdapterError, LoraLinear, LoraUpdate
from tformer.nn.weights.multi_lora import MultiLoraLinear, adapter_index, adapter_rows


def adapted(backend):
    """A base layer, two LoraLinear adapters over it (whole, and two row blocks) and the multi layer of both."""
    base = base_layer(backend)
    torch.manual_seed(1)
    first = randomised(LoraLinear(base, rank=4, alpha=8))
    second = randomised(LoraLinear(base, rank=2, alpha=16, blocks=[(0, 16), (32, 48)], rslora=True))
    return base, [first, second], MultiLoraLinear(base, [LoraUpdate.of(first), LoraUpdate.of(second)], ["a", "b"])


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked-in-inference", "grouped-in-training-mode"])
@pytest.mark.parametrize("backend", ["plain", "prepacked", "int8", "int4"])
@torch.no_grad()
def test_a_mixed_batch_equals_each_rows_adapter_alone(backend, stacked):
    base, alone, multi = adapted(backend)
    multi.train(not stacked)  # a server's model is in eval mode: every adapter's product in one stacked pair
    per_token = torch.tensor([-1, 0, 1, 1, 0, -1, 1, 0, 0, -1])
    x = torch.randn(1, len(per_token), 64)
    with adapter_rows.use(per_token):
        out = multi(x)
    # a few float32 ulps: the stacked products add the low-rank terms in another order than one adapter alone
    for row, adapter in enumerate(per_token.tolist()):
        want = (base if adapter < 0 else alone[adapter])(x[:, row:row + 1])
        torch.testing.assert_close(out[:, row:row + 1], want, rtol=1e-6, atol=1e-6)
    keep = torch.tensor([1, 5, 9])  # the head reads only the rows a step keeps
    kept = x[:, keep]
    with adapter_rows.use(per_token, keep):
        out = multi(kept)
    for row, adapter in enumerate(per_token[keep].tolist()):
        want = (base if adapter < 0 else alone[adapter])(kept[:, row:row + 1])
        torch.testing.assert_close(out[:, row:row + 1], want, rtol=1e-6, atol=1e-6)
    assert torch.equal(multi(x), base(x))  # outside a step: the base's


@torch.no_grad()
def test_an_adapter_that_leaves_a_layer_alone_adds_nothing_there_and_odd_row_counts_are_refused():
    base, (first, _), _ = adapted("plain")
    multi = MultiLoraLinear(base, [None, LoraUpdate.of(first)], ["none-here", "first"])
    x = torch.randn(4, 64)
    with adapter_rows.use(torch.tensor([0, 1, 0, 1])):
        out = multi(x)
        torch.testing.assert_close(out[[0, 2]], base(x[[0, 2]]), rtol=0, atol=1e-6)
        torch.testing.assert_close(out[[1, 3]], first(x[[1, 3]]), rtol=0, atol=1e-6)
        with pytest.raises(AdapterError, match="got 3 rows, which are neither the step's tokens nor its kept rows"):
            multi(x[:3])
    assert adapter_index([1, -1, 0], [2, 1, 3], torch.device("cpu")).tolist() == [1, 1, -1, 0, 0, 0]


@torch.no_grad()
def test_the_stacked_products_follow_a_changed_adapter_weight():
    base, alone, multi = adapted("plain")
    multi.eval()
    per_token, x = torch.tensor([0, 1, -1]), torch.randn(3, 64)
    with adapter_rows.use(per_token):
        multi(x)  # builds the stacked matrices
        for update in multi.updates.values():
            update.lora_B[0].mul_(2.0)  # in place, as an optimizer or a load_state_dict would
        out = multi(x)
    for row, adapter in enumerate(per_token.tolist()):
        want = base(x[row:row + 1]) + (0 if adapter < 0 else multi.updates[str(adapter)].update(x[row:row + 1]))
        torch.testing.assert_close(out[row:row + 1], want, rtol=0, atol=1e-6)


def llama():
    torch.manual_seed(0)
    return tformer.build_model("llama-small", vocab_size=96, d_model=64, num_layers=2, num_heads=4).eval()


@torch.no_grad()
def test_adapters_loaded_together_decode_each_row_as_its_adapter_alone(tmp_path):
    torch.manual_seed(2)
    save_adapter(with_random_adapter(llama(), targets=["q_proj", "v_proj", "feedforward"]), tmp_path / "a")
    save_adapter(with_random_adapter(llama(), targets="all-linear", rslora=True), tmp_path / "b")
    model = load_adapters(llama(), {"a": tmp_path / "a", "b": tmp_path / "b"})
    assert served_adapters(model) == ("a", "b") and not lora_layers(model)
    prompts = torch.randint(0, 96, (3, 7), generator=torch.Generator().manual_seed(3))
    adapters = [1, -1, 0]  # a batch of three rows: adapter b, the base, adapter a
    with adapter_rows.use(adapter_index(adapters, [7, 7, 7], torch.device("cpu"))):
        mixed = model(prompts).logits
        viewed = model.decoding_view()(prompts).logits
    for row, adapter in enumerate(adapters):
        alone = llama() if adapter < 0 else load_adapter(llama(), tmp_path / "ab"[adapter]).eval()
        want = alone(prompts[row:row + 1]).logits
        torch.testing.assert_close(mixed[row:row + 1], want, rtol=0, atol=1e-5)
        torch.testing.assert_close(viewed[row:row + 1], want, rtol=0, atol=1e-5)
    assert torch.equal(model(prompts).logits, llama()(prompts).logits)  # outside a step: the base everywhere


def test_an_adapter_for_another_base_is_refused_naming_it_and_the_model_is_left_alone(tmp_path):
    save_adapter(with_random_adapter(llama(), targets=["q_proj"]), tmp_path / "good")
    gpt = tformer.build_model("gpt-nano", d_model=64, num_heads=4)
    save_adapter(with_random_adapter(gpt, targets=["attention"]), tmp_path / "gpt")
    model = llama()
    with pytest.raises(AdapterError, match="adapter 'other': .*an adapter for GPT2LMHeadModel; this model is Llama"):
        load_adapters(model, {"good": tmp_path / "good", "other": tmp_path / "gpt"})
    assert not served_adapters(model) and not lora_layers(model)
