"""Commands that load a model choose their CPU threads in one place (``model_source.load_model``, through
``tformer.cpu_threads``) when neither ``--threads`` nor OMP_NUM_THREADS names a count; a named count is never
changed. The measurement and the load average are injected: nothing here depends on this machine's load, and
the commands run on one thread (two spin-waiting threads on a busy machine can take minutes)."""

import pytest
import torch

import tformer
import tformer.cpu_threads as cpu_threads
from tformer.cli import build_parser, main, model_source
from tformer.tokenizers import CharTokenizer

TEXT = "to be or not to be, that is the question.\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("threads") / "tiny"
    tokenizer = CharTokenizer.train(TEXT)
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size)
    model.tokenizer = tokenizer
    model.save(folder)
    return folder


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A 4-CPU machine where PyTorch would take 2 threads and no OMP_NUM_THREADS is set; ``machine.load`` is its
    load average, ``machine.steps`` the measured step seconds by thread count."""

    class Machine:
        load = 0.0
        steps = {1: 0.5, 2: 1.0}
        measured = []

    def measure(threads, width):
        Machine.measured.append(threads)
        return Machine.steps[threads]

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_threads, "cache_file", lambda: tmp_path / "cache" / "threads.json")  # not XDG_CACHE_HOME:
    # torch's compiled kernels are kept there too, and would be built again
    monkeypatch.setattr(cpu_threads, "available_cpus", lambda: 4)
    monkeypatch.setattr(cpu_threads, "step_seconds", measure)
    monkeypatch.setattr(cpu_threads, "load_average", lambda: Machine.load)
    monkeypatch.setattr(model_source, "CHOSEN_THREADS", [])
    yield Machine
    torch.set_num_threads(before)


def generate(folder, *extra):
    return main(["generate", str(folder), "--prompt", "to be", "--max-new-tokens", "3", *extra])


def test_generate_measures_once_and_keeps_the_faster_count(folder, machine, capsys, tmp_path):
    assert generate(folder) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "CPU thread" in line]
    assert notes == [notes[0]] and notes[0].startswith("tformer generate: 1 CPU thread for models about 32 wide")
    assert torch.get_num_threads() == 1 and machine.measured == [1, 2]
    assert (tmp_path / "cache" / "threads.json").is_file()
    model_source.CHOSEN_THREADS.clear()  # a new process
    torch.set_num_threads(2)
    machine.steps = {1: 1.0, 2: 0.1}  # were it measured again, 2 would win: it is not
    assert generate(folder) == 0
    assert "CPU thread" not in capsys.readouterr().err and torch.get_num_threads() == 1
    assert machine.measured == [1, 2]


def test_a_busy_machine_is_said_in_one_line(folder, machine, capsys):
    machine.load, machine.steps = 3.5, {1: 1.0, 2: 0.5}  # of 4 CPUs; measured, 2 threads would win
    assert generate(folder) == 0
    busy = [line for line in capsys.readouterr().err.splitlines() if "busy" in line]
    assert busy == ["tformer generate: the machine is busy (load average 3.5 on 4 CPUs): computing with 1 thread, "
                    "not 2, since more would wait for each other (--threads N to choose)"]
    assert torch.get_num_threads() == 1


def test_threads_given_are_never_changed(folder, machine, capsys, monkeypatch):
    monkeypatch.setattr(cpu_threads, "step_seconds", lambda *_: pytest.fail("measured"))
    monkeypatch.setattr(cpu_threads, "load_average", lambda: pytest.fail("load read"))
    assert generate(folder, "--threads", "1") == 0
    assert "thread" not in capsys.readouterr().err and torch.get_num_threads() == 1


# Each command's arguments besides the model (parsing reads no file).
COMMANDS = {"generate": [], "translate": ["--input", "x.txt"], "transcribe": ["x.wav"], "evaluate": [],
            "classify": ["x.png"], "predict": [], "attention": ["--text", "x"], "serve": []}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_model_command_chooses_unless_a_count_is_named(folder, machine, monkeypatch, command):
    def source(*extra):
        args = build_parser().parse_args([command, str(folder), *COMMANDS[command], *extra])
        args.prepare(args)
        return args.model_source

    assert source().choose_threads == command
    assert source("--threads", "1").choose_threads is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the environment names a count
    assert source().choose_threads is None


def test_a_draft_keeps_the_targets_count(folder, machine, capsys):
    assert generate(folder, "--draft", str(folder), "--num-draft-tokens", "2") == 0
    assert len([line for line in capsys.readouterr().err.splitlines() if "CPU thread" in line]) == 1
    assert machine.measured == [1, 2]
