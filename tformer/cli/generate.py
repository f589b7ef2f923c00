"""``tformer generate CKPT --prompt TEXT``: continue a prompt with a checkpoint's model and print
the text (as it is produced with ``--stream``), then the speed on standard error."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from typing import TypeVar

from tformer.cli import add_device_option, add_model_argument, add_quantize_option, add_threads_option

T = TypeVar("T")

# GenerationConfig fields -> the options that set them, so an option's error names the option.
OPTIONS = {"max_new_tokens": "--max-new-tokens", "min_new_tokens": "--min-new-tokens", "temperature": "--temperature",
           "top_k": "--top-k", "top_p": "--top-p", "num_beams": "--num-beams", "seed": "--seed",
           "stop_strings": "--stop", "num_draft_tokens": "--num-draft-tokens"}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate", help="continue a prompt with a checkpoint (greedy, sampling, beam search, speculative)",
        description="Continue --prompt with the model of a checkpoint folder that has a tokenizer. Greedy by "
                    "default; --temperature / --top-k / --top-p sample, --num-beams searches, --draft decodes "
                    "speculatively with a smaller model of the same vocabulary. The text goes to standard "
                    "output, the speed (new tokens/s) to standard error.",
    )
    add_model_argument(parser, "checkpoint", "a checkpoint folder with a tokenizer.json (tformer or Hugging Face "
                                             "format)")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=100, help="at most this many new tokens (default: 100)")
    parser.add_argument("--min-new-tokens", type=int, default=0, help="never end before this many (default: 0)")
    parser.add_argument("--temperature", type=float, help="sample at this temperature (0 = greedy)")
    parser.add_argument("--top-k", type=int, help="sample among the k most probable tokens")
    parser.add_argument("--top-p", type=float, help="sample among the most probable tokens holding this mass")
    parser.add_argument("--num-beams", type=int, default=1, help="beam search with this many beams (default: 1)")
    parser.add_argument("--seed", type=int, help="seed for reproducible sampling")
    parser.add_argument("--stop", action="append", default=[], metavar="TEXT",
                        help="stop once the new text contains TEXT (repeatable)")
    parser.add_argument("--draft", metavar="CKPT", help="a small checkpoint (a folder, or a Hub name at its main "
                                                         "branch) to draft tokens (speculative decoding)")
    parser.add_argument("--num-draft-tokens", type=int, default=4, help="tokens drafted per round (default: 4)")
    parser.add_argument("--stream", action="store_true", help="print the text as it is produced")
    add_device_option(parser)
    add_quantize_option(parser)
    add_threads_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    import tformer
    from tformer.cli import UsageError, check_text_option, encode_prompt, quantize_option, resolve_device
    from tformer.generation import GenerationConfig, GenerationError, TextStreamer
    from tformer.nn import compiled

    if args.stream and args.num_beams > 1:
        raise UsageError("--stream needs --num-beams 1: beam search knows its text only at the end")
    if args.draft and args.num_beams > 1:
        raise UsageError("--draft needs --num-beams 1: speculative decoding is greedy or sampling")
    # Every option is checked here, before anything is loaded or printed.
    check_text_option(args.prompt, "--prompt")
    for stop in args.stop:
        check_text_option(stop, "--stop")
    try:
        config = GenerationConfig(
            max_new_tokens=args.max_new_tokens, min_new_tokens=args.min_new_tokens,
            temperature=1.0 if args.temperature is None else args.temperature, top_k=args.top_k, top_p=args.top_p,
            seed=args.seed, stop_strings=tuple(args.stop), num_beams=args.num_beams,
            num_draft_tokens=args.num_draft_tokens, return_dict=True,
        )
    except GenerationError as error:
        option = OPTIONS.get(str(error).split("=", 1)[0])
        raise UsageError(f"{option}: {error}" if option else str(error)) from None
    device = resolve_device(args.device)
    quantize = quantize_option(args)
    model, tokenizer_problem = load_model(args.checkpoint, device, quantize)
    refuse_non_generator(model, args.checkpoint, "generate")
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise UsageError(f"{tokenizer_problem or f'{args.checkpoint}: no tokenizer.json'}; "
                         "generate needs one to read --prompt")
    draft = load_model(args.draft, device, quantize, local_only=args.local_only)[0] if args.draft else None
    if draft is not None:
        refuse_non_generator(draft, args.draft, "--draft")
    prompt_ids = encode_prompt(tokenizer, args.prompt)

    input_ids = torch.tensor([prompt_ids], device=device)
    compiled.ready(device)  # a first run builds the CPU kernels here, outside the timed part
    started = time.perf_counter()
    if config.num_beams > 1:
        output = tformer.generate(model, input_ids, generation_config=config, tokenizer=tokenizer)
        sys.stdout.write(args.prompt + tokenizer.decode(output.new_tokens[0].tolist()))
    else:
        # The stream checks every option against the models when it is made, so errors come before any text.
        stream = tformer.stream_generate(model, input_ids, generation_config=config, draft_model=draft,
                                         tokenizer=tokenizer)
        sys.stdout.write(args.prompt)
        streamer = TextStreamer(tokenizer) if args.stream else None
        for chunk in stream:
            if streamer is not None:
                streamer(chunk)
        output = stream.output
        if streamer is not None:
            streamer.end()
        else:
            sys.stdout.write(tokenizer.decode(output.new_tokens[0].tolist()))
    seconds = time.perf_counter() - started
    new_count = output.new_tokens.shape[1]
    sys.stdout.write("\n")
    sys.stdout.flush()

    speed = f"{new_count} new tokens in {seconds:.2f} s: {new_count / seconds:.1f} tokens/s"
    if output.acceptance_rate is not None:
        speed += (f"; draft acceptance {output.acceptance_rate:.0%} "
                  f"({output.accepted_draft_tokens}/{output.draft_tokens} drafted tokens)")
    print(speed, file=sys.stderr)
    return 0


# What a model that generates no text is, and the command that runs it instead, by architecture.
NOT_GENERATORS = {"encoder": ("an encoder, which reads text and answers with its head",
                              "tformer predict and tformer evaluate run it"),
                  "vision": ("a vision model, which labels images", "tformer classify runs it")}


def refuse_non_generator(model, folder: str, command: str) -> None:
    """A one-line UsageError, in a user's terms, when ``model`` generates no text (an encoder, a vision model):
    ``command`` needs a decoder (the library's wording names generation hooks the model lacks)."""
    from tformer.cli import UsageError
    from tformer.generation.settings import HOOKS

    if all(hasattr(model, hook) for hook in HOOKS):
        return
    architecture = model.config.architecture
    what, instead = NOT_GENERATORS.get(architecture, (f"a {architecture} model, which does not write text", None))
    raise UsageError(f"{folder}: {command} needs a decoder (a text generator); this run is {what}"
                     f"{f': {instead}' if instead else ''}")


def load_model(path: str, device="cpu", quantize=None, local_only: bool = False):
    """``tformer.load(path, device, quantize=..., local_only=...)`` and, when its tokenizer could not be attached,
    why (see ``with_tokenizer_problem``)."""
    import tformer

    return with_tokenizer_problem(lambda: tformer.load(path, device=device, quantize=quantize, local_only=local_only))


def with_tokenizer_problem(load: Callable[[], T]) -> tuple[T, str | None]:
    """``load()`` (a model or a tokenizer) and, when a tokenizer could not be read, why (the warning's text, kept
    for the error instead of shown); other warnings are shown as they come."""
    from tformer.checkpoint import TokenizerNotAttachedWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load()
    problem = None
    for warning in caught:
        if issubclass(warning.category, TokenizerNotAttachedWarning):
            problem = str(warning.message)
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    return loaded, problem
