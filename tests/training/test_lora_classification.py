"""A classifier fine-tuned with LoRA through ``tformer train``'s [adapter] section: its new head (the classifier and
the pooler it reads) trains whole beside the adapters while the backbone stays frozen, the run's count of trained
parameters includes the head, and the run's adapter folder carries the trained head (PEFT's modules_to_save), so
that the base with the adapter gives the run's own model back, and ``tformer evaluate BASE --adapter RUN`` its
own scores (and ``tformer merge`` a plain classifier with the same logits)."""

import json

import pytest
import torch
from safetensors.torch import load_file

import tformer
from tformer.adapters import load_adapter, lora_layers, trained_modules
from tformer.cli import main
from tformer.nn.weights import Int8Linear
from tformer.quantization import quantize
from tformer.tokenizers import WordPieceTokenizer
from tformer.training.config import AdapterConfig, TrainingError
from tformer.training.recipe import recipe_from_dict
from tformer.training.run import train_recipe

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "good", "bad", "fine", "film", "."]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def write_rows(path, rows: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    lines = ["sentence\tlabel"]
    for _ in range(rows):
        label = ("bad", "fine", "good")[int(torch.randint(3, (1,), generator=generator))]
        words = [WORDS[index] for index in torch.randint(8, (5,), generator=generator).tolist()]
        lines.append(" ".join([*words, label, "film"]) + f"\t{label}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def classifier_recipe(folder, adapter: dict):
    """A 3-step LoRA classification recipe over a bert-tiny masked-LM base saved in FOLDER/base."""
    torch.manual_seed(0)
    base = tformer.build_model("bert-tiny", vocab_size=len(VOCAB), head="masked_lm", max_seq_len=32)
    base.tokenizer = WordPieceTokenizer(VOCAB)
    base.save(folder / "base")
    write_rows(folder / "train.tsv", 24, 0)
    write_rows(folder / "dev.tsv", 9, 1)
    raw = {"model": {"init_from": "base", "head": "sequence_classification", "pooling": "mean", "dropout": 0.0},
           "data": {"train": "train.tsv", "eval": "dev.tsv"}, "task": {"name": "classification"},
           "training": {"max_steps": 3, "batch_size": 4, "seq_len": 32, "eval_every": 3, "threads": 1,
                        "warmup_steps": 0, "lr": 1e-2},
           "adapter": {"rank": 2, "alpha": 4, **adapter}}
    return base, recipe_from_dict(raw, base_dir=folder)


def test_a_lora_classifier_trains_and_saves_its_new_head_whole(tmp_path):
    base, recipe = classifier_recipe(tmp_path, {"targets": ["attention", "feedforward"]})
    lines: list[str] = []
    train_recipe(recipe, tmp_path / "run", progress=False, echo=lines.append)

    width, labels = base.config.d_model, 3
    layers, d_ff = base.config.num_layers, base.config.d_ff
    lora = layers * 2 * ((width + 3 * width) + (width + width) + (width + d_ff) + (d_ff + width))  # A and B, rank 2
    head = width * width + width + width * labels + labels  # the pooler's dense, the classifier
    line = next(line for line in lines if line.startswith("adapter"))
    assert "classifier, pooler trained whole" in line and f": {lora + head:,} of " in line, line

    tensors = load_file(tmp_path / "run" / "adapter_model.safetensors")
    config = json.loads((tmp_path / "run" / "adapter_config.json").read_text())
    assert sorted(config["modules_to_save"]) == ["classifier", "pooler.dense"]
    model = tformer.load(tmp_path / "base", head="sequence_classification", num_labels=labels, pooling="mean")
    fresh = model.classifier.weight.detach().clone()
    load_adapter(model, tmp_path / "run")
    assert set(trained_modules(model)) == {"classifier", "pooler.dense"}
    assert torch.equal(model.classifier.weight, tensors["base_model.model.classifier.weight"])
    assert not torch.equal(model.classifier.weight, fresh)
    backbone = tformer.load(tmp_path / "base")
    assert torch.equal(model.embedding.token.weight, backbone.embedding.token.weight)  # the backbone stayed frozen

    # tformer evaluate BASE --adapter RUN: the base loads with the run's head, the adapter brings its weights
    assert main(["evaluate", str(tmp_path / "base"), "--adapter", str(tmp_path / "run"), "--data",
                 str(tmp_path / "dev.tsv"), "--out", str(tmp_path / "evaluation")]) == 0
    scored = json.loads((tmp_path / "evaluation" / "dev.json").read_text())
    last = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert scored["eval_accuracy"] == pytest.approx(last["eval_accuracy"])
    assert scored["eval_loss"] == pytest.approx(last["eval_loss"], abs=1e-5)

    # tformer merge BASE RUN: a plain classifier folder, the head and the merged updates in it
    assert main(["merge", str(tmp_path / "base"), str(tmp_path / "run"), "--out", str(tmp_path / "merged")]) == 0
    merged = tformer.load(tmp_path / "merged").eval()
    ids = torch.randint(5, len(VOCAB), (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, model.eval()(ids).logits, rtol=0, atol=1e-5)


def test_qlora_keeps_an_adapted_token_table_and_a_head_trained_whole_float(tmp_path):
    """[adapter] quantize over configs/sst2-lora.toml's settings (a table among the targets, the classifier named
    to train whole): the backbone's linear layers are quantized, the tables and the head stay float, so the
    table's adapter goes on and trains and so does the classifier."""
    _, recipe = classifier_recipe(tmp_path, {"targets": ["attention", "feedforward", "embedding.token"],
                                             "train_modules": ["classifier"], "quantize": "int8"})
    lines: list[str] = []
    train_recipe(recipe, tmp_path / "run", progress=False, echo=lines.append)
    assert "over an int8 base," in next(line for line in lines if line.startswith("adapter"))
    tensors = load_file(tmp_path / "run" / "adapter_model.safetensors")
    table_update = [tensor for name, tensor in tensors.items() if "lora_embedding_A" in name]
    assert len(table_update) == 1 and table_update[0].abs().sum() > 0  # A starts at zero: it trained
    model = tformer.load(tmp_path / "base", head="sequence_classification", num_labels=3, pooling="mean")
    quantize(model, "int8", head=False, embeddings=False)
    load_adapter(model, tmp_path / "run")
    assert isinstance(lora_layers(model)["stack.blocks.0.attention.qkv_proj"].base, Int8Linear)
    assert type(lora_layers(model)["embedding.token"].base) is torch.nn.Embedding
    assert type(model.classifier) is torch.nn.Linear and "base_model.model.classifier.weight" in tensors


@pytest.mark.parametrize("value", ["classifier", [""], [3]])
def test_train_modules_must_be_a_list_of_names(value):
    with pytest.raises(TrainingError, match=r"train_modules=.* must be a list of module names \(\[\] for none\)"):
        AdapterConfig(train_modules=value)
    assert AdapterConfig(train_modules=[]).train_modules == [] and AdapterConfig().train_modules is None
