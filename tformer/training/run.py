"""A recipe run end to end: check the output folder, load the data, build the model, resume
if asked, save the resolved recipe, train. What ``tformer train`` does, as a function."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from tformer.adapters import (
    adapted_tables,
    adapter_parameters,
    add_lora,
    default_trained_modules,
    merge_refusal,
    trained_modules,
)
from tformer.files import write_text_atomically
from tformer.hub import load, load_tokenizer
from tformer.hub_cache import resolve_model
from tformer.models import build_model
from tformer.nn.weights.lora import AdapterError
from tformer.quantization import QuantizationError, quantize, represented_parameters
from tformer.training import checkpoints, distributed
from tformer.training.config import TrainingError
from tformer.training.recipe import Recipe
from tformer.training.signals import TrainingInterrupted
from tformer.training.tasks import task_for_recipe
from tformer.training.trainer import Trainer, TrainingResult

RECIPE_NAME = "recipe.toml"


def train_recipe(recipe: Recipe, out_dir: str | Path, resume: str | None = None, progress: bool = True,
                 echo: Callable[[str], None] = print, overwrite: bool = False) -> TrainingResult:
    """Train what ``recipe`` describes into the run folder ``out_dir``. ``resume``: None (a
    fresh run; the folder must be empty, or with ``overwrite`` its contents are moved into
    ``OUT.replaced-N``), ``"auto"`` or a checkpoint/run folder. Nothing is written before the
    data, the model and the folder have passed their checks. SIGINT/SIGTERM: the run saves a
    checkpoint and ``TrainingInterrupted`` is raised."""
    out = Path(out_dir)
    config = recipe.training
    context = distributed.join_process_group(config.device, config.dist_timeout_s)
    say = echo if context.is_main else (lambda text: None)
    trainer = None
    try:
        if out.exists() and not out.is_dir():
            raise TrainingError(f"output folder {out}: exists and is not a folder")
        existing = checkpoints.list_checkpoints(out)
        if resume is None and existing and not overwrite:  # with overwrite, prepare_out_dir moves the run aside
            raise TrainingError(f"{out} already holds a run (checkpoints up to step {existing[-1][0]}); "
                                "continue it with --resume auto, choose another --out, or pass --overwrite to move "
                                f"it to {out.resolve().name}.replaced-N beside it (nothing is deleted)")
        pretrained_tokenizer = (None if recipe.init_from is None
                                else load_tokenizer(recipe.init_from, recipe.init_revision))
        task, data = task_for_recipe(recipe.task, recipe.data, seq_len=config.seq_len, tokenizer=pretrained_tokenizer,
                                     label_names=recipe.declared_label_names, num_labels=recipe.declared_num_labels,
                                     model_folder=model_folder(recipe))
        recipe = recipe.with_vocab_size(data.vocab_size).with_label_names(data.label_names)
        torch.manual_seed(config.seed)  # every process builds the same initial weights (and new heads)
        model = build_model(recipe.model) if recipe.init_from is None else pretrained_model(recipe, say)
        recipe = dataclasses.replace(recipe, model=model.config)
        model.tokenizer = data.tokenizer
        tokenizer = f" ({type(data.tokenizer).__name__}, {data.vocab_size} tokens)" if data.tokenizer else ""
        say(f"data       {data.description}{tokenizer}")
        layers = recipe.model.num_layers
        say(f"model      {recipe.model.architecture}: {model.num_parameters():,} parameters, "
            f"{layers} layer{'s' if layers != 1 else ''}, width {recipe.model.d_model}, "
            f"{type(model).describe_inputs(recipe.model)}")
        if recipe.adapter is not None:
            with_adapter(model, recipe, say)
        trainer = Trainer(model, config, task, out_dir=out, progress=progress, overwrite=overwrite)
        trainer.state.adapter_base = recipe.init_from if recipe.adapter is not None else None
        length = (f"as many steps as {config.max_minutes:g} minutes hold (sized by the clock),"
                  if config.sized_by_clock else f"{config.max_steps} steps")
        say(f"training   {length} of {trainer.units_per_step:,} {task.unit} "
            f"({task.describe_batch()} x {config.grad_accum_steps} accumulated x "
            f"{context.world_size} process{'es' if context.world_size > 1 else ''}) on {context.device}"
            f"{_threads(trainer)}, {trainer.precision}")
        fresh_start = False
        if resume is not None:
            step = trainer.resume(resume)
            if trainer.resumed_from is not None:
                say(f"resumed from step {step} ({trainer.resumed_from})")
            fresh_start = trainer.resumed_from is None and not trainer.restart
        trainer.prepare_out_dir()  # locked and checked before the recipe is written into it
        if fresh_start:  # said once the folder is known to take the run (a user's folder is refused above)
            say(f"no checkpoint in {out} yet: starting at step 0")
        trainer.state.on_main(lambda: write_recipe(out, recipe, trainer.state.run_token))
        try:
            result = trainer.train()
            if recipe.adapter is not None:
                result.merge_refused = merge_refusal(model)
        except TrainingInterrupted:
            distributed.barrier(context)
            raise
        distributed.barrier(context)  # nobody leaves the group while a peer still talks to it
        return result
    finally:
        if trainer is not None:
            trainer.state.release()  # (train releases it too; this covers a failure before it)
        trainer = model = None  # freed before the process group goes (see leave_process_group)
        distributed.leave_process_group()


def pretrained_model(recipe: Recipe, say: Callable[[str], None]):
    """The model of ``recipe.init_from`` with the recipe's head and dropout (the new head's weights listed in a
    warning). A quantized folder is refused here, naming it, before the run folder is touched."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load(recipe.init_from, revision=recipe.init_revision, **recipe.init_settings)
    scheme = getattr(model, "quantization", None)
    if scheme is not None and recipe.adapter is None:
        raise TrainingError(f"[model] init_from {recipe.init_from}: a quantized model ({scheme.describe()}) cannot be "
                            "trained (its weights are integers for inference); fine-tune its float checkpoint, then "
                            "quantize it, or train LoRA adapters over it (an [adapter] section)")
    for warning in caught:
        say(f"init_from  {warning.message}")
    return model.train()


def with_adapter(model, recipe: Recipe, say: Callable[[str], None]) -> None:
    """Put the recipe's LoRA adapters over ``model`` (in place), its base quantized first when ``[adapter]
    quantize`` asks (QLoRA); a setting that cannot apply is refused in one line."""
    adapter = recipe.adapter
    if recipe.training.distributed == "fsdp":
        raise TrainingError("[adapter] with training.distributed = \"fsdp\": not supported (the adapter is saved from "
                            "whole weights); use ddp")
    targets = adapter.targets if isinstance(adapter.targets, str) else list(adapter.targets)
    try:
        if adapter.quantize is not None:
            if getattr(model, "quantization", None) is not None:
                raise TrainingError(f"[adapter] quantize = {adapter.quantize!r}: the model is quantized already "
                                    f"({model.quantization.describe()}); leave quantize out")
            # a head with modules trained whole (a new task head's, by default) stays float: their weights must
            # train; so do the token tables when one takes an adapter (its update adds to float rows)
            whole = default_trained_modules(model) if adapter.train_modules is None else adapter.train_modules
            quantize(model, adapter.quantize, adapter.group_size, head=not whole,
                     embeddings=not adapted_tables(model, targets))
        train_modules = None if adapter.train_modules is None else list(adapter.train_modules)
        add_lora(model, adapter.rank, adapter.alpha, targets, adapter.dropout, adapter.rslora, train_modules,
                 dora=adapter.kind == "dora")
    except (AdapterError, QuantizationError) as error:
        raise TrainingError(f"[adapter] {error}") from None
    total = represented_parameters(model)  # a quantized base's integers count as the weights they stand for
    trained = adapter_parameters(model)  # the adapters' and those of the modules trained whole
    whole = trained_modules(model)
    beside = f", {', '.join(whole)} trained whole" if whole else ""
    say(f"adapter    {adapter.describe()}{beside}: {trained:,} of {total:,} parameters train "
        f"({100 * trained / total:.2f}%)")


def model_folder(recipe: Recipe) -> str | None:
    """The folder of the pretrained model a recipe starts from (a Hub name's snapshot), or None."""
    if recipe.init_from is None:
        return None
    return str(resolve_model(recipe.init_from, recipe.init_revision))


def write_recipe(out: Path, recipe: Recipe, tag: str | None = None) -> Path:
    """Save the resolved recipe as RUN/recipe.toml (atomically; ``tag``: the run's token)."""
    return write_text_atomically(out / RECIPE_NAME, recipe.to_toml(), tag)


def _threads(trainer: Trainer) -> str:
    if trainer.context.device.type != "cpu":
        return ""
    count = torch.get_num_threads()
    if trainer.thread_tuner is not None:
        return f" with 1 or {count} threads (whichever is faster, measured as it runs)"
    return f" with {count} thread{'s' if count > 1 else ''}"
