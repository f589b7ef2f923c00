"""Fault injection on run folders, through the ``tformer train`` command line on a tiny model: each
case asserts the exit code, the one-line message and that every file that was there before is
still there, byte for byte. (Issue 16: the trainer's and the run folder's cases.)"""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from python_path import child_python_path

import tformer
from tformer.cli import main
from tformer.training import Trainer, TrainingConfig
from tformer.training import checkpoints as checkpoints_module
from tformer.training.tasks import LanguageModelling
from tformer.training.tasks import lm as lm_task

RECIPE = """
[model]
max_seq_len = 16
d_model = 16
num_layers = 1
num_heads = 2

[data]
train = "text.txt"

[training]
max_steps = 3
batch_size = 2
seq_len = 16
warmup_steps = 0
eval_every = 3
eval_batches = 1
threads = 1
"""
TEXT = "the quick brown fox jumps over a lazy dog while rain falls on distant hills " * 40


@pytest.fixture
def recipe(tmp_path):
    (tmp_path / "text.txt").write_text(TEXT)
    path = tmp_path / "tiny.toml"
    path.write_text(RECIPE)
    return path


def train(recipe, out, *extra):
    return main(["train", str(recipe), "--out", str(out), "--no-progress", *extra])


def snapshot(folder):
    """Every file under ``folder`` (relative path -> bytes)."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def error_line(capsys):
    """The one line a failed command printed on stderr (and nothing else there)."""
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def wait_until(condition, what, process, timeout=60.0):
    """Poll ``condition`` until it holds; fail loudly when ``process`` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the run exited ({process.returncode}) before {what}\n{out}\n{err}")
        if time.monotonic() > deadline:
            process.kill()
            out, err = process.communicate()
            raise AssertionError(f"no {what} after {timeout:.0f} s\n{out}\n{err}")
        time.sleep(0.05)


# ---- 1. never delete what tformer did not write ----------------------------------------------------


def test_a_folder_tformer_did_not_write_is_refused_and_overwrite_moves_it_aside(recipe, tmp_path, capsys):
    user = tmp_path / "userproj"
    (user / "checkpoints" / "old-experiment").mkdir(parents=True)
    (user / "checkpoints" / "old-experiment" / "model.pt").write_text("w\n")
    (user / "metrics.jsonl").write_text("{}\n")
    before = snapshot(user)

    assert train(recipe, user) == 2
    assert "userproj is not empty (checkpoints, metrics.jsonl) and holds no run to resume" in error_line(capsys)
    assert snapshot(user) == before
    assert train(recipe, user, "--resume", "auto") == 2  # nothing to resume there either
    assert "is not empty" in error_line(capsys) and snapshot(user) == before

    assert train(recipe, user, "--overwrite") == 0
    assert f"{user} was not empty: moved its contents to {tmp_path / 'userproj.replaced-1'}" in capsys.readouterr().out
    assert snapshot(tmp_path / "userproj.replaced-1") == before  # moved, not deleted
    assert tformer.load(user).config.d_model == 16


def test_a_finished_run_whose_step_folders_were_pruned_is_not_replaced(recipe, tmp_path, capsys):
    run = tmp_path / "run"
    assert train(recipe, run) == 0
    for step in (run / "checkpoints").glob("step-*"):  # the user keeps only best/ and the final model
        for file in step.iterdir():
            file.unlink()
        step.rmdir()
    capsys.readouterr()
    before = snapshot(run)
    for extra in ((), ("--resume", "auto")):
        assert train(recipe, run, *extra) == 2
        assert "run is not empty (checkpoints, config.json, metrics.jsonl, model.safetensors and " \
               in error_line(capsys)
        assert snapshot(run) == before


# ---- 2. one writer per run folder ----------------------------------------------------------------


@pytest.mark.slow  # starts a training process
def test_a_second_process_on_a_run_folder_is_refused_and_a_killed_holder_leaves_no_lock(recipe, tmp_path, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-m", "tformer", "train", str(recipe), "--out", str(run), "--no-progress",
         "--set", "training.max_steps=1000000", "--set", "training.eval_every=1000000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": child_python_path()},
    )
    try:
        metrics = run / "metrics.jsonl"
        wait_until(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 2, "two metrics records", holder)
        for extra in ((), ("--resume", "auto")):  # a fresh run, and a resume, beside the running one
            assert train(recipe, run, *extra) == 2
            assert f"{run} is in use by another tformer run (pid {holder.pid})" in error_line(capsys)
        assert not (run / "model.safetensors").exists() and holder.poll() is None
    finally:
        holder.kill()
        holder.communicate()
    assert holder.returncode == -signal.SIGKILL
    assert train(recipe, run, "--resume", "auto") == 0  # the lock died with its holder
    assert "its run starts again at step 0" in capsys.readouterr().out
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3]


# ---- 3. resume checks the data's vocabulary --------------------------------------------------------


def test_resume_refuses_data_whose_vocabulary_changed(recipe, tmp_path, capsys):
    run = tmp_path / "run"
    assert train(recipe, run, "--set", "training.checkpoint_every=1") == 0
    (tmp_path / "text.txt").write_text(TEXT.replace("z", "#"))  # the same number of characters
    before = snapshot(run)
    capsys.readouterr()
    assert train(recipe, run, "--resume", "auto", "--set", "training.max_steps=4") == 2
    assert ("the data's vocabulary differs from the run's: token id 2 is 'a' in the run and '#' in the data "
            "(the first difference; 28 -> 28 tokens)") in error_line(capsys)
    assert snapshot(run) == before


# ---- 5. a NaN stop leaves a recoverable state ------------------------------------------------------


def test_a_nan_stop_leaves_a_state_that_a_lower_learning_rate_resumes(recipe, tmp_path, capsys):
    run = tmp_path / "run"
    assert train(recipe, run, "--set", "training.lr=1e9", "--set", "training.checkpoint_every=1") == 2
    message = error_line(capsys)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 1  # the last finite step, as metrics.jsonl numbers it; the next one failed
    assert "loss became nan at step 2: training stopped; no finite checkpoint was saved before it: --resume auto " \
           "starts again at step 0; lower training.lr" in message
    # Step 1's update left weights of ~1e9, finite but past recovery: set aside, not resumed, not deleted.
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-00000001.nonfinite"]

    assert train(recipe, run, "--set", "training.lr=1e-3", "--resume", "auto") == 0
    printed = capsys.readouterr().out
    assert "settings changed since that run: training.lr 1000000000.0 -> 0.001" in printed
    assert "completed at step 3" in printed
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_a_nan_stop_names_the_newest_finite_checkpoint_and_resume_states_the_new_rate(recipe, tmp_path, capsys,
                                                                                       monkeypatch):
    run = tmp_path / "run"
    real, calls = lm_task.LanguageModelling.loss, [0]

    def nan_on_the_fifth(*args, **kwargs):  # one loss per step: the 5th step's is NaN
        calls[0] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if calls[0] == 5 else loss

    monkeypatch.setattr(lm_task.LanguageModelling, "loss", nan_on_the_fifth)
    assert train(recipe, run, "--set", "training.max_steps=8", "--set", "training.checkpoint_every=2",
                 "--set", "training.eval_every=100") == 2
    # The state after step 4 trained to a NaN: its checkpoint is set aside; step 2's trained on (to step 3, 4).
    assert (f"loss became nan at step 5: training stopped; the newest finite checkpoint is "
            f"{run / 'checkpoints' / 'step-00000002'}, where --resume auto continues") in error_line(capsys)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000002", "step-00000004.nonfinite"]
    monkeypatch.setattr(lm_task.LanguageModelling, "loss", real)
    assert train(recipe, run, "--set", "training.max_steps=8", "--set", "training.lr=5e-4", "--resume", "auto") == 0
    printed = capsys.readouterr().out
    assert "resumed from step 2" in printed and "settings changed on resume: training.lr 0.001 -> 0.0005" in printed
    assert "completed at step 8" in printed


# ---- 7. one-line errors instead of tracebacks (the training items) --------------------------------


def test_a_npy_token_file_with_ids_outside_the_vocabulary_is_refused_before_training(tmp_path, capsys):
    ids = np.arange(400, dtype=np.int32) % 30
    ids[123] = 99
    np.save(tmp_path / "ids.npy", ids)
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(RECIPE.replace('train = "text.txt"', 'train = "ids.npy"\neval_fraction = 0')
                      .replace("num_heads = 2", "num_heads = 2\nvocab_size = 32"))
    assert train(recipe, tmp_path / "run") == 2
    assert (f"the training data ({tmp_path / 'ids.npy'}) holds token id 99 at position 123, outside the model's "
            "vocabulary (ids 0..31)") in error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_a_seed_beyond_64_bits_is_refused_at_validation(recipe, tmp_path, capsys):
    assert train(recipe, tmp_path / "run", "--set", f"training.seed={2**64}") == 2
    assert f"--set training.seed={2**64}: [training] seed={2**64} must be an integer in [0, 2**64 - 1]" \
           in error_line(capsys)
    assert not (tmp_path / "run").exists()
    assert train(recipe, tmp_path / "run", "--set", f"training.seed={2**64 - 1}") == 0  # the largest trains


def test_resume_auto_passes_over_a_corrupt_newest_checkpoint_and_says_so(recipe, tmp_path, capsys):
    run = tmp_path / "run"
    assert train(recipe, run, "--set", "training.checkpoint_every=1") == 0
    newest = run / "checkpoints" / "step-00000003"
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    before = snapshot(newest)
    capsys.readouterr()
    assert train(recipe, run, "--resume", "auto", "--set", "training.max_steps=4") == 0
    printed = capsys.readouterr().out
    assert (f"{newest}: not a readable training checkpoint (model.safetensors: ") in printed
    assert f"resuming from the newest intact checkpoint, {run / 'checkpoints' / 'step-00000002'}" in printed
    assert "resumed from step 2" in printed and "completed at step 4" in printed
    assert snapshot(newest) == before  # left for the user to look at


def test_a_full_disk_while_writing_a_checkpoint_is_one_line_and_keeps_the_earlier_ones(recipe, tmp_path, capsys,
                                                                                        monkeypatch):
    run = tmp_path / "run"
    real, calls = checkpoints_module.save_file, [0]

    def disk_fills_on_the_second(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoints_module, "save_file", disk_fills_on_the_second)
    assert train(recipe, run, "--set", "training.checkpoint_every=1") == 2
    message = error_line(capsys)
    first = run / "checkpoints" / "step-00000001"
    assert (f"cannot write {run / 'checkpoints' / 'step-00000002'}: No space left on device (" in message
            and f"MiB free there); the newest checkpoint, {first}, is intact" in message)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000001"]  # no debris
    assert tformer.load(first).config.d_model == 16


# ---- 8. values that cannot work -----------------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1e-3"])
def test_a_learning_rate_that_cannot_work_is_refused_at_validation(recipe, tmp_path, capsys, value):
    assert train(recipe, tmp_path / "run", "--set", f"training.lr={value}") == 2
    assert f"--set training.lr={value}: [training] lr=" in (line := error_line(capsys))
    assert "must be a finite number > 0.0" in line
    assert not (tmp_path / "run").exists()


# ---- 9. consistency --------------------------------------------------------------------------------


def test_set_errors_name_the_set_option_and_recipe_errors_the_file(recipe, tmp_path, capsys):
    assert train(recipe, tmp_path / "run", "--set", "training.warmup_steps=-1") == 2
    assert "error: --set training.warmup_steps=-1: [training] warmup_steps=-1 must be an integer >= 0" \
           in error_line(capsys)
    recipe.write_text(RECIPE.replace("warmup_steps = 0", "warmup_steps = -1"))
    assert train(recipe, tmp_path / "run") == 2
    assert f"error: {recipe}: [training] warmup_steps=-1" in error_line(capsys)


@pytest.mark.parametrize("setting, message", [
    ("model.vocab_size=4", "[model] vocab_size=4 is smaller than the tokenizer's 28 tokens"),
    ("training.early_stopping_metric=eval_bleu", "is not reported by the lm task"),
])
def test_a_run_refused_before_training_leaves_no_folder(recipe, tmp_path, capsys, setting, message):
    assert train(recipe, tmp_path / "new" / "run", "--set", setting) == 2
    assert message in error_line(capsys)
    assert not (tmp_path / "new").exists()


# ---- 10. an interrupted run is visible to its caller ----------------------------------------------


def test_sigterm_during_training_saves_then_raises_and_the_command_exits_143(recipe, tmp_path, capsys, monkeypatch):
    real, calls = lm_task.LanguageModelling.loss, [0]

    def terminate_on_the_second(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # lands in step 2; step 3 carries the request (to every process)
        return real(*args, **kwargs)

    monkeypatch.setattr(lm_task.LanguageModelling, "loss", terminate_on_the_second)
    run = tmp_path / "run"
    assert train(recipe, run, "--set", "training.max_steps=100") == 143
    saved = run / "checkpoints" / "step-00000003"
    assert f"interrupted at step 3: saved to {saved}; continue with --resume auto" in capsys.readouterr().out
    assert json.loads((saved / "trainer_state.json").read_text())["step"] == 3

    from tformer.training import TrainingInterrupted

    calls[0] = 0
    tokens = np.arange(500) % 16
    trainer = Trainer(tformer.build_model("gpt-nano", vocab_size=16, max_seq_len=16),
                      TrainingConfig(max_steps=100, batch_size=2, seq_len=16, threads=1), LanguageModelling(tokens),
                      out_dir=tmp_path / "library", progress=False)
    with pytest.raises(TrainingInterrupted, match="interrupted at step 3: saved to") as caught:
        trainer.train()  # a program calling the Trainer stops too, with the result in the exception
    assert isinstance(caught.value, KeyboardInterrupt) and caught.value.exit_code == 143
    assert caught.value.result.stopped == "interrupted" and caught.value.result.steps == 3


# ---- issue 37: what tformer did not write, and --overwrite as documented ---------------------------


def test_overwrite_moves_a_finished_run_aside_as_documented(recipe, tmp_path, capsys):
    run = tmp_path / "run"
    assert train(recipe, run) == 0
    before = snapshot(run)
    capsys.readouterr()

    assert train(recipe, run, "--overwrite", "--set", "training.max_steps=2") == 0
    assert f"{run} was not empty: moved its contents to {tmp_path / 'run.replaced-1'}" in capsys.readouterr().out
    assert snapshot(tmp_path / "run.replaced-1") == before  # the old run, whole
    assert [step for step, _ in checkpoints_module.list_checkpoints(run)] == [2]  # the new run alone


def test_resume_auto_removes_no_look_alike_of_a_temporary_and_only_its_own_run_debris(recipe, tmp_path, capsys):
    user = tmp_path / "photos"  # not a run: names that look like tformer's temporaries stay
    for folder in (user / ".staging-photos", user / "checkpoints" / ".best.tmp-1", user / ".step-1.deleting"):
        folder.mkdir(parents=True)
        (folder / "img.png").write_bytes(b"\x89PNG user")
    (user / ".notes.txt.tmp-7").write_text("draft\n")
    (user / "notes.txt").write_text("mine\n")
    before = snapshot(user)
    assert train(recipe, user, "--resume", "auto") == 2
    assert "photos is not empty (.notes.txt.tmp-7, .staging-photos, .step-1.deleting, checkpoints and 1 more) and " \
           "holds no run to resume" in error_line(capsys)
    assert snapshot(user) == before

    run = tmp_path / "run"  # a run: the debris its killed process left (names with its token) goes, nothing else
    assert train(recipe, run, "--set", "training.max_steps=2") == 0
    token = json.loads((run / "training_config.json").read_text())["run_token"]
    own = [run / f".staging-{token}-x1", run / "checkpoints" / f".step-00000002.tmp-{token}",
           run / "checkpoints" / f".step-00000001.deleting-{token}"]
    for folder in own:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    (run / f".metrics.jsonl.tmp-{token}").write_text("{}\n")
    for folder in (run / ".staging-photos", run / "checkpoints" / ".best.tmp-1"):
        folder.mkdir()
        (folder / "img.png").write_bytes(b"\x89PNG user")
    assert train(recipe, run, "--resume", "auto") == 0
    assert not any(path.exists() for path in [*own, run / f".metrics.jsonl.tmp-{token}"])
    kept = (run / ".staging-photos", run / "checkpoints" / ".best.tmp-1")
    assert all((folder / "img.png").is_file() for folder in kept)
    assert json.loads((run / "training_config.json").read_text())["run_token"] == token


# ---- a quantized model is refused before the run folder is touched (issue 60, defect 6) --------------------


@pytest.mark.slow  # trains a tiny run twice
@pytest.mark.parametrize("resume", [[], ["--resume", "auto"]], ids=["fresh", "resume-auto"])
def test_fine_tuning_a_quantized_folder_is_refused_in_one_line_and_writes_nothing(recipe, tmp_path, capsys, resume):
    assert train(recipe, tmp_path / "float") == 0
    tformer.load(tmp_path / "float", quantize="int8").save(tmp_path / "int8")
    capsys.readouterr()
    tuning = tmp_path / "tune.toml"
    tuning.write_text("[model]\ninit_from = \"int8\"\n\n[data]" + RECIPE.split("[data]")[1])
    out = tmp_path / "tuned"
    assert train(tuning, out, *resume) == 2
    assert error_line(capsys) == (f"tformer train: error: [model] init_from {tmp_path / 'int8'}: a quantized model "
                                  "(int8) cannot be trained (its weights are integers for inference); fine-tune its "
                                  "float checkpoint, then quantize it, or train LoRA adapters over it (an [adapter] "
                                  "section)")
    assert not out.exists()
    assert train(tuning, out, "--set", f"model.init_from={tmp_path / 'float'}") == 0  # the corrected run


def test_the_trainer_refuses_a_quantized_model_before_it_writes_into_the_run_folder(tmp_path):
    from tformer.training.config import TrainingError

    model = tformer.build_model("gpt-nano", vocab_size=32, max_seq_len=16)
    tformer.quantization.quantize(model, "int8")
    task = LanguageModelling(np.arange(200) % 32)
    trainer = Trainer(model, TrainingConfig(max_steps=1, batch_size=2, seq_len=16, threads=1), task,
                      out_dir=tmp_path / "run", progress=False)
    with pytest.raises(TrainingError, match=r"this model is quantized \(int8\)"):
        trainer.prepare_out_dir()
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


@pytest.mark.parametrize("args, message", [
    (["train", "RECIPE", "--quantize", "int8"],
     "tformer train: error: unrecognized arguments: --quantize int8; see tformer train --help"),
    (["train", "RECIPE", "--set"], "tformer train: error: argument --set: expected one argument; see tformer train "
                                   "--help"),
    (["quantize", "RECIPE", "--bits", "3", "--out", "x"],
     "tformer quantize: error: argument --bits: invalid choice: 3 (choose from 8, 4); see tformer quantize --help"),
])
def test_argument_errors_are_one_line_without_the_usage_block(recipe, capsys, args, message):
    args = [str(recipe) if arg == "RECIPE" else arg for arg in args]
    try:
        code = main(args)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    assert error_line(capsys) == message
