"""TrainingConfig: every setting of a training run, validated once at construction.

It is the ``[training]`` section of a recipe, field for field; a message names the field as
``training.NAME`` and says what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from tformer.errors import TformerError
from tformer.training.schedules import CLOCK_SCHEDULES, SCHEDULES

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DISTRIBUTED_MODES = ("ddp", "fsdp")
DEVICES = ("auto", "cpu", "cuda")
SEED_LIMIT = 2**64 - 1  # torch's generators take 64-bit seeds


def _is_cuda_index(device: object) -> bool:
    """``cuda:N``: one GPU by its index."""
    return isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit()


class TrainingError(TformerError):
    """A training setting is invalid, or training cannot go on (a non-finite loss, a dead peer)."""


@dataclass(frozen=True)
class TrainingConfig:
    """How to train: steps, batch, optimiser, schedule, evaluation, checkpoints, precision, processes.

    ``batch_size`` is per process and per micro-step: one optimiser step sees
    ``batch_size * grad_accum_steps * world_size`` sequences of ``seq_len`` tokens.
    """

    # steps and batches
    max_steps: int = 1000  # 0 = as many as max_minutes holds: the run and its schedule are sized by the clock
    max_minutes: float = 0.0  # wall-clock budget of the run, resumes included; 0 = none (see Trainer)
    batch_size: int = 12
    seq_len: int | None = None  # defaults to the model's max_seq_len
    grad_accum_steps: int = 1
    # optimiser (AdamW, decoupled weight decay)
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    schedule: str = "cosine"
    weight_decay: float = 0.1
    decay_embeddings: bool = False  # nanoGPT decays embedding tables too; the default does not
    # T5's relative position bias trains at lr times this: under Adam a bucket's scalar moves about lr a step, too
    # slowly at transformer learning rates to make attention positional within a short budget (docs/t5.md)
    position_bias_lr_scale: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 turns clipping off
    label_smoothing: float = 0.0
    # evaluation and stopping
    eval_every: int = 250
    eval_batches: int = 20  # 0 = the whole held-out split
    early_stopping_metric: str = "eval_loss"  # any metric the task reports (the Trainer checks)
    early_stopping_patience: int = 0  # evaluations without improvement before stopping; 0 = never
    early_stopping_min_delta: float = 0.0
    skip_nonfinite: int = 0  # steps with a NaN/Inf loss to skip before stopping the run
    # checkpoints
    checkpoint_every: int = 0  # 0 = only at the end (and on Ctrl-C)
    keep_last: int = 3  # step checkpoints kept; 0 = keep all
    save_best: bool = True
    # reproducibility and speed
    seed: int = 1337
    deterministic: bool = False
    precision: str = "auto"  # auto: bf16 autocast on a CUDA device with bf16, fp32 elsewhere (precision_on)
    compile: bool | str = "auto"  # auto: compiled on CUDA, not on the CPU (compile_on)
    activation_checkpointing: bool = False  # recompute each block's activations in the backward pass: less memory
    device: str = "auto"  # auto, cpu, cuda (the process's GPU) or cuda:N (one process on GPU N)
    threads: int = 0  # CPU threads; 0 = measured: PyTorch's default or 1, whichever is faster now
    # processes (under torchrun)
    distributed: str = "ddp"
    dist_timeout_s: float = 300.0
    # logging
    log_every: int = 1

    def __post_init__(self) -> None:
        _require_int("max_steps", self.max_steps, minimum=0)
        for name in ("batch_size", "grad_accum_steps", "eval_every", "log_every"):
            _require_int(name, getattr(self, name), minimum=1)
        for name in ("eval_batches", "warmup_steps", "checkpoint_every", "keep_last", "early_stopping_patience",
                     "skip_nonfinite", "threads"):
            _require_int(name, getattr(self, name), minimum=0)
        _require_int("seed", self.seed, minimum=0, maximum=SEED_LIMIT)
        if self.seq_len is not None:
            _require_int("seq_len", self.seq_len, minimum=1)
        for name, allowed in (
            ("schedule", SCHEDULES), ("precision", PRECISIONS), ("distributed", DISTRIBUTED_MODES),
            ("device", DEVICES),
        ):
            if name == "device" and _is_cuda_index(self.device):
                continue
            if getattr(self, name) not in allowed:
                raise TrainingError(f"training.{name}={getattr(self, name)!r} is not one of {', '.join(allowed)}")
        metric = self.early_stopping_metric
        if not isinstance(metric, str) or not metric.startswith("eval_"):
            raise TrainingError(f"training.early_stopping_metric={metric!r} must name an evaluation metric the task "
                                "reports, e.g. eval_loss or eval_accuracy")
        if self.compile != "auto" and not isinstance(self.compile, bool):
            raise TrainingError(f"training.compile={self.compile!r} must be true, false or \"auto\"")
        for name in ("deterministic", "save_best", "decay_embeddings", "activation_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise TrainingError(f"training.{name}={getattr(self, name)!r} must be true or false")
        _require_number("lr", self.lr, low=0.0, low_open=True)
        _require_number("min_lr", self.min_lr, low=0.0)
        _require_number("weight_decay", self.weight_decay, low=0.0)
        _require_number("position_bias_lr_scale", self.position_bias_lr_scale, low=0.0, low_open=True)
        _require_number("beta1", self.beta1, low=0.0, high=1.0)
        _require_number("beta2", self.beta2, low=0.0, high=1.0)
        _require_number("eps", self.eps, low=0.0, low_open=True)
        _require_number("grad_clip", self.grad_clip, low=0.0)
        _require_number("label_smoothing", self.label_smoothing, low=0.0, high=1.0)
        _require_number("early_stopping_min_delta", self.early_stopping_min_delta, low=0.0)
        _require_number("dist_timeout_s", self.dist_timeout_s, low=0.0, low_open=True)
        _require_number("max_minutes", self.max_minutes, low=0.0)
        if self.schedule in ("cosine", "linear") and self.min_lr > self.lr:
            raise TrainingError(f"training.min_lr={self.min_lr} must not exceed training.lr={self.lr}")
        if self.max_steps == 0:
            self._check_sized_by_clock()

    def _check_sized_by_clock(self) -> None:
        """The settings a run sized by the clock (max_steps = 0) cannot go with, refused by name."""
        if not self.max_minutes:
            raise TrainingError("training.max_steps=0 sizes the run by the clock and needs training.max_minutes > 0 "
                                "(its budget); give one, or max_steps >= 1")
        if self.schedule not in CLOCK_SCHEDULES:
            raise TrainingError(f"training.schedule={self.schedule!r} has no end to fit to training.max_minutes: "
                                f"a run sized by the clock (max_steps = 0) takes {', '.join(CLOCK_SCHEDULES)}")
        if self.deterministic:
            raise TrainingError("training.deterministic=true promises a run that repeats exactly; one sized by the "
                                "clock (max_steps = 0) takes as many steps, at such rates, as this host's speed "
                                "allows: give training.max_steps for it")

    def precision_on(self, device_type: str) -> str:
        """``precision`` on a device of ``device_type``: "auto" is bf16 autocast on a CUDA device that has bf16 (the
        speed its matrix units are built for) and fp32 elsewhere (a CPU's bf16 pays only with native units, and
        changes the results)."""
        if self.precision != "auto":
            return self.precision
        return "bf16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"

    def compile_on(self, device_type: str) -> bool:
        """``compile`` on a device of ``device_type``: "auto" compiles on CUDA (GPT-2's step on an H200 in bf16:
        25.4 ms compiled against 30.6 eager, issue 58) and not on the CPU, where compiling takes about 40 s for a tiny
        model on 2 cores before the first step."""
        return device_type == "cuda" if self.compile == "auto" else self.compile

    @property
    def early_stopping(self) -> bool:
        return self.early_stopping_patience > 0

    @property
    def sized_by_clock(self) -> bool:
        """max_steps = 0: the run lasts training.max_minutes, and its schedule decays over that time."""
        return self.max_steps == 0


def _require_int(name: str, value, minimum: int, maximum: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum or (
            maximum is not None and value > maximum):
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        if maximum is not None:
            kind = f"an integer in [{minimum}, {'2**64 - 1' if maximum == SEED_LIMIT else maximum}]"
        raise TrainingError(f"training.{name}={value!r} must be {kind}")


def _require_number(name: str, value, low: float, high: float | None = None, low_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (high is None or value < high)
    if not ok:
        bound = f"> {low}" if low_open else f">= {low}"
        if high is not None:
            bound = f"in [{low}, {high})"
        raise TrainingError(f"training.{name}={value!r} must be a finite number {bound}")


ADAPTER_KINDS = ("lora", "dora")  # dora: tformer.adapters.add_lora(..., dora=True)
ADAPTER_QUANTIZE = ("int4", "int8")


@dataclass(frozen=True)
class AdapterConfig:
    """The ``[adapter]`` section of a recipe: train LoRA adapters over the frozen model instead of every weight
    (``tformer.adapters.add_lora``). ``targets``: module names, groups or one regular expression, as
    ``add_lora`` reads them. ``quantize``: quantize the base first (``int4``: QLoRA; ``group_size`` its inputs
    per group), so that only the adapters are float. ``train_modules``: modules trained whole beside the
    adapters (PEFT's modules_to_save; [] for none; left out: a new task head's classifier and pooler). The run
    saves the adapter in PEFT's format."""

    kind: str = "lora"
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: list | str = dataclasses.field(default_factory=lambda: ["attention", "feedforward"])
    rslora: bool = False
    quantize: str | None = None
    group_size: int | None = None
    train_modules: list | None = None

    def __post_init__(self) -> None:
        if self.kind not in ADAPTER_KINDS:
            raise TrainingError(f"adapter.kind={self.kind!r} is not one of {', '.join(ADAPTER_KINDS)}")
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise TrainingError(f"adapter.rank={self.rank!r} must be a positive integer")
        ok = isinstance(self.alpha, (int, float)) and not isinstance(self.alpha, bool) and math.isfinite(self.alpha)
        if not ok or self.alpha <= 0:
            raise TrainingError(f"adapter.alpha={self.alpha!r} must be a finite number > 0")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise TrainingError(f"adapter.dropout={self.dropout!r} must be a number in [0, 1)")
        targets = self.targets
        if not (isinstance(targets, str) and targets) and not (
                isinstance(targets, (list, tuple)) and targets and all(isinstance(t, str) and t for t in targets)):
            raise TrainingError(f"adapter.targets={targets!r} must be a list of module names or groups, or one "
                                "regular expression")
        if not isinstance(self.rslora, bool):
            raise TrainingError(f"adapter.rslora={self.rslora!r} must be true or false")
        if self.quantize is not None and self.quantize not in ADAPTER_QUANTIZE:
            raise TrainingError(f"adapter.quantize={self.quantize!r} is not one of {', '.join(ADAPTER_QUANTIZE)}")
        if self.kind == "dora" and self.quantize is not None:
            raise TrainingError(f"adapter.kind = \"dora\" with adapter.quantize = {self.quantize!r}: DoRA's row norms "
                                "need the float weight a quantized base does not hold; use kind = \"lora\" over a "
                                "quantized base (QLoRA), or DoRA over a float one")
        if self.group_size is not None and self.quantize != "int4":
            raise TrainingError(f"adapter.group_size={self.group_size!r} goes with adapter.quantize = \"int4\"")
        modules = self.train_modules
        if modules is not None and not (isinstance(modules, (list, tuple)) and
                                        all(isinstance(name, str) and name for name in modules)):
            raise TrainingError(f"adapter.train_modules={modules!r} must be a list of module names ([] for none)")

    def describe(self) -> str:
        """One line for the run's log."""
        quantized = f" over an {self.quantize} base (QLoRA)" if self.quantize == "int4" else \
            f" over an {self.quantize} base" if self.quantize else ""
        scaling = ("rs" if self.rslora else "") + ("DoRA" if self.kind == "dora" else "LoRA")
        return f"{scaling} rank {self.rank}, alpha {self.alpha:g}, dropout {self.dropout:g}{quantized}"
