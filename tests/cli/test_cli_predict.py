"""``tformer predict`` on each head it reads: entities, answers and [MASK] fills equal what the
library's own functions give on the same model (classification: tests/training/test_tasks_classification.py)."""

from __future__ import annotations

import json

import pytest
import torch

import tformer
from tformer.cli import main
from tformer.tokenizers import WordPieceTokenizer
from tformer.training.tasks.span_qa import best_answer, question_windows
from tformer.training.tasks.token_classification import predict_entities

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "who", "sat", "on", "the", "mat", "cat", "a", "dog", "paris",
         "is", "in", "france", "?", "."]


def saved(tmp_path, head: str, **fields):
    torch.manual_seed(0)
    model = tformer.build_model("bert-tiny", head=head, vocab_size=len(VOCAB), max_seq_len=64, **fields).eval()
    model.tokenizer = WordPieceTokenizer(VOCAB)
    model.save(tmp_path / head)
    return tformer.load(tmp_path / head), str(tmp_path / head)


def predicted(capsys, *arguments: str) -> dict:
    capsys.readouterr()
    assert main(["predict", *arguments, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_entities_are_the_library_s(tmp_path, capsys):
    model, folder = saved(tmp_path, "token_classification", num_labels=5,
                          label_names=("O", "B-LOC", "I-LOC", "B-PER", "I-PER"))
    text = "the cat sat on the mat in paris . a dog is in france"
    result = predicted(capsys, folder, "--text", text)
    expected = predict_entities(model, model.tokenizer, text)
    assert [(e["type"], e["start"], e["end"], e["text"]) for e in result["entities"]] == \
        [entity[:4] for entity in expected]
    assert all(text[e["start"]:e["end"]] == e["text"] for e in result["entities"])


def test_the_answer_is_the_best_span_of_the_windows(tmp_path, capsys):
    model, folder = saved(tmp_path, "question_answering")
    question, context = "who sat on the mat ?", " ".join(["the cat sat on the mat ."] * 12)
    result = predicted(capsys, folder, "--question", question, "--context", context)
    windows = question_windows(model.tokenizer, [question], [context], seq_len=64, doc_stride=64 // 3, padding=True)
    assert len(windows["input_ids"]) > 1  # the context needs several windows at the model's 64 positions
    inputs = {name: torch.tensor(windows[name]) for name in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        output = model(**inputs)
    answer = best_answer(output.start_logits, output.end_logits, windows.encodings, context)
    assert (result["answer"], result["start"], result["end"]) == (answer.text, answer.start_char, answer.end_char)
    assert result["answer"] == context[result["start"]:result["end"]] and result["answer"]
    assert result["score"] == pytest.approx(answer.score, abs=1e-3)


def test_mask_fills_are_the_likeliest_tokens(tmp_path, capsys):
    model, folder = saved(tmp_path, "masked_lm")
    result = predicted(capsys, folder, "--text", "the cat [MASK] on the [MASK] .", "--top-k", "2")
    encoded = model.tokenizer.encode_batch(["the cat [MASK] on the [MASK] ."], return_tensors="pt")
    with torch.no_grad():
        logits = model(**encoded).logits[0]
    positions = (encoded["input_ids"][0] == 4).nonzero().flatten()
    best = [[model.tokenizer.id_to_token(i) for i in row] for row in logits[positions].topk(2).indices.tolist()]
    assert [[fill["token"] for fill in mask] for mask in result["masks"]] == best


@pytest.mark.parametrize(("head", "arguments", "message"), [
    ("masked_lm", ["--text", "no mask here"], "holds no [MASK] token to fill"),
    ("question_answering", ["--text", "hello"], "takes --question and --context"),
    ("token_classification", ["--text", "a", "--pair", "b"], "--pair is for sequence classification"),
])
def test_misused_options_are_one_line_errors(tmp_path, capsys, head, arguments, message):
    fields = {"num_labels": 3, "label_names": ("O", "B-X", "I-X")} if head == "token_classification" else {}
    _, folder = saved(tmp_path, head, **fields)
    assert main(["predict", folder, *arguments]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1
