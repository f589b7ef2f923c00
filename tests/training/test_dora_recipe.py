"""DoRA through a recipe: ``[adapter] kind = "dora"`` trains DoRA adapters with tformer train, saved in PEFT's format
(use_dora, magnitudes) and merged by tformer merge into a model with the adapted model's logits; DoRA over a
quantized base is refused by name before anything is written."""

import json

import torch
from safetensors.torch import load_file
from test_sft_adapters import chat_run  # noqa: F401 (the fixture)

import tformer
from tformer.adapters import load_adapter, lora_layers
from tformer.cli import main
from tformer.nn.weights.dora import DoraLinear


def test_a_dora_recipe_trains_saves_and_merges(chat_run, capsys):  # noqa: F811
    out = chat_run / "dora"
    assert main(["train", str(chat_run / "r.toml"), "--out", str(out), "--no-progress",
                 "--set", "adapter.kind=dora"]) == 0
    assert "adapter    DoRA rank 4" in capsys.readouterr().out
    assert json.loads((out / "adapter_config.json").read_text())["use_dora"] is True
    assert any(name.endswith(".lora_magnitude_vector") for name in load_file(out / "adapter_model.safetensors"))
    adapted = load_adapter(tformer.load(chat_run / "base"), out).eval()
    assert all(isinstance(layer, DoraLinear) for layer in lora_layers(adapted).values())
    norms = [torch.linalg.vector_norm(layer.base.weight[start:stop], dim=1)
             for layer in lora_layers(adapted).values() for start, stop in layer.blocks]
    magnitudes = [m for layer in lora_layers(adapted).values() for m in layer.lora_magnitude]
    assert any(not torch.allclose(m, n) for m, n in zip(magnitudes, norms, strict=True))  # the magnitudes trained
    assert main(["merge", str(chat_run / "base"), str(out), "--out", str(chat_run / "merged")]) == 0
    ids = torch.randint(0, 258, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        merged = tformer.load(chat_run / "merged").eval()
        assert (adapted(ids).logits - merged(ids).logits).abs().max() < 1e-5


def test_dora_over_a_quantized_base_is_refused_before_anything_is_written(chat_run, capsys):  # noqa: F811
    out = chat_run / "qdora"
    assert main(["train", str(chat_run / "r.toml"), "--out", str(out), "--no-progress", "--set", "adapter.kind=dora",
                 "--set", "adapter.quantize=int4"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and 'kind = "dora"' in error[0] and "quantize = 'int4'" in error[0]
    assert "the float weight a quantized base does not hold" in error[0]
    assert not out.exists()
