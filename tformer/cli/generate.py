"""``tformer generate CKPT --prompt TEXT``: continue a prompt with a checkpoint's model and print
the text (as it is produced with ``--stream``), then the speed on standard error."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tformer.cli import add_device_option, add_model_argument, add_quantize_option, add_threads_option

T = TypeVar("T")
DEFAULT_NEW_TOKENS = 100  # when neither --max-new-tokens nor the folder's generation_config.json gives a length

# GenerationConfig fields -> the options that set them, so an option's error names the option.
OPTIONS = {"max_new_tokens": "--max-new-tokens", "min_new_tokens": "--min-new-tokens", "temperature": "--temperature",
           "top_k": "--top-k", "top_p": "--top-p", "num_beams": "--num-beams", "seed": "--seed",
           "stop_strings": "--stop", "num_draft_tokens": "--num-draft-tokens"}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate", help="continue a prompt with a checkpoint (greedy, sampling, beam search, speculative)",
        description="Continue --prompt with the model of a checkpoint folder that has a tokenizer. Greedy by "
                    "default; --temperature / --top-k / --top-p sample, --num-beams searches, --draft decodes "
                    "speculatively with a smaller model of the same vocabulary. Options not given take the "
                    "folder's generation_config.json defaults, as Hugging Face's generate does. --chat answers "
                    "with the folder's chat template. The text goes to standard output, the speed (new tokens/s) "
                    "to standard error.",
    )
    add_model_argument(parser, "checkpoint", "a checkpoint folder with a tokenizer.json (tformer or Hugging Face "
                                             "format)")
    parser.add_argument("--prompt", help="the text to continue (with --chat: the user's message)")
    parser.add_argument("--chat", action="store_true",
                        help="render --prompt as one user message with the folder's chat template and print the "
                             "reply, which ends at the end-of-turn token")
    parser.add_argument("--messages", metavar="FILE", help="a JSON list of chat messages ({\"role\", "
                                                            "\"content\"}) to answer (implies --chat)")
    parser.add_argument("--max-new-tokens", type=int, help="at most this many new tokens (default: the folder's "
                                                           "generation_config.json, else 100)")
    parser.add_argument("--min-new-tokens", type=int, help="never end before this many (default: 0)")
    parser.add_argument("--temperature", type=float, help="sample at this temperature (0 = greedy)")
    parser.add_argument("--top-k", type=int, help="sample among the k most probable tokens")
    parser.add_argument("--top-p", type=float, help="sample among the most probable tokens holding this mass")
    parser.add_argument("--num-beams", type=int, help="beam search with this many beams (default: 1)")
    parser.add_argument("--seed", type=int, help="seed for reproducible sampling")
    parser.add_argument("--stop", action="append", default=[], metavar="TEXT",
                        help="stop once the new text contains TEXT (repeatable)")
    parser.add_argument("--draft", metavar="CKPT", help="a small checkpoint (a folder, or a Hub name at its main "
                                                         "branch) to draft tokens (speculative decoding)")
    parser.add_argument("--num-draft-tokens", type=int, help="tokens drafted per round (default: 4)")
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

    if args.stream and (args.num_beams or 1) > 1:
        raise UsageError("--stream needs --num-beams 1: beam search knows its text only at the end")
    if args.draft and (args.num_beams or 1) > 1:
        raise UsageError("--draft needs --num-beams 1: speculative decoding is greedy or sampling")
    chat = args.chat or args.messages is not None
    if (args.prompt is None) == (args.messages is None):
        raise UsageError("give --prompt TEXT or --messages FILE (with --chat), one of them")
    # Every option is checked here, before anything is loaded or printed.
    messages = read_messages(args.messages) if args.messages is not None else None
    if args.prompt is not None:
        check_text_option(args.prompt, "--prompt")
    for stop in args.stop:
        check_text_option(stop, "--stop")
    given = {name: getattr(args, option[2:].replace("-", "_")) for name, option in OPTIONS.items()}
    given = {name: value for name, value in given.items() if value is not None and value != []}
    if "stop_strings" in given:
        given["stop_strings"] = tuple(given["stop_strings"])
    try:
        GenerationConfig(**given)
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
    config = call_config(model, given)
    if chat:
        prompt_text, end_ids = chat_prompt(args.checkpoint, tokenizer, messages or [{"role": "user",
                                                                                        "content": args.prompt}])
        config = config.replace(eos_token_id=tuple(dict.fromkeys((*config.end_ids(model.config), *end_ids))))
        prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=False)
        if not prompt_ids:
            raise UsageError("the chat renders to no tokens; give some text")
        shown = ""  # a chat prints the reply alone
    else:
        prompt_ids = encode_prompt(tokenizer, args.prompt)
        shown = args.prompt
    draft = load_model(args.draft, device, quantize, local_only=args.local_only)[0] if args.draft else None
    if draft is not None:
        refuse_non_generator(draft, args.draft, "--draft")

    reply = {"skip_special_tokens": True} if chat else {}  # a chat's reply without its end-of-turn token
    input_ids = torch.tensor([prompt_ids], device=device)
    compiled.ready(device)  # a first run builds the CPU kernels here, outside the timed part
    started = time.perf_counter()
    if config.num_beams > 1:
        output = tformer.generate(model, input_ids, generation_config=config, tokenizer=tokenizer)
        sys.stdout.write(shown + tokenizer.decode(output.new_tokens[0].tolist(), **reply))
    else:
        # The stream checks every option against the models when it is made, so errors come before any text.
        stream = tformer.stream_generate(model, input_ids, generation_config=config, draft_model=draft,
                                         tokenizer=tokenizer)
        sys.stdout.write(shown)
        streamer = TextStreamer(tokenizer) if args.stream else None
        for chunk in stream:
            if streamer is not None:
                streamer(chunk)
        output = stream.output
        if streamer is not None:
            streamer.end()
        else:
            sys.stdout.write(tokenizer.decode(output.new_tokens[0].tolist(), **reply))
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


def call_config(model, given: dict):
    """The run's GenerationConfig: the folder's defaults (generation_config.json) with the options ``given`` over
    them; 100 new tokens when neither gives a length. --temperature, --top-k and --top-p sample, whatever the
    folder's do_sample."""
    from tformer.generation import GenerationConfig
    from tformer.generation.defaults import model_defaults

    base = model_defaults(model).replace(return_dict=True)
    if "max_new_tokens" not in given and base.max_length is None \
            and base.max_new_tokens == GenerationConfig().max_new_tokens:
        given = {**given, "max_new_tokens": DEFAULT_NEW_TOKENS}
    if "max_new_tokens" in given:
        given = {"max_length": None, **given}
    if {"temperature", "top_k", "top_p"} & set(given):
        given = {"do_sample": None, **given}
    return base.replace(**given)


def read_messages(path: str) -> list[dict]:
    """The chat messages of a JSON file: a list of objects with a "role" and a "content" string."""
    import json

    from tformer.cli import UsageError

    try:
        messages = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"--messages {path}: not a readable JSON file ({error})") from None
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise UsageError(f"--messages {path}: must be a non-empty JSON list of {{\"role\": str, \"content\": str}} "
                         "objects")
    return messages


def chat_prompt(folder: str, tokenizer, messages: list[dict]) -> tuple[str, tuple[int, ...]]:
    """``messages`` rendered by the folder's chat template, with the assistant's turn opened, and the id of
    tokenizer_config.json's eos_token (the end of a turn, a stop beside the model's end ids, as vLLM adds it).
    A folder without a template is a UsageError."""
    from tformer.cli import UsageError
    from tformer.serving.chat import ChatTemplate, ChatTemplateError

    try:
        template = ChatTemplate.from_folder(folder)
        if template is None:
            raise UsageError(f"{folder}: no chat template (chat_template.jinja or tokenizer_config.json's "
                             "chat_template); --chat needs one, or give --prompt alone to continue text")
        text = template.render(messages)
    except ChatTemplateError as error:
        raise UsageError(f"{folder}: {error}") from None
    end = template.special_tokens.get("eos_token")
    end_id = None if end is None else tokenizer.token_to_id(end)
    return text, () if end_id is None else (end_id,)


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
