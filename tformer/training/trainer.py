"""The training loop: one loop from a laptop CPU to many GPUs under torchrun.

Per step: learning rate from the schedule (a pure function of the step), ``grad_accum_steps``
micro-batches (random crops that are a pure function of seed and position, this process's rows
of the global batch), autocast, backward, one all-reduce of the loss (and of a stop request, so
every process agrees), a NaN/Inf check, gradient clipping, the AdamW step. Then evaluation,
best / step checkpoints, early stopping, Ctrl-C, as the config asks. ``resume`` restores the
exact state of a checkpoint, so a resumed run ends bitwise where an uninterrupted one would.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from tformer.checkpoint import atomic_directory, write_files_into, write_model_files
from tformer.data.lm import num_tokens, random_crops, spaced_windows
from tformer.nn.losses import token_cross_entropy
from tformer.training import checkpoints, distributed, preflight
from tformer.training.config import HIGHER_IS_BETTER, TrainingConfig, TrainingError
from tformer.training.optim import build_optimizer
from tformer.training.reporting import METRICS_NAME, Reporter, truncate_metrics
from tformer.training.schedules import learning_rate
from tformer.training.signals import StopRequest
from tformer.training.threads import ThreadTuner

__all__ = ["Trainer", "TrainingConfig", "TrainingError", "TrainingResult"]

EVAL_LOGITS_BUDGET = 2**24  # floats of logits per evaluation forward pass (64 MiB)


def native_bf16_matmul() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (oneDNN with AVX512-BF16 or AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@dataclass
class TrainingResult:
    """What a finished (or stopped) run reports. ``stopped``: completed, interrupted,
    early_stopping."""

    steps: int
    final_train_loss: float
    final_eval_loss: float | None
    seconds: float
    tokens_per_second: float
    history: list[dict] = field(default_factory=list)
    stopped: str = "completed"
    best_eval: float | None = None
    best_step: int | None = None
    checkpoint: Path | None = None
    start_step: int = 0


@dataclass
class StepOutcome:
    """One optimisation step as every process agrees on it."""

    loss: float
    lr: float
    grad_norm: float
    finite: bool
    stop_requested: bool


class Trainer:
    """Trains a language model on random crops of a token sequence.

    ``train_tokens`` / ``eval_tokens``: 1-D token ids (tensor, list, or numpy array, a memory
    map too). With ``out_dir`` the run writes metrics.jsonl, checkpoints/step-N (every
    ``checkpoint_every`` steps and at the end), checkpoints/best and, at the end, the model
    itself into ``out_dir`` (config.json, model.safetensors, tokenizer.json), so
    ``tformer.load(out_dir)`` works. ``overwrite`` lets a fresh run replace an old run's
    checkpoints in ``out_dir``; otherwise that is an error (resume it instead).
    """

    def __init__(self, model, config: TrainingConfig, train_tokens, eval_tokens=None,
                 out_dir: str | Path | None = None, progress: bool = True, *, overwrite: bool = False) -> None:
        self.config = config
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.progress = progress
        self.overwrite = overwrite
        self.context = distributed.join_process_group(config.device, config.dist_timeout_s)
        self.train_tokens = _as_tokens(train_tokens)
        self.eval_tokens = None if eval_tokens is None else _as_tokens(eval_tokens)
        self.seq_len = config.seq_len or model.config.max_seq_len
        if model.position_limit is not None and self.seq_len > model.position_limit:
            raise TrainingError(
                f"training.seq_len={self.seq_len} exceeds the model's max_seq_len={model.config.max_seq_len}"
            )
        for name, tokens in (("training", self.train_tokens), ("evaluation", self.eval_tokens)):
            if tokens is not None and num_tokens(tokens) < self.seq_len + 2:
                raise TrainingError(f"the {name} data has {num_tokens(tokens)} tokens; training.seq_len="
                                    f"{self.seq_len} needs at least {self.seq_len + 2}")
        if config.precision == "fp16" and self.context.device.type != "cuda":
            raise TrainingError("training.precision='fp16' needs a CUDA device (loss scaling); on CPU use 'bf16'")
        if config.precision == "bf16" and self.context.device.type == "cpu" and not native_bf16_matmul():
            warnings.warn("training.precision='bf16' on a CPU without native bf16 matrix units (AVX512-BF16 or "
                          "AMX): PyTorch's fallback multiplies bf16 matrices far slower than fp32 (10x or more); "
                          "'fp32' is faster here", stacklevel=2)
        if config.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.benchmark = False

        self._seed_random_generators(config.seed + self.context.rank)
        self.model = model.to(self.context.device)
        self.wrapped = distributed.wrap_model(self.model, self.context, config.distributed)
        self.sharded = self.context.is_distributed and config.distributed == "fsdp"
        self.forward_module = torch.compile(self.wrapped) if config.compile else self.wrapped
        self.optimizer = build_optimizer(
            self.model, config.lr, config.weight_decay, (config.beta1, config.beta2), config.eps,
            decay_embeddings=config.decay_embeddings, fused=not self.sharded,
        )
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.scaler = torch.amp.GradScaler("cuda") if config.precision == "fp16" else None
        self.thread_tuner = None
        if config.threads > 0:
            torch.set_num_threads(config.threads)
        elif self.context.device.type == "cpu" and not config.deterministic and torch.get_num_threads() > 1:
            self.thread_tuner = ThreadTuner(torch.get_num_threads())
        self.tokens_per_step = config.batch_size * self.seq_len * config.grad_accum_steps * self.context.world_size

        # The state a checkpoint holds besides weights and optimizer.
        self.step = 0
        self.data_position = 0  # micro-batches consumed: the next batch is random_crops(..., data_position)
        self.best_value: float | None = None
        self.best_step: int | None = None
        self.evals_without_improvement = 0
        self.skipped_steps = 0
        self.resumed_from: Path | None = None
        self._lr_in_optimizer: float | None = None

    # ---- one step ------------------------------------------------------------------------------

    def autocast(self):
        """bf16 / fp16 autocast on the training device, or nothing for fp32."""
        if self.config.precision == "fp32":
            return nullcontext()
        dtype = torch.bfloat16 if self.config.precision == "bf16" else torch.float16
        return torch.autocast(device_type=self.context.device.type, dtype=dtype)

    def learning_rate(self, step: int) -> float:
        config = self.config
        return learning_rate(
            step, schedule=config.schedule, lr=config.lr, warmup_steps=config.warmup_steps,
            max_steps=config.max_steps, min_lr=config.min_lr, d_model=self.model.config.d_model,
        )

    def batch(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's rows of the training batch at ``position``, on the device."""
        inputs, targets = random_crops(
            self.train_tokens, self.config.batch_size, self.seq_len, self.config.seed, position,
            rank=self.context.rank, world_size=self.context.world_size,
        )
        device = self.context.device
        if device.type == "cpu":
            return inputs, targets
        return inputs.pin_memory().to(device, non_blocking=True), targets.pin_memory().to(device, non_blocking=True)

    def loss_on(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The objective on one batch, inputs and targets (B, T): next-token cross-entropy, with
        ``label_smoothing`` while training. Override it for another objective (distillation, ...):
        training minimises it and evaluation reports its mean as ``eval_loss`` (and ``eval_ppl``;
        ``eval_accuracy`` only for this built-in objective). Runs under autocast."""
        logits = self.forward_module(inputs).logits
        smoothing = self.config.label_smoothing if self.model.training else 0.0
        return token_cross_entropy(logits, targets, smoothing)

    def train_step(self, stop_requested: bool = False) -> StepOutcome:
        """One optimisation step (skipped, not applied, when the loss or gradients are not finite)."""
        config = self.config
        lr = self.learning_rate(self.step)
        if lr != self._lr_in_optimizer:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self._lr_in_optimizer = lr
        if not self.model.training:
            self.forward_module.train()
        accumulate = config.grad_accum_steps
        loss_sum = None
        for micro in range(accumulate):
            inputs, targets = self.batch(self.data_position)
            self.data_position += 1
            with self._gradient_sync(micro == accumulate - 1), self.autocast():
                loss = self.loss_on(inputs, targets)
            scaled = loss / accumulate if accumulate > 1 else loss
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()

        if self.context.is_distributed:
            stats = torch.stack([loss_sum.float(), torch.tensor(float(stop_requested), device=loss_sum.device)])
            distributed.all_reduce_sum(stats, self.context)
            loss_value = stats[0].item() / (accumulate * self.context.world_size)
            stop_requested = stats[1].item() > 0
        else:
            loss_value = loss_sum.item() / accumulate

        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grad_norm = self._clip_gradients()
        finite = math.isfinite(loss_value) and (self.scaler is not None or math.isfinite(grad_norm))
        if finite:
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepOutcome(loss_value, lr, grad_norm, finite, stop_requested)

    def _gradient_sync(self, sync: bool):
        """Gradients are reduced across processes only on the last micro-batch of a step."""
        if sync or not self.context.is_distributed:
            if self.sharded:
                self.model.set_requires_gradient_sync(True)
            return nullcontext()
        if self.sharded:
            self.model.set_requires_gradient_sync(False)
            return nullcontext()
        return self.wrapped.no_sync()

    def _clip_gradients(self) -> float:
        """The total gradient norm before clipping (clipping to ``grad_clip`` when it is > 0)."""
        if self.config.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.config.grad_clip, foreach=True)
        else:
            grads = [p.grad for p in self.parameters if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads, foreach=True) if grads else torch.zeros(())
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return norm.item()

    # ---- evaluation ------------------------------------------------------------------------------

    def evaluate(self) -> float | None:
        """Mean loss over the evaluation crops (see ``evaluate_metrics``), or None without eval data."""
        metrics = self.evaluate_metrics()
        return None if metrics is None else metrics["eval_loss"]

    @torch.no_grad()
    def evaluate_metrics(self) -> dict[str, float] | None:
        """Loss, perplexity and next-token accuracy over ``eval_batches`` batches of windows
        spread evenly over the evaluation tokens (the same windows at every evaluation and for
        every seed; ``eval_batches = 0``: enough windows to cover the whole split), batches
        grouped into few forward passes; every process takes its rows."""
        if self.eval_tokens is None:
            return None
        config, context = self.config, self.context
        rows_per_batch = config.batch_size * context.world_size
        num_batches = config.eval_batches or -(-(num_tokens(self.eval_tokens) - 1) // (self.seq_len * rows_per_batch))
        vocab = self.model.config.vocab_size
        per_pass = max(1, min(num_batches, EVAL_LOGITS_BUDGET // (config.batch_size * self.seq_len * vocab)))
        builtin_objective = type(self).loss_on is Trainer.loss_on
        module = self.forward_module
        module.eval()
        sums = torch.zeros(2, dtype=torch.float64, device=context.device)  # loss x batches, correct tokens
        for first in range(0, num_batches, per_pass):
            crops = [spaced_windows(self.eval_tokens, config.batch_size, self.seq_len, index, num_batches,
                                    rank=context.rank, world_size=context.world_size)
                     for index in range(first, min(first + per_pass, num_batches))]
            inputs = torch.cat([c[0] for c in crops]).to(context.device)
            targets = torch.cat([c[1] for c in crops]).to(context.device)
            with self.autocast():
                if builtin_objective:  # one forward pass gives the loss and the accuracy
                    logits = module(inputs).logits
                    sums[0] += token_cross_entropy(logits, targets).double() * len(crops)
                    sums[1] += (logits.argmax(dim=-1) == targets).sum()
                else:
                    sums[0] += self.loss_on(inputs, targets).double() * len(crops)
        module.train()
        distributed.all_reduce_sum(sums, context)
        batches = num_batches * context.world_size
        loss = sums[0].item() / batches
        metrics = {"eval_loss": loss, "eval_ppl": math.exp(min(loss, 700.0))}
        if builtin_objective:
            metrics["eval_accuracy"] = sums[1].item() / (batches * config.batch_size * self.seq_len)
        return metrics

    # ---- the run ---------------------------------------------------------------------------------

    def train(self) -> TrainingResult:
        """Train from ``self.step`` to ``max_steps`` (or until stopped); see the class doc."""
        config, context = self.config, self.context
        if self.out_dir is not None:
            self._prepare_out_dir()
        reporter = Reporter(self.out_dir, config.max_steps, self.step, enabled=context.is_main,
                            progress=self.progress)
        window = _Window(self.tokens_per_step)
        history: list[dict] = []
        started = time.perf_counter()
        start_step = self.step
        loss, eval_loss, stopped = math.nan, None, "completed"
        last_saved = self.step if self.resumed_from is not None else None  # resumed: that step is on disk
        try:
            with StopRequest() as stop:
                while self.step < config.max_steps and stopped == "completed":
                    outcome = self._timed_step(stop.requested is not None, window, reporter)
                    loss = outcome.loss
                    evaluate = self.step % config.eval_every == 0 or self.step == config.max_steps
                    if window.steps >= config.log_every or evaluate or outcome.stop_requested:
                        record = window.record(self.step, outcome)
                        if evaluate:
                            eval_loss = self._evaluate_into(record, reporter) or eval_loss
                        history.append(record)
                        reporter.log(record)
                        if evaluate and "eval_loss" in record and self._track_best(record, reporter):
                            stopped = "early_stopping"
                    reporter.advance(1, loss, outcome.lr, window.smoothed_rate)
                    if outcome.stop_requested:
                        stopped = "interrupted"
                    due = config.checkpoint_every and self.step % config.checkpoint_every == 0
                    if self.out_dir is not None and (due or stopped != "completed"):
                        self.save_checkpoint(reporter)
                        last_saved = self.step
        except Exception as error:
            if context.is_distributed and distributed.is_collective_failure(error):
                cause = (str(error).splitlines() or [""])[0]
                cause = cause if len(cause) <= 160 else cause[:157] + "..."
                raise TrainingError(
                    f"rank {context.rank}: lost the other processes at step {self.step}: a peer died or hung "
                    f"past training.dist_timeout_s ({cause})"
                ) from None
            raise
        finally:
            reporter.close()
        checkpoint = None
        if self.out_dir is not None:
            if last_saved != self.step:
                self.save_checkpoint(None)
            checkpoint = checkpoints.step_folder(self.out_dir, self.step)
            self.save_final_model()
        if stopped == "interrupted" and context.is_main:
            where = f": saved to {checkpoint}; continue with --resume auto" if checkpoint else ""
            print(f"interrupted at step {self.step}{where}", flush=True)
        return TrainingResult(
            steps=self.step, final_train_loss=loss, final_eval_loss=eval_loss,
            seconds=time.perf_counter() - started,
            tokens_per_second=(self.step - start_step) * self.tokens_per_step / max(window.train_seconds, 1e-9),
            history=history, stopped=stopped, best_eval=self.best_value, best_step=self.best_step,
            checkpoint=checkpoint, start_step=start_step,
        )

    def _timed_step(self, stop_requested: bool, window: _Window, reporter: Reporter) -> StepOutcome:
        """One step, timed (for tokens/s and the thread tuner), the step counter advanced."""
        tuner = self.thread_tuner
        if tuner is not None:
            tuner.before_step()
        started = time.perf_counter()
        outcome = self.train_step(stop_requested=stop_requested)
        elapsed = time.perf_counter() - started
        if tuner is not None:
            tuner.after_step(elapsed)
            while tuner.changes:
                reporter.message(f"step {self.step + 1}: using {tuner.changes.pop(0)}")
        if not outcome.finite:
            self._handle_nonfinite(outcome, reporter)
        self.step += 1
        window.add(outcome.loss, elapsed)
        return outcome

    def _evaluate_into(self, record: dict, reporter: Reporter) -> float | None:
        """Add the evaluation metrics to ``record`` and print them; the eval loss, or None."""
        metrics = self.evaluate_metrics()
        if metrics is None:
            return None
        record.update(metrics)
        accuracy = f"  accuracy {metrics['eval_accuracy']:.3f}" if "eval_accuracy" in metrics else ""
        reporter.message(f"step {self.step:>7}  train loss {record['train_loss']:.4f}  eval loss "
                         f"{metrics['eval_loss']:.4f}  ppl {metrics['eval_ppl']:.2f}{accuracy}")
        return metrics["eval_loss"]

    def _track_best(self, record: dict, reporter: Reporter) -> bool:
        """Update the best metric (saving checkpoints/best); True when early stopping is due."""
        config = self.config
        name = config.early_stopping_metric
        sign = -1.0 if name in HIGHER_IS_BETTER else 1.0
        if name not in record:
            raise TrainingError(f"training.early_stopping_metric={name!r} is not reported for this objective; "
                                "use eval_loss or eval_ppl")
        value = record[name]
        if self.best_value is None or sign * value < sign * self.best_value - config.early_stopping_min_delta:
            self.best_value, self.best_step = value, self.step
            self.evals_without_improvement = 0
            if self.out_dir is not None and config.save_best:
                self.save_best()
            return False
        self.evals_without_improvement += 1
        if config.early_stopping and self.evals_without_improvement >= config.early_stopping_patience:
            reporter.message(f"early stopping: {name} has not improved by more than {config.early_stopping_min_delta} "
                             f"in {self.evals_without_improvement} evaluations (best {self.best_value:.4f} at step "
                             f"{self.best_step})")
            return True
        return False

    def _handle_nonfinite(self, outcome: StepOutcome, reporter: Reporter) -> None:
        """Skip the step (not applied) up to ``skip_nonfinite`` times; then stop with the state
        before it saved as a checkpoint."""
        self.skipped_steps += 1
        what = f"loss became {outcome.loss}" if not math.isfinite(outcome.loss) else (
            f"gradient norm became {outcome.grad_norm}")
        if self.skipped_steps <= self.config.skip_nonfinite:
            reporter.message(f"step {self.step}: {what}; step skipped "
                             f"({self.skipped_steps} of training.skip_nonfinite={self.config.skip_nonfinite})")
            return
        self.data_position -= self.config.grad_accum_steps  # the failed step is not part of the state
        saved = ""
        if self.out_dir is not None:
            weights_finite = all(bool(torch.isfinite(p.detach()).all()) for p in self.parameters)
            if weights_finite:
                reporter.close()
                self.save_checkpoint(None)
                saved = f"; the state before it is saved in {checkpoints.step_folder(self.out_dir, self.step)}"
            else:
                newest = checkpoints.latest_checkpoint(self.out_dir)
                saved = f"; last good checkpoint: {newest}" if newest else "; no good checkpoint was saved"
        raise TrainingError(f"{what} at step {self.step}: training stopped{saved}; lower training.lr, "
                            "raise training.skip_nonfinite, or check the data")

    # ---- checkpoints -------------------------------------------------------------------------------

    def _prepare_out_dir(self) -> None:
        """Before the first step: writable folder, enough disk, no debris, no stale run."""
        distributed.on_main_process(self._prepare_out_dir_on_main, self.context)

    def _prepare_out_dir_on_main(self) -> None:
        out = self.out_dir
        preflight.check_writable(out)
        preflight.check_disk_space(out, sum(p.numel() for p in self.model.parameters()))
        checkpoints.clean_debris(out)
        if self.resumed_from is None:
            existing = checkpoints.list_checkpoints(out)
            if existing and not self.overwrite:
                raise TrainingError(
                    f"{out} already holds a run (checkpoints up to step {existing[-1][0]}); "
                    "resume it with --resume auto, or choose another output folder"
                )
            for stale in (out / checkpoints.CHECKPOINTS_DIR, out / "tensorboard"):
                if stale.is_dir():
                    shutil.rmtree(stale)
            (out / METRICS_NAME).unlink(missing_ok=True)
        else:
            truncate_metrics(out, self.step)
        (out / "training_config.json").write_text(json.dumps(asdict(self.config), indent=2) + "\n")

    def full_state(self, with_optimizer: bool = True) -> tuple[dict, dict | None]:
        """Unsharded model weights (tied copies left out) and optimizer state keyed by
        parameter name, on CPU. Every process must call this (FSDP gathers shards)."""
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
        return model_state, optimizer_state

    def trainer_state(self) -> dict:
        """The loop's own state: JSON, written last into a checkpoint."""
        return {
            "step": self.step, "data_position": self.data_position, "world_size": self.context.world_size,
            "tokens_seen": self.step * self.tokens_per_step, "best_value": self.best_value,
            "best_step": self.best_step, "best_metric": self.config.early_stopping_metric,
            "evals_without_improvement": self.evals_without_improvement, "skipped_steps": self.skipped_steps,
            "scheduler": {"schedule": self.config.schedule, "lr": self.config.lr, "min_lr": self.config.min_lr,
                          "warmup_steps": self.config.warmup_steps, "max_steps": self.config.max_steps,
                          "next_lr": self.learning_rate(self.step)},
            "grad_scaler": None if self.scaler is None else self.scaler.state_dict(),
            "training_config": asdict(self.config),
        }

    def save_checkpoint(self, reporter: Reporter | None) -> Path | None:
        """Write checkpoints/step-N atomically and apply retention (main process writes; every
        process takes part in gathering the state)."""
        model_state, optimizer_state = self.full_state()
        rng_states = distributed.all_gather_objects(_rng_state(), self.context)
        folder = checkpoints.step_folder(self.out_dir, self.step)

        def write() -> None:
            if reporter is not None:
                reporter.flush()
            rng_tensors = {}
            for rank, state in enumerate(rng_states):
                rng_tensors[f"rng/torch/{rank}"] = state.pop("torch")
                if "cuda" in state:
                    rng_tensors[f"rng/cuda/{rank}"] = state.pop("cuda")
            trainer_state = {**self.trainer_state(), "rng": rng_states}
            try:
                checkpoints.write_checkpoint(folder, self.model.config, model_state, self.model.tokenizer,
                                             optimizer_state, trainer_state, rng_tensors)
            except OSError as error:
                raise TrainingError(f"cannot write checkpoint {folder}: {error.strerror or error}") from None
            checkpoints.remove_old_checkpoints(self.out_dir, self.config.keep_last)

        distributed.on_main_process(write, self.context)
        return folder

    def save_best(self) -> None:
        """checkpoints/best: the model at the best evaluation so far (a loadable model folder)."""
        model_state, _ = self.full_state(with_optimizer=False)

        def write() -> None:
            folder = self.out_dir / checkpoints.CHECKPOINTS_DIR / checkpoints.BEST_NAME
            with atomic_directory(folder) as temporary:
                write_model_files(temporary, self.model.config, model_state, self.model.tokenizer)
                (temporary / "best.json").write_text(json.dumps(
                    {"step": self.step, self.config.early_stopping_metric: self.best_value}) + "\n")

        distributed.on_main_process(write, self.context)

    def save_final_model(self) -> None:
        """The run folder itself becomes a model folder: config.json, model.safetensors, tokenizer."""
        model_state, _ = self.full_state(with_optimizer=False)
        distributed.on_main_process(lambda: write_files_into(self.out_dir, lambda folder: write_model_files(
            folder, self.model.config, model_state, self.model.tokenizer)), self.context)

    def resume(self, spec: str | Path = "auto") -> int:
        """Restore the state of a checkpoint: ``auto`` (this run folder's newest, or nothing when
        there is none), a checkpoint folder, or a run folder. Returns the step resumed from."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        if self.out_dir is not None:
            distributed.on_main_process(lambda: checkpoints.clean_debris(self.out_dir), self.context)
        folder = checkpoints.resolve_resume(spec, self.out_dir)
        if folder is None:
            return 0
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
        self.step = state["step"]
        self.data_position = state["data_position"]
        self.best_value, self.best_step = state.get("best_value"), state.get("best_step")
        self.evals_without_improvement = state.get("evals_without_improvement", 0)
        self.skipped_steps = state.get("skipped_steps", 0)
        if self.scaler is not None and state.get("grad_scaler"):
            self.scaler.load_state_dict(state["grad_scaler"])
        self._restore_rng(state.get("rng") or [], rng_tensors)
        self._lr_in_optimizer = None
        self.resumed_from = folder
        return self.step

    def _restore_rng(self, saved: list[dict], tensors: dict[str, torch.Tensor]) -> None:
        rank = self.context.rank
        if rank >= len(saved) or f"rng/torch/{rank}" not in tensors:
            self._seed_random_generators(self.config.seed + rank + 7919 * self.step)
            return
        python_state = saved[rank]["python"]
        random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
        kind, keys, position, has_gauss, cached = saved[rank]["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
        torch.set_rng_state(tensors[f"rng/torch/{rank}"])
        if f"rng/cuda/{rank}" in tensors and self.context.device.type == "cuda":
            torch.cuda.set_rng_state(tensors[f"rng/cuda/{rank}"], self.context.device)

    @staticmethod
    def _seed_random_generators(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)


class _Window:
    """Steps since the last metrics record: mean loss and training-only throughput."""

    def __init__(self, tokens_per_step: int) -> None:
        self.tokens_per_step = tokens_per_step
        self.steps, self.seconds, self.loss_sum = 0, 0.0, 0.0
        self.train_seconds = 0.0  # the whole run's time in training steps
        self.rate = 0.0  # tokens/s over this window
        self.smoothed_rate = 0.0  # tokens/s, exponentially smoothed over steps (for the bar)

    def add(self, loss: float, seconds: float) -> None:
        self.steps += 1
        self.seconds += seconds
        self.loss_sum += loss
        self.train_seconds += seconds
        self.rate = self.steps * self.tokens_per_step / max(self.seconds, 1e-9)
        step_rate = self.tokens_per_step / max(seconds, 1e-9)
        self.smoothed_rate = step_rate if not self.smoothed_rate else 0.95 * self.smoothed_rate + 0.05 * step_rate

    def record(self, step: int, outcome: StepOutcome) -> dict:
        """The metrics record of this window, which then starts anew."""
        record = {"step": step, "train_loss": self.loss_sum / self.steps, "lr": outcome.lr,
                  "tokens_per_s": self.rate, "grad_norm": outcome.grad_norm}
        self.steps, self.seconds, self.loss_sum = 0, 0.0, 0.0
        return record


def _rng_state() -> dict:
    """This process's RNG states: Python and numpy as JSON, torch as uint8 tensors."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state = {"python": [version, list(internal), gauss],
             "numpy": [kind, keys.tolist(), int(position), int(has_gauss), float(cached)],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _as_tokens(tokens):
    if isinstance(tokens, (torch.Tensor, np.ndarray)):
        return tokens
    return torch.as_tensor(tokens, dtype=torch.long)
