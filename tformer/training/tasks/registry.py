"""The tasks a recipe can name (``[task] name``), and the task a recipe's data makes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tformer.data.records import RECORD_FORMATS
from tformer.data.sources import COLUMN_OPTIONS, DataConfig
from tformer.errors import listed
from tformer.training.config import TrainingError
from tformer.training.tasks.base import Task, TaskData
from tformer.training.tasks.classification import SequenceClassification
from tformer.training.tasks.image_classification import ImageClassification
from tformer.training.tasks.lm import LanguageModelling
from tformer.training.tasks.mlm import MaskedLanguageModelling
from tformer.training.tasks.span_qa import SpanQuestionAnswering
from tformer.training.tasks.token_classification import TokenClassification
from tformer.training.tasks.translation import Translation

TASKS: dict[str, type[Task]] = {
    "lm": LanguageModelling,
    "mlm": MaskedLanguageModelling,
    "classification": SequenceClassification,
    "token_classification": TokenClassification,
    "span_qa": SpanQuestionAnswering,
    "image_classification": ImageClassification,
    "translation": Translation,
}
# The [task] settings that belong to one task; set for another, they are refused rather than ignored.
TASK_OPTIONS = {
    "mask_probability": ("mlm",),
    "whole_word_masking": ("mlm",),
    "doc_stride": ("span_qa",),
    "max_answer_length": ("span_qa",),
    "n_best": ("span_qa",),
    "crop_padding": ("image_classification",),
    "horizontal_flip": ("image_classification",),
    "image_mean": ("image_classification",),
    "image_std": ("image_classification",),
    "batch_tokens": ("translation",),
    "bpe_vocab_size": ("translation",),
    "eval_bleu": ("translation",),
    "eval_beams": ("translation",),
}
# The [data] settings each task reads besides train, eval and eval_fraction; every task reads records
# (JSONL, CSV/TSV, Parquet, datasets folders: tformer.data.records) beside its own formats, and ``columns``
# (the columns of a TSV/CSV file without a header row) with them.
_RECORDS = RECORD_FORMATS
DATA_OPTIONS = {
    "lm": {"format": ("auto", "text", "tokens", "npy", *_RECORDS), "tokenizer": True, "columns": True,
           "text_column": True},
    "mlm": {"format": ("auto", "text", *_RECORDS), "tokenizer": True, "columns": True, "text_column": True},
    "classification": {"format": ("auto", *_RECORDS), "tokenizer": True, "columns": True, "skip_bad": True,
                       "text_column": True, "text_pair_column": True, "label_column": True},
    "token_classification": {"format": ("auto", "conll", *_RECORDS), "tokenizer": True, "skip_bad": True,
                             "columns": True, "tokens_column": True, "tags_column": True},
    "span_qa": {"format": ("auto", "squad", *_RECORDS), "tokenizer": True, "skip_bad": True, "columns": True,
                "question_column": True, "context_column": True, "answers_column": True},
    "image_classification": {"format": ("auto", "idx", "image_folder", "npz", *_RECORDS), "columns": True,
                             "image_column": True, "label_column": True},
    "translation": {"format": ("auto", *_RECORDS), "tokenizer": True, "source_language": True,
                    "target_language": True, "columns": True, "translation_column": True, "source_column": True,
                    "target_column": True},
}


@dataclass(frozen=True)
class TaskConfig:
    """The ``[task]`` section of a recipe: which task trains the model (``lm``: next-token language
    modelling, the default; ``mlm``: masked LM, + next-sentence pairs with the ``pretraining`` head;
    ``classification``, ``token_classification``, ``span_qa``: an encoder's fine-tuning tasks;
    ``image_classification``: a vision model's; ``translation``: an encoder-decoder's, on sentence pairs) and
    the settings of that task."""

    name: str = "lm"
    mask_probability: float = 0.15  # mlm: the share of tokens chosen (80% [MASK], 10% random, 10% kept)
    whole_word_masking: bool = False  # mlm: choose whole words (WordPiece tokenizers)
    doc_stride: int = 128  # span_qa: tokens shared by consecutive windows of a long context
    max_answer_length: int = 30  # span_qa: the longest answer predicted, in tokens
    n_best: int = 20  # span_qa: start and end candidates per window
    crop_padding: int = 0  # image_classification: random translation by up to this many pixels (zero padding)
    horizontal_flip: bool = False  # image_classification: mirror half the training images (not for digits)
    image_mean: tuple[float, ...] | None = None  # image_classification: per channel, on 0..1 pixels; None: measured
    image_std: tuple[float, ...] | None = None  # image_classification: per channel; set with image_mean
    batch_tokens: int = 4096  # translation: a batch's tokens on its longer side, padding included; 0: batch_size pairs
    bpe_vocab_size: int = 8000  # translation with data.tokenizer = "bpe": the joint BPE's size
    eval_bleu: bool = True  # translation: translate the evaluation sources and report BLEU (needs sacrebleu)
    eval_beams: int = 1  # translation: beams of those evaluation translations (1: greedy)

    def __post_init__(self) -> None:
        if self.name not in TASKS:
            raise TrainingError(f"task.name={self.name!r} is not one of {', '.join(TASKS)}")
        defaults = TaskConfig.__dataclass_fields__
        for key, tasks in TASK_OPTIONS.items():
            if getattr(self, key) != defaults[key].default and self.name not in tasks:
                raise TrainingError(f"task.{key} is a setting of the {' and '.join(tasks)} task, not {self.name!r}")
        if not 0.0 < self.mask_probability < 1.0:
            raise TrainingError(f"task.mask_probability={self.mask_probability} must be in (0, 1)")
        for key in ("doc_stride", "max_answer_length", "n_best", "eval_beams"):
            if getattr(self, key) < 1:
                raise TrainingError(f"task.{key}={getattr(self, key)} must be a positive integer")
        if self.batch_tokens < 0:
            raise TrainingError(f"task.batch_tokens={self.batch_tokens} must be 0 (training.batch_size pairs a batch) "
                                "or a number of tokens")
        if self.bpe_vocab_size < 259:
            raise TrainingError(f"task.bpe_vocab_size={self.bpe_vocab_size} is too small: a byte-level BPE needs the "
                                "256 bytes and 3 special tokens, at least 259")
        if self.crop_padding < 0:
            raise TrainingError(f"task.crop_padding={self.crop_padding} must be 0 (no augmentation) or more pixels")
        for key in ("image_mean", "image_std"):
            values = getattr(self, key)
            if values is not None:
                object.__setattr__(self, key, tuple(values))
        if (self.image_mean is None) != (self.image_std is None):
            raise TrainingError("task.image_mean and task.image_std are set together (or neither: measured on the "
                                "training images)")


def check_data_options(task: str, data: DataConfig) -> None:
    """Refuse a [data] setting the task does not read."""
    allowed = DATA_OPTIONS[task]
    if data.format not in allowed["format"]:
        raise TrainingError(f"data.format={data.format!r} is not read by the {task} task; it reads "
                            f"{', '.join(allowed['format'])}")
    defaults = DataConfig.__dataclass_fields__
    for key in ("tokenizer", "columns", "skip_bad", "source_language", "target_language", *COLUMN_OPTIONS):
        if getattr(data, key) != defaults[key].default and key not in allowed:
            readers = [name for name, options in DATA_OPTIONS.items() if key in options]
            raise TrainingError(f"data.{key} is not read by the {task} task" +
                                (f" (it is a setting of {', '.join(readers)})" if readers else ""))
    two_columns = data.source_column is not None or data.target_column is not None
    if task == "translation" and not two_columns and not (data.source_language and data.target_language):
        raise TrainingError("the translation task reads data.train (and data.eval) as corpus prefixes: set "
                            "data.source_language and data.target_language (PREFIX.de and PREFIX.en for \"de\", "
                            "\"en\"); a records file is read by those languages too, or by data.source_column and "
                            "data.target_column")
    if data.tokenizer == "bpe" and task != "translation":
        raise TrainingError("data.tokenizer = \"bpe\" (a joint BPE learned from sentence pairs) is for the translation "
                            "task; give a tokenizer file, or \"char\"")


def task_for_recipe(config: TaskConfig, data: DataConfig, *, seq_len: int | None = None, tokenizer=None,
                    label_names: tuple[str, ...] | None = None,
                    num_labels: int | None = None) -> tuple[Task, TaskData]:
    """The task a recipe names, on the data its ``[data]`` section loads. ``tokenizer``: the one a
    pretrained model folder brings (else the data's); ``label_names``: those the recipe declares;
    ``num_labels``: the count it declares, which the data's labels must match (an image set's integer
    labels are then checked to be ids below it), never silently replaced by the data's."""
    check_data_options(config.name, data)
    if config.name == "translation" and config.bpe_vocab_size != TaskConfig.bpe_vocab_size and data.tokenizer != "bpe":
        raise TrainingError("task.bpe_vocab_size is the size of a learned BPE: it is read only with data.tokenizer = "
                            "\"bpe\"")
    if tokenizer is not None and data.tokenizer != DataConfig.__dataclass_fields__["tokenizer"].default:
        raise TrainingError("data.tokenizer cannot be set with [model] init_from: the model folder's tokenizer "
                            "is the one its weights were trained with")
    options = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)
               if config.name in TASK_OPTIONS.get(field.name, ())}
    if num_labels is not None and label_names is None and config.name == "image_classification":
        label_names = tuple(str(number) for number in range(num_labels))  # integer labels: ids 0..num_labels-1
    task, loaded = TASKS[config.name].from_recipe(data, seq_len=seq_len, tokenizer=tokenizer, label_names=label_names,
                                                  **options)
    found = loaded.label_names
    if num_labels is not None and found and len(found) != num_labels:
        raise TrainingError(f"model.num_labels={num_labels} but the data has {len(found)} labels ({listed(found)}); "
                            f"name all {num_labels} with model.label_names (the data's among them), or leave "
                            "num_labels out to take the data's")
    return task, loaded
