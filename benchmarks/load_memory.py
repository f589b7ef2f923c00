"""What ``tformer.load`` costs in memory: the process's peak resident set (``ru_maxrss``) before and after loading a
model folder, in a fresh process, and the seconds it took.

    python benchmarks/load_memory.py FOLDER            # an existing model folder
    python benchmarks/load_memory.py FOLDER --write    # first write a random 946 MiB llama-small-shaped folder there
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_folder(folder: Path) -> None:
    """A random model of 248M float32 parameters (vocab 32,000, width 1,024, 12 layers, 16/4 heads, d_ff 4,096)."""
    import tformer

    tformer.build_model("llama-small", vocab_size=32000, d_model=1024, num_layers=12, num_heads=16, num_kv_heads=4,
                        d_ff=4096, max_seq_len=512).save(folder)


def measure(folder: Path) -> None:
    import torch  # noqa: F401  imported before the first reading: its libraries are not the load's

    import tformer
    from tformer import checkpoint  # noqa: F401  (tformer's exports are lazy)

    before = peak_mib()
    started = time.perf_counter()
    model = tformer.load(folder)
    took = time.perf_counter() - started
    weights = sum(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values()) / 2**20
    print(f"{weights:.0f} MiB of weights; peak resident set {before:.0f} MiB before the load, {peak_mib():.0f} MiB "
          f"after (+{peak_mib() - before:.0f}); {took:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--write", action="store_true", help="write the random folder first")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the fresh process's part
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.measure:
        measure(args.folder)
        return
    if args.write:
        write_folder(args.folder)
    subprocess.run([sys.executable, __file__, str(args.folder), "--measure"], check=True)


if __name__ == "__main__":
    main()
