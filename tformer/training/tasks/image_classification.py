"""Image classification (one image -> one label) from idx files, image folders or .npz arrays.

Images stay uint8 in memory; a batch is cut from them, fitted to the model (its channels and image size:
converted and resized, with a warning, when the data differs), augmented and normalised as whole-batch
tensor operations. Augmentation is a random translation by up to ``crop_padding`` pixels (zero padding,
then a crop of the original size) and, when asked, a horizontal flip of half the images (off by default:
digits must not flip); its draws come from a generator seeded by (seed, position) for the global batch,
so a batch is a pure function of both and N processes see what one sees.

Normalisation is the model's ``ImageProcessing``: the one a pretrained model folder brings, else the
recipe's ``image_mean`` / ``image_std``, else the mean and standard deviation measured on the training
images; the task hands it to the model (``model.image_processor``), so the run folder keeps it.
Evaluation is the classification task's: loss, accuracy, macro F1 and a confusion matrix.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tformer.data.files import DataFileError
from tformer.data.image_processing import ImageProcessing
from tformer.data.images import (
    IMAGE_COLUMN,
    LABEL_COLUMN,
    ImageData,
    fit_images,
    pixel_mean_std,
    read_image_records,
    read_images,
)
from tformer.data.sources import DataConfig
from tformer.errors import listed
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks.base import Batch, TaskData
from tformer.training.tasks.classification import LabelEvaluation
from tformer.training.tasks.examples import EVAL_WEIGHTS, ExampleTask, Rows, seeded_generator, training_count

AUGMENTATION_STREAM = 3  # seeded_generator streams: 1 epoch permutations, 2 masked-LM masks


def pad_and_crop(images: Tensor, padding: int, offsets: Tensor) -> Tensor:
    """Each image of ``images`` (B, C, H, W) zero-padded by ``padding`` pixels on every side, then cut back to
    H x W at ``offsets`` (B, 2): its (row, column) in the padded image, each in 0..2 * padding. An offset of
    ``padding`` gives the image back; others move it by up to ``padding`` pixels, the uncovered border zero."""
    batch, _, height, width = images.shape
    padded = nn.functional.pad(images, (padding, padding, padding, padding))  # (B, C, H + 2p, W + 2p)
    windows = padded.unfold(2, height, 1).unfold(3, width, 1)  # (B, C, 2p + 1, 2p + 1, H, W), a view
    return windows[torch.arange(batch), :, offsets[:, 0], offsets[:, 1]]  # (B, C, H, W)


def flip_some(images: Tensor, flips: Tensor) -> Tensor:
    """``images`` (B, C, H, W) with those where ``flips`` (B,) is true mirrored left to right."""
    return torch.where(flips[:, None, None, None], images.flip(-1), images)


@dataclass(frozen=True)
class ImageOptions:
    """The image_classification task's [task] settings."""

    crop_padding: int = 0  # random translation by up to this many pixels (zero padding)
    horizontal_flip: bool = False  # mirror half the training images (not for digits)
    image_mean: tuple[float, ...] | None = None  # per channel, on 0..1 pixels; None: measured
    image_std: tuple[float, ...] | None = None  # per channel; set with image_mean

    def __post_init__(self) -> None:
        if self.crop_padding < 0:
            raise TrainingError(f"task.crop_padding={self.crop_padding} must be 0 (no augmentation) or more pixels")
        for key in ("image_mean", "image_std"):
            values = getattr(self, key)
            if values is not None:
                object.__setattr__(self, key, tuple(values))
        if (self.image_mean is None) != (self.image_std is None):
            raise TrainingError("task.image_mean and task.image_std are set together (or neither: measured on the "
                                "training images)")


class ImageClassification(LabelEvaluation, ExampleTask):
    """Single-label classification of ``train`` (and ``evaluation``) images; the model is a vision model
    with head ``image_classification`` and as many labels as ``train.label_names``. ``crop_padding`` and
    ``horizontal_flip`` augment the training batches; ``image_mean`` / ``image_std`` (one value per channel,
    on 0..1 pixels) replace the statistics measured on the training images."""

    name = "image_classification"
    Options = ImageOptions
    data_formats = ("idx", "image_folder", "npz")
    data_settings = frozenset({"columns", "image_column", "label_column"})
    reads_seq_len = False  # the image and patch sizes set the sequence

    def __init__(self, train: ImageData, evaluation: ImageData | None = None, *, crop_padding: int = 0,
                 horizontal_flip: bool = False, image_mean: Sequence[float] | None = None,
                 image_std: Sequence[float] | None = None) -> None:
        super().__init__()
        if evaluation is not None and evaluation.label_names != train.label_names:
            raise TrainingError(f"{evaluation.source}: its label names ({listed(evaluation.label_names)}) differ "
                                f"from the training data's ({listed(train.label_names)})")
        ImageOptions(crop_padding, horizontal_flip, image_mean, image_std)  # checks them
        self.train, self.evaluation = train, evaluation
        self.label_names = train.label_names
        self.train_rows = _rows(train)
        self.eval_rows = None if evaluation is None else _rows(evaluation)
        self.crop_padding = crop_padding
        self.horizontal_flip = horizontal_flip
        self.image_mean = None if image_mean is None else tuple(image_mean)
        self.image_std = None if image_std is None else tuple(image_std)
        self.image_processor: ImageProcessing | None = None
        self.confusion = None

    @classmethod
    def label_names_for(cls, num_labels: int) -> tuple[str, ...]:
        """Integer labels are ids 0..num_labels-1: named by their numbers."""
        return tuple(str(number) for number in range(num_labels))

    @classmethod
    def from_recipe(cls, data: DataConfig, *, seq_len: int | None, tokenizer=None, label_names=None,
                    crop_padding: int = 0, horizontal_flip: bool = False, image_mean=None, image_std=None):
        """The task on the images a recipe's [data] names (``eval``, else the last ``eval_fraction`` of
        ``train``); label names from the recipe, else from the training data."""
        if tokenizer is not None:
            raise TrainingError("the image_classification task reads images; the model folder brings a tokenizer "
                                "(is it a vision model?)")
        try:
            train = _read(data, data.train, label_names)
            evaluation = None
            if data.eval:
                evaluation = _read(data, data.eval, train.label_names)
            elif data.eval_fraction > 0:
                train, evaluation = train.split(training_count(len(train), data.eval_fraction, "images",
                                                               data.train))
        except DataFileError as error:
            raise TrainingError(str(error)) from None
        task = cls(train, evaluation, crop_padding=crop_padding, horizontal_flip=horizontal_flip,
                   image_mean=image_mean, image_std=image_std)
        return task, TaskData(None, None, task.describe(), task.label_names)

    def describe(self) -> str:
        """One line: images per split, their shape and the labels."""
        held_out = "" if self.evaluation is None else f"; evaluation {self.evaluation.describe()}"
        return (f"training {self.train.describe()}{held_out}; {len(self.label_names)} labels: "
                f"{listed(self.label_names)}")

    # ---- preparing for a model ------------------------------------------------------------------

    def prepare(self, config: TrainingConfig, context: ProcessContext, model: nn.Module) -> None:
        super().prepare(config, context, model)
        model_config = model.config
        if model_config.head != "image_classification":
            raise TrainingError(f"the image_classification task trains a vision model with head "
                                f"'image_classification', not architecture={model_config.architecture!r}, "
                                f"head={model_config.head!r}")
        if model_config.num_labels != len(self.label_names):
            raise TrainingError(f"the data has {len(self.label_names)} labels ({listed(self.label_names)}) but "
                                f"the model's num_labels is {model_config.num_labels}")
        self.num_channels, self.image_size = model_config.num_channels, model_config.image_size
        for data in (self.train, self.evaluation):
            if data is not None:
                self._check_fit(data)
        self.image_processor = self._processing(getattr(model, "image_processor", None))
        model.image_processor = self.image_processor

    def _check_fit(self, data: ImageData) -> None:
        """Warn when the images are converted or resized for the model; refuse what cannot be converted."""
        channels, height, width = data.shape
        changes = []
        if channels != self.num_channels:
            if {channels, self.num_channels} != {1, 3}:
                raise TrainingError(f"{data.source}: the images have {channels} channels but the model reads "
                                    f"{self.num_channels} (num_channels); only 1 <-> 3 are converted")
            changes.append(f"{'greyscale' if channels == 1 else 'RGB'} images read as "
                           f"{'RGB' if channels == 1 else 'greyscale'}")
        if (height, width) != (self.image_size, self.image_size):
            changes.append(f"{height} x {width} images resized to the model's {self.image_size} x {self.image_size} "
                           "(bilinear)")
        if changes:
            warnings.warn(f"{data.source}: {'; '.join(changes)}", stacklevel=3)

    def _processing(self, existing: ImageProcessing | None) -> ImageProcessing:
        """The model's image processing if it has one (its weights were trained with it), else one with the
        recipe's or the measured mean and std."""
        if existing is not None:
            if (existing.image_size, existing.num_channels) != (self.image_size, self.num_channels):
                raise TrainingError(f"the model's image processor reads {existing.num_channels} x "
                                    f"{existing.image_size} x {existing.image_size} images, its config "
                                    f"{self.num_channels} x {self.image_size} x {self.image_size}")
            for name, value, own in (("image_mean", self.image_mean, existing.mean),
                                     ("image_std", self.image_std, existing.std)):
                if value is not None and tuple(map(float, value)) != own:
                    raise TrainingError(f"task.{name}={list(value)} differs from the model folder's image processor "
                                        f"({list(own)}): a model reads pixels normalised as it was trained")
            return existing
        if self.image_mean is not None:
            mean, std = self.image_mean, self.image_std
        else:
            mean, std = pixel_mean_std(self.train.images, self.num_channels, self.image_size)
        try:
            return ImageProcessing(self.image_size, self.num_channels, mean, std)
        except ValueError as error:
            raise TrainingError(f"task.image_mean/image_std: {error}") from None

    # ---- batches ----------------------------------------------------------------------------------

    def train_batch(self, position: int) -> Batch:
        index = self.global_indices(position, len(self.train_rows))  # (G,): every process's rows
        draws = {"index": index, **self._augmentation_draws(position, index.numel())}
        mine = self.local(draws)
        rows = self.train_rows.select(mine["index"])
        images = fit_images(rows["pixel_values"], self.num_channels, self.image_size)  # (B, C, H, W) uint8
        if self.crop_padding:
            images = pad_and_crop(images, self.crop_padding, mine["offsets"])
        if self.horizontal_flip:
            images = flip_some(images, mine["flips"])
        return {"pixel_values": self.image_processor(images), "labels": rows["labels"]}

    def _augmentation_draws(self, position: int, size: int) -> dict[str, Tensor]:
        """The random numbers of the global batch at ``position``: crop offsets (G, 2) and flips (G,)."""
        generator = seeded_generator(self.config.seed, AUGMENTATION_STREAM, position)
        draws = {}
        if self.crop_padding:
            draws["offsets"] = torch.randint(0, 2 * self.crop_padding + 1, (size, 2), generator=generator)
        if self.horizontal_flip:
            draws["flips"] = torch.rand(size, generator=generator) < 0.5
        return draws

    def eval_batches(self) -> Iterator[Batch]:
        for index, weights in self.eval_row_batches():
            rows = self.eval_rows.select(index)
            images = fit_images(rows["pixel_values"], self.num_channels, self.image_size)
            yield {"pixel_values": self.image_processor(images), "labels": rows["labels"], EVAL_WEIGHTS: weights}


def _rows(data: ImageData) -> Rows:
    """Images (N, C, H, W) and labels (N,) as the rows an ExampleTask draws from (every row one unit long)."""
    return Rows({"pixel_values": data.images, "labels": data.labels}, torch.ones(len(data), dtype=torch.long), {})


def _read(data: DataConfig, path: str, label_names) -> ImageData:
    """The labelled images of ``path``: idx, an image folder, .npz, or records with an image column."""
    kind = data.record_format(path)
    data.check_columns(ImageClassification.name, path, kind)
    if kind is None:
        return read_images(path, format=None if data.format == "auto" else data.format, label_names=label_names)
    return read_image_records(path, format=kind, columns=data.columns, label_names=label_names,
                              image_column=data.image_column or IMAGE_COLUMN,
                              label_column=data.label_column or LABEL_COLUMN)
