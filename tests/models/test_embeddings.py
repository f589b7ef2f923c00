"""Text embeddings (``tformer.embed``, ``models.embeddings``): the final hidden states pooled as the checkpoint
says; a padded batch gives each text the vector it gets alone (mean pooling ignores padding, last pooling finds
the last real token), and a sentence-transformers folder pools as sentence-transformers does."""

import json

import pytest
import torch
from embedding_models import TEXTS, bert_folder, sentence_transformers_folder, sentence_transformers_vectors

import tformer
from tformer.models.embeddings import choose_pooling, embed_ids
from tformer.nn.heads import pool
from tformer.pooling import EmbeddingError, Pooling, folder_pooling

TOLERANCE = 1e-5
SEQUENCES = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15], [16, 17, 18, 19, 20]]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return tformer.load(bert_folder(tmp_path_factory.mktemp("bert") / "bert"))


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    return tformer.build_model("gpt-nano", initializer_range=0.2).eval()


@pytest.mark.parametrize("family", ["bert", "gpt"])
@pytest.mark.parametrize("mode", ["cls", "mean", "last"])
@pytest.mark.parametrize("normalize", [False, True])
def test_a_padded_batch_gives_each_text_its_vector_alone(request, family, mode, normalize):
    model = request.getfixturevalue(family)
    pooling = Pooling(mode, normalize)
    batch = embed_ids(model, SEQUENCES, pooling)
    alone = torch.cat([embed_ids(model, [ids], pooling) for ids in SEQUENCES])
    assert batch.shape == (len(SEQUENCES), model.config.d_model) and batch.dtype == torch.float32
    assert (batch - alone).abs().max() < TOLERANCE
    if normalize:
        assert torch.allclose(batch.norm(dim=-1), torch.ones(len(SEQUENCES)))


def test_the_vectors_are_the_forwards_hidden_states_pooled(bert, gpt):
    ids = torch.tensor([SEQUENCES[1]])
    hidden = bert(ids).last_hidden_state[0]  # (T, D): the bare encoder's output
    assert (tformer.embed(bert, SEQUENCES[1], pooling="mean")[0] - hidden.mean(0)).abs().max() < TOLERANCE
    assert (tformer.embed(bert, SEQUENCES[1])[0] - hidden[0]).abs().max() < TOLERANCE  # its config: cls
    final = gpt(ids, output_hidden_states=True).hidden_states[-1][0]  # after the final norm
    assert (tformer.embed(gpt, [SEQUENCES[1]])[0] - final[-1]).abs().max() < TOLERANCE  # a decoder: the last token
    assert (tformer.embed(gpt, [SEQUENCES[1]], pooling="mean")[0] - final.mean(0)).abs().max() < TOLERANCE


def test_last_pooling_finds_the_last_real_token_on_either_side():
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]])
    assert torch.equal(pool(hidden, "last", mask), torch.stack([hidden[0, 1], hidden[1, 3]]))
    assert torch.equal(pool(hidden, "last"), hidden[:, -1])


def test_texts_token_ids_and_batches_give_the_same_vectors(bert):
    ids = [bert.tokenizer.encode(text) for text in TEXTS]
    by_text = tformer.embed(bert, TEXTS, pooling="mean", batch_size=3)
    assert (by_text - tformer.embed(bert, ids, pooling="mean", batch_size=1)).abs().max() < TOLERANCE
    assert (by_text[0] - tformer.embed(bert, TEXTS[0], pooling="mean")[0]).abs().max() < TOLERANCE


def test_the_family_default_and_what_is_given(bert, gpt, tmp_path):
    assert choose_pooling(bert).mode == "cls" and choose_pooling(gpt).mode == "last"
    assert choose_pooling(bert, None, "mean", True) == Pooling("mean", True, "as asked")
    assert folder_pooling(tmp_path) is None  # no modules.json: not a sentence-transformers folder


@pytest.mark.parametrize("inputs, message", [
    ([], "no input"),
    ([[]], "input 0 has no tokens"),
    ([[1] * 33], "input 0 has 33 tokens; the model reads at most 32"),
    ([[5], [120]], r"input 1: token id 120 is outside the vocabulary \[0, 120\)"),
])
def test_bad_inputs_are_refused_naming_them(bert, inputs, message):
    with pytest.raises(EmbeddingError, match=message):
        tformer.embed(bert, inputs)


def test_a_model_without_text_embeddings_and_unknown_modes_are_refused(bert):
    vision = tformer.build_model("vit-mnist")
    with pytest.raises(EmbeddingError, match="a vision model has no text embeddings"):
        tformer.embed(vision, [[1]])
    with pytest.raises(EmbeddingError, match="pooling='max' is not one of cls, mean, last"):
        tformer.embed(bert, [[5]], pooling="max")


@pytest.mark.slow  # transformers
@pytest.mark.parametrize("mode, normalize", [("mean", True), ("cls", False), ("last", True)])
def test_a_sentence_transformers_folder_pools_as_sentence_transformers(tmp_path, mode, normalize):
    folder = sentence_transformers_folder(tmp_path / "st", mode, normalize)
    assert folder_pooling(folder) == Pooling(mode, normalize, "1_Pooling/config.json")
    tokenizer = tformer.load(folder).tokenizer
    ids = [tokenizer.encode(text) for text in TEXTS]
    expected = sentence_transformers_vectors(folder, ids, mode, normalize)
    assert (tformer.embed(folder, TEXTS) - expected).abs().max() < TOLERANCE
    assert (tformer.embed(str(folder), ids, batch_size=2) - expected).abs().max() < TOLERANCE


@pytest.mark.slow  # transformers
def test_sentence_transformers_modules_and_modes_tformer_does_not_compute_are_refused(tmp_path):
    folder = sentence_transformers_folder(tmp_path / "max", "max")
    with pytest.raises(EmbeddingError, match="pooling_mode_max_tokens is not supported; tformer pools by exactly one"):
        tformer.embed(folder, TEXTS)
    folder = sentence_transformers_folder(tmp_path / "dense", extra_modules=("Dense",))
    with pytest.raises(EmbeddingError, match="module 'sentence_transformers.models.Dense' is not supported"):
        folder_pooling(folder)
    config = folder / "1_Pooling" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "pooling_mode_cls_token": True}))
    (folder / "modules.json").write_text(json.dumps(json.loads((folder / "modules.json").read_text())[:3]))
    with pytest.raises(EmbeddingError, match="2 pooling modes are set"):
        folder_pooling(folder)
