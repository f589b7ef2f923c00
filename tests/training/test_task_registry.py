"""Tasks declare themselves: a new task is its own class (settings, data it reads, metrics and their
direction) and one entry in TASKS; recipes, the Trainer and `tformer evaluate` then serve it unchanged."""

import json
from dataclasses import dataclass

import pytest

from tformer.cli import main
from tformer.data.classification import ClassificationData, ClassificationExample
from tformer.data.sources import DataConfig
from tformer.training.config import TrainingError
from tformer.training.recipe import RecipeError, load_recipe, recipe_from_dict
from tformer.training.run import train_recipe
from tformer.training.tasks import TASKS, TaskConfig
from tformer.training.tasks.classification import SequenceClassification
from tformer.training.tasks.examples import data_tokenizer
from tformer.training.tasks.registry import check_data_options

LABELS = ("sorted", "unsorted")


@dataclass(frozen=True)
class SortednessOptions:
    min_letters: int = 2  # shorter words are left out

    def __post_init__(self) -> None:
        if self.min_letters < 1:
            raise TrainingError(f"task.min_letters={self.min_letters} must be a positive integer")


class Sortedness(SequenceClassification):
    """Are a word's letters in alphabetical order? Read from a plain text file, one word a line."""

    name = "sortedness"
    Options = SortednessOptions
    data_formats = ("text",)
    data_settings = frozenset({"tokenizer"})
    metrics = ("eval_loss", "eval_accuracy", "eval_f1", "eval_error")
    higher_is_better = frozenset({"eval_accuracy", "eval_f1"})  # eval_error improves downwards
    metric_places = {"eval_error": 1}

    @classmethod
    def from_recipe(cls, data, *, seq_len, tokenizer=None, label_names=None, min_letters=2):
        def read(path):
            words = [line.strip() for line in open(path, encoding="utf-8") if len(line.strip()) >= min_letters]
            examples = [ClassificationExample(word, None, LABELS[list(word) != sorted(word)], number)
                        for number, word in enumerate(words, 1)]
            return ClassificationData(path, examples, LABELS)
        tokenizer = data_tokenizer(data, cls.name, tokenizer)
        task = cls(read(data.train), read(data.eval), tokenizer, seq_len=seq_len or 16)
        return task, task_data(task, tokenizer)

    def finalise(self, totals):
        metrics = super().finalise(totals)
        return {**metrics, "eval_error": 100 * (1 - metrics["eval_accuracy"])}


def task_data(task, tokenizer):
    from tformer.training.tasks.base import TaskData
    return TaskData(tokenizer, tokenizer.vocab_size, "words", task.label_names)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(TASKS, Sortedness.name, Sortedness)


def words(folder, name, count, seed):
    import random
    generator = random.Random(seed)
    lines = []
    for _ in range(count):
        letters = generator.sample("abcdefghij", generator.randint(1, 6))
        lines.append("".join(sorted(letters) if generator.random() < 0.5 else letters))
    path = folder / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def vocabulary(folder):
    letters = "abcdefghij"
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *(f"##{letter}" for letter in letters)]
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")


def recipe(**task) -> dict:
    return {"model": {"preset": "bert-tiny", "head": "sequence_classification", "max_seq_len": 16},
            "data": {"train": "train.txt", "eval": "dev.txt", "tokenizer": "vocab.txt"},
            "task": {"name": "sortedness", **task},
            "training": {"max_steps": 40, "batch_size": 8, "seq_len": 16, "eval_every": 5, "threads": 1,
                         "eval_batches": 0, "lr": 3e-3, "early_stopping_metric": "eval_error"}}


def test_a_new_task_is_its_class_and_one_registry_entry(registered, tmp_path, capsys):
    words(tmp_path, "train.txt", 64, 0)
    words(tmp_path, "dev.txt", 24, 1)
    vocabulary(tmp_path)
    lines: list[str] = []
    result = train_recipe(recipe_from_dict(recipe(min_letters=3), base_dir=tmp_path), tmp_path / "run",
                          progress=False, echo=lines.append)
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evaluated = [record for record in logged if "eval_error" in record]
    errors = [record["eval_error"] for record in evaluated]
    # eval_error is declared lower-is-better: the best is the lowest, not the highest
    assert len(set(errors)) > 1 and result.best_eval == min(errors)
    # its declared places: one decimal in the log line
    assert f"  error {errors[0]:.1f}\n" in capsys.readouterr().out
    # the run's resolved recipe carries the task's own setting and reads back
    written = (tmp_path / "run" / "recipe.toml").read_text()
    assert "min_letters = 3" in written and "doc_stride" not in written
    assert load_recipe(tmp_path / "run" / "recipe.toml").task == TaskConfig("sortedness", min_letters=3)
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(tmp_path / "dev.txt")]) == 0
    record = json.loads((tmp_path / "run" / "evaluation" / "dev.json").read_text())
    assert record["task"] == "sortedness" and record["eval_error"] == pytest.approx(100 * (1 - record["eval_accuracy"]))


def test_settings_belong_to_the_task_that_declares_them(registered, tmp_path):
    assert TaskConfig("sortedness", min_letters=4).min_letters == 4
    with pytest.raises(TrainingError, match=r"^task.min_letters=0 must be a positive integer$"):
        TaskConfig("sortedness", min_letters=0)
    with pytest.raises(TrainingError, match=r"^task.min_letters is a setting of the sortedness task, not 'lm'$"):
        TaskConfig("lm", min_letters=4)
    with pytest.raises(TrainingError, match=r"^task.doc_stride is a setting of the span_qa task, not 'sortedness'$"):
        TaskConfig("sortedness", doc_stride=64)
    # another task's setting at its default is what an earlier version's recipe.toml lists: accepted
    assert TaskConfig("sortedness", doc_stride=128) == TaskConfig("sortedness")
    with pytest.raises(AttributeError, match="the sortedness task has no setting 'doc_stride'"):
        _ = TaskConfig("sortedness").doc_stride
    with pytest.raises(RecipeError, match=r"\[task\] unknown key 'min_leters' \(did you mean 'min_letters'\?\)"):
        recipe_from_dict(recipe(min_leters=3), base_dir=tmp_path)
    with pytest.raises(RecipeError, match=r"\[task\] min_letters='3' must be an integer"):
        recipe_from_dict(recipe(min_letters="3"), base_dir=tmp_path)
    # the data it reads: its declared format, not another task's
    check_data_options("sortedness", DataConfig(train="x", format="text"))
    with pytest.raises(TrainingError, match=r"data.format='conll' is not read by the sortedness task; it reads auto, "
                                            r"text, jsonl"):
        check_data_options("sortedness", DataConfig(train="x", format="conll"))
    with pytest.raises(TrainingError, match=r"data.skip_bad is not read by the sortedness task \(it is a setting of "
                                            r"classification, token_classification, span_qa, speech_recognition, "
                                            r"sft\)"):
        check_data_options("sortedness", DataConfig(train="x", skip_bad=True))
