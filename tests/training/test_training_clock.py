"""Runs sized by the clock (training.max_steps = 0 with max_minutes): the schedule decays over the time budget
and reaches min_lr as it ends, resumes continue it, the run ends with an evaluation, and what cannot follow the
clock is refused by name. Time is a fake clock handed to the Trainer, moved on by a fixed amount per step, so
nothing here depends on this machine's speed."""

import json
import math
import random

import pytest
import torch

import tformer
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.reporting import Reporter
from tformer.training.schedules import clock_learning_rate
from tformer.training.signals import TrainingInterrupted
from tformer.training.tasks import LanguageModelling
from tformer.training.trainer import Trainer

RANDOM = random.Random(0)
TOKENS = torch.tensor([RANDOM.randrange(16) for _ in range(3000)])
LR, MIN_LR = 3e-3, 1e-4


class FakeClock:
    """Seconds that pass only when a step runs (see ClockedTrainer)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class ClockedTrainer(Trainer):
    """A Trainer on a fake clock whose every step takes ``step_seconds`` and every evaluation ``eval_seconds``;
    ``stop_at``: the step (1-based) after which it stops as Ctrl-C stops a run (a checkpoint, then
    TrainingInterrupted)."""

    def __init__(self, *args, step_seconds: float, eval_seconds: float = 0.0, stop_at: int | None = None,
                 start: float = 0.0, **options):
        self.fake_clock, self.stop_at = FakeClock(start), stop_at
        self.step_seconds, self.eval_seconds = step_seconds, eval_seconds
        super().__init__(*args, clock=self.fake_clock, **options)

    def train_step(self, stop_requested: bool = False):
        self.fake_clock.now += self.step_seconds
        return super().train_step(stop_requested=stop_requested or self.step + 1 == self.stop_at)

    def evaluate_metrics(self, progress: bool = False):
        self.fake_clock.now += self.eval_seconds
        return super().evaluate_metrics(progress)


def config(**overrides) -> TrainingConfig:
    settings = dict(max_steps=0, max_minutes=1.0, batch_size=4, seq_len=16, lr=LR, min_lr=MIN_LR, warmup_steps=3,
                    eval_every=25, eval_batches=2, log_every=1, threads=1, device="cpu")
    settings.update(overrides)
    return TrainingConfig(**settings)


def trainer(out_dir=None, step_seconds=1.0, **overrides) -> ClockedTrainer:
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=16, max_seq_len=16)
    options = {name: overrides.pop(name) for name in ("stop_at", "start", "eval_seconds") if name in overrides}
    return ClockedTrainer(model, config(**overrides), LanguageModelling(TOKENS, TOKENS[:500]), out_dir=out_dir,
                          progress=False, step_seconds=step_seconds, **options)


def metrics(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def cosine(fraction: float) -> float:
    return MIN_LR + 0.5 * (1 + math.cos(math.pi * fraction)) * (LR - MIN_LR)


def test_the_rate_decays_over_the_budget_to_min_lr_and_the_run_ends_with_an_evaluation(tmp_path):
    result = trainer(tmp_path).train()  # 60 s of budget, 1 s a step
    assert result.stopped == "completed" and result.steps == 60  # step 60 ends as the budget does
    records = metrics(tmp_path)
    assert [record["step"] for record in records] == list(range(1, 61))
    # Step k starts with (k - 1) of 60 seconds spent: the warmup ramps over steps 1-3 below the decay, which then
    # follows the share of the budget spent.
    expected = [min(LR * k / 3, cosine((k - 1) / 60)) for k in range(1, 61)]
    assert [record["lr"] for record in records] == pytest.approx(expected, rel=1e-12)
    assert records[0]["lr"] == pytest.approx(LR / 3) and records[3]["lr"] == pytest.approx(cosine(3 / 60))
    assert records[-1]["lr"] - MIN_LR < 0.001 * (LR - MIN_LR)  # the last step runs at min_lr (within a step)
    assert [record["budget_fraction"] for record in records] == pytest.approx([k / 60 for k in range(1, 61)])
    # eval_every still counts steps; the step that spends the budget evaluates and is saved
    assert [record["step"] for record in records if "eval_loss" in record] == [25, 50, 60]
    assert (tmp_path / "checkpoints" / "step-00000060" / "trainer_state.json").is_file()
    assert tformer.load(tmp_path).config.num_layers == 2


def test_evaluations_spend_the_budget_too():
    result = trainer(eval_seconds=2.0).train()  # the evaluations after steps 25 and 50 take 2 s each
    # Step k starts with k - 1 seconds of steps spent, and 2 s more for each evaluation before it; step 56 ends
    # at 60 s.
    spent = [k - 1 + 2 * (k > 25) + 2 * (k > 50) for k in range(1, 57)]
    assert result.steps == 56 and [r["step"] for r in result.history if "eval_loss" in r] == [25, 50, 56]
    lrs = [record["lr"] for record in result.history]
    expected = [min(LR * k / 3, cosine(seconds / 60)) for k, seconds in enumerate(spent, 1)]
    assert lrs == pytest.approx(expected, rel=1e-12)


def test_a_slower_host_fits_fewer_steps_into_the_same_schedule():
    fast, slow = trainer(step_seconds=1.0).train(), trainer(step_seconds=2.5).train()
    assert (fast.steps, slow.steps) == (60, 24)
    lrs = [record["lr"] for record in slow.history]
    assert lrs == pytest.approx([min(LR * k / 3, cosine(2.5 * (k - 1) / 60)) for k in range(1, 25)], rel=1e-12)
    assert lrs[-1] - MIN_LR < 0.01 * (LR - MIN_LR)


def test_linear_and_constant_schedules_follow_the_clock():
    linear = trainer(schedule="linear", warmup_steps=0).train()
    assert [r["lr"] for r in linear.history] == pytest.approx([LR + (k / 60) * (MIN_LR - LR) for k in range(60)])
    constant = trainer(schedule="constant", warmup_steps=0, max_minutes=0.25).train()
    assert constant.steps == 15 and {r["lr"] for r in constant.history} == {LR}


def test_a_resumed_run_continues_the_schedule_where_it_stopped(tmp_path):
    whole = trainer(tmp_path / "whole", checkpoint_every=20).train()
    with pytest.raises(TrainingInterrupted):
        trainer(tmp_path / "cut", checkpoint_every=20, stop_at=33).train()
    state = json.loads((tmp_path / "cut" / "checkpoints" / "step-00000033" / "trainer_state.json").read_text())
    assert state["elapsed_seconds"] == 33.0
    again = trainer(tmp_path / "cut", checkpoint_every=20, start=5000.0)  # another process: its clock reads other
    assert again.resume("auto") == 33                                      # numbers; only the time spent counts
    finished = again.train()
    assert finished.steps == whole.steps == 60 and finished.stopped == "completed"
    assert [r["lr"] for r in metrics(tmp_path / "cut")] == [r["lr"] for r in metrics(tmp_path / "whole")]
    for name, weight in tformer.load(tmp_path / "whole").state_dict().items():
        assert torch.equal(tformer.load(tmp_path / "cut").state_dict()[name], weight), name


def test_a_run_that_spent_its_budget_takes_no_step_and_a_longer_budget_stretches_the_decay(tmp_path):
    trainer(tmp_path, max_minutes=0.5).train()
    spent = trainer(tmp_path, max_minutes=0.5)
    spent.resume("auto")
    result = spent.train()
    assert result.steps == result.start_step == 30 and result.stopped == "completed"
    longer = trainer(tmp_path, max_minutes=1.0)
    longer.resume("auto")
    result = longer.train()
    assert result.steps == 60 and result.history[0]["lr"] == pytest.approx(cosine(30 / 60))


def test_settings_that_cannot_follow_the_clock_are_refused_by_name():
    with pytest.raises(TrainingError, match=r"training.max_steps=0 sizes the run by the clock and needs "
                                            r"training.max_minutes > 0"):
        TrainingConfig(max_steps=0)
    with pytest.raises(TrainingError, match=r"training.schedule='inverse_sqrt' has no end to fit to "
                                            r"training.max_minutes: .* takes cosine, linear, constant"):
        config(schedule="inverse_sqrt")
    with pytest.raises(TrainingError, match=r"training.deterministic=true promises a run that repeats exactly"):
        config(deterministic=True)
    with pytest.raises(TrainingError, match=r"training.max_steps=-1 must be an integer >= 0"):
        config(max_steps=-1)
    with pytest.raises(TrainingError, match=r"training.max_minutes=-1 must be a finite number >= 0"):
        config(max_minutes=-1)
    with pytest.raises(ValueError, match="schedule='inverse_sqrt' cannot follow the clock"):
        clock_learning_rate(0, 0.5, schedule="inverse_sqrt", lr=1.0, warmup_steps=0)


def test_the_progress_bar_counts_steps_without_an_end_and_shows_the_minutes_left(capsys):
    reporter = Reporter(None, None, 0, unit="examples")
    reporter.advance(1, 0.5, 1e-3, 100.0, minutes_left=12.34)
    assert reporter.bar.total is None
    reporter.close()
    shown = capsys.readouterr().err
    assert "left=12.3min" in shown, shown
