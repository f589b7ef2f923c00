"""The image-classification task: batches that are a pure function of (seed, position), split across
processes as one process sees them, augmented by batched tensor operations, normalised with measured or
given statistics (or a pretrained model's), metrics equal to the confusion matrix of the predictions, and
its refusals; recipes name it and its settings."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tformer.data.image_processing import ImageProcessing
from tformer.data.images import ImageData
from tformer.data.sources import DataConfig
from tformer.evaluation.classification import classification_scores, confusion_matrix
from tformer.models.output import ModelOutput
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks.image_classification import ImageClassification, flip_some, pad_and_crop
from tformer.training.tasks.registry import TaskConfig, check_data_options

LABELS = ("circle", "square", "stripe")


class TinyVision(nn.Module):
    """A stand-in with the vision model's call: ``model(pixel_values (B, C, H, W), labels (B,))`` ->
    logits (B, num_labels) and the cross-entropy loss; a linear map of the pixels."""

    def __init__(self, image_size: int = 8, num_channels: int = 1, num_labels: int = 3,
                 head: str = "image_classification") -> None:
        super().__init__()
        self.config = SimpleNamespace(architecture="vision", head=head, image_size=image_size,
                                      num_channels=num_channels, num_labels=num_labels, label_names=())
        self.classifier = nn.Linear(num_channels * image_size * image_size, num_labels)
        self.image_processor = None

    def forward(self, pixel_values, labels=None) -> ModelOutput:
        logits = self.classifier(pixel_values.flatten(1))
        return ModelOutput(logits=logits, loss=None if labels is None else F.cross_entropy(logits, labels))


def image_data(count: int = 40, size: int = 8, channels: int = 1, seed: int = 0) -> ImageData:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (count, channels, size, size), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 3, (count,), generator=generator)
    return ImageData(images, labels, LABELS, f"images-{seed}")


def prepared(task: ImageClassification, batch_size: int = 4, rank: int = 0, world_size: int = 1, seed: int = 1337,
             model: nn.Module | None = None):
    model = model or TinyVision()
    task.prepare(TrainingConfig(batch_size=batch_size, seed=seed), ProcessContext(rank, world_size), model)
    return task, model


def augmented(**settings) -> ImageClassification:
    return ImageClassification(image_data(), image_data(count=11, seed=1), crop_padding=2, horizontal_flip=True,
                               **settings)


def test_a_batch_is_a_pure_function_of_seed_and_position():
    task, _ = prepared(augmented())
    first, again = task.train_batch(5), task.train_batch(5)
    assert torch.equal(first["pixel_values"], again["pixel_values"]) and torch.equal(first["labels"], again["labels"])
    fresh, _ = prepared(augmented())
    assert torch.equal(fresh.train_batch(5)["pixel_values"], first["pixel_values"])
    assert not torch.equal(task.train_batch(6)["pixel_values"], first["pixel_values"])
    other_seed, _ = prepared(augmented(), seed=7)
    assert not torch.equal(other_seed.train_batch(5)["pixel_values"], first["pixel_values"])
    assert first["pixel_values"].dtype == torch.float32 and first["pixel_values"].shape == (4, 1, 8, 8)


def test_two_processes_see_the_rows_one_process_sees_with_twice_the_batch():
    one, _ = prepared(augmented(), batch_size=6)
    ranks = [prepared(augmented(), batch_size=3, rank=rank, world_size=2)[0] for rank in range(2)]
    for position in range(8):  # more than one epoch of 40 images
        whole = one.train_batch(position)
        parts = [task.train_batch(position) for task in ranks]
        for name in ("pixel_values", "labels"):
            assert torch.equal(torch.cat([part[name] for part in parts]), whole[name])


def test_without_augmentation_a_batch_is_the_normalised_images_of_an_epoch_permutation():
    data = image_data()
    task, model = prepared(ImageClassification(data))
    processor = model.image_processor
    assert processor is task.image_processor and processor.image_size == 8 and processor.num_channels == 1
    seen = torch.cat([task.train_batch(position)["labels"] for position in range(10)])
    assert sorted(seen.tolist()) == sorted(data.labels.tolist())  # one epoch: every image once
    batch = task.train_batch(3)
    index = task.global_indices(3, len(data))
    assert torch.equal(batch["pixel_values"], processor(data.images[index]))
    # The measured statistics normalise the training pixels to mean 0 and standard deviation 1.
    whole = processor(data.images).double()
    assert whole.mean().item() == pytest.approx(0.0, abs=1e-6) and whole.std(correction=0).item() == pytest.approx(
        1.0, abs=1e-6)


def reference_crop(image: torch.Tensor, padding: int, row: int, column: int) -> torch.Tensor:
    """One image (C, H, W), padded with zeros and cut at (row, column): the loop the batched version replaces."""
    padded = F.pad(image, (padding,) * 4)
    return padded[:, row : row + image.shape[1], column : column + image.shape[2]]


def test_random_crops_and_flips_equal_the_image_by_image_operations():
    images = torch.randint(0, 256, (6, 3, 5, 7), dtype=torch.uint8)
    offsets = torch.tensor([[0, 0], [2, 2], [4, 4], [0, 4], [3, 1], [2, 0]])
    cropped = pad_and_crop(images, 2, offsets)
    assert cropped.dtype == torch.uint8 and cropped.shape == images.shape
    for image, offset, result in zip(images, offsets.tolist(), cropped, strict=True):
        assert torch.equal(result, reference_crop(image, 2, *offset))
    assert torch.equal(cropped[1], images[1])  # the centred window is the image itself
    assert cropped[0, :, :2].eq(0).all() and torch.equal(cropped[0, :, 2:, 2:], images[0, :, :3, :5])
    flips = torch.tensor([True, False, True, False, False, True])
    flipped = flip_some(images, flips)
    for image, flip, result in zip(images, flips, flipped, strict=True):
        assert torch.equal(result, image.flip(-1) if flip else image)


def test_augmentation_follows_the_settings():
    data = image_data()
    plain, model = prepared(ImageClassification(data))
    processor = model.image_processor
    batches = {}
    for settings in ({}, {"crop_padding": 2}, {"horizontal_flip": True}):
        task, _ = prepared(ImageClassification(data, **settings), model=TinyVision())
        batches[tuple(settings)] = task.train_batch(2)["pixel_values"]
    index = plain.global_indices(2, len(data))
    original = processor(data.images[index])
    assert torch.equal(batches[()], original)
    assert not torch.equal(batches[("crop_padding",)], original)
    flipped = batches[("horizontal_flip",)]
    same = [torch.equal(row, base) for row, base in zip(flipped, original, strict=True)]
    mirrored = [torch.equal(row, base.flip(-1)) for row, base in zip(flipped, original, strict=True)]
    assert all(a or b for a, b in zip(same, mirrored, strict=True)) and any(mirrored)


def test_the_recipe_statistics_or_a_pretrained_models_processor_normalise():
    data = image_data()
    task, model = prepared(ImageClassification(data, image_mean=[0.5], image_std=[0.25]))
    assert (model.image_processor.mean, model.image_processor.std) == ((0.5,), (0.25,))
    expected = (data.images[task.global_indices(0, len(data))].float() / 255 - 0.5) / 0.25
    assert torch.allclose(task.train_batch(0)["pixel_values"], expected, atol=1e-6)
    pretrained = TinyVision()
    pretrained.image_processor = ImageProcessing(8, 1, (0.1,), (0.2,))
    task, model = prepared(ImageClassification(data), model=pretrained)
    assert model.image_processor is pretrained.image_processor is task.image_processor  # kept: its weights know it
    with pytest.raises(TrainingError, match=r"task.image_mean=\[0.5\] differs from the model folder's image "
                                            r"processor \(\[0.1\]\)"):
        prepared(ImageClassification(data, image_mean=[0.5], image_std=[0.2]), model=pretrained)
    with pytest.raises(TrainingError, match=r"mean=\[0.5, 0.5, 0.5\] has 3 values; num_channels=1 needs one per"):
        prepared(ImageClassification(data, image_mean=[0.5] * 3, image_std=[0.5] * 3))


def test_images_that_differ_from_the_model_are_converted_with_a_warning():
    data, held_out = image_data(size=6, channels=3), image_data(count=5, size=6, channels=3, seed=1)
    with pytest.warns(UserWarning, match=r"images-\d: RGB images read as greyscale; 6 x 6 images resized to the "
                                         r"model's 8 x 8 \(bilinear\)"):
        task, _ = prepared(ImageClassification(data, held_out))
    assert task.train_batch(0)["pixel_values"].shape == (4, 1, 8, 8)
    assert next(iter(task.eval_batches()))["pixel_values"].shape == (4, 1, 8, 8)
    with pytest.raises(TrainingError, match=r"the images have 3 channels but the model reads 2"):
        prepared(ImageClassification(data), model=TinyVision(num_channels=2))


def evaluate(task, model) -> dict:
    totals: dict = {}
    with torch.no_grad():
        for batch in task.eval_batches():
            for name, value in task.eval_sums(model, batch).items():
                totals[name] = totals.get(name, 0.0) + float(value)
    return totals


def test_metrics_equal_the_confusion_matrix_of_the_predictions():
    data, held_out = image_data(), image_data(count=11, seed=1)
    task, model = prepared(ImageClassification(data, held_out), batch_size=4)
    metrics = task.finalise(evaluate(task, model))
    with torch.no_grad():
        logits = model(model.image_processor(held_out.images)).logits
    expected = classification_scores(confusion_matrix(held_out.labels, logits.argmax(-1), 3), LABELS)
    assert metrics["eval_accuracy"] == pytest.approx(expected.accuracy)
    assert metrics["eval_f1"] == pytest.approx(expected.macro_f1)
    assert metrics["eval_loss"] == pytest.approx(F.cross_entropy(logits, held_out.labels).item(), rel=1e-5)
    assert np.array_equal(task.confusion, expected.matrix) and task.confusion.sum() == 11
    totals: dict = {}
    for rank in range(2):  # two processes (one with a filler row) total what one does
        shard, _ = prepared(ImageClassification(data, held_out), batch_size=4, rank=rank, world_size=2, model=model)
        for name, value in evaluate(shard, model).items():
            totals[name] = totals.get(name, 0.0) + value
    assert task.finalise(totals) == pytest.approx(metrics)


def test_the_task_refuses_a_model_that_does_not_fit():
    data = image_data()
    with pytest.raises(TrainingError, match=r"the data has 3 labels \(circle, square, stripe\) but the model's "
                                            r"num_labels is 2"):
        prepared(ImageClassification(data), model=TinyVision(num_labels=2))
    with pytest.raises(TrainingError, match=r"trains a vision model with head 'image_classification', not "
                                            r"architecture='vision', head=None"):
        prepared(ImageClassification(data), model=TinyVision(head=None))
    with pytest.raises(TrainingError, match="image_mean and task.image_std are set together"):
        ImageClassification(data, image_mean=[0.5])


def test_task_and_data_settings_are_refused_where_they_are_not_read(tmp_path):
    assert TaskConfig(name="image_classification", crop_padding=4, image_mean=[0.5], image_std=[0.2]).image_mean == (
        0.5,)
    with pytest.raises(TrainingError, match=r"task.crop_padding is a setting of the image_classification task, not "
                                            r"'lm'"):
        TaskConfig(crop_padding=4)
    with pytest.raises(TrainingError, match=r"task.horizontal_flip is a setting of the image_classification task"):
        TaskConfig(name="classification", horizontal_flip=True)
    with pytest.raises(TrainingError, match="task.crop_padding=-1 must be 0"):
        TaskConfig(name="image_classification", crop_padding=-1)
    with pytest.raises(TrainingError, match="set together"):
        TaskConfig(name="image_classification", image_std=[0.2])
    (tmp_path / "vocab.txt").write_text("[PAD]\n")
    with pytest.raises(TrainingError, match="data.tokenizer is not read by the image_classification task"):
        check_data_options("image_classification", DataConfig(train="x", tokenizer=str(tmp_path / "vocab.txt")))
    with pytest.raises(TrainingError, match=r"data.format='idx' is not read by the lm task"):
        check_data_options("lm", DataConfig(train="x", format="idx"))
    with pytest.raises(TrainingError, match=r"data.format='squad' is not read by the image_classification task; it "
                                            r"reads auto, idx, image_folder, npz, jsonl, csv, tsv, parquet, datasets"):
        check_data_options("image_classification", DataConfig(train="x", format="squad"))
