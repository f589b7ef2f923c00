"""Training: recipes (``load_recipe``), the loop (``Trainer``) and the tasks it runs (``Task``,
``LanguageModelling``), ``train_recipe`` (what ``tformer train`` runs), schedules, AdamW groups,
checkpoints and several processes."""

from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.recipe import Recipe, RecipeError, load_recipe
from tformer.training.run import train_recipe
from tformer.training.signals import TrainingInterrupted
from tformer.training.tasks import LanguageModelling, Task
from tformer.training.trainer import Trainer, TrainingResult

__all__ = ["LanguageModelling", "Recipe", "RecipeError", "Task", "Trainer", "TrainingConfig", "TrainingError",
           "TrainingInterrupted", "TrainingResult", "load_recipe", "train_recipe"]
