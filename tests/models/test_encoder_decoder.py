"""The encoder-decoder (architecture "encoder_decoder"): teacher-forced forward and loss, cached
decoding equal to the full forward at every step, beam search of one beam equal to greedy, a
padded batch equal to one sentence at a time, separate depths, presets and the checkpoint."""

import pytest
import torch

import tformer
from tformer.config import ModelConfig
from tformer.nn.losses import token_cross_entropy

CONFIG = ModelConfig(
    architecture="encoder_decoder", vocab_size=40, max_seq_len=32, d_model=32, num_layers=3, num_encoder_layers=2,
    num_heads=4, d_ff=64, activation="relu", norm_position="post", positional="sinusoidal", scale_embeddings=True,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)


def model_of(**overrides):
    torch.manual_seed(0)
    model = tformer.build_model(CONFIG.replace(**overrides)).eval()
    with torch.no_grad():  # biases start at zero; a path that forgot one would go unseen
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.1)
    return model


def sources():
    """Two sources, the second right-padded (as tokenizers pad for an encoder)."""
    ids = torch.tensor([[5, 9, 14, 3, 22, 7, 2], [11, 4, 30, 2, 0, 0, 0]])
    return ids, (ids != 0).long()


@torch.no_grad()
def greedy_by_full_forward(model, source, mask, steps):
    """Each next token the argmax of a fresh forward over the whole decoder sequence: no cache."""
    decoded = torch.tensor([[model.start_token_id]])
    for _ in range(steps):
        logits = model(source, attention_mask=mask, decoder_input_ids=decoded).logits
        decoded = torch.cat([decoded, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return decoded[0]


@pytest.mark.slow  # builds the full-size presets
def test_depths_presets_and_parameter_count():
    model = model_of()
    assert (len(model.encoder.blocks), len(model.decoder.blocks)) == (2, 3)
    assert model.decoder.blocks[0].cross_attention is not None and model.encoder.blocks[0].cross_attention is None
    base = tformer.build_model("transformer-base")
    d, ff, vocab = 512, 2048, 37000
    attention, feedforward, norm = 4 * d * d + 4 * d, 2 * d * ff + ff + d, 2 * d
    encoder_layer = attention + feedforward + 2 * norm
    decoder_layer = 2 * attention + feedforward + 3 * norm
    assert base.num_parameters() == vocab * d + 6 * encoder_layer + 6 * decoder_layer  # 63.1M; the paper rounds to 65M
    assert tformer.build_model("transformer-multi30k").config.num_encoder_layers == 3


def test_labels_are_read_shifted_right_and_scored():
    model = model_of()
    source, mask = sources()
    labels = torch.tensor([[7, 8, 9, 2, -100], [12, 13, 2, -100, -100]])
    out = model(source, attention_mask=mask, labels=labels)
    decoder_inputs = torch.tensor([[1, 7, 8, 9, 2], [1, 12, 13, 2, 0]])
    assert torch.equal(model.shift_right(labels), decoder_inputs)
    same = model(source, attention_mask=mask, decoder_input_ids=decoder_inputs)
    torch.testing.assert_close(out.logits, same.logits)
    torch.testing.assert_close(out.loss, token_cross_entropy(same.logits, labels))


def test_the_decoder_is_causal_and_the_encoder_sees_the_whole_source():
    model = model_of()
    source, mask = sources()
    target = torch.tensor([[1, 7, 8, 9, 10]])
    changed_target = target.clone()
    changed_target[0, 3] = 20
    first = model(source[:1], decoder_input_ids=target).logits
    second = model(source[:1], decoder_input_ids=changed_target).logits
    torch.testing.assert_close(first[:, :3], second[:, :3])  # positions before the change cannot see it
    assert not torch.allclose(first[:, 3:], second[:, 3:])
    changed_source = source[:1].clone()
    changed_source[0, -2] = 33
    assert not torch.allclose(model(changed_source, decoder_input_ids=target).logits[:, 0], first[:, 0])


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
def test_greedy_generation_equals_the_full_forward_at_every_step(use_cache):
    model = model_of()
    source, mask = sources()
    out = tformer.generate(model, source, 10, attention_mask=mask, eos_token_id=[], use_cache=use_cache,
                           output_scores=True, return_dict=True)
    assert out.sequences.shape == (2, 11) and (out.sequences[:, 0] == model.start_token_id).all()
    for row in range(2):
        length = int(mask[row].sum())
        alone = source[row : row + 1, :length]
        expected = greedy_by_full_forward(model, alone, None, 10)
        assert torch.equal(out.sequences[row], expected)  # a padded row decodes as the sentence alone
        with torch.no_grad():  # ... with the logits of the sentence alone at every step, not just their argmax
            logits = model(alone, decoder_input_ids=expected[None, :-1]).logits[0]
        torch.testing.assert_close(torch.stack([scores[row] for scores in out.scores]), logits, atol=1e-5, rtol=1e-5)


def test_beam_search_of_one_beam_is_greedy_and_a_batch_is_each_sentence_alone():
    model = model_of()
    source, mask = sources()
    greedy = tformer.generate(model, source, 8, attention_mask=mask, eos_token_id=[])
    assert torch.equal(tformer.generate(model, source, 8, attention_mask=mask, eos_token_id=[], num_beams=1,
                                        early_stopping=True), greedy)
    beams = tformer.generate(model, source, 8, attention_mask=mask, num_beams=3, eos_token_id=2)
    for row in range(2):
        length = int(mask[row].sum())
        alone = tformer.generate(model, source[row : row + 1, :length], 8, num_beams=3, eos_token_id=2)
        assert torch.equal(beams[row, : alone.shape[1]], alone[0])


def test_a_checkpoint_round_trip_keeps_the_model(tmp_path):
    model = model_of(tie_embeddings=False)
    source, mask = sources()
    target = torch.tensor([[1, 5, 6], [1, 7, 8]])
    model.save(tmp_path / "translator")
    loaded = tformer.load(tmp_path / "translator")
    assert loaded.config == model.config and loaded.config.num_encoder_layers == 2
    torch.testing.assert_close(loaded(source, attention_mask=mask, decoder_input_ids=target).logits,
                               model(source, attention_mask=mask, decoder_input_ids=target).logits)


def test_family_fields_stay_in_their_family():
    with pytest.raises(tformer.config.ConfigError, match="num_encoder_layers"):
        ModelConfig(num_encoder_layers=2)
    with pytest.raises(tformer.config.ConfigError, match="decoder_start_token_id"):
        ModelConfig(architecture="encoder", decoder_start_token_id=0)
