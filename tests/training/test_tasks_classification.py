"""The sequence-classification task (rows, truncation counts, metrics from a summed confusion
matrix, refusals) and the two commands that read a trained run: ``tformer evaluate`` and
``tformer predict``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tformer
from tformer.cli import main
from tformer.data.classification import read_classification
from tformer.evaluation.classification import classification_scores, confusion_matrix
from tformer.tokenizers import WordPieceTokenizer
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.recipe import recipe_from_dict
from tformer.training.run import train_recipe
from tformer.training.tasks.classification import SequenceClassification

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "good", "bad", "fine", "film", "."]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
LABELS = ("bad", "fine", "good")


def write_data(folder: Path, rows: int = 24, seed: int = 0, name: str = "train.tsv") -> Path:
    generator = torch.Generator().manual_seed(seed)
    lines = ["sentence\tlabel"]
    for _ in range(rows):
        label = LABELS[int(torch.randint(3, (1,), generator=generator))]
        length = int(torch.randint(2, 12, (1,), generator=generator))
        words = [WORDS[index] for index in torch.randint(8, (length,), generator=generator).tolist()]
        lines.append(" ".join([*words, label, "film"]) + f"\t{label}")
    path = folder / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return path


def prepared(task, batch_size=4, rank=0, world_size=1, num_labels=3):
    model = tformer.build_model("bert-tiny", head="sequence_classification", vocab_size=len(VOCAB),
                                max_seq_len=32, num_labels=num_labels).eval()
    task.prepare(TrainingConfig(batch_size=batch_size, seq_len=task.seq_len), ProcessContext(rank, world_size), model)
    return task, model


def test_rows_hold_the_tokens_and_truncation_is_counted(tmp_path):
    data = read_classification(write_data(tmp_path))
    tokenizer = WordPieceTokenizer(VOCAB)
    task = SequenceClassification(data, data, tokenizer, seq_len=8)
    lengths = [len(tokenizer.encode(example.text)) for example in data.examples]
    assert task.train_truncated == sum(length > 8 for length in lengths) > 0
    rows = task.train_rows
    assert rows.lengths.tolist() == [min(length, 8) for length in lengths]
    for row, (example, length) in enumerate(zip(data.examples, lengths, strict=True)):
        ids = rows.fields["input_ids"][row, : min(length, 8)].tolist()
        whole = tokenizer.encode(example.text)
        assert ids == (whole if length <= 8 else whole[:7] + [tokenizer.sep_token_id])
    assert rows.fields["labels"].tolist() == data.label_ids()
    assert f"{task.train_truncated} truncated to 8 tokens" in task.describe(data, data)


def evaluate(task, model) -> dict:
    totals: dict = {}
    with torch.no_grad():
        for batch in task.eval_batches():
            for name, value in task.eval_sums(model, batch).items():
                totals[name] = totals.get(name, 0.0) + float(value)
    return totals


def test_metrics_equal_the_confusion_matrix_of_the_predictions(tmp_path):
    data = read_classification(write_data(tmp_path, rows=30))
    task, model = prepared(SequenceClassification(data, data, WordPieceTokenizer(VOCAB), seq_len=32), batch_size=4)
    metrics = task.finalise(evaluate(task, model))
    rows = task.eval_rows.fields
    with torch.no_grad():
        logits = model(rows["input_ids"], attention_mask=rows["attention_mask"]).logits
    predictions = logits.argmax(-1)
    expected = classification_scores(confusion_matrix(rows["labels"], predictions, 3), LABELS)
    assert metrics["eval_accuracy"] == pytest.approx(expected.accuracy)
    assert metrics["eval_f1"] == pytest.approx(expected.macro_f1)
    assert metrics["eval_loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, rows["labels"]).item(),
                                                 rel=1e-5)
    assert task.confusion.tolist() == expected.matrix.tolist()


def test_two_processes_sum_to_the_same_metrics(tmp_path):
    data = read_classification(write_data(tmp_path, rows=13))
    task, model = prepared(SequenceClassification(data, data, WordPieceTokenizer(VOCAB), seq_len=32), batch_size=3)
    single = task.finalise(evaluate(task, model))
    totals: dict = {}
    for rank in range(2):
        shard, _ = prepared(SequenceClassification(data, data, WordPieceTokenizer(VOCAB), seq_len=32), batch_size=3,
                            rank=rank, world_size=2)
        for name, value in evaluate(shard, model).items():
            totals[name] = totals.get(name, 0.0) + value
    assert task.finalise(totals) == pytest.approx(single)


def test_the_task_refuses_a_model_that_does_not_fit_the_data(tmp_path):
    data = read_classification(write_data(tmp_path))
    with pytest.raises(TrainingError, match=r"the data has 3 labels \(bad, fine, good\) but the model.s num_labels"):
        prepared(SequenceClassification(data, None, WordPieceTokenizer(VOCAB), seq_len=32), num_labels=2)


def recipe(folder: Path, **data) -> dict:
    return {"model": {"preset": "bert-tiny", "head": "sequence_classification", "max_seq_len": 32},
            "data": {"train": "train.tsv", "eval": "dev.tsv", "tokenizer": "vocab.txt", **data},
            "task": {"name": "classification"},
            "training": {"max_steps": 4, "batch_size": 4, "seq_len": 32, "eval_every": 4, "threads": 1,
                         "eval_batches": 0, "lr": 3e-3}}


def test_bad_rows_stop_the_run_or_are_counted_with_skip_bad(tmp_path):
    write_data(tmp_path)
    dev = write_data(tmp_path, rows=6, seed=1, name="dev.tsv")
    dev.write_text(dev.read_text() + "a fine film\tgreat\nno label here\n", encoding="utf-8")
    with pytest.raises(TrainingError, match=r"dev.tsv:8: label .great. is not one of the labels of the training file "
                                            r".*train.tsv: "):
        train_recipe(recipe_from_dict(recipe(tmp_path), base_dir=tmp_path), tmp_path / "run", progress=False,
                     echo=lambda text: None)
    assert not (tmp_path / "run").exists()  # nothing written
    lines: list[str] = []
    train_recipe(recipe_from_dict(recipe(tmp_path, skip_bad=True), base_dir=tmp_path), tmp_path / "run",
                 progress=False, echo=lines.append)
    assert "evaluation dev.tsv: 6 examples (2 bad records skipped" in lines[0]


def test_evaluate_and_predict_read_a_trained_run(tmp_path, capsys):
    write_data(tmp_path)
    write_data(tmp_path, rows=9, seed=1, name="dev.tsv")
    train_recipe(recipe_from_dict(recipe(tmp_path), base_dir=tmp_path), tmp_path / "run", progress=False,
                 echo=lambda text: None)
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(tmp_path / "dev.tsv")]) == 0
    printed = capsys.readouterr().out
    record = json.loads((tmp_path / "run" / "evaluation" / "dev.json").read_text())
    assert f"eval_accuracy      {record['eval_accuracy']:.4f}" in printed
    assert (tmp_path / "run" / "evaluation" / "dev-confusion.png").read_bytes()[:4] == b"\x89PNG"
    model = tformer.load(tmp_path / "run")
    encoded = model.tokenizer.encode_batch(["a good film"], return_tensors="pt")
    with torch.no_grad():
        probabilities = torch.softmax(model(**encoded).logits[0], -1)
    assert main(["predict", str(tmp_path / "run"), "--text", "a good film", "--json", "--top-k", "3"]) == 0
    labels = json.loads(capsys.readouterr().out)["labels"]
    assert [label["label"] for label in labels] == [LABELS[i] for i in probabilities.argsort(descending=True)]
    assert labels[0]["probability"] == pytest.approx(probabilities.max().item(), abs=1e-4)
    assert main(["predict", str(tmp_path / "run"), "--question", "why?", "--context", "because"]) == 2
    assert "--question/--context are for a question-answering model" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path), "--data", str(tmp_path / "dev.tsv")]) == 2
    assert "no recipe.toml in it" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(tmp_path / "dev.tsv"), "--beam", "4"]) == 2
    assert ("--beam: a classification run does not decode its evaluation data; --beam goes with --source, or "
            "with --data for a translation, speech recognition or text-to-text run") in capsys.readouterr().err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "dev.json").write_text('{"my": "notes"}')
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(tmp_path / "dev.tsv"), "--out",
                 str(tmp_path / "mine")]) == 2
    assert "is not an evaluation tformer wrote" in capsys.readouterr().err
    assert (tmp_path / "mine" / "dev.json").read_text() == '{"my": "notes"}'
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(tmp_path / "dev.tsv")]) == 0  # its own: replaced
