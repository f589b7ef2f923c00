"""``tformer info DIR``: a checkpoint's config and parameter count."""

from __future__ import annotations

import argparse

from tformer.cli import add_model_argument


def register(subparsers) -> None:
    parser = subparsers.add_parser("info", help="print a checkpoint's config and parameter count")
    add_model_argument(parser, "checkpoint", "a checkpoint folder (tformer or Hugging Face format)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import tformer

    model = tformer.load(args.checkpoint)
    config = model.config
    print(f"checkpoint   {args.checkpoint}")
    print(f"model        {type(model).__name__} ({config.architecture})")
    print(f"parameters   {model.num_parameters():,} "
          f"({model.num_parameters(exclude_embeddings=True):,} without embeddings)")
    scheme = model.quantization
    if scheme is not None:
        from tformer.quantization import plans, quantized_weights

        print(f"quantized    {scheme.describe()}: {quantized_weights(model):,} weights as integers besides the "
              "float parameters above")
        for name, plan in plans(model).items():
            print(f"             {name} on this host: {plan.describe()} (measured)")
    tokenizer = getattr(model, "tokenizer", None)
    print(f"tokenizer    {type(tokenizer).__name__ + f' ({tokenizer.vocab_size} tokens)' if tokenizer else 'none'}")
    print("config")
    for key, value in config.to_dict().items():
        print(f"  {key:<22} {value}")
    return 0
