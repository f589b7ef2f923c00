"""``tformer serve RUN``: an OpenAI-compatible HTTP server (completions, chat completions, streaming, audio
transcriptions) over a decoder, encoder-decoder or speech checkpoint, with continuous batching over a paged key/value
cache; ``--adapter NAME=DIR`` serves LoRA adapters over it, a request's ``model`` choosing one."""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from functools import partial
from pathlib import Path

from tformer.cli.model_source import ModelSource, add_model_source
from tformer.pooling import EMBEDDING_POOLINGS
from tformer.serving.limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_PROMPTS,
    DEFAULT_STALL_SECONDS,
    HEARTBEAT_SECONDS,
    MIN_STALL_SECONDS,
)

ENGINE_THREADS_HELP = ("CPU threads for the model (default: PyTorch's, or one fewer when a decoding step measured at "
                       "start makes so many tokens a second that streaming them needs a share of a core: "
                       "docs/serving.md)")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve a decoder checkpoint over HTTP with the OpenAI API (continuous batching, streaming)",
        description="Serve a decoder checkpoint folder (tformer or Hugging Face format, with a tokenizer) with the "
                    "OpenAI API: POST /v1/completions and /v1/chat/completions (when the tokenizer ships a chat "
                    "template; an encoder-decoder's completions translate the prompt), POST "
                    "/v1/audio/transcriptions (a speech model's transcript of a WAV upload), POST /v1/embeddings (an "
                    "encoder's folder serves it alone; --pooling), GET "
                    "/v1/models, /health and /metrics (Prometheus); POST /tokenize and /detokenize, GET "
                    "/tokenizer_info. Completions with echo and logprobs score prompts (lm-evaluation-harness's "
                    "local-completions). Requests share one continuously batched decode over a paged key/value "
                    "cache, run by an engine in a process of its own. SIGTERM or Ctrl-C stops admitting (new "
                    "requests get 503), lets requests in flight finish for --shutdown-timeout seconds, and exits 0; "
                    "a second signal ends them at once.",
    )
    add_model_source(parser, "checkpoint", "a checkpoint folder with a tokenizer (tformer or Hugging Face format)",
                     helps={"threads": ENGINE_THREADS_HELP}, sets_threads=False, without=("adapter",))
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default: 127.0.0.1, this machine only; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 picks a free one)")
    parser.add_argument("--model-name", help="the model's name in the API (default: the folder's name)")
    parser.add_argument("--adapter", metavar="NAME=DIR", action="append", default=[],
                        help="serve the LoRA adapter in DIR (PEFT's format: adapter_config.json + "
                             "adapter_model.safetensors) over the model as NAME: a request whose model is NAME decodes "
                             "with it, batched with the others (repeat for more adapters; /v1/models lists them)")
    parser.add_argument("--api-key", default=os.environ.get("TFORMER_API_KEY"),
                        help="require 'Authorization: Bearer KEY' (default: $TFORMER_API_KEY; none: no key)")
    parser.add_argument("--chat-template", metavar="FILE",
                        help="a Jinja chat template, for a tokenizer that ships none (or to replace its own)")
    _add_engine_options(parser)
    parser.add_argument("--shutdown-timeout", type=float, default=30.0,
                        help="seconds requests in flight get to finish after SIGTERM; the server exits at most a "
                             "few seconds later, whatever hangs (default: 30)")
    parser.add_argument("--engine-timeout", type=float, default=DEFAULT_STALL_SECONDS,
                        help="seconds the engine may go without a sign of life (a step that never returns, an "
                             "engine process stopped or hung) before /health answers 503 and the requests waiting "
                             "on it fail with 503; longer than the slowest step (default: "
                             f"{DEFAULT_STALL_SECONDS:g}; 0: never)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help=f"a request body's size limit; larger bodies get 413 unread (default: "
                             f"{DEFAULT_MAX_BODY_BYTES})")
    parser.add_argument("--max-prompts", type=int, default=DEFAULT_MAX_PROMPTS,
                        help=f"prompts in one completions request (default: {DEFAULT_MAX_PROMPTS})")
    parser.add_argument("--max-request-tokens", type=int,
                        help="prompt and answer tokens of all of one request's sequences, n x (prompt + max_tokens) "
                             "summed over its prompts (default: --cache-tokens)")
    parser.add_argument("--pooling", choices=(*EMBEDDING_POOLINGS, "none"),
                        help="how POST /v1/embeddings pools the final hidden states: the first token's vector (cls), "
                             "the mean of the tokens' (mean) or the last token's (last); none: no embeddings (default: "
                             "a sentence-transformers folder's 1_Pooling/config.json, else an encoder's config, cls "
                             "unless it says mean, and a decoder's last token)")
    parser.add_argument("--normalize", action=argparse.BooleanOptionalAction,
                        help="scale embeddings to unit length (default: as a sentence-transformers folder's "
                             "modules.json says, else not)")
    parser.add_argument("--engine", choices=("process", "thread"), default="process",
                        help="where the engine runs: a process of its own, beside the HTTP process (default), or "
                             "a thread of the HTTP process, sharing its interpreter lock")
    parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                        help="the HTTP server's log level (default: warning)")
    parser.set_defaults(run=run)


def _add_engine_options(parser: argparse.ArgumentParser) -> None:
    """The engine's options: its cache, batch and step limits, how it reads the cache and admits requests."""
    parser.add_argument("--cache-tokens", type=int, default=16384,
                        help="the key/value cache's size in tokens, shared by all requests (default: 16384)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per cache block (default: 16)")
    parser.add_argument("--max-running", type=int, default=64, help="sequences decoding at once (default: 64)")
    parser.add_argument("--max-step-tokens", type=int, default=4096,
                        help="prompt and decode tokens per step; longer prompts wait a step (default: 4096)")
    parser.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_const", const=False, default=None,
                        help="compute every prompt whole: no reuse of a prefix's cached blocks, and the n sequences "
                             "of a request each prefill the prompt (default: prefix caching on, but for an "
                             "encoder-decoder and a model with a Performer layer, whose caches share no prefix)")
    parser.add_argument("--paged-attention", choices=("auto", "in-place", "gather"), default="auto",
                        help="how decode steps read the cache: in place (the compiled CPU kernel; FlexAttention on a "
                             "CUDA GPU), or by gathering each sequence's blocks; auto (default) reads in place on the "
                             "CPU where the model allows, gathers on a GPU (its steps captured), and says which")
    parser.add_argument("--overlap", choices=("auto", "on", "off"), default="auto",
                        help="launch each decode step from the last step's tokens before the host reads them, and "
                             "send their events while it runs; auto (default): on a CUDA GPU, off on the CPU (a CPU "
                             "step runs on the host's thread: nothing to overlap)")
    parser.add_argument("--gather-sources", type=int, default=1, metavar="N",
                        help="an encoder-decoder or speech model: while sequences decode, new requests wait up to N "
                             "steps for N of them to start together, their sources encoded as one batch (cheaper a "
                             "source than one at a time: docs/serving.md); default 1: each starts as soon as it can")
    parser.add_argument("--queue-timeout", type=float, default=60.0,
                        help="seconds a request may wait for cache room before a 429 (default: 60; 0: at once)")


def run(args: argparse.Namespace) -> int:
    from tformer.cli import UsageError

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} must be in [0, 65535]")
    for option, value in (("--cache-tokens", args.cache_tokens), ("--block-size", args.block_size),
                          ("--max-running", args.max_running), ("--max-step-tokens", args.max_step_tokens),
                          ("--max-body-bytes", args.max_body_bytes), ("--max-prompts", args.max_prompts),
                          ("--max-request-tokens", args.max_request_tokens), ("--gather-sources", args.gather_sources)):
        if value is not None and value < 1:
            raise UsageError(f"{option} {value} must be >= 1")
    for option, value in (("--queue-timeout", args.queue_timeout), ("--shutdown-timeout", args.shutdown_timeout),
                          ("--engine-timeout", args.engine_timeout)):
        if not value >= 0:
            raise UsageError(f"{option} {value} must be a number of seconds >= 0")
    for option, value in (("--shutdown-timeout", args.shutdown_timeout), ("--engine-timeout", args.engine_timeout)):
        if math.isinf(value):
            raise UsageError(f"{option} {value} must be a finite number of seconds")
    if 0 < args.engine_timeout < MIN_STALL_SECONDS:
        raise UsageError(f"--engine-timeout {args.engine_timeout:g} must be >= {MIN_STALL_SECONDS:g} s (the engine "
                         f"gives a sign of life every {HEARTBEAT_SECONDS:g} s), or 0 for no limit")
    if args.api_key is not None and not args.api_key.strip():
        raise UsageError("--api-key is empty; give a key, or leave the option out to serve without one")
    name = args.model_name or args.model_source.hub_name or Path(args.checkpoint).resolve().name
    adapters = _adapter_options(args.adapter, name)
    _check_address(args.host, args.port)
    try:
        import pydantic  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise UsageError(f"serve needs the serving extra ({error.name} is missing): "
                         "pip install 'tformer[serve]'") from None

    import torch

    from tformer.cli.model_source import load_tokenizer
    from tformer.serving.engine_client import ThreadEngineClient
    from tformer.serving.engine_process import ProcessEngineClient
    from tformer.serving.server import OpenAIServer
    from tformer.serving.server import run as serve
    from tformer.tokenizers.chat_template import ChatTemplate, ChatTemplateError

    template = None
    try:
        template = (ChatTemplate.from_file(args.chat_template) if args.chat_template
                    else ChatTemplate.from_folder(args.checkpoint))
    except ChatTemplateError as error:
        raise UsageError(f"{args.chat_template or args.checkpoint}: {error}") from None
    options = {"cache_tokens": args.cache_tokens, "block_size": args.block_size, "max_running": args.max_running,
               "max_step_tokens": args.max_step_tokens, "queue_timeout": args.queue_timeout,
               "prefix_caching": args.prefix_cache, "paged_attention": args.paged_attention,
               "overlap": {"auto": None, "on": True, "off": False}[args.overlap],
               "gather_sources": args.gather_sources, "pooling": args.pooling, "normalize": args.normalize,
               "adapters": adapters}
    build = partial(build_engine, args.model_source, options=options)
    if args.engine == "thread":
        engine = ThreadEngineClient(build(), stall_timeout=args.engine_timeout)
    else:
        tokenizer, problem = load_tokenizer(args.model_source)
        if tokenizer is None:
            raise _no_tokenizer(args.checkpoint, problem)
        torch.set_num_threads(1)  # this process tokenizes and formats; the engine process has --threads
        engine = ProcessEngineClient(build, tokenizer, stall_timeout=args.engine_timeout)
    try:
        server = OpenAIServer(engine, name, api_key=args.api_key, chat_template=template,
                              max_body_bytes=args.max_body_bytes, max_prompts=args.max_prompts,
                              max_request_tokens=args.max_request_tokens)
        serve(server, host=args.host, port=args.port, shutdown_timeout=args.shutdown_timeout,
              log_level=args.log_level)
    finally:
        if isinstance(engine, ProcessEngineClient):
            engine.close()
    return 0


def build_engine(source: ModelSource | str, device="cpu", quantize=None, threads: int | None = None,
                 options: dict | None = None):
    """The Engine ``tformer serve`` runs: the model of ``source`` (the option group's ModelSource: device,
    quantization, threads, ...) with its tokenizer; a folder ``source`` loads with ``device``, ``quantize`` and
    ``threads``. Called in the engine process (or, with ``--engine thread``, in the server's), so it is a
    module-level function of picklable arguments."""
    import torch

    from tformer.cli import UsageError, warning_printer
    from tformer.cli.model_source import load_model
    from tformer.generation import GenerationError
    from tformer.nn import compiled
    from tformer.serving.engine import Engine
    from tformer.serving.threads import engine_threads

    if not isinstance(source, ModelSource):
        source = ModelSource(str(source), device=torch.device(device), quantize=quantize, threads=threads)
    warnings.showwarning = warning_printer("serve")  # one line each, in the engine process too
    threads = source.threads
    if threads is not None:
        torch.set_num_threads(threads)
    loaded = load_model(source)
    model = loaded.model
    options = dict(options or {})
    _load_adapters(model, options.pop("adapters", None))
    asked = (options.pop("pooling", None), options.pop("normalize", None))
    pooling = _served_pooling(model, source.path, *asked)
    tokenizer = loaded.require_tokenizer(source.path, SERVE_NEEDS_TOKENIZER)
    try:
        engine = Engine(model, tokenizer, pooling=pooling, **options)
    except GenerationError as error:
        raise UsageError(f"{source.path}: {error}") from None
    compiled.ready(model.device)  # a first run builds the CPU kernels here, before the step is timed
    if pooling is not None and (not model.generates or asked != (None, None)):  # a generator's default goes unsaid
        print(f"tformer serve: embeddings pool by {pooling.mode}{' and are normalized' if pooling.normalize else ''} "
              f"({pooling.source})", file=sys.stderr, flush=True)
    if threads is None and model.device.type == "cpu" and model.generates:
        chosen, why = engine_threads(model)
        torch.set_num_threads(chosen)
        print(f"tformer serve: the engine runs {why} (--threads to choose)", file=sys.stderr, flush=True)
    return engine


SERVE_NEEDS_TOKENIZER = "serve needs one (requests and answers are text)"


def _adapter_options(given: list[str], model_name: str) -> dict[str, str]:
    """``--adapter NAME=DIR`` options as name -> folder; refused in one line: no ``=``, an empty, repeated or the
    base model's name, a folder without adapter_config.json."""
    from tformer.cli import UsageError
    from tformer.interop.peft_adapter import ADAPTER_CONFIG

    adapters: dict[str, str] = {}
    for option in given:
        name, equals, folder = option.partition("=")
        if not equals or not name.strip() or not folder:
            raise UsageError(f"--adapter {option!r} must be NAME=DIR (the name requests give as model, the "
                             "adapter's folder)")
        if name == model_name or name in adapters:
            taken = "the base model's name (--model-name)" if name == model_name else "given twice"
            raise UsageError(f"--adapter {option}: the name {name!r} is {taken}; each adapter needs a name of its own")
        if not (Path(folder) / ADAPTER_CONFIG).is_file():
            raise UsageError(f"--adapter {option}: no {ADAPTER_CONFIG} in {folder} (an adapter folder holds it and "
                             "adapter_model.safetensors: what tformer train writes with an [adapter] section, or "
                             "PEFT's save_pretrained)")
        adapters[name] = folder
    return adapters


def _load_adapters(model, adapters: dict[str, str] | None) -> None:
    """Put the ``--adapter`` adapters over ``model`` together (``tformer.adapters.load_adapters``); one that is
    another base's is refused in one line."""
    if not adapters:
        return
    from tformer.adapters import load_adapters

    load_adapters(model, adapters).eval()  # an AdapterError (one line, exit 2) names the adapter and why
    print(f"tformer serve: LoRA adapters {', '.join(adapters)} over the model, chosen per request by its model name",
          file=sys.stderr, flush=True)


def _served_pooling(model, folder: str, mode: str | None, normalize: bool | None):
    """The pooling ``/v1/embeddings`` serves ``model`` with (``--pooling``, ``--normalize``, else the folder's or
    the family's: ``models.embeddings.choose_pooling``), or None (``--pooling none``, or a model with no text
    embeddings that generates); a model that neither generates nor embeds is refused in one line."""
    from tformer.cli import UsageError
    from tformer.cli.model_source import require_generator
    from tformer.models.embeddings import choose_pooling, embedding_problem
    from tformer.pooling import EmbeddingError

    if mode == "none" or (model.generates and embedding_problem(model) is not None):
        if normalize is not None:
            raise UsageError("--normalize goes with embeddings; leave out --pooling none")
        require_generator(model, folder, "serve")  # an encoder with no pooling serves nothing
        return None
    if not model.generates and embedding_problem(model) is not None:
        require_generator(model, folder, "serve")
    try:
        return choose_pooling(model, folder, mode, normalize)
    except EmbeddingError as error:
        raise UsageError(f"{folder}: {error}") from None


def _no_tokenizer(checkpoint: str, problem: str | None):
    from tformer.cli import UsageError

    return UsageError(f"{problem or f'{checkpoint}: no tokenizer.json'}; {SERVE_NEEDS_TOKENIZER}")


def _check_address(host: str, port: int) -> None:
    """Refuse an address that cannot be bound (in use, not this machine's) before the model loads."""
    import socket

    from tformer.cli import UsageError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise UsageError(f"--host {host!r}: {error.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            raise UsageError(f"cannot listen on {host}:{port}: {error.strerror}") from None
