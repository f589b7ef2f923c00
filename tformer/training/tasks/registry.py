"""The tasks a recipe can name (``[task] name``), their settings, and the task a recipe's data makes.

Each task declares beside its class what a recipe may say to it (``Task.Options``, ``data_formats``,
``data_settings``, ``learned_tokenizers``); this module reads those declarations. Adding a task is its
file and one line in ``TASKS``.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from tformer.data.records import RECORD_FORMATS
from tformer.data.sources import COLUMN_OPTIONS, DataConfig
from tformer.errors import listed
from tformer.training.config import TrainingError
from tformer.training.tasks.base import Task, TaskData
from tformer.training.tasks.classification import SequenceClassification
from tformer.training.tasks.image_classification import ImageClassification
from tformer.training.tasks.lm import LanguageModelling
from tformer.training.tasks.mlm import MaskedLanguageModelling
from tformer.training.tasks.sft import SupervisedFineTuning
from tformer.training.tasks.span_corruption import SpanCorruption
from tformer.training.tasks.span_qa import SpanQuestionAnswering
from tformer.training.tasks.speech_recognition import SpeechRecognition
from tformer.training.tasks.text_to_text import TextToText
from tformer.training.tasks.token_classification import TokenClassification
from tformer.training.tasks.translation import Translation

TASKS: dict[str, type[Task]] = {
    task.name: task
    for task in (LanguageModelling, MaskedLanguageModelling, SequenceClassification, TokenClassification,
                 SpanQuestionAnswering, ImageClassification, Translation, SpeechRecognition, SupervisedFineTuning,
                 SpanCorruption, TextToText)
}
# The [data] settings a task may read besides train, eval, eval_fraction and format.
DATA_SETTINGS = ("tokenizer", "columns", "skip_bad", "source_language", "target_language", *COLUMN_OPTIONS, "sources")


def task_settings() -> dict[str, tuple[Any, Any, tuple[str, ...]]]:
    """Every [task] setting of every task: its type, its default and the tasks that declare it (a setting
    two tasks declare has one type and one default)."""
    settings: dict[str, tuple[Any, Any, tuple[str, ...]]] = {}
    for name, task in TASKS.items():
        types = typing.get_type_hints(task.Options)
        for field in dataclasses.fields(task.Options):
            kind, default, owners = settings.get(field.name, (types[field.name], field.default, ()))
            if (kind, default) != (types[field.name], field.default):
                raise TypeError(f"task.{field.name}: {', '.join(owners)} and {name} declare it differently")
            settings[field.name] = (kind, default, (*owners, name))
    return settings


class TaskConfig:
    """The ``[task]`` section of a recipe: which task trains the model (``lm``: next-token language
    modelling, the default; ``mlm``: masked LM, + next-sentence pairs with the ``pretraining`` head;
    ``classification``, ``token_classification``, ``span_qa``: an encoder's fine-tuning tasks;
    ``image_classification``: a vision model's; ``translation``: an encoder-decoder's, on sentence pairs;
    ``speech_recognition``: a speech model's, on (audio, transcript) pairs; ``sft``: a decoder's supervised
    fine-tuning on instruction and chat data; ``span_corruption``: T5's denoising pretraining of an
    encoder-decoder; ``text_to_text``: its multi-task fine-tuning on a mixture of text-to-text sources) and
    its settings, ``options`` (the task's ``Options``; read them as attributes: ``config.doc_stride``).

    Another task's setting is refused unless it holds that task's default (a resolved recipe written by an
    earlier version lists every task's settings)."""

    __slots__ = ("name", "options")

    def __init__(self, name: str = "lm", **settings: Any) -> None:
        if name not in TASKS:
            raise TrainingError(f"task.name={name!r} is not one of {', '.join(TASKS)}")
        task = TASKS[name]
        own = {field.name for field in dataclasses.fields(task.Options)}
        known = task_settings()
        for key, value in settings.items():
            if key in own:
                continue
            if key not in known:
                raise TrainingError(f"task.{key} is not a task setting; the {name} task's: "
                                    f"{', '.join(sorted(own)) or 'none'}")
            if value != known[key][1]:
                raise TrainingError(f"task.{key} is a setting of the {' and '.join(known[key][2])} task, not {name!r}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "options", task.Options(**{key: settings[key] for key in own if key in settings}))

    def __getattr__(self, key: str) -> Any:
        if key in ("name", "options"):  # not set yet (a failed __init__)
            raise AttributeError(key)
        try:
            return getattr(self.options, key)
        except AttributeError:
            raise AttributeError(f"the {self.name} task has no setting {key!r}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {key!r}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskConfig) and (self.name, self.options) == (other.name, other.options)

    def __hash__(self) -> int:
        return hash((self.name, self.options))

    def __repr__(self) -> str:
        settings = ", ".join(f"{key}={value!r}" for key, value in self.settings().items())
        return f"TaskConfig({settings})"

    def settings(self) -> dict[str, Any]:
        """The name and the task's settings, as a recipe's [task] section holds them."""
        return {"name": self.name, **dataclasses.asdict(self.options)}

    def replace(self, **changes: Any) -> TaskConfig:
        """This config with some settings changed (checked again)."""
        return TaskConfig(**{**self.settings(), **changes})


def check_data_options(task: str, data: DataConfig) -> None:
    """Refuse a [data] setting the task does not read."""
    reader = TASKS[task]
    formats = ("auto", *reader.data_formats, *RECORD_FORMATS)
    if data.format not in formats:
        raise TrainingError(f"data.format={data.format!r} is not read by the {task} task; it reads "
                            f"{', '.join(formats)}")
    defaults = DataConfig.__dataclass_fields__
    for key in DATA_SETTINGS:
        if getattr(data, key) != defaults[key].default and key not in reader.data_settings:
            readers = [name for name, other in TASKS.items() if key in other.data_settings]
            raise TrainingError(f"data.{key} is not read by the {task} task" +
                                (f" (it is a setting of {', '.join(readers)})" if readers else ""))
    learners = [name for name, other in TASKS.items() if data.tokenizer in other.learned_tokenizers]
    if learners and task not in learners:
        raise TrainingError(f"data.tokenizer = {data.tokenizer!r} (a tokenizer learned from the data) is for the "
                            f"{' and '.join(learners)} task; give a tokenizer file, or \"char\"")
    reader.check_data(data)


def task_for_recipe(config: TaskConfig, data: DataConfig, *, seq_len: int | None = None, tokenizer=None,
                    label_names: tuple[str, ...] | None = None, num_labels: int | None = None,
                    model_folder: str | None = None) -> tuple[Task, TaskData]:
    """The task a recipe names, on the data its ``[data]`` section loads. ``tokenizer``: the one a
    pretrained model folder brings (else the data's), ``model_folder`` that folder (for a task that
    reads more of it: ``reads_model_folder``); ``label_names``: those the recipe declares;
    ``num_labels``: the count it declares, which the data's labels must match (an image set's integer
    labels are then checked to be ids below it), never silently replaced by the data's."""
    check_data_options(config.name, data)
    if tokenizer is not None and data.tokenizer != DataConfig.__dataclass_fields__["tokenizer"].default:
        raise TrainingError("data.tokenizer cannot be set with [model] init_from: the model folder's tokenizer "
                            "is the one its weights were trained with")
    task_class = TASKS[config.name]
    if num_labels is not None and label_names is None:
        label_names = task_class.label_names_for(num_labels)
    folder = {"model_folder": model_folder} if task_class.reads_model_folder else {}
    task, loaded = task_class.from_recipe(data, seq_len=seq_len, tokenizer=tokenizer, label_names=label_names,
                                          **folder, **dataclasses.asdict(config.options))
    found = loaded.label_names
    if num_labels is not None and found and len(found) != num_labels:
        raise TrainingError(f"model.num_labels={num_labels} but the data has {len(found)} labels ({listed(found)}); "
                            f"name all {num_labels} with model.label_names (the data's among them), or leave "
                            "num_labels out to take the data's")
    return task, loaded
