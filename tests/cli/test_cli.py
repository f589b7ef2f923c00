"""The ``tformer`` command: help, demo, info, and one-line errors with exit code 2."""

import subprocess
import sys

import pytest

import tformer
from tformer.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tformer", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # runs the command line in a subprocess
def test_help_lists_the_commands():
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("demo", "info"):
        assert command in result.stdout


@pytest.mark.slow  # trains the demo: over 2 s
def test_demo_trains_saves_plots_and_samples(tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    out = tmp_path / "run"
    args = ["demo", "--steps", "30", "--out", str(out), "--data", str(data), "--sample-tokens", "20",
            "--model", "gpt-nano"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "unigram baseline" in printed and "sample" in printed
    assert {"config.json", "model.safetensors", "tokenizer.json", "metrics.jsonl", "loss_curve.png"} <= {
        p.name for p in out.iterdir()
    }
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = tformer.load(out)
    assert loaded.tokenizer is not None and loaded.config.positional == "rope"  # the demo's default


def test_info_prints_config_and_parameters(tmp_path, capsys):
    tformer.build_model("gpt-nano").save(tmp_path / "m")
    assert main(["info", str(tmp_path / "m")]) == 0
    printed = capsys.readouterr().out
    assert "DecoderLM" in printed and f"{tformer.build_model('gpt-nano').num_parameters():,}" in printed


@pytest.mark.slow  # runs the command line in a subprocess
@pytest.mark.parametrize(
    "args, message",
    [
        (["info", "/nonexistent/ckpt"], "not a checkpoint folder"),
        (["demo", "--steps", "0"], "--steps=0 must be a positive integer"),
        (["demo", "--model", "gpt5"], "unknown preset 'gpt5'"),
        (["demo", "--data", "/nonexistent.txt"], "/nonexistent.txt: no such file"),
    ],
)
def test_user_errors_are_one_line_with_exit_code_2(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
