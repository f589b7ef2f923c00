"""Fine-tuning as people do it: activation checkpointing (the same gradients), LoRA and QLoRA adapters through the
Trainer and ``tformer train``'s [adapter] section (the adapter saved in PEFT's format, read by ``generate --adapter``
and merged by ``tformer merge`` to the same logits), the sft task end to end, peak memory in metrics.jsonl."""

import json

import pytest
import torch
from safetensors.torch import load_file

import tformer
from tformer.adapters import add_lora, load_adapter
from tformer.cli import main
from tformer.nn.stack import set_activation_checkpointing
from tformer.quantization import quantize
from tformer.tokenizers import BPETokenizer
from tformer.tokenizers.byte_level import BYTE_TO_CHAR
from tformer.training import LanguageModelling, Trainer, TrainingConfig, TrainingError
from tformer.training.optim import parameter_groups

START, END = "<|im_start|>", "<|im_end|>"
CHATML = ("{% for m in messages %}" + START + "{{ m.role }}\n{{ m.content }}" + END + "\n{% endfor %}"
          "{% if add_generation_prompt %}" + START + "assistant\n{% endif %}")


@pytest.mark.parametrize("name", ["gpt-nano", "bert-tiny"])
def test_activation_checkpointing_gives_the_same_gradients(name):
    head = {"head": "masked_lm"} if name == "bert-tiny" else {}
    model = tformer.build_model(name, vocab_size=50, dropout=0.1, **head)
    ids = torch.randint(0, 50, (2, 12))
    labels = ids if name == "gpt-nano" else torch.where(torch.rand(2, 12) < 0.3, ids, -100)

    def gradients(checkpointing):
        model.zero_grad()
        set_activation_checkpointing(model, checkpointing)
        torch.manual_seed(3)  # the same dropout masks both ways
        model.train()(ids, labels=labels).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    plain, recomputed = gradients(False), gradients(True)
    assert plain.keys() == recomputed.keys()
    for name_, grad in plain.items():
        assert torch.allclose(grad, recomputed[name_], atol=1e-6, rtol=0), name_


def test_lora_matrices_decay_as_hugging_face_decays_them():
    model = add_lora(tformer.build_model("gpt-nano", vocab_size=50), rank=4)
    decay, no_decay = parameter_groups(model, 0.1)
    adapters = [p for name, p in model.named_parameters() if "lora_" in name]
    assert {id(p) for p in decay["params"]} == {id(p) for p in adapters} and not no_decay["params"]


def test_qlora_trains_its_adapters_and_the_int4_base_stays(tmp_path):
    model = quantize(tformer.build_model("gpt-nano", vocab_size=50), "int4", group_size=32)
    tokens = torch.randint(0, 50, (400,))
    config = TrainingConfig(max_steps=3, batch_size=2, seq_len=16, warmup_steps=0, eval_every=100, threads=1)
    with pytest.raises(TrainingError, match="LoRA adapters over it"):
        Trainer(model, config, LanguageModelling(tokens), progress=False).train()
    add_lora(model, rank=4, targets="all-linear")
    layer = model.stack.blocks[0].attention.qkv_proj
    before = layer.base.qweight.clone()
    adapter_before = layer.lora_B[0].clone()
    Trainer(model, config, LanguageModelling(tokens), progress=False).train()
    assert layer.base.qweight.dtype == torch.uint8 and torch.equal(layer.base.qweight, before)
    assert not torch.equal(layer.lora_B[0], adapter_before)  # the adapter trained


@pytest.fixture
def chat_run(tmp_path):
    """A base model folder with a ChatML template, chat data, and a tiny sft recipe with an [adapter]."""
    tokenizer = BPETokenizer({char: byte for byte, char in enumerate(BYTE_TO_CHAR)}, [])
    tokenizer.add_special_tokens([START, END])
    model = tformer.build_model("gpt-nano", vocab_size=258)
    model.tokenizer = tokenizer
    model.save(tmp_path / "base")
    (tmp_path / "base" / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": END}))
    rows = [{"messages": [{"role": "user", "content": f"{a}+{b}"}, {"role": "assistant", "content": str(a + b)}]}
            for a in range(6) for b in range(4)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "r.toml").write_text("""
[model]
init_from = "base"
[data]
train = "chat.jsonl"
eval_fraction = 0.2
[task]
name = "sft"
[training]
max_steps = 4
batch_size = 4
seq_len = 64
eval_every = 4
warmup_steps = 0
lr = 0.01
threads = 1
activation_checkpointing = true
[adapter]
rank = 4
alpha = 8
targets = "all-linear"
""")
    return tmp_path


def test_lora_through_tformer_train_generate_and_merge(chat_run, capsys):
    out = chat_run / "run"
    assert main(["train", str(chat_run / "r.toml"), "--out", str(out), "--no-progress"]) == 0
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in out.iterdir()}
    assert not (out / "model.safetensors").exists()
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["peak_memory_mib"] > 0 and "eval_loss" in record
    printed = capsys.readouterr().out
    assert "adapter    LoRA rank 4" in printed and "data       training: 19 examples in 10 rows" in printed
    assert f"tformer merge {chat_run / 'base'} {out} --out MERGED" in printed

    assert main(["generate", str(chat_run / "base"), "--adapter", str(out), "--prompt", "1+2",
                 "--max-new-tokens", "3"]) == 0
    assert main(["merge", str(chat_run / "base"), str(out), "--out", str(chat_run / "merged")]) == 0
    ids = torch.randint(0, 258, (2, 20))
    adapted = load_adapter(tformer.load(chat_run / "base"), out).eval()
    merged = tformer.load(chat_run / "merged").eval()
    with torch.no_grad():
        assert (adapted(ids).logits - merged(ids).logits).abs().max() < 1e-5
        assert (tformer.load(chat_run / "base")(ids).logits - merged(ids).logits).abs().max() > 1e-4  # it trained
    assert main(["merge", str(chat_run / "base"), str(out), "--out", str(chat_run / "merged")]) == 2  # not empty


def test_a_tied_head_adapters_run_does_not_offer_the_merge_it_refuses(chat_run, capsys):
    out = chat_run / "tied"
    assert main(["train", str(chat_run / "r.toml"), "--out", str(out), "--no-progress", "--set",
                 'adapter.targets=["all-linear", "lm_head"]']) == 0
    printed = capsys.readouterr().out
    assert "tformer merge" not in printed
    assert "not mergeable: lm_head's weight is the token table (tie_embeddings)" in printed
    assert main(["merge", str(chat_run / "base"), str(out), "--out", str(chat_run / "merged")]) == 2
    assert "lm_head's weight is the token table" in capsys.readouterr().err


def test_qlora_recipe_keeps_its_base_int4(chat_run):
    out = chat_run / "qrun"
    assert main(["train", str(chat_run / "r.toml"), "--out", str(out), "--no-progress", "--set",
                 "adapter.quantize=int4", "--set", "adapter.group_size=32"]) == 0
    model = load_adapter(quantize(tformer.load(chat_run / "base"), "int4", group_size=32), out)
    assert model.stack.blocks[0].attention.qkv_proj.base.qweight.dtype == torch.uint8


def test_a_chat_without_an_answer_is_refused_before_anything_is_written(chat_run, capsys):
    with (chat_run / "chat.jsonl").open("a") as file:
        file.write(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    out = chat_run / "bad"
    assert main(["train", str(chat_run / "r.toml"), "--out", str(out), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert "chat.jsonl:25: a conversation without an assistant turn" in error and len(error.splitlines()) == 1
    assert not out.exists()


def test_an_adapter_over_the_tied_head_checkpoints_and_resumes_to_the_uninterrupted_adapter(chat_run):
    """Under its adapter the head tied to the table is ``lm_head.base.weight``: a checkpoint saves it once (as the
    table) and resuming ties it again, the continuation equal to the run that was never stopped."""
    def train(out, *settings, resume=()):
        command = ["train", str(chat_run / "r.toml"), "--out", str(out), "--no-progress", *resume, "--set",
                   'adapter.targets=["all-linear", "lm_head"]', "--set", "training.schedule=constant",
                   "--set", "training.checkpoint_every=2", "--set", "training.activation_checkpointing=false"]
        assert main(command + [item for setting in settings for item in ("--set", setting)]) == 0
        return load_file(out / "adapter_model.safetensors")

    whole = train(chat_run / "whole")
    train(chat_run / "halves", "training.max_steps=2")
    resumed = train(chat_run / "halves", "training.max_steps=4", resume=("--resume", "auto"))
    assert any(".lm_head.lora_B" in name for name in whole) and whole.keys() == resumed.keys()
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)
