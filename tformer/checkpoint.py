"""Checkpoint folders: config.json + model.safetensors (+ tokenizer.json, + a vision model's
preprocessor_config.json), written atomically.

This module knows files, not model classes: ``tformer.hub.load`` builds the model and fills it
through ``load_weights``; ``Model.save`` writes through ``save_checkpoint``.

Weights never travel by pickle. A folder is written under a temporary name and renamed into
place, so a crash leaves either the old checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from tformer.config import ModelConfig
from tformer.data.image_processing import PREPROCESSOR_NAME, ImageProcessing, ImageProcessingError
from tformer.errors import TformerError, warn_user
from tformer.files import clear_dead_writers, dead_writer_pid, remove_entry
from tformer.quantization import SCALE_LIMIT, implausible_scales, scheme_disagreement
from tformer.tokenizers import TokenizerError
from tformer.tokenizers import load as load_tokenizer

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TOKENIZER_NAME = "tokenizer.json"
# What loading a checkpoint folder reads (tformer's format and Hugging Face's): weights whole or sharded,
# configs, every tokenizer file, the chat template, image processing. ``checkpoint_files`` lists them;
# ``tformer.hub_cache`` fetches them from the Hub, pickle weights excepted.
CHECKPOINT_NAMES = frozenset({
    "config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
    "pytorch_model.bin.index.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "encoder.json", "vocab.bpe", "vocab.txt", "chat_template.jinja",
    "preprocessor_config.json"})
CHECKPOINT_SHARDS = re.compile(r"^(model-\d+-of-\d+\.safetensors|pytorch_model-\d+-of-\d+\.bin)$")
FORMAT_VERSION = 1
QUANTIZATION_KEY = "quantization"  # config.json's record of a quantized model's scheme (tformer.quantization)


class CheckpointError(TformerError):
    """A checkpoint folder is missing, unreadable, or does not match its config."""


class TokenizerNotAttachedWarning(UserWarning):
    """A checkpoint's tokenizer could not be read: the model loads without one (usable with token ids)."""


class ImageProcessorNotAttachedWarning(UserWarning):
    """A checkpoint's preprocessor_config.json could not be read: the model loads without an image
    processor (usable with pixel values normalised by the caller)."""


class NonFiniteWeightsWarning(UserWarning):
    """A loaded checkpoint holds NaN or infinite weights: the model's outputs will not be finite."""


@contextmanager
def atomic_directory(path: str | Path, tag: str | None = None) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; on success it replaces ``path`` in one rename.

    On error the temporary folder is removed and ``path`` is left as it was (an old folder
    already renamed aside is renamed back). The temporary names end in ``-TAG``: a run passes its
    token (so that it can tell its own debris), the default is the pid, and then what a writer of
    ``path`` killed mid-write left is cleared first (``files.clear_dead_writers``).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if tag is None:
        clear_dead_writers(target)
    suffix = tag or os.getpid()
    temporary = target.parent / f".{target.name}.tmp-{suffix}"
    previous = target.parent / f".{target.name}.old-{suffix}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    try:
        yield temporary
        for file in temporary.iterdir():
            _fsync(file)
        if target.exists():
            os.replace(target, previous)
        os.replace(temporary, target)
        shutil.rmtree(previous, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        if previous.exists() and not target.exists():
            os.replace(previous, target)
        raise


def write_files_into(target: Path, write, tag: str | None = None) -> None:
    """Write files into an existing folder (a run folder with logs beside the checkpoint):
    ``write`` fills a temporary folder (``.staging-TAG-XXXX``, the pid without a tag; see
    ``atomic_directory``), then each file is renamed into place, the config last, so a reader never
    sees a config without its weights. Without a tag, staging folders of writers killed mid-write go
    first."""
    if tag is None:
        for entry in target.iterdir():
            if dead_writer_pid(entry.name.rpartition("-")[0], ".staging-") is not None and entry.is_dir():
                remove_entry(entry)
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{tag or os.getpid()}-", dir=target))
    try:
        write(staging)
        for file in sorted(staging.iterdir(), key=lambda f: f.name == CONFIG_NAME):
            _fsync(file)
            os.replace(file, target / file.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fsync(file: Path) -> None:
    if file.is_file():
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())


def save_checkpoint(model, path: str | Path) -> Path:
    """Save ``model`` (a tformer Model: ``config``, ``state_dict``, ``tied_parameters``, optional
    ``tokenizer`` and ``image_processor``) as a checkpoint folder in tformer's format."""
    state = {name: tensor.detach().contiguous().cpu() for name, tensor in model.state_dict().items()
             if name not in model.tied_state_names()}
    tokenizer = getattr(model, "tokenizer", None)
    image_processor = getattr(model, "image_processor", None)
    quantization = getattr(model, "quantization", None)

    def write(folder: Path) -> None:
        write_model_files(folder, model.config, state, tokenizer, image_processor,
                          None if quantization is None else quantization.to_dict())

    return write_checkpoint_folder(path, write)


def write_checkpoint_folder(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Let ``write`` fill the checkpoint folder ``path`` (it writes config.json last).

    A new or empty folder appears whole, in one rename; into a folder that already holds other
    files (a run folder with logs) each file is renamed into place, the config last. What a writer of
    ``path`` killed mid-write left beside it is cleared first (an old copy it had renamed aside comes back).
    """
    target = Path(path)
    clear_dead_writers(target)
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"{target}: exists and is not a folder; a checkpoint is written as a folder "
                              "(give a new path or a folder)")
    if target.is_dir() and any(target.iterdir()):
        write_files_into(target, write)
    else:
        with atomic_directory(target) as folder:
            write(folder)
    return target


def write_model_files(
    folder: Path, config: ModelConfig, state: dict[str, torch.Tensor], tokenizer=None,
    image_processor: ImageProcessing | None = None, quantization: dict | None = None,
) -> None:
    """Write model.safetensors (``state``: untied CPU tensors), tokenizer.json and
    preprocessor_config.json when given, then config.json (with the ``quantization`` scheme of a
    quantized model) into an existing (usually temporary) folder. The trainer calls this with
    weights gathered from every process."""
    save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save(folder / TOKENIZER_NAME)
    if image_processor is not None:
        image_processor.save(folder)
    extra = {} if quantization is None else {QUANTIZATION_KEY: quantization}
    config_text = json.dumps({"tformer_format": FORMAT_VERSION, **config.to_dict(), **extra}, indent=2,
                             sort_keys=True)
    (folder / CONFIG_NAME).write_text(config_text + "\n")


def read_config(path: str | Path) -> dict:
    """The parsed config.json of a checkpoint folder, with a clear error when it is not one."""
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a checkpoint folder (no such directory)")
    config_file = folder / CONFIG_NAME
    if not config_file.is_file():
        raise CheckpointError(f"{folder}: not a checkpoint folder (no {CONFIG_NAME})")
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{config_file}: not valid JSON ({error})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{config_file}: holds a JSON {type(raw).__name__}, not an object of config fields")
    return raw


def config_from_checkpoint(raw: dict) -> ModelConfig:
    """The ModelConfig of a tformer checkpoint's parsed config.json."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{CONFIG_NAME} is not a JSON object")
    raw = dict(raw)
    raw.pop("tformer_format", None)
    raw.pop(QUANTIZATION_KEY, None)
    return ModelConfig.from_dict(raw)


def is_hf_config(raw: dict) -> bool:
    """Whether a parsed config.json is Hugging Face's (it names a ``model_type``) rather than tformer's."""
    return "model_type" in raw and "tformer_format" not in raw


def load_weights(model, folder: Path, new_head: bool = False) -> HeadChanges:
    """Fill ``model`` from the checkpoint folder's model.safetensors, after checking names and shapes
    (``load_state``: with ``new_head``, head tensors the file lacks keep their initialisation)."""
    weights_file = folder / WEIGHTS_NAME
    if not weights_file.is_file():
        raise CheckpointError(f"{folder}: no {WEIGHTS_NAME}")
    return load_state(model, read_safetensors(weights_file), source=str(weights_file), new_head=new_head)


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; a truncated, empty or foreign file is a CheckpointError naming it."""
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from None


def load_state(model, state: dict[str, torch.Tensor], source: str, new_head: bool = False) -> HeadChanges:
    """Copy ``state`` into ``model`` after checking names and shapes; nothing is copied on error.

    A quantized model's scheme (config.json) must agree with the tensors (``scheme_disagreement``).
    Tensors of the model's ``head_modules`` (a task head, a pooler) that ``state`` holds but the
    model lacks are dropped, as Hugging Face drops another head's weights; with ``new_head`` (a
    fine-tuning load) the model's head tensors that ``state`` lacks, or holds in another shape, keep
    their fresh initialisation. Both are returned; everything else must match exactly.
    """
    head_modules = getattr(model, "head_modules", ())

    def is_head(name: str) -> bool:
        return name.split(".", 1)[0] in head_modules

    expected = {name: tensor.shape for name, tensor in model.state_dict().items()
                if name not in model.tied_state_names()}
    found = {name: tensor.shape for name, tensor in state.items()}
    scheme = getattr(model, "quantization", None)
    problem = scheme and scheme_disagreement(model, scheme, state)
    if problem:
        raise CheckpointError(f"{source}: {problem}")
    changes = head_changes(expected, found, is_head, new_head)
    check_weights({name: shape for name, shape in expected.items() if name not in changes.initialised},
                  {name: shape for name, shape in found.items() if name not in changes.dropped}, source)
    _warn_if_not_finite(state, source)
    if scheme:
        _warn_if_implausible_scales(state, source)
    model.load_state_dict({name: t for name, t in state.items() if name not in changes.dropped}, strict=False)
    return changes


@dataclass
class HeadChanges:
    """What a load left to a head: tensors newly initialised (not in the file, or in another shape)
    and tensors of the file it did not use (another head's)."""

    initialised: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.initialised or self.dropped)

    def describe(self) -> str:
        parts = []
        if self.initialised:
            parts.append(f"newly initialised: {_name_list(self.initialised)}")
        if self.dropped:
            parts.append(f"not used: {_name_list(self.dropped)}")
        return "; ".join(parts)


def head_changes(
    expected: Mapping[str, Sequence[int]], found: Mapping[str, Sequence[int]], is_head: Callable[[str], bool],
    new_head: bool,
) -> HeadChanges:
    """The head tensors a load initialises afresh (only with ``new_head``: expected ones missing from
    ``found`` or of another shape) and those of ``found`` it drops (not expected, or of another shape
    when ``new_head``). Names are the files' own on both sides."""
    def differs(name: str) -> bool:
        return tuple(found[name]) != tuple(expected[name])

    changes = HeadChanges()
    if new_head:
        changes.initialised = sorted(n for n in expected if is_head(n) and (n not in found or differs(n)))
    changes.dropped = sorted(n for n in found if is_head(n) and (
        n not in expected or (new_head and differs(n))))
    return changes


def _warn_if_not_finite(state: dict[str, torch.Tensor], source: str) -> None:
    bad = [name for name, tensor in sorted(state.items()) if tensor.is_floating_point() and not _all_finite(tensor)]
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        warn_user(f"{source}: {bad[0]}{more} hold NaN or infinite values; the model's outputs will not be "
                      "finite (was it saved after training diverged?)", NonFiniteWeightsWarning)


def _all_finite(tensor: torch.Tensor) -> bool:
    """Whether every value of a floating-point tensor is finite: a NaN or an infinity reaches its minimum or
    maximum, one pass with no mask the size of the tensor (0.03 s against ``isfinite().all()``'s 0.79 s on a 1 GB
    weight, a one-off timing on the AMD EPYC host)."""
    if tensor.numel() == 0:
        return True
    low, high = torch.aminmax(tensor)
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


def _warn_if_implausible_scales(state: dict[str, torch.Tensor], source: str) -> None:
    """As ``_warn_if_not_finite``, for quantization scales that are finite but absurd (``implausible_scales``)."""
    found = implausible_scales(state)
    if found:
        first, largest = next(iter(found.items()))
        more = f" and {len(found) - 1} more" if len(found) > 1 else ""
        warn_user(f"{source}: {first}{more} hold values up to {largest:.3g}, where quantization scales stay "
                      f"below {SCALE_LIMIT:g} (a trained layer's are far below 1); the model's outputs will be "
                      "infinite or meaningless (is the file corrupt?)", NonFiniteWeightsWarning)


def check_weights(expected: Mapping[str, Sequence[int]], found: Mapping[str, Sequence[int]], source: str) -> None:
    """Raise CheckpointError unless ``found`` has exactly the ``expected`` tensor names and shapes.

    The message lists missing and unexpected names (the first 20 of each), or names the first
    tensor (in name order) whose shape differs, with both shapes.
    """
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing: {_name_list(missing)}")
        if unexpected:
            parts.append(f"unexpected: {_name_list(unexpected)}")
        raise CheckpointError(f"{source}: weights do not match the config ({'; '.join(parts)})")
    for name, shape in sorted(found.items()):
        if tuple(shape) != tuple(expected[name]):
            raise CheckpointError(
                f"{source}: {name} has shape {tuple(shape)}, the config expects {tuple(expected[name])}"
            )


def _name_list(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


# The tokenizer files a checkpoint folder may hold, in the order the tokenizer loader looks for them.
TOKENIZER_LAYOUTS = ((TOKENIZER_NAME,), ("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe"), ("vocab.txt",))


def load_attached_tokenizer(folder: Path):
    """The tokenizer saved in a checkpoint folder (tokenizer.json, else GPT-2's vocab.json + merges.txt or
    encoder.json + vocab.bpe, else BERT's vocab.txt, as a Hugging Face folder's), or None (see
    ``read_attached_tokenizer``). A folder with GPT-2's two files but no tokenizer.json got none."""
    if not any(all((folder / name).is_file() for name in layout) for layout in TOKENIZER_LAYOUTS):
        return None
    return read_attached_tokenizer(folder, folder)


def read_attached_tokenizer(source: Path, folder: Path):
    """The tokenizer at ``source`` (a file or folder of the checkpoint ``folder``). One tformer
    cannot read is reported by a TokenizerNotAttachedWarning, not an error: the weights are still
    usable with token ids."""
    try:
        return load_tokenizer(source)
    except TokenizerError as error:
        warn_user(f"{folder}: tokenizer not attached: {error}", TokenizerNotAttachedWarning)
        return None


def load_attached_image_processor(folder: Path, config: ModelConfig) -> ImageProcessing | None:
    """The image processing saved in the checkpoint folder of a family that attaches one (a vision model's:
    preprocessor_config.json, tformer's or Hugging Face's), or None. One tformer cannot read is reported by an
    ImageProcessorNotAttachedWarning, not an error: the weights are still usable with pixel values
    normalised by the caller."""
    if not (folder / PREPROCESSOR_NAME).is_file():
        return None
    try:
        return ImageProcessing.read(folder, num_channels=config.num_channels)
    except ImageProcessingError as error:
        warn_user(f"{folder}: image processor not attached: {error}", ImageProcessorNotAttachedWarning)
        return None


def checkpoint_files(folder: str | Path) -> list[str]:
    """The names in ``folder`` that a checkpoint loader reads (``CHECKPOINT_NAMES`` and weight shards), sorted:
    the files of a checkpoint written there, which a new checkpoint replaces as a whole (a stale one, such as a
    tokenizer_config.json whose chat template ``serve`` would use, must not outlive it)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(entry.name for entry in folder.iterdir()
                  if entry.name in CHECKPOINT_NAMES or CHECKPOINT_SHARDS.match(entry.name))
