"""Checkpoints that survive anything: a run SIGKILLed at several moments (mid-step, mid-
checkpoint-write, mid-retention, mid-final-write, at a random time) and resumed each time
ends with weights bitwise identical to an uninterrupted run; Ctrl-C saves and exits cleanly."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from python_path import child_python_path
from safetensors.torch import load_file

import tformer

pytestmark = pytest.mark.slow

RECIPE = """
[model]
max_seq_len = 16
d_model = 32
num_layers = 2
num_heads = 4
vocab_size = 48
dropout = 0.1

[data]
train = "text.txt"

[training]
max_steps = {max_steps}
batch_size = 4
seq_len = 16
warmup_steps = 4
lr = 3e-3
eval_every = 6
eval_batches = 2
checkpoint_every = {checkpoint_every}
keep_last = 2
deterministic = true
"""

# Runs the CLI after arranging for this process to SIGKILL itself at the moment KILL_AT names:
#   forward:N      during the N-th forward pass's loss (training or evaluation)
#   optimizer:N    after the N-th checkpoint's optimizer.safetensors is written, before the
#                  trainer state and the rename that makes the checkpoint visible
#   retention:N    halfway through deleting an old checkpoint (the N-th deletion)
#   final:1        after the final model files are staged, before they are renamed into place
KILL_DRIVER = r"""
import os, shutil, signal, sys
point, count = os.environ["KILL_AT"].split(":")
count = int(count)
calls = [0]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def on_call(original, before=False):
    def wrapper(*args, **kwargs):
        calls[0] += 1
        if before and calls[0] == count:
            die()
        result = original(*args, **kwargs)
        if calls[0] == count:
            die()
        return result
    return wrapper

import tformer.training.checkpoints as checkpoints
import tformer.training.state as state
import tformer.training.tasks.lm as lm

if point == "forward":
    lm.LanguageModelling.loss = on_call(lm.LanguageModelling.loss)
elif point == "optimizer":
    checkpoints.save_file = on_call(checkpoints.save_file)
elif point == "retention":
    real_rmtree = shutil.rmtree
    def rmtree(path, *args, **kwargs):
        if ".deleting-" in os.path.basename(str(path)):
            calls[0] += 1
            if calls[0] == count:
                files = sorted(p for p in os.listdir(path))
                os.remove(os.path.join(path, files[0]))
                die()
        return real_rmtree(path, *args, **kwargs)
    shutil.rmtree = rmtree
elif point == "final":
    real_write_files_into = state.write_files_into
    def write_files_into(target, write, **options):
        def write_then_die(folder):
            write(folder)
            die()
        return real_write_files_into(target, write_then_die, **options)
    state.write_files_into = write_files_into

from tformer.cli import main
sys.exit(main(sys.argv[1:]))
"""


def make_run_folder(tmp_path, max_steps=24, checkpoint_every=3):
    rng = random.Random(0)
    words = "the quick brown fox jumps over a lazy dog while rain falls on distant hills".split()
    (tmp_path / "text.txt").write_text(" ".join(rng.choice(words) for _ in range(4000)))
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(RECIPE.format(max_steps=max_steps, checkpoint_every=checkpoint_every))
    return recipe


def environment():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": child_python_path()}


def train(recipe, out, *extra, kill_at=None, timeout=240):
    command = [sys.executable, "-m", "tformer", "train", str(recipe), "--out", str(out), "--no-progress", *extra]
    env = environment()
    if kill_at:
        command = [sys.executable, "-c", KILL_DRIVER, "train", str(recipe), "--out", str(out), "--no-progress",
                   *extra]
        env["KILL_AT"] = kill_at
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def latest_checkpoint_step(run) -> int:
    """The step of the newest complete checkpoint folder in ``run`` (-1 when there is none)."""
    folder = run / "checkpoints"
    steps = [int(p.name[5:]) for p in folder.glob("step-*")] if folder.is_dir() else []
    return max(steps, default=-1)


def wait_until(condition, what, process, timeout=120.0):
    """Poll ``condition`` until it holds; fail loudly, with the run's output, when ``process``
    exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            stdout, stderr = process.communicate()
            raise AssertionError(f"the run exited ({process.returncode}) before {what}\n{stdout}\n{stderr}")
        if time.monotonic() > deadline:
            process.kill()
            stdout, stderr = process.communicate()
            raise AssertionError(f"no {what} after {timeout:.0f} s\n{stdout}\n{stderr}")
        time.sleep(0.05)


def final_weights(run):
    return load_file(str(run / "model.safetensors"))


def test_sigkill_at_any_moment_then_resume_is_bitwise_identical(tmp_path):
    recipe = make_run_folder(tmp_path)
    reference = train(recipe, tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr

    run = tmp_path / "run"
    # forward passes: 6 training steps (one each) + an evaluation (one, 2 batches together) ... the 9th is mid-step 8
    plan = ["optimizer:2", "retention:1", "forward:9", "outside", "final:1"]
    resumed_steps = []
    for index, kill_at in enumerate(plan):
        extra = ["--resume", "auto"] if index else []
        if kill_at == "outside":  # a SIGKILL from another process, as soon as a (seeded) random checkpoint exists
            target = random.Random(0).choice([18, 21])
            process = subprocess.Popen(
                [sys.executable, "-m", "tformer", "train", str(recipe), "--out", str(run), "--no-progress", *extra],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(),
            )
            wait_until(lambda step=target: latest_checkpoint_step(run) >= step, f"checkpoint of step {target}", process)
            process.send_signal(signal.SIGKILL)  # it lands wherever the run has got to by now
            stdout, _ = process.communicate(timeout=60)
            assert process.returncode in (-signal.SIGKILL, 0)  # 0: it landed after the end
            resumed_steps.append(int(stdout.split("resumed from step ")[1].split()[0]))
            continue
        killed = train(recipe, run, *extra, kill_at=kill_at)
        assert killed.returncode == -signal.SIGKILL, (kill_at, killed.stdout, killed.stderr)
        if index:
            assert "resumed from step" in killed.stdout
            resumed_steps.append(int(killed.stdout.split("resumed from step ")[1].split()[0]))

    finished = train(recipe, run, "--resume", "auto")
    assert finished.returncode == 0, finished.stderr
    assert "resumed from step" in finished.stdout
    assert resumed_steps == sorted(resumed_steps) and resumed_steps[0] > 0

    expected, actual = final_weights(tmp_path / "reference"), final_weights(run)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    # The metrics of the stitched run match the uninterrupted one, step for step, once each.
    def losses(folder):
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["train_loss"], r.get("eval_loss")) for r in records]

    assert losses(run) == losses(tmp_path / "reference")
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    assert tformer.load(run).tokenizer is not None


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    recipe = make_run_folder(tmp_path, max_steps=100000, checkpoint_every=5)
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "tformer", "train", str(recipe), "--out", str(run), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(),
    )
    wait_until(lambda: latest_checkpoint_step(run) >= 5, "checkpoint of step 5", process)  # well into training
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    step = int(stdout.split("interrupted at step ")[1].split(":")[0])
    assert 5 <= step < 100000
    assert (run / "checkpoints" / f"step-{step:08d}" / "trainer_state.json").is_file()
    assert tformer.load(run).config.d_model == 32

    resumed = subprocess.run(  # the run folder alone is enough: its recipe.toml is used
        [sys.executable, "-m", "tformer", "train", "--resume", str(run), "--no-progress",
         "--set", f"training.max_steps={step + 2}"], capture_output=True, text=True, timeout=240, env=environment(),
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from step {step}" in resumed.stdout
    assert "completed at step" in resumed.stdout
