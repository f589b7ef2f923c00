"""Every command on today's open checkpoints (issue 55, point 5): for a tiny random folder of each family written by
transformers (Llama with Llama 3's RoPE scaling, Qwen2, Mistral with a window, Gemma, Phi-3, Mixtral, Qwen2-MoE),
``tformer generate`` decodes what transformers' ``generate`` decodes (the folder's generation_config.json sampling
settings, penalty and end-id list included), ``tformer quantize`` int8/int4 writes folders generate runs (a
mixture's experts quantized too; int8 logits near fp32's), ``tformer train`` fine-tunes from the folder,
``tformer convert --to hf`` writes a folder transformers loads with the same logits, the folder loads by Hub name
from a Hugging Face cache with the network off, and bf16/fp16 load and generate.

The folders are test_interop.py's and test_interop_moe.py's (``hf_decoder``, ``hf_moe``) with a character
tokenizer of exactly their 97 ids beside them; the commands run in this process (``tformer.cli.main``)."""

from __future__ import annotations

import json
import shutil
import socket
import string

import pytest
import torch
from safetensors.torch import load_file
from test_hub_cache import _add_snapshot
from test_interop import LLAMA_CASES, OPEN_CASES, VOCAB, hf_decoder, hf_from_folder, random_ids
from test_interop_moe import hf_from_folder as hf_moe_from_folder
from test_interop_moe import hf_moe

import tformer
from tformer.cli import main
from tformer.tokenizers import CharTokenizer

transformers = pytest.importorskip("transformers")
hub_constants = pytest.importorskip("huggingface_hub.constants")

pytestmark = pytest.mark.slow  # compares with transformers

PROMPT = "Hello, world"
NEW = 8
TEXT = "the quick brown fox jumps over the lazy dog; Hello, world! 12345\n" * 24
FAMILIES = {
    "llama3": lambda folder: hf_decoder("llama", folder, **LLAMA_CASES["rope-llama3"]),
    "qwen2": lambda folder: hf_decoder("qwen2", folder, **OPEN_CASES["qwen2-untied"][1]),
    "mistral": lambda folder: hf_decoder("mistral", folder, **OPEN_CASES["mistral-window-5"][1]),
    "gemma": lambda folder: hf_decoder("gemma", folder, **OPEN_CASES["gemma"][1]),
    "phi3": lambda folder: hf_decoder("phi3", folder, **OPEN_CASES["phi3-mini"][1]),
    "mixtral": lambda folder: hf_moe("mixtral-4x-top2-tied-mqa", folder),
    "qwen2_moe": lambda folder: hf_moe("qwen2-moe-4x-top2", folder),
}
MIXTURES = ("mixtral", "qwen2_moe")
# int8 (one scale per output channel) moves each weight by at most half a step, 1/254 of its row's largest. Over
# these two-layer models (logits' standard deviation about 0.33) the dense families' logits move by at most 0.016
# and by 0.003 or less on average (measured); a mixture's token whose top-k experts nearly tie may switch experts
# under that rounding (Mixtral's case: max 0.064 on one token), so the bound on the largest move is 0.1 and on the
# mean 0.01. A mapping error (a wrong scale, a transposed row) moves them by the logits' own size.
INT8_MAX, INT8_MEAN = 0.1, 0.01


def _tokenizer() -> CharTokenizer:
    """94 printable characters after <unk>, <s>, </s> (ids 0, 1, 2, the families' defaults): exactly the models'
    97 ids, so every id a random model picks has a text."""
    characters = (string.ascii_letters + string.digits + " " + string.punctuation)[:VOCAB - 3]
    return CharTokenizer(characters, ("<unk>", "<s>", "</s>"))


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(name, folder, the transformers model saved there)."""
    folder = tmp_path_factory.mktemp("commands") / request.param
    reference = FAMILIES[request.param](folder).eval()
    _tokenizer().save(folder / "tokenizer.json")
    return request.param, folder, reference


def _hf(folder):
    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    return hf_moe_from_folder(folder) if model_type in MIXTURES else hf_from_folder(folder)


def _generated(capsys, *args) -> str:
    assert main(["generate", *(str(arg) for arg in args), "--prompt", PROMPT, "--max-new-tokens", str(NEW)]) == 0
    return capsys.readouterr().out.removesuffix("\n")


def _hf_text(reference, **options) -> str:
    tokenizer = _tokenizer()
    ids = torch.tensor([tokenizer.encode(PROMPT)])
    new = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, **options)
    return PROMPT + tokenizer.decode(new[0, ids.shape[1]:].tolist())


def test_generate_decodes_as_transformers_generate(family, capsys):
    name, folder, reference = family
    assert _generated(capsys, folder) == _hf_text(reference, do_sample=False)


def test_generation_config_defaults_are_honoured_as_transformers_honours_them(family, tmp_path, capsys):
    """do_sample with top_k 1 (so the draw is the penalised argmax whatever the seed), temperature, top_p, a
    repetition_penalty (5: strong enough that no family's 8 tokens repeat one) and a three-id end list whose last
    id is the 5th token transformers produces."""
    name, folder, reference = family
    settings = {"do_sample": True, "top_k": 1, "temperature": 0.7, "top_p": 0.8, "repetition_penalty": 5.0}
    free = _hf_text(reference, **settings, eos_token_id=None)
    end = _tokenizer().encode(free[len(PROMPT) + 4])[0]
    assert end not in _tokenizer().encode(free[len(PROMPT):len(PROMPT) + 4])
    copy = tmp_path / name
    shutil.copytree(folder, copy)
    raw = json.loads((copy / "generation_config.json").read_text())
    (copy / "generation_config.json").write_text(json.dumps({**raw, **settings, "eos_token_id": [2, 0, end]}))
    hf = _hf(copy)
    expected = _hf_text(hf)
    assert len(expected) == len(PROMPT) + 5  # the end list bites
    assert _generated(capsys, copy) == expected


def _stored(folder) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.mark.parametrize("bits", [8, 4])
def test_quantize_writes_a_folder_generate_runs(family, tmp_path, capsys, bits):
    name, folder, reference = family
    out = tmp_path / f"int{bits}"
    options = ["--group-size", "32"] if bits == 4 else []
    assert main(["quantize", str(folder), "--bits", str(bits), *options, "--out", str(out)]) == 0
    capsys.readouterr()
    assert _generated(capsys, out).startswith(PROMPT)
    stored = _stored(out)
    quantized = {key.removesuffix(".qweight") for key in stored if key.endswith(".qweight")}
    assert "stack.blocks.0.attention.q_proj" in quantized or any("attention" in key for key in quantized)
    if name in MIXTURES:  # every expert: int8 whole; int4 where its inputs are a multiple of the group (32)
        model = tformer.load(folder)
        experts = {f"stack.{key}" for key, module in model.stack.named_modules() if ".experts." in key
                   and isinstance(module, torch.nn.Linear) and (bits == 8 or module.in_features % 32 == 0)}
        assert experts and experts <= quantized, sorted(experts - quantized)
    if bits == 8:
        ours, exact = tformer.load(out), tformer.load(folder)
        ids = random_ids()
        with torch.no_grad():
            difference = (ours(ids).logits - exact(ids).logits).abs()
        print(f"{name} int8: |logit - fp32 logit| max {difference.max():.4f}, mean {difference.mean():.4f}")
        assert difference.max() < INT8_MAX and difference.mean() < INT8_MEAN


def _loss(model, ids) -> float:
    with torch.no_grad():
        return model(ids, labels=ids).loss.item()


def test_train_fine_tunes_from_the_folder(family, tmp_path, capsys):
    name, folder, reference = family
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "recipe.toml").write_text(
        f'[model]\ninit_from = "{folder}"\n[data]\ntrain = "corpus.txt"\neval_fraction = 0.2\n[task]\nname = "lm"\n'
        "[training]\nmax_steps = 8\nbatch_size = 4\nseq_len = 32\nlr = 0.01\nwarmup_steps = 0\neval_every = 8\n"
        "threads = 1\n")
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "recipe.toml"), "--out", str(run), "--no-progress"]) == 0
    tuned, start = tformer.load(run), tformer.load(folder)
    assert tuned.config == start.config
    ids = torch.tensor([_tokenizer().encode(TEXT[:96])])
    before, after = _loss(start, ids), _loss(tuned, ids)
    print(f"{name}: loss {before:.3f} -> {after:.3f} after 8 steps")
    assert after < before - 0.1


def test_convert_back_to_hugging_face_gives_its_logits(family, tmp_path):
    name, folder, reference = family
    assert main(["convert", str(folder), str(tmp_path / "hf"), "--to", "hf"]) == 0
    written = json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"]
    assert written == json.loads((folder / "config.json").read_text())["model_type"]
    back = _hf(tmp_path / "hf")
    ids = random_ids()
    with torch.no_grad():
        assert (back(ids).logits - reference(ids).logits).abs().max().item() < 1e-5


def test_loads_by_hub_name_from_the_cache_offline(family, tmp_path, monkeypatch, capsys):
    name, folder, reference = family
    cache = tmp_path / "cache"
    _add_snapshot(cache, f"tiny-org/{name}", "c" * 40, folder, symlinks=True, refs=("main",))
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)

    def no_network(self, *args, **kwargs):
        raise AssertionError(f"a connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.chdir(tmp_path)
    expected = _generated(capsys, folder)
    assert _generated(capsys, f"tiny-org/{name}") == expected
    model = tformer.load(f"tiny-org/{name}")
    ids = random_ids()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, tformer.load(folder)(ids).logits)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_precision_loads_and_generates(family, capsys, dtype):
    name, folder, reference = family
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    model = tformer.load(folder, dtype=torch_dtype)
    assert {parameter.dtype for parameter in model.parameters()} == {torch_dtype}
    # built in the type and the weights read into it: every tensor what a cast after a float32 load gives
    cast_after = tformer.load(folder).to(torch_dtype).state_dict()
    assert all(torch.equal(tensor, cast_after[name]) for name, tensor in model.state_dict().items())
    text = _generated(capsys, folder, "--dtype", dtype)
    ids = torch.tensor([model.tokenizer.encode(PROMPT)])
    assert text == PROMPT + model.tokenizer.decode(tformer.generate(model, ids, NEW)[0, ids.shape[1]:].tolist())
