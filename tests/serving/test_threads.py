"""``tformer serve``'s engine threads when the user gives no --threads: one core left to the HTTP process when a
measured decoding step makes so many tokens a second that streaming them needs a share of a core."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from python_path import child_python_path

import tformer
from tformer.serving.threads import BATCH, HTTP_SECONDS_PER_TOKEN, HTTP_SHARE, decode_step_seconds, engine_threads
from tformer.tokenizers import CharTokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_fast_step_leaves_a_core_and_a_slow_one_takes_them_all(two_threads):
    boundary = BATCH * HTTP_SECONDS_PER_TOKEN / HTTP_SHARE  # the step time whose tokens need HTTP_SHARE of a core
    threads, why = engine_threads(None, measure=lambda: boundary / 2)
    assert threads == 1 and "1 of 2 threads" in why and "left to the HTTP process" in why
    threads, why = engine_threads(None, measure=lambda: boundary * 2)
    assert threads == 2 and why.startswith("2 threads")
    assert torch.get_num_threads() == 2  # choosing sets nothing: the caller does


def test_one_thread_is_kept_without_measuring():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert engine_threads(None, measure=lambda: pytest.fail("measured"))[0] == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("max_seq_len", [128, 8, 2])  # room for the whole measurement, a shorter one, one step
def test_the_step_is_timed_on_a_real_model_within_its_context(max_seq_len):
    seconds = decode_step_seconds(tformer.build_model("gpt-nano", max_seq_len=max_seq_len).eval(), rounds=1)
    assert 0 < seconds < math.inf  # a time, not a failure (how long depends on the machine and its load)


@pytest.mark.parametrize("preset", ["transformer-multi30k", "whisper-digits"])
def test_the_step_of_an_encoder_decoder_and_a_speech_model_is_timed_from_its_own_inputs(preset):
    # tformer serve times a step when --threads is not given: a translator's and a speech model's too
    model = tformer.build_model(preset, vocab_size=40, d_model=32, num_heads=4, num_layers=1, d_ff=64).eval()
    assert 0 < decode_step_seconds(model, rounds=1) < math.inf


@pytest.mark.slow  # a server process
def test_serve_without_threads_says_what_its_engine_took(tmp_path):
    tokenizer = CharTokenizer.train("to be or not to be\n")
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size)
    model.tokenizer = tokenizer
    model.save(tmp_path / "tiny")
    process = subprocess.Popen([sys.executable, "-m", "tformer", "serve", str(tmp_path / "tiny"), "--port", "0"],
                               cwd=ROOT, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": child_python_path(), "OMP_NUM_THREADS": "2"})
    try:
        lines = []
        while not lines or "listening on http://" not in lines[-1]:
            line = process.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        chosen = [line for line in lines if "the engine runs" in line]
        assert len(chosen) == 1 and "tokens/s on 2 threads" in chosen[0], lines
    finally:
        process.kill()
        process.wait()
