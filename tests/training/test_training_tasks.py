"""The Trainer runs any Task: a toy classification task (is a sequence sorted?) trains with its
own metrics (eval_accuracy, examples/s), stops early and keeps its best model on a higher-is-better
metric, resumes bitwise after SIGKILL, and runs under 2 processes as 1 with twice the batch;
recipes name their task."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from python_path import child_python_path
from safetensors.torch import load_file
from sorted_task import SortedClassifier, SortedOrNot, config

from tformer.training.config import TrainingError
from tformer.training.recipe import RecipeError, recipe_from_dict
from tformer.training.tasks import TASKS, LanguageModelling
from tformer.training.trainer import Trainer

SCRIPT = str(Path(__file__).parents[1] / "sorted_task.py")


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_classification_task_reports_its_metrics_and_stops_early_on_accuracy(tmp_path):
    torch.manual_seed(0)
    result = Trainer(SortedClassifier(), config(max_steps=200, early_stopping_patience=3), SortedOrNot(),
                     out_dir=tmp_path, progress=False).train()
    logged = records(tmp_path)
    assert {"examples_per_s", "train_loss", "lr"} <= set(logged[0]) and "tokens_per_s" not in logged[0]
    assert result.unit == "examples" and result.throughput > 0
    evaluated = [r for r in logged if "eval_accuracy" in r]
    assert [r["step"] for r in evaluated] == list(range(4, result.steps + 1, 4))
    accuracies = [r["eval_accuracy"] for r in evaluated]
    assert all(0 <= a <= 1 for a in accuracies) and max(accuracies) > accuracies[0] + 0.1  # it learns
    # Higher is better: the best is the highest accuracy (first reached), and 3 evaluations
    # without a higher one stop the run.
    assert result.stopped == "early_stopping"
    assert result.best_eval == max(accuracies)
    assert result.best_step == evaluated[accuracies.index(max(accuracies))]["step"]
    assert result.steps == result.best_step + 3 * 4
    best = json.loads((tmp_path / "checkpoints" / "best" / "best.json").read_text())
    assert best == {"step": result.best_step, "eval_accuracy": result.best_eval}


def test_the_default_loss_smooths_labels_while_training_only():
    torch.manual_seed(0)
    task = SortedOrNot()
    trainer = Trainer(SortedClassifier(dropout=0.0), config(label_smoothing=0.2), task, progress=False)
    batch = task.train_batch(0)
    with torch.no_grad():
        smoothed = F.cross_entropy(trainer.model(batch["input_ids"]).logits, batch["labels"], label_smoothing=0.2)
        whole = F.cross_entropy(trainer.model(task.eval_ids).logits, task.eval_labels)
    assert trainer.evaluate() == pytest.approx(whole.item(), rel=1e-6)  # plain cross-entropy, every example
    assert trainer.train_step().loss == pytest.approx(smoothed.item(), rel=1e-6)


def test_an_early_stopping_metric_the_task_does_not_report_is_refused():
    with pytest.raises(TrainingError, match=r"^training.early_stopping_metric='eval_ppl' is not reported by the "
                                            r"sorted task; it reports eval_loss, eval_accuracy$"):
        Trainer(SortedClassifier(), config(early_stopping_metric="eval_ppl"), SortedOrNot(), progress=False)
    import tformer

    model = tformer.build_model("gpt-nano", vocab_size=8, max_seq_len=16)
    with pytest.raises(TrainingError, match="it reports eval_loss, eval_ppl, eval_accuracy$"):
        Trainer(model, config(early_stopping_metric="eval_f1", seq_len=8),
                LanguageModelling(torch.arange(8).repeat(10)), progress=False)
    with pytest.raises(TrainingError, match="must name an evaluation metric"):
        config(early_stopping_metric="accuracy")


def test_recipes_name_their_task(tmp_path):
    (tmp_path / "text.txt").write_text("hello world, " * 50)
    raw = {"model": {"preset": "gpt-nano"}, "data": {"train": "text.txt"}, "training": {"max_steps": 2}}
    assert recipe_from_dict(raw, base_dir=tmp_path).task.name == "lm"  # the default
    raw["task"] = {"name": "lm"}
    recipe = recipe_from_dict(raw, base_dir=tmp_path)
    assert '[task]\nname = "lm"' in recipe.to_toml()
    raw["task"] = {"name": "token_classification"}
    assert recipe_from_dict(raw, base_dir=tmp_path).task.name == "token_classification"
    raw["task"] = {"name": "classify"}
    with pytest.raises(RecipeError, match=rf"\[task\] name='classify' is not one of {', '.join(TASKS)}$"):
        recipe_from_dict(raw, base_dir=tmp_path)


def environment():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": child_python_path()}


def train(out, *extra, processes=1):
    launcher = [sys.executable]
    if processes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    return subprocess.run([*launcher, SCRIPT, str(out), *extra], capture_output=True, text=True, timeout=300,
                          env=environment())


def without_throughput(run):
    return [{k: v for k, v in r.items() if k != "examples_per_s"} for r in records(run)]


@pytest.mark.slow
def test_a_task_run_killed_mid_step_resumes_bitwise(tmp_path):
    reference = train(tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr
    run = tmp_path / "run"
    killed = train(run, "--kill-at-position", "9")  # step 10, after the checkpoint of step 8
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = train(run, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[0]) == {"resumed_from": 8}
    expected, actual = load_file(str(tmp_path / "reference" / "model.safetensors")), load_file(
        str(run / "model.safetensors"))
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)
    assert without_throughput(run) == without_throughput(tmp_path / "reference")


@pytest.mark.slow
def test_a_task_under_two_processes_matches_one_with_twice_the_batch(tmp_path):
    single = train(tmp_path / "single", "--batch-size", "8", "--dropout", "0")
    assert single.returncode == 0, single.stderr
    ddp = train(tmp_path / "ddp", "--batch-size", "4", "--dropout", "0", processes=2)
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    one, two = without_throughput(tmp_path / "single"), without_throughput(tmp_path / "ddp")
    assert [r.keys() for r in one] == [r.keys() for r in two] and "eval_accuracy" in one[3]
    for a, b in zip(one, two, strict=True):
        for name in ("train_loss", "eval_loss", "eval_accuracy"):
            if name in a:
                assert abs(a[name] - b[name]) <= 1e-5, (a["step"], name, a[name], b[name])
