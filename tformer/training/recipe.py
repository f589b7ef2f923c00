"""Recipes: a TOML file whose ``[model]``, ``[data]``, ``[training]``, ``[task]`` and ``[adapter]`` sections map
one to one onto ModelConfig (plus an optional ``preset``), DataConfig, TrainingConfig, TaskConfig and
AdapterConfig (``[task]`` may be left out: ``name = "lm"``, next-token language modelling; ``[adapter]`` too: every
weight trains).

Everything is checked here, before any work starts: an unknown section or key, a value of the
wrong type, or an invalid one is an error naming the section, the key and what is allowed.
``--set section.key=value`` overrides are applied first. Relative paths in ``[data]`` are
resolved against the recipe's folder (against the working folder for ``--set`` values);
``dataset:NAME/FILE`` names a file of a dataset by name (``tformer data fetch NAME``), looked for in
``TFORMER_DATA``, then ``[data] root`` when that folder exists, then the cache (``tformer.data.cache``).
A resolved recipe (every field, paths absolute) is written back with ``to_toml``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import tomllib
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tformer.checkpoint import CheckpointError
from tformer.config import REGULARISATION_FIELDS, ConfigError, ModelConfig, resolve_config
from tformer.data.cache import DataFetchError, is_dataset_path, resolve
from tformer.data.sources import LEARNED_TOKENIZERS, DataConfig, DataError
from tformer.errors import TformerError
from tformer.hub import read_model_config
from tformer.hub_cache import is_hub_name
from tformer.models import model_class
from tformer.nn.positions import POSITIONAL_SCHEMES
from tformer.training.config import AdapterConfig, TrainingConfig, TrainingError
from tformer.training.tasks.registry import TASKS, TaskConfig, check_data_options, task_settings

SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "training": TrainingConfig,
                             "task": TaskConfig, "adapter": AdapterConfig}
PATH_KEYS = ("train", "eval", "tokenizer")  # [data] keys that name files
EXTRA_KEYS = {"model": ("preset",), "data": ("root",)}  # keys read here, beside the config's fields
HEAD_KEYS = ("head", "num_labels", "label_names", "problem_type", "pooling")
INIT_FROM_KEYS = HEAD_KEYS + REGULARISATION_FIELDS  # what [model] may set beside init_from


class RecipeError(TformerError):
    """A recipe is unreadable or invalid; the message names the file, section and key."""


@dataclass(frozen=True)
class Recipe:
    """A validated recipe. ``model`` holds a placeholder vocabulary size until the data's
    tokenizer is known unless the recipe set ``vocab_size`` (``vocab_size_given``).

    ``init_from``: a pretrained model folder or Hugging Face Hub name to start from (fine-tuning), at
    ``init_revision`` for a name; ``model`` is then that model's config, and ``init_settings`` what the
    recipe changes in it (``INIT_FROM_KEYS``: the head settings, the dropout rates), arguments of
    ``tformer.load``. ``num_labels_given``: the recipe set ``num_labels`` itself (else it follows the
    data's labels). ``adapter``: the ``[adapter]`` section (LoRA adapters train, the model stays frozen), or None."""

    model: ModelConfig
    data: DataConfig
    training: TrainingConfig
    task: TaskConfig = TaskConfig()
    source: str = "<recipe>"
    vocab_size_given: bool = False
    init_from: str | None = None
    init_revision: str | None = None
    init_settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    num_labels_given: bool = False
    adapter: AdapterConfig | None = None

    @property
    def declared_label_names(self) -> tuple[str, ...] | None:
        """The label names the recipe declares (the data's labels must be among them), or None."""
        names = self.init_settings.get("label_names") if self.init_from else self.model.label_names
        return tuple(names) if names else None

    @property
    def declared_num_labels(self) -> int | None:
        """The number of labels the recipe sets (``[model] num_labels``; the data must have as many), or None:
        the data's count."""
        if self.init_from:
            return self.init_settings.get("num_labels")
        return self.model.num_labels if self.num_labels_given else None

    def with_label_names(self, label_names: tuple[str, ...] | None) -> Recipe:
        """The recipe with the data's label names (and their number) unless it declared its own."""
        if not label_names or self.declared_label_names:
            return self
        if self.init_from:
            return dataclasses.replace(self, init_settings={**self.init_settings, "label_names": list(label_names),
                                                            "num_labels": len(label_names)})
        model = _build(lambda section, key: self.source, "model", lambda: dataclasses.replace(
            self.model, label_names=tuple(label_names), num_labels=len(label_names)))
        return dataclasses.replace(self, model=model)

    def with_vocab_size(self, vocab_size: int | None) -> Recipe:
        """The recipe with the model's vocabulary fixed: the recipe's own value, else the tokenizer's (a
        vision model reads pixels: it has none to fix)."""
        if not model_class(self.model).reads_tokens and vocab_size is None:
            return self
        if self.vocab_size_given:
            if vocab_size is not None and vocab_size > self.model.vocab_size:
                raise RecipeError(
                    f"{self.source}: [model] vocab_size={self.model.vocab_size} is smaller than the "
                    f"tokenizer's {vocab_size} tokens"
                )
            return self
        if vocab_size is None:
            raise RecipeError(f"{self.source}: [model] vocab_size is needed: [data] has no tokenizer to take it from")
        model = _build(lambda section, key: self.source, "model",
                       lambda: resolve_config(self.model, vocab_size=vocab_size))
        return dataclasses.replace(self, model=model, vocab_size_given=True)

    def to_toml(self) -> str:
        """Every field of every section, in TOML, loadable by ``load_recipe``."""
        lines = ["# The resolved recipe of this run: every setting, data paths absolute.", ""]
        for section in SECTIONS:
            if section == "adapter" and self.adapter is None:
                continue
            lines.append(f"[{section}]")
            values = self.task.settings() if section == "task" else dataclasses.asdict(getattr(self, section))
            if section == "model" and self.init_from:
                values = {"init_from": self.init_from, "init_revision": self.init_revision, **self.init_settings}
            for key, value in values.items():
                if value is None or value == {}:
                    continue
                lines.append(f"{key} = {toml_value(value)}")
            lines.append("")
        return "\n".join(lines)


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Read, override and validate a recipe file."""
    source = str(path)
    file = Path(path)
    if not file.is_file():
        raise RecipeError(f"{source}: no such recipe file")
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise RecipeError(f"{source}: not valid TOML ({error})") from None
    return recipe_from_dict(raw, source=source, base_dir=file.resolve().parent, overrides=overrides)


def recipe_from_dict(
    raw: dict[str, Any], source: str = "<recipe>", base_dir: Path | None = None, overrides=()
) -> Recipe:
    """Validate a parsed recipe (sections -> key -> value) after applying ``--set`` overrides."""
    base_dir = base_dir or Path.cwd()
    raw = {section: dict(values) if isinstance(values, dict) else values for section, values in raw.items()}
    origin = _apply_overrides(raw, overrides, source)
    for section, values in raw.items():
        if section not in SECTIONS:
            raise RecipeError(f"{source}: unknown section [{section}]; sections: {', '.join(SECTIONS)}")
        if not isinstance(values, dict):
            raise RecipeError(f"{source}: [{section}] must be a table of key = value lines")
    values = {section: dict(raw.get(section, {})) for section in SECTIONS}
    model_values, data_values = values["model"], values["data"]
    start = _model_start(origin, model_values, base_dir)
    data_root = _data_root(origin, data_values, base_dir)
    for section, section_values in values.items():
        _check_keys(origin, section, section_values, extra_allowed=EXTRA_KEYS.get(section, ()))
    for section, section_values in values.items():
        _check_types(origin, section, section_values)
    _resolve_data_paths(origin, data_values, base_dir, data_root)

    model = _build(origin, "model", lambda: start.model_config(origin, model_values))
    data = _build(origin, "data", lambda: DataConfig(**data_values))
    training = _build(origin, "training", lambda: TrainingConfig(**values["training"]))
    task = _build(origin, "task", lambda: TaskConfig(**values["task"]))
    adapter = _build(origin, "adapter", lambda: AdapterConfig(**values["adapter"])) if "adapter" in raw else None
    _build(origin, "data", lambda: check_data_options(task.name, data))
    _build(origin, "data", data.check_files)
    training = _settle_seq_len(origin, model, training, task)
    return Recipe(model, data, training, task, source=source,
                  vocab_size_given="vocab_size" in model_values or start.init_from is not None,
                  init_from=start.init_from, init_revision=start.init_revision,
                  init_settings=dict(model_values) if start.init_from is not None else {},
                  num_labels_given="num_labels" in model_values, adapter=adapter)


@dataclass(frozen=True)
class _Origin:
    """Where each recipe value came from: its ``--set`` option, or the recipe file (``source``).
    Called as ``origin(section, key)`` for the prefix of an error message."""

    source: str
    from_command_line: dict[tuple[str, str], str]  # (section, key) -> "--set section.key=value"

    def __call__(self, section: str, key: str | None) -> str:
        return self.from_command_line.get((section, key or ""), self.source)

    def is_override(self, section: str, key: str) -> bool:
        return (section, key) in self.from_command_line

    def root(self, section: str, key: str, base_dir: Path) -> Path:
        """The folder a relative path is resolved against: the working folder for a --set value."""
        return Path.cwd() if self.is_override(section, key) else base_dir


def _apply_overrides(raw: dict[str, Any], overrides, source: str) -> _Origin:
    """Write each ``--set section.key=value`` into ``raw`` (in place); returns where values came from."""
    from_command_line: dict[tuple[str, str], str] = {}
    for override in overrides:
        section, key, value = parse_override(override)
        if section not in SECTIONS:
            raise RecipeError(f"--set {override}: unknown section [{section}]; sections: {', '.join(SECTIONS)}")
        if not isinstance(raw.get(section, {}), dict):
            raise RecipeError(f"{source}: [{section}] must be a table of key = value lines")
        raw.setdefault(section, {})[key] = value
        from_command_line[(section, key)] = f"--set {override.strip()}"
    return _Origin(source, from_command_line)


@dataclass(frozen=True)
class _ModelStart:
    """What ``[model]`` starts from: a preset, a pretrained model (``init_from`` at ``init_revision``),
    or neither (every field given)."""

    preset: str | None
    init_from: str | None
    init_revision: str | None

    def model_config(self, origin: _Origin, model_values: dict[str, Any]) -> ModelConfig:
        """The model's config: the pretrained model's, or the preset's or ModelConfig's with ``model_values``."""
        if self.init_from is not None:
            try:
                return read_model_config(self.init_from, self.init_revision)
            except CheckpointError as error:
                raise RecipeError(f"{origin('model', 'init_from')}: [model] init_from: {error}") from None
        if self.preset is None:
            return ModelConfig(**model_values)
        return resolve_config(self.preset, **model_values)  # a preset's special-token ids follow a new vocab_size


def _model_start(origin: _Origin, model_values: dict[str, Any], base_dir: Path) -> _ModelStart:
    """Take ``preset``, ``init_from`` and ``init_revision`` out of ``model_values`` (in place) and check
    them; a local ``init_from`` path becomes absolute, and beside it only ``INIT_FROM_KEYS`` may be set."""
    preset = model_values.pop("preset", None)
    if preset is not None and not isinstance(preset, str):
        raise RecipeError(f"{origin('model', 'preset')}: [model] preset={preset!r} must be a preset name")
    init_from = model_values.pop("init_from", None)
    init_revision = model_values.pop("init_revision", None)
    if init_revision is not None and not (isinstance(init_revision, str) and init_from is not None):
        raise RecipeError(f"{origin('model', 'init_revision')}: [model] init_revision={init_revision!r} must be a "
                          "branch, tag or commit (a string) of the Hub model init_from names")
    if init_from is not None:
        if not isinstance(init_from, str):
            raise RecipeError(f"{origin('model', 'init_from')}: [model] init_from={init_from!r} must be a model folder "
                              "or a Hub name")
        local = (origin.root("model", "init_from", base_dir) / Path(init_from).expanduser()).resolve()
        init_from = str(local) if local.exists() or not is_hub_name(init_from) else init_from
        others = [key for key in model_values if key not in INIT_FROM_KEYS] + (["preset"] if preset else [])
        if others:
            raise RecipeError(f"{origin('model', others[0])}: [model] {others[0]} cannot be set with init_from (the "
                              f"folder's config is the model's); beside it only {', '.join(INIT_FROM_KEYS)}")
    return _ModelStart(preset, init_from, init_revision)


def _data_root(origin: _Origin, data_values: dict[str, Any], base_dir: Path) -> Path | None:
    """Take ``root`` out of ``data_values`` (in place): a folder of datasets by name (as ../shared/data beside
    the project) where ``dataset:NAME/FILE`` paths are looked for when it exists, relative to the recipe."""
    root = data_values.pop("root", None)
    if root is None:
        return None
    if not isinstance(root, str) or not root.strip():
        raise RecipeError(f"{origin('data', 'root')}: [data] root={root!r} must be a folder of datasets (a string)")
    return (origin.root("data", "root", base_dir) / Path(root).expanduser()).resolve()


def _resolve_data_paths(origin: _Origin, data_values: dict[str, Any], base_dir: Path, data_root: Path | None
                        ) -> None:
    """Make the ``[data]`` file paths absolute (in place): ``dataset:NAME/FILE`` in the data roots, others against
    the recipe's folder; a learned tokenizer's name stays a name."""
    tables = [(data_values, "", "")]  # (settings, what names them, the key whose origin says where they came from)
    sources = data_values.get("sources")
    if isinstance(sources, list):  # text-to-text sources name their own files
        data_values["sources"] = [dict(source) if isinstance(source, dict) else source for source in sources]
        tables += [(source, f"sources[{number}].", "sources") for number, source in enumerate(data_values["sources"])
                   if isinstance(source, dict)]
    for values, prefix, origin_key in tables:
        for key in PATH_KEYS:
            value = values.get(key)
            if not isinstance(value, str) or not value or (key == "tokenizer" and value in LEARNED_TOKENIZERS):
                continue
            named = origin_key or key
            if is_dataset_path(value):
                try:
                    values[key] = str(resolve(value, data_root))
                except DataFetchError as error:
                    raise RecipeError(f"{origin('data', named)}: [data] {prefix}{key}: {error}") from None
            else:
                values[key] = str((origin.root("data", named, base_dir) / Path(value).expanduser()).resolve())


def _settle_seq_len(origin: _Origin, model: ModelConfig, training: TrainingConfig, task: TaskConfig
                    ) -> TrainingConfig:
    """``training`` with its sequence length checked against the task and the model (the model's
    ``max_seq_len`` when left out)."""
    if not TASKS[task.name].reads_seq_len:
        # a run's recipe.toml from before this check holds the default it resolved to (max_seq_len): still read
        if training.seq_len not in (None, model.max_seq_len):
            raise RecipeError(f"{origin('training', 'seq_len')}: [training] seq_len={training.seq_len} is not read "
                              f"by the {task.name} task (its model's inputs set the sequence length); leave it out")
    elif (training.seq_len is not None and training.seq_len > model.max_seq_len
            and POSITIONAL_SCHEMES[model.positional].table):
        where = origin("training", "seq_len") if origin.is_override("training", "seq_len") else \
            origin("model", "max_seq_len")
        raise RecipeError(
            f"{where}: [training] seq_len={training.seq_len} exceeds [model] max_seq_len={model.max_seq_len} "
            f"of its {model.positional} position table"
        )
    elif training.seq_len is None:
        training = dataclasses.replace(training, seq_len=model.max_seq_len)
    return training


def parse_override(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` -> (section, key, value); the value is read as a TOML value, or
    kept as a plain string when it is not one (so paths need no quotes)."""
    name, equals, value_text = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not equals or not dot or not section or not key:
        raise RecipeError(f"--set {text}: expected section.key=value, e.g. training.lr=3e-4")
    try:
        value = tomllib.loads(f"value = {value_text.strip()}")["value"]
    except tomllib.TOMLDecodeError:
        value = value_text.strip()
    return section, key.strip(), value


def toml_value(value: Any) -> str:
    """One TOML value: booleans, integers, floats (inf/nan too), strings, lists and inline tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


# ---- checks ---------------------------------------------------------------------------------


def _field_types(section: str) -> dict[str, Any]:
    if section == "task":  # the settings every task declares (TaskConfig refuses another task's)
        return {"name": str, **{key: kind for key, (kind, _, _) in task_settings().items()}}
    cls = SECTIONS[section]
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def _check_keys(origin, section: str, values: dict, extra_allowed: tuple[str, ...] = ()) -> None:
    """``origin(section, key)``: where a value came from (the recipe file or its --set option)."""
    known = [*_field_types(section), *extra_allowed]
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise RecipeError(
                f"{origin(section, key)}: [{section}] unknown key {key!r}{hint}; valid keys: {', '.join(sorted(known))}"
            )


def _check_types(origin, section: str, values: dict) -> None:
    types_by_key = _field_types(section)
    for key, value in values.items():
        expected = types_by_key[key]
        if not _matches(value, expected):
            raise RecipeError(
                f"{origin(section, key)}: [{section}] {key}={value!r} must be {_describe(expected)}"
                f" (got {type(value).__name__})"
            )


def _matches(value: Any, expected: Any) -> bool:
    options = typing.get_args(expected) if isinstance(expected, types.UnionType) else (expected,)
    for option in options:
        origin = typing.get_origin(option) or option
        if option is type(None) and value is None:
            return True
        if origin is bool and isinstance(value, bool):
            return True
        if origin is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if origin is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if origin in (str, dict, list, tuple) and isinstance(value, origin):
            return True
        if origin is tuple and isinstance(value, list):  # TOML has arrays only (ModelConfig.label_names)
            return True
    return False


def _describe(expected: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a table",
             list: "an array", tuple: "an array"}
    options = typing.get_args(expected) if isinstance(expected, types.UnionType) else (expected,)
    described = [names.get(typing.get_origin(o) or o, str(o)) for o in options if o is not type(None)]
    return " or ".join(described)


def _build(origin, section: str, make):
    """Run a constructor; its error becomes one line naming the recipe (or the --set option that
    gave the value the message names first) and the section."""
    try:
        return make()
    except (ConfigError, TrainingError, DataError, TypeError) as error:
        message = str(error)
        if message.startswith(f"{section}."):
            message = message[len(section) + 1 :]
        named = re.match(r"(\w+)[=:]", message)
        raise RecipeError(f"{origin(section, named and named.group(1))}: [{section}] {message}") from None
