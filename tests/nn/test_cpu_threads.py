"""The CPU thread count a model command takes when the user names none (``tformer.cpu_threads``): measured once per
machine and width class and kept in a file, lowered to the free cores when the load average says the machine is
busy. The measurement and the load are injected: nothing here depends on this machine's load."""

import json

import pytest
import torch

from tformer.cpu_threads import MARGIN, ThreadChoice, choose_threads, step_seconds, width_class


class Steps:
    """A measurement: ``seconds[threads]`` per step, counting the calls."""

    def __init__(self, one: float, many: float) -> None:
        self.seconds = {1: one}
        self.many = many
        self.calls = []

    def __call__(self, threads: int, width: int) -> float:
        self.calls.append((threads, width))
        return self.seconds.get(threads, self.many)


def idle() -> float:
    return 0.0


def test_measured_once_per_width_class_and_kept(tmp_path):
    path = tmp_path / "cache" / "threads.json"
    faster_on_two = Steps(one=1.0, many=0.5)
    first = choose_threads(768, default=2, cpus=2, measure=faster_on_two, load=idle, path=path)
    assert first.threads == 2 and faster_on_two.calls == [(1, 512), (2, 512)]
    assert "2 CPU threads for models about 512 wide" in first.note and f"kept in {path}" in first.note
    again = choose_threads(600, default=2, cpus=2, measure=lambda *_: pytest.fail("measured twice"), load=idle,
                           path=path)
    assert again == ThreadChoice(2, None)  # the same class: read from the file, nothing to say
    kept = json.loads(path.read_text(encoding="utf-8"))
    assert [entry["threads"] for entry in kept["choices"].values()] == [2]
    assert [p.name for p in path.parent.iterdir()] == ["threads.json"]  # written whole: no temporary left


@pytest.mark.parametrize(("many", "threads"), [(MARGIN * 0.99, 2), (MARGIN * 1.01, 1), (7.0, 1)])
def test_more_threads_are_kept_only_when_clearly_faster(tmp_path, many, threads):
    choice = choose_threads(64, default=2, cpus=2, measure=Steps(one=1.0, many=many), load=idle,
                            path=tmp_path / "threads.json")
    assert choice.threads == threads


def test_a_busy_machine_computes_on_its_free_cores_and_says_so(tmp_path):
    path = tmp_path / "threads.json"
    choose_threads(64, default=4, cpus=4, measure=Steps(one=1.0, many=0.2), load=idle, path=path)  # kept: 4
    choice = choose_threads(64, default=4, cpus=4, load=lambda: 2.3, path=path)
    assert choice.threads == 2  # 4 CPUs, 2.3 of them in use
    assert choice.note.startswith("the machine is busy (load average 2.3 on 4 CPUs): computing with 2 threads, not 4")
    assert "--threads N" in choice.note
    assert choose_threads(64, default=4, cpus=4, load=lambda: 9.0, path=path).threads == 1  # never below 1
    assert choose_threads(64, default=4, cpus=4, load=lambda: 0.4, path=path) == ThreadChoice(4, None)


def test_a_measurement_taken_while_busy_is_used_but_not_kept(tmp_path):
    path = tmp_path / "threads.json"
    choice = choose_threads(64, default=2, cpus=2, measure=Steps(one=1.0, many=9.0), load=lambda: 1.8, path=path)
    assert choice.threads == 1 and "not kept: measured while the machine is busy" in choice.note
    assert not path.exists()


def test_one_thread_is_kept_without_measuring_or_reading_the_load(tmp_path):
    choice = choose_threads(64, default=1, cpus=2, measure=lambda *_: pytest.fail("measured"),
                            load=lambda: pytest.fail("load read"), path=tmp_path / "threads.json")
    assert choice == ThreadChoice(1, None)


def test_an_unreadable_file_is_measured_again_and_an_unwritable_one_said(tmp_path):
    path = tmp_path / "threads.json"
    path.write_text("{not json", encoding="utf-8")
    assert choose_threads(64, default=2, cpus=2, measure=Steps(1.0, 0.5), load=idle, path=path).threads == 2
    assert json.loads(path.read_text(encoding="utf-8"))["version"] == 1
    blocked = tmp_path / "a-file" / "threads.json"
    blocked.parent.write_text("", encoding="utf-8")  # its folder is a file: it cannot be written
    choice = choose_threads(64, default=2, cpus=2, measure=Steps(1.0, 0.5), load=idle, path=blocked)
    assert choice.threads == 2 and "cannot be written" in choice.note


def test_width_classes():
    assert [width_class(width) for width in (1, 32, 63, 64, 768, 1024, 4096)] == [32, 32, 32, 64, 512, 1024, 1024]


def test_the_step_is_timed_and_the_thread_count_restored():
    before = torch.get_num_threads()
    state = torch.get_rng_state()
    assert 0 < step_seconds(1, 32) < 1
    assert torch.get_num_threads() == before
    assert torch.equal(torch.get_rng_state(), state)  # a command's seeded sampling is not moved
