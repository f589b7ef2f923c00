"""``tformer translate RUN --input FILE``: translate a file line by line with an encoder-decoder (a run
folder, a checkpoint or a Hugging Face Marian/T5 folder with a tokenizer), one output line per input line."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tformer.cli import add_progress_option, show_progress
from tformer.cli.model_source import add_model_source


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "translate", help="translate a text file line by line with an encoder-decoder model",
        description="Translate each line of --input (UTF-8, .gz read too) with the encoder-decoder of a model "
                    "folder, by beam search (--beam 1: greedy). Writes one line per input line, in order (an empty "
                    "line stays empty), to --output or standard output; counts and speed go to standard error.",
    )
    add_model_source(parser, "model", "a run or model folder with a tokenizer (tformer or Hugging Face)", "RUN")
    parser.add_argument("--input", required=True, metavar="FILE", help="sentences to translate, one a line")
    parser.add_argument("--output", metavar="FILE", help="where to write the translations (default: standard output)")
    parser.add_argument("--beam", type=int, default=5, help="beams (default: 5; 1 = greedy)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences translated at once (default: 64)")
    parser.add_argument("--length-penalty", type=float, default=1.0,
                        help="beam search: scores divided by length**PENALTY (default: 1.0, as Hugging Face)")
    parser.add_argument("--max-new-tokens", type=int,
                        help="tokens a translation may have (default: 1.5 x the longest source in its batch + 10)")
    parser.add_argument("--overwrite", action="store_true", help="replace --output when it exists")
    add_progress_option(parser)
    parser.set_defaults(run=run)


def check_options(args: argparse.Namespace) -> None:
    """Every option checked before the model loads: one line naming the option and what it allows."""
    from tformer.cli import UsageError

    for option, value in (("--beam", args.beam), ("--batch-size", args.batch_size)):
        if value < 1:
            raise UsageError(f"{option} {value} must be a positive integer")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens} must be a positive integer")
    if not Path(args.input).is_file():
        raise UsageError(f"--input {args.input}: no such file")
    if args.output:
        output = Path(args.output)
        if output.is_dir():
            raise UsageError(f"--output {output}: is a folder; give a file name")
        if not output.parent.is_dir():
            raise UsageError(f"--output {output}: its folder {output.parent} does not exist")
        if output.resolve() == Path(args.input).resolve():
            raise UsageError(f"--output {output} is the --input file; write the translations elsewhere")
        if output.exists() and not args.overwrite:
            raise UsageError(f"--output {output} exists; give --overwrite to replace it, or another file")


def read_lines(path: str) -> list[str]:
    from tformer.data.files import DataFileError
    from tformer.data.parallel import text_lines

    try:
        return text_lines(path)
    except DataFileError as error:
        from tformer.cli import UsageError

        raise UsageError(f"--input {error}") from None


def run(args: argparse.Namespace) -> int:
    from tformer.cli.model_source import load_translator
    from tformer.files import write_text_atomically
    from tformer.generation.translation import translate
    from tformer.nn import compiled

    check_options(args)
    lines = read_lines(args.input)
    model = load_translator(args.model_source)
    compiled.ready(model.device)  # a first run builds the CPU kernels here, outside the timed part
    started = time.perf_counter()
    result = translate(model, lines, num_beams=args.beam, batch_size=args.batch_size,
                       length_penalty=args.length_penalty, max_new_tokens=args.max_new_tokens,
                       progress=show_progress(args))
    seconds = time.perf_counter() - started
    text = "".join(f"{line}\n" for line in result.texts)
    if args.output:
        write_text_atomically(Path(args.output), text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    notes = [f"{result.empty:,} empty lines left empty"] if result.empty else []
    notes += [f"{result.cut:,} sources cut to the model's {model.position_limit} tokens"] if result.cut else []
    print(f"translated {len(lines) - result.empty:,} sentences in {seconds:.1f} s "
          f"({(len(lines) - result.empty) / max(seconds, 1e-9):.1f} sentences/s, beam {args.beam})"
          + (f"; {'; '.join(notes)}" if notes else ""), file=sys.stderr)
    return 0
