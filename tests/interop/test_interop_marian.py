"""Marian (MarianMTModel) in and out: the same random weights give Hugging Face's logits on a
right-padded batch, its greedy and beam-search translations token for token, and a folder tformer
writes loads in ``from_pretrained`` with the same logits."""

import pytest
import torch
from seq2seq_parity import assert_generate_equals, assert_saved_folder_loads

import tformer
from tformer.checkpoint import CheckpointError

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # compares with transformers

PAD, EOS = 59, 0


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.MarianConfig(
        vocab_size=60, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        activation_function="swish", scale_embedding=True, pad_token_id=PAD, eos_token_id=EOS,
        decoder_start_token_id=PAD, forced_eos_token_id=None, init_std=0.1,
    )
    hf = transformers.MarianMTModel(config).eval()
    with torch.no_grad():  # biases start at zero; a mapping that lost one would go unseen
        hf.final_logits_bias.normal_(0, 0.05)
        for name, parameter in hf.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.1)
    folder = tmp_path_factory.mktemp("hf-marian")
    hf.save_pretrained(folder)
    return hf, tformer.load(folder)


def sources():
    ids = torch.randint(1, PAD, (2, 9), generator=torch.Generator().manual_seed(3))
    ids[0, -1] = EOS
    ids[1, 6] = EOS
    ids[1, 7:] = PAD  # the second source is 7 tokens, right-padded as Marian's tokenizer pads
    return ids, (ids != PAD).long()


def test_the_config_and_logits_equal_hugging_face(models):
    hf, ours = models
    config = ours.config
    assert (config.num_encoder_layers, config.num_layers, config.sinusoidal_layout) == (2, 3, "split")
    assert (config.activation, config.decoder_start_token_id, config.lm_head_bias) == ("silu", PAD, True)
    ids, mask = sources()
    target = torch.randint(1, PAD, (2, 6), generator=torch.Generator().manual_seed(4))
    target[:, 0] = PAD
    expected = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
    got = ours(ids, attention_mask=mask, decoder_input_ids=target).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam-4"])
def test_translations_equal_hugging_face_generate(models, num_beams):
    hf, ours = models
    ids, mask = sources()
    ends = [EOS, 26]  # 26: a token these weights produce mid-sentence, so some rows end early
    assert_generate_equals(hf, ours, ids, mask, num_beams, ends, PAD)


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam-4"])
def test_forced_eos_at_the_length_limit_as_hugging_face(models, tmp_path, num_beams):
    """Marian's forced_eos_token_id (read from config.json; null means none): a row that reaches the
    limit ends with it, in greedy and beam search, token for token and score for score with generate."""
    hf, _ = models
    hf.config.forced_eos_token_id = hf.generation_config.forced_eos_token_id = EOS
    try:
        hf.save_pretrained(tmp_path)
        ours = tformer.load(tmp_path)
        assert ours.config.forced_eos_token_id == EOS
        ids, mask = sources()
        assert_generate_equals(hf, ours, ids, mask, num_beams, [EOS], PAD, new_tokens=5)
        got = tformer.generate(ours, ids, 5, attention_mask=mask, num_beams=num_beams)
        assert bool((got[:, -1] == EOS).all())  # every row ran to the limit and was ended there
        free = tformer.generate(ours, ids, 5, attention_mask=mask, num_beams=num_beams, forced_eos_token_id=False)
        assert not bool((free[:, -1] == EOS).all())
    finally:
        hf.config.forced_eos_token_id = hf.generation_config.forced_eos_token_id = None


def test_saved_folders_load_in_hugging_face_with_the_same_logits(models, tmp_path):
    hf, ours = models
    ids, mask = sources()
    assert_saved_folder_loads(hf, ours, transformers.MarianMTModel, tmp_path / "marian", ids, mask, PAD)


def test_what_marian_cannot_hold_is_refused(tmp_path):
    model = tformer.build_model("transformer-multi30k", norm_position="pre", activation="gelu_tanh")
    with pytest.raises(CheckpointError, match="norm_position='pre'"):
        model.save(tmp_path / "out", format="hf")
    assert not (tmp_path / "out").exists()


def test_a_model_trained_with_the_papers_positions_saves_as_an_equal_marian(tmp_path):
    # transformer-multi30k: interleaved sine/cosine channels and no output bias; saved as Marian, its residual
    # channels are re-laid out for Marian's split table and a zero final_logits_bias is added: the same logits.
    torch.manual_seed(1)
    ours = tformer.build_model("transformer-multi30k", vocab_size=60, d_model=32, num_layers=2, num_heads=4, d_ff=64,
                               max_seq_len=64, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=1,
                               decoder_start_token_id=PAD).eval()
    assert (ours.config.sinusoidal_layout, ours.config.lm_head_bias) == ("interleaved", False)
    ours.save(tmp_path / "marian", format="hf")
    hf = transformers.MarianMTModel.from_pretrained(tmp_path / "marian").eval()
    ids, mask = sources()
    target = torch.randint(1, PAD, (2, 6), generator=torch.Generator().manual_seed(5))
    target[:, 0] = PAD
    with torch.no_grad():
        expected = ours(ids, attention_mask=mask, decoder_input_ids=target).logits
        got = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(tformer.generate(ours, ids, 8, attention_mask=mask, num_beams=3),
                       tformer.generate(tformer.load(tmp_path / "marian"), ids, 8, attention_mask=mask, num_beams=3))
