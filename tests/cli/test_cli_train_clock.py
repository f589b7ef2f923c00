"""``tformer train`` with a recipe sized by the clock (training.max_steps = 0 with max_minutes): what it says
before and after, that a resumed run which spent its budget says so rather than naming max_steps, and the
refusals as one line. The budget is a few hundredths of a second, so the run is one step or a few on any host."""

import json

import pytest

from tformer.cli import main

RECIPE = """
[model]
max_seq_len = 16
d_model = 16
num_layers = 1
num_heads = 2

[data]
train = "text.txt"

[training]
max_steps = 0
max_minutes = 0.001
batch_size = 2
seq_len = 16
warmup_steps = 0
eval_every = 1000
eval_batches = 1
threads = 1
"""
TEXT = "the quick brown fox jumps over a lazy dog while rain falls on distant hills " * 40


@pytest.fixture
def recipe(tmp_path):
    (tmp_path / "text.txt").write_text(TEXT)
    path = tmp_path / "clock.toml"
    path.write_text(RECIPE)
    return path


def test_a_clock_sized_run_says_so_ends_evaluated_and_a_spent_budget_is_named_on_resume(recipe, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", str(recipe), "--out", str(out), "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert "training   as many steps as 0.001 minutes hold (sized by the clock), of 32 tokens" in said
    assert "stopping: training.max_minutes=0.001 spent" in said and ": the end of the schedule" in said
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = records[-1]["step"]
    assert f"completed at step {steps}:" in said
    assert "eval_loss" in records[-1] and records[-1]["budget_fraction"] >= 1.0  # evaluated where the budget ended
    assert main(["train", str(recipe), "--out", str(out), "--no-progress", "--resume", "auto"]) == 0
    assert (f"nothing to train: the run at step {steps} has spent training.max_minutes=0.001 (raise it with --set "
            "training.max_minutes=M)") in capsys.readouterr().out


@pytest.mark.parametrize("setting, message", [
    ("training.max_minutes=0", "[training] max_steps=0 sizes the run by the clock and needs training.max_minutes > 0"),
    ("training.schedule=inverse_sqrt", "[training] schedule='inverse_sqrt' has no end to fit to training.max_minutes"),
    ("training.deterministic=true", "[training] deterministic=true promises a run that repeats exactly"),
])
def test_what_cannot_follow_the_clock_is_one_line_with_status_2(recipe, tmp_path, capsys, setting, message):
    out = tmp_path / "refused"
    assert main(["train", str(recipe), "--out", str(out), "--no-progress", "--set", setting]) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1 and "Traceback" not in error
    assert not out.exists()
