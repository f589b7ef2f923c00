"""``tformer embed MODEL --text ... [--file F.txt]``: each text's embedding (``tformer.embed``: the final hidden
states pooled as the checkpoint says, or by ``--pooling``), printed as one JSON line a text, or written to a .npy
file of shape (texts, dimensions) with ``--out``."""

from __future__ import annotations

import argparse
import io
import json
import sys

from tformer.cli.model_source import add_model_source
from tformer.pooling import EMBEDDING_POOLINGS


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "embed", help="turn texts into vectors with an encoder or a decoder (JSON lines, or .npy)",
        description="Embed texts with the model of a folder (an encoder such as BERT or RoBERTa, a "
                    "sentence-transformers folder, or a decoder): each text's final hidden states pooled into one "
                    "vector, by the folder's 1_Pooling/config.json where it has one, else the family's default (an "
                    "encoder's config: [CLS] unless it says mean; a decoder: its last token). Prints one JSON object "
                    "a text ({\"index\", \"embedding\"}), or writes a float32 .npy array with --out.",
    )
    add_model_source(parser, "model", "a model folder with a tokenizer (an encoder or a decoder)")
    parser.add_argument("--text", action="append", default=[], help="a text to embed (repeatable)")
    parser.add_argument("--file", help="a UTF-8 text file, one text a line (after the --text texts)")
    parser.add_argument("--pooling", choices=EMBEDDING_POOLINGS,
                        help="the first token's vector (cls), the mean of the tokens' (mean) or the last token's "
                             "(last) (default: the folder's or the family's, above)")
    parser.add_argument("--normalize", action=argparse.BooleanOptionalAction,
                        help="scale each vector to unit length (default: as a sentence-transformers folder's "
                             "modules.json says, else not)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts embedded at once (default: 32)")
    parser.add_argument("--out", metavar="FILE.npy", help="write the vectors to this .npy file instead of printing")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tformer.cli import UsageError
    from tformer.cli.model_source import load_model
    from tformer.models.embeddings import choose_pooling, embed
    from tformer.pooling import EmbeddingError

    if args.batch_size < 1:
        raise UsageError(f"--batch-size {args.batch_size} must be >= 1")
    if args.out is not None and not args.out.endswith(".npy"):
        raise UsageError(f"--out {args.out}: the vectors are written as a .npy file; give a name ending in .npy")
    texts = read_texts(args.text, args.file)
    model = load_model(args.model_source).model
    if model.tokenizer is None:
        raise UsageError(f"{args.model}: the model folder has no tokenizer to read the texts with")
    try:
        pooling = choose_pooling(model, args.model_source.path, args.pooling, args.normalize)
        vectors = embed(model, texts, pooling=pooling, batch_size=args.batch_size)  # (N, D)
    except EmbeddingError as error:
        raise UsageError(f"{args.model}: {error}") from None
    if args.out is not None:
        write_npy(args.out, vectors.numpy())
        print(f"tformer embed: {vectors.shape[0]} x {vectors.shape[1]} float32 ({pooling.mode} pooling"
              f"{', normalized' if pooling.normalize else ''}) -> {args.out}", file=sys.stderr)
        return 0
    for index, vector in enumerate(vectors.tolist()):
        print(json.dumps({"index": index, "embedding": vector}))
    return 0


def read_texts(texts: list[str], path: str | None) -> list[str]:
    """The ``--text`` texts, then the lines of ``--file``; a UsageError for none, or for an empty one."""
    from tformer.cli import UsageError, check_text_option

    given = [(check_text_option(text, "--text"), f"--text {index + 1}") for index, text in enumerate(texts)]
    if path is not None:
        from tformer.data.files import DataFileError
        from tformer.data.parallel import text_lines

        try:
            lines = text_lines(path)
        except DataFileError as error:
            raise UsageError(f"--file {error}") from None
        given += [(line, f"{path} line {number}") for number, line in enumerate(lines, 1)]
    if not given:
        raise UsageError("give texts to embed with --text or --file")
    empty = next((where for text, where in given if not text.strip()), None)
    if empty is not None:
        raise UsageError(f"{empty} is empty; every text must have some characters")
    return [text for text, _ in given]


def write_npy(path: str, array) -> None:
    """``array`` as a .npy file, written atomically."""
    import numpy as np

    from tformer.files import write_bytes_atomically

    buffer = io.BytesIO()
    np.save(buffer, array)
    write_bytes_atomically(path, buffer.getvalue())
