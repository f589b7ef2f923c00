"""The PYTHONPATH a test gives a child process: this checkout first, then whatever the parent's
PYTHONPATH already holds (a machine may keep extra packages there, as the GPU check does)."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child_python_path() -> str:
    """This checkout, then the parent's PYTHONPATH entries, joined for a child's environment."""
    inherited = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return os.pathsep.join([str(ROOT), *inherited])
