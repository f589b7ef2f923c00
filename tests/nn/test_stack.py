"""TransformerStack: causal and bidirectional attention, padding, cross-attention kept apart from
self-attention, cached cross-attention decoding, the embedding norm; TokenEmbedding's segments."""

import pytest
import torch

from tformer import ModelConfig
from tformer.nn.embeddings import TokenEmbedding
from tformer.nn.stack import TransformerStack

CONFIG = ModelConfig(vocab_size=50, max_seq_len=32, d_model=32, num_layers=2, num_heads=4)
POSITIONALS = ("learned", "rope", "alibi", "relative")


def stack(causal: bool, cross_attention: bool = False, **fields) -> TransformerStack:
    return TransformerStack(CONFIG.replace(**fields), causal=causal, cross_attention=cross_attention).eval()


@pytest.mark.parametrize("positional", POSITIONALS)
def test_bidirectional_stack_lets_later_tokens_change_earlier_outputs(positional):
    x = torch.randn(2, 6, 32)
    changed = x.clone()
    changed[:, -1] = torch.randn(2, 32)  # only the last token differs
    for causal in (True, False):
        core = stack(causal, positional=positional)
        first, second = core(x).hidden, core(changed).hidden
        earlier_moved = (first[:, :-1] - second[:, :-1]).abs().max().item()
        if causal:
            assert earlier_moved == 0.0
        else:
            assert earlier_moved > 1e-3


def test_bidirectional_relative_bias_distinguishes_left_from_right():
    assert stack(False, positional="relative").positional.bias.bidirectional
    assert not stack(True, positional="relative").positional.bias.bidirectional


@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_keys_do_not_change_real_positions_in_a_bidirectional_stack(positional, side):
    core = stack(False, positional=positional)
    real = torch.randn(1, 5, 32)
    padding = 100 * torch.randn(1, 3, 32)  # garbage in the padded slots
    if side == "right":
        padded, mask, rows = torch.cat([real, padding], 1), torch.tensor([[1] * 5 + [0] * 3]), slice(0, 5)
    else:
        padded, mask, rows = torch.cat([padding, real], 1), torch.tensor([[0] * 3 + [1] * 5]), slice(3, 8)
    alone = core(real).hidden
    together = core(padded, attention_mask=mask).hidden[:, rows]
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_cross_attention_weights_are_kept_apart_and_sum_to_one_over_unmasked_source():
    core = stack(True, cross_attention=True)
    x, source = torch.randn(2, 4, 32), torch.randn(2, 6, 32)
    source_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    out = core(x, encoder_hidden=source, encoder_mask=source_mask, output_attentions=True)
    assert len(out.attentions) == 2 and len(out.cross_attentions) == 2
    for self_weights, cross_weights in zip(out.attentions, out.cross_attentions, strict=True):
        assert self_weights.shape == (2, 4, 4, 4) and torch.all(self_weights.triu(1) == 0)
        assert cross_weights.shape == (2, 4, 4, 6)
        torch.testing.assert_close(cross_weights.sum(-1), torch.ones(2, 4, 4))
        assert torch.all(cross_weights[1, :, :, 4:] == 0)  # masked source positions get no weight
    assert stack(True)(x, output_attentions=True).cross_attentions is None


def test_cross_attention_output_ignores_masked_source_positions():
    core = stack(True, cross_attention=True)
    x, source = torch.randn(1, 4, 32), torch.randn(1, 6, 32)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    changed = source.clone()
    changed[:, 4:] = 50.0
    first = core(x, encoder_hidden=source, encoder_mask=mask).hidden
    torch.testing.assert_close(core(x, encoder_hidden=changed, encoder_mask=mask).hidden, first)
    torch.testing.assert_close(core(x, encoder_hidden=source[:, :4]).hidden, first, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional", POSITIONALS)
def test_cached_cross_attention_decoding_equals_the_full_pass(positional):
    core = stack(True, cross_attention=True, positional=positional)
    x, source = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    source_mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    full = core(x, encoder_hidden=source, encoder_mask=source_mask).hidden
    cache = core.new_cache(2, 5, torch.float32, torch.device("cpu"))
    assert not any(layer.cross_attention.filled for layer in cache)
    steps = [core(x[:, t:t + 1], cache=cache, encoder_hidden=source, encoder_mask=source_mask).hidden
             for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert all(layer.cross_attention.keys.shape == (2, 4, 7, 8) for layer in cache)  # projected once, kept


def test_embedding_norm_normalises_what_enters_the_first_block():
    x = 5 + 3 * torch.randn(2, 6, 32)
    entering = stack(False, embedding_norm=True)(x, output_hidden_states=True).hidden_states[0]
    torch.testing.assert_close(entering.mean(-1), torch.zeros(2, 6), atol=1e-5, rtol=0)
    torch.testing.assert_close(entering.var(-1, unbiased=False), torch.ones(2, 6), atol=1e-3, rtol=0)
    plain = stack(False)(x, output_hidden_states=True).hidden_states[0]
    assert plain.mean(-1).abs().min() > 1  # without it the embeddings (+ positions) enter as they are


def test_stack_checks_mask_shape_and_position_table():
    core = stack(False)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(1, 4\)"):
        core(torch.randn(1, 4, 32), attention_mask=torch.ones(1, 5))
    with pytest.raises(ValueError, match="position 32 is beyond max_seq_len=32 of this model's learned position table"):
        core(torch.randn(1, 33, 32))
    assert core.position_limit == 32 and stack(False, positional="rope").position_limit is None


def test_an_encoder_state_is_refused_by_a_stack_without_cross_attention():
    with pytest.raises(ValueError, match="encoder_hidden given, but this stack has no cross-attention"):
        stack(True)(torch.randn(1, 4, 32), encoder_hidden=torch.randn(1, 3, 32))


def test_segment_embeddings_add_a_learned_vector_per_type():
    embedding = TokenEmbedding(vocab_size=10, d_model=8, type_vocab_size=2)
    ids = torch.tensor([[1, 2, 3]])
    types = torch.tensor([[0, 1, 1]])
    expected = embedding.token(ids) + embedding.token_type(types)
    torch.testing.assert_close(embedding(ids, types), expected)
    torch.testing.assert_close(embedding(ids), embedding(ids, torch.zeros_like(ids)))  # no types: all type 0
    with pytest.raises(ValueError, match=r"token type id 2 is outside the token types \[0, 2\)"):
        embedding(ids, torch.tensor([[0, 2, 1]]))
    with pytest.raises(ValueError, match="no token type embeddings"):
        TokenEmbedding(vocab_size=10, d_model=8)(ids, types)


def test_scaled_embeddings_multiply_the_token_table_by_sqrt_d_model():
    embedding = TokenEmbedding(vocab_size=10, d_model=16, scale=True)
    ids = torch.tensor([[4, 5]])
    torch.testing.assert_close(embedding(ids), embedding.token(ids) * 4.0)
