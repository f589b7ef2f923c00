"""``tformer merge BASE ADAPTER --out DIR``: the model with a LoRA adapter's update added into its weights, written as
a plain model folder (no adapter left: it loads and runs as any other)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tformer.cli import check_model_output, refuse_output_over_input
from tformer.cli.model_source import add_model_source

FORMATS = ("tformer", "hf")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "merge", help="add a LoRA adapter into its base model's weights and write the merged model",
        description="Load BASE, put the LoRA adapter in ADAPTER over it (PEFT's format: what tformer train writes "
                    "with an [adapter] section, or PEFT's save_pretrained), add each adapter's update into the "
                    "weights and write the plain model to --out. A quantized base is refused (merge into its float "
                    "checkpoint).",
    )
    add_model_source(parser, "base", "the base model folder the adapter was trained on", "BASE",
                     without=("device", "quantize", "adapter"))
    parser.add_argument("adapter_folder", metavar="ADAPTER", help="the adapter folder (adapter_config.json + "
                                                                  "adapter_model.safetensors)")
    parser.add_argument("--out", required=True, metavar="DIR", help="the folder to write (new or empty)")
    parser.add_argument("--to", choices=FORMATS, default="tformer",
                        help="the format to write: tformer's (default) or Hugging Face's")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into --out when it holds a model folder (its model files are replaced, other "
                             "files kept)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tformer.adapters import lora_layers, unload_adapter
    from tformer.cli.model_source import adapter_option, load_model

    out = Path(args.out)
    refuse_output_over_input(out, [args.base, args.adapter_folder], option="--out")
    check_model_output(out, args.overwrite)
    adapter = adapter_option(argparse.Namespace(adapter=args.adapter_folder))  # an adapter folder, or one line
    model = load_model(args.model_source.replace(adapter=adapter)).model  # every refusal before anything is written
    layers = len(lora_layers(model))
    unload_adapter(model, merge=True)
    model.save(out, format=args.to)
    print(f"wrote {out} ({args.to} format): {args.adapter_folder} merged into {layers} layer"
          f"{'s' if layers != 1 else ''} of {args.base}")
    return 0
