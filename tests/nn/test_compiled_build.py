"""How the compiled CPU kernels are built (``nn/compiled.py``): one build folder per build command, a line on
stderr when a build starts or waits for another's, and no process left waiting on a build whose process was
killed. ninja and the compiler are stood in for (a build of the real kernels takes minutes): PyTorch's
``load_inline`` runs as it is, with its lock file, up to the compile and the import."""

import dataclasses
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.utils.cpp_extension as extension

from tformer.nn import compiled

# The stand-ins, for this process (monkeypatched) and for the processes the slow tests start (installed by SCRIPT).
STAND_INS = '''
import sys, time, types
from pathlib import Path

HANG = False  # the build never ends (a compile killed midway is one that had not ended)


def pretend_to_build(name, build_directory, **_):
    """ninja and the compiler: a marker that the build started, then an empty library."""
    Path(build_directory, "started").touch()
    if HANG:
        time.sleep(600)
    Path(build_directory, name + ".so").write_text("")


def pretend_to_import(name, path, is_python_module):
    return types.ModuleType(name)
'''
SCRIPT = STAND_INS + '''
import torch.utils.cpp_extension as extension
from tformer.nn import compiled

HANG = sys.argv[1] == "hang"
compiled.WAIT_SECONDS = float(sys.argv[2])
extension._write_ninja_file_and_build_library = pretend_to_build
extension._import_module_from_library = pretend_to_import
try:
    print("loaded", compiled.load().__name__, flush=True)
except compiled.CompiledKernelError as error:
    print("refused:", error, flush=True)
'''
BUILDING = "tformer: building the CPU kernels in "


def test_the_build_folder_is_named_by_everything_in_the_build_command():
    build = compiled.this_build()
    assert build.name == compiled.this_build().name and build.name.startswith("tformer_kernels_")
    other_checkout = (str(Path("/elsewhere/tformer/nn/kernels")), *build.include_paths[1:])
    variants = [dataclasses.replace(build, include_paths=other_checkout),
                dataclasses.replace(build, source=build.source + "\n"),
                dataclasses.replace(build, header=build.header + "\n"),
                dataclasses.replace(build, compile_flags=(*build.compile_flags, "-g")),
                dataclasses.replace(build, link_flags=()),
                dataclasses.replace(build, toolchain=build.toolchain + " 2")]
    assert len({build.name, *(variant.name for variant in variants)}) == 1 + len(variants)


@pytest.fixture
def stand_ins(monkeypatch, tmp_path):
    """A private extensions folder, the build and import stood in for, and a build of a name of this test's own
    (PyTorch remembers in-process which names it has built)."""
    names: dict = {}
    exec(STAND_INS, names)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(extension, "_write_ninja_file_and_build_library", names["pretend_to_build"])
    monkeypatch.setattr(extension, "_import_module_from_library", names["pretend_to_import"])
    return dataclasses.replace(compiled.this_build(), toolchain=f"test {tmp_path}")


def test_a_line_says_when_a_build_starts_and_none_when_the_build_is_there(stand_ins, tmp_path, capsys):
    compiled._build(stand_ins)
    assert capsys.readouterr().err == f"{BUILDING}{tmp_path / stand_ins.name} (once per machine and checkout, about " \
                                      "a minute)\n"
    assert (tmp_path / stand_ins.name / f"{stand_ins.name}.so").is_file()
    compiled._build(stand_ins)
    assert capsys.readouterr().err == ""


def test_a_live_build_of_another_process_is_waited_for_then_refused_in_one_line(stand_ins, tmp_path, capsys,
                                                                                 monkeypatch):
    folder = tmp_path / stand_ins.name
    folder.mkdir()
    monkeypatch.setattr(compiled, "WAIT_SECONDS", 0.3)
    with open(folder / compiled.LOCK, "a+") as holder:  # another open of the lock conflicts, even in this process
        fcntl.flock(holder, fcntl.LOCK_EX)
        holder.write("process 12345 on elsewhere")
        holder.flush()
        started = time.monotonic()
        with pytest.raises(compiled.CompiledKernelError, match=r"^process 12345 on elsewhere has been building the "
                           r"CPU kernels in .* for over 0 s; end that process .*TFORMER_COMPILED_KERNELS=0$"):
            compiled._build(stand_ins)
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"tformer: waiting for process 12345 on elsewhere, which is building the CPU kernels in {folder}"
    assert len(err) == 2 and not (folder / "started").exists()


def run_load(tmp_path: Path, *args: str, timeout: float = 120, wait: bool = True):
    """``compiled.load()`` in a process of its own with ``tmp_path`` as its extensions folder (SCRIPT's stand-ins)."""
    command = [sys.executable, "-c", SCRIPT, *args]
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "TFORMER_COMPILED_KERNELS": "1"}
    if not wait:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


def started_build(tmp_path: Path, process: subprocess.Popen) -> Path:
    """The folder in which ``process``'s build has started (its stand-in compile is running)."""
    deadline = time.monotonic() + 120
    while not (markers := list(tmp_path.glob("*/started"))):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.1)
    return markers[0].parent


@pytest.mark.slow
def test_a_build_killed_midway_is_started_again_by_the_next_process(tmp_path):
    builder = run_load(tmp_path, "hang", "900", wait=False)
    try:
        folder = started_build(tmp_path, builder)
    finally:
        builder.kill()
        builder.communicate()
    assert (folder / "lock").exists()  # PyTorch's lock, left by the killed build: PyTorch itself waits on it forever
    (folder / "started").unlink()
    after = run_load(tmp_path, "build", "900")  # a regression times out here instead of hanging the suite
    assert after.stdout.startswith("loaded tformer_kernels_"), after.stderr
    assert after.stderr.splitlines() == [
        f"tformer: a build of the CPU kernels in {folder} was cut short (its process is gone); starting it again",
        f"{BUILDING}{folder} (once per machine and checkout, about a minute)"]
    assert (folder / "started").exists() and not (folder / "lock").exists()


@pytest.mark.slow
def test_a_process_says_it_waits_for_a_live_build_and_ends_the_wait(tmp_path):
    builder = run_load(tmp_path, "hang", "900", wait=False)
    try:
        folder = started_build(tmp_path, builder)
        waiter = run_load(tmp_path, "build", "1")
    finally:
        builder.kill()
        builder.communicate()
    assert waiter.stderr.startswith(f"tformer: waiting for process {builder.pid} on "), waiter.stderr
    assert waiter.stdout.startswith(f"refused: process {builder.pid} on ")
    assert waiter.stdout.rstrip().endswith("set TFORMER_COMPILED_KERNELS=0") and str(folder) in waiter.stdout
