"""The encoder family: BERT-shaped presets, heads, losses, padding, the fine-tuning load and the
refusals. Hugging Face parity of every head is tests/interop/test_interop_encoder.py's."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import tformer
from tformer import ConfigError
from tformer.generation.settings import GenerationError
from tformer.models import EncoderModel, build_model
from tformer.training.checkpoints import check_same_shape

VOCAB = 50


def tiny(head=None, **overrides) -> EncoderModel:
    """A 2-layer, 32-wide encoder in eval mode (dropout off) with ``head``."""
    torch.manual_seed(0)
    fields = dict(vocab_size=VOCAB, max_seq_len=32, d_model=32, num_layers=2, num_heads=4, head=head)
    return build_model("bert-tiny", **{**fields, **overrides}).eval()


def batch(length: int = 9) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(1, VOCAB, (3, length), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    attention_mask[2, 3:] = 0
    input_ids[attention_mask == 0] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 4:] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


# ---- presets --------------------------------------------------------------------------------------


def test_bert_base_has_the_parameters_of_hugging_face_bert_base_uncased():
    with torch.device("meta"):  # shapes only: counting needs no weights
        model = build_model("bert-base")  # BertModel: embeddings, 12 post-norm layers, pooler
    assert model.num_parameters() == 109_482_240
    assert model.pooler is not None and model.config.head is None


@pytest.mark.parametrize("name, layers, width, heads", [
    ("bert-tiny", 2, 128, 2), ("bert-mini", 4, 256, 4), ("bert-small", 4, 512, 8), ("bert-base", 12, 768, 12),
])
def test_bert_presets(name, layers, width, heads):
    config = tformer.PRESETS[name]
    assert (config.num_layers, config.d_model, config.num_heads, config.d_ff) == (layers, width, heads, 4 * width)
    assert (config.vocab_size, config.max_seq_len, config.type_vocab_size) == (30522, 512, 2)
    assert (config.activation, config.norm_eps, config.norm_position, config.embedding_norm) == \
        ("gelu", 1e-12, "post", True)


# ---- heads and outputs ----------------------------------------------------------------------------


@pytest.mark.parametrize("head, shape", [
    (None, (3, 9, 32)),
    ("masked_lm", (3, 9, VOCAB)),
    ("next_sentence", (3, 2)),
    ("pretraining", (3, 9, VOCAB)),
    ("sequence_classification", (3, 4)),
    ("token_classification", (3, 9, 4)),
    ("question_answering", (3, 9, 2)),
])
def test_each_head_gives_its_logits(head, shape):
    labels = {"num_labels": 4} if head in ("sequence_classification", "token_classification") else {}
    output = tiny(head, **labels)(**batch())
    assert output.logits.shape == shape
    assert output.last_hidden_state.shape == (3, 9, 32)
    assert (output.pooled is not None) == (head in (None, "next_sentence", "pretraining", "sequence_classification"))
    if head == "pretraining":
        assert output.next_sentence_logits.shape == (3, 2)
    if head == "question_answering":
        assert torch.equal(output.start_logits, output.logits[..., 0])
        assert torch.equal(output.end_logits, output.logits[..., 1])


def test_masked_lm_decoder_is_the_token_table_and_trains_through_both():
    model = tiny("masked_lm").train()
    assert model.mlm_head.decoder.weight is model.embedding.token.weight
    ids = batch()["input_ids"]
    model(ids, labels=ids).loss.backward()
    assert all(parameter.grad is not None for parameter in model.parameters())


def test_real_tokens_do_not_see_padding():
    """A right-padded row gives the same outputs at its real tokens as the row alone."""
    model = tiny("token_classification")
    inputs = batch()
    padded = model(**inputs).logits
    alone = model(inputs["input_ids"][2:, :3], token_type_ids=inputs["token_type_ids"][2:, :3]).logits
    assert (padded[2, :3] - alone[0]).abs().max() < 1e-5


def test_reference_and_fused_attention_agree():
    model = tiny("masked_lm")
    fused = model(**batch())
    reference = model(**batch(), output_attentions=True, output_hidden_states=True)
    assert (fused.logits - reference.logits).abs().max() < 1e-5
    assert len(reference.attentions) == 2 and reference.attentions[0].shape == (3, 4, 9, 9)
    assert len(reference.hidden_states) == 3
    assert reference.attentions[0][2, :, :, 3:].abs().max() == 0  # padding keys get no weight


def test_pre_norm_switch_adds_a_final_norm():
    model = tiny("masked_lm", norm_position="pre")
    assert isinstance(model.stack.final_norm, torch.nn.LayerNorm)
    assert torch.isfinite(model(**batch()).logits).all()


def test_roberta_positions_number_real_tokens_after_the_padding_index():
    model = tiny(pad_token_id=1, position_offset=2)
    assert model.position_ids(torch.tensor([[0, 5, 7, 1, 1]])).tolist() == [[2, 3, 4, 1, 1]]
    assert tiny().position_ids(torch.tensor([[0, 5, 7, 0]])).tolist() == [[0, 1, 2, 3]]


# ---- losses ---------------------------------------------------------------------------------------


def test_token_classification_ignores_minus_100():
    model = tiny("token_classification", num_labels=3)
    inputs = batch()
    labels = torch.randint(0, 3, inputs["input_ids"].shape).masked_fill(inputs["attention_mask"] == 0, -100)
    output = model(**inputs, labels=labels)
    kept = labels != -100
    assert torch.allclose(output.loss, F.cross_entropy(output.logits[kept], labels[kept]))


def test_question_answering_loss_runs_over_the_real_tokens_and_ignores_positions_outside_them():
    model = tiny("question_answering")
    inputs = batch()  # rows of 9, 6 and 3 real tokens
    # row 2: start 99 is past the end and end 5 lies on padding, both ignored; -5 clamps to 0, still a target
    output = model(**inputs, start_positions=torch.tensor([1, 2, 99]), end_positions=torch.tensor([3, -5, 5]))
    def over_real_tokens(logits, positions):  # each row's softmax over its own tokens
        return torch.stack([F.cross_entropy(logits[row, :length], torch.tensor(position))
                            for row, (length, position) in enumerate(zip((9, 6), positions, strict=True))]).mean()
    start = over_real_tokens(output.start_logits, (1, 2))
    end = over_real_tokens(output.end_logits, (3, 0))
    torch.testing.assert_close(output.loss, (start + end) / 2)


@pytest.mark.parametrize("head", ["masked_lm", "pretraining"])
def test_labelled_logits_only_gives_the_same_loss_and_gradients(head):
    model = tiny(head)
    inputs = batch()
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[0, 1], labels[1, 4], labels[2, 0] = 7, 8, 9
    full = model(**inputs, labels=labels)
    full.loss.backward()
    full_gradients = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    short = model(**inputs, labels=labels, labelled_logits_only=True)
    short.loss.backward()
    assert short.logits.shape == (3, VOCAB)
    assert torch.allclose(short.logits, full.logits[labels != -100], atol=1e-6)
    assert torch.allclose(short.loss, full.loss, atol=1e-6)
    for parameter, gradient in zip(model.parameters(), full_gradients, strict=True):
        if gradient is None:  # the next-sentence head, without its labels
            assert parameter.grad is None
        else:
            assert torch.allclose(parameter.grad, gradient, atol=1e-6)
    with pytest.raises(ValueError, match="labelled_logits_only needs labels"):
        model(**inputs, labelled_logits_only=True)


def test_pretraining_loss_is_the_sum_of_both():
    model = tiny("pretraining")
    inputs = batch()
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    nsp = torch.tensor([0, 1, 0])
    both = model(**inputs, labels=labels, next_sentence_label=nsp)
    mlm = F.cross_entropy(both.logits[labels != -100], labels[labels != -100])
    assert torch.allclose(both.loss, mlm + F.cross_entropy(both.next_sentence_logits, nsp))
    assert torch.allclose(model(**inputs, labels=labels).loss, mlm)


@pytest.mark.parametrize("head, arguments, message", [
    (None, {"labels": torch.zeros(3, dtype=torch.long)}, "labels given, but head=None reads none"),
    ("question_answering", {"labels": torch.zeros(3, dtype=torch.long)},
     "labels given, but head='question_answering' reads start_positions, end_positions"),
    ("masked_lm", {"next_sentence_label": torch.zeros(3, dtype=torch.long)}, "next_sentence_label given"),
    ("question_answering", {"start_positions": torch.zeros(3, dtype=torch.long)}, "needs both start_positions"),
])
def test_labels_a_head_does_not_read_are_refused(head, arguments, message):
    with pytest.raises(ValueError, match=message):
        tiny(head)(**batch(), **arguments)


def test_attention_mask_shape_is_checked_even_without_padding():
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(3, 9\)"):
        tiny()(batch()["input_ids"], attention_mask=torch.ones(3, 8))


def test_token_types_are_checked():
    with pytest.raises(ValueError, match=r"token type id 2 is outside the token types \[0, 2\)"):
        tiny()(batch()["input_ids"], token_type_ids=torch.full((3, 9), 2))


def test_mean_pooling_reads_the_tokens_that_are_not_padding():
    model = tiny("sequence_classification", pooling="mean")
    inputs = batch()
    output = model(**inputs, output_hidden_states=True)
    mask = inputs["attention_mask"][:, :, None].float()
    mean = (output.last_hidden_state * mask).sum(1) / mask.sum(1)  # (B, D)
    torch.testing.assert_close(output.pooled, torch.tanh(model.pooler.dense(mean)))
    alone = model(**{name: tensor[2:, :3] for name, tensor in inputs.items()})  # row 2 without its padding
    torch.testing.assert_close(output.logits[2:], alone.logits, atol=1e-5, rtol=0)
    first = tiny("sequence_classification")  # the same weights, BERT's first-token pooling
    assert not torch.allclose(first(**inputs).logits, output.logits)


# ---- config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fields, message", [
    ({"head": "summarise"}, "head='summarise' is not one of None, masked_lm"),
    ({"head": "masked_lm", "num_labels": 3}, "num_labels=3 is read only by the classification heads"),
    ({"head": "token_classification", "problem_type": "regression"},
     "problem_type='regression' is read only by head='sequence_classification'"),
    ({"head": "sequence_classification", "problem_type": "ranking"}, "problem_type='ranking' is not one of"),
    ({"head": "sequence_classification", "num_labels": 3, "label_names": ("a", "b")},
     "label_names=['a', 'b'] must be 3 distinct names (num_labels=3)"),
    ({"position_offset": 2, "pad_token_id": None}, "position_offset=2 needs pad_token_id"),
    ({"head": "masked_lm", "pooler_input_dropout": True}, "pooler_input_dropout=True needs a head that reads"),
    ({"head": "token_classification", "pooling": "mean"}, "pooling='mean' needs a head that reads the pooler"),
    ({"head": "sequence_classification", "pooling": "max"}, "pooling='max' is not one of cls, mean"),
])
def test_bad_encoder_config_names_the_field(fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        tformer.PRESETS["bert-tiny"].replace(**fields)


def test_encoder_fields_are_refused_by_the_decoder():
    with pytest.raises(ConfigError, match="head='masked_lm' is a field of the encoder, vision families; "
                                          "architecture='decoder' does not use it"):
        tformer.PRESETS["gpt-nano"].replace(head="masked_lm")


def test_generate_refuses_an_encoder():
    with pytest.raises(GenerationError, match=r"\(EncoderModel, architecture='encoder'\) does not generate tokens"):
        tformer.generate(tiny("masked_lm"), torch.tensor([[1, 2, 3]]), max_new_tokens=2)


# ---- saving and fine-tuning -----------------------------------------------------------------------


def test_save_and_load_keep_the_head_and_its_labels(tmp_path):
    model = tiny("sequence_classification", num_labels=3, label_names=("neg", "neu", "pos"),
                 problem_type="single_label_classification")
    model.save(tmp_path)
    loaded = tformer.load(tmp_path)
    assert loaded.config == model.config
    assert torch.equal(loaded(**batch()).logits, model(**batch()).logits)


def test_fine_tuning_load_reports_dropped_and_new_weights(tmp_path):
    pretrained = tiny("pretraining")
    pretrained.save(tmp_path)
    with pytest.warns(UserWarning, match=(
        r"head='token_classification': newly initialised: classifier\.bias, classifier\.weight; "
        r"not used: mlm_head\.bias, mlm_head\.dense\.bias, .*nsp_head\.weight, pooler\.dense\.bias, "
        r"pooler\.dense\.weight$")):
        model = tformer.load(tmp_path, head="token_classification", label_names=["O", "B-PER", "I-PER"])
    assert model.config.num_labels == 3 and model.pooler is None
    state = pretrained.state_dict()
    for name, tensor in model.state_dict().items():
        if not name.startswith("classifier."):
            assert torch.equal(tensor, state[name]), name


def test_fine_tuning_load_chooses_the_pooling_and_a_head_without_a_pooler_drops_it(tmp_path):
    pretrained = tiny("masked_lm")
    pretrained.save(tmp_path / "mlm")
    with pytest.warns(UserWarning, match="newly initialised: classifier"):
        model = tformer.load(tmp_path / "mlm", head="sequence_classification", pooling="mean")
    assert model.config.pooling == "mean"
    backbone = model.stack.blocks[0].attention.qkv_proj.weight
    assert torch.equal(backbone, pretrained.stack.blocks[0].attention.qkv_proj.weight)
    model.save(tmp_path / "sst")
    assert tformer.load(tmp_path / "sst").config.pooling == "mean"
    with pytest.warns(UserWarning):
        tagger = tformer.load(tmp_path / "sst", head="token_classification")
    assert tagger.config.pooling == "cls" and tagger.pooler is None


def test_a_load_may_change_the_dropout_rates_and_nothing_else_of_the_backbone(tmp_path):
    tiny("sequence_classification", dropout=0.0, attention_dropout=0.0).save(tmp_path)
    plain, dropped = tformer.load(tmp_path), tformer.load(tmp_path, dropout=0.1, attention_dropout=0.2)
    assert (dropped.config.dropout, dropped.config.attention_dropout) == (0.1, 0.2)
    assert dropped.config == plain.config.replace(dropout=0.1, attention_dropout=0.2)
    inputs = batch()
    assert torch.equal(dropped(**inputs).logits, plain(**inputs).logits)  # eval mode: the same function
    torch.manual_seed(0)
    assert not torch.allclose(dropped.train()(**inputs).logits, plain.train()(**inputs).logits)
    with pytest.raises(ConfigError, match="dropout=1.5"):
        tformer.load(tmp_path, dropout=1.5)


def test_fine_tuning_load_with_the_same_head_warns_nothing(tmp_path, recwarn):
    tiny("sequence_classification").save(tmp_path)
    tformer.load(tmp_path, head="sequence_classification")
    assert not recwarn.list


def test_new_label_names_reset_a_classifier_whose_rows_belong_to_other_labels(tmp_path):
    trained = tiny("token_classification", num_labels=3, label_names=("O", "B-PER", "I-PER"))
    trained.save(tmp_path)
    with pytest.warns(UserWarning, match="classifier initialised afresh: its labels were O, B-PER, I-PER, the "
                                         "model's are O, I-PER, B-PER"):
        reordered = tformer.load(tmp_path, label_names=["O", "I-PER", "B-PER"])
    assert not torch.equal(reordered.classifier.weight, trained.classifier.weight)
    assert torch.equal(reordered.embedding.token.weight, trained.embedding.token.weight)
    kept = tformer.load(tmp_path, label_names=["O", "B-PER", "I-PER"])
    assert torch.equal(kept.classifier.weight, trained.classifier.weight)


def test_checkpoints_written_before_the_encoder_fields_still_resume(tmp_path):
    """A run folder from before these fields existed: its config.json lacks them, and resuming
    compares them at their defaults rather than refusing."""
    config = tformer.PRESETS["gpt-nano"]
    build_model(config).save(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    for name in ("head", "num_labels", "problem_type", "label_names", "position_offset", "pooler_input_dropout"):
        del raw[name]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    check_same_shape(tmp_path, config)
    assert tformer.load(tmp_path).config == config
