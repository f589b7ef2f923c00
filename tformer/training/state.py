"""A run's state on disk: what a checkpoint holds (weights, optimizer, grad scaler, the loop's
counters, every process's RNG states), writing it (step checkpoints, the best model, the final
model) and restoring it exactly, so a resumed run ends bitwise where an uninterrupted one would.

Every process takes part in gathering the state (FSDP gathers shards; each process has its own
RNG states); only the main process writes. ``RunState.on_main`` is the one place a write is
guarded and ``RunState.gather`` the one place state is gathered.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from tformer.checkpoint import atomic_directory, write_files_into, write_model_files
from tformer.training import checkpoints, distributed, preflight
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.reporting import METRICS_NAME, Reporter, truncate_metrics

# The loop's counters a checkpoint holds, with their values at the start of a fresh run.
FRESH_COUNTERS = {"step": 0, "data_position": 0, "best_value": None, "best_step": None,
                  "evals_without_improvement": 0, "skipped_steps": 0}


class RunState:
    """Checkpoints of one run: its model, optimizer and grad scaler, written into ``out_dir``."""

    def __init__(self, model, optimizer, scaler, config: TrainingConfig, context: distributed.ProcessContext,
                 out_dir: Path | None) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.config, self.context, self.out_dir = config, context, out_dir

    def on_main(self, action):
        """Run ``action()`` (a write) on the main process; the others wait and fail with it."""
        return distributed.on_main_process(action, self.context)

    def gather(self, with_optimizer: bool = True, with_rng: bool = False) -> tuple[dict, dict | None, list | None]:
        """Unsharded weights (tied copies left out), the optimizer state keyed by parameter name
        (or None) and every process's RNG states in rank order (or None), on CPU. Every process
        must call this."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        tied = self.model.tied_parameters()
        model_state = {name: tensor.detach().contiguous().cpu()
                       for name, tensor in get_model_state_dict(self.model, options=options).items()
                       if name not in tied}
        optimizer_state = get_optimizer_state_dict(self.model, self.optimizer, options=options) \
            if with_optimizer else None
        rng_states = distributed.all_gather_objects(capture_rng(), self.context) if with_rng else None
        return model_state, optimizer_state, rng_states

    # ---- writing ----------------------------------------------------------------------------------

    def prepare_out_dir(self, resumed: bool, overwrite: bool, step: int) -> None:
        """Before the first step: writable folder, enough disk, no debris, no stale run (a
        resumed run keeps its metrics up to ``step``)."""
        def prepare() -> None:
            out = self.out_dir
            preflight.check_writable(out)
            preflight.check_disk_space(out, sum(p.numel() for p in self.model.parameters()))
            checkpoints.clean_debris(out)
            if resumed:
                truncate_metrics(out, step)
            else:
                existing = checkpoints.list_checkpoints(out)
                if existing and not overwrite:
                    raise TrainingError(
                        f"{out} already holds a run (checkpoints up to step {existing[-1][0]}); "
                        "resume it with --resume auto, or choose another output folder"
                    )
                for stale in (out / checkpoints.CHECKPOINTS_DIR, out / "tensorboard"):
                    if stale.is_dir():
                        shutil.rmtree(stale)
                (out / METRICS_NAME).unlink(missing_ok=True)
            (out / "training_config.json").write_text(json.dumps(asdict(self.config), indent=2) + "\n")

        self.on_main(prepare)

    def trainer_state(self, counters: dict, next_lr: float, units: str, units_per_step: int) -> dict:
        """The loop's own state: JSON, written last into a checkpoint."""
        config = self.config
        return {
            "step": counters["step"], "data_position": counters["data_position"],
            "world_size": self.context.world_size, f"{units}_seen": counters["step"] * units_per_step,
            "best_value": counters["best_value"], "best_step": counters["best_step"],
            "best_metric": config.early_stopping_metric,
            "evals_without_improvement": counters["evals_without_improvement"],
            "skipped_steps": counters["skipped_steps"],
            "scheduler": {"schedule": config.schedule, "lr": config.lr, "min_lr": config.min_lr,
                          "warmup_steps": config.warmup_steps, "max_steps": config.max_steps, "next_lr": next_lr},
            "grad_scaler": None if self.scaler is None else self.scaler.state_dict(),
            "training_config": asdict(config),
        }

    def save_checkpoint(self, trainer_state: dict, reporter: Reporter | None) -> Path:
        """Write checkpoints/step-N atomically and apply retention (``trainer_state``: see
        ``trainer_state``)."""
        model_state, optimizer_state, rng_states = self.gather(with_optimizer=True, with_rng=True)
        folder = checkpoints.step_folder(self.out_dir, trainer_state["step"])

        def write() -> None:
            if reporter is not None:
                reporter.flush()
            rng_tensors = {}
            for rank, state in enumerate(rng_states):
                rng_tensors[f"rng/torch/{rank}"] = state.pop("torch")
                if "cuda" in state:
                    rng_tensors[f"rng/cuda/{rank}"] = state.pop("cuda")
            try:
                checkpoints.write_checkpoint(folder, self.model.config, model_state, self.model.tokenizer,
                                             optimizer_state, {**trainer_state, "rng": rng_states}, rng_tensors)
            except OSError as error:
                raise TrainingError(f"cannot write checkpoint {folder}: {error.strerror or error}") from None
            checkpoints.remove_old_checkpoints(self.out_dir, self.config.keep_last)

        self.on_main(write)
        return folder

    def save_best(self, step: int, value: float) -> None:
        """checkpoints/best: the model at the best evaluation so far (a loadable model folder)."""
        model_state, _, _ = self.gather(with_optimizer=False)

        def write() -> None:
            folder = self.out_dir / checkpoints.CHECKPOINTS_DIR / checkpoints.BEST_NAME
            with atomic_directory(folder) as temporary:
                write_model_files(temporary, self.model.config, model_state, self.model.tokenizer)
                (temporary / "best.json").write_text(json.dumps(
                    {"step": step, self.config.early_stopping_metric: value}) + "\n")

        self.on_main(write)

    def save_final_model(self) -> None:
        """The run folder itself becomes a model folder: config.json, model.safetensors, tokenizer."""
        model_state, _, _ = self.gather(with_optimizer=False)
        self.on_main(lambda: write_files_into(self.out_dir, lambda folder: write_model_files(
            folder, self.model.config, model_state, self.model.tokenizer)))

    # ---- restoring --------------------------------------------------------------------------------

    def resume(self, spec: str | Path = "auto") -> tuple[Path, dict] | None:
        """Restore weights, optimizer, grad scaler and this process's RNG states from a
        checkpoint: ``auto`` (this run folder's newest, or None when there is none), a checkpoint
        folder, or a run folder. Returns the folder and the loop's counters (``FRESH_COUNTERS``' keys)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        if self.out_dir is not None:
            self.on_main(lambda: checkpoints.clean_debris(self.out_dir))
        folder = checkpoints.resolve_resume(spec, self.out_dir)
        if folder is None:
            return None
        checkpoints.check_same_shape(folder, self.model.config)
        state, model_state, optimizer_entries, rng_tensors = checkpoints.read_checkpoint(folder)
        expected = {n for n in self.model.state_dict() if n not in self.model.tied_parameters()}
        if set(model_state) != expected:
            raise TrainingError(f"{folder}: the weights do not match the model "
                                f"(missing: {sorted(expected - set(model_state))[:5]}, "
                                f"unexpected: {sorted(set(model_state) - expected)[:5]})")
        options = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(self.model, model_state, options=options)
        if optimizer_entries:
            groups = get_optimizer_state_dict(self.model, self.optimizer, options=options)["param_groups"]
            set_optimizer_state_dict(self.model, self.optimizer, {"state": optimizer_entries, "param_groups": groups},
                                     options=options)
        if self.scaler is not None and state.get("grad_scaler"):
            self.scaler.load_state_dict(state["grad_scaler"])
        rank = self.context.rank
        if not restore_rng(state.get("rng") or [], rng_tensors, rank, self.context.device):
            seed_random_generators(self.config.seed + rank + 7919 * state["step"])
        counters = {name: state.get(name, fresh) for name, fresh in FRESH_COUNTERS.items()}
        counters["step"], counters["data_position"] = state["step"], state["data_position"]
        return folder, counters


# ---- random number generators ---------------------------------------------------------------------


def seed_random_generators(seed: int) -> None:
    """Seed Python's, numpy's and torch's generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed % 2**64)


def capture_rng() -> dict:
    """This process's RNG states: Python and numpy as JSON, torch as uint8 tensors."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state = {"python": [version, list(internal), gauss],
             "numpy": [kind, keys.tolist(), int(position), int(has_gauss), float(cached)],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(saved: list[dict], tensors: dict[str, torch.Tensor], rank: int, device: torch.device) -> bool:
    """Put back ``rank``'s RNG states from a checkpoint; False when it holds none for this rank
    (a checkpoint from fewer processes)."""
    if rank >= len(saved) or f"rng/torch/{rank}" not in tensors:
        return False
    python_state = saved[rank]["python"]
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    kind, keys, position, has_gauss, cached = saved[rank]["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
    torch.set_rng_state(tensors[f"rng/torch/{rank}"])
    if f"rng/cuda/{rank}" in tensors and device.type == "cuda":
        torch.cuda.set_rng_state(tensors[f"rng/cuda/{rank}"], device)
    return True
