"""Reading the weights of a Hugging Face checkpoint folder, without ever unpickling code.

Looked for in Hugging Face's order of preference: ``model.safetensors``, sharded safetensors
(``model.safetensors.index.json``), ``pytorch_model.bin``, sharded ``.bin`` files
(``pytorch_model.bin.index.json``). ``.bin`` files are read with ``torch.load(weights_only=True)``,
which accepts tensors and plain containers only.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from torch import Tensor

from tformer.checkpoint import CheckpointError, read_safetensors

SAFETENSORS_NAME = "model.safetensors"
SAFETENSORS_INDEX_NAME = "model.safetensors.index.json"
PYTORCH_NAME = "pytorch_model.bin"
PYTORCH_INDEX_NAME = "pytorch_model.bin.index.json"
WEIGHT_FILE_NAMES = (SAFETENSORS_NAME, SAFETENSORS_INDEX_NAME, PYTORCH_NAME, PYTORCH_INDEX_NAME)


def read_hf_weights(folder: Path) -> tuple[dict[str, Tensor], str]:
    """All tensors of the checkpoint in ``folder`` (on the CPU), and the file they came from."""
    for name in WEIGHT_FILE_NAMES:
        path = folder / name
        if path.is_file():
            state = _read_index(path) if name.endswith(".index.json") else _read_weight_file(path)
            return state, str(path)
    raise CheckpointError(f"{folder}: no weights (looked for {', '.join(WEIGHT_FILE_NAMES)})")


def _read_weight_file(path: Path) -> dict[str, Tensor]:
    """One safetensors or ``.bin`` file."""
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(
            f"{path}: refused or unreadable; only plain tensor files load (weights_only=True): {first_line}"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(t, Tensor) for t in state.values()):
        raise CheckpointError(f"{path}: not a state dict of tensors")
    return state


def _read_index(index_path: Path) -> dict[str, Tensor]:
    """The tensors of a sharded checkpoint, each taken from the shard its index names."""
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise CheckpointError(f"{index_path}: not a checkpoint index with a weight_map ({error})") from None
    by_shard: dict[str, list[str]] = {}
    for tensor_name, shard_name in weight_map.items():
        by_shard.setdefault(shard_name, []).append(tensor_name)
    state: dict[str, Tensor] = {}
    for shard_name, tensor_names in sorted(by_shard.items()):
        shard_path = index_path.parent / shard_name
        if Path(shard_name).name != shard_name or not shard_path.is_file():
            raise CheckpointError(f"{index_path}: names shard {shard_name!r}, which is not a file in the folder")
        shard = _read_weight_file(shard_path)
        for tensor_name in tensor_names:
            if tensor_name not in shard:
                raise CheckpointError(f"{index_path}: {tensor_name} is not in its shard {shard_name}")
            state[tensor_name] = shard[tensor_name]
    return state
