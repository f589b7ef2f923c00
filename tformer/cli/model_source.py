"""Where a command's model comes from: the one option group every command that loads a model takes, read once
into a ``ModelSource`` by ``main``, and the one loader that turns a source into the model with its tokenizer or
image processor. Commands import these (and ``model_inputs``), never each other, so a cross-cutting option is
one entry in ``MODEL_OPTIONS`` and one field of ``ModelSource`` here.

The group: the model (a folder, or a Hugging Face Hub name with ``--revision`` and ``--local-only``), ``--device``,
``--dtype``, ``--quantize`` / ``--group-size`` (choices read from the quantized weight backends' registry),
``--threads`` and ``--adapter`` (a LoRA adapter put over the model as it loads).
A command leaves out the options it cannot honour (``without=``): the flag then does not exist for it."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tformer.cli import UsageError
from tformer.cpu_threads import available_cpus

T = TypeVar("T")
RECIPE_NAME = "recipe.toml"  # a run folder's recipe, beside its model
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # --dtype's names -> torch's


# ---- the option group ----------------------------------------------------------------------------------------


def add_device_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--device``: where the model runs (``resolve_device`` reads it)."""
    parser.add_argument("--device", default="cpu", help=help or "cpu, cuda, cuda:N, or auto (cuda when PyTorch sees a "
                                                                "GPU, else cpu) (default: cpu)")


def add_dtype_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--dtype``: the floating-point type of the model's parameters (built in it, or cast to it once loaded)."""
    parser.add_argument("--dtype", choices=tuple(DTYPES),
                        help=help or "the model's floating-point weights in float32, bfloat16 or float16 (default: "
                                     "float32): a float model is built in the type, without a float32 copy; a "
                                     "quantized model's layers must take that type on this host, or it is refused")


def add_quantize_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--quantize`` and ``--group-size``: quantize the weights as they load, by a method of the quantized weight
    backends' registry (``quantize_option`` reads them)."""
    from tformer.nn.weights import QUANTIZED_BACKENDS
    from tformer.nn.weights.int4 import GROUP_SIZES
    from tformer.quantization import DEFAULT_GROUP_SIZE

    parser.add_argument("--quantize", choices=tuple(QUANTIZED_BACKENDS),
                        help=help or "quantize the weights as they load: int8 (per output channel), w8a8 (int8 "
                                     "weights, activations rounded to int8 where that is faster) or int4 (groups of "
                                     "--group-size inputs); a folder written by tformer quantize loads quantized "
                                     "without it")
    parser.add_argument("--group-size", type=int, metavar="N",
                        help=f"with --quantize int4: inputs per group, {', '.join(map(str, GROUP_SIZES[:-1]))} or "
                             f"{GROUP_SIZES[-1]} (default: {DEFAULT_GROUP_SIZE})")


def add_threads_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--threads``: the CPU threads the command computes with (``read_model_source`` checks them, and sets them
    before the command runs unless it says it sets them itself); without it ``load_model`` chooses them."""
    parser.add_argument("--threads", type=int, metavar="N",
                        help=help or "CPU threads PyTorch computes with (default: PyTorch's count, one a core, or 1 "
                                     "where 1 is faster on this machine: measured once and kept in "
                                     "$XDG_CACHE_HOME/tformer/threads.json; fewer when the load average leaves fewer "
                                     "cores free)")


def add_adapter_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--adapter``: a LoRA adapter folder put over the model once it has loaded (``load_model``)."""
    parser.add_argument("--adapter", metavar="DIR",
                        help=help or "a LoRA adapter folder in PEFT's format (adapter_config.json + "
                                     "adapter_model.safetensors; a tformer train run with an [adapter] section) to "
                                     "put over the model as it loads; the model is then its base")


# The group's options besides the model argument: name -> how it is added (given a help text of the command's own,
# or None). A command leaves out some by name.
MODEL_OPTIONS: dict[str, Callable[[argparse.ArgumentParser, str | None], None]] = {
    "device": add_device_option, "dtype": add_dtype_option, "quantize": add_quantize_option,
    "threads": add_threads_option, "adapter": add_adapter_option}


def add_model_source(parser: argparse.ArgumentParser, dest: str, help: str, metavar: str | None = None,
                     nargs: str | None = None, *, without: Collection[str] = (), helps: Mapping[str, str] | None = None,
                     sets_threads: bool = True) -> None:
    """The command's model: a local folder or a Hugging Face Hub name, with ``--revision`` and ``--local-only``,
    and every option of ``MODEL_OPTIONS`` but those named in ``without`` (``helps``: a command's own help text for
    some). ``main`` reads them once into ``args.model_source`` before the command runs (``read_model_source``, the
    parser's ``prepare``), so commands only ever see folders; it sets ``--threads`` unless ``sets_threads`` is False
    (a command that gives them to a process of its own)."""
    helps = helps or {}
    unknown = (set(without) | set(helps)) - set(MODEL_OPTIONS)
    if unknown:
        raise ValueError(f"{sorted(unknown)}: not options of the group ({', '.join(MODEL_OPTIONS)})")
    parser.add_argument(dest, metavar=metavar, nargs=nargs,
                        help=f"{help}; or a Hugging Face Hub name (org/name) when no such local path exists")
    group = parser.add_argument_group("model options", "how the model loads (the same options on every command "
                                                       "that loads one)")
    group.add_argument("--revision", help="with a Hub name: its branch, tag or commit (default: the main branch)")
    group.add_argument("--local-only", action="store_true",
                       help="with a Hub name: read the Hugging Face cache only, never the network")
    options = tuple(name for name in MODEL_OPTIONS if name not in without)
    for name in options:
        MODEL_OPTIONS[name](group, helps.get(name))
    parser.set_defaults(model_argument=dest, model_options=options, sets_threads=sets_threads,
                        prepare=read_model_source)


# ---- the source, read once -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSource:
    """What the option group asked for: the model's ``path`` (a folder: ``main`` turned a Hub name into its
    snapshot, ``hub_name`` keeps the name; None when the command's model argument is optional and not given), and
    how to load it. Picklable: ``tformer serve`` hands it to its engine process."""

    path: str | None
    hub_name: str | None = None
    revision: str | None = None  # of a Hub name ``path``; None once ``main`` resolved it to the snapshot folder
    local_only: bool = False
    device: Any = "cpu"  # a torch.device (``resolve_device``)
    quantize: Any = None  # a QuantizationScheme, or None
    threads: int | None = None
    dtype: Any = None  # the torch.dtype of the model's floating-point parameters, or None (as it loads)
    choose_threads: str | None = None  # the command whose ``load_model`` chooses the CPU threads (no --threads)
    adapter: str | None = None  # a LoRA adapter folder put over the model as it loads, or None

    def replace(self, **changes: Any) -> ModelSource:
        """This source with ``changes`` (another path: a draft model, loaded the same way)."""
        return dataclasses.replace(self, **changes)


def read_model_source(args: argparse.Namespace) -> None:
    """Check the group's options once, before the command runs: resolve a Hub name to its snapshot folder (the
    command's model argument then names the folder, ``args.hub_name`` the name), the device and the quantization;
    set ``args.model_source`` and this process's threads (``--threads``)."""
    args.hub_name = None
    dest = getattr(args, "model_argument", None)
    if dest is None:
        return
    path = resolve_model_argument(args, dest)
    given = set(args.model_options)
    threads = args.threads if "threads" in given else None
    if threads is not None:
        check_threads(threads)
    device = resolve_device(args.device if "device" in given else "cpu")
    args.model_source = ModelSource(path=path, hub_name=args.hub_name, local_only=args.local_only, device=device,
                                    quantize=quantize_option(args) if "quantize" in given else None,
                                    threads=threads, dtype=dtype_option(args, device) if "dtype" in given else None,
                                    adapter=adapter_option(args) if "adapter" in given else None)
    if threads is not None and args.sets_threads:
        import torch

        torch.set_num_threads(threads)
    elif threads is None and "threads" in given and device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        args.model_source = args.model_source.replace(choose_threads=args.command)


def resolve_model_argument(args: argparse.Namespace, dest: str) -> str | None:
    """The folder the command's model argument names (a Hub name: its snapshot folder in the Hugging Face cache,
    written back into ``args``, the name kept in ``args.hub_name``); None when the argument is optional and absent."""
    from tformer.hub_cache import resolve_model

    source = getattr(args, dest)
    if source is None:
        if args.revision is not None:
            raise UsageError("--revision goes with a Hub model name")
        return None
    folder = resolve_model(source, args.revision, args.local_only)
    if str(folder) != str(Path(source).expanduser()):
        args.hub_name = source
        setattr(args, dest, str(folder))
    return getattr(args, dest)


def output_beside_model(args: argparse.Namespace, folder: str | Path, *default: str) -> Path:
    """``--out``, or by default the path ``default`` inside the model's folder; for a Hub model (whose
    snapshot in the cache is not ours to write) inside a folder named after it in the working directory."""
    if args.out:
        return Path(args.out)
    return (Path(args.hub_name.replace("/", "--")) if args.hub_name else Path(folder)).joinpath(*default)


def check_threads(threads: int, option: str = "--threads") -> None:
    """Refuse in one line a thread count below 1, or above the CPUs this process may run on: threads past them
    only wait for each other (9999 on 2 cores made a 0.0 s transcription take 19 s)."""
    if threads < 1:
        raise UsageError(f"{option} {threads} must be >= 1")
    cpus = available_cpus()
    if threads > cpus:
        raise UsageError(f"{option} {threads} is more than the {cpus} CPU(s) this process may run on; give 1 to "
                         f"{cpus}")


def adapter_option(args: argparse.Namespace) -> str | None:
    """The ``--adapter`` folder, or None; refused in one line when it holds no adapter."""
    from tformer.interop.peft_adapter import ADAPTER_CONFIG

    if args.adapter is None:
        return None
    if not (Path(args.adapter) / ADAPTER_CONFIG).is_file():
        raise UsageError(f"--adapter {args.adapter}: no {ADAPTER_CONFIG} there (an adapter folder holds it and "
                         "adapter_model.safetensors: what tformer train writes with an [adapter] section, or PEFT's "
                         "save_pretrained)")
    return args.adapter


def quantize_option(args: argparse.Namespace):
    """The ``QuantizationScheme`` that ``--quantize`` / ``--group-size`` ask for, or None."""
    from tformer.quantization import QuantizationError, scheme_for

    method, group_size = args.quantize, args.group_size
    if method is None:
        if group_size is not None:
            raise UsageError("--group-size goes with --quantize int4")
        return None
    if method != "int4" and group_size is not None:
        raise UsageError(f"--group-size goes with --quantize int4 ({method} is per output channel)")
    try:
        return scheme_for(method, group_size)
    except QuantizationError as error:
        raise UsageError(f"--group-size: {error}") from None


def dtype_option(args: argparse.Namespace, device):
    """The torch.dtype ``--dtype`` names, or None when it is not given; refused in one line when this PyTorch
    cannot compute in it on ``device``."""
    import torch

    if args.dtype is None:
        return None
    dtype = getattr(torch, DTYPES[args.dtype])
    problem = device_dtype_problem(device, dtype)
    if problem is not None:
        raise UsageError(f"--dtype {args.dtype}: {problem}; leave out --dtype, or give another")
    return dtype


def device_dtype_problem(device, dtype) -> str | None:
    """Why this PyTorch cannot compute in ``dtype`` on ``device`` (a matrix product, a norm, a softmax and
    attention: what every model runs; float16 on the CPU came late to PyTorch), or None."""
    import torch
    import torch.nn.functional as F

    ones = torch.ones(1, 2, 8, 8, dtype=dtype, device=device)  # (B, H, T, Dh)
    try:
        F.linear(ones, ones[0, 0])
        F.layer_norm(ones, (8,), ones[0, 0, 0], ones[0, 0, 0])
        ones.softmax(-1)
        F.scaled_dot_product_attention(ones, ones, ones, is_causal=True)
    except RuntimeError as error:
        why = str(error).splitlines()[0] if str(error) else type(error).__name__
        return (f"PyTorch {torch.__version__} cannot compute in {str(dtype).removeprefix('torch.')} on "
                f"{device} ({why})")
    return None


def resolve_device(text: str, option: str = "--device"):
    """The torch.device a ``--device`` value names, refused in one line naming the devices this machine has
    when it has no such device."""
    import torch

    text = text.strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    kind, _, index = text.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise UsageError(f"{option} {text!r} is not a device (cpu, cuda, cuda:N or auto); this machine has: "
                         f"{available_devices()}")
    if not torch.cuda.is_available():
        build = " (a CPU-only build)" if torch.version.cuda is None else ""
        raise UsageError(f"{option} {text}: PyTorch {torch.__version__}{build} sees no CUDA device; this machine "
                         f"has: {available_devices()}")
    if index and int(index) >= torch.cuda.device_count():
        raise UsageError(f"{option} {text}: no such CUDA device; this machine has: {available_devices()}")
    return torch.device(text)


def available_devices() -> str:
    """The ``--device`` values this machine can run on, for a message: cpu, each GPU (cuda:N), auto."""
    import torch

    gpus = [f"cuda:{index}" for index in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return ", ".join(["cpu", *gpus, "auto"])


# ---- the loader ----------------------------------------------------------------------------------------------


@dataclass
class LoadedModel:
    """A model as ``load_model`` gives it: in eval mode on the source's device, its tokenizer and image processor
    attached where the folder has them, and why a tokenizer could not be read (None when it could, or when the
    folder has none), kept for the command's error instead of shown as a warning."""

    model: Any
    tokenizer_problem: str | None = None

    @property
    def tokenizer(self):
        return getattr(self.model, "tokenizer", None)

    @property
    def image_processor(self):
        return getattr(self.model, "image_processor", None)

    def require_tokenizer(self, label: str, why: str):
        """The tokenizer, or a one-line UsageError saying why there is none and ``why`` the command needs one."""
        if self.tokenizer is None:
            raise UsageError(f"{self.tokenizer_problem or f'{label}: no tokenizer.json'}; {why}")
        return self.tokenizer


def load_model(source: ModelSource) -> LoadedModel:
    """The model of ``source`` (``tformer.load`` with the group's options), the one way the commands load one."""
    import tformer

    if source.path is None:
        raise UsageError("no model given")
    head = adapter_head(source.adapter)
    # A float model is built in --dtype and its weights read into it (no float32 copy on the way); a quantized one
    # or one an adapter goes onto is cast once complete, where a layer that cannot take the type is refused by name.
    built_in = source.dtype if source.adapter is None and source.quantize is None else None

    def load():
        with warnings.catch_warnings():
            if head:  # the new head's weights come with the adapter: "newly initialised" would mislead
                warnings.filterwarnings("ignore", message=r".*loaded with head=")
            return tformer.load(source.path, device=source.device, quantize=source.quantize,
                                revision=source.revision, local_only=source.local_only, dtype=built_in, **head)

    model, problem = with_tokenizer_problem(load)
    if source.adapter is not None:
        from tformer.adapters import load_adapter

        load_adapter(model, source.adapter).eval()  # an AdapterError (one line) when it is another base's
    if source.dtype is not None and built_in is None:
        cast_model(model, source.dtype, source.path)
    if source.choose_threads is not None:
        choose_model_threads(model, source.choose_threads)
    return LoadedModel(model, problem)


def adapter_head(folder: str | None) -> dict[str, Any]:
    """The task head an adapter run trained over its base (its recipe.toml's [model] head settings: head,
    num_labels, label_names, pooling...), for the base to load with before the adapter goes on: a classifier's
    LoRA run over a masked-LM backbone saves the new head with its adapter. {} without one (no adapter, PEFT's
    folders, a decoder's run)."""
    if folder is None or not (Path(folder) / RECIPE_NAME).is_file():
        return {}
    import tomllib

    from tformer.training.recipe import HEAD_KEYS

    try:
        values = tomllib.loads((Path(folder) / RECIPE_NAME).read_text(encoding="utf-8")).get("model", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise UsageError(f"--adapter {folder}: its {RECIPE_NAME} is not readable ({error})") from None
    if not isinstance(values, dict) or values.get("head") is None:
        return {}
    return {key: values[key] for key in HEAD_KEYS if key in values}


CHOSEN_THREADS: list[int] = []  # the count this process chose: a draft model loaded after its target keeps it


def choose_model_threads(model, command: str) -> int:
    """Compute with the CPU threads ``tformer.cpu_threads.choose_threads`` picks for ``model``'s width (once a
    process), its note, when it has one, a line on stderr; returns the count."""
    import torch

    from tformer.cpu_threads import choose_threads

    if not CHOSEN_THREADS:
        choice = choose_threads(model.config.d_model)
        if choice.note:
            print(f"tformer {command}: {choice.note}", file=sys.stderr, flush=True)
        CHOSEN_THREADS.append(choice.threads)
    torch.set_num_threads(CHOSEN_THREADS[0])
    return CHOSEN_THREADS[0]


def cast_model(model, dtype, label: str) -> None:
    """Cast ``model``'s floating-point parameters and buffers to ``dtype`` (``--dtype``), in place; a one-line
    UsageError when its quantized layers cannot take activations of that type on this host."""
    from tformer.quantization import QuantizationError
    from tformer.quantization import cast_model as cast

    try:
        cast(model, dtype)
    except QuantizationError as error:
        name = next(name for name, torch_name in DTYPES.items() if torch_name == str(dtype).removeprefix("torch."))
        raise UsageError(f"--dtype {name}: {label} is {error}; leave out --dtype (its float parts stay float32), or "
                         "use another --quantize") from None


def load_tokenizer(source: ModelSource):
    """The tokenizer of ``source`` without its model, and why it could not be read (or None): for a process that
    only reads and writes text (``tformer serve``'s HTTP process)."""
    from tformer.hub import load_tokenizer as folder_tokenizer

    return with_tokenizer_problem(lambda: folder_tokenizer(source.path, source.revision,
                                                                          source.local_only))


def with_tokenizer_problem(load: Callable[[], T]) -> tuple[T, str | None]:
    """``load()`` (a model or a tokenizer) and, when a tokenizer could not be read, why (the warning's text, kept
    for the error instead of shown); other warnings are shown as they come."""
    from tformer.checkpoint import TokenizerNotAttachedWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load()
    problem = None
    for warning in caught:
        if issubclass(warning.category, TokenizerNotAttachedWarning):
            problem = str(warning.message)
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    return loaded, problem


# ---- what a command needs of the model -----------------------------------------------------------------------

# What a model that generates no text is, and the command that runs it instead, by architecture.
NOT_GENERATORS = {"encoder": ("an encoder, which reads text and answers with its head",
                              "tformer predict and tformer evaluate run it"),
                  "vision": ("a vision model, which labels images", "tformer classify runs it")}


def require_generator(model, label: str, command: str) -> None:
    """A one-line UsageError, in a user's terms, when ``model`` generates no text (an encoder, a vision model):
    ``command`` needs a decoder (the library's refusal speaks of the generation protocol instead)."""
    if model.generates:  # the generation protocol's (models/generation_protocol.py)
        return
    architecture = model.config.architecture
    what, instead = NOT_GENERATORS.get(architecture, (f"a {architecture} model, which does not write text", None))
    raise UsageError(f"{label}: {command} needs a decoder (a text generator); this run is {what}"
                     f"{f': {instead}' if instead else ''}")


def load_translator(source: ModelSource):
    """The encoder-decoder of ``source`` with its tokenizer, or a one-line UsageError."""
    model = load_model(source).model
    if not getattr(model, "encodes_prompt", False) or getattr(model, "inputs", "tokens") != "tokens":
        raise UsageError(f"{source.path}: a {model.config.architecture} model does not translate; give an "
                         "encoder-decoder (architecture encoder_decoder or rnn_seq2seq)")
    if getattr(model, "tokenizer", None) is None:
        raise UsageError(f"{source.path}: the model folder has no tokenizer to read the sentences with")
    return model


def load_image_classifier(source: ModelSource):
    """The vision model with an image-classification head of ``source``, with its image processor; a UsageError
    naming what the folder holds otherwise."""
    model = load_model(source).model
    config = model.config
    if config.head != "image_classification":
        raise UsageError(f"{source.path}: a vision model with head 'image_classification' is needed; this model "
                         f"is architecture={config.architecture!r}, head={config.head!r}")
    if getattr(model, "image_processor", None) is None:
        raise UsageError(f"{source.path}: the model folder has no preprocessor_config.json (the normalisation its "
                         "weights were trained with)")
    return model


def load_speech_model(source: ModelSource):
    """The speech model of ``source`` with its tokenizer, or a one-line UsageError."""
    model = load_model(source).model
    if getattr(model, "inputs", "tokens") != "audio":
        raise UsageError(f"{source.path}: a {model.config.architecture} model does not transcribe audio; give a "
                         "speech model (architecture 'speech': a speech_recognition run, or a Whisper folder)")
    if getattr(model, "tokenizer", None) is None:
        raise UsageError(f"{source.path}: the model folder has no tokenizer to write the transcripts with")
    return model


# ---- the run a model folder belongs to -----------------------------------------------------------------------


def find_recipe(folder: Path) -> Path:
    """The recipe of a run folder (or of a folder ``tformer quantize`` wrote from one, which carries it), or of
    the run a checkpoint folder (RUN/checkpoints/NAME) belongs to."""
    candidates = [folder / RECIPE_NAME]
    if folder.resolve().parent.name == "checkpoints":  # not any folder's grandparent: a run's checkpoint
        candidates.append(folder.resolve().parent.parent / RECIPE_NAME)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(2, f"no {RECIPE_NAME} in it or in the run folder two levels up (evaluate reads the "
                               "task and the data format from the run's recipe)", str(folder))


def run_recipe(folder: Path, model: Path | None = None):
    """The recipe a model folder was trained with (see ``find_recipe``), its model being the folder
    itself (or ``model``: the base of an adapter run's folder), whatever folder the run started from."""
    import tomllib

    from tformer.training.recipe import recipe_from_dict

    recipe_file = find_recipe(folder)
    raw = tomllib.loads(recipe_file.read_text(encoding="utf-8"))
    raw["model"] = {"init_from": str((model or folder).resolve())}
    raw.pop("adapter", None)  # the adapter is put on by the loader (--adapter)
    return recipe_from_dict(raw, source=str(recipe_file), base_dir=recipe_file.parent)
