"""``tformer generate CKPT --prompt TEXT``: continue a prompt with a checkpoint's model and print
the text (as it is produced with ``--stream``), then the speed on standard error."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tformer.cli.model_source import add_model_source
from tformer.generation.settings import declared

DEFAULT_NEW_TOKENS = 100  # when neither --max-new-tokens nor the folder's generation_config.json gives a length

# GenerationConfig fields -> the options that set them (each field declares its flag), so an option's error names
# the option; and the sampling ones, which sample whatever the folder's do_sample says.
FLAGS = {name: option.flag for name, option in declared().items() if option.flag is not None}
OPTIONS = {name: flag.name for name, flag in FLAGS.items()}
SAMPLING_OPTIONS = frozenset(name for name, option in declared().items() if option.flag and option.sampling)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate", help="continue a prompt with a checkpoint (greedy, sampling, beam search, speculative)",
        description="Continue --prompt with the model of a checkpoint folder that has a tokenizer. Greedy by "
                    "default; --temperature / --top-k / --top-p sample, --num-beams searches, --draft decodes "
                    "speculatively with a smaller model of the same vocabulary. Options not given take the "
                    "folder's generation_config.json defaults, as Hugging Face's generate does. --chat answers "
                    "with the folder's chat template. --json-schema, --json-object, --regex, --choice and --grammar "
                    "constrain the new text (printed alone). The text goes to standard output, the speed (new "
                    "tokens/s) to standard error.",
    )
    add_model_source(parser, "checkpoint", "a checkpoint folder with a tokenizer.json (tformer or Hugging Face "
                                           "format)")
    parser.add_argument("--prompt", help="the text to continue (with --chat: the user's message)")
    parser.add_argument("--chat", action="store_true",
                        help="render --prompt as one user message with the folder's chat template and print the "
                             "reply, which ends at the end-of-turn token")
    parser.add_argument("--messages", metavar="FILE", help="a JSON list of chat messages ({\"role\", "
                                                            "\"content\"}) to answer (implies --chat)")
    parser.add_argument("--draft", metavar="CKPT", help="a small checkpoint (a folder, or a Hub name at its main "
                                                         "branch) to draft tokens (speculative decoding)")
    for flag in FLAGS.values():  # the GenerationConfig options, as their fields declare them
        parser.add_argument(flag.name, type=flag.type, help=flag.help, metavar=flag.metavar,
                            **({"action": "append", "default": []} if flag.repeat else {}))
    structure = parser.add_mutually_exclusive_group()  # what the new text must be (structured outputs)
    structure.add_argument("--json-schema", metavar="FILE", help="write JSON valid under the JSON Schema in FILE")
    structure.add_argument("--json-object", action="store_true", help="write a JSON object")
    structure.add_argument("--regex", metavar="PATTERN", help="write text matching PATTERN whole (Rust regex syntax)")
    structure.add_argument("--choice", metavar="TEXT", action="append",
                           help="write exactly one of the --choice texts (repeatable)")
    structure.add_argument("--grammar", metavar="FILE", help="write a sentence of the Lark (or GBNF) grammar in FILE")
    parser.add_argument("--stream", action="store_true", help="print the text as it is produced")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    import tformer
    from tformer.cli import UsageError, check_text_option
    from tformer.generation import GenerationConfig, GenerationError, TextStreamer
    from tformer.nn import compiled

    if args.stream and (args.num_beams or 1) > 1:
        raise UsageError("--stream needs --num-beams 1: beam search knows its text only at the end")
    if args.draft and (args.num_beams or 1) > 1:
        raise UsageError("--draft needs --num-beams 1: speculative decoding is greedy or sampling")
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
    given = {name: tuple(value) if FLAGS[name].repeat else value for name, value in given.items()}
    constraint = read_constraint(args)
    if constraint is not None:
        given["constraint"] = constraint
    try:
        GenerationConfig(**given)
    except GenerationError as error:
        option = OPTIONS.get(str(error).split("=", 1)[0])
        raise UsageError(f"{option}: {error}" if option else str(error)) from None
    model, tokenizer = load_generator(args)
    prompt_ids, shown, config = prepare_prompt(args, model, tokenizer, call_config(model, given), messages)
    draft = load_draft(args)

    # a chat's reply without its end-of-turn token; a structure alone (no prompt before it: JSON to pipe on), without
    # the end id that closes it
    reply = {"skip_special_tokens": True} if is_chat(args) or config.constraint is not None else {}
    shown = "" if config.constraint is not None else shown
    input_ids = torch.tensor([prompt_ids], device=model.device)
    compiled.ready(model.device)  # a first run builds the CPU kernels here, outside the timed part
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
        # a structure streams without the end id that closes it, as it prints whole
        closing = torch.tensor(config.end_ids(model.config)) if config.constraint is not None else None
        for chunk in stream:
            if streamer is not None:
                streamer(chunk if closing is None else chunk[:, ~torch.isin(chunk[0], closing)])
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


def read_constraint(args: argparse.Namespace):
    """The Constraint --json-schema, --json-object, --regex, --choice or --grammar asks for (None: free text); a
    one-line UsageError naming the option for an unreadable file or a schema, regex or grammar that does not
    compile."""
    import json

    from tformer.cli import UsageError
    from tformer.generation.constraints import Constraint
    from tformer.generation.settings import GenerationError

    for option, path in (("--json-schema", args.json_schema), ("--grammar", args.grammar)):
        if path is None:
            continue
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise UsageError(f"{option} {path}: not a readable text file ({error})") from None
        try:
            if option == "--grammar":
                return Constraint.grammar(text)
            try:
                schema = json.loads(text)
            except json.JSONDecodeError as error:
                raise UsageError(f"--json-schema {path}: not JSON ({error})") from None
            return Constraint.json_schema(schema)
        except GenerationError as error:
            raise UsageError(f"{option} {path}: {error}") from None
    try:
        if args.json_object:
            return Constraint.json_object()
        if args.regex is not None:
            return Constraint.regex(args.regex)
        if args.choice:
            return Constraint.choice(args.choice)
    except GenerationError as error:
        option = "--regex" if args.regex is not None else "--choice"
        raise UsageError(f"{option}: {error}") from None
    return None


def is_chat(args: argparse.Namespace) -> bool:
    """Whether the run answers a chat (--chat, or --messages) rather than continuing text."""
    return args.chat or args.messages is not None


def load_generator(args: argparse.Namespace):
    """The model the option group names, and its tokenizer; a one-line UsageError when it writes no text or has
    no tokenizer."""
    from tformer.cli.model_source import load_model, require_generator

    loaded = load_model(args.model_source)
    require_generator(loaded.model, args.checkpoint, "generate")
    return loaded.model, loaded.require_tokenizer(args.checkpoint, "generate needs one to read --prompt")


def load_draft(args: argparse.Namespace):
    """The --draft model, loaded as the option group loads the model (device, quantization, ...), or None."""
    from tformer.cli.model_source import load_model, require_generator

    if not args.draft:
        return None
    draft = load_model(args.model_source.replace(path=args.draft, hub_name=None, revision=None, adapter=None)).model
    require_generator(draft, args.draft, "--draft")
    return draft


def prepare_prompt(args: argparse.Namespace, model, tokenizer, config, messages: list[dict] | None):
    """The prompt's ids, the text printed before the new text (the prompt; nothing for a chat, whose reply is
    printed alone) and the run's GenerationConfig (a chat's also ends at the template's end of turn)."""
    from tformer.cli import UsageError, encode_prompt

    if not is_chat(args):
        return encode_prompt(tokenizer, args.prompt), args.prompt, config
    prompt_text, end_ids = chat_prompt(args.checkpoint, tokenizer, messages or [{"role": "user",
                                                                                    "content": args.prompt}])
    config = config.replace(eos_token_id=tuple(dict.fromkeys((*config.end_ids(model.config), *end_ids))))
    prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=False)
    if not prompt_ids:
        raise UsageError("the chat renders to no tokens; give some text")
    return prompt_ids, "", config


def call_config(model, given: dict):
    """The run's GenerationConfig: the folder's defaults (generation_config.json) with the options ``given`` over
    them; 100 new tokens when neither gives a length. The sampling options (--temperature, --top-k, --top-p,
    --min-p) sample, whatever the folder's do_sample."""
    from tformer.generation import GenerationConfig
    from tformer.generation.defaults import model_defaults

    base = model_defaults(model).replace(return_dict=True)
    if "max_new_tokens" not in given and base.max_length is None \
            and base.max_new_tokens == GenerationConfig().max_new_tokens:
        given = {**given, "max_new_tokens": DEFAULT_NEW_TOKENS}
    if "max_new_tokens" in given:
        given = {"max_length": None, **given}
    if SAMPLING_OPTIONS & set(given):
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
    from tformer.tokenizers.chat_template import ChatTemplate, ChatTemplateError

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
