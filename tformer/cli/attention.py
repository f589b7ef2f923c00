"""``tformer attention MODEL --image IMAGE...``: where a Vision Transformer looks. For each image, the
attention rollout (Abnar & Zuidema 2020) and the class token's last-layer attention, upsampled over the
image, in one PNG (a row per image, the predicted label beside it); ``--positions`` adds the grid of
learned position-embedding similarities (the ViT paper's Figure 7)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tformer.viz.rollout import HEAD_FUSIONS


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "attention", help="attention rollout overlays of a vision model on images (PNG)",
        description="Run a vision model on PNG/JPEG images with its attention maps and draw, for each image, the "
                    "attention rollout (every layer, the residual as identity) and the last layer's class-token "
                    "attention over the image.",
    )
    parser.add_argument("model", help="a vision model folder (a run, a checkpoint, a Hugging Face ViT folder)")
    parser.add_argument("--image", nargs="+", required=True, metavar="IMAGE", help="PNG or JPEG files")
    parser.add_argument("--out", help="the PNG to write (default: MODEL/attention/<first image's name>.png)")
    parser.add_argument("--head-fusion", choices=HEAD_FUSIONS, default="mean",
                        help="how each layer's heads combine (default: mean)")
    parser.add_argument("--positions", metavar="PNG",
                        help="also draw the learned position embeddings' similarities into this PNG")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from tformer.cli import UsageError
    from tformer.cli.classify import load_classifier, read_model_images
    from tformer.viz.rollout import (
        attention_rollout,
        fuse_heads,
        patch_map,
        plot_attention_maps,
        plot_position_similarity,
        position_similarity,
        upsample_map,
    )

    model = load_classifier(args.model)
    config = model.config
    out = Path(args.out) if args.out else Path(args.model) / "attention" / f"{Path(args.image[0]).stem}.png"
    outputs = [out] + ([Path(args.positions)] if args.positions else [])
    for path in outputs:
        check_own_png(path)
    if args.positions and config.positional != "learned":
        raise UsageError(f"--positions draws learned position embeddings; this model's are {config.positional!r}")
    pixels = read_model_images(args.image, model.image_processor)  # uint8 (N, C, H, W) at the model's size
    with torch.inference_mode():
        output = model(model.image_processor(pixels), output_attentions=True)
    size, grid = tuple(pixels.shape[-2:]), (config.patch_grid,) * 2
    rollout = patch_map(attention_rollout(output.attentions, args.head_fusion), grid, config.pooling)
    last = patch_map(fuse_heads(output.attentions[-1], args.head_fusion), grid, config.pooling)
    names = config.label_names or tuple(f"LABEL_{index}" for index in range(config.num_labels))
    probabilities = output.logits.float().softmax(-1)
    titles = [f"{Path(path).name}\n{names[int(row.argmax())]} ({float(row.max()):.2f})"
              for path, row in zip(args.image, probabilities, strict=True)]
    maps = {f"rollout ({args.head_fusion})": upsample_map(rollout, size),
            f"last layer ({args.head_fusion})": upsample_map(last, size)}
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"attention  {plot_attention_maps(pixels.float() / 255, maps, out, titles)}")
    if args.positions:
        table = model.embedding.position_embeddings[0, -config.num_patches:].detach()  # (N, D): the patches' rows
        similarity = position_similarity(table, grid)
        print(f"positions  {plot_position_similarity(similarity, args.positions, f'{args.model}: positions')}")
    return 0


def check_own_png(path: Path) -> None:
    """Refuse an output that exists and is not a figure tformer wrote, or whose folder is a file."""
    from tformer.cli import UsageError
    from tformer.viz.figures import written_by_tformer

    if path.suffix.lower() != ".png":
        raise UsageError(f"{path}: the output is a PNG file (name it .png)")
    if path.parent.exists() and not path.parent.is_dir():
        raise UsageError(f"{path.parent}: exists and is not a folder")
    if path.exists() and not written_by_tformer(path):
        raise UsageError(f"{path} exists and is not a figure tformer wrote; choose another --out")
