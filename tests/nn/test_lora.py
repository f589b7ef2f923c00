"""LoRA adapters as a weight backend (nn/weights/lora.py, tformer/adapters.py): a zero-B adapter is its base on
every backend; merging equals the unmerged sum and unmerging gives the base back bit for bit; gradients reach
the adapters only, through int4 and int8 bases too (QLoRA: the base stays integers); every family takes
adapters; the saved folder holds adapter tensors only; and what cannot be honoured is refused in one line."""

import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import tformer
from tformer.adapters import (
    adapter_parameters,
    add_lora,
    load_adapter,
    lora_layers,
    merge_adapter,
    save_adapter,
    unload_adapter,
    unmerge_adapter,
)
from tformer.nn.weights import Int4Linear, Int8Linear, PrepackedLinear, QuantizedLinear, use_weights
from tformer.nn.weights.lora import AdapterError, LoraLinear, lora_scale
from tformer.quantization import dequantized, quantize, represented_parameters


def base_layer(backend: str, in_features: int = 64, out_features: int = 48) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(in_features, out_features)
    if backend == "prepacked":
        return PrepackedLinear.from_linear(layer)
    if backend == "int8":
        return Int8Linear.from_linear(layer)
    if backend == "int4":
        return Int4Linear.from_linear(layer, group_size=32)
    return layer


def randomised(layer: LoraLinear) -> LoraLinear:
    """``layer`` with nonzero B (a zero B would hide a wrong update)."""
    with torch.no_grad():
        for b in layer.lora_B:
            b.normal_(0, 0.1)
    return layer


def gpt(**options):
    torch.manual_seed(0)
    return tformer.build_model("gpt-nano", d_model=64, num_heads=4, **options).eval()


def llama():
    torch.manual_seed(0)
    return tformer.build_model("llama-small", vocab_size=96, d_model=64, num_layers=2, num_heads=4).eval()


def ids(batch: int = 2, length: int = 10, vocab: int = 64) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(5))


def with_random_adapter(model, **options):
    add_lora(model, rank=4, alpha=8, **options)
    for layer in lora_layers(model).values():
        randomised(layer)
    return model


# ---- the layer -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["plain", "prepacked", "int8", "int4"])
@pytest.mark.parametrize("blocks", [None, [(0, 16), (32, 48)]])
@torch.no_grad()
def test_a_zero_b_adapter_equals_its_base_on_every_backend(backend, blocks):
    base = base_layer(backend)
    x = torch.randn(3, 5, 64)
    want = base(x)
    layer = LoraLinear(base, rank=4, alpha=8, blocks=blocks)
    assert all(torch.count_nonzero(a) > 0 for a in layer.lora_A)  # A drawn, B zero
    assert torch.equal(layer(x), want)


def test_a_starts_as_peft_draws_it_and_the_scale_is_alpha_over_rank_or_its_root():
    layer = LoraLinear(nn.Linear(64, 48), rank=4, alpha=8)
    bound = 1 / 64 ** 0.5  # kaiming_uniform_(a=sqrt(5)) on (rank, in): U(-1/sqrt(in), 1/sqrt(in)), nn.Linear's
    assert layer.lora_A[0].abs().max() <= bound and layer.lora_A[0].abs().max() > 0.8 * bound
    assert layer.scale == 2.0 and lora_scale(4, 8, rslora=True) == 4.0
    assert LoraLinear(nn.Linear(64, 48), rank=4, alpha=8, rslora=True).scale == 4.0


@torch.no_grad()
def test_row_blocks_adapt_their_rows_only():
    base = base_layer("plain")
    layer = randomised(LoraLinear(base, rank=4, alpha=8, blocks=[(0, 16), (32, 48)]))
    x = torch.randn(7, 64)
    delta = layer(x) - base(x)
    assert torch.equal(delta[:, 16:32], torch.zeros(7, 16))
    for (start, stop), a, b in zip(layer.blocks, layer.lora_A, layer.lora_B, strict=True):
        torch.testing.assert_close(delta[:, start:stop], layer.scale * x @ a.T @ b.T, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["plain", "prepacked"])
@pytest.mark.parametrize("blocks", [None, [(16, 32)]])
@torch.no_grad()
def test_merged_equals_unmerged_and_unmerge_restores_the_base_bit_for_bit(backend, blocks):
    base = base_layer(backend)
    original = base.weight.clone()
    layer = randomised(LoraLinear(base, rank=4, alpha=8, blocks=blocks))
    x = torch.randn(4, 64)
    unmerged = layer(x)
    layer.merge()
    assert layer.merged and not torch.equal(base.weight, original)
    torch.testing.assert_close(layer(x), unmerged, rtol=0, atol=1e-5)
    layer.unmerge()
    assert torch.equal(base.weight, original) and torch.equal(layer(x), unmerged)


@pytest.mark.parametrize("backend", ["int8", "int4"])
def test_a_quantized_base_refuses_merging_in_place(backend):
    layer = LoraLinear(base_layer(backend), rank=4, alpha=8)
    with pytest.raises(AdapterError, match=f"a {backend} base holds integers.*dequantize"):
        layer.merge()


@pytest.mark.parametrize("rank", [0, 17, 65, 2.0])
def test_a_rank_the_layer_cannot_hold_is_refused(rank):
    with pytest.raises(AdapterError, match=r"rank=.* must be a whole number from 1 to 16"):
        LoraLinear(nn.Linear(64, 48), rank=rank, alpha=8, blocks=[(0, 16), (16, 48)])


# ---- a model -----------------------------------------------------------------------------------------


def test_only_the_adapters_train():
    model = with_random_adapter(gpt(), targets=["attention", "feedforward", "head"])
    model.train()
    model(ids(), labels=ids()).loss.backward()
    adapters = {id(p) for layer in lora_layers(model).values() for p in (*layer.lora_A, *layer.lora_B)}
    for name, parameter in model.named_parameters():
        if id(parameter) in adapters:
            assert parameter.requires_grad and parameter.grad is not None and parameter.grad.abs().sum() > 0, name
        else:
            assert not parameter.requires_grad and parameter.grad is None, name
    assert adapter_parameters(model) == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_qlora_keeps_an_int4_base_in_memory_and_trains_its_adapters():
    model = quantize(gpt(), "int4", group_size=32)
    with_random_adapter(model, targets=["attention", "feedforward"])
    bases = [layer.base for layer in lora_layers(model).values()]
    assert bases and all(isinstance(base, Int4Linear) for base in bases)
    for base in bases:
        assert base.weight is None and base.qweight.dtype == torch.uint8  # the integers, two to a byte
    assert not any(t.is_floating_point() and t.dim() == 2 and t.shape[0] * t.shape[1] > 64 * 64 // 2
                   for name, t in model.state_dict().items() if ".base." in name and "scales" not in name
                   and "zeros" not in name)
    model.train()
    model(ids(), labels=ids()).loss.backward()  # through the int4 kernels' input gradients
    first = lora_layers(model)["stack.blocks.0.attention.qkv_proj"]
    assert first.lora_A[0].grad.abs().sum() > 0 and first.lora_B[0].grad.abs().sum() > 0
    assert all(isinstance(base, Int4Linear) for base in (layer.base for layer in lora_layers(model).values()))


@pytest.mark.parametrize("scheme", [{"method": "int8"}, {"method": "int4", "group_size": 32}], ids=["int8", "int4"])
def test_qlora_over_a_tied_head_counts_the_token_table_once(scheme):
    """The model a training run describes (`adapter ... N of M parameters train`): the float model's parameters
    and the adapters', whether the head tied to the table is float or quantized under its adapter."""
    targets = ["attention", "feedforward", "head"]
    lora = with_random_adapter(gpt(), targets=targets)
    qlora = with_random_adapter(quantize(gpt(), **scheme), targets=targets)
    assert isinstance(lora_layers(qlora)["lm_head"].base, QuantizedLinear)
    expected = gpt().num_parameters() + adapter_parameters(lora)
    assert represented_parameters(lora) == represented_parameters(qlora) == expected


@pytest.mark.parametrize("backend", ["int8", "int4"])
@pytest.mark.parametrize("rows", [3, 40])  # the fused kernel's rows and the matrix product's
def test_a_quantized_layer_passes_its_input_the_gradient_of_its_dequantized_weight(backend, rows):
    layer = base_layer(backend)
    x = torch.randn(rows, 64, requires_grad=True)
    grad = torch.randn(rows, 48)
    layer(x).backward(grad)
    torch.testing.assert_close(x.grad, grad @ layer.dequantized_weight(), rtol=1e-5, atol=1e-5)


def test_merging_the_whole_model_equals_the_adapted_model_and_unmerging_gives_the_base_back():
    model = with_random_adapter(gpt(tie_embeddings=False), targets=["attention", "feedforward", "head"])
    before = {name: t.clone() for name, t in model.state_dict().items()}
    with torch.no_grad():
        adapted = model(ids()).logits
        merge_adapter(model)
        torch.testing.assert_close(model(ids()).logits, adapted, rtol=0, atol=1e-5)
        unmerge_adapter(model)
        assert all(torch.equal(t, before[name]) for name, t in model.state_dict().items())
        plain = unload_adapter(model)  # merged, then the LoRA layers replaced by their bases
        assert not lora_layers(plain) and not any(isinstance(m, LoraLinear) for m in plain.modules())
        torch.testing.assert_close(plain(ids()).logits, adapted, rtol=0, atol=1e-5)


def test_a_head_tied_to_the_token_table_or_a_quantized_base_refuses_merging_and_nothing_changes():
    model = with_random_adapter(gpt(), targets=["attention", "head"])
    before = {name: t.clone() for name, t in model.state_dict().items()}
    with pytest.raises(AdapterError, match="lm_head's weight is the token table"):
        merge_adapter(model)
    assert all(torch.equal(t, before[name]) for name, t in model.state_dict().items())
    model = with_random_adapter(quantize(gpt(), "int8"), targets=["attention"])
    with pytest.raises(AdapterError, match="int8 base holds integers"):
        merge_adapter(model)
    with torch.no_grad():
        # The documented way: a float base first, then merge. The adapted outputs are the float base's: an int8
        # base's own products may run in bfloat16 (quantized.plan_for measures which way is faster here).
        adapted = dequantized(model)(ids()).logits
        merge_adapter(model)
        torch.testing.assert_close(model(ids()).logits, adapted, rtol=0, atol=1e-5)


@torch.no_grad()
def test_decoding_keeps_the_adapter_on_a_prepacked_base():
    model = with_random_adapter(gpt(), targets=["attention", "feedforward"])
    prompt = ids(2, 4)
    generated = tformer.generate(model, prompt, 8, eos_token_id=[])
    for step in range(4, generated.shape[1]):
        assert torch.equal(model(generated[:, :step]).logits[:, -1].argmax(-1), generated[:, step])
    use_weights(model, "prepacked")
    assert all(isinstance(layer.base, PrepackedLinear) for layer in lora_layers(model).values())
    assert torch.equal(tformer.generate(model, prompt, 8, eos_token_id=[]), generated)


FAMILIES = {
    "decoder": (gpt, lambda: {"input_ids": ids()}),
    "encoder": (lambda: tformer.build_model("bert-tiny", vocab_size=96, head="sequence_classification",
                                            num_labels=3), lambda: {"input_ids": ids(vocab=96)}),
    "encoder-decoder": (lambda: tformer.build_model("transformer-multi30k", vocab_size=96, num_layers=2, d_model=64,
                                                    num_heads=4, d_ff=128),
                        lambda: {"input_ids": ids(vocab=96), "decoder_input_ids": ids(2, 6, 96)}),
    "vision": (lambda: tformer.build_model("vit-mnist", num_layers=2, d_model=64),
               lambda: {"pixel_values": torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(3))}),
    "speech": (lambda: tformer.build_model("whisper-digits", num_layers=1, num_encoder_layers=1),
               lambda: {"input_features": torch.randn(1, 80, 300, generator=torch.Generator().manual_seed(3)),
                        "decoder_input_ids": torch.tensor([[1, 2, 3]])}),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_takes_adapters_equal_to_its_base_at_first_and_training_them(family):
    build, inputs = FAMILIES[family]
    torch.manual_seed(0)
    model = build().eval()
    batch = inputs()
    with torch.no_grad():
        want = model(**batch).logits
    add_lora(model, rank=4, alpha=8, targets="all-linear" if family != "vision" else ["attention", "head"])
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, want)
    model(**batch).logits.square().mean().backward()
    grads = [b.grad for layer in lora_layers(model).values() for b in layer.lora_B]
    assert grads and all(g is not None for g in grads) and sum(g.abs().sum() for g in grads) > 0


# ---- targets -----------------------------------------------------------------------------------------


def test_hugging_face_names_adapt_the_rows_of_their_part_of_a_fused_matrix():
    model = add_lora(llama(), rank=4, targets=["q_proj", "v_proj", "up_proj"])
    qkv = lora_layers(model)["stack.blocks.0.attention.qkv_proj"]
    q_rows, kv_rows = 64, model.config.num_kv_heads * model.config.head_dim
    assert qkv.blocks == ((0, q_rows), (q_rows + kv_rows, q_rows + 2 * kv_rows))
    feedforward = lora_layers(model)["stack.blocks.1.feedforward.in_proj"]
    assert feedforward.blocks == ((model.config.d_ff, 2 * model.config.d_ff),)  # gate rows first, then up
    assert set(lora_layers(model)) == {f"stack.blocks.{i}.{name}" for i in range(2)
                                       for name in ("attention.qkv_proj", "feedforward.in_proj")}
    whole = add_lora(llama(), rank=4, targets=["qkv_proj"])
    assert lora_layers(whole)["stack.blocks.0.attention.qkv_proj"].whole
    regex = add_lora(llama(), rank=4, targets=r"stack\.blocks\.1\..*out_proj")
    assert set(lora_layers(regex)) == {"stack.blocks.1.attention.out_proj", "stack.blocks.1.feedforward.out_proj"}


def test_a_target_that_matches_nothing_is_refused_listing_what_exists():
    model = gpt()
    with pytest.raises(AdapterError) as error:
        add_lora(model, targets=["attention", "q_prj"])
    message = str(error.value)
    assert "\n" not in message and "'q_prj' matches no linear layer" in message
    assert "stack.blocks.{i}.attention.qkv_proj" in message and "c_attn" in message and "all-linear" in message
    assert not lora_layers(model) and all(p.requires_grad for p in model.parameters())  # nothing changed
    with pytest.raises(AdapterError, match="has a LoRA adapter already"):
        add_lora(add_lora(gpt()))


# ---- saving and loading --------------------------------------------------------------------------------


def test_saving_writes_only_adapter_tensors_and_loading_gives_the_same_model(tmp_path):
    model = with_random_adapter(llama(), targets=["q_proj", "v_proj", "feedforward"], rslora=True, dropout=0.1)
    save_adapter(model, tmp_path / "adapter", base_model_name_or_path="llama-small")
    tensors = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == ["adapter_config.json",
                                                                        "adapter_model.safetensors"]
    assert tensors and all(name.startswith("base_model.model.model.layers.") and
                           name.endswith((".lora_A.weight", ".lora_B.weight")) for name in tensors)
    assert sum(t.numel() for t in tensors.values()) == adapter_parameters(model) + 2 * 4 * 64  # A repeated: gate/up
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    assert config["use_rslora"] and config["lora_dropout"] == 0.1 and config["bias"] == "none"
    assert config["target_modules"] == ["down_proj", "gate_proj", "q_proj", "up_proj", "v_proj"]
    assert config["base_model_name_or_path"] == "llama-small" and config["task_type"] == "CAUSAL_LM"
    loaded = load_adapter(llama(), tmp_path / "adapter").eval()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids(vocab=96)).logits, model(ids(vocab=96)).logits, rtol=0, atol=1e-5)


def test_a_model_without_a_hugging_face_family_saves_under_tformers_names(tmp_path):
    model = with_random_adapter(gpt(attention_kernel="performer"), targets=["attention"]).eval()
    save_adapter(model, tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["auto_mapping"]["base_model_class"] == "tformer"
    assert "stack.blocks.0.attention.qkv_proj" in config["target_modules"] or "qkv_proj" in config["target_modules"]
    loaded = load_adapter(gpt(attention_kernel="performer"), tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(loaded(ids()).logits, model(ids()).logits)


def test_an_adapter_for_another_base_is_refused_in_one_line(tmp_path):
    save_adapter(with_random_adapter(gpt(), targets=["attention"]), tmp_path / "gpt2")
    other_width = tformer.build_model("gpt-nano", d_model=32, num_heads=4)
    with pytest.raises(AdapterError, match=r"lora_A.weight is \(4, 64\) float32, this model needs \(4, 32\)"):
        load_adapter(other_width, tmp_path / "gpt2")
    assert not lora_layers(other_width) and all(p.requires_grad for p in other_width.parameters())
    with pytest.raises(AdapterError, match="an adapter for GPT2LMHeadModel; this model is LlamaForCausalLM"):
        load_adapter(llama(), tmp_path / "gpt2")
    config = json.loads((tmp_path / "gpt2" / "adapter_config.json").read_text())
    del config["auto_mapping"]
    (tmp_path / "gpt2" / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterError, match="transformer.h.0.attn.c_attn.*which this llama model has no linear layer"):
        load_adapter(llama(), tmp_path / "gpt2")


@pytest.mark.parametrize("change, message", [
    ({"use_dora": True}, r"has no lora_magnitude_vector \(use_dora is true"),  # a LoRA file called DoRA
    ({"rank_pattern": {"c_attn": 8}}, "rank_pattern="),
    ({"bias": "all"}, "bias='all'"),
    ({"peft_type": "IA3"}, "peft_type='IA3'; tformer reads LoRA adapters"),
    ({"r": 8}, r"is \(4, 64\) float32, this model needs \(8, 64\) float \(r=8\)"),
])
def test_peft_settings_tformer_does_not_compute_are_refused(tmp_path, change, message):
    save_adapter(with_random_adapter(gpt(), targets=["attention"]), tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    (tmp_path / "adapter_config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(AdapterError, match=message):
        load_adapter(gpt(), tmp_path)


def test_hugging_face_names_find_their_layers_on_an_int8_base():
    model = with_random_adapter(quantize(llama(), "int8"), targets=["q_proj"])
    assert all(isinstance(layer.base, QuantizedLinear) for layer in lora_layers(model).values())
