"""Tasks: what the Trainer trains on and how it is scored (see ``base.Task``). A recipe names
one in ``[task] name``; ``TASKS`` holds those a recipe can name."""

from tformer.training.tasks.base import Batch, Task
from tformer.training.tasks.lm import LanguageModelling
from tformer.training.tasks.registry import TASKS, TaskConfig, task_for_recipe

__all__ = ["TASKS", "Batch", "LanguageModelling", "Task", "TaskConfig", "task_for_recipe"]
