"""Hugging Face interop for the encoder family: BERT and RoBERTa folders of every head class load
with HF's logits and losses and save back.

Every checkpoint is a seeded random tiny HF model written by ``save_pretrained`` into a temporary
folder (nothing is downloaded), its parameters perturbed so that biases and norms are not 0 and 1.
HF runs with eager attention. Batches are right-padded (rows of 10, 7 and 4 real tokens) with a
second segment (``token_type_ids`` = 1 from position 5 on), and logits are compared at every
position, padding included: both number positions the same way (BERT: indices; RoBERTa: after the
padding index, padding at the padding index).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")
from transformers import BertConfig, RobertaConfig  # noqa: E402

import tformer  # noqa: E402
from tformer.checkpoint import CheckpointError  # noqa: E402
from tformer.models import build_model  # noqa: E402
from tformer.nn.losses import span_loss  # noqa: E402

pytestmark = pytest.mark.slow  # compares with transformers

transformers.logging.set_verbosity_error()

# Measured: the largest |tformer - HF| over all heads here is 7e-7 (hidden states of the bare model);
# float32 sums in another order (fused QKV, SDPA) stay far below this.
TOLERANCE = 1e-5
VOCAB = 99
TINY = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=40)
BERT_CLASSES = ["BertModel", "BertForMaskedLM", "BertForPreTraining", "BertForNextSentencePrediction",
                "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering"]
ROBERTA_CLASSES = ["RobertaModel", "RobertaForMaskedLM", "RobertaForSequenceClassification",
                   "RobertaForTokenClassification", "RobertaForQuestionAnswering"]
NUM_LABELS = 3


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def hf_model(class_name: str, folder=None, **overrides) -> torch.nn.Module:
    """A seeded, perturbed tiny HF model of ``class_name``, saved to ``folder`` when given."""
    config_class = RobertaConfig if class_name.startswith("Roberta") else BertConfig
    labels = {"num_labels": NUM_LABELS} if "Classification" in class_name else {}
    config = config_class(**{**TINY, **labels, **overrides}, attn_implementation="eager")
    torch.manual_seed(0)
    model = perturbed(getattr(transformers, class_name)(config))
    if folder is not None:
        model.save_pretrained(folder)
    return model


def hf_from_folder(folder) -> torch.nn.Module:
    class_name = json.loads((folder / "config.json").read_text())["architectures"][0]
    return getattr(transformers, class_name).from_pretrained(folder, attn_implementation="eager").eval()


def padded_batch(pad_token_id: int) -> dict[str, torch.Tensor]:
    """Three right-padded rows of 10 positions (10, 7 and 4 real tokens), segment B from position 5."""
    input_ids = torch.randint(3, VOCAB, (3, 10), generator=torch.Generator().manual_seed(2))
    attention_mask = torch.ones_like(input_ids)
    for row, length in enumerate((10, 7, 4)):
        attention_mask[row, length:] = 0
    input_ids[attention_mask == 0] = pad_token_id
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 5:] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def outputs_of(class_name: str, output) -> dict[str, torch.Tensor]:
    """The named outputs of a head, tformer's or HF's, keyed alike."""
    tformer_output = isinstance(output, tformer.EncoderOutput)
    if class_name.endswith("Model"):
        if tformer_output:
            return {"hidden": output.last_hidden_state, "pooled": output.pooled}
        return {"hidden": output.last_hidden_state, "pooled": output.pooler_output}
    if class_name.endswith("QuestionAnswering"):
        return {"start": output.start_logits, "end": output.end_logits}
    if class_name.endswith("PreTraining"):
        if tformer_output:
            return {"mlm": output.logits, "nsp": output.next_sentence_logits}
        return {"mlm": output.prediction_logits, "nsp": output.seq_relationship_logits}
    return {"logits": output.logits}


@torch.no_grad()
def max_difference(class_name: str, ours, theirs, batch) -> float:
    our_outputs = outputs_of(class_name, ours(**batch))
    their_outputs = outputs_of(class_name, theirs(**batch))
    differences = []
    for key, theirs_tensor in their_outputs.items():
        assert our_outputs[key].shape == theirs_tensor.shape, key
        assert theirs_tensor.std() > 0.01  # a real comparison, not of near-constant outputs
        differences.append((our_outputs[key] - theirs_tensor).abs().max().item())
    return max(differences)


def pad_id(model) -> int:
    return model.config.pad_token_id


# ---- HF -> tformer: identical outputs ---------------------------------------------------------


@pytest.mark.parametrize("class_name", BERT_CLASSES + ROBERTA_CLASSES)
def test_every_head_class_gives_hf_outputs_on_a_padded_pair_batch(tmp_path, class_name):
    reference = hf_model(class_name, tmp_path)
    model = tformer.load(tmp_path)
    difference = max_difference(class_name, model, reference, padded_batch(pad_id(model)))
    print(f"max |difference| {class_name}: {difference:.2e}")
    assert difference < TOLERANCE


def test_roberta_positions_start_after_the_padding_index(tmp_path):
    hf_model("RobertaModel", tmp_path, pad_token_id=1)
    model = tformer.load(tmp_path)
    assert model.config.position_offset == 2
    input_ids = torch.tensor([[5, 6, 7, 1, 1]])
    assert model.position_ids(input_ids).tolist() == [[2, 3, 4, 1, 1]]


LABELLED = {
    "BertForMaskedLM": lambda batch: {"labels": torch.where(torch.rand(batch["input_ids"].shape) < 0.3,
                                                            batch["input_ids"], -100)},
    "BertForPreTraining": lambda batch: {"labels": batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100),
                                         "next_sentence_label": torch.tensor([0, 1, 1])},
    "BertForNextSentencePrediction": lambda batch: {"labels": torch.tensor([1, 0, 1])},
    "BertForTokenClassification": lambda batch: {
        "labels": torch.randint(0, NUM_LABELS, batch["input_ids"].shape).masked_fill(batch["attention_mask"] == 0,
                                                                                     -100)},
    "RobertaForMaskedLM": lambda batch: {"labels": torch.where(torch.rand(batch["input_ids"].shape) < 0.3,
                                                               batch["input_ids"], -100)},
}
PROBLEM_TYPES = {
    "single_label_classification": lambda: torch.tensor([0, 2, 1]),
    "multi_label_classification": lambda: torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]),
    "regression": lambda: torch.randn(3, NUM_LABELS),
}


@torch.no_grad()
def assert_same_loss(ours, theirs, batch, labels) -> None:
    our_loss = ours(**batch, **labels).loss
    their_loss = theirs(**batch, **labels).loss
    print(f"loss {our_loss.item():.6f} tformer, {their_loss.item():.6f} HF")
    assert torch.isfinite(our_loss) and abs(our_loss.item() - their_loss.item()) < TOLERANCE


@pytest.mark.parametrize("class_name", LABELLED)
def test_losses_equal_hf_losses(tmp_path, class_name):
    reference = hf_model(class_name, tmp_path)
    model = tformer.load(tmp_path)
    batch = padded_batch(pad_id(model))
    torch.manual_seed(3)
    assert_same_loss(model, reference, batch, LABELLED[class_name](batch))


@torch.no_grad()
def test_question_answering_loss_is_hfs_over_the_real_tokens(tmp_path):
    """HF's QA loss spreads each softmax over the padding too, tformer's over a row's real tokens (the loss
    the span_qa task trains on, whatever the padding). Unpadded they are one loss; padded, ``span_loss``
    without the mask is HF's, and the model's is HF's with the padding's logits at -inf."""
    reference = hf_model("BertForQuestionAnswering", tmp_path)
    model = tformer.load(tmp_path)
    batch = padded_batch(pad_id(model))  # rows of 10, 7 and 4 real tokens
    positions = {"start_positions": torch.tensor([1, 3, 40]), "end_positions": torch.tensor([4, 5, 2])}  # 40: ignored
    unpadded = {name: values[:1] for name, values in batch.items()}
    first = {name: values[:1] for name, values in positions.items()}
    assert_same_loss(model, reference, unpadded, first)
    ours, theirs = model(**batch, **positions), reference(**batch, **positions)
    hf_definition = span_loss(ours.start_logits, ours.end_logits, positions["start_positions"],
                              positions["end_positions"])
    assert abs(hf_definition.item() - theirs.loss.item()) < TOLERANCE
    padding = batch["attention_mask"] == 0
    start = F.cross_entropy(theirs.start_logits.masked_fill(padding, -math.inf)[:2], torch.tensor([1, 3]))
    end = F.cross_entropy(theirs.end_logits.masked_fill(padding, -math.inf), positions["end_positions"])
    assert abs(ours.loss.item() - ((start + end) / 2).item()) < TOLERANCE
    assert abs(ours.loss.item() - theirs.loss.item()) > 100 * TOLERANCE  # the padding counts in HF's


@pytest.mark.parametrize("family", ["Bert", "Roberta"])
@pytest.mark.parametrize("problem_type", [*PROBLEM_TYPES, None])
def test_sequence_classification_losses_by_problem_type(tmp_path, family, problem_type):
    """Each problem type as HF computes it; None infers it from the labels as HF does (integer
    labels: single-label; float labels: multi-label). HF fixes an inferred type in its config on the
    first call, so each kind of labels gets a freshly loaded HF model."""
    class_name = f"{family}ForSequenceClassification"
    hf_model(class_name, tmp_path, problem_type=problem_type)
    model = tformer.load(tmp_path)
    assert model.config.problem_type == problem_type
    batch = padded_batch(pad_id(model))
    kinds = ["single_label_classification", "multi_label_classification"] if problem_type is None else [problem_type]
    for kind in kinds:
        assert_same_loss(model, hf_from_folder(tmp_path), batch, {"labels": PROBLEM_TYPES[kind]()})


def test_single_output_regression_loss(tmp_path):
    reference = hf_model("BertForSequenceClassification", tmp_path, num_labels=1)
    model = tformer.load(tmp_path)
    assert model.config.num_labels == 1 and model.config.problem_type is None
    assert_same_loss(model, reference, padded_batch(0), {"labels": torch.randn(3)})


# ---- tformer -> HF ------------------------------------------------------------------------------


@pytest.mark.parametrize("class_name", BERT_CLASSES + ROBERTA_CLASSES)
def test_round_trip_gives_the_same_tensors_and_hf_loads_it_with_the_same_outputs(tmp_path, class_name):
    hf_model(class_name, tmp_path / "original")
    model = tformer.load(tmp_path / "original")
    model.save(tmp_path / "written", format="hf")
    original = load_file(str(tmp_path / "original" / "model.safetensors"))
    written = load_file(str(tmp_path / "written" / "model.safetensors"))
    assert sorted(written) == sorted(original)
    assert all(torch.equal(written[name], original[name]) for name in original)
    reloaded = hf_from_folder(tmp_path / "written")
    assert type(reloaded).__name__ == class_name
    assert max_difference(class_name, model, reloaded, padded_batch(pad_id(model))) < TOLERANCE
    assert tformer.load(tmp_path / "written").config == model.config


def test_labels_and_problem_type_round_trip(tmp_path):
    names = {0: "negative", 1: "neutral", 2: "positive"}
    hf_model("BertForSequenceClassification", tmp_path / "hf", id2label=names,
             label2id={v: k for k, v in names.items()}, problem_type="single_label_classification")
    model = tformer.load(tmp_path / "hf")
    assert model.config.label_names == ("negative", "neutral", "positive")
    model.save(tmp_path / "back", format="hf")
    raw = json.loads((tmp_path / "back" / "config.json").read_text())
    assert raw["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}
    assert raw["label2id"] == {"negative": 0, "neutral": 1, "positive": 2}
    assert raw["problem_type"] == "single_label_classification"
    reloaded = hf_from_folder(tmp_path / "back")
    assert reloaded.config.id2label == names and reloaded.config.problem_type == "single_label_classification"


def test_untied_masked_lm_decoder_round_trips(tmp_path):
    hf_model("BertForMaskedLM", tmp_path / "hf", tie_word_embeddings=False)
    model = tformer.load(tmp_path / "hf")
    assert not model.config.tie_embeddings
    assert model.mlm_head.decoder.weight.data_ptr() != model.embedding.token.weight.data_ptr()
    model.save(tmp_path / "back", format="hf")
    assert "cls.predictions.decoder.weight" in load_file(str(tmp_path / "back" / "model.safetensors"))
    reloaded = hf_from_folder(tmp_path / "back")
    assert max_difference("BertForMaskedLM", model, reloaded, padded_batch(0)) < TOLERANCE


@pytest.mark.parametrize("head", [None, "masked_lm", "pretraining", "sequence_classification",
                                  "token_classification", "question_answering"])
def test_tformer_encoder_saved_as_bert_loads_in_hf_with_the_same_outputs(tmp_path, head):
    torch.manual_seed(0)
    labels = {"num_labels": 4, "label_names": ("a", "b", "c", "d")} if head and "classification" in head else {}
    model = perturbed(build_model("bert-tiny", vocab_size=VOCAB, max_seq_len=40, head=head, **labels))
    model.save(tmp_path, format="hf")
    reference = hf_from_folder(tmp_path)
    class_name = type(reference).__name__
    assert class_name == {None: "BertModel"}.get(head, class_name)
    assert max_difference(class_name, model, reference, padded_batch(0)) < TOLERANCE
    assert tformer.load(tmp_path).config == model.config


def test_tformer_encoder_with_roberta_positions_saves_as_roberta(tmp_path):
    torch.manual_seed(0)
    model = perturbed(build_model("bert-tiny", vocab_size=VOCAB, max_seq_len=40, pad_token_id=1, position_offset=2,
                                  head="sequence_classification", pooler_input_dropout=True))
    model.save(tmp_path, format="hf")
    reference = hf_from_folder(tmp_path)
    assert type(reference).__name__ == "RobertaForSequenceClassification"
    assert max_difference("RobertaForSequenceClassification", model, reference, padded_batch(1)) < TOLERANCE


# ---- fine-tuning from a pretrained folder -------------------------------------------------------


def test_fine_tuning_load_keeps_the_backbone_and_pooler_and_reports_the_new_head(tmp_path):
    pretrained = hf_model("BertForPreTraining", tmp_path)
    with pytest.warns(UserWarning, match=(
        r"loaded with head='sequence_classification': newly initialised: classifier\.bias, classifier\.weight; "
        r"not used: cls\.predictions\.bias, cls\.predictions\.transform\.LayerNorm\.bias, .*cls\.seq_relationship"
    )) as caught:
        model = tformer.load(tmp_path, head="sequence_classification", label_names=["no", "yes"])
    assert len(caught) == 1
    assert model.config.num_labels == 2 and model.config.label_names == ("no", "yes")
    assert torch.equal(model.pooler.dense.weight, pretrained.bert.pooler.dense.weight)
    assert torch.equal(model.stack.blocks[1].feedforward.out_proj.weight,
                       pretrained.bert.encoder.layer[1].output.dense.weight)
    with torch.no_grad():
        pooled = pretrained.bert(**padded_batch(0)).pooler_output
        assert (model(**padded_batch(0)).pooled - pooled).abs().max() < TOLERANCE
    model.save(tmp_path / "fine-tuned", format="hf")
    assert type(hf_from_folder(tmp_path / "fine-tuned")).__name__ == "BertForSequenceClassification"


def test_fine_tuning_roberta_masked_lm_into_classification_initialises_its_classification_head(tmp_path):
    hf_model("RobertaForMaskedLM", tmp_path)
    with pytest.warns(UserWarning, match=r"newly initialised: classifier\.bias, classifier\.weight, "
                                         r"pooler\.dense\.bias, pooler\.dense\.weight; not used: lm_head\.bias"):
        model = tformer.load(tmp_path, head="sequence_classification", num_labels=5)
    assert model.config.pooler_input_dropout  # RoBERTa's classification head
    model.save(tmp_path / "out", format="hf")
    assert type(hf_from_folder(tmp_path / "out")).__name__ == "RobertaForSequenceClassification"


def test_classifier_of_another_size_is_reinitialised(tmp_path):
    hf_model("BertForTokenClassification", tmp_path)  # 3 labels
    with pytest.warns(UserWarning, match=r"newly initialised: classifier\.bias, classifier\.weight; "
                                         r"not used: classifier\.bias, classifier\.weight"):
        model = tformer.load(tmp_path, num_labels=7)
    assert model.config.head == "token_classification" and model.classifier.out_features == 7


def test_another_heads_weights_are_dropped_with_a_warning_as_hf_does(tmp_path):
    """bert-base-uncased's layout: config.json says BertForMaskedLM, the file also holds the pooler
    and the next-sentence head, and older files the tied decoder and index buffers."""
    reference = hf_model("BertForPreTraining")
    state = {name: tensor.clone() for name, tensor in reference.state_dict().items()}
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"].clone()
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"].clone()
    state["bert.embeddings.position_ids"] = torch.arange(40)[None]
    save_file(state, str(tmp_path / "model.safetensors"))
    raw = json.loads(reference.config.to_json_string())
    raw["architectures"] = ["BertForMaskedLM"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.warns(UserWarning, match=r"not used: bert\.pooler\.dense\.bias, bert\.pooler\.dense\.weight, "
                                         r"cls\.seq_relationship\.bias, cls\.seq_relationship\.weight$"):
        model = tformer.load(tmp_path)
    with torch.no_grad():
        difference = (model(**padded_batch(0)).logits - reference(**padded_batch(0)).prediction_logits).abs().max()
    assert difference < TOLERANCE


def test_a_missing_head_weight_is_an_error_unless_the_head_is_new(tmp_path):
    hf_model("BertForQuestionAnswering", tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["qa_outputs.bias"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing: qa_outputs\.bias\)"):
        tformer.load(tmp_path)
    with pytest.warns(UserWarning, match=r"newly initialised: qa_head\.bias$"):  # the weight loads
        model = tformer.load(tmp_path, head="question_answering")
    assert torch.equal(model.qa_head.weight, state["qa_outputs.weight"])


def test_head_arguments_are_refused_for_a_decoder(tmp_path):
    build_model("gpt-nano").save(tmp_path)
    with pytest.raises(tformer.ConfigError, match=r"choose an encoder's or a vision model's head; this checkpoint "
                                                  r"is architecture='decoder'"):
        tformer.load(tmp_path, head="sequence_classification")


# ---- fail closed ----------------------------------------------------------------------------------


def write_config(folder, **changes) -> None:
    raw = json.loads((folder / "config.json").read_text())
    raw.update(changes)
    (folder / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("class_name, changes, message", [
    ("BertModel", {"position_embedding_type": "relative_key"},
     r"bert position_embedding_type='relative_key' is not supported by tformer \(supported: 'absolute'\)"),
    ("BertModel", {"is_decoder": True}, r"bert is_decoder=True is not supported"),
    ("BertModel", {"add_cross_attention": True}, r"bert add_cross_attention=True is not supported"),
    ("BertModel", {"architectures": ["BertForMultipleChoice"]},
     r"bert architectures='BertForMultipleChoice' is not supported by tformer \(supported: 'BertModel', "),
    ("BertForSequenceClassification", {"classifier_dropout": 0.3},
     r"bert classifier_dropout=0\.3 is not supported by tformer \(supported: 0\.1\)"),
    ("BertModel", {"hidden_act": "gelu_fast"}, r"bert hidden_act='gelu_fast' is not supported"),
    ("RobertaModel", {"architectures": ["RobertaForCausalLM"]}, r"roberta architectures='RobertaForCausalLM'"),
    ("RobertaForMaskedLM", {"hidden_act": "relu"},
     r"roberta hidden_act='relu' with a masked-LM head is not supported"),
])
def test_features_tformer_lacks_are_refused_in_one_line(tmp_path, class_name, changes, message):
    hf_model(class_name, tmp_path)
    write_config(tmp_path, **changes)
    with pytest.raises(CheckpointError, match=r"config\.json: " + message) as error:
        tformer.load(tmp_path)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("overrides, reason", [
    ({"norm_position": "pre"}, "as bert: norm_position='pre' (needs 'post')"),
    ({"type_vocab_size": 0}, "as bert: type_vocab_size=0 (needs >= 1: bert has segment embeddings)"),
    ({"positional": "rope"}, "as bert: positional='rope' (needs 'learned')"),
    ({"head": "pretraining", "pad_token_id": 1, "position_offset": 2},
     "as roberta: head='pretraining' (needs None or 'masked_lm' or"),
    ({"head": "sequence_classification", "pooling": "mean"}, "as bert: pooling='mean'"),
])
def test_encoders_without_a_hugging_face_equivalent_are_refused(tmp_path, overrides, reason):
    model = build_model("bert-tiny", vocab_size=VOCAB, max_seq_len=40, **overrides)
    with pytest.raises(CheckpointError, match="no Hugging Face equivalent") as error:
        model.save(tmp_path / "out", format="hf")
    assert reason in str(error.value) and "as gpt2" not in str(error.value)
    assert not (tmp_path / "out").exists()


def test_bert_base_shape_matches_hf():
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        reference = transformers.BertModel(BertConfig())
    assert sum(p.numel() for p in reference.parameters()) == 109_482_240
    family = tformer.interop.family_for_model_type("bert")
    assert family.config_from_hf(json.loads(reference.config.to_json_string())) == tformer.PRESETS["bert-base"]


@dataclass(frozen=True)
class _SwitchedConfig(tformer.ModelConfig):
    """ModelConfig with a switch the encoder families have not heard of (as a future field would be)."""

    new_switch: bool = False


def test_an_unknown_switch_is_refused_by_both_encoder_families():
    config = _SwitchedConfig(**{**tformer.PRESETS["bert-tiny"].to_dict(), "new_switch": True})
    for model_type in ("bert", "roberta"):
        reasons = tformer.interop.family_for_model_type(model_type).mismatches(config)
        assert f"new_switch=True (needs False: not a {model_type} setting)" in reasons
    assert tformer.interop.family_for_model_type("bert").mismatches(tformer.PRESETS["bert-tiny"]) == []


def test_convert_and_info_commands_handle_an_encoder(tmp_path, capsys):
    from tformer.cli import main as cli_main

    reference = hf_model("RobertaForTokenClassification", tmp_path / "hf")
    assert cli_main(["convert", str(tmp_path / "hf"), str(tmp_path / "native"), "--to", "tformer"]) == 0
    assert cli_main(["convert", str(tmp_path / "native"), str(tmp_path / "back"), "--to", "hf"]) == 0
    assert cli_main(["info", str(tmp_path / "native")]) == 0
    assert "EncoderModel (encoder)" in capsys.readouterr().out
    native = tformer.load(tmp_path / "native")
    assert max_difference("RobertaForTokenClassification", native, reference, padded_batch(1)) < TOLERANCE
    assert max_difference("RobertaForTokenClassification", native, hf_from_folder(tmp_path / "back"),
                          padded_batch(1)) < TOLERANCE


def test_a_bert_folder_with_only_vocab_txt_attaches_its_tokenizer(tmp_path):
    """A Hugging Face BERT folder whose vocabulary is a vocab.txt (+ tokenizer_config.json, as older
    hub folders have it) loads with a tokenizer that gives the ids BertTokenizerFast gives."""
    from shared_data import BERT_DIR, require

    require(BERT_DIR / "vocab.txt")
    (tmp_path / "vocab.txt").write_bytes((BERT_DIR / "vocab.txt").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    hf_model("BertModel", tmp_path, vocab_size=hf_tokenizer.vocab_size)
    model = tformer.load(tmp_path)
    text, pair = "Héllo, World! Tokenizers split unaffable words.", "A second segment."
    assert model.tokenizer is not None
    assert model.tokenizer.encode(text, pair) == hf_tokenizer(text, pair)["input_ids"]
