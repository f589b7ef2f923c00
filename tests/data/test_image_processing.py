"""ImageProcessing: the normalisation a vision model reads its pixels with, and its
preprocessor_config.json, checked against Hugging Face's ViT image processor."""

import json

import numpy as np
import pytest
import torch

from tformer.data.image_processing import PREPROCESSOR_NAME, ImageProcessing, ImageProcessingError

IMAGENET = ImageProcessing(image_size=8, num_channels=3, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def _hf_processor(**settings):
    transformers = pytest.importorskip("transformers")
    return transformers.ViTImageProcessorPil(**settings)


@pytest.mark.slow  # imports transformers
@pytest.mark.parametrize("processing", [
    IMAGENET,
    ImageProcessing(image_size=6, num_channels=1, mean=(0.1307,), std=(0.3081,)),
])
def test_normalisation_equals_hugging_faces(processing):
    channels, size = processing.num_channels, processing.image_size
    images = torch.randint(0, 256, (4, channels, size, size), dtype=torch.uint8)
    ours = processing(images)
    assert ours.dtype == torch.float32 and ours.shape == images.shape
    hf = _hf_processor(do_resize=False, image_mean=list(processing.mean), image_std=list(processing.std))
    theirs = hf([image.numpy() for image in images], input_data_format="channels_first",
                data_format="channels_first", return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    # The formula of the contract, per channel.
    mean = torch.tensor(processing.mean).view(1, -1, 1, 1)
    std = torch.tensor(processing.std).view(1, -1, 1, 1)
    torch.testing.assert_close(ours, (images.float() / 255 - mean) / std)


@pytest.mark.slow  # imports transformers
def test_saved_settings_read_back_equal_and_hugging_face_reads_them(tmp_path):
    path = IMAGENET.save(tmp_path)
    assert path == tmp_path / PREPROCESSOR_NAME
    raw = json.loads(path.read_text())
    assert raw["image_processor_type"] == "ViTImageProcessor"
    assert raw["size"] == {"height": 8, "width": 8}
    assert raw["do_rescale"] and raw["do_normalize"] and raw["do_resize"]
    assert ImageProcessing.read(tmp_path) == IMAGENET
    hf = pytest.importorskip("transformers").ViTImageProcessorPil.from_pretrained(tmp_path)
    assert list(hf.image_mean) == list(IMAGENET.mean) and list(hf.image_std) == list(IMAGENET.std)
    assert hf.size["height"] == hf.size["width"] == 8
    assert hf.rescale_factor == IMAGENET.rescale


@pytest.mark.slow  # imports transformers
def test_reads_a_file_hugging_face_saved(tmp_path):
    _hf_processor(size={"height": 32, "width": 32}, image_mean=[0.5, 0.25, 0.125],
                  image_std=[0.5, 0.5, 0.25]).save_pretrained(tmp_path)
    assert ImageProcessing.read(tmp_path) == ImageProcessing(32, 3, (0.5, 0.25, 0.125), (0.5, 0.5, 0.25))


def test_switched_off_steps_and_single_values():
    raw = {"size": 4, "do_rescale": False, "do_normalize": False, "image_mean": [9, 9], "image_std": [9, 9]}
    assert ImageProcessing.from_hf(raw, num_channels=2) == ImageProcessing(4, 2, (0.0, 0.0), (1.0, 1.0), 1.0)
    spread = ImageProcessing.from_hf({"size": 4, "image_mean": 0.5, "image_std": 0.25}, num_channels=3)
    assert spread.mean == (0.5, 0.5, 0.5) and spread.std == (0.25, 0.25, 0.25)
    with pytest.raises(ImageProcessingError, match="how many channels"):
        ImageProcessing.from_hf({"size": 4, "image_mean": 0.5, "image_std": 0.25})


@pytest.mark.parametrize(("settings", "message"), [
    ({"std": (0.5, 0.0, 0.5)}, "must be > 0"),
    ({"mean": (0.5, 0.5)}, "num_channels=3 needs one per channel"),
    ({"mean": (0.5, float("nan"), 0.5)}, "finite numbers"),
    ({"image_size": 0}, "image_size=0 must be a positive integer"),
    ({"rescale": -1.0}, "rescale=-1.0"),
])
def test_bad_settings_are_refused(settings, message):
    base = {"image_size": 8, "num_channels": 3, "mean": (0.5,) * 3, "std": (0.5,) * 3}
    with pytest.raises(ImageProcessingError, match=message):
        ImageProcessing(**{**base, **settings})


def test_bad_files_are_named(tmp_path):
    with pytest.raises(ImageProcessingError, match="no such file"):
        ImageProcessing.read(tmp_path)
    (tmp_path / PREPROCESSOR_NAME).write_text("{broken")
    with pytest.raises(ImageProcessingError, match="not valid JSON"):
        ImageProcessing.read(tmp_path)
    (tmp_path / PREPROCESSOR_NAME).write_text(json.dumps({"size": {"shortest_edge": 224}, "image_mean": [0.5],
                                                          "image_std": [0.5]}))
    with pytest.raises(ImageProcessingError, match=f"{PREPROCESSOR_NAME}: size=.*not supported"):
        ImageProcessing.read(tmp_path)


@pytest.mark.parametrize(("images", "message"), [
    (torch.zeros(2, 3, 8, 8), "uint8"),
    (np.zeros((2, 3, 8, 8), dtype=np.uint8), "uint8"),
    (torch.zeros(3, 8, 8, dtype=torch.uint8), r"\(N, C, H, W\)"),
    (torch.zeros(2, 1, 8, 8, dtype=torch.uint8), "1 channels, the model reads 3"),
    (torch.zeros(2, 3, 8, 9, dtype=torch.uint8), "8 x 9, the model reads 8 x 8"),
])
def test_images_that_do_not_fit_are_refused(images, message):
    with pytest.raises(ValueError, match=message):
        IMAGENET(images)
