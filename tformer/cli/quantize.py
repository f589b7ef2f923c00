"""``tformer quantize RUN --bits 8|4 [--activations int8] --out DIR``: write a model folder whose linear layers
hold int8 or int4 weights (``tformer.quantization``), which every command loads as it is."""

from __future__ import annotations

import argparse
from pathlib import Path

from tformer.cli import UsageError, check_model_output, refuse_output_over_input
from tformer.cli.model_source import RECIPE_NAME, add_model_source, find_recipe


def weight_bits() -> dict[int, str]:
    """--bits's choices: the bits of each weight-only quantized backend (``int8``, ``int4``) in the registry, by
    the backend's name (w8a8 is int8's weights with --activations int8)."""
    from tformer.nn.weights import QUANTIZED_BACKENDS

    return {int(name[3:]): name for name in QUANTIZED_BACKENDS if name.startswith("int") and name[3:].isdigit()}


BITS = weight_bits()


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "quantize", help="write an int8, w8a8 or int4 copy of a model folder (quantization for inference)",
        description="Load RUN (a run or model folder, tformer or Hugging Face format), quantize the weights of every "
                    "linear layer (the output head too unless --keep-head) and the token tables as int8 rows (unless "
                    "--keep-embeddings); with --activations int8, the activations too where that is faster (scheme "
                    "w8a8). Write a tformer folder to --out: model.safetensors holds the integers and scales, "
                    "config.json the scheme, and recipe.toml the recipe of RUN's run when it has one (what evaluate "
                    "and predict read). tformer generate, serve, translate, predict, classify and evaluate load "
                    "it quantized; training it is refused.",
    )
    add_model_source(parser, "model", "the float model folder to quantize", "RUN",
                     without=("device", "quantize", "adapter"))
    parser.add_argument("--bits", type=int, required=True, choices=tuple(BITS),
                        help="8: int8, one scale per output channel; 4: int4, a scale and offset per group of inputs")
    parser.add_argument("--group-size", type=int, metavar="N", help="--bits 4: inputs per group, 32, 64 or 128 "
                                                                    "(default: 64)")
    parser.add_argument("--activations", choices=("float", "int8"), default="float",
                        help="--bits 8: int8 also rounds the activations to int8 per row where that multiplies "
                             "faster on the host (scheme w8a8; default: float, weight-only)")
    parser.add_argument("--keep-head", action="store_true", help="keep the output head (LM head, task head) in float")
    parser.add_argument("--keep-embeddings", action="store_true",
                        help="keep the token tables in float (exact lookups; default: int8 rows, one scale each)")
    parser.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into --out when it holds a model folder (its model files are replaced, other "
                             "files kept)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tformer.checkpoint import WEIGHTS_NAME
    from tformer.cli.model_source import load_model
    from tformer.files import write_text_atomically
    from tformer.quantization import QuantizationError, plans, scheme_for

    method = BITS[args.bits]
    if args.group_size is not None and args.bits != 4:
        raise UsageError("--group-size goes with --bits 4 (int8 is per output channel)")
    if args.activations == "int8":
        if args.bits != 8:
            raise UsageError("--activations int8 goes with --bits 8 (int4 keeps float activations)")
        method = "w8a8"
    try:
        scheme = scheme_for(method, args.group_size, head=not args.keep_head, embeddings=not args.keep_embeddings)
    except QuantizationError as error:
        raise UsageError(f"--group-size: {error}") from None
    out = Path(args.out)
    refuse_output_over_input(out, [args.model], option="--out")
    check_model_output(out, args.overwrite)
    recipe = run_recipe_text(Path(args.model))
    if recipe is None and (out / RECIPE_NAME).exists():
        raise UsageError(f"--out {out} holds a {RECIPE_NAME} and {args.model} has none to replace it with (it would "
                         "describe another model to evaluate); choose an empty or new folder")
    model = load_model(args.model_source.replace(quantize=scheme)).model
    model.save(out)
    if recipe is not None:
        write_text_atomically(out / RECIPE_NAME, recipe)
    source_bytes = _weights_bytes(Path(args.model))
    written = (out / WEIGHTS_NAME).stat().st_size
    print(f"wrote {out} ({model.quantization.describe()})")
    for name, plan in plans(model).items():
        print(f"{name} on this host: {plan.describe()} (measured)")
    if model.quantization.float_layers:
        print(f"kept in float (inputs not a multiple of {scheme.group_size}): "
              f"{', '.join(model.quantization.float_layers)}")
    size = f"weights {written / 1e6:,.1f} MB"
    if source_bytes:
        size += f", {written / source_bytes:.2f}x the {source_bytes / 1e6:,.1f} MB of {args.model}"
    print(size)
    return 0


def _weights_bytes(folder: Path) -> int:
    """The size of a model folder's weight files (safetensors, or PyTorch's), 0 when it has none."""
    return sum(file.stat().st_size for pattern in ("*.safetensors", "pytorch_model*.bin")
               for file in folder.glob(pattern))


def run_recipe_text(folder: Path) -> str | None:
    """The recipe of the run ``folder`` belongs to (``evaluate.find_recipe``), as text, or None: the quantized
    folder keeps it, so that evaluate and predict read the task and data format of the run as they do from it."""
    try:
        return find_recipe(folder).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
