"""LoRA adapters in Hugging Face PEFT's format, both ways, against ``peft`` itself: an adapter ``peft`` makes on a
tiny random GPT-2, Llama or BERT (built by transformers, weights perturbed, lora_B drawn at random so that a
mis-mapped adapter shows) loads onto tformer's model of the same folder with PEFT's logits, and ``peft`` loads the
adapter tformer saves with tformer's logits (1e-5). GPT-2's Conv1D layers and fused c_attn, Llama's and BERT's
q/k/v in tformer's fused qkv_proj (an adapter per part, or one over the fused matrix written as one per part),
Llama's gate/up in in_proj, BERT's bare and masked-LM class names and its head's dense layer are all crossed."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import tformer  # noqa: E402
from tformer.adapters import (  # noqa: E402
    adapter_parameters,
    add_lora,
    load_adapter,
    lora_layers,
    save_adapter,
    trained_modules,
    unload_adapter,
)

pytestmark = pytest.mark.slow  # compares with transformers and peft

transformers.logging.set_verbosity_error()

TOLERANCE = 1e-5
VOCAB = 97
CONFIGS = {
    "gpt2": ("GPT2LMHeadModel", transformers.GPT2Config(vocab_size=VOCAB, n_positions=40, n_embd=32, n_layer=2,
                                                        n_head=4, bos_token_id=0, eos_token_id=0)),
    "gpt2-tied-head": ("GPT2LMHeadModel", transformers.GPT2Config(vocab_size=VOCAB, n_positions=40, n_embd=32,
                                                                  n_layer=2, n_head=4)),
    "llama": ("LlamaForCausalLM", transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=56,
                                                           num_hidden_layers=2, num_attention_heads=4,
                                                           num_key_value_heads=2, max_position_embeddings=64)),
    "bert": ("BertForMaskedLM", transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                        num_attention_heads=4, intermediate_size=48,
                                                        max_position_embeddings=40)),
    "bert-bare": ("BertModel", transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                       num_attention_heads=4, intermediate_size=48,
                                                       max_position_embeddings=40)),
}
# PEFT's targets per case: fused and Conv1D (GPT-2), some parts of fused matrices (Llama), a head's layer (BERT).
PEFT_TARGETS = {
    "gpt2": dict(target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True),
    "gpt2-tied-head": dict(target_modules=["c_attn", "lm_head"]),  # PEFT saves lm_head's base weight beside it
    "llama": dict(target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"], use_rslora=True),
    "bert": dict(target_modules=["query", "value", "dense"]),
    "bert-bare": dict(target_modules=r".*layer\.1\.attention\.self\.(key|value)"),
}
# tformer's targets: whole fused layers (written as one PEFT adapter per Hugging Face part), its own names.
TFORMER_TARGETS = {"gpt2": ["attention", "feedforward"], "gpt2-tied-head": ["attention", "lm_head"],
                   "llama": ["qkv_proj", "feedforward.in_proj", "o_proj"],
                   "bert": ["attention", "feedforward"], "bert-bare": ["qkv_proj", "intermediate.dense"]}


def hf_model(case: str, folder) -> torch.nn.Module:
    """A seeded tiny HF model of ``case``, every parameter moved off its initial value, saved to ``folder``."""
    class_name, config = CONFIGS[case]
    torch.manual_seed(0)
    model = getattr(transformers, class_name)(config.__class__(**config.to_dict(), attn_implementation="eager"))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(folder)
    return model.eval()


def randomise_lora_b(model: torch.nn.Module, part: str = "lora_B", seed: int = 4) -> None:
    """Draw the adapter matrices whose names hold ``part`` at random (a zero lora_B would hide a wrong map)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if part in name:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))


def inputs() -> torch.Tensor:
    return torch.randint(1, VOCAB, (2, 11), generator=torch.Generator().manual_seed(2))


@torch.no_grad()
def outputs(model, ids: torch.Tensor) -> torch.Tensor:
    output = model(ids)
    logits = getattr(output, "logits", None)
    return output.last_hidden_state if logits is None else logits


def assert_equal_and_adapted(ours, theirs, base, label: str) -> None:
    ids = inputs()
    got, want, plain = outputs(ours, ids), outputs(theirs, ids), outputs(base, ids)
    difference, change = (got - want).abs().max().item(), (want - plain).abs().max().item()
    print(f"{label}: max |difference| {difference:.2e}; the adapter moves the outputs by {change:.2e}")
    assert got.shape == want.shape and difference < TOLERANCE
    assert change > 100 * TOLERANCE  # the adapter changes the outputs: a dropped adapter would fail


@pytest.mark.parametrize("case", list(CONFIGS))
def test_an_adapter_peft_made_loads_onto_tformer_with_peft_logits(tmp_path, case):
    base = hf_model(case, tmp_path / "base")
    reference = hf_model(case, tmp_path / "base")
    peft_model = get_peft_model(reference, LoraConfig(r=4, lora_alpha=8, **PEFT_TARGETS[case]))
    randomise_lora_b(peft_model)
    peft_model.eval().save_pretrained(tmp_path / "adapter")
    ours = load_adapter(tformer.load(tmp_path / "base"), tmp_path / "adapter").eval()
    assert lora_layers(ours) and all(not p.requires_grad for n, p in ours.named_parameters() if "lora_" not in n)
    assert_equal_and_adapted(ours, peft_model, base, f"peft -> tformer, {case}")


@pytest.mark.parametrize("case", list(CONFIGS))
def test_peft_loads_the_adapter_tformer_saved_with_tformer_logits(tmp_path, case):
    base = hf_model(case, tmp_path / "base")
    ours = add_lora(tformer.load(tmp_path / "base"), rank=4, alpha=16, targets=TFORMER_TARGETS[case])
    randomise_lora_b(ours)
    save_adapter(ours.eval(), tmp_path / "adapter", base_model_name_or_path=str(tmp_path / "base"))
    theirs = PeftModel.from_pretrained(hf_model(case, tmp_path / "base"), tmp_path / "adapter").eval()
    assert_equal_and_adapted(ours, theirs, base, f"tformer -> peft, {case}")
    if case == "gpt2-tied-head":
        return  # PEFT's merge into a head tied to the table changes the table too; tformer refuses that merge
    merged = theirs.merge_and_unload()  # PEFT's merge of tformer's adapter: the same function again
    assert (outputs(merged, inputs()) - outputs(ours, inputs())).abs().max() < TOLERANCE


# ---- modules trained whole beside the adapters (PEFT's modules_to_save) ------------------------------------------

CLASSIFIER = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=40, num_labels=3)


def bert_classifier(folder) -> torch.nn.Module:
    """A seeded tiny BertForSequenceClassification, weights moved off their initial values, saved to ``folder``."""
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(
        CLASSIFIER.__class__(**CLASSIFIER.to_dict(), attn_implementation="eager"))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(folder)
    return model.eval()


def move_trained_weights(model: torch.nn.Module, names: tuple[str, ...]) -> None:
    """Draw lora_B and the weights of the modules trained whole (their trained copies) at random: as training
    leaves them, so that a head read from the base instead of the file shows."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name or (parameter.requires_grad and any(part in name for part in names)):
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))


@pytest.mark.parametrize("modules_to_save", [None, ["pooler"]])
def test_a_classifier_peft_trained_whole_loads_onto_tformer_with_peft_logits(tmp_path, modules_to_save):
    base = bert_classifier(tmp_path / "base")
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value", "dense"], task_type="SEQ_CLS",
                        modules_to_save=modules_to_save)
    peft_model = get_peft_model(bert_classifier(tmp_path / "base"), config)  # SEQ_CLS: the classifier trains whole
    move_trained_weights(peft_model, ("classifier", "pooler"))
    peft_model.eval().save_pretrained(tmp_path / "adapter")
    ours = load_adapter(tformer.load(tmp_path / "base"), tmp_path / "adapter").eval()
    want = {"classifier"} | ({"pooler.dense"} if modules_to_save else set())
    assert set(trained_modules(ours)) == want
    assert_equal_and_adapted(ours, peft_model, base, f"peft -> tformer, BERT classifier + {sorted(want)}")
    unload_adapter(ours, merge=False)  # the base as it was: its own head back
    assert (outputs(ours, inputs()) - outputs(base, inputs())).abs().max() < TOLERANCE


def test_peft_loads_a_tformer_adapter_with_its_head_trained_whole_with_tformer_logits(tmp_path):
    base = bert_classifier(tmp_path / "base")
    ours = add_lora(tformer.load(tmp_path / "base"), rank=4, alpha=16, targets=["attention", "feedforward"])
    assert trained_modules(ours) == ("classifier", "pooler")  # the default for a classifier, as PEFT's SEQ_CLS
    trained = {name for name, p in ours.named_parameters() if p.requires_grad}
    assert {"classifier.weight", "classifier.bias", "pooler.dense.weight", "pooler.dense.bias"} <= trained
    assert all("lora_" in name or name.startswith(("classifier.", "pooler.")) for name in trained)
    assert adapter_parameters(ours) == sum(ours.get_parameter(name).numel() for name in trained)
    move_trained_weights(ours, ("classifier", "pooler"))
    save_adapter(ours.eval(), tmp_path / "adapter", base_model_name_or_path=str(tmp_path / "base"))
    written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert written["task_type"] == "SEQ_CLS" and sorted(written["modules_to_save"]) == ["bert.pooler.dense",
                                                                                       "classifier"]
    tensors = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert {"base_model.model.classifier.weight", "base_model.model.bert.pooler.dense.bias"} <= set(tensors)
    theirs = PeftModel.from_pretrained(bert_classifier(tmp_path / "base"), tmp_path / "adapter").eval()
    assert_equal_and_adapted(ours, theirs, base, "tformer -> peft, BERT classifier trained whole")
    again = load_adapter(tformer.load(tmp_path / "base"), tmp_path / "adapter").eval()  # and back into tformer
    assert (outputs(again, inputs()) - outputs(ours, inputs())).abs().max() < TOLERANCE


# ---- token tables (PEFT's lora_embedding_A and lora_embedding_B) --------------------------------------------------


def draw_every_adapter_matrix(model: torch.nn.Module) -> None:
    """A table's A starts at zero on both sides: drawn too, so that a mis-read table shows."""
    randomise_lora_b(model, part="lora_", seed=6)


@pytest.mark.parametrize("case, theirs, ours", [
    ("llama", ["embed_tokens"], ["embedding.token"]),
    ("bert-classifier", ["word_embeddings", "query"], ["embedding.token", "attention"]),  # an untied BERT table
])
def test_a_token_tables_adapter_crosses_both_ways_with_equal_logits(tmp_path, case, theirs, ours):
    def build():
        return bert_classifier(tmp_path / "base") if case == "bert-classifier" else hf_model(case, tmp_path / "base")

    base = build()
    peft_model = get_peft_model(build(), LoraConfig(r=4, lora_alpha=8, target_modules=theirs))
    draw_every_adapter_matrix(peft_model)
    peft_model.eval().save_pretrained(tmp_path / "from-peft")  # with the base table beside (save_embedding_layers)
    loaded = load_adapter(tformer.load(tmp_path / "base"), tmp_path / "from-peft").eval()
    assert_equal_and_adapted(loaded, peft_model, base, f"peft -> tformer, {case} table {theirs}")
    model = add_lora(tformer.load(tmp_path / "base"), rank=4, alpha=8, targets=ours, train_modules=[])
    draw_every_adapter_matrix(model)
    save_adapter(model.eval(), tmp_path / "from-tformer")
    read = PeftModel.from_pretrained(build(), tmp_path / "from-tformer").eval()
    assert_equal_and_adapted(model, read, base, f"tformer -> peft, {case} table {ours}")
