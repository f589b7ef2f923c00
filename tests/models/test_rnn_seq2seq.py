"""The attention-RNN baseline: Bahdanau's and Luong's scores equal their formulas on hand-made tensors,
attention weights sum to 1 over the real source positions, padding on either side changes nothing,
generation through the Session protocol equals an argmax loop over full forwards (greedy, beams, batches),
teacher forcing below 1 reads the model's own predictions, and fields it does not read are refused."""

import pytest
import torch

import tformer
from tformer.config import ConfigError, ModelConfig
from tformer.models.rnn_seq2seq import SourceAttention


def rnn(**fields):
    base = {"architecture": "rnn_seq2seq", "vocab_size": 40, "d_model": 12, "rnn_hidden_size": 16, "num_layers": 2,
            "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    return tformer.build_model(ModelConfig(**{**base, **fields})).eval()


VARIANTS = [{"rnn_attention": "bahdanau"}, {"rnn_attention": "luong_dot", "input_feeding": True, "rnn_cell": "lstm"},
            {"rnn_attention": "luong_general", "rnn_cell": "gru"}]
SOURCE = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
MASK = (SOURCE != 0).long()


def test_bahdanau_and_luong_scores_are_their_formulas():
    query = torch.tensor([[1.0, -2.0]])
    memory = torch.tensor([[[0.5, 1.0], [2.0, -1.0], [0.0, 3.0]]])
    mask = torch.tensor([[True, True, False]])

    dot = SourceAttention("luong_dot", 2)
    context, weights = dot(query, dot.keys(memory), memory, mask)
    scores = torch.tensor([0.5 - 2.0, 2.0 + 2.0])  # s . h(j)
    assert torch.allclose(weights[0, :2], torch.softmax(scores, 0)) and weights[0, 2] == 0
    assert torch.allclose(context[0], weights[0, 0] * memory[0, 0] + weights[0, 1] * memory[0, 1])

    general = SourceAttention("luong_general", 2)
    with torch.no_grad():
        general.key_proj.weight.copy_(torch.tensor([[2.0, 0.0], [1.0, 1.0]]))  # W
    _, weights = general(query, general.keys(memory), memory, mask)
    projected = memory[0, :2] @ general.key_proj.weight.T  # W h(j)
    assert torch.allclose(weights[0, :2], torch.softmax(projected @ query[0], 0))

    additive = SourceAttention("bahdanau", 2)
    with torch.no_grad():
        additive.query_proj.weight.copy_(torch.tensor([[1.0, 0.0], [0.5, -1.0]]))  # W
        additive.key_proj.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 1.0]]))  # U
        additive.key_proj.bias.copy_(torch.tensor([0.1, -0.2]))
        additive.score_proj.weight.copy_(torch.tensor([[2.0, -1.0]]))  # v
    _, weights = additive(query, additive.keys(memory), memory, mask)
    w, u, b, v = (additive.query_proj.weight, additive.key_proj.weight, additive.key_proj.bias,
                  additive.score_proj.weight[0])
    expected = torch.stack([v @ torch.tanh(w @ query[0] + u @ memory[0, j] + b) for j in range(2)])
    assert torch.allclose(weights[0, :2], torch.softmax(expected, 0))


def test_one_decoder_step_is_bahdanaus_and_luongs_recipe():
    start = torch.ones(2, 1, dtype=torch.long)
    bahdanau = rnn(rnn_attention="bahdanau", num_layers=1)
    with torch.no_grad():
        memory = bahdanau.encode(SOURCE, MASK)
        previous, _ = bahdanau.initial_state(memory, MASK.bool())
        # Bahdanau: attend with the previous state, read [y(t-1); c(t)], predict from [s(t); c(t); y(t-1)]
        context, _ = bahdanau.attention(previous[-1], bahdanau.attention.keys(memory), memory, MASK.bool())
        embedded = bahdanau.embedding(start[:, 0])
        state, _ = bahdanau.decoder(torch.cat([embedded, context], -1)[:, None], previous)
        expected = bahdanau.lm_head(bahdanau.output_proj(torch.cat([state[:, 0], context, embedded], -1)))
        actual = bahdanau(SOURCE, attention_mask=MASK, decoder_input_ids=start).logits[:, 0]
    assert torch.allclose(actual, expected, atol=1e-6)

    luong = rnn(rnn_attention="luong_general", input_feeding=True, num_layers=1)
    with torch.no_grad():
        memory = luong.encode(SOURCE, MASK)
        previous, _ = luong.initial_state(memory, MASK.bool())
        # Luong: step first (the previous attentional vector fed in: zeros at the start), then attend with s(t)
        embedded = luong.embedding(start[:, 0])
        state, _ = luong.decoder(torch.cat([embedded, torch.zeros(2, 16)], -1)[:, None], previous)
        context, _ = luong.attention(state[:, 0], luong.attention.keys(memory), memory, MASK.bool())
        attentional = torch.tanh(luong.combine(torch.cat([context, state[:, 0]], -1)))
        expected = luong.lm_head(luong.output_proj(attentional))
        actual = luong(SOURCE, attention_mask=MASK, decoder_input_ids=start).logits[:, 0]
    assert torch.allclose(actual, expected, atol=1e-6)


@pytest.mark.parametrize("fields", VARIANTS)
def test_attention_sums_to_one_over_the_real_source_and_padding_side_does_not_matter(fields):
    model = rnn(**fields)
    labels = torch.tensor([[11, 12, 13, 2], [14, 2, -100, -100]])
    with torch.no_grad():
        right = model(SOURCE, attention_mask=MASK, labels=labels, output_attentions=True)
        left_source = torch.tensor([[5, 6, 7, 8, 2], [0, 0, 9, 10, 2]])
        left = model(left_source, attention_mask=(left_source != 0).long(), labels=labels, output_attentions=True)
    weights = right.cross_attentions[0][:, 0]  # (B, T, S)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4))
    assert weights[1, :, 3:].abs().max() == 0  # never on padding
    assert torch.allclose(right.logits, left.logits, atol=1e-6)
    assert torch.allclose(left.cross_attentions[0][1, 0, :, 2:], weights[1, :, :3], atol=1e-6)
    alone = model(SOURCE[1:, :3], labels=labels[1:, :2]).logits
    assert torch.allclose(alone, right.logits[1:, :2], atol=1e-5)


@pytest.mark.parametrize("fields", VARIANTS)
def test_greedy_and_beam_generation_equal_full_forwards(fields):
    model = rnn(**fields)
    out = tformer.generate(model, SOURCE, attention_mask=MASK, max_new_tokens=6, eos_token_id=[])
    tokens = torch.full((2, 1), 1)
    with torch.no_grad():
        for _ in range(6):  # argmax over a fresh full forward at every step
            logits = model(SOURCE, attention_mask=MASK, decoder_input_ids=tokens).logits
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, tokens)
    uncached = tformer.generate(model, SOURCE, attention_mask=MASK, max_new_tokens=6, eos_token_id=[],
                                use_cache=False)
    assert torch.equal(uncached, tokens)
    one_beam = tformer.generate(model, SOURCE, attention_mask=MASK, max_new_tokens=6, eos_token_id=[], num_beams=1)
    assert torch.equal(one_beam, tokens)
    beams = tformer.generate(model, SOURCE, attention_mask=MASK, max_new_tokens=6, num_beams=3)
    for row in range(2):
        real = SOURCE[row : row + 1, : int(MASK[row].sum())]
        alone = tformer.generate(model, real, max_new_tokens=6, num_beams=3)
        assert beams[row, : alone.shape[1]].tolist() == alone[0].tolist()


def test_teacher_forcing_below_one_reads_the_models_own_predictions():
    model = rnn(rnn_attention="luong_general", input_feeding=True, teacher_forcing_ratio=0.0)
    labels = torch.tensor([[11, 12, 13, 2], [14, 15, 16, 2]])
    own = tformer.generate(model, SOURCE, attention_mask=MASK, max_new_tokens=4, eos_token_id=[])
    model.train()  # dropout is 0: only the ratio differs between training and evaluation
    with torch.no_grad():
        trained = model(SOURCE, attention_mask=MASK, labels=labels).logits
    model.eval()
    with torch.no_grad():
        expected = model(SOURCE, attention_mask=MASK, decoder_input_ids=own[:, :4]).logits
        forced = model(SOURCE, attention_mask=MASK, labels=labels).logits
    assert torch.allclose(trained, expected, atol=1e-6)
    assert not torch.allclose(forced, expected)


def test_a_checkpoint_round_trip_keeps_the_model(tmp_path):
    model = rnn(rnn_attention="luong_dot", rnn_cell="lstm", input_feeding=True)
    model.save(tmp_path / "rnn")
    loaded = tformer.load(tmp_path / "rnn")
    with torch.no_grad():
        expected = model(SOURCE, attention_mask=MASK, labels=torch.tensor([[3, 2], [4, 2]])).logits
        actual = loaded(SOURCE, attention_mask=MASK, labels=torch.tensor([[3, 2], [4, 2]])).logits
    assert torch.equal(expected, actual)
    assert loaded.lm_head.weight is loaded.embedding.weight  # tied, saved once


def test_fields_the_rnn_does_not_read_are_refused():
    with pytest.raises(ConfigError, match=r"num_heads=8 is a transformer's field; architecture='rnn_seq2seq' reads"):
        rnn(num_heads=8)
    with pytest.raises(ConfigError, match=r"input_feeding=True is Luong's"):
        rnn(input_feeding=True)
    with pytest.raises(ConfigError, match=r"teacher_forcing_ratio=1.5 must be a number in \[0, 1\]"):
        rnn(teacher_forcing_ratio=1.5)
    with pytest.raises(ConfigError, match=r"rnn_attention='luong' is not one of bahdanau, luong_dot, luong_general"):
        rnn(rnn_attention="luong")
    with pytest.raises(ConfigError, match=r"rnn_cell='lstm' is a field of the rnn_seq2seq family"):
        ModelConfig(architecture="encoder_decoder", rnn_cell="lstm")
    with pytest.raises(ValueError, match=r"rnn_hidden_size=15 must be even"):
        rnn(rnn_hidden_size=15)
    with pytest.raises(Exception, match=r"speculative decoding needs a key/value cache|draft"):
        tformer.generate(rnn(), SOURCE, attention_mask=MASK, max_new_tokens=3, draft_model=rnn())


def test_max_seq_len_bounds_what_the_rnn_reads_and_translate_cuts_to_it():
    from tformer.generation.translation import translate
    from tformer.tokenizers import CharTokenizer

    tokenizer = CharTokenizer.train(["abcdefghij"], special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    model = rnn(max_seq_len=6, vocab_size=tokenizer.vocab_size)
    assert model.position_limit == 6
    with pytest.raises(ValueError, match=r"the source \(input_ids\) has 7 tokens; this model reads at most "
                                         r"max_seq_len=6"):
        model(torch.full((1, 7), 5), labels=torch.full((1, 3), 5))
    with pytest.raises(ValueError, match=r"the target has 7 tokens; this model reads at most max_seq_len=6"):
        model(SOURCE, labels=torch.full((2, 7), 5))
    result = translate(model, ["abcdefghij", "ab"], tokenizer, num_beams=2, max_new_tokens=3)
    assert result.cut == 1 and len(result.texts) == 2
