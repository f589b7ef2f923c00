"""Hugging Face interop: GPT-2 and Llama checkpoints load with HF's logits and save back.

Every checkpoint here is a seeded random Hugging Face model written by ``save_pretrained`` (or
by hand, for older file layouts) into a temporary folder: nothing is downloaded. Parameters
are perturbed after HF's initialisation so that biases and norm weights are not 0 and 1 and a
mis-mapped tensor cannot hide. HF runs with eager attention as the reference.

Positions with left padding: tformer derives position ids from ``attention_mask`` itself; HF's
forward uses 0..T-1 unless told otherwise, so HF gets the same mask-derived ``position_ids``
explicitly (as HF's own ``generate`` does), and logits are compared at real tokens only. This
matters for GPT-2's learned position table; RoPE (Llama) only sees relative positions, so there
a shared offset would not change the logits anyway.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    Gemma2Config,
    Gemma2ForCausalLM,
    GemmaConfig,
    GemmaForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import tformer  # noqa: E402
from tformer.checkpoint import CheckpointError  # noqa: E402
from tformer.cli import main as cli_main  # noqa: E402
from tformer.interop import family_for_model_type  # noqa: E402
from tformer.models import build_model  # noqa: E402
from tformer.tokenizers import CharTokenizer, TokenizerError  # noqa: E402

pytestmark = pytest.mark.slow  # compares with transformers

transformers.logging.set_verbosity_error()

# tformer's logits differ from HF's by 2e-7 to 5e-7 on these tiny models and by 2e-6 on GPT-2 124M
# (float32 sums in another order); a GELU mapped to its tanh approximation is 7.7e-5 off.
TOLERANCE = 1e-5
VOCAB = 97
GPT2_TINY = dict(vocab_size=VOCAB, n_positions=40, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
LLAMA_TINY = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64,
)
GPT2_CASES = {
    "tied": {},
    "untied": {"tie_word_embeddings": False},
    "exact-gelu-custom-inner": {"activation_function": "gelu", "n_inner": 48, "layer_norm_epsilon": 1e-6},
}
LLAMA_CASES = {
    "gqa-untied": {},
    "gqa-tied": {"tie_word_embeddings": True},
    "mqa-biases-wide-heads-theta": {
        "num_key_value_heads": 1, "head_dim": 16, "attention_bias": True, "mlp_bias": True,
        "rms_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    },
}
# Llama 3.x and the other RoPE scalings, each with a context short enough that the 12-token batches and the
# generation tests pass it (dynamic scaling changes only past max_position_embeddings).
LLAMA_ROPE_CASES = {
    "rope-linear": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
    "rope-dynamic": {"max_position_embeddings": 8,
                     "rope_parameters": {"rope_type": "dynamic", "factor": 3.0, "rope_theta": 10000.0}},
    "rope-yarn": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 6,
                                      "rope_theta": 10000.0}},
    "rope-longrope": {"rope_parameters": {"rope_type": "longrope", "original_max_position_embeddings": 6,
                                          "short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [1.5, 3.0, 6.0, 9.0],
                                          "rope_theta": 10000.0}},
    "rope-llama3": {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
                                        "rope_theta": 500000.0}},
}
LLAMA_CASES.update(LLAMA_ROPE_CASES)
PHI3_TOKENS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}  # Phi3Config's 32000 is past VOCAB
GEMMA2_TINY = {"hidden_size": 36, "intermediate_size": 45, "num_hidden_layers": 3, "head_dim": 12,
               "query_pre_attn_scalar": 13, "attn_logit_softcapping": 0.3, "final_logit_softcapping": 2.5,
               "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
# Today's Llama-shaped families: Qwen2 (biases on q, k and v only; a large RoPE base; often tied) and Mistral (a
# sliding window, here shorter than the 12-token batches and the prompts of the generation tests).
OPEN_CASES = {
    "qwen2-untied": ("qwen2", {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
    "qwen2-tied-mqa": ("qwen2", {"tie_word_embeddings": True, "num_key_value_heads": 1, "head_dim": 16}),
    "qwen2-yarn": ("qwen2", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 6, "rope_theta": 10000.0}}),
    "mistral-window-5": ("mistral", {"sliding_window": 5}),
    "mistral-no-window": ("mistral", {"sliding_window": None}),
    "mistral-window-7-llama3": ("mistral", {"sliding_window": 7, "num_key_value_heads": 4, "rope_parameters": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64, "rope_theta": 500000.0}}),
    # Phi-3: fused projections; its long variants' LongRoPE past original_max_position_embeddings (top-level), a
    # window, and rotary on half of each head (Phi-4-mini rotates 3/4)
    "phi3-mini": ("phi3", {"sliding_window": None, **PHI3_TOKENS}),
    "phi3-longrope-window": ("phi3", {**PHI3_TOKENS, "sliding_window": 9, "original_max_position_embeddings": 6,
                                      "rope_parameters": {
        "rope_type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [1.5, 3.0, 6.0, 9.0],
        "rope_theta": 10000.0}}),
    "phi3-partial-rotary": ("phi3", {**PHI3_TOKENS, "sliding_window": None, "tie_word_embeddings": True,
                                     "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}),
    # Gemma: (1 + w) RMSNorm, embeddings scaled by sqrt(d), GeGLU with the tanh GELU, heads wider than d / heads
    "gemma": ("gemma", {"head_dim": 16, "hidden_act": "gelu_pytorch_tanh", "bos_token_id": 2, "eos_token_id": 1,
                        "pad_token_id": 0}),
    "gemma-mqa-untied-legacy-gelu": ("gemma", {"num_key_value_heads": 1, "tie_word_embeddings": False,
                                               "hidden_act": "gelu", "pad_token_id": 0}),
    # Gemma 2: four norms a block, query_pre_attn_scalar, attention and final logits soft-capped (caps low enough
    # to bend these tiny models' scores and logits), a window of 5 < the 12-token batches on the layers
    # layer_types names (by default 0, 2, ...), odd sizes
    "gemma2-window-5-softcaps": ("gemma2", {**GEMMA2_TINY, "sliding_window": 5}),
    "gemma2-layer-types-mqa-untied": ("gemma2", {
        **GEMMA2_TINY, "num_key_value_heads": 1, "tie_word_embeddings": False, "sliding_window": 7,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention"], "final_logit_softcapping": 4.0,
        "query_pre_attn_scalar": 16}),
    "gemma2-no-attention-cap": ("gemma2", {**GEMMA2_TINY, "sliding_window": 4, "attn_logit_softcapping": None}),
}


# ---- helpers ----------------------------------------------------------------------------------


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` in eval mode with every parameter moved off its initial value (seeded)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def hf_gpt2(folder=None, **overrides) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    model = perturbed(GPT2LMHeadModel(GPT2Config(**{**GPT2_TINY, **overrides}, attn_implementation="eager")))
    if folder is not None:
        model.save_pretrained(folder)
    return model


# The Llama-shaped families: config and LM classes by model_type, each made at LLAMA_TINY's sizes.
LLAMA_SHAPED = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                "mistral": (MistralConfig, MistralForCausalLM), "phi3": (Phi3Config, Phi3ForCausalLM),
                "gemma": (GemmaConfig, GemmaForCausalLM), "gemma2": (Gemma2Config, Gemma2ForCausalLM)}


def hf_decoder(model_type: str, folder=None, **overrides) -> torch.nn.Module:
    """A seeded, perturbed random HF model of a Llama-shaped family (saved into ``folder`` when given)."""
    torch.manual_seed(0)
    config_class, model_class = LLAMA_SHAPED[model_type]
    model = perturbed(model_class(config_class(**{**LLAMA_TINY, **overrides}, attn_implementation="eager")))
    if folder is not None:
        model.save_pretrained(folder)
    return model


def hf_llama(folder=None, **overrides) -> LlamaForCausalLM:
    return hf_decoder("llama", folder, **overrides)


def hf_from_folder(folder) -> torch.nn.Module:
    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    model_class = {"gpt2": GPT2LMHeadModel, **{name: classes[1] for name, classes in LLAMA_SHAPED.items()}}[model_type]
    return model_class.from_pretrained(folder, attn_implementation="eager").eval()


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


@torch.no_grad()
def max_logit_difference(ours, theirs, input_ids, attention_mask=None) -> float:
    """Largest |tformer - HF| logit at real (non-padding) tokens."""
    our_logits = ours(input_ids, attention_mask=attention_mask).logits
    if attention_mask is None:
        their_logits = theirs(input_ids).logits
        real = torch.ones_like(input_ids, dtype=torch.bool)
    else:
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        their_logits = theirs(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        real = attention_mask.bool()
    assert our_logits.shape == their_logits.shape
    assert their_logits[real].std() > 0.1  # a real comparison, not of near-constant outputs
    return (our_logits - their_logits)[real].abs().max().item()


def assert_same_logits(ours, theirs, label: str) -> None:
    plain = max_logit_difference(ours, theirs, random_ids())
    padded = max_logit_difference(ours, theirs, *left_padded_batch())
    print(f"max |logit difference| {label}: {plain:.2e} plain, {padded:.2e} left-padded")
    assert plain < TOLERANCE and padded < TOLERANCE


# ---- HF -> tformer: identical logits ----------------------------------------------------------


@pytest.mark.parametrize("case", GPT2_CASES)
def test_gpt2_checkpoint_gives_hf_logits(tmp_path, case):
    reference = hf_gpt2(tmp_path, **GPT2_CASES[case])
    model = tformer.load(tmp_path)
    assert model.config.tie_embeddings == reference.config.tie_word_embeddings
    assert_same_logits(model, reference, f"gpt2 {case}")


@pytest.mark.parametrize("case", LLAMA_CASES)
def test_llama_checkpoint_gives_hf_logits(tmp_path, case):
    reference = hf_llama(tmp_path, **LLAMA_CASES[case])
    model = tformer.load(tmp_path)
    assert model.config.num_kv_heads == reference.config.num_key_value_heads
    assert model.config.tie_embeddings == reference.config.tie_word_embeddings
    assert_same_logits(model, reference, f"llama {case}")


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_greedy_generation_with_cache_matches_hf(tmp_path, family):
    reference = hf_gpt2(tmp_path) if family == "gpt2" else hf_llama(tmp_path)
    model = tformer.load(tmp_path)
    prompt = random_ids(2, 5, seed=4)
    ours = tformer.generate(model, prompt, max_new_tokens=8)
    theirs = prompt
    with torch.no_grad():
        for _ in range(8):  # greedy by full forward passes: no cache on the HF side
            theirs = torch.cat([theirs, reference(theirs).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("case", LLAMA_ROPE_CASES)
def test_scaled_rope_decodes_as_hf_generate_past_the_original_context(tmp_path, case):
    """Greedy and beam-4 decoding with tformer's caches equal HF ``generate`` token for token on a left-padded
    batch whose positions pass the original context (and max_position_embeddings for dynamic scaling)."""
    hf_llama(tmp_path, **LLAMA_ROPE_CASES[case])
    model = tformer.load(tmp_path)
    assert model.config.rope_scaling["rope_type"] == case.removeprefix("rope-")
    ids, mask = left_padded_batch()
    for beams in (1, 4):
        reference = hf_llama(**LLAMA_ROPE_CASES[case])  # fresh: HF's dynamic frequencies remember past passes
        expected = reference.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, num_beams=beams,
                                      eos_token_id=None, pad_token_id=0)
        got = tformer.generate(model, ids, 10, attention_mask=mask, num_beams=beams, pad_token_id=0)
        assert torch.equal(got, expected), f"{case}, {beams} beam(s)"


@pytest.mark.parametrize("case", LLAMA_ROPE_CASES)
def test_scaled_rope_round_trips_to_hf(tmp_path, case):
    hf_llama(tmp_path / "original", **LLAMA_ROPE_CASES[case])
    model = tformer.load(tmp_path / "original")
    model.save(tmp_path / "written", format="hf")
    written = hf_from_folder(tmp_path / "written")
    assert written.config.rope_parameters == hf_from_folder(tmp_path / "original").config.rope_parameters
    assert_same_logits(model, written, f"round trip {case}")
    assert tformer.load(tmp_path / "written").config == model.config
    with torch.no_grad():  # the scaling changes the function (a test of the scaling, not of plain RoPE)
        plain = build_model(model.config.replace(rope_scaling=None))
        plain.load_state_dict(model.state_dict())
        assert (plain(random_ids()).logits - model(random_ids()).logits).abs().max() > 1e-3


@pytest.mark.parametrize("case", OPEN_CASES)
def test_open_families_give_hf_logits_and_decode_as_hf_generate(tmp_path, case):
    """Qwen2 and Mistral folders: logits within 1e-5 on plain and left-padded batches, and greedy and beam-4
    decoding with tformer's caches equal to HF ``generate`` token for token (Mistral's window shorter than the
    prompts, so its rolling cache is exercised)."""
    model_type, overrides = OPEN_CASES[case]
    reference = hf_decoder(model_type, tmp_path, **overrides)
    model = tformer.load(tmp_path)
    if model_type == "gemma2":  # the window on its layers only
        assert model.config.layer_attention_windows == tuple(
            overrides["sliding_window"] - 1 if kind == "sliding_attention" else 0
            for kind in reference.config.layer_types)
    elif overrides.get("sliding_window"):
        assert (model.config.attention_kernel, model.config.attention_window) == (
            "sliding_window", overrides["sliding_window"] - 1)
    assert_same_logits(model, reference, case)
    ids, mask = left_padded_batch()
    for beams in (1, 4):  # both end at the config's end token
        expected = hf_decoder(model_type, **overrides).generate(
            ids, attention_mask=mask, max_new_tokens=10, do_sample=False, num_beams=beams,
            eos_token_id=reference.config.eos_token_id, pad_token_id=0)
        got = tformer.generate(model, ids, 10, attention_mask=mask, num_beams=beams, pad_token_id=0)
        end = reference.config.eos_token_id
        assert torch.equal(until_end(got, ids.shape[1], end), until_end(expected, ids.shape[1], end)), \
            f"{case}, {beams} beam(s)"


def until_end(sequences: torch.Tensor, prompt_length: int, end: int | list[int] | None) -> torch.Tensor:
    """The sequences with what follows each new end token blanked (-1): HF's beam search fills a finished row with
    its end token where tformer (and HF's greedy search) pad it."""
    new = sequences[:, prompt_length:]
    is_end = torch.isin(new, torch.tensor([] if end is None else end).reshape(-1)).long()
    ended = is_end.cumsum(dim=1) - is_end > 0  # strictly after the first end token
    return torch.cat([sequences[:, :prompt_length], new.masked_fill(ended, -1)], dim=1)


@pytest.mark.parametrize("case", OPEN_CASES)
def test_open_families_round_trip_to_hf(tmp_path, case):
    """HF folder -> tformer -> HF folder of the same model_type (a Mistral without a window is written as a Mistral,
    though a Llama could hold it): every tensor back bit for bit, the window and biases kept, and HF's logits of
    the written folder equal tformer's."""
    model_type, overrides = OPEN_CASES[case]
    hf_decoder(model_type, tmp_path / "original", **overrides)
    model = tformer.load(tmp_path / "original")
    model.save(tmp_path / "written", format="hf")
    written_config = json.loads((tmp_path / "written" / "config.json").read_text())
    assert written_config["model_type"] == model_type  # the family it came from, though a Llama may hold it
    if model_type in ("mistral", "phi3", "gemma2"):
        assert written_config["sliding_window"] == overrides["sliding_window"]
    if model_type == "gemma2":
        original_config = json.loads((tmp_path / "original" / "config.json").read_text())
        for key in ("layer_types", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):
            assert written_config[key] == original_config[key], key
    original = load_file(str(tmp_path / "original" / "model.safetensors"))
    written = load_file(str(tmp_path / "written" / "model.safetensors"))
    assert sorted(written) == sorted(original)
    assert all(torch.equal(written[name], original[name]) for name in original)
    assert_same_logits(model, hf_from_folder(tmp_path / "written"), f"round trip {case}")
    assert tformer.load(tmp_path / "written").config == model.config


# ---- weight files -----------------------------------------------------------------------------


def test_sharded_safetensors_load(tmp_path):
    reference = hf_llama()
    reference.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    assert_same_logits(tformer.load(tmp_path), reference, "llama sharded safetensors")


def test_pytorch_bin_loads(tmp_path):
    reference = hf_gpt2()  # tied: the .bin also holds lm_head.weight, which is ignored like HF does
    (tmp_path / "config.json").write_text(reference.config.to_json_string())
    torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
    assert_same_logits(tformer.load(tmp_path), reference, "gpt2 pytorch_model.bin")


def test_sharded_pytorch_bin_loads(tmp_path):
    reference = hf_llama()
    (tmp_path / "config.json").write_text(reference.config.to_json_string())
    state = reference.state_dict()
    names = sorted(state)
    shards = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
    for shard_name, shard_names in shards.items():
        torch.save({name: state[name] for name in shard_names}, tmp_path / shard_name)
    weight_map = {name: shard_name for shard_name, shard_names in shards.items() for name in shard_names}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert_same_logits(tformer.load(tmp_path), reference, "llama sharded pytorch_model.bin")


def test_hub_layout_gpt2_without_prefix_and_with_mask_buffers(tmp_path):
    """The layout of GPT-2 files on the Hub: saved from the base model (no ``transformer.``),
    with the causal-mask buffers ``h.N.attn.bias`` that old transformers versions stored."""
    reference = hf_gpt2()
    state = {name: tensor.clone() for name, tensor in reference.transformer.state_dict().items()}
    for layer in range(reference.config.n_layer):
        state[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(1, 1, 40, 40))
        state[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    (tmp_path / "config.json").write_text(reference.config.to_json_string())
    save_file(state, str(tmp_path / "model.safetensors"))
    assert_same_logits(tformer.load(tmp_path), reference, "gpt2 hub layout")


def test_old_llama_files_with_rotary_buffers_and_legacy_rope_fields(tmp_path):
    reference = hf_llama(rope_parameters={"rope_type": "default", "rope_theta": 20000.0})
    state = {name: tensor.clone() for name, tensor in reference.state_dict().items()}
    for layer in range(reference.config.num_hidden_layers):
        state[f"model.layers.{layer}.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    raw = json.loads(reference.config.to_json_string())
    del raw["rope_parameters"]
    raw.update(rope_theta=20000.0, rope_scaling=None)  # how transformers 4.x wrote it
    (tmp_path / "config.json").write_text(json.dumps(raw))
    save_file(state, str(tmp_path / "model.safetensors"))
    model = tformer.load(tmp_path)
    assert model.config.rope_theta == 20000.0
    assert_same_logits(model, reference, "llama 4.x layout")


# ---- tformer -> HF ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["gpt2-tied", "gpt2-untied", "llama-gqa-untied", "llama-mqa-biases"])
def test_hf_round_trip_gives_same_logits_and_same_tensors(tmp_path, case):
    """HF folder -> tformer -> HF folder: every tensor comes back bit for bit, and HF's
    ``from_pretrained`` of the written folder gives tformer's logits."""
    family, variant = case.split("-", 1)
    overrides = {
        "gpt2-tied": {}, "gpt2-untied": {"tie_word_embeddings": False},
        "llama-gqa-untied": LLAMA_CASES["gqa-untied"], "llama-mqa-biases": LLAMA_CASES["mqa-biases-wide-heads-theta"],
    }[case]
    (hf_gpt2 if family == "gpt2" else hf_llama)(tmp_path / "original", **overrides)
    model = tformer.load(tmp_path / "original")
    model.save(tmp_path / "written", format="hf")
    original = load_file(str(tmp_path / "original" / "model.safetensors"))
    written = load_file(str(tmp_path / "written" / "model.safetensors"))
    assert sorted(written) == sorted(original)
    assert all(torch.equal(written[name], original[name]) for name in original)
    assert_same_logits(model, hf_from_folder(tmp_path / "written"), f"round trip {case}")


TFORMER_CONFIGS = {
    "gpt-nano": dict(preset="gpt-nano"),
    "llama-like-tied": dict(
        preset="llama-small", vocab_size=VOCAB, max_seq_len=64, d_model=32, num_layers=2, num_heads=4,
        num_kv_heads=2, d_ff=48, tie_embeddings=True, rope_theta=1e4,
    ),
}


@pytest.mark.parametrize("name", TFORMER_CONFIGS)
def test_tformer_model_saved_as_hf_loads_in_hf_with_same_logits(tmp_path, name):
    overrides = dict(TFORMER_CONFIGS[name])
    torch.manual_seed(0)
    model = perturbed(build_model(overrides.pop("preset"), **overrides))
    model.save(tmp_path / "hf", format="hf")
    reference = hf_from_folder(tmp_path / "hf")
    input_ids = random_ids() % model.config.vocab_size
    assert max_logit_difference(model, reference, input_ids) < TOLERANCE
    assert tformer.load(tmp_path / "hf").config == model.config


def test_convert_command_both_ways(tmp_path, capsys):
    reference = hf_llama(tmp_path / "hf")
    assert cli_main(["convert", str(tmp_path / "hf"), str(tmp_path / "native"), "--to", "tformer"]) == 0
    assert json.loads((tmp_path / "native" / "config.json").read_text())["tformer_format"] == 1
    assert cli_main(["convert", str(tmp_path / "native"), str(tmp_path / "back"), "--to", "hf"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert_same_logits(tformer.load(tmp_path / "native"), reference, "convert hf -> tformer")
    assert_same_logits(tformer.load(tmp_path / "native"), hf_from_folder(tmp_path / "back"), "convert tformer -> hf")


def test_convert_refuses_an_existing_destination_unless_told(tmp_path, capsys):
    hf_gpt2(tmp_path / "hf")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    assert cli_main(["convert", str(tmp_path / "hf"), str(tmp_path / "taken"), "--to", "tformer"]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["keep.txt"]
    assert cli_main(["convert", str(tmp_path / "hf"), str(tmp_path / "taken"), "--to", "tformer", "--overwrite"]) == 0
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"  # a run folder's other files stay
    assert "tformer_format" in json.loads((tmp_path / "taken" / "config.json").read_text())


def test_dtype_is_kept_on_save_and_loading_gives_float32(tmp_path):
    torch.manual_seed(0)
    model = perturbed(build_model("gpt-nano")).to(torch.bfloat16)
    model.save(tmp_path, format="hf")
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(str(tmp_path / "model.safetensors")).values()} == {torch.bfloat16}
    loaded = tformer.load(tmp_path)
    assert loaded.dtype == torch.float32
    assert all(torch.equal(tensor, model.state_dict()[name].float()) for name, tensor in loaded.state_dict().items())


# ---- tokenizers -------------------------------------------------------------------------------


def trained_byte_level_bpe():
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(["the transformer reads the text and writes the text"] * 20, trainer)
    return tokenizer


def loads_with_tformer(path) -> None:
    """Skip when the tokenizer loader does not (yet) read this kind of file."""
    try:
        tformer.tokenizers.load(path)
    except TokenizerError as error:
        pytest.skip(f"tformer.tokenizers cannot read this tokenizer yet: {error}")


@pytest.mark.parametrize("files", ["tokenizer.json", "vocab.json+merges.txt"])
def test_bpe_tokenizer_in_the_folder_is_attached(tmp_path, files):
    hf_gpt2(tmp_path)
    tokenizer = trained_byte_level_bpe()
    if files == "tokenizer.json":
        tokenizer.save(str(tmp_path / "tokenizer.json"))
        loads_with_tformer(tmp_path / "tokenizer.json")
    else:
        tokenizer.model.save(str(tmp_path))
        assert (tmp_path / "vocab.json").is_file() and (tmp_path / "merges.txt").is_file()
        loads_with_tformer(tmp_path)
    model = tformer.load(tmp_path)
    text = "the transformer writes"
    assert model.tokenizer is not None
    assert list(model.tokenizer.encode(text)) == tokenizer.encode(text).ids


def test_tokenizer_travels_through_hf_save_and_load(tmp_path):
    model = build_model("gpt-nano")
    model.tokenizer = CharTokenizer.train("abcdefg hij")
    model.save(tmp_path, format="hf")
    loaded = tformer.load(tmp_path)
    assert isinstance(loaded.tokenizer, CharTokenizer)
    assert loaded.tokenizer.encode("bad hig") == model.tokenizer.encode("bad hig")


def test_unreadable_tokenizer_warns_and_the_model_still_loads(tmp_path):
    reference = hf_gpt2(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "NoSuchKind"}}))
    with pytest.warns(UserWarning, match="tokenizer not attached.*NoSuchKind"):
        model = tformer.load(tmp_path)
    assert model.tokenizer is None
    assert max_logit_difference(model, reference, random_ids()) < TOLERANCE


# ---- errors -----------------------------------------------------------------------------------


def write_config(folder, **changes) -> None:
    raw = json.loads((folder / "config.json").read_text())
    raw.update(changes)
    (folder / "config.json").write_text(json.dumps(raw))


def test_unsupported_model_type_names_the_supported_ones(tmp_path, capsys):
    tmp_path.joinpath("config.json").write_text(json.dumps({"model_type": "bart", "d_model": 8}))
    with pytest.raises(CheckpointError,
                       match=r"model_type .bart. is not supported; supported: gpt2, llama, qwen2, mistral, phi3, "):
        tformer.load(tmp_path)
    assert cli_main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "supported: gpt2, llama, qwen2, mistral, phi3, gemma, bert" in err


def test_missing_weights_are_listed(tmp_path):
    hf_gpt2(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["transformer.h.1.mlp.c_fc.bias"], state["transformer.ln_f.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    expected = r"missing: transformer\.h\.1\.mlp\.c_fc\.bias, transformer\.ln_f\.weight\)"
    with pytest.raises(CheckpointError, match=expected):
        tformer.load(tmp_path)


def test_unexpected_weights_are_listed(tmp_path):
    hf_llama(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["model.layers.0.self_attn.q_norm.weight"] = torch.ones(8)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"unexpected: model\.layers\.0\.self_attn\.q_norm\.weight\)"):
        tformer.load(tmp_path)


def test_shape_mismatch_names_the_tensor_and_both_shapes(tmp_path):
    hf_gpt2(tmp_path)
    write_config(tmp_path, n_inner=64)  # the file holds 4 * 32 = 128
    with pytest.raises(
        CheckpointError,
        match=r"model\.safetensors: transformer\.h\.0\.mlp\.c_fc\.bias has shape \(128,\), the config expects \(64,\)",
    ):
        tformer.load(tmp_path)


def test_fused_part_with_wrong_shape_is_named_by_its_hf_name(tmp_path):
    hf_llama(tmp_path)
    write_config(tmp_path, num_key_value_heads=4)  # the file's k_proj/v_proj have 2 heads of 8
    with pytest.raises(
        CheckpointError,
        match=r"model\.layers\.0\.self_attn\.k_proj\.weight has shape \(16, 32\), the config expects \(32, 32\)",
    ):
        tformer.load(tmp_path)


@pytest.mark.parametrize("changes, message", [
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}},
     r"rope_scaling of rope_type='llama3' needs low_freq_factor, high_freq_factor"),
    ({"rope_parameters": None, "rope_scaling": {"type": "ntk-by-parts", "factor": 2.0}},
     r"rope_scaling rope_type='ntk-by-parts' is not one of linear, dynamic, yarn, longrope, llama3"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4, "low_freq_factor": 1.0}},
     r"rope_scaling low_freq_factor is not read by rope_type='linear'"),
    ({"hidden_act": "gelu_pytorch_tanh"},
     r"hidden_act='gelu_pytorch_tanh' is not supported by tformer \(supported: 'silu', 'gelu'\)"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     r"partial_rotary_factor=0\.5 is not supported"),
])
def test_llama_features_tformer_lacks_are_refused(tmp_path, changes, message):
    hf_llama(tmp_path)
    write_config(tmp_path, **changes)
    with pytest.raises(CheckpointError, match=r"config\.json: llama .*" + message):
        tformer.load(tmp_path)


@pytest.mark.parametrize("model_type, changes, message", [
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4},
     r"qwen2 use_sliding_window=True is not supported by tformer \(supported: False\)"),
    ("mistral", {"sliding_window": 1}, r"mistral sliding_window=1 must be an integer >= 2"),
    ("mistral", {"layer_types": ["sliding_attention", "full_attention"]},
     r"mistral layer_types=\['sliding_attention', 'full_attention'\] is not supported"),
    ("mistral", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4}},
     r"mistral rope_scaling of rope_type='dynamic' needs factor"),
    ("gemma2", {"layer_types": ["sliding_attention", "chunked_attention"]},
     r"gemma2 layer_types=\['sliding_attention', 'chunked_attention'\] must name each of the 2 layers "
     r"'sliding_attention' or 'full_attention'"),
    ("gemma2", {"layer_types": ["sliding_attention"]}, r"gemma2 layer_types=\['sliding_attention'\] must name each"),
    ("gemma2", {"sliding_window": 1}, r"gemma2 sliding_window=1 must be an integer >= 2"),
    ("gemma2", {"sliding_window": None}, r"gemma2 sliding_window=None must be an integer >= 2"),
    ("gemma2", {"use_bidirectional_attention": True},
     r"gemma2 use_bidirectional_attention=True is not supported by tformer \(supported: False\)"),
    ("gemma2", {"hidden_activation": "relu"}, r"gemma2 hidden_activation='relu' is not supported by tformer"),
    ("gemma2", {"attn_logit_softcapping": -1.0}, r"attention_softcap=-1\.0 must be a finite number > 0"),
    ("gemma2", {"attention_dropout": 0.1},
     r"attention_dropout=0\.1 is not supported by attention_kernel='chunked'"),
])
def test_open_family_features_tformer_lacks_are_refused(tmp_path, model_type, changes, message):
    hf_decoder(model_type, tmp_path)
    write_config(tmp_path, **changes)
    with pytest.raises(CheckpointError, match=rf"config\.json: {message}"):
        tformer.load(tmp_path)


@pytest.mark.parametrize("changes, message", [
    ({"scale_attn_by_inverse_layer_idx": True}, r"scale_attn_by_inverse_layer_idx=True is not supported"),
    ({"activation_function": "quick_gelu"}, r"activation_function='quick_gelu' is not supported .*'gelu_new'"),
])
def test_gpt2_features_tformer_lacks_are_refused(tmp_path, changes, message):
    hf_gpt2(tmp_path)
    write_config(tmp_path, **changes)
    with pytest.raises(CheckpointError, match=message):
        tformer.load(tmp_path)


def test_folder_without_weights_says_what_it_looked_for(tmp_path):
    hf_gpt2(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no weights \(looked for model\.safetensors, .*pytorch_model\.bin"):
        tformer.load(tmp_path)


class NotATensor:
    """A pickled object of a custom class: loading it would run arbitrary code paths."""


def test_pickled_objects_are_refused(tmp_path):
    reference = hf_gpt2()
    (tmp_path / "config.json").write_text(reference.config.to_json_string())
    torch.save({"transformer.wte.weight": NotATensor()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: refused or unreadable; only plain tensor files"):
        tformer.load(tmp_path)


def test_index_naming_a_missing_shard_is_refused(tmp_path):
    hf_llama().save_pretrained(tmp_path, max_shard_size="20KB")
    next(iter(sorted(tmp_path.glob("model-*.safetensors")))).unlink()
    expected = r"index\.json: names shard 'model-00001-of-\d+\.safetensors', which is not a file"
    with pytest.raises(CheckpointError, match=expected):
        tformer.load(tmp_path)


def test_model_without_hf_equivalent_is_refused_and_nothing_is_written(tmp_path):
    model = build_model("gpt-nano", positional="rope")  # GPT-2 layers with rotary positions
    with pytest.raises(CheckpointError, match=(
        r"no Hugging Face equivalent \(as gpt2: positional='rope' \(needs 'learned'\); "
        r"as llama: norm='layernorm' \(needs 'rmsnorm'\), activation='gelu_tanh' \(needs 'swiglu' or 'geglu'\); "
        r"as qwen2: .*output_bias=True \(needs False\).*; as mistral: .*attention_bias=True \(needs False\)"
    )):
        model.save(tmp_path / "out", format="hf")
    assert not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("kept")
    with pytest.raises(CheckpointError):
        model.save(tmp_path / "out", format="hf")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (tmp_path / "out" / "old.txt").is_file()


def test_failed_convert_leaves_no_destination(tmp_path, capsys):
    hf_gpt2(tmp_path / "hf")
    write_config(tmp_path / "hf", n_inner=64)
    assert cli_main(["convert", str(tmp_path / "hf"), str(tmp_path / "out"), "--to", "tformer"]) == 2
    assert "has shape (128,), the config expects (64,)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---- config translation -----------------------------------------------------------------------


def test_llama3_style_eos_list_survives_translation():
    llama = family_for_model_type("llama")
    raw = json.loads(LlamaConfig(**LLAMA_TINY, eos_token_id=[5, 6, 7], bos_token_id=4).to_json_string())
    config = llama.config_from_hf(raw)
    assert config.eos_token_id == 5 and config.bos_token_id == 4
    assert llama.config_to_hf(config)["eos_token_id"] == [5, 6, 7]


def test_bias_switches_derive_from_bias_and_govern_only_their_projections():
    plain = build_model("gpt-nano", bias=False)
    assert (plain.config.attention_bias, plain.config.feedforward_bias) == (False, False)
    model = build_model("gpt-nano", bias=False, attention_bias=True)
    block = model.stack.blocks[0]
    assert block.attention.qkv_proj.bias is not None and block.attention.out_proj.bias is not None
    assert block.feedforward.in_proj.bias is None and block.attention_norm.bias is None
    assert model.config.replace(bias=True).feedforward_bias is True  # derived values follow bias


# ---- GPT-2's real size ------------------------------------------------------------------------


def test_gpt2_124m_shape(tmp_path):
    started = time.perf_counter()
    torch.manual_seed(0)
    reference = GPT2LMHeadModel(GPT2Config(attn_implementation="eager")).eval()  # 124M, random
    reference.save_pretrained(tmp_path)
    model = tformer.load(tmp_path)
    assert model.num_parameters() == 124_439_808
    preset = tformer.PRESETS["gpt2"]
    assert model.config == preset.replace(dropout=0.1, attention_dropout=0.1)
    input_ids = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(5))
    difference = max_logit_difference(model, reference, input_ids)
    print(f"max |logit difference| gpt2 124M: {difference:.2e} ({time.perf_counter() - started:.1f} s)")
    assert difference < TOLERANCE


# ---- special-token ids outside the vocabulary --------------------------------------------------


def test_gpt2_folder_with_default_special_ids_outside_a_small_vocabulary_loads_with_one_warning(tmp_path):
    """GPT2Config's default bos/eos (50256) do not fit vocab_size=1000: HF loads such a folder, so
    tformer does too, dropping the unusable ids with one warning, and the logits still match."""
    torch.manual_seed(0)
    reference = GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=16, n_embd=32, n_layer=1, n_head=2)).eval()
    reference.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["bos_token_id"] == 50256
    with pytest.warns(UserWarning, match=r"bos_token_id=50256, eos_token_id=50256 are outside the vocabulary "
                                          r"\[0, 1000\)") as caught:
        model = tformer.load(tmp_path)
    assert len(caught) == 1 and caught[0].filename == __file__  # one warning, pointing at the caller
    assert (model.config.bos_token_id, model.config.eos_token_id) == (None, None)
    ids = torch.randint(0, 1000, (2, 12))
    with torch.no_grad():
        difference = (model(ids).logits - reference(ids).logits).abs().max().item()
    assert difference < TOLERANCE


def test_llama_eos_list_keeps_its_ids_inside_the_vocabulary(tmp_path):
    raw = json.loads(LlamaConfig(**LLAMA_TINY, eos_token_id=[5, 500, 7], bos_token_id=4).to_json_string())
    llama = family_for_model_type("llama")
    with pytest.warns(UserWarning, match=r"eos_token_id=\[5, 500, 7\] are outside"):
        config = llama.config_from_hf(raw)
    assert (config.bos_token_id, config.eos_token_id, config.extra["eos_token_ids"]) == (4, 5, [5, 7])
