"""The training loop: one loop from a laptop CPU to many GPUs under torchrun, for any Task.

Per step: learning rate from the schedule (a pure function of the step), ``grad_accum_steps``
micro-batches (the task's batches: a pure function of seed and position, this process's rows
of the global batch), autocast, the task's loss, backward, one all-reduce of the loss (and of a
stop request, so every process agrees), a NaN/Inf check, gradient clipping, the AdamW step. Then
evaluation (the task's sums, added over processes), best / step checkpoints, early stopping,
Ctrl-C, as the config asks. ``resume`` restores the exact state of a checkpoint (``state``), so
a resumed run ends bitwise where an uninterrupted one would.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from tformer.adapters import trained_with_adapter
from tformer.memory import peak_memory
from tformer.nn.experts import auxiliary_loss, mixtures
from tformer.nn.stack import set_activation_checkpointing
from tformer.training import checkpoints, distributed, preflight, run_folder
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.optim import build_optimizer
from tformer.training.reporting import Reporter
from tformer.training.schedules import clock_learning_rate, learning_rate
from tformer.training.signals import StopRequest, TrainingInterrupted
from tformer.training.state import FRESH_COUNTERS, NonFiniteState, RunState, changed_settings, seed_random_generators
from tformer.training.tasks.base import Batch, Task, row_pieces
from tformer.training.threads import ThreadTuner

__all__ = ["Trainer", "TrainingConfig", "TrainingError", "TrainingInterrupted", "TrainingResult"]


def native_bf16_matmul() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (oneDNN with AVX512-BF16 or AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@dataclass
class TrainingResult:
    """What a finished (or stopped) run reports. ``stopped``: completed (a run sized by the clock: its
    budget spent), interrupted, early_stopping, time_limit. ``throughput``: ``unit`` per second of
    training (tokens, examples)."""

    steps: int
    final_train_loss: float
    final_eval_loss: float | None
    seconds: float
    throughput: float
    unit: str = "tokens"
    history: list[dict] = field(default_factory=list)
    stopped: str = "completed"
    best_eval: float | None = None
    best_step: int | None = None
    checkpoint: Path | None = None
    start_step: int = 0
    merge_refused: str | None = None  # an adapter run's: why ``tformer merge`` refuses its adapter (None: it merges)


@dataclass
class StepOutcome:
    """One optimisation step as every process agrees on it."""

    loss: float
    lr: float
    grad_norm: float
    finite: bool
    stop_requested: bool


class Trainer:
    """Trains a model on a Task (``tformer.training.tasks``: its batches, loss and metrics).

    With ``out_dir`` the run writes metrics.jsonl, checkpoints/step-N (every
    ``checkpoint_every`` steps and at the end), checkpoints/best and, at the end, the model
    itself into ``out_dir`` (config.json, model.safetensors, tokenizer.json), so
    ``tformer.load(out_dir)`` works. The folder is locked while the run uses it (a second
    process is refused). A fresh run needs an empty folder; ``overwrite`` moves what is there
    into ``OUT.replaced-N`` beside it (nothing is ever deleted); otherwise resume the run there.
    A run stopped by SIGINT/SIGTERM saves a checkpoint and raises ``TrainingInterrupted``.
    With ``max_minutes`` the run stops after the first step that ends past that much wall-clock
    time (counted across resumes, evaluations and checkpoints included), evaluates and saves
    there, and reports ``stopped="time_limit"``; the schedule still spans ``max_steps``. With
    ``max_steps = 0`` as well the run is sized by the clock: the schedule's decay measures its
    progress as the share of the budget spent (``schedules.clock_learning_rate``), so the rate
    reaches ``min_lr`` as the budget ends, and how many steps that is depends on the host (such a
    run, unlike a step-sized one, does not repeat exactly). ``clock``: the wall clock, in seconds
    (``time.perf_counter``; tests pass a fake one).
    """

    def __init__(self, model, config: TrainingConfig, task: Task, out_dir: str | Path | None = None,
                 progress: bool = True, *, overwrite: bool = False,
                 clock: Callable[[], float] | None = None) -> None:
        if not isinstance(task, Task):
            raise TypeError(f"Trainer(model, config, task): task must be a tformer Task, not {type(task).__name__}")
        self.config = config
        self.task = task
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.progress = progress
        self.overwrite = overwrite
        self.clock = clock if clock is not None else time.perf_counter
        self.context = distributed.join_process_group(config.device, config.dist_timeout_s)
        task.prepare(config, self.context, model)
        if config.early_stopping_metric not in task.metrics:
            raise TrainingError(f"training.early_stopping_metric={config.early_stopping_metric!r} is not reported "
                                f"by the {task.name} task; it reports {', '.join(task.metrics)}")
        if config.max_minutes and self.context.is_distributed:
            raise TrainingError("training.max_minutes needs a single process: each rank's clock would stop it at a "
                                "different step (use max_steps under torchrun)")
        self.precision = config.precision_on(self.context.device.type)  # "auto" resolved: what the steps run in
        if self.precision == "fp16" and self.context.device.type != "cuda":
            raise TrainingError("training.precision='fp16' needs a CUDA device (loss scaling); on CPU use 'bf16'")
        preflight.check_kernels_train_on(self.context.device, model)
        if self.precision == "bf16" and self.context.device.type == "cpu" and not native_bf16_matmul():
            warnings.warn("training.precision='bf16' on a CPU without native bf16 matrix units (AVX512-BF16 or "
                          "AMX): PyTorch's fallback multiplies bf16 matrices far slower than fp32 (10x or more); "
                          "'fp32' is faster here", stacklevel=2)
        if config.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.benchmark = False

        seed_random_generators(config.seed + self.context.rank)
        self.model = model.to(self.context.device)
        if config.activation_checkpointing:
            set_activation_checkpointing(self.model)
        self.wrapped = distributed.wrap_model(self.model, self.context, config.distributed)
        self.sharded = self.context.is_distributed and config.distributed == "fsdp"
        compiled = config.compile_on(self.context.device.type)
        self.forward_module = torch.compile(self.wrapped) if compiled else self.wrapped
        self.optimizer = build_optimizer(
            self.model, config.lr, config.weight_decay, (config.beta1, config.beta2), config.eps,
            decay_embeddings=config.decay_embeddings, fused=not self.sharded,
            position_bias_lr_scale=config.position_bias_lr_scale)
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.mixtures = mixtures(self.model)  # its mixture-of-experts layers, whose load-balancing loss training adds
        self.scaler = torch.amp.GradScaler("cuda") if self.precision == "fp16" else None
        self.thread_tuner = None
        if config.threads > 0:
            torch.set_num_threads(config.threads)
        elif self.context.device.type == "cpu" and not config.deterministic and torch.get_num_threads() > 1:
            self.thread_tuner = ThreadTuner(torch.get_num_threads())
        self.units_per_step = task.units_per_batch() * config.grad_accum_steps * self.context.world_size
        self.state = RunState(self.model, self.optimizer, self.scaler, config, self.context, self.out_dir)

        # The loop's counters a checkpoint holds (besides weights, optimizer and RNG states).
        self.step = 0
        self.data_position = 0  # micro-batches consumed: the next batch is task.train_batch(data_position)
        self.best_value: float | None = None
        self.best_step: int | None = None
        self.evals_without_improvement = 0
        self.skipped_steps = 0
        self.elapsed_seconds = 0.0  # wall-clock time of the run's loop, resumes included (training.max_minutes)
        self.resumed_from: Path | None = None
        self.restart = False  # resume("auto") found an unfinished run without a usable checkpoint
        self.last_good_step = 0  # the newest state whose training step was finite (see _stop_nonfinite)
        self._out_dir_ready = False
        self._lr_in_optimizer: float | None = None

    # ---- one step ------------------------------------------------------------------------------

    def autocast(self):
        """bf16 / fp16 autocast on the training device, or nothing for fp32."""
        if self.precision == "fp32":
            return nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(device_type=self.context.device.type, dtype=dtype)

    def learning_rate(self, step: int) -> float:
        """The schedule's rate for ``step``; a run sized by the clock reads the share of its budget spent so far."""
        config = self.config
        if config.sized_by_clock:
            return clock_learning_rate(step, self.budget_fraction(), schedule=config.schedule, lr=config.lr,
                                       warmup_steps=config.warmup_steps, min_lr=config.min_lr)
        return learning_rate(
            step, schedule=config.schedule, lr=config.lr, warmup_steps=config.warmup_steps,
            max_steps=config.max_steps, min_lr=config.min_lr, d_model=self.model.config.d_model,
        )

    def budget_fraction(self) -> float | None:
        """The share of ``training.max_minutes`` spent (``elapsed_seconds``; past 1 once the last step ends after
        the budget), or None without a budget."""
        budget = 60 * self.config.max_minutes
        return self.elapsed_seconds / budget if budget else None

    def on_device(self, batch: Batch) -> Batch:
        """A batch on the training device (the same dict on the CPU: nothing is copied)."""
        device = self.context.device
        if device.type == "cpu":
            return batch
        return {name: tensor.pin_memory().to(device, non_blocking=True) for name, tensor in batch.items()}

    def train_step(self, stop_requested: bool = False) -> StepOutcome:
        """One optimisation step (skipped, not applied, when the loss or gradients are not finite)."""
        self._refuse_quantized()
        config = self.config
        lr = self.learning_rate(self.step)
        if lr != self._lr_in_optimizer:
            for group in self.optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)
            self._lr_in_optimizer = lr
        if not self.model.training:
            self.forward_module.train()
        accumulate = config.grad_accum_steps
        loss_sum = None
        for micro in range(accumulate):
            batch = self.on_device(self.task.train_batch(self.data_position))
            self.data_position += 1
            with self._gradient_sync(micro == accumulate - 1), self.autocast():
                loss = self.task.loss(self.forward_module, batch)
                balance = auxiliary_loss(self.mixtures, batch.get("attention_mask"))  # mixtures of experts
                if balance is not None:
                    loss = loss + balance
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

    def _refuse_quantized(self) -> None:
        """A quantized model evaluates but does not train: its weights are integers. Only its LoRA adapters may
        train (QLoRA), when they are all that does."""
        scheme = getattr(self.model, "quantization", None)
        if scheme is None:
            return
        adapters = {id(p) for p in trained_with_adapter(self.model)}  # LoRA's, and modules trained whole beside
        trained = [name for name, p in self.model.named_parameters() if p.requires_grad and id(p) not in adapters]
        if adapters and not trained:
            return
        why = f"its parameter {trained[0]} would train too; freeze it" if adapters else \
            "train or fine-tune the float checkpoint, then quantize it, or train LoRA adapters over it (QLoRA)"
        raise TrainingError(f"this model is quantized ({scheme.describe()}): its weights are integers for inference "
                            f"and cannot be trained; {why}")

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
        """The task's ``eval_loss`` (see ``evaluate_metrics``), or None without eval data."""
        metrics = self.evaluate_metrics()
        return None if metrics is None else metrics["eval_loss"]

    @torch.no_grad()
    def evaluate_metrics(self, progress: bool = False) -> dict[str, float] | None:
        """The task's metrics over its evaluation batches: each batch's sums, added over batches
        and, with one all-reduce, over processes, then finalised; None without eval data.
        ``progress``: a bar over the batches (``tformer evaluate``)."""
        if not self.task.can_evaluate:
            return None
        module = self.forward_module
        module.eval()
        totals: dict = {}
        batches = self.task.eval_batches()
        if progress and self.context.is_main:
            batches = tqdm(batches, desc="evaluating", unit="batch", leave=False)
        rows = self.task.eval_rows_per_pass()
        for batch in batches:
            for piece in row_pieces(self.on_device(batch), rows):
                with self.autocast():
                    sums = self.task.eval_sums(module, piece)
                for name, value in sums.items():
                    totals[name] = totals[name] + value if name in totals else value
        module.train()
        names = list(totals)
        device = self.context.device
        stacked = torch.stack([torch.as_tensor(totals[name], dtype=torch.float64, device=device) for name in names])
        distributed.all_reduce_sum(stacked, self.context)
        return self.task.finalise(dict(zip(names, stacked.tolist(), strict=True)))

    # ---- the run ---------------------------------------------------------------------------------

    def prepare_out_dir(self) -> None:
        """Lock the run folder and check it (see the class doc) before the first step; ``train``
        calls it, a caller that writes its own files into the folder (a recipe) calls it first. A model
        that cannot train (a quantized one) is refused here, before the folder is touched."""
        if self.out_dir is None or self._out_dir_ready:
            return
        self._refuse_quantized()
        self.state.claim()
        try:
            notes = self.state.prepare_out_dir(self.resumed_from is not None or self.step > 0, self.overwrite,
                                               self.step, restart=self.restart, resumed_from=self.resumed_from)
        except BaseException:
            self.state.release(abandon=self.step == 0 and self.resumed_from is None)
            raise
        self._say(notes)
        self._out_dir_ready = True

    def train(self) -> TrainingResult:
        """Train from ``self.step`` to ``max_steps`` (or until stopped; SIGINT/SIGTERM save a
        checkpoint and raise ``TrainingInterrupted``); see the class doc."""
        self._refuse_quantized()
        self.prepare_out_dir()
        try:
            return self._train()
        finally:
            self.state.release()
            self._out_dir_ready = False

    def _train(self) -> TrainingResult:
        config, context = self.config, self.context
        self.last_good_step = self.step
        reporter = Reporter(self.out_dir, None if config.sized_by_clock else config.max_steps, self.step,
                            enabled=context.is_main, progress=self.progress, unit=self.task.unit)
        window = _Window(self.units_per_step, self.task.unit, context.device)
        history: list[dict] = []
        step_limit = math.inf if config.sized_by_clock else config.max_steps
        started = self.clock()
        start_step = self.step
        loss, eval_loss, stopped, signal_name = math.nan, None, "completed", None
        last_saved = self.step if self.resumed_from is not None else None  # resumed: that step is on disk
        seconds_before, budget = self.elapsed_seconds, 60 * config.max_minutes
        if budget and self.elapsed_seconds >= budget:  # a resumed run that had spent its time
            stopped = "time_limit"
        try:
            with StopRequest() as stop:
                while self.step < step_limit and stopped == "completed":
                    self.elapsed_seconds = seconds_before + self.clock() - started  # the schedule's, at this step
                    outcome = self._timed_step(stop.requested is not None, window, reporter)
                    loss = outcome.loss
                    self.elapsed_seconds = seconds_before + self.clock() - started
                    out_of_time = bool(budget) and self.elapsed_seconds >= budget and self.step < step_limit
                    evaluate = self.step % config.eval_every == 0 or self.step == step_limit or out_of_time
                    if window.steps >= config.log_every or evaluate or outcome.stop_requested:
                        record = window.record(self.step, outcome)
                        if budget:
                            record["budget_fraction"] = self.budget_fraction()
                        if evaluate:
                            eval_loss = self._evaluate_into(record, reporter) or eval_loss
                        history.append(record)
                        reporter.log(record)
                        if evaluate and "eval_loss" in record and self._track_best(record, reporter):
                            stopped = "early_stopping"
                    minutes_left = max(0.0, budget - self.elapsed_seconds) / 60 if budget else None
                    reporter.advance(1, loss, outcome.lr, window.smoothed_rate, peak_memory(context.device),
                                     minutes_left)
                    if outcome.stop_requested:
                        stopped, signal_name = "interrupted", stop.requested
                    elif out_of_time and stopped == "completed":
                        stopped = "time_limit"
                        end = ": the end of the schedule" if config.sized_by_clock else ""
                        reporter.message(f"step {self.step}: stopping: training.max_minutes={config.max_minutes:g} "
                                         f"spent ({self.elapsed_seconds:.0f} s){end}")
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
        if stopped == "time_limit" and config.sized_by_clock:
            stopped = "completed"  # the budget is the run's length
        checkpoint = None
        if self.out_dir is not None:
            if last_saved != self.step:
                self.save_checkpoint(None)
            checkpoint = checkpoints.step_folder(self.out_dir, self.step)
            self.state.save_final_model()
        result = TrainingResult(
            steps=self.step, final_train_loss=loss, final_eval_loss=eval_loss,
            seconds=self.clock() - started,
            throughput=(self.step - start_step) * self.units_per_step / max(window.train_seconds, 1e-9),
            unit=self.task.unit, history=history, stopped=stopped, best_eval=self.best_value,
            best_step=self.best_step, checkpoint=checkpoint, start_step=start_step,
        )
        if stopped == "interrupted":
            where = f": saved to {checkpoint}; continue with --resume auto" if checkpoint else ""
            raise TrainingInterrupted(f"interrupted at step {self.step}{where}", result, signal_name)
        return result

    def _timed_step(self, stop_requested: bool, window: _Window, reporter: Reporter) -> StepOutcome:
        """One step, timed (for the throughput and the thread tuner), the step counter advanced."""
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
        if outcome.finite:
            self.last_good_step = self.step  # this state trained to a finite loss and gradient
        else:
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
        named = {"eval_loss": "eval loss", "eval_ppl": "ppl", "eval_accuracy": "accuracy"}
        shown = "  ".join(f"{named.get(name, name.removeprefix('eval_'))} {self.task.format_metric(name, value)}"
                          for name, value in metrics.items())
        reporter.message(f"step {self.step:>7}  train loss {record['train_loss']:.4f}  {shown}")
        return metrics["eval_loss"]

    def _track_best(self, record: dict, reporter: Reporter) -> bool:
        """Update the best metric (saving checkpoints/best); True when early stopping is due."""
        config = self.config
        name = config.early_stopping_metric
        sign = -1.0 if name in self.task.higher_is_better else 1.0
        value = record[name]
        if self.best_value is None or sign * value < sign * self.best_value - config.early_stopping_min_delta:
            self.best_value, self.best_step = value, self.step
            self.evals_without_improvement = 0
            if self.out_dir is not None and config.save_best:
                self.state.save_best(self.step, value)
            return False
        self.evals_without_improvement += 1
        if config.early_stopping and self.evals_without_improvement >= config.early_stopping_patience:
            reporter.message(f"early stopping: {name} has not improved by more than {config.early_stopping_min_delta} "
                             f"in {self.evals_without_improvement} evaluations (best {self.best_value:.4f} at step "
                             f"{self.best_step})")
            return True
        return False

    def _handle_nonfinite(self, outcome: StepOutcome, reporter: Reporter) -> None:
        """Skip the step (not applied) up to ``skip_nonfinite`` times; then stop (``_stop_nonfinite``).
        Steps are numbered as metrics.jsonl numbers them: the one after ``self.step``."""
        self.skipped_steps += 1
        what = f"loss became {outcome.loss}" if not math.isfinite(outcome.loss) else (
            f"gradient norm became {outcome.grad_norm}")
        if self.skipped_steps <= self.config.skip_nonfinite:
            reporter.message(f"step {self.step + 1}: {what}; step skipped "
                             f"({self.skipped_steps} of training.skip_nonfinite={self.config.skip_nonfinite})")
            return
        raise self._stop_nonfinite(f"{what} at step {self.step + 1}")

    def _stop_nonfinite(self, what: str) -> TrainingError:
        """The error that ends a run gone non-finite. Only a state that trained on to a finite step
        is worth resuming (its successor need not be: with too high a learning rate one finite step
        leaves weights whose next loss overflows), so the checkpoints after the newest such state
        are renamed aside (``step-N.nonfinite``) and the message names the newest one left."""
        advice = "lower training.lr (--set training.lr=...), raise training.skip_nonfinite, or check the data"
        if self.out_dir is None:
            return TrainingError(f"{what}: training stopped; {advice}")
        newest = self.state.set_aside_after(self.last_good_step)
        if newest is not None:
            where = f"the newest finite checkpoint is {newest}, where --resume auto continues"
        else:
            where = "no finite checkpoint was saved before it: --resume auto starts again at step 0"
        return TrainingError(f"{what}: training stopped; {where}; {advice}")

    # ---- checkpoints (state.RunState writes and reads them) ---------------------------------------

    def save_checkpoint(self, reporter: Reporter | None) -> Path:
        """Write checkpoints/step-N of the run as it stands (see ``state.RunState``); a state
        with non-finite weights or moments is not written and stops the run."""
        counters = {name: getattr(self, name) for name in FRESH_COUNTERS}
        trainer_state = self.state.trainer_state(counters, self.learning_rate(self.step), self.task.unit,
                                                 self.units_per_step)
        try:
            return self.state.save_checkpoint(trainer_state, reporter)
        except NonFiniteState as error:
            raise self._stop_nonfinite(str(error)) from None

    def resume(self, spec: str | Path = "auto") -> int:
        """Restore the state of a checkpoint: ``auto`` (this run folder's newest intact one, or
        nothing when there is none), a checkpoint folder, or a run folder. Returns the step
        resumed from. Locks the run folder (see ``train``)."""
        self.state.claim()
        try:
            restored = self.state.resume(spec)
            if restored is None:
                self._restart_unfinished_run(spec)
                return 0
        except BaseException:
            self.state.release(abandon=True)
            raise
        self.resumed_from, counters, saved_settings, notes = restored
        for name, value in counters.items():
            setattr(self, name, value)
        self._lr_in_optimizer = None
        changed = changed_settings(saved_settings, self.config)
        if changed:
            notes.append(f"settings changed on resume: {', '.join(changed)}")
        self._say(notes)
        return self.step

    def _restart_unfinished_run(self, spec: str | Path) -> None:
        """``resume("auto")`` in a run folder that holds a run of this model stopped before any
        usable checkpoint: the run starts again at step 0 (its metrics from step 1 on are dropped)."""
        out = self.out_dir
        if str(spec) != "auto" or out is None or not run_folder.is_unfinished_run(out):
            return
        best = out / checkpoints.CHECKPOINTS_DIR / checkpoints.BEST_NAME
        if (best / "config.json").is_file():
            checkpoints.check_same_shape(best, self.model.config)
        notes = [f"no usable checkpoint in {out}: its run starts again at step 0"]
        try:
            saved = json.loads((out / run_folder.TRAINING_CONFIG_NAME).read_text())
            changed = changed_settings(saved if isinstance(saved, dict) else {}, self.config)
        except (OSError, ValueError):
            changed = []
        if changed:
            notes.append(f"settings changed since that run: {', '.join(changed)}")
        self.restart = True
        self._say(notes)

    def _say(self, lines: list[str]) -> None:
        """Lines for the user, from the main process."""
        if self.context.is_main:
            for line in lines:
                print(line, flush=True)


class _Window:
    """Steps since the last metrics record: mean loss and training-only throughput."""

    def __init__(self, units_per_step: int, unit: str, device: torch.device) -> None:
        self.units_per_step, self.device = units_per_step, device
        self.rate_name = f"{unit}_per_s"
        self.steps, self.seconds, self.loss_sum = 0, 0.0, 0.0
        self.train_seconds = 0.0  # the whole run's time in training steps
        self.rate = 0.0  # units/s over this window
        self.smoothed_rate = 0.0  # units/s, exponentially smoothed over steps (for the bar)

    def add(self, loss: float, seconds: float) -> None:
        self.steps += 1
        self.seconds += seconds
        self.loss_sum += loss
        self.train_seconds += seconds
        self.rate = self.steps * self.units_per_step / max(self.seconds, 1e-9)
        step_rate = self.units_per_step / max(seconds, 1e-9)
        self.smoothed_rate = step_rate if not self.smoothed_rate else 0.95 * self.smoothed_rate + 0.05 * step_rate

    def record(self, step: int, outcome: StepOutcome) -> dict:
        """The metrics record of this window, which then starts anew."""
        record = {"step": step, "train_loss": self.loss_sum / self.steps, "lr": outcome.lr,
                  self.rate_name: self.rate, "grad_norm": outcome.grad_norm}
        peak = peak_memory(self.device)
        if peak is not None:
            record["peak_memory_mib"] = round(peak / 2**20, 1)  # the process's so far (CPU: RSS; CUDA: allocated)
        self.steps, self.seconds, self.loss_sum = 0, 0.0, 0.0
        return record
