"""LoRA over a token table (nn/weights/lora.py's LoraEmbedding): it starts as its base, looks up what the one-hot
product of its update gives, merges and unmerges bit for bit, trains its two matrices only, is chosen by name
(tformer's or Hugging Face's) and never by a group, saves as PEFT names a table's adapter; and what it cannot be
(DoRA, a tied table, a served adapter, a base table that differs) is refused in one line."""

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from test_lora import gpt, ids, llama

from tformer.adapters import (
    add_lora,
    load_adapter,
    load_adapters,
    lora_layers,
    merge_adapter,
    save_adapter,
    unmerge_adapter,
)
from tformer.nn.weights.lora import AdapterError, LoraEmbedding
from tformer.quantization import QuantizationError, quantize


def drawn(model):
    """Every adapter matrix drawn at random: a table's A starts at zero, which would hide a wrong update."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_" in name:
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    return model


def test_a_table_adapter_starts_as_its_base_and_looks_up_its_one_hot_product():
    table = torch.nn.Embedding(50, 16, padding_idx=0)
    adapted = LoraEmbedding(table, rank=4, alpha=8)
    a, b = adapted.lora_A[0], adapted.lora_B[0]
    assert a.shape == (4, 50) and b.shape == (16, 4)  # PEFT's lora_embedding_A and lora_embedding_B
    assert not a.any() and b.std() > 0.5  # PEFT's start: A zero, B standard normal
    tokens = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(adapted(tokens), table(tokens))
        a.normal_()
        one_hot = F.one_hot(tokens, 50).float()  # (3, 7, 50): the lookup is this product
        expected = table(tokens) + 2.0 * one_hot @ a.t() @ b.t()
        torch.testing.assert_close(adapted(tokens), expected, rtol=0, atol=1e-5)


def test_a_merged_table_equals_the_adapted_one_and_unmerging_gives_the_base_back_bit_for_bit():
    model = drawn(add_lora(llama(), rank=4, alpha=8, targets=["embedding.token", "attention"]))
    base = model.embedding.token.base.weight.clone()
    with torch.no_grad():
        adapted = model(ids(vocab=96)).logits
        merge_adapter(model)
        assert not torch.equal(model.embedding.token.base.weight, base)
        torch.testing.assert_close(model(ids(vocab=96)).logits, adapted, rtol=0, atol=1e-5)
        unmerge_adapter(model)
    assert torch.equal(model.embedding.token.base.weight, base)


def test_only_the_table_adapters_matrices_train_and_both_get_gradients():
    model = add_lora(llama(), rank=2, alpha=4, targets=["embed_tokens"])  # Hugging Face's name for it
    assert list(lora_layers(model)) == ["embedding.token"]
    model.train()
    model(ids(vocab=96)).logits.pow(2).mean().backward()
    trained = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trained == {"embedding.token.lora_A.0", "embedding.token.lora_B.0"}
    assert model.embedding.token.lora_A[0].grad.abs().sum() > 0  # A starts at zero: B passes it the gradient
    assert model.embedding.token.base.weight.grad is None


def test_groups_leave_the_table_alone_and_its_name_is_listed_when_a_target_matches_nothing():
    model = add_lora(llama(), rank=2, alpha=4, targets="all-linear")
    assert not isinstance(model.embedding.token, LoraEmbedding)
    with pytest.raises(AdapterError, match=r"matches no linear layer or token table; .*embedding\.token"):
        add_lora(llama(), targets=["no_such_layer"])


@pytest.mark.parametrize("options, message", [
    (dict(model=gpt, targets=["embedding.token"]), "is the output head's weight too \\(tie_embeddings\\)"),
    (dict(model=llama, targets=["embedding.token"], dora=True), "a token table takes a LoRA adapter"),
    (dict(model=llama, targets=["embedding.token"], rank=97), "rank=97 must be a whole number from 1 to 64"),
])
def test_what_a_table_adapter_cannot_be_is_refused_in_one_line(options, message):
    model = options.pop("model")()
    with pytest.raises(AdapterError, match=f"embedding.token: .*{message}"):
        add_lora(model, **{"rank": 4, "alpha": 8, **options})
    assert not lora_layers(model)


def test_a_table_adapter_saves_as_peft_names_it_and_loads_back_to_the_same_model(tmp_path):
    model = drawn(add_lora(llama(), rank=4, alpha=8, targets=["embedding.token", "q_proj"])).eval()
    save_adapter(model, tmp_path)
    tensors = load_file(tmp_path / "adapter_model.safetensors")
    assert tensors["base_model.model.model.embed_tokens.lora_embedding_A"].shape == (4, 96)
    assert tensors["base_model.model.model.embed_tokens.lora_embedding_B"].shape == (64, 4)
    loaded = load_adapter(llama(), tmp_path).eval()
    assert isinstance(loaded.embedding.token, LoraEmbedding)
    with torch.no_grad():
        assert torch.equal(loaded(ids(vocab=96)).logits, model(ids(vocab=96)).logits)


def test_a_saved_base_table_must_be_the_models_and_a_table_adapter_is_not_served(tmp_path):
    model = drawn(add_lora(llama(), rank=4, alpha=8, targets=["embedding.token"])).eval()
    save_adapter(model, tmp_path)
    tensors = load_file(tmp_path / "adapter_model.safetensors")
    table = model.embedding.token.base.weight.detach().clone()  # PEFT saves it beside a table's adapter
    save_file({**tensors, "base_model.model.model.embed_tokens.base_layer.weight": table},
              tmp_path / "adapter_model.safetensors")
    assert isinstance(load_adapter(llama(), tmp_path).embedding.token, LoraEmbedding)  # the same table: read
    save_file({**tensors, "base_model.model.model.embed_tokens.base_layer.weight": table + 1},
              tmp_path / "adapter_model.safetensors")
    other = llama()
    with pytest.raises(AdapterError, match="embed_tokens's weight \\(96, 64\\), which differs from this model's"):
        load_adapter(other, tmp_path)
    assert not lora_layers(other)
    save_file(tensors, tmp_path / "adapter_model.safetensors")
    with pytest.raises(AdapterError, match="adapts the token table embedding.token; served adapters adapt linear"):
        load_adapters(llama(), {"one": tmp_path})


def test_quantizing_a_model_whose_table_carries_an_adapter_is_refused_unless_the_tables_stay_float():
    model = drawn(add_lora(llama(), rank=4, alpha=8, targets=["embedding.token", "q_proj"])).eval()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(QuantizationError, match="embedding.token carries a LoRA adapter .*embeddings=False"):
        quantize(model, "int8")
    assert all(torch.equal(tensor, before[name]) for name, tensor in model.state_dict().items())  # nothing changed
    quantize(model, "int8", embeddings=False)
    assert isinstance(model.embedding.token, LoraEmbedding)


def test_an_adapter_over_a_table_quantized_first_is_refused_naming_the_int8_table():
    model = quantize(llama(), "int4", group_size=32)  # QLoRA's order: the base quantized, then the adapters
    with pytest.raises(AdapterError, match=r"'embed_tokens' is a quantized token table \(embedding.token, int8\)"):
        add_lora(model, rank=4, alpha=8, targets=["q_proj", "embed_tokens"])
    assert not lora_layers(model)  # nothing put on
    quantized = quantize(llama(), "int4", group_size=32, embeddings=False)
    assert isinstance(add_lora(quantized, rank=4, alpha=8, targets=["embedding.token"]).embedding.token, LoraEmbedding)
