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
    hf = transformers.T5ForConditionalGeneration(config).eval()
    folder = tmp_path_factory.mktemp("hf-t5")
    hf.save_pretrained(folder)
    return hf, tformer.load(folder)


def sources():
    ids = torch.randint(2, 60, (2, 30), generator=torch.Generator().manual_seed(3))  # past the exact buckets
    ids[0, -1] = EOS
    ids[1, 21] = EOS
    ids[1, 22:] = PAD  # the second source is 22 tokens, right-padded as T5's tokenizer pads
    return ids, (ids != PAD).long()


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
