"""``tformer classify RUN IMAGE...``: the likeliest labels of images by a vision model with a classification
head, with their probabilities. Each image is decoded with Pillow, converted to the model's channels
(greyscale or RGB), resized to its image size (with a warning when it differs) and normalised with the
model folder's image processor (its ``preprocessor_config.json``)."""

from __future__ import annotations

import argparse
import json

from tformer.cli.model_source import add_model_source

CHUNK = 64  # images per forward pass


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "classify", help="label images with a vision model (the top-k labels with their probabilities)",
        description="Run the vision model of a folder (a run folder, a checkpoint, a Hugging Face ViT folder) on "
                    "PNG/JPEG images and print each one's likeliest labels with their probabilities. --json prints "
                    "one JSON object per image instead of lines.",
    )
    add_model_source(parser, "model", "a model folder: a vision model with head 'image_classification'",
                     without=("device",))
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="PNG or JPEG files")
    parser.add_argument("--top-k", type=int, default=5, help="labels to show per image (default: 5)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from tformer.cli import UsageError
    from tformer.cli.model_inputs import read_model_images
    from tformer.cli.model_source import load_image_classifier

    if args.top_k < 1:
        raise UsageError(f"--top-k {args.top_k} must be a positive integer")
    model = load_image_classifier(args.model_source)
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
