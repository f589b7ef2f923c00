"""``load`` and ``save``: checkpoint folders in tformer's format or Hugging Face's, the one entry
that sits above model classes, interop and checkpoint files (none of them imports this)."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tformer.checkpoint import (
    CONFIG_NAME,
    QUANTIZATION_KEY,
    CheckpointError,
    config_from_checkpoint,
    is_hf_config,
    load_attached_image_processor,
    load_attached_tokenizer,
    load_weights,
    read_config,
)
from tformer.config import REGULARISATION_FIELDS, ConfigError, ModelConfig
from tformer.errors import warn_user
from tformer.families import families_reading
from tformer.generation.defaults import attach_generation_defaults
from tformer.hub_cache import resolve_model
from tformer.interop import attached_tokenizer, hf_config, load_hf_weights
from tformer.interop.gguf_layout import is_gguf
from tformer.memory import require_memory
from tformer.models import Model, model_class
from tformer.models.embeddings import embed as embed_with
from tformer.models.registry import model_bytes
from tformer.nn.heads import replace_head
from tformer.nn.uninitialised import without_initialisation
from tformer.quantization import QuantizationError, QuantizationScheme, cast_model, prepare_quantized, scheme_for
from tformer.quantization import quantize as quantize_model

if importlib.util.find_spec("gguf") is not None:  # the [gguf] extra: GGUF files as model sources
    from tformer.interop import gguf as gguf_files
else:
    gguf_files = None

_KEEP: Any = object()  # "the checkpoint's own head"


def load(
    path: str | Path,
    device: str | torch.device = "cpu",
    *,
    head: str | None = _KEEP,
    num_labels: int | None = None,
    label_names: Sequence[str] | None = None,
    problem_type: str | None = None,
    pooling: str | None = None,
    dropout: float | None = None,
    attention_dropout: float | None = None,
    quantize: str | QuantizationScheme | None = None,
    revision: str | None = None,
    local_only: bool = False,
    dtype: torch.dtype | None = None,
) -> Model:
    """Load a checkpoint folder (tformer's format, or Hugging Face's when config.json has a
    ``model_type``) into a model in eval mode, with its tokenizer attached when it has one (a vision
    model: its image processor, from preprocessor_config.json). ``path`` may also be a GGUF file (llama.cpp's; the
    gguf package reads it): a float model of its weights, dequantized, with its tokenizer.

    ``path`` may also be a Hugging Face Hub name ("openai-community/gpt2") when no such local path
    exists: its snapshot at ``revision`` (a branch, tag or commit) comes from the Hub cache, fetched
    when missing unless ``local_only`` or ``HF_HUB_OFFLINE=1`` (``tformer.hub_cache``).

    Fine-tuning an encoder or a vision model: ``head`` (one of ``config.ENCODER_HEADS`` or
    ``config.VISION_HEADS``, None for the bare model), ``num_labels``, ``label_names``,
    ``problem_type`` (encoders) or ``pooling`` (``config.POOLINGS``) give the model a new head: the
    backbone loads exactly, head weights the folder holds in the right shape load too, the others are
    initialised afresh, and the folder's weights the new model does not use are dropped. One warning
    lists the newly initialised tensors (tformer's names) and the dropped ones (the folder's names), as
    does a load that drops another head's weights (a Hugging Face BertForMaskedLM file with NSP weights).

    ``dropout`` and ``attention_dropout`` replace the folder's rates (any family: they shape no weight),
    e.g. to fine-tune with dropout a model pretrained without it.

    ``dtype`` (``torch.bfloat16``, ``torch.float16``, ...): the floating-point parameters and buffers in that type
    (float32 otherwise, whatever the stored dtype). A float model is built in it and the weights read into it (the
    values a cast after a float32 load gives, in half float32's memory for bfloat16); a model quantized as it loads,
    or a quantized folder, is cast once it has loaded, and refused (CheckpointError) when its quantized layers cannot
    run in the type on this host.

    A folder written from a quantized model loads quantized (its config.json records the scheme).
    ``quantize`` ("int8", "w8a8", "int4" or a ``QuantizationScheme``) quantizes a float checkpoint as it loads
    (``tformer.quantization.quantize``); asking a quantized folder for another scheme is refused.
    """
    regularisation = {name: value for name, value in zip(REGULARISATION_FIELDS, (dropout, attention_dropout),
                                                         strict=True) if value is not None}
    folder = resolve_model(path, revision, local_only)
    gguf_file = is_gguf(folder)
    raw = {} if gguf_file else read_config(folder)
    head_options = (head, num_labels, label_names, problem_type, pooling)
    new_head = head is not _KEEP or any(value is not None for value in head_options[1:])
    saved_scheme = None if gguf_file else _saved_scheme(folder, raw)
    wanted = scheme_for(quantize) if isinstance(quantize, str) else quantize
    _check_requantize(folder, saved_scheme, wanted, new_head)
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise CheckpointError(f"dtype={dtype!r} must be a floating-point torch.dtype (torch.bfloat16, ...)")
    # A float model is built in the type asked for, so the weights are read into it (half float32's memory for
    # bfloat16); one to be quantized as it loads is quantized from its float32 weights, then cast
    build_dtype = dtype if wanted is None and saved_scheme is None else None
    read_folder = _read_gguf_file if gguf_file else _read_hf_folder if is_hf_config(raw) else _read_tformer_folder
    model, saved_labels, changes = read_folder(folder, raw, head_options if new_head else None, regularisation,
                                               saved_scheme, build_dtype)
    if "image_processor" in model_class(model.config).attachments:
        model.image_processor = load_attached_image_processor(folder, model.config)
    relabelled = _reset_relabelled_classifier(model, saved_labels)
    if changes or relabelled:
        described = "; ".join(part for part in (relabelled, changes.describe()) if part)
        warn_user(f"{folder}: loaded with head={model.config.head!r}: {described}")
    if wanted is not None and saved_scheme is None:
        quantize_model(model, wanted)
    model = model.to(device).eval()
    if dtype is not None:
        try:
            cast_model(model, dtype)
        except QuantizationError as error:
            raise CheckpointError(f"{folder}: dtype={dtype} refused: the model is {error}") from None
    return model


def _check_requantize(folder: Path, saved: QuantizationScheme | None, wanted: QuantizationScheme | None,
                      new_head: bool) -> None:
    """Refuse a new head for a quantized folder, and a quantization other than the one it was saved with."""
    if saved is None or not (new_head or wanted is not None):
        return
    if new_head:
        raise CheckpointError(f"{folder}: a quantized model ({saved.describe()}) cannot take a new head; "
                              "fine-tune its float checkpoint, then quantize")
    if (wanted.method, wanted.group_size, wanted.head, wanted.embeddings) != (
            saved.method, saved.group_size, saved.head, saved.embeddings):
        raise CheckpointError(f"{folder}: quantized already ({saved.describe()}); it cannot be quantized "
                              f"again as {wanted.describe()} (quantize its float checkpoint)")


def _read_hf_folder(folder: Path, raw: dict, head_options: tuple | None, regularisation: dict,
                    saved_scheme: QuantizationScheme | None,
                    dtype: torch.dtype | None) -> tuple[Model, Sequence[str], Any]:
    """The model of a Hugging Face folder (with a new head when ``head_options`` are given), the labels its
    config named, and the weights' changes (new and dropped tensors); its tokenizer and generation defaults
    attached."""
    family, config = hf_config(folder, raw)
    saved_labels = config.label_names
    if head_options is not None:
        config = _with_head(config, *head_options, family.head_layout)
    # Without a new head the load writes every weight (or fails): nothing to initialise
    model = _build(config.replace(**regularisation), folder, initialised=head_options is not None, dtype=dtype)
    changes = load_hf_weights(model, family, folder, new_head=head_options is not None)
    model.tokenizer = attached_tokenizer(folder)
    attach_generation_defaults(model, folder)
    return model, saved_labels, changes


def _read_tformer_folder(folder: Path, raw: dict, head_options: tuple | None, regularisation: dict,
                         saved_scheme: QuantizationScheme | None,
                         dtype: torch.dtype | None) -> tuple[Model, Sequence[str], Any]:
    """The model of a tformer folder (quantized as it was saved; with a new head when ``head_options`` are
    given), the labels its config named, and the weights' changes; its tokenizer attached."""
    config = config_from_checkpoint(raw)
    saved_labels = config.label_names
    if head_options is not None:
        config = _with_head(config, *head_options, lambda _: {})
    model = _build(config.replace(**regularisation), folder, initialised=head_options is not None,  # as above
                   dtype=dtype)
    if saved_scheme is not None:
        prepare_quantized(model, saved_scheme)
    changes = load_weights(model, folder, new_head=head_options is not None)
    model.tokenizer = load_attached_tokenizer(folder)
    return model, saved_labels, changes


def _read_gguf_file(path: Path, raw: dict, head_options: tuple | None, regularisation: dict,
                    saved_scheme: None, dtype: torch.dtype | None) -> tuple[Model, Sequence[str], Any]:
    """The float model of a GGUF file, every weight dequantized, with its tokenizer (no labels, nothing changed)."""
    if head_options is not None:
        raise CheckpointError(f"{path}: a GGUF file holds a decoder; head, num_labels, label_names, problem_type and "
                              "pooling choose an encoder's or a vision model's head")
    checkpoint = _gguf_checkpoint(path)
    model = _build(checkpoint.config.replace(**regularisation), path, initialised=False,  # every weight the file's
                   dtype=dtype)
    return gguf_files.load_gguf_weights(model, checkpoint), (), None


def _gguf_checkpoint(path: Path):
    """The GGUF file at ``path`` read (tformer.interop.gguf), or a one-line CheckpointError without the gguf package."""
    if gguf_files is None:
        raise CheckpointError(f"{path}: GGUF files are read through the gguf package: pip install 'tformer[gguf]'")
    return gguf_files.read_gguf(path)


def _saved_scheme(folder: Path, raw: dict) -> QuantizationScheme | None:
    """The quantization scheme config.json records (tformer's format only), or None."""
    if QUANTIZATION_KEY not in raw or is_hf_config(raw):
        return None
    try:
        return QuantizationScheme.from_dict(raw[QUANTIZATION_KEY])
    except QuantizationError as error:
        raise CheckpointError(f"{folder / CONFIG_NAME}: {error}") from None


def _reset_relabelled_classifier(model: Model, saved_labels: Sequence[str]) -> str:
    """Initialise the classifier afresh when the folder's labels were named and the model's are others
    (the same count, another order or names): its rows belong to the folder's labels. Says so, or ''."""
    labels = tuple(getattr(model.config, "label_names", ()))
    classifier = getattr(model, "classifier", None)
    if classifier is None or not saved_labels or not labels or tuple(saved_labels) == labels:
        return ""
    torch.nn.init.normal_(classifier.weight, 0.0, model.config.initializer_range)
    if classifier.bias is not None:
        torch.nn.init.zeros_(classifier.bias)
    return (f"classifier initialised afresh: its labels were {', '.join(saved_labels)}, the model's are "
            f"{', '.join(labels)}")


def read_model_config(path: str | Path, revision: str | None = None, local_only: bool = False) -> ModelConfig:
    """The ModelConfig of a checkpoint folder (tformer's or Hugging Face's) or Hub name, without its weights."""
    folder = resolve_model(path, revision, local_only)
    if is_gguf(folder):
        return _gguf_checkpoint(folder).config
    raw = read_config(folder)
    return hf_config(folder, raw)[1] if is_hf_config(raw) else config_from_checkpoint(raw)


def load_tokenizer(path: str | Path, revision: str | None = None, local_only: bool = False):
    """The tokenizer a checkpoint folder or Hub name holds (tformer's or Hugging Face's files), or None."""
    folder = resolve_model(path, revision, local_only)
    if is_gguf(folder):
        return _gguf_checkpoint(folder).tokenizer
    return attached_tokenizer(folder) if is_hf_config(read_config(folder)) else load_attached_tokenizer(folder)


def _build(config: ModelConfig, source: Path, initialised: bool = True, dtype: torch.dtype | None = None) -> Model:
    """The model of ``config`` (its floating-point parameters and buffers in ``dtype`` where given, else float32),
    once its memory has been found to fit: loading holds it and the weights read from the file (counted as
    float32). With ``initialised`` False its weights are left as allocated (``nn.uninitialised``): for a load that
    writes every one or fails."""
    label = source if source.is_file() else source / CONFIG_NAME
    element_size = 4 if dtype is None else torch.empty(0, dtype=dtype).element_size()
    require_memory(model_bytes(config, element_size) + model_bytes(config), "cpu", f"{label}: loading its model "
                   f"(vocab_size={config.vocab_size}, d_model={config.d_model}, num_layers={config.num_layers})",
                   CheckpointError)
    with contextlib.nullcontext() if initialised else without_initialisation():
        model = model_class(config)(config)
    return model if dtype is None else model.to(dtype)


def _with_head(config: ModelConfig, head, num_labels, label_names, problem_type, pooling, layout) -> ModelConfig:
    if config.architecture not in families_reading("head"):  # the families with task heads
        raise ConfigError(f"head, num_labels, label_names, problem_type and pooling choose an encoder's or a vision "
                          f"model's head; this checkpoint is architecture={config.architecture!r}")
    head = config.head if head is _KEEP else head
    return replace_head(config, head, num_labels, label_names, problem_type, pooling, **layout(head))


def embed(model: Model | str | Path, inputs: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
          **options: Any) -> torch.Tensor:
    """``tformer.embed``: embeddings (N, D) of ``inputs`` by ``model``, a loaded model or a folder / Hub name / GGUF
    file (loaded, and its sentence-transformers pooling config read); ``options`` as ``models.embeddings.embed``."""
    if isinstance(model, str | Path):
        return embed_with(load(model), inputs, folder=resolve_model(model), **options)
    return embed_with(model, inputs, **options)


def save(model: Model, path: str | Path, format: str = "tformer") -> Path:
    """Write ``model`` as a checkpoint folder: ``format="tformer"`` or ``"hf"`` (see ``Model.save``)."""
    return model.save(path, format=format)

