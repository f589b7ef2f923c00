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
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from tformer.adapters import lora_layers, save_adapter
from tformer.checkpoint import atomic_directory, write_files_into, write_model_files
from tformer.training import checkpoints, distributed, preflight, run_folder
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.reporting import Reporter, truncate_metrics

# The loop's counters a checkpoint holds, with their values at the start of a fresh run.
FRESH_COUNTERS = {"step": 0, "data_position": 0, "best_value": None, "best_step": None,
                  "evals_without_improvement": 0, "skipped_steps": 0, "elapsed_seconds": 0.0}


class NonFiniteState(TrainingError):
    """The weights or the optimizer's moments hold a NaN or Inf: such a state is never saved."""


class RunState:
    """Checkpoints of one run: its model, optimizer and grad scaler, written into ``out_dir``."""

    def __init__(self, model, optimizer, scaler, config: TrainingConfig, context: distributed.ProcessContext,
                 out_dir: Path | None) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.config, self.context, self.out_dir = config, context, out_dir
        self.lock = None if out_dir is None else run_folder.RunLock(out_dir)
        self.claimed = False  # the same on every process (the main one holds the lock)
        self.created_out_dir = False
        self.run_token: str | None = None  # set by prepare_out_dir (main process): its temporary names carry it
        # A model with LoRA adapters saves its best and final model as the adapter alone (PEFT's format), for the
        # base this names (its base_model_name_or_path); step checkpoints hold every weight, to resume from.
        self.adapter_base: str | None = None

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
        tied = self.model.tied_state_names()
        model_state = {name: tensor.detach().contiguous().cpu()
                       for name, tensor in get_model_state_dict(self.model, options=options).items()
                       if name not in tied}
        optimizer_state = get_optimizer_state_dict(self.model, self.optimizer, options=options) \
            if with_optimizer else None
        rng_states = distributed.all_gather_objects(capture_rng(), self.context) if with_rng else None
        return model_state, optimizer_state, rng_states

    # ---- writing ----------------------------------------------------------------------------------

    def claim(self) -> None:
        """Create the run folder if needed and take its lock (``run_folder.RunLock``) on the main
        process, before anything reads or writes the folder; kept until ``release``."""
        if self.out_dir is None or self.claimed:
            return

        def take() -> None:
            self.created_out_dir = not self.out_dir.exists()
            preflight.check_writable(self.out_dir)
            self.lock.acquire()

        self.on_main(take)
        self.claimed = True

    def release(self, abandon: bool = False) -> None:
        """Let go of the run folder; with ``abandon`` (nothing was trained), remove it again when
        this run created it and it holds nothing but the lock."""
        if self.lock is not None and self.lock.held:
            self.lock.release()
            if abandon and self.created_out_dir and not any(self.out_dir.iterdir()):
                self.out_dir.rmdir()
        self.claimed = False

    def prepare_out_dir(self, resumed: bool, overwrite: bool, step: int, restart: bool = False,
                        resumed_from: Path | None = None) -> list[str]:
        """Before the first step: enough disk, no debris of its own. A run resumed from its
        own folder keeps its metrics up to ``step``; a fresh one (or one resumed from another
        folder's ``resumed_from``) needs an empty folder, or ``restart`` (an unfinished run with no
        checkpoint to resume: its metrics are dropped), or ``overwrite`` (the old contents are
        moved into ``RUN.replaced-N``). Nothing is deleted. Returns lines to show the user."""
        def prepare() -> list[str]:
            out = self.out_dir
            preflight.check_disk_space(out, sum(p.numel() for p in self.model.parameters()))
            notes = []
            elsewhere = resumed_from is not None and out.resolve() not in resumed_from.resolve().parents
            if elsewhere and run_folder.contents(out):
                raise TrainingError(f"{out} is not empty ({run_folder.describe(run_folder.contents(out))}); a run "
                                    f"resumed from {resumed_from} starts in an empty output folder (or continue the "
                                    f"run in {out} with --resume auto)")
            token = None
            if resumed or restart:
                checkpoints.clean_debris(out)  # a run's own leftovers; a folder it did not write is left alone
                token = run_folder.run_token(out)
            elif run_folder.contents(out):
                existing = checkpoints.list_checkpoints(out)
                if overwrite:
                    moved = run_folder.move_aside(out)
                    notes.append(f"{out} was not empty: moved its contents to {moved} (nothing is deleted)")
                elif existing:
                    raise TrainingError(
                        f"{out} already holds a run (checkpoints up to step {existing[-1][0]}); resume it with "
                        f"--resume auto, choose another output folder, or pass --overwrite to move it to "
                        f"{out.resolve().name}.replaced-N beside it (nothing is deleted)"
                    )
                else:
                    names = run_folder.contents(out)
                    raise TrainingError(
                        f"{out} is not empty ({run_folder.describe(names)}) and holds no run to resume; choose "
                        f"another output folder, or pass --overwrite to move its contents to "
                        f"{out.resolve().name}.replaced-N beside it (nothing is deleted)"
                    )
            self.run_token = token or run_folder.new_run_token()  # kept on resume: its debris stays provably its own
            if resumed or restart:
                truncate_metrics(out, step, self.run_token)
            record = {**asdict(self.config), run_folder.RUN_TOKEN_KEY: self.run_token}
            (out / run_folder.TRAINING_CONFIG_NAME).write_text(json.dumps(record, indent=2) + "\n")
            return notes

        return self.on_main(prepare) or []

    def trainer_state(self, counters: dict, next_lr: float, units: str, units_per_step: int) -> dict:
        """The loop's own state: JSON, written last into a checkpoint."""
        config = self.config
        return {
            "step": counters["step"], "data_position": counters["data_position"],
            "world_size": self.context.world_size, f"{units}_seen": counters["step"] * units_per_step,
            "best_value": counters["best_value"], "best_step": counters["best_step"],
            "best_metric": config.early_stopping_metric,
            "evals_without_improvement": counters["evals_without_improvement"],
            "skipped_steps": counters["skipped_steps"], "elapsed_seconds": counters["elapsed_seconds"],
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

        # Checked before anything is written (the main process holds the gathered state; all learn the answer).
        nonfinite = distributed.all_gather_objects(
            self.on_main(lambda: first_nonfinite(model_state, optimizer_state)), self.context)[0]
        if nonfinite is not None:
            raise NonFiniteState(f"{nonfinite} is not finite after step {trainer_state['step']}")

        def write() -> None:
            rng_tensors = {}
            for rank, state in enumerate(rng_states):
                rng_tensors[f"rng/torch/{rank}"] = state.pop("torch")
                if "cuda" in state:
                    rng_tensors[f"rng/cuda/{rank}"] = state.pop("cuda")
            with self.writing(folder):
                if reporter is not None:
                    reporter.flush()
                checkpoints.write_checkpoint(folder, self.model.config, model_state, self.model.tokenizer,
                                             optimizer_state, {**trainer_state, "rng": rng_states}, rng_tensors,
                                             image_processor=self.image_processor, tag=self.run_token)
            checkpoints.remove_old_checkpoints(self.out_dir, self.config.keep_last, self.run_token)

        self.on_main(write)
        return folder

    def save_best(self, step: int, value: float) -> None:
        """checkpoints/best: the model at the best evaluation so far (a loadable model folder; a model with
        adapters: the adapter folder)."""
        adapted = self.adapted
        model_state, _, _ = (None, None, None) if adapted else self.gather(with_optimizer=False)

        def write() -> None:
            folder = self.out_dir / checkpoints.CHECKPOINTS_DIR / checkpoints.BEST_NAME
            with self.writing(folder), atomic_directory(folder, self.run_token) as temporary:
                if adapted:
                    self.save_adapter(temporary)
                else:
                    write_model_files(temporary, self.model.config, model_state, self.model.tokenizer,
                                      self.image_processor)
                (temporary / "best.json").write_text(json.dumps(
                    {"step": step, self.config.early_stopping_metric: value}) + "\n")

        self.on_main(write)

    @property
    def image_processor(self):
        """The model's image processing (a vision model's, saved beside its weights), or None."""
        return getattr(self.model, "image_processor", None)

    @property
    def adapted(self) -> bool:
        """Whether the model carries LoRA adapters (then its best and final models are the adapter alone)."""
        return bool(lora_layers(self.model))

    def save_adapter(self, folder: Path) -> None:
        """The model's adapter, in PEFT's format, into ``folder`` (main process)."""
        save_adapter(self.model, folder, base_model_name_or_path=self.adapter_base)

    def save_final_model(self) -> None:
        """The run folder itself becomes a model folder: config.json, model.safetensors, tokenizer; a model with
        adapters: adapter_config.json and adapter_model.safetensors (PEFT's format)."""
        if self.adapted:
            def write_adapter() -> None:
                with self.writing(self.out_dir / "adapter_model.safetensors"):
                    write_files_into(self.out_dir, self.save_adapter, tag=self.run_token)

            self.on_main(write_adapter)
            return
        model_state, _, _ = self.gather(with_optimizer=False)

        def write() -> None:
            with self.writing(self.out_dir / "model.safetensors"):
                write_files_into(self.out_dir, lambda folder: write_model_files(
                    folder, self.model.config, model_state, self.model.tokenizer, self.image_processor),
                    tag=self.run_token)

        self.on_main(write)

    @contextmanager
    def writing(self, path: Path):
        """A write whose failure (a full disk) becomes one line naming ``path`` and the free space;
        what was written before stays as it was (every write goes to a temporary name first)."""
        try:
            yield
        except OSError as error:
            try:
                free = f"{shutil.disk_usage(self.out_dir).free / 2**20:,.0f} MiB free there"
            except OSError:
                free = "free space unknown"
            newest = checkpoints.latest_checkpoint(self.out_dir)
            kept = f"; the newest checkpoint, {newest}, is intact" if newest else ""
            raise TrainingError(f"cannot write {path}: {error.strerror or error} ({free}){kept}") from None

    def set_aside_after(self, step: int) -> Path | None:
        """Checkpoints after ``step`` (their training went non-finite since) renamed aside on the
        main process; the newest checkpoint left, or None."""
        def set_aside() -> Path | None:
            checkpoints.set_aside_after(self.out_dir, step)
            return checkpoints.latest_checkpoint(self.out_dir)

        newest = self.on_main(set_aside)
        return distributed.all_gather_objects(newest, self.context)[0]

    # ---- restoring --------------------------------------------------------------------------------

    def resume(self, spec: str | Path = "auto") -> tuple[Path, dict, dict, list[str]] | None:
        """Restore weights, optimizer, grad scaler and this process's RNG states from a
        checkpoint: ``auto`` (this run folder's newest intact one, or None when there is none), a
        checkpoint folder, or a run folder. Returns the folder, the loop's counters
        (``FRESH_COUNTERS``' keys), the checkpoint's training settings and lines to show the user
        (a damaged checkpoint passed over)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        if self.out_dir is not None:
            self.on_main(lambda: checkpoints.clean_debris(self.out_dir))
        if str(spec) == "auto":
            candidates = [] if self.out_dir is None else \
                [folder for _, folder in reversed(checkpoints.list_checkpoints(self.out_dir))]
        else:
            candidates = [checkpoints.resolve_resume(spec, self.out_dir)]
        if not candidates:
            return None
        notes, damaged = [], []
        for folder in candidates:
            try:
                state, model_state, optimizer_entries, rng_tensors = checkpoints.read_checkpoint(folder)
                checkpoints.check_same_shape(folder, self.model.config)
                checkpoints.check_same_vocabulary(folder, getattr(self.model, "tokenizer", None))
                break
            except checkpoints.CorruptCheckpoint as error:
                if len(candidates) == 1:
                    raise
                damaged.append(str(error))
        else:
            raise TrainingError(f"--resume {spec}: no intact checkpoint in {self.out_dir}: " + "; ".join(damaged))
        if damaged:
            notes = [f"{reason}; resuming from the newest intact checkpoint, {folder}" for reason in damaged]
        expected = {n for n in self.model.state_dict() if n not in self.model.tied_state_names()}
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
        return folder, counters, state.get("training_config") or {}, notes


def changed_settings(saved: dict, config: TrainingConfig) -> list[str]:
    """``training.NAME old -> new`` for each training setting that differs from ``saved`` (a
    run's earlier settings, as ``asdict`` gives them)."""
    current = asdict(config)
    return [f"training.{name} {saved[name]!r} -> {value!r}" for name, value in current.items()
            if name in saved and saved[name] != value]


def first_nonfinite(model_state: dict[str, torch.Tensor], optimizer_state: dict | None) -> str | None:
    """The name of the first weight or optimizer moment holding a NaN or Inf, or None."""
    named = list(model_state.items())
    for name, entries in (optimizer_state or {}).get("state", {}).items():
        named += [(f"the optimizer's {key} of {name}", value) for key, value in entries.items()
                  if isinstance(value, torch.Tensor)]
    floats = [(name, tensor) for name, tensor in named if tensor.is_floating_point() and tensor.numel()]
    if not floats or bool(torch.stack([tensor.isfinite().all() for _, tensor in floats]).all()):
        return None
    return next(name for name, tensor in floats if not bool(tensor.isfinite().all()))


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
