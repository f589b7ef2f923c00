"""Modules trained whole beside LoRA adapters (PEFT's modules_to_save, tformer/adapters.py): a fine-tune's new task
head (the classifier, and the pooler it reads) trains in full by default while the backbone stays frozen, and
nothing does on a decoder or a masked-LM encoder; gradients reach the adapters and those modules only; the
adapter's files carry the head and give the same model back; unloading without merging restores the base's head;
what cannot be honoured is refused in one line, the model untouched."""

import json

import pytest
import torch
from safetensors.torch import load_file

import tformer
from tformer.adapters import (
    adapter_parameters,
    add_lora,
    load_adapter,
    load_adapters,
    lora_layers,
    save_adapter,
    trained_modules,
    trained_with_adapter,
    unload_adapter,
)
from tformer.nn.weights.lora import AdapterError
from tformer.quantization import quantize


def classifier(pooling: str = "cls", head: str = "sequence_classification"):
    torch.manual_seed(0)
    options = {"pooling": pooling} if head == "sequence_classification" else {}
    return tformer.build_model("bert-tiny", vocab_size=96, head=head, num_labels=3, **options).eval()


def ids() -> torch.Tensor:
    return torch.randint(1, 96, (2, 9), generator=torch.Generator().manual_seed(5))


def trained_names(model) -> set[str]:
    return {name for name, parameter in model.named_parameters() if parameter.requires_grad}


def test_a_new_classification_head_trains_whole_by_default_and_a_pretraining_head_does_not():
    model = add_lora(classifier(), rank=4)
    assert trained_modules(model) == ("classifier", "pooler")
    head = {"classifier.weight", "classifier.bias", "pooler.dense.weight", "pooler.dense.bias"}
    assert head <= trained_names(model)
    assert all("lora_" in name for name in trained_names(model) - head)  # the backbone stays frozen
    assert adapter_parameters(model) == sum(p.numel() for p in trained_with_adapter(model))
    assert adapter_parameters(model) == sum(model.get_parameter(name).numel() for name in trained_names(model))
    tokens = add_lora(classifier(head="token_classification"), rank=4)
    assert trained_modules(tokens) == ("classifier",)  # reads every token: no pooler
    torch.manual_seed(0)
    masked = add_lora(tformer.build_model("bert-tiny", vocab_size=96, head="masked_lm"), rank=4)
    decoder = add_lora(tformer.build_model("gpt-nano"), rank=4)
    for model in (masked, decoder):
        assert trained_modules(model) == () and all("lora_" in name for name in trained_names(model))
    assert trained_modules(add_lora(classifier(), rank=4, train_modules=[])) == ()


def test_gradients_reach_the_adapters_and_the_head_only():
    model = add_lora(classifier(), rank=4).train()
    model(ids(), labels=torch.tensor([0, 2])).loss.backward()
    reached = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert {"classifier.weight", "pooler.dense.weight"} <= reached
    assert reached <= trained_names(model)


def test_modules_named_by_tformer_or_hugging_face_train_whole():
    model = add_lora(classifier(), rank=4, targets=["attention"], train_modules=["bert.pooler.dense"])
    assert trained_modules(model) == ("pooler.dense",)
    inner = add_lora(classifier(), rank=4, targets=["attention"], train_modules=["pooler", "pooler.dense"])
    assert trained_modules(inner) == ("pooler",)  # a module inside another chosen one is not listed twice
    adapted = add_lora(classifier(), rank=4, targets="all-linear")  # the pooler adapted: only the classifier whole
    assert trained_modules(adapted) == ("classifier",) and "pooler.dense" in lora_layers(adapted)


@pytest.mark.parametrize("build, options, message", [
    (classifier, {"train_modules": ["clasifier"]}, "'clasifier' matches no module of this model"),
    (classifier, {"targets": ["attention", "head"], "train_modules": ["classifier"]},
     "classifier is both adapted .* and trained whole"),
    (lambda: tformer.build_model("gpt-nano"), {"train_modules": ["lm_head"]},
     "lm_head's weight is the token table"),
    (lambda: quantize(classifier(), "int8"), {"train_modules": ["classifier"]},
     "classifier is quantized"),
])
def test_what_cannot_train_whole_is_refused_in_one_line(build, options, message):
    model = build()
    before = trained_names(model)
    with pytest.raises(AdapterError, match=message) as error:
        add_lora(model, rank=4, **options)
    assert "\n" not in str(error.value)
    assert not lora_layers(model) and trained_names(model) == before and trained_modules(model) == ()


def randomise(model) -> None:
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))


@pytest.mark.parametrize("pooling, pooler, task_type", [("cls", "bert.pooler.dense", "SEQ_CLS"),
                                                         ("mean", "pooler.dense", None)])  # mean: no HF family
@torch.no_grad()
def test_the_adapter_files_carry_the_head_and_give_the_same_model_back(tmp_path, pooling, pooler, task_type):
    base = classifier(pooling)
    model = add_lora(classifier(pooling), rank=4)
    randomise(model)
    save_adapter(model, tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert sorted(config["modules_to_save"]) == sorted(["classifier", pooler]) and config["task_type"] == task_type
    tensors = load_file(tmp_path / "adapter_model.safetensors")
    whole = {name for name in tensors if not name.endswith((".lora_A.weight", ".lora_B.weight"))}
    assert whole == {f"base_model.model.{name}" for name in ("classifier.weight", "classifier.bias",
                                                             f"{pooler}.weight", f"{pooler}.bias")}
    assert sum(t.numel() for t in tensors.values()) >= adapter_parameters(model)
    loaded = load_adapter(classifier(pooling), tmp_path).eval()
    assert set(trained_modules(loaded)) == {"classifier", "pooler.dense"}
    # float32 rounding apart: the fused q/k/v projection's adapter comes back as PEFT's three (query, key, value),
    # whose products sum in another order (1.4e-6 on a logit of 0.13 on an AMD EPYC host with AVX-512 BF16)
    torch.testing.assert_close(loaded(ids()).logits, model(ids()).logits, rtol=1e-5, atol=1e-6)
    unload_adapter(loaded, merge=False)  # the base as it was, its head too
    assert torch.equal(loaded(ids()).logits, base(ids()).logits) and trained_modules(loaded) == ()
    merged = unload_adapter(model, merge=True)  # merged: the trained head stays, frozen
    assert not trained_names(merged) and trained_modules(merged) == ()
    assert not torch.equal(merged(ids()).logits, base(ids()).logits)


def test_an_adapter_whose_head_the_model_lacks_or_that_serves_per_row_is_refused(tmp_path):
    save_adapter(add_lora(classifier(), rank=4), tmp_path / "classifier")
    torch.manual_seed(0)
    masked = tformer.build_model("bert-tiny", vocab_size=96, head="masked_lm")
    with pytest.raises(AdapterError, match="trains .*classifier.* whole .*which this model has no parameter of"):
        load_adapter(masked, tmp_path / "classifier")
    assert not lora_layers(masked)
    with pytest.raises(AdapterError, match="adapter 'a' .* trains .*classifier.* whole"):
        load_adapters(classifier(), {"a": tmp_path / "classifier"})
    config = json.loads((tmp_path / "classifier" / "adapter_config.json").read_text())
    (tmp_path / "classifier" / "adapter_config.json").write_text(json.dumps({**config, "modules_to_save": None}))
    with pytest.raises(AdapterError, match="holds .*classifier.* tensors of modules_to_save only"):
        load_adapter(classifier(), tmp_path / "classifier")
