"""Checkpoint folders: save/load identity, atomic writes, clear errors."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import tformer
import tformer.hub as hub
from tformer.checkpoint import CheckpointError, atomic_directory, load_weights
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


@pytest.mark.parametrize("preset", ["gpt-nano", "bert-tiny", "whisper-digits", "vit-mnist"])
def test_a_load_in_another_type_reads_the_weights_into_a_model_built_in_it(tmp_path, preset, monkeypatch):
    """``tformer.load(..., dtype=)`` builds a float model in that type and reads the weights into it (half the
    memory of a float32 model for bfloat16): every tensor what a cast after a float32 load gives, tied weights
    still one tensor."""
    tformer.build_model(preset).save(tmp_path / "ckpt")
    read_into = []

    def recording_load_weights(model, folder, **options):
        read_into.append({parameter.dtype for parameter in model.parameters()})
        return load_weights(model, folder, **options)

    monkeypatch.setattr(hub, "load_weights", recording_load_weights)
    model = tformer.load(tmp_path / "ckpt", dtype=torch.bfloat16)
    assert read_into == [{torch.bfloat16}]  # the weights were read into the bfloat16 model
    cast_after = tformer.load(tmp_path / "ckpt").to(torch.bfloat16).state_dict()
    assert all(torch.equal(tensor, cast_after[name]) for name, tensor in model.state_dict().items())
    assert {tensor.dtype for tensor in model.state_dict().values() if tensor.is_floating_point()} == {torch.bfloat16}
    if getattr(model.config, "tie_embeddings", False) and hasattr(model, "lm_head"):
        assert model.lm_head.weight is model.embedding.token.weight


def test_a_model_quantized_as_it_loads_is_quantized_from_float32_then_cast(tmp_path):
    """The integers and scales come from the float32 weights (not from weights already rounded to bfloat16)."""
    from tformer.quantization import cast_model, quantize

    tformer.build_model("gpt-nano").save(tmp_path / "ckpt")
    model = tformer.load(tmp_path / "ckpt", quantize="int8", dtype=torch.bfloat16)
    reference = quantize(tformer.load(tmp_path / "ckpt"), "int8")
    cast_model(reference, torch.bfloat16)
    expected = reference.state_dict()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in model.state_dict().items())


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


# ---- what a writer killed mid-write leaves (issue 60, defect 9) --------------------------------------------


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.slow  # starts a writer and kills it
def test_a_save_clears_what_a_writer_killed_mid_write_left_and_nothing_else(tmp_path):
    import signal
    import subprocess
    import sys

    from python_path import child_python_path

    out = tmp_path / "int8"
    writer = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom tformer.checkpoint import atomic_directory\n"
         f"with atomic_directory({str(out)!r}) as folder:\n"
         "    (folder / 'model.safetensors').write_bytes(b'half')\n    print('writing', flush=True)\n"
         "    time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": child_python_path()})
    assert writer.stdout.readline() == "writing\n"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    debris = tmp_path / f".int8.tmp-{writer.pid}"
    assert (debris / "model.safetensors").read_bytes() == b"half"
    kept = [tmp_path / ".int8.tmp-1", tmp_path / ".int8.tmp-photos", tmp_path / f".other.tmp-{writer.pid}",
            tmp_path / f".int8.tmp-{writer.pid}0000000000000"]  # pid 1 runs; not a pid; another name; a run token
    for folder in kept:
        folder.mkdir()
    tformer.build_model("gpt-nano").save(out)
    assert not debris.exists() and all(folder.is_dir() for folder in kept)
    assert tformer.load(out).config.d_model == tformer.build_model("gpt-nano").config.d_model


def test_a_swap_killed_between_its_renames_gets_the_old_folder_back(tmp_path):
    pid = dead_pid()
    tformer.build_model("gpt-nano", num_layers=1).save(tmp_path / "swap")
    (tmp_path / "swap" / "notes.txt").write_text("kept beside the model")
    os.replace(tmp_path / "swap", tmp_path / f".ckpt.old-{pid}")  # the kill fell after the first rename
    (tmp_path / f".ckpt.tmp-{pid}").mkdir()
    tformer.build_model("gpt-nano").save(tmp_path / "ckpt")  # into the folder brought back: other files kept
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ckpt"]
    assert (tmp_path / "ckpt" / "notes.txt").read_text() == "kept beside the model"
    assert tformer.load(tmp_path / "ckpt").config.num_layers == tformer.build_model("gpt-nano").config.num_layers
    (tmp_path / f".ckpt.old-{pid}").mkdir()  # the kill fell after the second rename: the old copy goes
    tformer.build_model("gpt-nano").save(tmp_path / "ckpt")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ckpt"]


def test_text_files_and_staging_folders_of_dead_writers_are_cleared_by_the_next_write(tmp_path):
    from tformer.files import write_text_atomically

    pid = dead_pid()
    (tmp_path / f".notes.txt.tmp-{pid}").write_text("half")
    (tmp_path / ".notes.txt.tmp-1").write_text("a live writer's")
    write_text_atomically(tmp_path / "notes.txt", "whole\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == [".notes.txt.tmp-1", "notes.txt"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    for name in (f".staging-{pid}-k3x9", ".staging-photos", ".staging-1-abc"):
        (run / name).mkdir()
    tformer.build_model("gpt-nano").save(run)  # into a folder holding other files: staged, then renamed in
    assert sorted(path.name for path in run.iterdir() if path.name.startswith(".")) == [".staging-1-abc",
                                                                                       ".staging-photos"]


@pytest.mark.parametrize("layout", ["vocab.json+merges.txt", "encoder.json+vocab.bpe", "vocab.txt"])
def test_a_tokenizer_in_the_files_of_gpt2_or_bert_is_attached_as_in_a_hugging_face_folder(tmp_path, layout):
    """A tformer folder with GPT-2's vocab.json + merges.txt and no tokenizer.json loaded without a tokenizer."""
    from tformer.hub import load_tokenizer
    from tformer.tokenizers import BPETokenizer, WordPieceTokenizer

    text = "the transformer writes the text"
    if layout == "vocab.txt":
        words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "transformer", "writes", "text"]
        (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
        tokenizer = WordPieceTokenizer.from_vocab_file(tmp_path / "vocab.txt")
    else:
        tokenizer = BPETokenizer.train([text] * 5, vocab_size=280)
        model_part = tokenizer.to_dict()["model"]
        vocab_name, merges_name = layout.split("+")
        (tmp_path / vocab_name).write_text(json.dumps(model_part["vocab"]), encoding="utf-8")
        (tmp_path / merges_name).write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in model_part["merges"]),
                                            encoding="utf-8")
    tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size).save(tmp_path / "model")
    for name in os.listdir(tmp_path):
        if name != "model":
            os.replace(tmp_path / name, tmp_path / "model" / name)
    assert not (tmp_path / "model" / "tokenizer.json").exists()
    model = tformer.load(tmp_path / "model")
    assert type(model.tokenizer) is type(tokenizer)
    assert model.tokenizer.encode(text) == tokenizer.encode(text)
    assert load_tokenizer(tmp_path / "model").encode(text) == tokenizer.encode(text)  # what serve reads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_any_nan_or_infinity_in_a_weight_is_found(dtype):
    from tformer.checkpoint import _all_finite

    assert _all_finite(torch.randn(64, 33).to(dtype)) and _all_finite(torch.empty(0, 8, dtype=dtype))
    for bad in (float("nan"), float("inf"), float("-inf")):
        for position in (0, 1000, 64 * 33 - 1):  # the first value, one inside, the last
            weight = torch.randn(64, 33).to(dtype)
            weight.view(-1)[position] = bad
            assert not _all_finite(weight), (bad, position)
