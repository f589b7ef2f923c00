"""Labelled images for image classification: idx files (MNIST, Fashion-MNIST), image folders (one
subfolder per class) and ``.npz`` arrays, each read into one ``ImageData``: uint8 images (N, C, H, W),
int64 labels (N,) and the label names.

* **idx** (``format="idx"``): the images file (``magic 0x00000803``: N x H x W uint8, gzip or not) and
  its labels file (``0x00000801``: N uint8), found beside it by the standard name (``train-images-idx3-ubyte``
  -> ``train-labels-idx1-ubyte``, with or without ``.gz``) or given. Label names: "0".."K-1", or the
  caller's (``FASHION_MNIST_LABELS`` for Fashion-MNIST).
* **image folder** (``format="image_folder"``): ``ROOT/CLASS/*.png|jpg|jpeg``, decoded with Pillow; the
  label names are the class folders' names, sorted (numerically when every name is an integer). Greyscale
  images give 1 channel unless some image has colour (then every image is read as RGB); ``num_channels``
  forces one. Images of different sizes are refused, naming two of them, unless ``image_size`` is given:
  then every image of another size is resized to it (bilinear) and counted in ``notes``.
* **npz** (``format="npz"``): the arrays ``images`` (uint8, (N, H, W) or channels-last (N, H, W, C) with
  C = 1 or 3), ``labels`` (integers >= 0, (N,)) and optionally ``label_names`` (strings, (K,)); any other
  array is refused, so a file holding several splits (``x_train``, ``x_test``) is not read by guesswork.

* **records** (``read_image_records``): JSONL, TSV/CSV, Parquet or a datasets folder with an image column
  (Hugging Face's Image feature: PNG/JPEG bytes; or a file path) and a label column.

Bad input is a ``DataFileError`` naming the file and what is allowed: counts that disagree, a corrupt
image, a folder without images, images of mixed sizes, a label outside the label names.
"""

from __future__ import annotations

import gzip
import io
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from tformer.data.files import DataFileError, sorted_names
from tformer.data.records import RecordFile, class_name, field_value
from tformer.errors import listed, quoted

IMAGE_FORMATS = ("idx", "image_folder", "npz")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC = 0x00000803, 0x00000801
# Fashion-MNIST's classes by label id (github.com/zalandoresearch/fashion-mnist).
FASHION_MNIST_LABELS = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                        "Ankle boot")
MNIST_LABELS = tuple(str(digit) for digit in range(10))
NPZ_ARRAYS = ("images", "labels", "label_names")
GREY_MODES = ("1", "L", "LA")  # Pillow's 8-bit (and 1-bit) modes without colour
IMAGE_COLUMN, LABEL_COLUMN = "image", "label"  # Hugging Face's mnist / beans / food101 names (cifar10: img)
# Labels without names are ids 0..K-1, K = the largest + 1; past this many classes a stray value (10**12 in
# one row) would build as many names and a head as wide, so more classes need their names (or num_labels).
MAX_UNNAMED_LABELS = 1000


@dataclass
class ImageData:
    """Labelled images: ``images`` (N, C, H, W) uint8, ``labels`` (N,) int64 ids into ``label_names``,
    the file or folder they came from and ``notes`` on what reading changed (images resized, files left out)."""

    images: Tensor
    labels: Tensor
    label_names: tuple[str, ...]
    source: str
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def shape(self) -> tuple[int, int, int]:
        """(C, H, W) of every image."""
        return tuple(self.images.shape[1:])

    def describe(self) -> str:
        """One line: where from, how many images of which shape, and the notes."""
        channels, height, width = self.shape
        notes = f" ({'; '.join(self.notes)})" if self.notes else ""
        return f"{Path(self.source).name}: {len(self):,} images of {channels} x {height} x {width}{notes}"

    def split(self, keep: int) -> tuple[ImageData, ImageData]:
        """The first ``keep`` images, and the rest (held out for evaluation)."""
        head = ImageData(self.images[:keep], self.labels[:keep], self.label_names, self.source, self.notes)
        return head, ImageData(self.images[keep:], self.labels[keep:], self.label_names, self.source)


def image_format(path: str | Path) -> str:
    """idx, image_folder or npz, from the path: a folder, a name ending in .npz, or an idx name
    (``...-idx3-ubyte``, ``.idx3``, gzip or not)."""
    path = Path(path)
    if path.is_dir():
        return "image_folder"
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".npz"):
        return "npz"
    if "idx3" in name or name.endswith(("-ubyte", ".idx")):
        return "idx"
    raise DataFileError(f"{path}: cannot tell the image format from the name; give a folder of class folders, "
                        "a .npz file or an idx file (...-idx3-ubyte[.gz]), or set the format (idx, image_folder, npz)")


def read_images(path: str | Path, *, format: str | None = None, labels: str | Path | None = None,
                label_names: Sequence[str] | None = None, image_size: int | None = None,
                num_channels: int | None = None) -> ImageData:
    """Read labelled images from ``path`` (format from the name unless given). ``labels``: an idx
    labels file (default: beside the images by the standard name); ``label_names``: the names by label id
    (a label outside them is an error); ``image_size`` / ``num_channels``: what an image folder's images
    are converted to (see the module's docstring)."""
    kind = format or image_format(path)
    if kind not in IMAGE_FORMATS:
        raise DataFileError(f"format={kind!r} is not one of {', '.join(IMAGE_FORMATS)}")
    if label_names is not None:
        label_names = tuple(str(name) for name in label_names)
        if not label_names or len(set(label_names)) != len(label_names):
            raise DataFileError(f"label names {list(label_names)} must be distinct names, at least one")
    if labels is not None and kind != "idx":
        raise DataFileError(f"{path}: a separate labels file is read with idx images only, not {kind}")
    if (image_size is not None or num_channels is not None) and kind != "image_folder":
        raise DataFileError(f"{path}: image_size and num_channels convert an image folder's files, not {kind} arrays")
    if kind == "idx":
        return read_idx_images(path, labels, label_names)
    if kind == "npz":
        return read_npz_images(path, label_names)
    return read_image_folder(path, label_names, image_size=image_size, num_channels=num_channels)


# ---- fitting images to a model --------------------------------------------------------------------


def fit_images(images: Tensor, num_channels: int, image_size: int) -> Tensor:
    """uint8 (N, C, H, W) -> uint8 (N, num_channels, image_size, image_size): greyscale repeated into RGB,
    RGB made greyscale with ITU-R 601 luma weights (as Pillow's "L"), another size resized (bilinear,
    antialiased). Images that already fit are returned as they are (no copy)."""
    channels = images.shape[1]
    if channels != num_channels:
        if channels == 1:
            images = images.expand(-1, num_channels, -1, -1)
        elif channels == 3 and num_channels == 1:
            luma = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
            images = (images.float() * luma).sum(dim=1, keepdim=True).round().clamp(0, 255).to(torch.uint8)
        else:
            raise DataFileError(f"images of {channels} channels cannot be read as {num_channels}; allowed: 1 <-> 3")
    if tuple(images.shape[-2:]) != (image_size, image_size):
        resized = torch.nn.functional.interpolate(images.float(), size=(image_size, image_size), mode="bilinear",
                                                  align_corners=False, antialias=True)
        images = resized.round().clamp(0, 255).to(torch.uint8)
    return images


def pixel_mean_std(images: Tensor, num_channels: int, image_size: int,
                   chunk: int = 4096) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The mean and standard deviation of each channel's pixel values on the 0..1 scale, over every pixel
    of ``images`` (uint8 (N, C, H, W)) as ``fit_images`` gives them to a model: exact, from per-channel
    histograms of the 256 values, a chunk of images at a time."""
    counts = torch.zeros(num_channels, 256, dtype=torch.float64)
    for start in range(0, images.shape[0], chunk):
        block = fit_images(images[start : start + chunk], num_channels, image_size)
        for channel in range(num_channels):
            counts[channel] += torch.bincount(block[:, channel].reshape(-1), minlength=256)
    values = torch.arange(256, dtype=torch.float64) / 255
    total = counts.sum(dim=1)
    mean = (counts * values).sum(dim=1) / total
    variance = ((counts * values.square()).sum(dim=1) / total - mean.square()).clamp(min=0)
    return tuple(mean.tolist()), tuple(variance.sqrt().tolist())


# ---- idx ------------------------------------------------------------------------------------------


def _open_binary(path: Path):
    if not path.is_file():
        raise DataFileError(f"{path}: no such file")
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115 (returned)


def read_idx_header(path: str | Path) -> tuple[int, tuple[int, ...]]:
    """(magic number, dimensions) of an idx file, reading only its header."""
    path = Path(path)
    try:
        with _open_binary(path) as handle:
            head = handle.read(4)
            if len(head) < 4 or head[:2] != b"\0\0":
                raise DataFileError(f"{path}: not an idx file (it does not start with two zero bytes)")
            rank = head[3]
            dims = handle.read(4 * rank)
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise DataFileError(f"{path}: cannot read ({error})") from None
    if len(dims) < 4 * rank:
        raise DataFileError(f"{path}: the idx header ends early (it announces {rank} dimensions)")
    return int.from_bytes(head, "big"), tuple(int.from_bytes(dims[4 * i : 4 * i + 4], "big") for i in range(rank))


def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """The uint8 array of an idx file whose magic number must be ``magic``; its size must match the header."""
    path = Path(path)
    found, dims = read_idx_header(path)
    if found != magic:
        kinds = {IDX_IMAGES_MAGIC: "images (0x00000803: N x H x W uint8)", IDX_LABELS_MAGIC: "labels (0x00000801: N "
                 "uint8)"}
        raise DataFileError(f"{path}: idx magic number 0x{found:08x}, expected {kinds[magic]}")
    try:
        with _open_binary(path) as handle:
            raw = handle.read()
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise DataFileError(f"{path}: cannot read ({error})") from None
    start = 4 + 4 * len(dims)
    expected = int(np.prod(dims, dtype=np.int64))
    if len(raw) - start != expected:
        shape = " x ".join(map(str, dims))
        raise DataFileError(f"{path}: the header announces {shape} = {expected:,} bytes of data, the file holds "
                            f"{len(raw) - start:,}")
    return np.frombuffer(raw, dtype=np.uint8, offset=start).reshape(dims)


def idx_labels_path(images: str | Path) -> Path:
    """The labels file beside an idx images file by the standard name (``images-idx3`` -> ``labels-idx1``),
    with or without ``.gz``."""
    images = Path(images)
    if "images-idx3" not in images.name:
        raise DataFileError(f"{images}: no standard labels name to look for (it does not hold 'images-idx3'); give "
                            "the labels file")
    name = images.name.replace("images-idx3", "labels-idx1").removesuffix(".gz")
    for candidate in (images.with_name(name), images.with_name(name + ".gz")):
        if candidate.is_file():
            return candidate
    raise DataFileError(f"{images}: no labels file beside it (looked for {name} and {name}.gz)")


def read_idx_images(path: str | Path, labels: str | Path | None = None,
                    label_names: Sequence[str] | None = None) -> ImageData:
    """idx images (N, H, W) and their labels (N,) as ImageData with one channel."""
    images = read_idx(path, IDX_IMAGES_MAGIC)
    if images.ndim != 3:
        shape = " x ".join(map(str, images.shape))
        raise DataFileError(f"{path}: an idx images file holds N x H x W, this one {shape}")
    labels_path = Path(labels) if labels is not None else idx_labels_path(path)
    ids = read_idx(labels_path, IDX_LABELS_MAGIC)
    if ids.ndim != 1 or len(ids) != len(images):
        raise DataFileError(f"{path} holds {len(images):,} images but {labels_path} holds {ids.size:,} labels; "
                            "an images file and its labels file have one label per image")
    names = _label_names(ids, label_names, labels_path)
    return ImageData(torch.from_numpy(images.copy()).unsqueeze(1), torch.from_numpy(ids.astype(np.int64)), names,
                     str(path))


def _label_names(ids: np.ndarray, label_names: tuple[str, ...] | None, source) -> tuple[str, ...]:
    """The given names, else "0".."K-1" for ids up to K-1 (K at most ``MAX_UNNAMED_LABELS``). Every id
    (N,) must index one, checked before anything is sized by them: an id outside is a DataFileError
    naming the file, its row and the ids allowed."""
    limit = MAX_UNNAMED_LABELS if label_names is None else len(label_names)
    outside = np.flatnonzero((ids < 0) | (ids >= limit))
    if outside.size:
        row = int(outside[0])
        where = f"{source}: row {row} (counting from 0) has label {int(ids[row])}"
        if label_names is None:
            raise DataFileError(f"{where}; labels without names are ids 0..{limit - 1} (at most {limit:,} classes): "
                                "name the classes (a 'label_names' array in a .npz, model.label_names or "
                                "model.num_labels) to have more")
        raise DataFileError(f"{where}, outside the ids 0..{limit - 1} of the {limit} label names "
                            f"({listed(label_names)})")
    if label_names is None:
        return tuple(str(number) for number in range(int(ids.max()) + 1 if ids.size else 1))
    return label_names


# ---- npz ------------------------------------------------------------------------------------------


def read_npz_images(path: str | Path, label_names: Sequence[str] | None = None) -> ImageData:
    """``images`` and ``labels`` (and optional ``label_names``) of a .npz file."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: no such file")
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise DataFileError(f"{path}: one .npy array, not a .npz archive of named arrays (images, labels)")
        with archive:
            names = sorted(archive.files)
            unknown = [name for name in names if name not in NPZ_ARRAYS]
            if unknown or not {"images", "labels"} <= set(names):
                raise DataFileError(f"{path}: arrays {', '.join(names) or 'none'}; a .npz of images holds 'images' "
                                    "(uint8, N x H x W or N x H x W x C), 'labels' (N integers) and optionally "
                                    "'label_names' (strings), nothing else")
            images, ids = archive["images"], archive["labels"]
            stored_names = archive["label_names"] if "label_names" in names else None
    except DataFileError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise DataFileError(f"{path}: not a readable .npz file ({error})") from None
    if images.dtype != np.uint8:
        raise DataFileError(f"{path}: 'images' is {images.dtype}; it must be uint8 (pixel values 0-255)")
    if images.ndim == 3:
        images = images[:, None]
    elif images.ndim == 4 and images.shape[-1] in (1, 3):
        images = images.transpose(0, 3, 1, 2)
    else:
        raise DataFileError(f"{path}: 'images' has shape {images.shape}; allowed: (N, H, W) or channels-last "
                            "(N, H, W, C) with C = 1 or 3")
    if ids.ndim != 1 or len(ids) != len(images) or not np.issubdtype(ids.dtype, np.integer):
        raise DataFileError(f"{path}: 'labels' is {ids.dtype} of shape {ids.shape}; it must hold one integer per "
                            f"image ({len(images):,})")
    if stored_names is not None:
        stored = tuple(str(name) for name in stored_names.reshape(-1).tolist())
        if label_names is not None and stored != tuple(label_names):
            raise DataFileError(f"{path}: its label_names ({listed(stored)}) differ from the ones given "
                                f"({listed(label_names)})")
        label_names = stored
    names = _label_names(ids, None if label_names is None else tuple(label_names), path)
    return ImageData(torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(ids.astype(np.int64)), names,
                     str(path))


# ---- image folders --------------------------------------------------------------------------------


def pillow():
    """Pillow's Image module, or a DataFileError saying how to install it."""
    try:
        from PIL import Image
    except ImportError:
        raise DataFileError("reading PNG/JPEG images needs Pillow: pip install pillow") from None
    return Image


def open_image(path, name: str | None = None):
    """A Pillow image from a file (or a binary file object, called ``name`` in messages), decoded whole now
    so a corrupt one is named here; a DataFileError if it is not one."""
    image_module = pillow()
    name = name or str(path)
    try:
        image = image_module.open(path)
        image.load()
    except FileNotFoundError:
        raise DataFileError(f"{name}: no such file") from None
    except (OSError, SyntaxError, ValueError, image_module.DecompressionBombError) as error:
        raise DataFileError(f"{name}: not a readable image ({error}); allowed: PNG or JPEG files") from None
    if image.mode in ("I", "F") or image.mode.startswith("I;16"):
        raise DataFileError(f"{name}: a {image.mode} image (16 or 32 bits a pixel); allowed: 8-bit greyscale, RGB, "
                            "RGBA or palette images")
    return image


def image_tensor(image, num_channels: int, size: tuple[int, int] | None = None) -> Tensor:
    """A Pillow image as uint8 (C, H, W): converted to ``num_channels`` (1: greyscale, 3: RGB; alpha is
    dropped) and, when ``size`` (height, width) differs from its own, resized to it (bilinear)."""
    if num_channels not in (1, 3):
        raise DataFileError(f"num_channels={num_channels}: images are read with 1 (greyscale) or 3 (RGB) channels")
    image = image.convert("L" if num_channels == 1 else "RGB")
    if size is not None and (image.height, image.width) != tuple(size):
        image = image.resize((size[1], size[0]), pillow().Resampling.BILINEAR)
    pixels = np.asarray(image, dtype=np.uint8).reshape(image.height, image.width, num_channels)
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1).contiguous()


def read_image_folder(root: str | Path, label_names: Sequence[str] | None = None, *, image_size: int | None = None,
                      num_channels: int | None = None) -> ImageData:
    """``ROOT/CLASS/IMAGE`` files as ImageData (see the module's docstring). With ``label_names`` the
    class folders must be among them (the ids follow their order); files that are not PNG/JPEG are left
    out and counted."""
    root = Path(root)
    if not root.is_dir():
        raise DataFileError(f"{root}: no such folder (an image folder holds one subfolder of images per class)")
    classes = [entry for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith(".")]
    if not classes:
        raise DataFileError(f"{root}: no class folders; an image folder holds one subfolder of PNG/JPEG images per "
                            "class (ROOT/CLASS/IMAGE.png)")
    names = sorted_names(entry.name for entry in classes) if label_names is None else tuple(label_names)
    unknown = sorted(entry.name for entry in classes if entry.name not in names)
    if unknown:
        raise DataFileError(f"{root}: class folder {quoted(unknown[0])} is not one of the label names "
                            f"({listed(names)})")
    files: list[tuple[Path, int]] = []
    ignored = 0
    for label, name in enumerate(names):
        folder = root / name
        entries = sorted(folder.iterdir()) if folder.is_dir() else []
        images = [entry for entry in entries if entry.is_file() and entry.suffix.lower() in IMAGE_SUFFIXES
                  and not entry.name.startswith(".")]
        ignored += sum(entry.is_file() for entry in entries) - len(images)
        if folder.is_dir() and not images:
            raise DataFileError(f"{folder}: no images (PNG or JPEG files ending in {', '.join(IMAGE_SUFFIXES)})")
        files += [(path, label) for path in images]
    opened = [(str(path), open_image(path)) for path, _ in files]
    labels = [label for _, label in files]
    return stack_images(opened, labels, names, str(root), image_size=image_size, num_channels=num_channels,
                        ignored=ignored)


def stack_images(opened: list[tuple[str, object]], labels: Sequence[int], names: tuple[str, ...], source: str, *,
                 image_size: int | None = None, num_channels: int | None = None, ignored: int = 0) -> ImageData:
    """ImageData of decoded Pillow images (each with the name a message gives it) and their label ids: one
    channel when every image is greyscale (else RGB) unless ``num_channels`` says; one size for all, or
    each resized to ``image_size``; ``ignored`` files counted in the notes."""
    channels = num_channels or (1 if all(image.mode in GREY_MODES for _, image in opened) else 3)
    size = None if image_size is None else (image_size, image_size)
    if size is None:
        first_path, first = opened[0]
        for path, image in opened:
            if image.size != first.size:
                raise DataFileError(f"{path} is {image.height} x {image.width} but {first_path} is {first.height} x "
                                    f"{first.width}: the images of a data set share one size (or read them with "
                                    "image_size to resize them)")
    resized = sum(size is not None and (image.height, image.width) != size for _, image in opened)
    images = torch.stack([image_tensor(image, channels, size) for _, image in opened])  # (N, C, H, W)
    notes = [f"{resized:,} resized to {size[0]} x {size[1]}"] if resized else []
    notes += [f"{ignored:,} files that are not PNG/JPEG left out"] if ignored else []
    return ImageData(images, torch.tensor(list(labels), dtype=torch.long), names, source, notes)


# ---- records ----------------------------------------------------------------------------------------------


def read_image_records(path: str | Path, *, format: str | None = None, image_column: str = IMAGE_COLUMN,
                       label_column: str = LABEL_COLUMN, columns: Sequence[str] | None = None,
                       label_names: Sequence[str] | None = None) -> ImageData:
    """Labelled images from records (JSONL, TSV/CSV, Parquet, a datasets folder; ``tformer.data.records``):
    the ``image_column`` holds an image as Hugging Face's Image feature stores it (``{"bytes": PNG/JPEG
    bytes, "path": ...}``), as bytes, or as a file path (relative paths from the records file's folder); the
    ``label_column`` a class name or an integer class id (named by the file's ClassLabel names, else
    ``label_names``, else "0".."K-1"). The images share one size, as an image folder's."""
    records = RecordFile.open(path, format, columns=columns)
    records.require(image_column, "image_column")
    records.require(label_column, "label_column")
    class_names = records.class_names(label_column)
    declared = None if label_names is None else tuple(str(name) for name in label_names)
    folder = records.path if records.format == "datasets" else records.path.parent
    opened, values = [], []
    for _, where, record in records.readable([image_column, label_column]):
        image = field_value(record, image_column, "image_column", where)
        opened.append((where, _record_image(image, folder, where)))
        values.append(field_value(record, label_column, "label_column", where))
    if not opened:
        raise DataFileError(f"{path}: no images")
    integer_ids = all(isinstance(value, int) and not isinstance(value, bool) for value in values)
    # unnamed class ids: "0".."K-1", bounded and checked as an .npz file's are, before anything is sized by them
    names = _label_names(np.array(values), None, path) if integer_ids and not (class_names or declared) else None
    found = []
    for (where, _), value in zip(opened, values, strict=True):
        try:
            found.append(class_name(value, class_names or declared or names, "label"))
        except DataFileError as error:
            raise DataFileError(f"{where}: {error}") from None
    names = declared or class_names or names or sorted_names(found)
    index = {name: number for number, name in enumerate(names)}
    for (where, _), name in zip(opened, found, strict=True):
        if name not in index:
            raise DataFileError(f"{where}: label {quoted(name)} is not one of the label names ({listed(names)})")
    return stack_images(opened, [index[name] for name in found], tuple(names), str(path))


def _record_image(value, folder: Path, where: str):
    """A decoded Pillow image from an image column's value."""
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return open_image(io.BytesIO(value), name=f"{where}: the image")
    if isinstance(value, str) and value:
        return open_image(folder / value, name=f"{where}: {folder / value}")
    raise DataFileError(f"{where}: the image is {type(value).__name__}; allowed: {{\"bytes\": ...}} (Hugging Face's "
                        "Image feature), bytes, or a file path")
