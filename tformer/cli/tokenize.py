"""``tformer tokenize --tokenizer tok.json FILES --out data.bin``: a corpus as a memory-mappable
token file (uint16 when the vocabulary fits) plus its JSON header, for language-model training."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    parser = subparsers.add_parser("tokenize", help="encode text files into a token file for training")
    parser.add_argument("files", nargs="+", help="text files (UTF-8; .gz is read too), or records files (.jsonl, "
                        ".csv, .tsv, .parquet, a datasets save_to_disk folder: --text-column, a record a line), "
                        "in order")
    parser.add_argument("--tokenizer", required=True, help="a tokenizer.json, vocabulary file, or a folder")
    parser.add_argument("--out", required=True, help="the token file to write (its header goes to OUT.json)")
    parser.add_argument("--no-separator", action="store_true",
                        help="do not put the end-of-sequence token after each file")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUT and OUT.json when they exist (without it an existing one is refused)")
    parser.add_argument("--text-column", default="text",
                        help="the column holding the text of a records file (default: text)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tformer.cli import check_replaceable, refuse_output_over_input
    from tformer.data import tokenize_files
    from tformer.tokenizers import load

    inputs = [*args.files, args.tokenizer]
    refuse_output_over_input(args.out, inputs)
    refuse_output_over_input(f"{args.out}.json", inputs, option="--out's header")
    check_replaceable(args.out, args.overwrite)
    check_replaceable(f"{args.out}.json", args.overwrite)
    tokenizer = load(args.tokenizer)
    header = tokenize_files(tokenizer, args.files, args.out, separate_documents=not args.no_separator,
                            progress=not args.quiet, text_column=args.text_column)
    count, text_bytes = header["count"], header["text_bytes"]
    print(f"wrote       {args.out} ({count:,} tokens, {header['dtype']}) and {args.out}.json")
    print(f"from        {len(args.files)} file(s), {text_bytes:,} bytes, "
          f"{text_bytes / max(count, 1):.3f} bytes per token")
    print(f"took        {header['seconds']:.2f} s ({text_bytes / 1e6 / max(header['seconds'], 1e-9):.2f} MB/s)")
    return 0
