"""``tformer classify RUN IMAGE...``: the likeliest labels of images by a vision model with a classification
head, with their probabilities. Each image is decoded with Pillow, converted to the model's channels
(greyscale or RGB), resized to its image size (with a warning when it differs) and normalised with the
model folder's image processor (its ``preprocessor_config.json``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CHUNK = 64  # images per forward pass


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "classify", help="label images with a vision model (the top-k labels with their probabilities)",
        description="Run the vision model of a folder (a run folder, a checkpoint, a Hugging Face ViT folder) on "
                    "PNG/JPEG images and print each one's likeliest labels with their probabilities. --json prints "
                    "one JSON object per image instead of lines.",
    )
    parser.add_argument("model", help="a model folder: a vision model with head 'image_classification'")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="PNG or JPEG files")
    parser.add_argument("--top-k", type=int, default=5, help="labels to show per image (default: 5)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import warnings

    import torch

    import tformer
    from tformer.cli import UsageError
    from tformer.data.images import image_tensor, open_image

    if args.top_k < 1:
        raise UsageError(f"--top-k {args.top_k} must be a positive integer")
    for path in args.images:
        if not Path(path).is_file():
            raise UsageError(f"{path}: no such file")
    model = tformer.load(args.model)
    config = model.config
    if config.architecture != "vision" or config.head != "image_classification":
        raise UsageError(f"{args.model}: classify reads a vision model with head 'image_classification'; this model "
                         f"is architecture={config.architecture!r}, head={config.head!r}")
    processor = getattr(model, "image_processor", None)
    if processor is None:
        raise UsageError(f"{args.model}: the model folder has no preprocessor_config.json (the normalisation its "
                         "weights were trained with)")
    size = processor.image_size
    pixels = []
    for path in args.images:  # every image is read before any is classified: a bad one stops the command first
        image = open_image(path)
        if (image.height, image.width) != (size, size):
            warnings.warn(f"{path}: {image.height} x {image.width} resized to the model's {size} x {size}",
                          stacklevel=2)
        pixels.append(image_tensor(image, processor.num_channels, (size, size)))
    names = config.label_names or tuple(f"LABEL_{index}" for index in range(config.num_labels))
    top_k = min(args.top_k, config.num_labels)
    for start in range(0, len(pixels), CHUNK):
        batch = processor(torch.stack(pixels[start : start + CHUNK]))  # (B, C, H, W) float32
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
