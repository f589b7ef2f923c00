"""``tformer tokenizer train|encode``: learn a tokenizer from text files, or show how one
cuts a text (tokens and ids)."""

from __future__ import annotations

import argparse
import time


def register(subparsers) -> None:
    parser = subparsers.add_parser("tokenizer", help="train a tokenizer, or show how one encodes a text")
    actions = parser.add_subparsers(dest="tokenizer_command", metavar="ACTION", title="actions")
    parser.set_defaults(run=lambda args: parser.print_help() or 2)

    train = actions.add_parser("train", help="learn a BPE, WordPiece or character tokenizer from text files")
    train.add_argument("files", nargs="+", help="training text files (UTF-8; .gz is read too)")
    train.add_argument("--kind", required=True, choices=["bpe", "wordpiece", "char"], help="tokenizer kind")
    train.add_argument("--vocab-size", type=int, help="vocabulary size, special tokens included "
                       "(required for bpe and wordpiece; for char it keeps the most frequent characters)")
    train.add_argument("--out", required=True, help="where to write tokenizer.json (a file or a folder)")
    train.add_argument("--min-frequency", type=int, default=2, help="least count of a pair to merge (default 2)")
    train.add_argument("--special-tokens", help="comma-separated special tokens (default: <|endoftext|> for bpe; "
                       "[PAD],[UNK],[CLS],[SEP],[MASK] for wordpiece; <unk> for char)")
    train.add_argument("--cased", action="store_true", help="wordpiece: keep case and accents")
    train.add_argument("--overwrite", action="store_true",
                       help="replace the tokenizer.json --out names when it exists (without it one is refused)")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(run=run_train)

    encode = actions.add_parser("encode", help="show the tokens and ids of a text")
    encode.add_argument("tokenizer", help="a tokenizer.json, GPT-2 / BERT vocabulary file, or a folder holding one")
    encode.add_argument("text", help="the text to encode")
    encode.add_argument("--pair", help="a second text (sentence pairs, e.g. for BERT)")
    encode.add_argument("--no-special-tokens", action="store_true", help="do not add [CLS]/[SEP] and the like")
    encode.set_defaults(run=run_encode)


def run_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tformer.cli import UsageError, check_replaceable, check_text_option, refuse_output_over_input
    from tformer.tokenizers import train
    from tformer.tokenizers.base import TOKENIZER_FILE

    files = [Path(file) for file in args.files]
    for file in files:
        if not file.is_file():
            raise UsageError(f"{file}: no such training file")
    out = Path(args.out)
    target = out / TOKENIZER_FILE if out.is_dir() else out
    refuse_output_over_input(target, files)
    check_replaceable(target, args.overwrite)
    if args.kind != "char" and args.vocab_size is None:
        raise UsageError(f"--vocab-size is required for --kind {args.kind}")
    if args.min_frequency < 0:
        raise UsageError(f"--min-frequency {args.min_frequency}: must be an integer >= 0 "
                         "(the least count of a pair to merge)")
    options = {"progress": not args.quiet}
    if args.kind != "char":
        options["min_frequency"] = args.min_frequency
    if args.special_tokens is not None:
        check_text_option(args.special_tokens, "--special-tokens")
        options["special_tokens"] = [token.strip() for token in args.special_tokens.split(",") if token.strip()]
        if not options["special_tokens"]:
            raise UsageError(f"--special-tokens {args.special_tokens!r} names no token; give a comma-separated "
                             "list such as '<unk>,<|endoftext|>'")
    if args.kind == "wordpiece" and args.cased:
        options["lowercase"] = False
    elif args.cased:
        raise UsageError("--cased applies to --kind wordpiece only")

    started = time.perf_counter()
    tokenizer = train(args.kind, files, args.vocab_size, **options)
    seconds = time.perf_counter() - started
    path = tokenizer.save(args.out)
    text_bytes, tokens = _measure(tokenizer, files)
    print(f"tokenizer   {type(tokenizer).__name__}, {tokenizer.vocab_size:,} tokens")
    print(f"trained on  {len(files)} file(s), {text_bytes:,} bytes, in {seconds:.2f} s")
    print(f"compression {text_bytes / max(tokens, 1):.3f} bytes per token ({tokens:,} tokens)")
    print(f"saved       {path}")
    return 0


def _measure(tokenizer, files) -> tuple[int, int]:
    """Bytes and tokens of the training files (the compression the tokenizer achieves on them)."""
    from tformer.tokenizers.corpus import read_file_chunks

    text_bytes = tokens = 0
    for file in files:
        for chunk in read_file_chunks(file):
            text_bytes += len(chunk.encode("utf-8"))
            tokens += len(tokenizer.encode(chunk, add_special_tokens=False))
    return text_bytes, tokens


def run_encode(args: argparse.Namespace) -> int:
    from tformer.cli import check_text_option
    from tformer.tokenizers import load

    tokenizer = load(args.tokenizer)
    check_text_option(args.text, "TEXT")
    if args.pair is not None:
        check_text_option(args.pair, "--pair")
    ids = tokenizer.encode(args.text, args.pair, add_special_tokens=not args.no_special_tokens)
    tokens = [tokenizer.id_to_token(token_id) for token_id in ids]
    width = max((len(str(token_id)) for token_id in ids), default=1)
    print(f"{len(ids)} tokens ({type(tokenizer).__name__}, vocabulary {tokenizer.vocab_size:,})")
    for token_id, token in zip(ids, tokens, strict=True):
        shown = repr(token)[1:-1]  # escapes keep newlines and tabs on one line
        special = "  (special)" if token_id in tokenizer.special_token_ids else ""
        print(f"  {token_id:>{width}}  {shown}{special}")
    print("ids", " ".join(map(str, ids)))
    return 0
