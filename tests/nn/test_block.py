"""TransformerBlock: causality, permutation equivariance, pre/post/sandwich norms."""

import pytest
import torch

from tformer import ModelConfig, build_model
from tformer.nn.attention import AttentionMask
from tformer.nn.block import AttentionContext, TransformerBlock
from tformer.nn.positions import positional_from_config

CONFIG = ModelConfig(vocab_size=50, max_seq_len=32, d_model=32, num_layers=2, num_heads=4)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "alibi", "relative", "none"])
@pytest.mark.parametrize("norm_position", ["pre", "post", "sandwich"])
def test_decoder_is_causal(positional, norm_position):
    model = build_model(CONFIG, positional=positional, norm_position=norm_position).eval()
    ids = torch.randint(0, 50, (2, 12))
    changed = ids.clone()
    changed[:, 7:] = torch.randint(0, 50, (2, 5))
    a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("norm_position", ["pre", "post", "sandwich"])
def test_block_without_positions_is_permutation_equivariant(norm_position):
    block = TransformerBlock(CONFIG.replace(norm_position=norm_position)).eval()
    x = torch.randn(2, 9, 32)
    permutation = torch.randperm(9)
    out, _, _ = block(x, AttentionContext())
    permuted_out, _, _ = block(x[:, permutation], AttentionContext())
    torch.testing.assert_close(permuted_out, out[:, permutation], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "alibi", "relative"])
def test_positions_break_permutation_equivariance(positional):
    config = CONFIG.replace(positional=positional)
    block = TransformerBlock(config).eval()
    scheme = positional_from_config(config, causal=False)
    x, permutation = torch.randn(1, 9, 32), torch.randperm(9)
    positions = torch.arange(9)[None]

    def run(inputs):
        absolute = scheme.embeddings(positions)
        context = AttentionContext(
            rotary=scheme.rotary_angles(positions, inputs.dtype),
            mask=AttentionMask(query_positions=positions, key_positions=positions,
                               position_bias=scheme.bias if scheme.adds_bias else None),
        )
        out, _, _ = block(inputs if absolute is None else inputs + absolute, context)
        return out

    assert not torch.allclose(run(x[:, permutation]), run(x)[:, permutation], atol=1e-4)


def test_post_norm_follows_the_2017_order():
    block = TransformerBlock(CONFIG.replace(norm_position="post")).eval()
    x = torch.randn(1, 4, 32)
    attention_out, _ = block.attention(x)
    h = block.attention_norm(x + attention_out)
    expected = block.feedforward_norm(h + block.feedforward(h))
    out, _, _ = block(x, AttentionContext())
    torch.testing.assert_close(out, expected)


def test_sandwich_norms_each_sublayer_on_both_sides():
    """Gemma 2's block: x + norm'(attn(norm(x))), then the same around the feed-forward; four norms, and the
    stack's final norm as after pre-norm blocks."""
    model = build_model(CONFIG, norm_position="sandwich", norm="rmsnorm").eval()
    block = model.stack.blocks[0]
    with torch.no_grad():
        for norm in (block.attention_output_norm, block.feedforward_output_norm):
            norm.weight.normal_()  # not the identity's ones: a norm left out would show
    x = torch.randn(1, 4, 32)
    attention_out, _ = block.attention(block.attention_norm(x))
    h = x + block.attention_output_norm(attention_out)
    expected = h + block.feedforward_output_norm(block.feedforward(block.feedforward_norm(h)))
    out, _, _ = block(x, AttentionContext())
    torch.testing.assert_close(out, expected)
    assert not isinstance(model.stack.final_norm, torch.nn.Identity)
    assert not hasattr(build_model(CONFIG).stack.blocks[0], "attention_output_norm")  # pre-norm: two norms


def test_cross_attention_block_uses_the_context():
    block = TransformerBlock(CONFIG, cross_attention=True).eval()
    x, memory = torch.randn(1, 4, 32), torch.randn(1, 6, 32)
    a, _, _ = block(x, AttentionContext(encoder_output=memory))
    b, _, _ = block(x, AttentionContext(encoder_output=memory + 1))
    assert a.shape == (1, 4, 32) and not torch.allclose(a, b)
