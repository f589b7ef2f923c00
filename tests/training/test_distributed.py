"""Several processes on CPU (gloo) through torchrun: DDP and FSDP with per-process batch b
match one process with batch 2b; checkpoints move between 2 processes and 1; a dead peer makes
the survivor exit with an error instead of hanging."""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest
from python_path import child_python_path

import tformer

pytestmark = pytest.mark.slow

RECIPE = """
[model]
max_seq_len = 16
d_model = 32
num_layers = 2
num_heads = 4
vocab_size = 48

[data]
train = "text.txt"

[training]
max_steps = 5
batch_size = 2
seq_len = 16
warmup_steps = 2
lr = 3e-3
eval_every = 5
eval_batches = 2
checkpoint_every = 5
dist_timeout_s = 60.0
device = "cpu"  # gloo on CPU, also on a machine with GPUs
"""


@pytest.fixture
def recipe(tmp_path):
    rng = random.Random(1)
    words = "to be or not to be that is the question whether tis nobler in the mind".split()
    (tmp_path / "text.txt").write_text(" ".join(rng.choice(words) for _ in range(3000)))
    path = tmp_path / "tiny.toml"
    path.write_text(RECIPE)
    return path


def environment():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": child_python_path()}


def train(recipe, out, *extra, processes=1):
    launcher = [sys.executable, "-m", "tformer"]
    if processes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
                    "-m", "tformer"]
    result = subprocess.run([*launcher, "train", str(recipe), "--out", str(out), "--no-progress", *extra],
                            capture_output=True, text=True, timeout=300, env=environment())
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def losses(run):
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (r["train_loss"], r.get("eval_loss")) for r in records}


def assert_close(a, b, tolerance=1e-5):
    assert a.keys() == b.keys()
    for step in a:
        for x, y in zip(a[step], b[step], strict=True):
            assert (x is None and y is None) or abs(x - y) <= tolerance, (step, a[step], b[step])


def test_two_processes_match_one_with_twice_the_batch_and_checkpoints_move_between_them(recipe, tmp_path):
    single = tmp_path / "single"
    train(recipe, single, "--set", "training.batch_size=4")
    ddp = tmp_path / "ddp"
    out = train(recipe, ddp, processes=2).stdout
    assert "2 processes" in out
    fsdp = tmp_path / "fsdp"
    train(recipe, fsdp, "--set", "training.distributed=fsdp", processes=2)
    assert len(losses(single)) == 5
    assert_close(losses(ddp), losses(single))
    assert_close(losses(fsdp), losses(single))

    # A 2-process checkpoint continues in 1 process, a 1-process one in 2, a sharded one sharded
    # (with the same global batch): the continuations agree.
    resumed_in_one = train(recipe, ddp, "--resume", "auto", "--set", "training.max_steps=7",
                           "--set", "training.batch_size=4")
    assert "resumed from step 5" in resumed_in_one.stdout
    resumed_in_two = train(recipe, single, "--resume", "auto", "--set", "training.max_steps=7", processes=2)
    assert "resumed from step 5" in resumed_in_two.stdout
    assert_close(losses(ddp), losses(single))
    resumed_sharded = train(recipe, fsdp, "--resume", "auto", "--set", "training.max_steps=7",
                            "--set", "training.distributed=fsdp", processes=2)
    assert "resumed from step 5" in resumed_sharded.stdout
    assert_close(losses(fsdp), losses(single))
    assert tformer.load(fsdp).config.d_model == 32
    assert tformer.load(ddp).config.d_model == 32


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_dead_peer_makes_the_survivor_exit_instead_of_hanging(recipe, tmp_path):
    recipe.write_text(RECIPE.replace("max_steps = 5", "max_steps = 100000").replace(
        "checkpoint_every = 5", "checkpoint_every = 10"))
    out = tmp_path / "run"
    port = str(free_port())
    processes = []
    for rank in (0, 1):
        env = {**environment(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2",
               "RANK": str(rank), "LOCAL_RANK": str(rank)}
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "tformer", "train", str(recipe), "--out", str(out), "--no-progress"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        ))
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoints" / "step-00000010").exists():
            assert time.monotonic() < deadline and processes[0].poll() is None, processes[0].communicate()
            time.sleep(0.2)
        processes[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = processes[0].communicate(timeout=90)  # bounded by dist_timeout_s = 60 at worst
        assert time.monotonic() - killed_at < 90
        assert processes[0].returncode not in (0, None)
        assert "lost the other processes" in stderr
        assert "Traceback" not in stderr
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
