"""Hugging Face interop of the mixture-of-experts families: Mixtral and Qwen2-MoE folders load with HF's logits, decode
as HF ``generate``, route every token to the experts HF routes it to, give HF's load-balancing loss, and save back
to folders HF loads with the same logits.

Every folder is a seeded random HF model written by ``save_pretrained`` (nothing is downloaded), its parameters
perturbed off their initial values so a mis-mapped tensor cannot hide; HF runs with eager attention. As in
test_interop.py, HF gets the mask-derived position ids of a left-padded batch, and logits are compared at real
tokens. tformer's logits differ from HF's by at most 5e-7 on these models (float32 sums in another order; the
experts' outputs are added in the same expert order), so 1e-5 leaves two orders of magnitude.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")
from transformers import MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM  # noqa: E402

import tformer  # noqa: E402
from tformer.checkpoint import CheckpointError  # noqa: E402
from tformer.interop import family_for_config, family_for_model_type  # noqa: E402
from tformer.nn.experts import (  # noqa: E402
    auxiliary_loss,
    load_balancing_loss,
    mixtures,
    recording_router_logits,
    router_logits,
)

pytestmark = pytest.mark.slow  # compares with transformers

transformers.logging.set_verbosity_error()

TOLERANCE = 1e-5
VOCAB = 97
CLASSES = {"mixtral": (MixtralConfig, MixtralForCausalLM), "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM)}
TINY = {
    "mixtral": dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64, router_aux_loss_coef=0.02),
    "qwen2_moe": dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=40, moe_intermediate_size=24,
                      shared_expert_intermediate_size=20, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, eos_token_id=2),
}
# 4 and 8 experts, top-1 to top-3, renormalised or not, grouped- and multi-query attention, tied and untied heads,
# Mixtral's sliding window shorter than the batches and prompts
CASES = {
    "mixtral-4x-top1": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 1}),
    "mixtral-8x-top2-window-5": ("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 5}),
    "mixtral-4x-top2-tied-mqa": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2,
                                             "tie_word_embeddings": True, "num_key_value_heads": 1}),
    "qwen2-moe-4x-top2": ("qwen2_moe", {"num_experts": 4, "num_experts_per_tok": 2}),
    "qwen2-moe-8x-top3-renormalised": ("qwen2_moe", {"num_experts": 8, "num_experts_per_tok": 3,
                                                     "norm_topk_prob": True}),
    "qwen2-moe-8x-top1-tied-mqa": ("qwen2_moe", {"num_experts": 8, "num_experts_per_tok": 1,
                                                 "tie_word_embeddings": True, "num_key_value_heads": 1}),
}


def hf_moe(case: str, folder=None, **save_options) -> torch.nn.Module:
    """A seeded, perturbed random HF model of ``case`` (saved into ``folder`` when given)."""
    model_type, overrides = CASES[case]
    config_class, model_class = CLASSES[model_type]
    torch.manual_seed(0)
    model = model_class(config_class(**{**TINY[model_type], **overrides}, attn_implementation="eager"))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    if folder is not None:
        model.save_pretrained(folder, **save_options)
    return model.eval()


def hf_from_folder(folder) -> torch.nn.Module:
    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    return CLASSES[model_type][1].from_pretrained(folder, attn_implementation="eager").eval()


def random_ids(batch: int = 2, length: int = 12, seed: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def left_padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of 12 positions: 0, 4 and 9 of them left padding (pad id 0)."""
    input_ids = random_ids(3, 12, seed=3)
    attention_mask = torch.ones_like(input_ids)
    for row, pads in enumerate((0, 4, 9)):
        attention_mask[row, :pads] = 0
        input_ids[row, :pads] = 0
    return input_ids, attention_mask


def hf_inputs(attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """HF's mask and the mask-derived positions tformer counts itself."""
    return {"attention_mask": attention_mask, "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0)}


@torch.no_grad()
def max_logit_difference(ours, theirs, input_ids, attention_mask=None) -> float:
    """Largest |tformer - HF| logit at real (non-padding) tokens."""
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    our_logits = ours(input_ids, attention_mask=attention_mask).logits
    their_logits = theirs(input_ids, **hf_inputs(mask)).logits
    real = mask.bool()
    assert their_logits[real].std() > 0.1  # a real comparison, not of near-constant outputs
    return (our_logits - their_logits)[real].abs().max().item()


def assert_same_logits(ours, theirs, label: str) -> None:
    plain = max_logit_difference(ours, theirs, random_ids())
    padded = max_logit_difference(ours, theirs, *left_padded_batch())
    print(f"max |logit difference| {label}: {plain:.2e} plain, {padded:.2e} left-padded")
    assert plain < TOLERANCE and padded < TOLERANCE


def until_end(sequences: torch.Tensor, prompt_length: int, end: int | None) -> torch.Tensor:
    """The sequences with what follows each new end token blanked (-1): HF's beam search fills a finished row with
    its end token where tformer pads it."""
    new = sequences[:, prompt_length:]
    is_end = (new == end).long() if end is not None else torch.zeros_like(new)
    ended = is_end.cumsum(dim=1) - is_end > 0
    return torch.cat([sequences[:, :prompt_length], new.masked_fill(ended, -1)], dim=1)


# ---- HF -> tformer ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_moe_folders_give_hf_logits(tmp_path, case):
    reference = hf_moe(case, tmp_path)
    model = tformer.load(tmp_path)
    config = model.config
    assert (config.num_experts, config.num_experts_per_token) == (reference.config.num_local_experts if
                                                                  "mixtral" in case else reference.config.num_experts,
                                                                  reference.config.num_experts_per_tok)
    assert len(mixtures(model)) == 2
    assert_same_logits(model, reference, case)


@pytest.mark.parametrize("case", CASES)
def test_moe_decodes_as_hf_generate_greedy_and_beam_4(tmp_path, case):
    """Greedy and beam-4 decoding with tformer's caches equal HF ``generate`` token for token on a left-padded
    batch (Mixtral's window shorter than the prompts: its rolling cache is exercised)."""
    reference = hf_moe(case, tmp_path)
    model = tformer.load(tmp_path)
    ids, mask = left_padded_batch()
    end = reference.config.eos_token_id
    for beams in (1, 4):
        expected = reference.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, num_beams=beams,
                                      eos_token_id=end, pad_token_id=0)
        got = tformer.generate(model, ids, 8, attention_mask=mask, num_beams=beams, pad_token_id=0)
        assert torch.equal(until_end(got, ids.shape[1], end), until_end(expected, ids.shape[1], end)), \
            f"{case}, {beams} beam(s)"


@pytest.mark.parametrize("case", ["mixtral-8x-top2-window-5", "qwen2-moe-4x-top2", "qwen2-moe-8x-top3-renormalised"])
def test_router_choices_and_load_balancing_loss_equal_hf(tmp_path, case):
    """Per layer the router logits and each real token's chosen experts equal HF's; the auxiliary loss equals HF's
    ``aux_loss`` on a left-padded batch, and the training loss (next-token loss + coefficient x aux) HF's ``loss``."""
    reference = hf_moe(case, tmp_path)
    model = tformer.load(tmp_path)
    ids, mask = left_padded_batch()
    top_k = model.config.num_experts_per_token
    with torch.no_grad(), recording_router_logits(model):
        model(ids, attention_mask=mask)
        theirs = reference(ids, **hf_inputs(mask), output_router_logits=True)
        ours = router_logits(model)
        real = mask.reshape(-1).bool()
        assert len(ours) == len(theirs.router_logits) == 2
        for our_layer, their_layer in zip(ours, theirs.router_logits, strict=True):
            assert (our_layer[real] - their_layer[real]).abs().max() < 1e-5
            assert torch.equal(our_layer[real].topk(top_k).indices, their_layer[real].topk(top_k).indices)
        aux = load_balancing_loss(ours, model.config.num_experts, top_k, mask)
        print(f"{case}: aux loss {aux.item():.6f}, HF {theirs.aux_loss.item():.6f}")
        assert abs(aux.item() - theirs.aux_loss.item()) < 1e-6

        unpadded = random_ids()
        loss = model(unpadded, labels=unpadded).loss + auxiliary_loss(mixtures(model))
        their_loss = reference(unpadded, labels=unpadded, output_router_logits=True).loss
    assert model.config.router_aux_loss_coef == reference.config.router_aux_loss_coef
    assert abs(loss.item() - their_loss.item()) < 1e-5


def test_transformers_5_fused_expert_layout_loads(tmp_path):
    """``save_pretrained(save_original_format=False)`` writes the experts as transformers 5 holds them (3-D
    gate_up_proj and down_proj tensors, the router under ``mlp.``): read too."""
    for case in ("mixtral-4x-top2-tied-mqa", "qwen2-moe-4x-top2"):
        reference = hf_moe(case, tmp_path / case, save_original_format=False)
        names = load_file(str(tmp_path / case / "model.safetensors"))
        assert "model.layers.0.mlp.experts.gate_up_proj" in names
        assert_same_logits(tformer.load(tmp_path / case), reference, f"{case} fused")


def test_mixtral_rope_base_defaults_to_mixtrals(tmp_path):
    """A config.json without any RoPE key: MixtralConfig's base is 1e6 (Mistral's 1e4)."""
    hf_moe("mixtral-4x-top1", tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw.pop("rope_parameters", None)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert hf_from_folder(tmp_path).config.rope_parameters["rope_theta"] == 1000000.0
    assert tformer.load(tmp_path).config.rope_theta == 1000000.0


# ---- tformer -> HF ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_moe_folders_round_trip_to_hf(tmp_path, case):
    """HF folder -> tformer -> HF folder of the same model_type: every tensor back bit for bit under the Hub's
    per-expert names, HF's logits of the written folder equal tformer's, and the config reads back equal."""
    model_type = CASES[case][0]
    hf_moe(case, tmp_path / "original")
    model = tformer.load(tmp_path / "original")
    model.save(tmp_path / "written", format="hf")
    assert json.loads((tmp_path / "written" / "config.json").read_text())["model_type"] == model_type
    original = load_file(str(tmp_path / "original" / "model.safetensors"))
    written = load_file(str(tmp_path / "written" / "model.safetensors"))
    assert sorted(written) == sorted(original)
    assert all(torch.equal(written[name], original[name]) for name in original)
    assert_same_logits(model, hf_from_folder(tmp_path / "written"), f"round trip {case}")
    assert tformer.load(tmp_path / "written").config == model.config


MOE_CONFIG = dict(vocab_size=VOCAB, max_seq_len=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                  activation="swiglu", norm="rmsnorm", positional="rope", bias=False, tie_embeddings=False,
                  num_experts=4, num_experts_per_token=2, d_ff=24)


@pytest.mark.parametrize("changes, model_type", [
    ({}, "mixtral"),
    ({"attention_bias": True, "output_bias": False, "norm_bias": False, "feedforward_bias": False, "d_ff": 40,
      "moe_d_ff": 24, "norm_topk_prob": False, "shared_expert_d_ff": 20, "shared_expert_gate": True}, "qwen2_moe"),
])
def test_a_tformer_mixture_is_written_as_the_family_that_holds_it(tmp_path, changes, model_type):
    torch.manual_seed(0)
    model = tformer.build_model(tformer.ModelConfig(**{**MOE_CONFIG, **changes})).eval()
    model.save(tmp_path, format="hf")
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == model_type
    assert_same_logits(model, hf_from_folder(tmp_path), f"tformer -> {model_type}")


@pytest.mark.parametrize("changes, message", [
    ({"norm_topk_prob": False}, r"as mixtral: norm_topk_prob=False \(needs True\)"),
    ({"moe_d_ff": 16}, r"as mixtral: moe_d_ff=16 \(needs 24\)"),
    ({"shared_expert_d_ff": 8}, r"as mixtral: shared_expert_d_ff=8 \(needs 0\)"),
])
def test_a_mixture_no_family_holds_is_refused_naming_the_field(tmp_path, changes, message):
    model = tformer.build_model(tformer.ModelConfig(**{**MOE_CONFIG, **changes}))
    with pytest.raises(CheckpointError, match=message):
        model.save(tmp_path / "out", format="hf")
    assert not (tmp_path / "out").exists()


def test_dense_families_refuse_a_mixture_and_the_mixtures_a_dense_model():
    mixture = tformer.ModelConfig(**{**MOE_CONFIG, "norm_topk_prob": False})  # no family holds it
    with pytest.raises(CheckpointError, match=r"as llama: .*num_experts=4 \(needs 0: not a llama setting\)"):
        family_for_config(mixture)
    dense = {name: value for name, value in MOE_CONFIG.items() if name not in ("num_experts", "num_experts_per_token")}
    dense = tformer.ModelConfig(**dense)
    assert family_for_config(dense).model_type == "llama"
    for model_type in ("mixtral", "qwen2_moe"):
        mismatches = family_for_model_type(model_type).mismatches(dense)
        assert any(phrase.startswith("num_experts=0 (needs > 0") for phrase in mismatches)


# ---- refused folders ------------------------------------------------------------------------------


@pytest.mark.parametrize("case, changes, message", [
    ("qwen2-moe-4x-top2", {"decoder_sparse_step": 2}, "qwen2_moe decoder_sparse_step=2 is not supported"),
    ("qwen2-moe-4x-top2", {"mlp_only_layers": [1]}, r"qwen2_moe mlp_only_layers=\[1\] is not supported"),
    ("qwen2-moe-4x-top2", {"qkv_bias": False}, "qwen2_moe qkv_bias=False is not supported"),
    ("qwen2-moe-4x-top2", {"use_sliding_window": True}, "qwen2_moe use_sliding_window=True is not supported"),
    ("qwen2-moe-4x-top2", {"num_experts": 0}, r"qwen2_moe num_experts=0 is not supported by tformer \(needs > 0\)"),
    ("qwen2-moe-4x-top2", {"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size=0"),
    ("qwen2-moe-4x-top2", {"num_experts_per_tok": 5}, "num_experts_per_token=5 must be at most num_experts=4"),
    ("mixtral-4x-top1", {"router_jitter_noise": 0.1}, "mixtral router_jitter_noise=0.1 is not supported"),
    ("mixtral-4x-top1", {"model_type": "olmoe"}, "model_type 'olmoe' is not supported"),
])
def test_moe_features_tformer_lacks_are_refused_in_one_line(tmp_path, case, changes, message):
    hf_moe(case, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, **changes}))
    with pytest.raises(CheckpointError, match=message) as error:
        tformer.load(tmp_path)
    assert "\n" not in str(error.value)


def test_a_missing_expert_weight_is_named(tmp_path):
    hf_moe("mixtral-4x-top1", tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.block_sparse_moe\.experts\.3\.w2\.weight"):
        tformer.load(tmp_path)
