"""DoRA adapters in PEFT's format (use_dora, lora_magnitude_vector), both ways, against ``peft`` itself: a DoRA
adapter ``peft`` makes on a tiny random GPT-2, Llama or BERT (lora_B and the magnitudes moved off their initial
values, so a wrong norm or a mis-mapped row shows) loads onto tformer's model of the same folder with PEFT's logits,
and ``peft`` loads the DoRA adapter tformer saves with tformer's logits (1e-5); PEFT's merge of it equals tformer's
unmerged model, and tformer's merge equals its unmerged model."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import tformer  # noqa: E402
from tformer.adapters import add_lora, load_adapter, lora_layers, merge_adapter, save_adapter  # noqa: E402
from tformer.nn.weights.dora import DoraLinear  # noqa: E402
from tformer.nn.weights.lora import AdapterError  # noqa: E402

pytestmark = pytest.mark.slow  # compares with transformers and peft

transformers.logging.set_verbosity_error()

TOLERANCE = 1e-5
VOCAB = 97
CONFIGS = {
    "gpt2": ("GPT2LMHeadModel", transformers.GPT2Config(vocab_size=VOCAB, n_positions=40, n_embd=32, n_layer=2,
                                                        n_head=4, bos_token_id=0, eos_token_id=0)),
    "llama": ("LlamaForCausalLM", transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=56,
                                                           num_hidden_layers=2, num_attention_heads=4,
                                                           num_key_value_heads=2, max_position_embeddings=64)),
    "bert": ("BertForMaskedLM", transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                        num_attention_heads=4, intermediate_size=48,
                                                        max_position_embeddings=40)),
}
# PEFT's targets: GPT-2's fused c_attn (Conv1D), parts of Llama's fused q/k/v and gate/up, BERT's q/v and dense layers
PEFT_TARGETS = {
    "gpt2": dict(target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True),
    "llama": dict(target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"], use_rslora=True),
    "bert": dict(target_modules=["query", "value", "dense"]),
}
# tformer's: whole fused layers, written as one PEFT module per Hugging Face part (B and the magnitudes split by rows)
TFORMER_TARGETS = {"gpt2": ["attention", "feedforward"], "llama": ["qkv_proj", "feedforward.in_proj", "o_proj"],
                   "bert": ["attention", "feedforward"]}


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


def moved(model: torch.nn.Module) -> None:
    """B drawn at random and every magnitude scaled off the base's row norms (names as PEFT's or tformer's)."""
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
            elif "magnitude" in name:
                parameter.mul_(1 + 0.5 * torch.rand(parameter.shape, generator=generator))


def inputs() -> torch.Tensor:
    return torch.randint(1, VOCAB, (2, 11), generator=torch.Generator().manual_seed(2))


@torch.no_grad()
def logits(model) -> torch.Tensor:
    return model(inputs()).logits


def assert_equal_and_adapted(got: torch.Tensor, want: torch.Tensor, plain: torch.Tensor, label: str) -> None:
    difference, change = (got - want).abs().max().item(), (want - plain).abs().max().item()
    print(f"{label}: max |difference| {difference:.2e}; the adapter moves the logits by {change:.2e}")
    assert got.shape == want.shape and difference < TOLERANCE
    assert change > 100 * TOLERANCE


@pytest.mark.parametrize("case", list(CONFIGS))
def test_a_dora_adapter_peft_made_loads_onto_tformer_with_peft_logits(tmp_path, case):
    base = hf_model(case, tmp_path / "base")
    peft_model = get_peft_model(hf_model(case, tmp_path / "base"),
                                LoraConfig(r=4, lora_alpha=8, use_dora=True, **PEFT_TARGETS[case]))
    moved(peft_model)
    peft_model.eval().save_pretrained(tmp_path / "adapter")
    ours = load_adapter(tformer.load(tmp_path / "base"), tmp_path / "adapter").eval()
    assert lora_layers(ours) and all(isinstance(layer, DoraLinear) for layer in lora_layers(ours).values())
    adapted = logits(ours)
    assert_equal_and_adapted(adapted, logits(peft_model), logits(base), f"peft -> tformer, DoRA, {case}")
    if case != "gpt2":  # GPT-2's head is the token table: merging is refused there (tests/nn/test_lora.py)
        merge_adapter(ours)
        assert (logits(ours) - adapted).abs().max() < TOLERANCE


@pytest.mark.parametrize("case", list(CONFIGS))
def test_peft_loads_the_dora_adapter_tformer_saved_with_tformer_logits(tmp_path, case):
    base = hf_model(case, tmp_path / "base")
    ours = add_lora(tformer.load(tmp_path / "base"), rank=4, alpha=16, targets=TFORMER_TARGETS[case], dora=True)
    moved(ours)
    save_adapter(ours.eval(), tmp_path / "adapter", base_model_name_or_path=str(tmp_path / "base"))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    tensors = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert config["use_dora"] is True
    assert {name.rpartition(".lora_")[2] for name in tensors} == {"A.weight", "B.weight", "magnitude_vector"}
    theirs = PeftModel.from_pretrained(hf_model(case, tmp_path / "base"), tmp_path / "adapter").eval()
    adapted = logits(ours)
    assert_equal_and_adapted(adapted, logits(theirs), logits(base), f"tformer -> peft, DoRA, {case}")
    merged = theirs.merge_and_unload()  # PEFT's DoRA merge of tformer's adapter: the same function again
    assert (logits(merged) - adapted).abs().max() < TOLERANCE


def test_magnitudes_without_use_dora_and_a_missing_magnitude_are_refused(tmp_path):
    hf_model("llama", tmp_path / "base")
    model = add_lora(tformer.load(tmp_path / "base"), rank=4, alpha=8, targets=["o_proj"], dora=True)
    save_adapter(model, tmp_path / "adapter")
    config_path = tmp_path / "adapter" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "use_dora": False}))
    with pytest.raises(AdapterError, match="holds DoRA magnitudes .* use_dora=false"):
        load_adapter(tformer.load(tmp_path / "base"), tmp_path / "adapter")
    save_adapter(add_lora(tformer.load(tmp_path / "base"), rank=4, alpha=8, targets=["o_proj"]), tmp_path / "lora")
    config_path = tmp_path / "lora" / "adapter_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "use_dora": True}))
    with pytest.raises(AdapterError, match="has no lora_magnitude_vector"):
        load_adapter(tformer.load(tmp_path / "base"), tmp_path / "lora")
