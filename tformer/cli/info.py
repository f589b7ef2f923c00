"""``tformer info DIR``: a checkpoint's config and parameter count."""

from __future__ import annotations

import argparse

from tformer.cli.model_source import add_model_source


def register(subparsers) -> None:
    parser = subparsers.add_parser("info", help="print a checkpoint's config and parameter count")
    add_model_source(parser, "checkpoint", "a checkpoint folder (tformer or Hugging Face format)",
                     without=("device",))
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tformer.cli.model_source import load_model
    from tformer.quantization import plans, quantized_weights, represented_parameters

    model = load_model(args.model_source).model
    config = model.config
    scheme = model.quantization
    count = represented_parameters(model)  # a quantized model's: those it stands for, its integers included
    stored = "" if scheme is None else (f"; stored quantized: {quantized_weights(model):,} as integers, "
                                        f"{count - quantized_weights(model):,} in float")
    print(f"checkpoint   {args.checkpoint}")
    print(f"model        {type(model).__name__} ({config.architecture})")
    print(f"parameters   {count:,} ({represented_parameters(model, exclude_embeddings=True):,} without "
          f"embeddings){stored}")
    if scheme is not None:
        print(f"quantized    {scheme.describe()}")
        for name, plan in plans(model).items():
            print(f"             {name} on this host: {plan.describe()} (measured)")
    tokenizer = getattr(model, "tokenizer", None)
    print(f"tokenizer    {type(tokenizer).__name__ + f' ({tokenizer.vocab_size} tokens)' if tokenizer else 'none'}")
    print("config")
    for key, value in config.to_dict().items():
        print(f"  {key:<22} {value}")
    return 0
