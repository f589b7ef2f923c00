"""Training checkpoints that survive anything: a run folder's ``checkpoints/step-NNNNNNNN/``
holds the model (config.json, model.safetensors, tokenizer.json: ``tformer.load`` reads it),
the optimizer's state and the RNG states (optimizer.safetensors) and, written last,
trainer_state.json (step, data position, best metric, counters, Python and numpy RNG states).

Each checkpoint is written into a temporary folder and renamed into place, so a process killed
at any moment leaves only complete checkpoints (and temporary debris, named with the run's token,
that ``clean_debris`` removes). Tensors travel by safetensors, never by pickle. Optimizer state is keyed by
parameter name, so checkpoints move between 1 and N processes (DDP or FSDP).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from tformer.checkpoint import (
    CheckpointError,
    atomic_directory,
    load_attached_tokenizer,
    read_config,
    write_model_files,
)
from tformer.config import ModelConfig, field_default
from tformer.errors import TformerError
from tformer.training import run_folder
from tformer.training.config import TrainingError

CHECKPOINTS_DIR = "checkpoints"
BEST_NAME = "best"
STATE_NAME = "trainer_state.json"
OPTIMIZER_NAME = "optimizer.safetensors"
STATE_FORMAT = 1
STEP_PATTERN = re.compile(r"^step-(\d+)$")
NONFINITE_SUFFIX = ".nonfinite"  # a step folder set aside: training from its state went non-finite
# Fields a resumed run may change without changing any weight's shape.
SHAPE_FREE_FIELDS = ("dropout", "attention_dropout", "initializer_range")


class CorruptCheckpoint(TrainingError):
    """A checkpoint folder whose files cannot be read (truncated, overwritten, half deleted)."""


def step_folder(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR / f"step-{step:08d}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete step checkpoints of a run folder, oldest first."""
    folder = Path(run_dir) / CHECKPOINTS_DIR
    found = []
    if folder.is_dir():
        for entry in folder.iterdir():
            match = STEP_PATTERN.match(entry.name)
            if match and (entry / STATE_NAME).is_file():
                found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def resolve_resume(spec: str | Path, run_dir: Path | None) -> Path | None:
    """The checkpoint folder ``--resume`` names: ``auto`` (the run folder's newest complete
    checkpoint, or None when there is none yet), a checkpoint folder, or a run folder."""
    if str(spec) == "auto":
        return None if run_dir is None else latest_checkpoint(run_dir)
    folder = Path(spec)
    if (folder / STATE_NAME).is_file():
        return folder
    newest = latest_checkpoint(folder)
    if newest is None:
        raise TrainingError(f"--resume {spec}: no training checkpoint there (no {STATE_NAME}, no "
                            f"{CHECKPOINTS_DIR}/step-* folder)")
    return newest


def clean_debris(run_dir: Path) -> None:
    """Remove what a killed run left behind in its own folder (temporary checkpoint folders and
    files, folders half deleted by retention) and put back a folder caught between its two renames.
    Only names that carry the token of the run the folder holds (``run_folder.run_token``) are
    touched, in the folder and its checkpoints/: a folder that holds no run keeps everything."""
    token = run_folder.run_token(run_dir)
    if token is None:
        return
    for folder in (Path(run_dir), Path(run_dir) / CHECKPOINTS_DIR):
        if not folder.is_dir() or folder.is_symlink():
            continue
        for entry in sorted(folder.iterdir()):
            name = entry.name
            if not name.startswith("."):
                continue
            if name.endswith(f".old-{token}"):  # the old copy of NAME, renamed aside just before its replacement
                original = folder / name[1:-len(f".old-{token}")]
                if not original.exists():
                    os.replace(entry, original)
                    continue
            elif not (name.endswith((f".tmp-{token}", f".deleting-{token}")) or name.startswith(f".staging-{token}-")):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def set_aside_after(run_dir: Path, step: int) -> list[Path]:
    """Rename the step checkpoints after ``step`` to ``step-N.nonfinite`` (-2, -3 ... when taken),
    so ``--resume auto`` no longer picks them and nothing is deleted; returns their new paths."""
    moved = []
    for saved_step, folder in list_checkpoints(run_dir):
        if saved_step <= step:
            continue
        for number in range(1, 1000):
            target = folder.with_name(folder.name + NONFINITE_SUFFIX + (f"-{number}" if number > 1 else ""))
            if not target.exists():
                os.replace(folder, target)
                moved.append(target)
                break
    return moved


def remove_old_checkpoints(run_dir: Path, keep_last: int, token: str) -> None:
    """Keep the newest ``keep_last`` step checkpoints (all when 0). A folder is renamed away (to a
    name with the run's ``token``) before it is deleted, so an interrupted deletion never looks like
    a checkpoint and ``clean_debris`` finishes it."""
    if keep_last <= 0:
        return
    for _, folder in list_checkpoints(run_dir)[:-keep_last]:
        doomed = folder.parent / f".{folder.name}.deleting-{token}"
        os.replace(folder, doomed)
        shutil.rmtree(doomed, ignore_errors=True)


# ---- writing --------------------------------------------------------------------------------


def write_checkpoint(
    folder: Path, config: ModelConfig, model_state: dict[str, torch.Tensor], tokenizer,
    optimizer_state: dict | None, trainer_state: dict, rng_tensors: dict[str, torch.Tensor] | None = None,
    image_processor=None, tag: str | None = None,
) -> Path:
    """Write one checkpoint folder atomically (``tag``: see ``atomic_directory``). ``optimizer_state``
    is a full (unsharded) optimizer state dict keyed by parameter name; ``trainer_state`` must be
    JSON-serialisable."""
    with atomic_directory(folder, tag) as temporary:
        write_model_files(temporary, config, model_state, tokenizer, image_processor)
        if optimizer_state is not None:
            tensors, groups = flatten_optimizer_state(optimizer_state)
            tensors.update(rng_tensors or {})
            save_file(tensors, str(temporary / OPTIMIZER_NAME), metadata={"format": "pt"})
            trainer_state = {**trainer_state, "optimizer_param_groups": groups}
        state_text = json.dumps({"format": STATE_FORMAT, **trainer_state}, indent=1)
        (temporary / STATE_NAME).write_text(state_text + "\n")
    return folder


def flatten_optimizer_state(optimizer_state: dict) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """{"state": {name: {key: tensor}}, "param_groups": [...]} -> flat tensors named
    ``optimizer/NAME/KEY`` and JSON-ready parameter groups."""
    tensors: dict[str, torch.Tensor] = {}
    for name, entries in optimizer_state["state"].items():
        for key, value in entries.items():
            value = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            tensors[f"optimizer/{name}/{key}"] = value.detach().cpu().contiguous()
    groups = [{key: (list(value) if isinstance(value, tuple) else value) for key, value in group.items()}
              for group in optimizer_state["param_groups"]]
    return tensors, groups


# ---- reading --------------------------------------------------------------------------------


def read_checkpoint(folder: Path) -> tuple[dict, dict[str, torch.Tensor], dict, dict[str, torch.Tensor]]:
    """(trainer state, model weights, optimizer state {name: {key: tensor}}, RNG tensors)."""
    folder = Path(folder)
    try:
        trainer_state = json.loads((folder / STATE_NAME).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptCheckpoint(f"{folder}: not a readable training checkpoint ({STATE_NAME}: {error})") from None
    if not isinstance(trainer_state, dict) or not isinstance(trainer_state.get("step"), int):
        raise CorruptCheckpoint(f"{folder}: not a readable training checkpoint ({STATE_NAME} holds no step)")
    if trainer_state.get("format") != STATE_FORMAT:
        raise TrainingError(f"{folder}: {STATE_NAME} has format {trainer_state.get('format')!r}; "
                            f"this tformer reads format {STATE_FORMAT}")
    model_state = _read_tensors(folder / "model.safetensors")
    optimizer_state: dict[str, dict[str, torch.Tensor]] = {}
    rng_tensors: dict[str, torch.Tensor] = {}
    if (folder / OPTIMIZER_NAME).is_file():
        for key, tensor in _read_tensors(folder / OPTIMIZER_NAME).items():
            if key.startswith("optimizer/"):
                name, _, entry = key[len("optimizer/"):].rpartition("/")
                optimizer_state.setdefault(name, {})[entry] = tensor
            else:
                rng_tensors[key] = tensor
    return trainer_state, model_state, optimizer_state, rng_tensors


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as error:
        reason = getattr(error, "strerror", None) or str(error).splitlines()[0]
        raise CorruptCheckpoint(f"{path.parent}: not a readable training checkpoint ({path.name}: {reason})") from None


def check_same_vocabulary(folder: Path, tokenizer) -> None:
    """Refuse to resume when the data's tokenizer differs from the run's (the one saved in the
    checkpoint): the same ids would mean other tokens. Names the first token that differs."""
    if tokenizer is None or not hasattr(tokenizer, "fingerprint"):
        return
    try:
        saved = load_attached_tokenizer(folder)
    except (OSError, TformerError) as error:
        raise CorruptCheckpoint(f"{folder}: not a readable training checkpoint (tokenizer.json: "
                                f"{str(error).splitlines()[0]})") from None
    if saved is None or saved.fingerprint() == tokenizer.fingerprint():
        return
    advice = "train on the run's data (or its tokenizer), or start a new run folder"
    for token_id in range(max(saved.vocab_size, tokenizer.vocab_size)):
        before, now = saved.id_to_token(token_id), tokenizer.id_to_token(token_id)
        if before != now:
            raise TrainingError(f"cannot resume from {folder}: the data's vocabulary differs from the run's: token "
                                f"id {token_id} is {before!r} in the run and {now!r} in the data (the first "
                                f"difference; {saved.vocab_size} -> {tokenizer.vocab_size} tokens); {advice}")
    raise TrainingError(f"cannot resume from {folder}: the data's tokenizer has the run's tokens but other settings "
                        f"(normalisation, special tokens or post-processing); {advice}")


def check_same_shape(folder: Path, config: ModelConfig) -> None:
    """Refuse to resume when the recipe's model differs from the checkpoint's, naming fields."""
    try:
        saved = read_config(folder)
    except CheckpointError as error:
        raise CorruptCheckpoint(f"{folder}: not a readable training checkpoint ({error})") from None
    if not isinstance(saved, dict):
        raise CorruptCheckpoint(f"{folder}: not a readable training checkpoint (config.json is not a JSON object)")
    saved.pop("tformer_format", None)
    current = config.to_dict()
    for name in set(current) - set(saved):  # a field added since the checkpoint was written: its default
        default = field_default(ModelConfig, name)
        saved[name] = list(default) if isinstance(default, tuple) else default
    differing = [
        f"{name} {saved.get(name)!r} -> {current.get(name)!r}"
        for name in sorted(set(saved) | set(current))
        if name not in SHAPE_FREE_FIELDS and saved.get(name) != current.get(name)
    ]
    if differing:
        raise TrainingError(
            f"cannot resume from {folder}: the recipe changes the model ({'; '.join(differing)}); "
            "resume with the checkpoint's model settings or start a new run folder"
        )
