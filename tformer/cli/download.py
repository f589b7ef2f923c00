"""``tformer download NAME``: fetch a Hugging Face Hub model into the shared cache (only the files
tformer reads) and print its local folder."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "download", help="fetch a Hugging Face Hub model into the cache and print its folder",
        description="Fetch the files tformer reads of a Hugging Face Hub model (configs, safetensors weights, "
                    "tokenizer files; never pickle .bin weights) into the Hugging Face cache (HF_HUB_CACHE, "
                    "HF_HOME), then print the snapshot folder. Every command that takes a model folder also takes "
                    "the name itself.",
    )
    parser.add_argument("name", metavar="NAME", help="a Hub model name: org/name (or a legacy name such as gpt2)")
    parser.add_argument("--revision", help="a branch, tag or commit (default: the main branch)")
    parser.add_argument("--local-only", action="store_true",
                        help="do not touch the network: print the cached folder, or fail when it is not cached")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tformer.hub_cache import download

    print(download(args.name, args.revision, args.local_only))
    return 0
