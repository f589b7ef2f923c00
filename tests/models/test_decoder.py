"""DecoderLM: shapes, loss, cached decoding, input checks, learning."""

import pytest
import torch

from tformer import ModelConfig, build_model
from tformer.config import ConfigError
from tformer.nn.losses import next_token_loss

VARIANTS = {
    "gpt-learned-mha": dict(positional="learned"),
    "llama-rope-gqa": dict(positional="rope", norm="rmsnorm", activation="swiglu", num_kv_heads=2, bias=False,
                           tie_embeddings=False),
    "rope-mqa": dict(positional="rope", num_kv_heads=1),
    "alibi": dict(positional="alibi"),
    "relative": dict(positional="relative"),
    "sinusoidal-post": dict(positional="sinusoidal", norm_position="post"),
}
BASE = ModelConfig(vocab_size=61, max_seq_len=48, d_model=32, num_layers=2, num_heads=4)


def test_forward_shapes_and_loss():
    model = build_model(BASE)
    ids = torch.randint(0, 61, (3, 10))
    out = model(ids, labels=ids)
    assert out.logits.shape == (3, 10, 61)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 61), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)


def test_ignored_labels_do_not_count():
    model = build_model(BASE)
    ids = torch.randint(0, 61, (2, 8))
    labels = ids.clone()
    labels[:, 4:] = -100
    logits = model(ids).logits
    expected = torch.nn.functional.cross_entropy(logits[:, :3].reshape(-1, 61), ids[:, 1:4].reshape(-1))
    torch.testing.assert_close(next_token_loss(logits, labels), expected)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_decoding_equals_full_forward(variant):
    model = build_model(BASE, **VARIANTS[variant]).eval()
    ids = torch.randint(0, 61, (2, 12))
    full = model(ids).logits
    cache = model.new_cache(2, 12)
    pieces = [model(ids[:, :5], cache=cache).logits]
    for t in range(5, 12):
        pieces.append(model(ids[:, t : t + 1], cache=cache).logits)
    cached = torch.cat(pieces, 1)
    assert ((cached - full).norm() / full.norm()).item() <= 1e-5


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_left_padded_batch_matches_each_prompt_alone(variant):
    model = build_model(BASE, **VARIANTS[variant]).eval()
    short, long = torch.randint(0, 61, (1, 4)), torch.randint(0, 61, (1, 7))
    ids = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1), long])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1] * 7])
    batched = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(batched[0, 3:], model(short).logits[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batched[1], model(long).logits[0], rtol=1e-5, atol=1e-5)


def test_tied_and_untied_heads():
    tied = build_model(BASE)
    assert tied.lm_head.weight is tied.embedding.token.weight
    untied = build_model(BASE, tie_embeddings=False)
    assert untied.num_parameters() == tied.num_parameters() + 61 * 32


def test_too_long_sequence_and_bad_ids_are_clear_errors():
    model = build_model(BASE)
    with pytest.raises(ValueError, match="beyond max_seq_len=48"):
        model(torch.zeros(1, 49, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token id 61 is outside the vocabulary \[0, 61\)"):
        model(torch.tensor([[1, 61]]))
    with pytest.raises(ValueError, match="token id -1"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        model(torch.zeros(1, 4, dtype=torch.long), attention_mask=torch.ones(1, 3))


def test_rope_model_runs_past_max_seq_len():
    model = build_model(BASE, positional="rope").eval()
    assert model(torch.zeros(1, 60, dtype=torch.long)).logits.shape == (1, 60, 61)


def test_output_attentions_and_hidden_states():
    model = build_model(BASE).eval()
    out = model(torch.randint(0, 61, (1, 6)), output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (1, 4, 6, 6)
    assert len(out.hidden_states) == 3
    assert torch.all(out.attentions[0].triu(1) == 0)


def test_nano_model_overfits_one_sequence():
    torch.manual_seed(0)
    model = build_model("gpt-nano")
    ids = torch.randint(0, 64, (1, 32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = model(ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05


def test_registry_finds_the_decoder_and_refuses_a_second_class_for_a_family():
    from tformer.families import FAMILIES
    from tformer.models import DecoderLM, model_class, register

    assert model_class(BASE) is DecoderLM
    vision = FAMILIES["vision"]
    with pytest.raises(ValueError, match="architecture 'vision' is already implemented by VisionModel"):
        register("vision")(DecoderLM)
    assert FAMILIES["vision"] is vision  # the refused class declared nothing
    with pytest.raises(ConfigError, match="architecture='unlisted' is not one of decoder, encoder"):
        BASE.replace(architecture="unlisted")


def test_parameter_names_follow_embedding_stack_head():
    model = build_model(BASE)
    names = [name for name, _ in model.named_parameters()]
    assert names[:2] == ["embedding.token.weight", "stack.positional.absolute.embedding.weight"]
    assert "stack.blocks.1.attention.qkv_proj.weight" in names and "stack.final_norm.weight" in names
    assert model.tied_parameters() == {"lm_head.weight": "embedding.token.weight"}
    assert model.position_limit == 48 and build_model(BASE.replace(positional="rope")).position_limit is None
