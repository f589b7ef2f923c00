"""The training engine in one process: accumulation, label smoothing, precision, NaN stop and
skip, early stopping, best / keep-last-k checkpoints, refusals before training, metrics, plot."""

import functools
import json
import os
import random
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tformer
from tformer.cli import main
from tformer.data.lm import random_crops, spaced_windows
from tformer.data.sources import DataConfig, encode_text, load_language_model_data
from tformer.tokenizers import CharTokenizer
from tformer.training import preflight
from tformer.training import trainer as trainer_module
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.optim import build_optimizer
from tformer.training.tasks import LanguageModelling
from tformer.training.tasks import lm as lm_task
from tformer.training.trainer import Trainer

RANDOM = random.Random(0)
TOKENS = torch.tensor([RANDOM.randrange(16) for _ in range(3000)])  # not constant: a model cannot predict it all


def tiny_model(**overrides):
    torch.manual_seed(0)
    return tformer.build_model("gpt-nano", vocab_size=16, max_seq_len=16, **overrides)


def config(**overrides):
    settings = dict(max_steps=6, batch_size=4, seq_len=16, lr=3e-3, warmup_steps=2, eval_every=3, eval_batches=2,
                    device="cpu")  # these tests compare with computations on the CPU, also on a machine with a GPU
    settings.update(overrides)
    return TrainingConfig(**settings)


def run(tmp_path=None, model=None, **overrides):
    trainer = Trainer(model or tiny_model(), config(**overrides), LanguageModelling(TOKENS, TOKENS[:500]),
                      out_dir=tmp_path, progress=False)
    return trainer, trainer.train()


def test_gradient_accumulation_equals_one_big_batch_of_the_same_crops():
    accumulated = Trainer(tiny_model(), config(batch_size=2, grad_accum_steps=2, grad_clip=0.0),
                          LanguageModelling(TOKENS), progress=False)
    accumulated.train_step()
    manual = tiny_model()
    optimizer = build_optimizer(manual, lr=accumulated.learning_rate(0), betas=(0.9, 0.99))
    crops = [random_crops(TOKENS, 2, 16, seed=1337, step=position) for position in (0, 1)]
    inputs, targets = torch.cat([c[0] for c in crops]), torch.cat([c[1] for c in crops])
    F.cross_entropy(manual(inputs).logits.flatten(0, 1), targets.flatten()).backward()
    optimizer.step()
    for (name, expected), actual in zip(manual.named_parameters(), accumulated.model.parameters(), strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6, msg=name)
    assert accumulated.data_position == 2


def test_label_smoothing_is_applied_to_training_not_to_evaluation():
    trainer = Trainer(tiny_model(), config(label_smoothing=0.3), LanguageModelling(TOKENS, TOKENS[:500]),
                      progress=False)
    inputs, targets = random_crops(TOKENS, 4, 16, seed=1337, step=0)
    with torch.no_grad():
        logits = trainer.model(inputs).logits.flatten(0, 1)
    smoothed = F.cross_entropy(logits, targets.flatten(), label_smoothing=0.3).item()
    held = []
    hook = trainer.model.register_forward_hook(lambda module, args, output: held.append(output.logits))
    assert trainer.train_step().loss == pytest.approx(smoothed, rel=1e-5)
    hook.remove()
    assert held == [None]  # the step took the loss alone (losses.head_loss): no (B, T, V) logits kept
    # Evaluation of these (trained) weights: plain cross-entropy over the evaluation windows.
    windows = [spaced_windows(TOKENS[:500], 4, 16, index, 2) for index in range(2)]

    def mean_loss(smoothing):
        with torch.no_grad():
            return sum(F.cross_entropy(trainer.model(inputs).logits.flatten(0, 1), targets.flatten(),
                                       label_smoothing=smoothing).item() for inputs, targets in windows) / 2

    plain = mean_loss(0.0)
    assert trainer.evaluate() == pytest.approx(plain, rel=1e-5)
    assert mean_loss(0.3) != pytest.approx(plain, rel=1e-4)  # smoothing changes this loss: the check has power


@pytest.mark.filterwarnings("ignore:training.precision=.bf16. on a CPU without native bf16")
def test_bf16_autocast_trains_on_cpu_and_fp16_needs_a_gpu():
    trainer = Trainer(tiny_model(), config(precision="bf16"), LanguageModelling(TOKENS), progress=False)
    inputs, targets = random_crops(TOKENS, 4, 16, seed=1337, step=0)
    with torch.no_grad():
        fp32 = F.cross_entropy(trainer.model(inputs).logits.flatten(0, 1), targets.flatten()).item()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = trainer.model(inputs).logits
        assert logits.dtype == torch.bfloat16
        bf16 = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()).item()
    assert bf16 != fp32  # bf16 matrix products round: the two losses differ (by about 1e-5 here)
    assert trainer.train_step().loss == pytest.approx(bf16, rel=1e-6, abs=0)  # the step ran under bf16 autocast
    _, result = run(precision="bf16", max_steps=12, lr=1e-2)
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    if not torch.cuda.is_available():
        with pytest.raises(TrainingError, match="fp16' needs a CUDA device"):
            run(precision="fp16")


def test_metrics_jsonl_has_the_named_metrics_and_the_run_folder_loads(tmp_path):
    _, result = run(tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert {"step", "train_loss", "lr", "tokens_per_s"} <= set(records[0])
    assert {"eval_loss", "eval_ppl", "eval_accuracy"} <= set(records[2]) and 0 <= records[2]["eval_accuracy"] <= 1
    assert records[2]["eval_ppl"] == pytest.approx(np.exp(records[2]["eval_loss"]))
    assert result.final_eval_loss == records[-1]["eval_loss"]
    loaded = tformer.load(tmp_path)
    assert loaded.config.d_model == 32
    assert main(["plot", str(tmp_path)]) == 0
    assert (tmp_path / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_needs_a_run_folder(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_best_and_keep_last_k_checkpoints(tmp_path):
    _, result = run(tmp_path, max_steps=10, checkpoint_every=2, keep_last=2, eval_every=2)
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["best", "step-00000008", "step-00000010"]
    best = json.loads((folder / "best" / "best.json").read_text())
    evaluations = {record["step"]: record["eval_loss"] for record in result.history if "eval_loss" in record}
    assert sorted(evaluations) == [2, 4, 6, 8, 10] and len(set(evaluations.values())) == 5
    assert best["step"] == result.best_step == min(evaluations, key=evaluations.get)
    assert best["eval_loss"] == result.best_eval == min(evaluations.values())
    best_model = tformer.load(folder / "best")  # holds the weights of that evaluation
    evaluation = Trainer(best_model, config(), LanguageModelling(TOKENS, TOKENS[:500]), progress=False).evaluate()
    assert evaluation == pytest.approx(best["eval_loss"], rel=1e-6)
    assert tformer.load(folder / "best").config.num_layers == 2
    assert tformer.load(folder / "step-00000008").config.num_layers == 2


def test_early_stopping_when_the_eval_metric_stops_improving():
    _, result = run(max_steps=100, schedule="constant", lr=1e-12, warmup_steps=0, eval_every=2,
                    early_stopping_patience=2, early_stopping_min_delta=0.01)
    assert result.stopped == "early_stopping"
    assert result.steps == 6 and result.best_step == 2


class FakeClock:
    """The trainer's clock, moved on by ``step_seconds`` inside every training step."""

    def __init__(self, monkeypatch, step_seconds):
        self.now, self.step_seconds = 0.0, step_seconds
        monkeypatch.setattr(trainer_module, "time", SimpleNamespace(perf_counter=lambda: self.now))
        real_step = Trainer.train_step

        def train_step(trainer, **options):
            self.now += self.step_seconds
            return real_step(trainer, **options)

        monkeypatch.setattr(Trainer, "train_step", train_step)


def test_max_minutes_stops_the_run_evaluates_and_saves_and_counts_across_resumes(tmp_path, monkeypatch):
    FakeClock(monkeypatch, step_seconds=2.5)
    _, result = run(tmp_path, max_steps=100, eval_every=50, max_minutes=0.1)  # 6 s: spent during step 3
    assert result.stopped == "time_limit" and result.steps == 3
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 3 and "eval_loss" in records[-1]  # evaluated where it stopped
    state = json.loads((tmp_path / "checkpoints" / "step-00000003" / "trainer_state.json").read_text())
    assert state["elapsed_seconds"] == 7.5
    assert tformer.load(tmp_path).config.num_layers == tiny_model().config.num_layers  # the model is saved

    def resumed(minutes):
        trainer = Trainer(tiny_model(), config(max_steps=100, eval_every=50, max_minutes=minutes),
                          LanguageModelling(TOKENS, TOKENS[:500]), out_dir=tmp_path, progress=False)
        trainer.resume("auto")
        return trainer.train()

    again = resumed(0.1)  # the budget was spent before: no step
    assert again.stopped == "time_limit" and again.steps == 3
    longer = resumed(0.2)  # 12 s in all: 7.5 before, then 10 after step 4, 12.5 after step 5
    assert longer.stopped == "time_limit" and longer.steps == 5


def test_max_minutes_is_refused_when_negative_and_ignored_when_zero():
    with pytest.raises(TrainingError, match=r"training.max_minutes=-1 must be a finite number >= 0"):
        config(max_minutes=-1)
    _, result = run(max_minutes=0)
    assert result.stopped == "completed" and result.steps == 6


class InjectNaN:
    """Make the training loss NaN on the given (1-based) forward calls."""

    def __init__(self, monkeypatch, calls):
        self.calls, self.count = set(calls), 0
        real = lm_task.LanguageModelling.loss

        def loss(task, model, batch):
            self.count += 1
            value = real(task, model, batch)
            return value * float("nan") if self.count in self.calls else value

        monkeypatch.setattr(lm_task.LanguageModelling, "loss", loss)


def test_a_nan_loss_stops_the_run_naming_the_newest_finite_checkpoint(tmp_path, monkeypatch):
    InjectNaN(monkeypatch, calls=[6])  # one loss per step (no evaluation): the 6th step's is NaN
    with pytest.raises(TrainingError, match=r"loss became nan at step 6: training stopped; the newest finite "
                                            r"checkpoint is .*step-00000004, where --resume auto continues"):
        run(tmp_path, max_steps=20, checkpoint_every=2, eval_every=100)
    saved = tmp_path / "checkpoints" / "step-00000004"  # its state trained on to a finite step 5
    model = tformer.load(saved)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    state = json.loads((saved / "trainer_state.json").read_text())
    assert state["step"] == 4 and state["data_position"] == 4
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 5  # the last finite step: metrics.jsonl numbers steps as the message does
    assert not (tmp_path / "model.safetensors").exists()


def test_a_state_with_non_finite_weights_is_never_saved(tmp_path):
    trainer = Trainer(tiny_model(), config(max_steps=4, checkpoint_every=1), LanguageModelling(TOKENS),
                      out_dir=tmp_path, progress=False)
    trainer.train_step()
    trainer.step = 1
    trainer.prepare_out_dir()
    trainer.save_checkpoint(None)
    before = {p.name: p.read_bytes() for p in (tmp_path / "checkpoints" / "step-00000001").iterdir()}
    trainer.step, trainer.last_good_step = 2, 1
    with torch.no_grad():
        trainer.model.stack.final_norm.weight[3] = float("inf")
    with pytest.raises(TrainingError, match=r"stack.final_norm.weight is not finite after step 2: training stopped; "
                                            r"the newest finite checkpoint is .*step-00000001"):
        trainer.save_checkpoint(None)
    trainer.state.release()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000001"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "checkpoints" / "step-00000001").iterdir()} == before


def test_nan_steps_are_skipped_up_to_the_limit(tmp_path, monkeypatch, capsys):
    InjectNaN(monkeypatch, calls=[2, 4])
    _, result = run(tmp_path, skip_nonfinite=2, eval_every=100)
    assert result.stopped == "completed" and result.steps == 6
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["train_loss"] is None for r in records] == [False, True, False, True, False, False]
    assert "step skipped (2 of training.skip_nonfinite=2)" in capsys.readouterr().out


def test_a_resume_that_changes_the_model_is_refused_naming_the_fields(tmp_path):
    run(tmp_path, max_steps=2)
    changed = Trainer(tiny_model(d_model=48), config(), LanguageModelling(TOKENS), out_dir=tmp_path, progress=False)
    with pytest.raises(TrainingError, match=r"the recipe changes the model \(.*d_model 32 -> 48.*\)"):
        changed.resume("auto")


def test_an_existing_run_is_not_overwritten_by_accident(tmp_path):
    out = tmp_path / "run"
    run(out, max_steps=2)
    before = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(TrainingError, match="already holds a run .* resume it with --resume auto"):
        run(out, max_steps=2)
    trainer = Trainer(tiny_model(), config(max_steps=2), LanguageModelling(TOKENS), out_dir=out, progress=False,
                      overwrite=True)
    assert trainer.train().steps == 2
    moved = tmp_path / "run.replaced-1"  # the old run, moved aside whole: nothing is deleted
    assert {str(p.relative_to(moved)): p.read_bytes() for p in moved.rglob("*") if p.is_file()} == before


def test_an_unwritable_output_folder_is_reported_before_training(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    trainer = Trainer(tiny_model(), config(), LanguageModelling(TOKENS), out_dir=tmp_path / "file" / "run",
                      progress=False)
    with pytest.raises(TrainingError, match="exists and is not a folder|cannot write there"):
        trainer.train()
    assert trainer.step == 0


def test_a_disk_too_small_for_a_checkpoint_is_reported_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: SimpleNamespace(free=1000))
    trainer = Trainer(tiny_model(), config(), LanguageModelling(TOKENS), out_dir=tmp_path, progress=False)
    with pytest.raises(TrainingError, match="0 MiB free, but a checkpoint of this model needs about"):
        trainer.train()
    assert trainer.step == 0 and not (tmp_path / "metrics.jsonl").exists()


def test_token_files_are_memory_mapped(tmp_path):
    ids = np.asarray(TOKENS.numpy(), dtype=np.uint16)
    np.save(tmp_path / "tokens.npy", ids)
    data = load_language_model_data(DataConfig(train=str(tmp_path / "tokens.npy"), eval_fraction=0.1))
    assert isinstance(data.train, np.memmap) and data.tokenizer is None
    inputs, targets = random_crops(data.train, 4, 16, seed=1, step=3)
    expected = random_crops(torch.from_numpy(ids.astype(np.int64))[: len(data.train)], 4, 16, seed=1, step=3)
    assert torch.equal(inputs, expected[0]) and torch.equal(targets, expected[1])
    trainer = Trainer(tiny_model(), config(max_steps=4), LanguageModelling(data.train, data.eval), progress=False)
    assert trainer.train().steps == 4


def test_fast_character_encoding_matches_the_tokenizer():
    text = "To be, or not to be: that is the question. Ünïcödé ✓\n" * 20
    tokenizer = CharTokenizer.train(text[:-30] + "x")
    assert encode_text(tokenizer, text).tolist() == tokenizer.encode(text)


@pytest.mark.slow  # over 2 s
def test_a_compiled_training_step_traces_whole_and_matches_eager(monkeypatch):
    """training.compile=true through torch.compile's tracing and AOT autograd (forward and backward
    graphs) without inductor's code generation, which takes minutes on a small CPU (the test
    below, opt-in, runs it): one graph, no graph break, the eager losses. About 5-10 s."""
    from torch._dynamo.utils import counters

    eager = Trainer(tiny_model(), config(), LanguageModelling(TOKENS), progress=False)
    expected = [eager.train_step().loss for _ in range(2)]
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    counters.clear()
    compiled = Trainer(tiny_model(), config(compile=True), LanguageModelling(TOKENS), progress=False)
    assert [compiled.train_step().loss for _ in range(2)] == pytest.approx(expected, rel=1e-6)
    assert counters["stats"]["unique_graphs"] == 1 and counters["aot_autograd"]["ok"] == 1
    assert not counters["graph_break"]


def test_precision_and_compile_default_to_each_devices_choice(monkeypatch):
    """``auto``: bf16 and compiled steps on CUDA (fp32 where the card has no bf16), fp32 eager on the CPU; what a
    recipe names is kept; anything else refused by name."""
    default = TrainingConfig()
    assert (default.precision_on("cpu"), default.compile_on("cpu")) == ("fp32", False)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert (default.precision_on("cuda"), default.compile_on("cuda")) == ("bf16", True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert default.precision_on("cuda") == "fp32"
    named = TrainingConfig(precision="bf16", compile=False)
    assert (named.precision_on("cpu"), named.compile_on("cuda")) == ("bf16", False)
    trainer = Trainer(tiny_model(), config(), LanguageModelling(TOKENS), progress=False)
    assert trainer.precision == "fp32" and trainer.forward_module is trainer.wrapped
    with pytest.raises(TrainingError, match='training.compile=\'yes\' must be true, false or "auto"'):
        TrainingConfig(compile="yes")
    with pytest.raises(TrainingError, match="training.precision='fp64' is not one of auto, fp32, bf16, fp16"):
        TrainingConfig(precision="fp64")


@pytest.mark.skipif(not os.environ.get("TFORMER_TEST_COMPILE"), reason="torch.compile takes ~40 s on a 2-core CPU; "
                    "set TFORMER_TEST_COMPILE=1 to run")
def test_compiled_training_matches_eager_without_graph_breaks():
    from torch._dynamo.utils import counters

    _, eager = run(max_steps=3)
    counters.clear()
    _, compiled = run(max_steps=3, compile=True)
    assert compiled.final_eval_loss == pytest.approx(eager.final_eval_loss, rel=1e-4)
    assert not counters["graph_break"]  # the input checks' host syncs are skipped when compiled


def test_recipes_train_on_token_files_from_tformer_tokenize(tmp_path):
    from tformer.data import tokenize_files
    from tformer.training.recipe import recipe_from_dict
    from tformer.training.run import train_recipe

    text = "all the world's a stage, and all the men and women merely players. " * 60
    (tmp_path / "corpus.txt").write_text(text)
    tokenizer = CharTokenizer.train(text)
    tokenizer.save(tmp_path / "tok.json")
    tokenize_files(tokenizer, [tmp_path / "corpus.txt"], tmp_path / "data.bin", progress=False)
    raw = {"model": {"preset": "gpt-nano", "max_seq_len": 16},
           "data": {"train": "data.bin", "tokenizer": "tok.json"},
           "training": {"max_steps": 3, "batch_size": 2, "eval_every": 3, "eval_batches": 1}}
    recipe = recipe_from_dict(raw, base_dir=tmp_path)
    data = load_language_model_data(recipe.data)
    assert isinstance(data.train, np.memmap) and data.vocab_size == tokenizer.vocab_size
    result = train_recipe(recipe, tmp_path / "run", progress=False, echo=lambda line: None)
    assert result.steps == 3
    assert tformer.load(tmp_path / "run").tokenizer.vocab_size == tokenizer.vocab_size
    assert "[data]" in (tmp_path / "run" / "recipe.toml").read_text()

    CharTokenizer.train("other characters entirely: xyz").save(tmp_path / "other.json")
    raw["data"]["tokenizer"] = "other.json"
    with pytest.raises(Exception, match="made with another tokenizer"):
        load_language_model_data(recipe_from_dict(raw, base_dir=tmp_path).data)


class FakeThreads:
    """Stands in for torch's thread count, with a step time per count."""

    def __init__(self, monkeypatch, seconds_by_count):
        from tformer.training import threads

        self.count, self.seconds_by_count = 2, seconds_by_count
        monkeypatch.setattr(threads.torch, "get_num_threads", lambda: self.count)
        monkeypatch.setattr(threads.torch, "set_num_threads", lambda n: setattr(self, "count", n))

    def run(self, tuner, steps):
        used = []
        for _ in range(steps):
            tuner.before_step()
            used.append(self.count)
            tuner.after_step(self.seconds_by_count[self.count])
        return used


@pytest.mark.parametrize("seconds, settles_on", [({1: 0.070, 2: 0.040}, 2), ({1: 0.063, 2: 1.8}, 1),
                                                  ({1: 0.050, 2: 0.048}, 1)])
def test_the_thread_tuner_keeps_the_faster_count_and_rarely_retries_the_slower(monkeypatch, seconds, settles_on):
    from tformer.training.threads import ThreadTuner

    fake = FakeThreads(monkeypatch, seconds)
    tuner = ThreadTuner(default_threads=2)
    used = fake.run(tuner, 2000)
    assert used[-1] == settles_on
    slower = 2 if settles_on == 1 else 1
    assert used.count(slower) <= 16  # the first comparison, then a few short re-tries
    if seconds[2] > 1.5 * seconds[1]:
        assert used.count(2) <= 4  # a hopeless trial ends after one step
    assert (settles_on == 2) == bool(tuner.changes)


def test_evaluation_windows_spread_over_the_whole_split_and_split_across_processes():
    tokens = torch.arange(1000)
    batches = [spaced_windows(tokens, 4, 16, index, 5) for index in range(5)]
    starts = torch.cat([inputs[:, 0] for inputs, _ in batches])
    assert starts[0] == 0 and starts[-1] == 1000 - 17 and bool((starts.diff() > 0).all())
    assert torch.equal(batches[2][1], batches[2][0] + 1)  # targets are the inputs shifted by one
    for index in range(5):  # 2 processes with batch 2 = 1 process with batch 4, row for row
        halves = [spaced_windows(tokens, 2, 16, index, 5, rank=rank, world_size=2)[0] for rank in (0, 1)]
        assert torch.equal(torch.cat(halves), batches[index][0])


def test_eval_batches_zero_evaluates_the_whole_split():
    """1601 tokens with batch 4 and windows of 16: eval_batches=0 takes 25 batches whose 100 windows
    start every 16 tokens, so they tile the split exactly and the loss is the whole split's, up to
    the order of the sums. A model trained on zeros finds the zeros easy and the random tail hard,
    so a single batch (4 windows) gives another loss: the comparison has power."""
    evaluation = torch.cat([torch.zeros(1500, dtype=torch.long), TOKENS[:101]])
    trainer = Trainer(tiny_model(), config(eval_batches=0, lr=1e-2),
                      LanguageModelling(torch.zeros(3000, dtype=torch.long), evaluation), progress=False)
    for _ in range(3):
        trainer.train_step()
    with torch.no_grad():
        logits = trainer.model.eval()(evaluation[:1600].view(-1, 16)).logits
    whole = F.cross_entropy(logits.flatten(0, 1), evaluation[1:1601]).item()
    assert trainer.evaluate() == pytest.approx(whole, rel=1e-5)
    one_batch = Trainer(trainer.model, config(eval_batches=1), LanguageModelling(TOKENS, evaluation),
                        progress=False).evaluate()
    assert one_batch != pytest.approx(whole, rel=2e-3)  # the same weights, 4 windows: not the whole split


def test_a_task_subclass_can_replace_the_objective_for_training_and_evaluation():
    class HalfLoss(LanguageModelling):
        def loss(self, model, batch):
            next_tokens = batch["labels"][:, 1:]  # (B, T): the crop's tokens after the inputs' first
            return 0.5 * F.cross_entropy(model(batch["input_ids"]).logits.flatten(0, 1), next_tokens.flatten())

    plain = Trainer(tiny_model(), config(), LanguageModelling(TOKENS, TOKENS[:500]), progress=False)
    halved = Trainer(tiny_model(), config(), HalfLoss(TOKENS, TOKENS[:500]), progress=False)
    assert halved.evaluate() == pytest.approx(0.5 * plain.evaluate(), rel=1e-5)
    assert "eval_accuracy" not in halved.evaluate_metrics()
    assert halved.train_step().loss == pytest.approx(0.5 * plain.train_step().loss, rel=1e-5)


def test_bf16_on_a_cpu_without_native_bf16_warns(monkeypatch):
    monkeypatch.setattr(trainer_module, "native_bf16_matmul", lambda: False)
    with pytest.warns(UserWarning, match="without native bf16"):
        Trainer(tiny_model(), config(precision="bf16"), LanguageModelling(TOKENS), progress=False)
    monkeypatch.setattr(trainer_module, "native_bf16_matmul", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Trainer(tiny_model(), config(precision="bf16"), LanguageModelling(TOKENS), progress=False)
