"""``tformer classify RUN IMAGE...``: the likeliest labels of images by a vision model with a classification
head, with their probabilities. Each image is decoded with Pillow, converted to the model's channels
(greyscale or RGB), resized to its image size (with a warning when it differs) and normalised with the
model folder's image processor (its ``preprocessor_config.json``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tformer.cli import add_model_argument, add_quantize_option, add_threads_option

CHUNK = 64  # images per forward pass


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "classify", help="label images with a vision model (the top-k labels with their probabilities)",
        description="Run the vision model of a folder (a run folder, a checkpoint, a Hugging Face ViT folder) on "
                    "PNG/JPEG images and print each one's likeliest labels with their probabilities. --json prints "
                    "one JSON object per image instead of lines.",
    )
    add_model_argument(parser, "model", "a model folder: a vision model with head 'image_classification'")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="PNG or JPEG files")
    parser.add_argument("--top-k", type=int, default=5, help="labels to show per image (default: 5)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    add_quantize_option(parser)
    add_threads_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from tformer.cli import UsageError, quantize_option

    if args.top_k < 1:
        raise UsageError(f"--top-k {args.top_k} must be a positive integer")
    model = load_classifier(args.model, quantize_option(args))
    pixels = read_model_images(args.images, model.image_processor)  # uint8 (N, C, H, W)
    config = model.config
    names = config.label_names_or_ids
    top_k = min(args.top_k, config.num_labels)
    for start in range(0, len(pixels), CHUNK):
        batch = model.image_processor(pixels[start : start + CHUNK])  # (B, C, H, W) float32
        with torch.inference_mode():
            probabilities = torch.softmax(model(batch).logits.float(), dim=-1)  # (B, L)
        values, indices = probabilities.topk(top_k, dim=-1)
        for path, row_values, row_indices in zip(args.images[start : start + CHUNK], values.tolist(),
                                                 indices.tolist(), strict=True):
            labels = [{"label": names[index], "probability": round(value, 4)}
                      for value, index in zip(row_values, row_indices, strict=True)]
            line = ", ".join(f"{label['label']} ({label['probability']:.3f})" for label in labels)
            print(json.dumps({"image": path, "labels": labels}, ensure_ascii=False) if args.json else f"{line}\t{path}")
    return 0


def load_classifier(folder: str, quantize=None):
    """The vision model with an image-classification head in ``folder`` (quantized as ``quantize`` asks),
    with its image processor; a UsageError naming what the folder holds otherwise."""
    import tformer
    from tformer.cli import UsageError

    model = tformer.load(folder, quantize=quantize)
    config = model.config
    if config.head != "image_classification":
        raise UsageError(f"{folder}: a vision model with head 'image_classification' is needed; this model "
                         f"is architecture={config.architecture!r}, head={config.head!r}")
    if getattr(model, "image_processor", None) is None:
        raise UsageError(f"{folder}: the model folder has no preprocessor_config.json (the normalisation its "
                         "weights were trained with)")
    return model


def read_model_images(paths: list[str], processor):
    """uint8 (N, C, H, W): every image decoded (all before any is used: a bad one stops the command
    first), converted to the processor's channels and resized to its size with a warning."""
    import warnings

    import torch

    from tformer.cli import UsageError
    from tformer.data.images import image_tensor, open_image

    for path in paths:
        if Path(path).is_dir():
            raise UsageError(f"{path}: is a folder; give image files (PNG or JPEG), e.g. {Path(path) / '*.png'}")
        if not Path(path).is_file():
            raise UsageError(f"{path}: no such file")
    size = processor.image_size
    pixels = []
    for path in paths:
        image = open_image(path)
        if (image.height, image.width) != (size, size):
            warnings.warn(f"{path}: {image.height} x {image.width} resized to the model's {size} x {size}",
                          stacklevel=2)
        pixels.append(image_tensor(image, processor.num_channels, (size, size)))
    return torch.stack(pixels)
