"""The tasks a recipe can name (``[task] name``), and the task a recipe's data makes."""

from __future__ import annotations

from dataclasses import dataclass

from tformer.data.sources import DataConfig, LanguageModelData, load_language_model_data
from tformer.training.config import TrainingError
from tformer.training.tasks.base import Task
from tformer.training.tasks.lm import LanguageModelling

TASKS: dict[str, type[Task]] = {"lm": LanguageModelling}


@dataclass(frozen=True)
class TaskConfig:
    """The ``[task]`` section of a recipe: which task trains the model (``lm``: next-token
    language modelling, the default)."""

    name: str = "lm"

    def __post_init__(self) -> None:
        if self.name not in TASKS:
            raise TrainingError(f"task.name={self.name!r} is not one of {', '.join(TASKS)}")


def task_for_recipe(config: TaskConfig, data: DataConfig) -> tuple[Task, LanguageModelData]:
    """The task a recipe names, on the data its ``[data]`` section loads (with the tokenizer
    and vocabulary size the model takes from it)."""
    loaded = load_language_model_data(data)
    sources = {"training": data.train, "evaluation": data.eval or data.train}
    return TASKS[config.name](loaded.train, loaded.eval, sources=sources), loaded
