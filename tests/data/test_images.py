"""The image readers (idx, image folders, .npz) on small files the tests write, their one-line errors for
bad input, the real MNIST / Fashion-MNIST files, and fitting images to a model (channels, size, statistics)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from shared_data import SHARED_DATA, require

from tformer.data.files import DataFileError
from tformer.data.images import (
    FASHION_MNIST_LABELS,
    fit_images,
    image_format,
    pixel_mean_std,
    read_idx_header,
    read_images,
)
from tformer.errors import TformerError


def write_idx(path: Path, array: np.ndarray, magic_code: int = 0x08, compress: bool | None = None) -> Path:
    """An idx file of uint8 ``array`` (magic: two zero bytes, the type code, the number of dimensions)."""
    header = bytes([0, 0, magic_code, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    compress = path.suffix == ".gz" if compress is None else compress
    path.write_bytes(gzip.compress(raw) if compress else raw)
    return path


def idx_pair(folder: Path, count: int = 6, size: int = 5, suffix: str = ".gz", split: str = "train"):
    generator = np.random.default_rng(0)
    images = generator.integers(0, 256, (count, size, size), dtype=np.uint8)
    labels = generator.integers(0, 4, count, dtype=np.uint8)
    labels[0] = 3  # the largest label occurs: names 0..3
    write_idx(folder / f"{split}-images-idx3-ubyte{suffix}", images)
    write_idx(folder / f"{split}-labels-idx1-ubyte{suffix}", labels, compress=suffix == ".gz")
    return folder / f"{split}-images-idx3-ubyte{suffix}", images, labels


@pytest.mark.parametrize("suffix", [".gz", ""])
def test_idx_images_read_with_their_labels_found_beside_them(tmp_path, suffix):
    path, images, labels = idx_pair(tmp_path, suffix=suffix)
    data = read_images(path)
    assert data.images.dtype == torch.uint8 and data.images.shape == (6, 1, 5, 5)
    assert torch.equal(data.images[:, 0], torch.from_numpy(images))
    assert data.labels.dtype == torch.int64 and data.labels.tolist() == labels.tolist()
    assert data.label_names == ("0", "1", "2", "3") and data.source == str(path)
    assert data.describe() == f"{path.name}: 6 images of 1 x 5 x 5"
    named = read_images(path, label_names=["a", "b", "c", "d", "e"])
    assert named.label_names == ("a", "b", "c", "d", "e")


def test_idx_labels_can_be_named_and_bad_idx_files_are_one_line_errors(tmp_path):
    path, images, labels = idx_pair(tmp_path)
    other = write_idx(tmp_path / "my-labels.bin", labels[::-1].copy(), compress=False)
    assert read_images(path, labels=other).labels.tolist() == labels[::-1].tolist()
    write_idx(tmp_path / "short-labels.bin", labels[:5], compress=False)
    with pytest.raises(DataFileError, match=r"train-images-idx3-ubyte.gz holds 6 images but .*short-labels.bin holds "
                                            r"5 labels; an images file and its labels file have one label per image"):
        read_images(path, labels=tmp_path / "short-labels.bin")
    with pytest.raises(DataFileError, match=r"idx magic number 0x00000801, expected images \(0x00000803"):
        read_images(tmp_path / "train-labels-idx1-ubyte.gz", format="idx")
    with pytest.raises(DataFileError, match=r"labels-idx1-ubyte.gz: row 0 \(counting from 0\) has label 3, outside "
                                            r"the ids 0..1 of the 2 label names \(no, yes\)"):
        read_images(path, label_names=["no", "yes"])
    raw = gzip.decompress(path.read_bytes())
    (tmp_path / "cut-images-idx3-ubyte").write_bytes(raw[:-7])
    write_idx(tmp_path / "cut-labels-idx1-ubyte", labels, compress=False)
    with pytest.raises(DataFileError, match=r"cut-images-idx3-ubyte: the header announces 6 x 5 x 5 = 150 bytes of "
                                            r"data, the file holds 143"):
        read_images(tmp_path / "cut-images-idx3-ubyte")
    (tmp_path / "lonely-images-idx3-ubyte").write_bytes(raw)
    with pytest.raises(DataFileError, match=r"no labels file beside it \(looked for lonely-labels-idx1-ubyte and "
                                            r"lonely-labels-idx1-ubyte.gz\)"):
        read_images(tmp_path / "lonely-images-idx3-ubyte")
    (tmp_path / "text-images-idx3-ubyte").write_text("hello, world")
    with pytest.raises(DataFileError, match="not an idx file"):
        read_images(tmp_path / "text-images-idx3-ubyte")


def write_png(path: Path, pixels: np.ndarray, format: str | None = None) -> np.ndarray:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format=format)
    return pixels


def grey(seed: int, size: int = 6) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (size, size), dtype=np.uint8)


def test_an_image_folder_reads_one_class_per_subfolder_in_sorted_order(tmp_path):
    root = tmp_path / "train"
    expected = {("cat", 0): write_png(root / "cat" / "0.png", grey(0)), ("cat", 1): write_png(root / "cat" / "1.PNG",
                grey(1)), ("ant", 0): write_png(root / "ant" / "a.png", grey(2))}
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / ".hidden").mkdir()
    data = read_images(root)
    assert data.label_names == ("ant", "cat") and data.labels.tolist() == [0, 1, 1]
    assert data.images.shape == (3, 1, 6, 6)
    for row, key in enumerate([("ant", 0), ("cat", 0), ("cat", 1)]):
        assert np.array_equal(data.images[row, 0].numpy(), expected[key])  # PNG is lossless
    assert data.notes == ["1 files that are not PNG/JPEG left out"]
    # One colour image: every image is read as RGB (greyscale ones repeated in the three channels).
    colour = np.random.default_rng(3).integers(0, 256, (6, 6, 3), dtype=np.uint8)
    write_png(root / "bee" / "b.jpg", colour, format="JPEG")
    data = read_images(root)
    assert data.label_names == ("ant", "bee", "cat") and data.images.shape == (4, 3, 6, 6)
    assert all(torch.equal(data.images[0, channel], torch.from_numpy(expected[("ant", 0)])) for channel in range(3))
    decoded = np.asarray(Image.open(root / "bee" / "b.jpg").convert("RGB"))
    assert np.array_equal(data.images[1].permute(1, 2, 0).numpy(), decoded)
    assert read_images(root, num_channels=1).images.shape == (4, 1, 6, 6)
    # Numeric class names sort as numbers; declared names fix the ids.
    digits = tmp_path / "digits"
    for name in ("10", "2", "1"):
        write_png(digits / name / "x.png", grey(int(name)))
    assert read_images(digits).label_names == ("1", "2", "10")
    declared = read_images(digits, label_names=["10", "2", "1", "0"])
    assert declared.labels.tolist() == [0, 1, 2] and torch.equal(declared.images[0, 0], torch.from_numpy(grey(10)))


def test_bad_image_folders_are_one_line_errors_naming_the_file(tmp_path):
    root = tmp_path / "train"
    write_png(root / "a" / "good.png", grey(0))
    (root / "b").mkdir()
    (root / "b" / "readme.md").write_text("nothing here")
    with pytest.raises(DataFileError, match=r"train/b: no images \(PNG or JPEG files ending in .png, .jpg, .jpeg\)"):
        read_images(root)
    (root / "b" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    with pytest.raises(DataFileError, match=r"train/b/broken.png: not a readable image \(.*\); allowed: PNG or JPEG"):
        read_images(root)
    write_png(root / "b" / "broken.png", grey(1, size=8))
    with pytest.raises(DataFileError, match=r"train/b/broken.png is 8 x 8 but .*train/a/good.png is 6 x 6: the images "
                                            r"of a data set share one size \(or read them with image_size"):
        read_images(root)
    resized = read_images(root, image_size=6)
    assert resized.images.shape == (2, 1, 6, 6) and resized.notes[0] == "1 resized to 6 x 6"
    assert resized.describe().endswith("2 images of 1 x 6 x 6 (1 resized to 6 x 6; 1 files that are not PNG/JPEG "
                                       "left out)")
    with pytest.raises(DataFileError, match=r"class folder 'b' is not one of the label names \(a\)"):
        read_images(root, label_names=["a"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFileError, match=r"empty: no class folders; an image folder holds one subfolder"):
        read_images(tmp_path / "empty")
    with pytest.raises(DataFileError, match=r"cannot tell the image format from the name"):
        read_images(tmp_path / "photo.bmp")
    assert isinstance(DataFileError("x"), TformerError)


def test_npz_arrays_read_channels_last_and_their_label_names(tmp_path):
    generator = np.random.default_rng(0)
    images = generator.integers(0, 256, (5, 4, 4, 3), dtype=np.uint8)
    np.savez(tmp_path / "rgb.npz", images=images, labels=np.array([0, 1, 2, 1, 0]),
             label_names=np.array(["red", "green", "blue"]))
    data = read_images(tmp_path / "rgb.npz")
    assert data.images.shape == (5, 3, 4, 4) and torch.equal(data.images, torch.from_numpy(images).permute(0, 3, 1, 2))
    assert data.label_names == ("red", "green", "blue") and data.labels.tolist() == [0, 1, 2, 1, 0]
    np.savez(tmp_path / "grey.npz", images=images[..., 0], labels=np.arange(5))
    assert read_images(tmp_path / "grey.npz").images.shape == (5, 1, 4, 4)
    assert read_images(tmp_path / "grey.npz").label_names == ("0", "1", "2", "3", "4")
    np.savez(tmp_path / "splits.npz", x_train=images, y_train=np.arange(5))
    with pytest.raises(DataFileError, match=r"splits.npz: arrays x_train, y_train; a .npz of images holds 'images'"):
        read_images(tmp_path / "splits.npz")
    np.savez(tmp_path / "float.npz", images=images / 255.0, labels=np.arange(5))
    with pytest.raises(DataFileError, match=r"'images' is float64; it must be uint8"):
        read_images(tmp_path / "float.npz")
    np.savez(tmp_path / "short.npz", images=images, labels=np.arange(4))
    with pytest.raises(DataFileError, match=r"it must hold one integer per image \(5\)"):
        read_images(tmp_path / "short.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataFileError, match=r"junk.npz: not a readable .npz file"):
        read_images(tmp_path / "junk.npz")


def test_formats_are_told_by_the_name():
    assert image_format("data/train-images-idx3-ubyte.gz") == "idx"
    assert image_format("data/t10k-images-idx3-ubyte") == "idx"
    assert image_format("arrays.npz") == "npz"
    assert image_format(Path(__file__).parent) == "image_folder"


MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]  # ../shared/data/README.md


@pytest.mark.parametrize("dataset", ["mnist", "fashion-mnist"])
def test_the_shared_mnist_files_have_the_published_shapes(dataset):
    folder = SHARED_DATA / dataset
    require(folder)
    for split, count in (("train", 60_000), ("t10k", 10_000)):
        assert read_idx_header(folder / f"{split}-images-idx3-ubyte.gz") == (0x803, (count, 28, 28))
        assert read_idx_header(folder / f"{split}-labels-idx1-ubyte.gz") == (0x801, (count,))
    names = FASHION_MNIST_LABELS if dataset == "fashion-mnist" else None
    test = read_images(folder / "t10k-images-idx3-ubyte.gz", label_names=names)
    assert test.images.shape == (10_000, 1, 28, 28)
    counts = torch.bincount(test.labels, minlength=10).tolist()
    assert counts == (MNIST_TEST_COUNTS if dataset == "mnist" else [1000] * 10)
    assert test.label_names == (FASHION_MNIST_LABELS if dataset == "fashion-mnist" else tuple("0123456789"))


def test_fitting_images_to_a_model_converts_channels_as_pillow_does_and_resizes():
    generator = np.random.default_rng(0)
    rgb = generator.integers(0, 256, (3, 7, 7, 3), dtype=np.uint8)
    images = torch.from_numpy(rgb).permute(0, 3, 1, 2).contiguous()  # (3, 3, 7, 7)
    assert fit_images(images, 3, 7) is images  # fits: no copy
    greyscale = fit_images(images, 1, 7)
    pillow = np.stack([np.asarray(Image.fromarray(image).convert("L")) for image in rgb])
    assert np.abs(greyscale[:, 0].numpy().astype(int) - pillow.astype(int)).max() <= 1  # Pillow rounds in fixed point
    assert torch.equal(fit_images(greyscale, 3, 7), greyscale.expand(-1, 3, -1, -1))
    flat = torch.full((2, 1, 10, 10), 77, dtype=torch.uint8)
    assert torch.equal(fit_images(flat, 1, 4), torch.full((2, 1, 4, 4), 77, dtype=torch.uint8))
    with pytest.raises(DataFileError, match="images of 2 channels cannot be read as 3"):
        fit_images(torch.zeros(1, 2, 4, 4, dtype=torch.uint8), 3, 4)


def test_pixel_statistics_equal_the_mean_and_std_of_every_pixel():
    images = torch.randint(0, 256, (50, 3, 6, 6), dtype=torch.uint8)
    mean, std = pixel_mean_std(images, 3, 6, chunk=16)
    pixels = images.double().div(255).transpose(0, 1).reshape(3, -1)
    assert mean == pytest.approx(pixels.mean(dim=1).tolist(), abs=1e-12)
    assert std == pytest.approx(pixels.std(dim=1, correction=0).tolist(), abs=1e-12)


def test_the_mnist_training_pixels_have_their_well_known_statistics():
    """0.1307 and 0.3081: the normalisation every MNIST example (PyTorch's among them) uses."""
    path = SHARED_DATA / "mnist" / "train-images-idx3-ubyte.gz"
    require(path)
    train = read_images(path)
    mean, std = pixel_mean_std(train.images, 1, 28)
    assert round(mean[0], 4) == 0.1307 and round(std[0], 4) == 0.3081
