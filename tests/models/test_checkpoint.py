"""Checkpoint folders: save/load identity, atomic writes, clear errors."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import tformer
from tformer.checkpoint import CheckpointError, atomic_directory
from tformer.tokenizers import CharTokenizer


@pytest.mark.parametrize("preset_overrides", [{}, {"positional": "rope", "num_kv_heads": 2, "tie_embeddings": False}])
def test_save_then_load_gives_identical_logits(tmp_path, preset_overrides):
    model = tformer.build_model("gpt-nano", **preset_overrides).eval()
    model.tokenizer = CharTokenizer.train("hello world")
    model.save(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "model.safetensors",
                                                                     "tokenizer.json"]
    loaded = tformer.load(tmp_path / "ckpt")
    ids = torch.randint(0, 64, (2, 9))
    assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert loaded.config == model.config
    assert loaded.tokenizer.encode("hello") == model.tokenizer.encode("hello")
    if model.config.tie_embeddings:
        assert loaded.lm_head.weight is loaded.embedding.token.weight


def test_failed_write_leaves_the_old_checkpoint(tmp_path):
    target = tmp_path / "ckpt"
    tformer.build_model("gpt-nano").save(target)
    before = (target / "model.safetensors").read_bytes()
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as folder:
            (folder / "model.safetensors").write_bytes(b"partial")
            raise RuntimeError("crash mid-write")
    assert (target / "model.safetensors").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


class FailingReplace:
    """``os.replace`` that raises OSError on its ``failing_call``-th call (1-based) and works otherwise:
    a crash or a full disk between two of a save's renames."""

    def __init__(self, monkeypatch, failing_call):
        self.real, self.failing_call, self.calls = os.replace, failing_call, 0
        monkeypatch.setattr(os, "replace", self)

    def __call__(self, source, destination):
        self.calls += 1
        if self.calls == self.failing_call:
            raise OSError(f"injected failure renaming {source} to {destination}")
        self.real(source, destination)


def nano_with_weights(seed):
    torch.manual_seed(seed)
    return tformer.build_model("gpt-nano").eval()


@pytest.mark.parametrize("failing_call", [1, 2])
def test_a_replacement_that_fails_at_either_rename_leaves_the_old_checkpoint(tmp_path, monkeypatch, failing_call):
    """atomic_directory renames the old folder aside, then the new one into place: whichever
    rename fails, the old checkpoint is still there, whole, and nothing else is left behind."""
    old = nano_with_weights(1)
    old.save(tmp_path / "ckpt")
    replace = FailingReplace(monkeypatch, failing_call)
    with pytest.raises(OSError, match="injected failure"):
        with atomic_directory(tmp_path / "ckpt") as folder:
            (folder / "config.json").write_text("{}")
            (folder / "model.safetensors").write_bytes(b"new weights")
    assert replace.calls >= failing_call
    ids = torch.randint(0, 64, (1, 8))
    assert torch.equal(tformer.load(tmp_path / "ckpt")(ids).logits, old(ids).logits)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary or set-aside folder


def test_a_save_into_a_run_folder_never_shows_a_config_without_its_weights(tmp_path, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    FailingReplace(monkeypatch, failing_call=2)  # the weights are renamed into place, then the config fails
    with pytest.raises(OSError, match="injected failure"):
        nano_with_weights(1).save(tmp_path)
    assert not (tmp_path / "config.json").exists()  # so the folder is not (yet) a checkpoint
    with pytest.raises(CheckpointError, match="no config.json"):
        tformer.load(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "model.safetensors"]


def test_saving_into_a_run_folder_keeps_other_files(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    tformer.build_model("gpt-nano").save(tmp_path)
    assert (tmp_path / "metrics.jsonl").read_text() == "{}\n"
    assert tformer.load(tmp_path).num_parameters() > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(CheckpointError, match="no such directory"):
        tformer.load(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="no config.json"):
        tformer.load(tmp_path)
    model = tformer.build_model("gpt-nano")
    model.save(tmp_path / "a")
    weights = load_file(str(tmp_path / "a" / "model.safetensors"))
    weights["stack.blocks.0.attention.qkv_proj.weight"] = torch.zeros(3, 3)
    save_file(weights, str(tmp_path / "a" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"stack\.blocks\.0\.attention\.qkv_proj\.weight has shape \(3, 3\), "
                                               r"the config expects \(96, 32\)"):
        tformer.load(tmp_path / "a")
    del weights["stack.blocks.0.attention.qkv_proj.weight"]
    save_file(weights, str(tmp_path / "a" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing: stack.blocks.0.attention.qkv_proj.weight"):
        tformer.load(tmp_path / "a")
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    config["norm"] = "batchnorm"
    (tmp_path / "a" / "config.json").write_text(json.dumps(config))
    with pytest.raises(tformer.ConfigError, match="norm='batchnorm' is not one of layernorm, rmsnorm"):
        tformer.load(tmp_path / "a")


def test_tformer_save_is_model_save(tmp_path):
    model = tformer.build_model("gpt-nano").eval()
    assert tformer.save(model, tmp_path / "a") == tmp_path / "a"
    ids = torch.randint(0, 64, (1, 5))
    assert torch.equal(tformer.load(tmp_path / "a")(ids).logits, model(ids).logits)
    with pytest.raises(ValueError, match="format='onnx' is not one of tformer, hf"):
        tformer.save(model, tmp_path / "b", format="onnx")
