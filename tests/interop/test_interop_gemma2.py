"""Gemma 2 beyond the rows of test_interop.py's table (OPEN_CASES ``gemma2-*``: logits within 1e-5 plain and
left-padded, greedy and beam-4 ``generate`` token for token, the round trip): each of its switches bends
transformers' own logits (so that parity is a test of each), ``tformer generate`` decodes a folder as
transformers' ``generate`` does, a model built in tformer is written as a gemma2 folder transformers reads with
the same logits, and what gemma2 cannot hold is refused naming the field and its value."""

from __future__ import annotations

import json
import string

import pytest
import torch
from test_interop import (
    OPEN_CASES,
    TOLERANCE,
    VOCAB,
    hf_decoder,
    hf_from_folder,
    left_padded_batch,
    max_logit_difference,
    perturbed,
    random_ids,
)

import tformer
from tformer.checkpoint import CheckpointError
from tformer.cli import main
from tformer.models import build_model
from tformer.tokenizers import CharTokenizer

pytestmark = pytest.mark.slow  # compares with transformers

CASES = {name: overrides for name, (model_type, overrides) in OPEN_CASES.items() if model_type == "gemma2"}
# Each switch set to another value (a window no sequence fills: none)
OTHER_VALUES = {"attn_logit_softcapping": None, "final_logit_softcapping": None, "query_pre_attn_scalar": 1,
                "sliding_window": 64}
GEMMA2_LIKE = dict(vocab_size=VOCAB, max_seq_len=64, d_model=36, num_layers=3, num_heads=4, num_kv_heads=2,
                   head_dim=12, d_ff=45, positional="rope", norm="rmsnorm_plus_one", norm_eps=1e-6,
                   norm_position="sandwich", activation="geglu_tanh", bias=False, scale_embeddings=True,
                   attention_kernel="chunked", attention_softcap=0.5, query_pre_attn_scalar=7,
                   final_logit_softcap=2.0, bos_token_id=2, eos_token_id=1, pad_token_id=0)


@pytest.mark.parametrize("case", CASES)
def test_each_switch_bends_transformers_own_logits(case):
    overrides = CASES[case]
    ids = random_ids()
    with torch.no_grad():
        logits = hf_decoder("gemma2", **overrides)(ids).logits
        for key, value in OTHER_VALUES.items():
            if overrides.get(key) is not None:
                other = hf_decoder("gemma2", **{**overrides, key: value})(ids).logits
                assert (logits - other).abs().max() > 1e-3, key  # 100 times the parity's bound


def test_tformer_generate_decodes_as_transformers_generate(tmp_path, capsys):
    """Greedy and beam-4 from the command line on a folder with a window of 5 shorter than the 12-character
    prompt; a character tokenizer of exactly the model's 97 ids (<unk>, <s>, </s> first)."""
    reference = hf_decoder("gemma2", tmp_path, **CASES["gemma2-window-5-softcaps"])
    tokenizer = CharTokenizer((string.ascii_letters + string.digits + " " + string.punctuation)[:VOCAB - 3],
                              ("<unk>", "<s>", "</s>"))
    tokenizer.save(tmp_path / "tokenizer.json")
    prompt = "Hello, world"
    ids = torch.tensor([tokenizer.encode(prompt)])
    for beams in (1, 4):
        assert main(["generate", str(tmp_path), "--prompt", prompt, "--max-new-tokens", "8",
                     "--num-beams", str(beams)]) == 0
        new = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                 num_beams=beams)[0, ids.shape[1]:]
        expected = prompt + tokenizer.decode(new.tolist())
        assert capsys.readouterr().out.removesuffix("\n") == expected, f"{beams} beam(s)"


@pytest.mark.parametrize("windows", [{"layer_attention_windows": (4, 0, 4)},
                                     {"attention_kernel": "sliding_window", "attention_window": 4}],
                         ids=["windows-on-layers-0-and-2", "window-on-every-layer"])
def test_a_tformer_model_is_written_as_gemma2_and_transformers_reads_it(tmp_path, windows):
    torch.manual_seed(0)
    model = perturbed(build_model(tformer.ModelConfig(**{**GEMMA2_LIKE, **windows})))
    model.save(tmp_path, format="hf")
    written = json.loads((tmp_path / "config.json").read_text())
    expected_types = ["sliding_attention", "full_attention", "sliding_attention"]
    if "attention_window" in windows:
        expected_types = ["sliding_attention"] * 3
    assert (written["model_type"], written["layer_types"], written["sliding_window"]) == ("gemma2", expected_types, 5)
    assert (written["attn_logit_softcapping"], written["final_logit_softcapping"]) == (0.5, 2.0)
    assert written["query_pre_attn_scalar"] == 7
    reference = hf_from_folder(tmp_path)
    plain = max_logit_difference(model, reference, random_ids())
    padded = max_logit_difference(model, reference, *left_padded_batch())
    print(f"max |logit difference| tformer -> gemma2 {windows}: {plain:.2e} plain, {padded:.2e} left-padded")
    assert plain < TOLERANCE and padded < TOLERANCE
    loaded = tformer.load(tmp_path).config
    if "attention_window" not in windows:
        assert loaded.replace(extra={}) == model.config


def test_what_gemma2_cannot_hold_is_refused_naming_it(tmp_path):
    model = build_model(tformer.ModelConfig(**GEMMA2_LIKE, layer_attention_windows=(4, 0, 6)))
    with pytest.raises(CheckpointError, match=r"as gemma2: layer_attention_windows=\(4, 0, 6\) \(needs one window "
                                              r"size: gemma2's sliding_window is the same on every local layer\)"):
        model.save(tmp_path / "out", format="hf")
    assert not (tmp_path / "out").exists()
    pre_norm = build_model(tformer.ModelConfig(**{**GEMMA2_LIKE, "norm_position": "pre"}))
    with pytest.raises(CheckpointError, match=r"as gemma2: norm_position='pre' \(needs 'sandwich'\)"):
        pre_norm.save(tmp_path / "out", format="hf")
