"""T5 (T5ForConditionalGeneration) in and out, both variants: T5 (ReLU, tied output scaled by
d_model^-0.5) and T5 v1.1 (tanh-GELU gated feed-forward, untied output). The same random weights
give Hugging Face's logits on a right-padded batch, its greedy and beam-search outputs token for
token, and a folder tformer writes loads in ``from_pretrained`` with the same logits."""

import pytest
import torch
from seq2seq_parity import assert_generate_equals, assert_saved_folder_loads

import tformer

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # compares with transformers

PAD, EOS = 0, 1
VARIANTS = {"t5": dict(feed_forward_proj="relu", tie_word_embeddings=True),
            "t5-v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)}


@pytest.fixture(scope="module", params=list(VARIANTS))
def models(request, tmp_path_factory):
    torch.manual_seed(0)
    # Equal depths: transformers 5.23's T5 generate sizes its cache by the encoder's depth (IndexError otherwise).
    config = transformers.T5Config(
        vocab_size=60, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=20, pad_token_id=PAD, eos_token_id=EOS,
        decoder_start_token_id=PAD, **VARIANTS[request.param],
    )
    hf = untied_as_v11_checkpoints(config, VARIANTS[request.param]["tie_word_embeddings"])
    folder = tmp_path_factory.mktemp("hf-t5")
    hf.save_pretrained(folder)
    return hf, tformer.load(folder)


def untied_as_v11_checkpoints(config, tie_word_embeddings: bool):
    """The model of ``config``, its output untied from the token table as in T5 v1.1's checkpoints. transformers 5
    reads the keyword tie_word_embeddings as scale_decoder_outputs and ties anyway, so the attribute is set after;
    untied, it also draws the encoder's and decoder's embed_tokens apart from ``shared``, which T5's checkpoints
    hold as one table: they are made one again."""
    config.tie_word_embeddings = tie_word_embeddings
    hf = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        hf.encoder.embed_tokens.weight.copy_(hf.shared.weight)
        hf.decoder.embed_tokens.weight.copy_(hf.shared.weight)
    assert (hf.lm_head.weight.data_ptr() == hf.shared.weight.data_ptr()) == tie_word_embeddings
    return hf


def sources():
    ids = torch.randint(2, 60, (2, 30), generator=torch.Generator().manual_seed(3))  # past the exact buckets
    ids[0, -1] = EOS
    ids[1, 21] = EOS
    ids[1, 22:] = PAD  # the second source is 22 tokens, right-padded as T5's tokenizer pads
    return ids, (ids != PAD).long()


def test_a_folder_with_separate_encoder_and_decoder_tables_is_refused(tmp_path):
    config = transformers.T5Config(vocab_size=60, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)
    config.tie_word_embeddings = False  # transformers 5 then draws three tables
    transformers.T5ForConditionalGeneration(config).save_pretrained(tmp_path)
    with pytest.raises(tformer.checkpoint.CheckpointError,
                       match=r"encoder\.embed_tokens\.weight differs from shared\.weight: tformer's T5 has one token"):
        tformer.load(tmp_path)


def test_logits_equal_hugging_face(models):
    hf, ours = models
    ids, mask = sources()
    target = torch.randint(2, 60, (2, 25), generator=torch.Generator().manual_seed(4))
    target[:, 0] = PAD
    expected = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
    got = ours(ids, attention_mask=mask, decoder_input_ids=target).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam-4"])
def test_generate_equals_hugging_face(models, num_beams):
    hf, ours = models
    ids, mask = sources()
    assert_generate_equals(hf, ours, ids, mask, num_beams, EOS, PAD)


def test_saved_folders_load_in_hugging_face_with_the_same_logits(models, tmp_path):
    hf, ours = models
    ids, mask = sources()
    assert_saved_folder_loads(hf, ours, transformers.T5ForConditionalGeneration, tmp_path / "t5", ids, mask, PAD)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_new_model_draws_its_weights_as_hugging_faces_t5(variant, tmp_path):
    """A model built from a T5 config (``initializer = "t5"``; initializer_factor 2 read as initializer_range 0.04)
    draws every tensor with the spread Hugging Face's T5ForConditionalGeneration draws it with. Compared in
    tformer's layout (Hugging Face's draws loaded, the query carrying sqrt(d_kv)): standard deviations within 10%
    for tensors of at least 1,024 draws (an estimate's spread there is about 2%), norm weights equal."""
    config = transformers.T5Config(
        vocab_size=500, d_model=64, d_kv=16, d_ff=256, num_layers=2, num_heads=4, initializer_factor=2.0,
        pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD, **VARIANTS[variant],
    )
    torch.manual_seed(0)
    transformers.T5ForConditionalGeneration(config).save_pretrained(tmp_path)
    theirs = tformer.load(tmp_path)
    assert theirs.config.initializer == "t5" and theirs.config.initializer_range == pytest.approx(0.04)
    ours = tformer.build_model(theirs.config).state_dict()
    compared = 0
    for name, tensor in theirs.state_dict().items():
        if name.endswith("norm.weight"):
            torch.testing.assert_close(ours[name], tensor, rtol=0, atol=0)  # the factor: 2 everywhere
        elif tensor.numel() >= 1024:
            assert ours[name].std().item() == pytest.approx(tensor.std().item(), rel=0.1), name
            compared += 1
    assert compared >= 20
    for stack in ("encoder", "decoder"):  # the relative bias tables (32 x 4): normal(0, 2 * d_model^-0.5)
        assert ours[f"{stack}.positional.bias.embedding.weight"].std().item() == pytest.approx(0.25, rel=0.25)
    # transformers 5.24 ties T5's output to the token table whatever tie_word_embeddings says; an untied one is
    # drawn as T5PreTrainedModel draws lm_head: normal(0, factor)
    untied = tformer.build_model(theirs.config.replace(tie_embeddings=False, scale_decoder_output=False))
    assert untied.lm_head.weight.std().item() == pytest.approx(2.0, rel=0.1)
