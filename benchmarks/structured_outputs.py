"""Structured outputs: (a) what each grammar engine costs per token on tformer's vocabularies, (b) what constrained
decoding costs tformer serve in tokens/s at 16 concurrent clients.

    python benchmarks/structured_outputs.py --out benchmarks/logs/structured_outputs.json
    python benchmarks/structured_outputs.py --quick        # tiny sizes: checks that every part runs

(a) Mask time: for each library (llguidance, which tformer uses; outlines-core; xgrammar) and vocabulary (a
98-character one; GPT-2's 50,257 byte-level BPE tokens (dataset tokenizers/gpt2); a Llama-3-sized
128,256 made offline from GPT-2's by adding concatenations of two GPT-2 tokens, seeded, as nothing is downloaded),
the JSON documents of ``DOCUMENTS`` (valid under ``SCHEMA``) are fed token by token (GPT-2's tokenization for both
BPE vocabularies), the engine computing the next token's mask (a bitmask over the vocabulary) before each token.
Figures: the median and 90th percentile of the mask time per token, the time of one token's advance, and the
set-up (the vocabulary read, the schema compiled) once. Each document's tokens must be allowed by the mask before
them: a library that refuses one is reported, not timed. A library that is not installed is a row saying so.

(b) Serving: gpt-mini (1,024 positions) and GPT-2's 124M shape, random weights (seed 0), saved with their tokenizers
(gpt-mini's 256 byte tokens, end id 0, the NUL byte, which JSON text never holds; GPT-2's, end id 50256), served by
``tformer serve`` (its own process), --clients concurrent clients (16) each sending streaming /v1/completions
requests, as benchmarks/serve_load.py does: unconstrained (``ignore_eos``, exactly --new-tokens each) and
constrained (``response_format`` json_schema ``serve_schema``: an array of --items records, ending when the JSON is
complete, --constrained-tokens at most). Figures: tokens/s = tokens received / wall time, each run's tokens per
request, the constrained/unconstrained ratio, and whether every constrained answer parsed and validated
(jsonschema). A third run, free with the same lengths, sends the unconstrained requests again with ``ignore_eos``
and the constrained run's answer lengths as max_tokens: the same workload without the masks (constrained answers are
longer or shorter than --new-tokens, and a longer sequence's steps cost more attention), so constrained over it is
the masks' cost. """

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_roots import data_path  # noqa: E402

import tformer  # noqa: E402
from benchmarks.serve_load import (  # noqa: E402
    PROMPT_LENGTHS,
    Failed,
    free_port,
    make_prompts,
    run_load,
    server_for,
    tokenizer_for,
)
from tformer.generation.constraints import token_bytes_table  # noqa: E402
from tformer.tokenizers import CharTokenizer  # noqa: E402

GPT2_FILES = data_path("tokenizers/gpt2")
LIBRARIES = ("llguidance", "outlines-core", "xgrammar")
VOCABULARIES = ("char", "gpt2", "llama3-sized")
LLAMA3_VOCAB = 128256
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "role": {"enum": ["admin", "user", "guest"]},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 5}},
    "required": ["name", "age", "role", "address", "tags"], "additionalProperties": False}
DOCUMENTS = [
    {"name": "Ada Lovelace", "age": 36, "role": "admin", "address": {"city": "London", "zip": "10001"},
     "tags": ["math", "poetry"]},
    {"name": "Grace Hopper", "age": 85, "role": "user", "address": {"city": "New York", "zip": "20500"},
     "tags": ["navy", "cobol", "compilers"]},
    {"name": "Alan", "age": 41, "role": "guest", "address": {"city": "Wilmslow", "zip": "99999"}, "tags": []},
    {"name": "Katherine Johnson", "age": 101, "role": "user", "address": {"city": "Hampton", "zip": "23666"},
     "tags": ["orbits", "nasa", "geometry", "reentry"]},
]


# ---- (a) mask time --------------------------------------------------------------------------------


class Vocabulary:
    """A vocabulary as the grammar engines read it: each id's bytes (special ids 0xFF-marked, llguidance's
    convention), the end id, and text -> ids (the documents' tokenization)."""

    def __init__(self, name: str, tokens: list[bytes], end_id: int, encode) -> None:
        self.name, self.tokens, self.end_id, self.encode = name, tokens, end_id, encode

    @property
    def size(self) -> int:
        return len(self.tokens)


def vocabulary(name: str) -> Vocabulary:
    if name == "char":
        tokenizer = CharTokenizer([chr(code) for code in range(32, 127)] + ["\n"], special_tokens=["<unk>", "<eos>"])
        return Vocabulary(name, token_bytes_table(tokenizer, tokenizer.vocab_size), 1, tokenizer.encode)
    gpt2 = tformer.tokenizers.load(GPT2_FILES)
    table = token_bytes_table(gpt2, gpt2.vocab_size)
    encode = lambda text: gpt2.encode(text, add_special_tokens=False)  # noqa: E731
    if name == "gpt2":
        return Vocabulary(name, table, 50256, encode)
    # Llama 3's size: GPT-2's tokens, then distinct concatenations of two of them (seeded).
    rng, seen, grown = random.Random(0), set(table), list(table)
    ordinary = [token for token in table if token and not token.startswith(b"\xff")]
    while len(grown) < LLAMA3_VOCAB:
        token = rng.choice(ordinary) + rng.choice(ordinary)
        if token not in seen:
            seen.add(token)
            grown.append(token)
    return Vocabulary(name, grown, 50256, encode)


class LLGuidance:
    def __init__(self, vocab: Vocabulary, schema: dict) -> None:
        import llguidance
        from llguidance.torch import allocate_token_bitmask

        from tformer.generation.constraints import Constraint

        class Wrapped:  # what llguidance's TokenizerWrapper reads
            tokens, eos_token_id, bos_token_id = vocab.tokens, vocab.end_id, None
            special_token_ids = [i for i, token in enumerate(vocab.tokens) if token.startswith(b"\xff")]

            def __call__(self, text):
                return vocab.encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)

        tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapped()), n_vocab=vocab.size,
                                           eos_token=vocab.end_id)
        self.matcher = llguidance.LLMatcher(tokenizer, Constraint.json_schema(schema).grammar_text(), log_level=0)
        if self.matcher.is_error():
            raise Failed(self.matcher.get_error())
        self.mask = allocate_token_bitmask(1, vocab.size)[0]

    def compute(self) -> None:
        self.bits = self.matcher.compute_bitmask()  # what tformer's Constrained rule calls

    def allows(self, token: int) -> bool:
        return bool(self.bits[token // 8] >> (token % 8) & 1)

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise Failed(self.matcher.get_error())


class OutlinesCore:
    def __init__(self, vocab: Vocabulary, schema: dict) -> None:
        import outlines_core

        by_bytes: dict[bytes, list[int]] = {}
        for token_id, token in enumerate(vocab.tokens):
            if token and not token.startswith(b"\xff") and token_id != vocab.end_id:
                by_bytes.setdefault(token, []).append(token_id)
        regex = outlines_core.json_schema.build_regex_from_schema(json.dumps(schema), r"[ ]?")
        index = outlines_core.Index(regex, outlines_core.Vocabulary(vocab.end_id, by_bytes))
        self.guide = outlines_core.Guide(index)
        self.mask = torch.zeros((vocab.size + 31) // 32, dtype=torch.int32)

    def compute(self) -> None:
        self.guide.write_mask_into(self.mask.data_ptr(), self.mask.numel(), self.mask.element_size())

    def allows(self, token: int) -> bool:
        return bool(int(self.mask[token // 32]) >> (token % 32) & 1)

    def advance(self, token: int) -> None:
        self.guide.advance(token)


class XGrammar:
    def __init__(self, vocab: Vocabulary, schema: dict) -> None:
        import xgrammar

        info = xgrammar.TokenizerInfo(vocab.tokens, xgrammar.VocabType.RAW, vocab_size=vocab.size,
                                      stop_token_ids=[vocab.end_id])
        compiled = xgrammar.GrammarCompiler(info).compile_json_schema(json.dumps(schema), any_whitespace=False)
        self.matcher = xgrammar.GrammarMatcher(compiled)
        self.mask = xgrammar.allocate_token_bitmask(1, vocab.size)

    def compute(self) -> None:
        self.matcher.fill_next_token_bitmask(self.mask)

    def allows(self, token: int) -> bool:
        return bool(int(self.mask[0, token // 32]) >> (token % 32) & 1)

    def advance(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise Failed(f"rejected token {token}")


ENGINES = {"llguidance": LLGuidance, "outlines-core": OutlinesCore, "xgrammar": XGrammar}


def mask_times(library: str, vocab: Vocabulary, documents: list[dict]) -> dict:
    """Per-token mask and advance times over ``documents``, fed token by token, and the set-up time."""
    masks, advances, setups = [], [], []
    for document in documents:
        tokens = vocab.encode(json.dumps(document)) + [vocab.end_id]
        started = time.perf_counter()
        try:
            engine = ENGINES[library](vocab, SCHEMA)
        except ImportError as error:
            return {"error": f"not installed ({error.name})"}
        except Exception as error:  # the library's own refusal (a schema feature, a vocabulary)
            return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"}
        setups.append(time.perf_counter() - started)
        for token in tokens:
            started = time.perf_counter()
            engine.compute()
            masks.append(time.perf_counter() - started)
            if not engine.allows(token):
                return {"error": f"its mask refuses token {token} ({vocab.tokens[token]!r}) of a valid document"}
            if token == vocab.end_id:
                break
            started = time.perf_counter()
            engine.advance(token)
            advances.append(time.perf_counter() - started)
    quantiles = statistics.quantiles(masks, n=10)
    return {"mask_median_us": statistics.median(masks) * 1e6, "mask_p90_us": quantiles[-1] * 1e6,
            "advance_median_us": statistics.median(advances) * 1e6, "setup_s": statistics.median(setups),
            "tokens": len(masks)}


def print_mask_table(rows: dict, documents: int) -> None:
    print(f"\n(a) mask time per token, JSON-schema decoding ({documents} documents fed token by token)")
    print(f"{'vocabulary':<14} {'library':<14} {'mask p50':>10} {'mask p90':>10} {'advance':>9} {'set-up':>9} tokens")
    for vocab_name, libraries in rows.items():
        for library, row in libraries.items():
            if "error" in row:
                print(f"{vocab_name:<14} {library:<14} {row['error']}")
            else:
                print(f"{vocab_name:<14} {library:<14} {row['mask_median_us']:>8.1f}us {row['mask_p90_us']:>8.1f}us "
                      f"{row['advance_median_us']:>7.1f}us {row['setup_s']:>8.3f}s {row['tokens']}")


# ---- (b) serving ----------------------------------------------------------------------------------

END_IDS = {"gpt-mini": 0, "gpt2": 50256}


def serve_schema(items: int) -> dict:
    """An array of exactly ``items`` small records: bounded strings and integers, an enum, a boolean."""
    record = {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9999}, "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["a", "b", "c"]}, "ok": {"type": "boolean"}},
        "required": ["id", "name", "kind", "ok"], "additionalProperties": False}
    return {"type": "array", "items": record, "minItems": items, "maxItems": items}


def save_model(name: str, work: Path, args) -> Path:
    folder = work / f"{name}-structured"
    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        # 1,024 positions: gpt-mini's 256 hold no prompt beside --constrained-tokens (512) of byte tokens
        overrides = {"num_layers": 2, "max_seq_len": 512} if args.quick else {"max_seq_len": 1024}
        model = tformer.build_model(name, eos_token_id=END_IDS[name], **overrides).eval()
        model.tokenizer = tokenizer_for(name, GPT2_FILES / "encoder.json")
        model.save(folder)
    return folder


def serve_run(name: str, args, schema: dict) -> dict:
    import jsonschema

    folder = save_model(name, args.work, args)
    tokenizer = tokenizer_for(name, GPT2_FILES / "encoder.json")
    lengths = (4, 16) if args.quick else PROMPT_LENGTHS[name]
    prompts = make_prompts(tokenizer, args.requests, lengths)
    common = {"model": name, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    bodies = {
        "unconstrained": [({**common, "prompt": p.ids, "max_tokens": args.new_tokens, "ignore_eos": True}, len(p.ids))
                          for p in prompts],
        "constrained": [({**common, "prompt": p.ids, "max_tokens": args.constrained_tokens,
                          "response_format": {"type": "json_schema", "json_schema": {"name": "records",
                                                                                      "schema": schema}}}, len(p.ids))
                        for p in prompts],
    }
    server_args = argparse.Namespace(work=args.work, clients=[args.clients], threads=args.threads, engine=None,
                                     quantize=None)
    cache_tokens = args.clients * (PROMPT_LENGTHS[name][1] + max(args.new_tokens, args.constrained_tokens) + 32)
    server = server_for("tformer", folder, name, free_port(), server_args, cache_tokens)
    rows, rows_results = {}, {}
    try:
        server.start(args.start_timeout)
        for kind in ("unconstrained", "constrained", "free, same lengths"):
            if kind == "free, same lengths":  # the constrained run's answer lengths, free: the workload without masks
                lengths = [result.tokens for result in rows_results["constrained"]]
                bodies[kind] = [({**body, "max_tokens": max(1, lengths[i % len(lengths)]), "ignore_eos": True}, n)
                                for i, (body, n) in enumerate(bodies["unconstrained"])]
            run = asyncio.run(run_load(server, bodies[kind], args.clients, None))
            rows_results[kind] = run["results"]
            tokens = sum(result.tokens for result in run["results"])
            row = {"tokens_per_s": tokens / run["wall"], "tokens_per_request": tokens / len(run["results"]),
                   "wall_s": run["wall"], "requests": len(run["results"])}
            if kind == "constrained":
                valid = 0
                for result in run["results"]:
                    try:
                        jsonschema.validate(json.loads(result.text), schema)
                        valid += 1
                    except (ValueError, jsonschema.ValidationError):
                        pass
                row["valid"] = valid
            rows[kind] = row
    except Failed as error:
        rows["error"] = str(error)
    finally:
        server.stop()
    return rows


def print_serve_table(results: dict, clients: int) -> None:
    print(f"\n(b) tformer serve at {clients} concurrent clients: tokens/s, constrained against unconstrained")
    print(f"{'model':<10} {'run':<18} {'tokens/s':>10} {'tok/request':>12} {'valid JSON':>11} {'ratio':>7}")
    for name, rows in results.items():
        if "error" in rows:
            print(f"{name:<10} {rows['error']}")
            continue
        base = rows["unconstrained"]["tokens_per_s"]
        for kind, row in rows.items():
            valid = f"{row['valid']}/{row['requests']}" if "valid" in row else "-"
            print(f"{name:<10} {kind:<18} {row['tokens_per_s']:>10.1f} {row['tokens_per_request']:>12.1f} "
                  f"{valid:>11} {row['tokens_per_s'] / base:>7.2f}")
        same = rows["free, same lengths"]["tokens_per_s"]
        print(f"{name:<10} constrained / free with the same lengths: {rows['constrained']['tokens_per_s'] / same:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the character vocabulary, 2 documents, "
                        "a 2-layer gpt-mini, 4 requests at 2 clients, one record): checks that every part runs")
    parser.add_argument("--libraries", default=",".join(LIBRARIES))
    parser.add_argument("--vocabularies", default=",".join(VOCABULARIES))
    parser.add_argument("--models", default="gpt-mini,gpt2", help="served in (b); empty: (a) only")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64, help="requests per serving run")
    parser.add_argument("--new-tokens", type=int, default=128, help="an unconstrained request's tokens")
    parser.add_argument("--constrained-tokens", type=int, default=512, help="a constrained request's max_tokens")
    parser.add_argument("--items", type=int, default=4, help="records in the served schema's array")
    parser.add_argument("--threads", type=int, help="tformer serve --threads")
    parser.add_argument("--work", type=Path, help="folder for the checkpoints and server logs (default: temporary)")
    parser.add_argument("--start-timeout", type=float, default=300)
    parser.add_argument("--out", type=Path, help="write every figure here as JSON")
    args = parser.parse_args()
    libraries, vocabularies = args.libraries.split(","), args.vocabularies.split(",")
    models = [name for name in args.models.split(",") if name]
    documents = DOCUMENTS
    if args.quick:
        vocabularies, documents, models = ["char"], DOCUMENTS[:2], ["gpt-mini"] if models else []
        args.clients, args.requests, args.new_tokens, args.constrained_tokens, args.items = 2, 4, 8, 200, 1
    unknown = ([name for name in libraries if name not in LIBRARIES]
               + [name for name in vocabularies if name not in VOCABULARIES] + [m for m in models if m not in END_IDS])
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    print(f"torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
          flush=True)
    masks = {}
    for vocab_name in vocabularies:
        vocab = vocabulary(vocab_name)
        masks[vocab_name] = {library: mask_times(library, vocab, documents) for library in libraries}
    print_mask_table(masks, len(documents))
    served = {}
    if models:
        with tempfile.TemporaryDirectory() as scratch:
            args.work = args.work or Path(scratch)
            args.work.mkdir(parents=True, exist_ok=True)
            schema = serve_schema(args.items)
            served = {name: serve_run(name, args, schema) for name in models}
        print_serve_table(served, args.clients)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        settings = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
        args.out.write_text(json.dumps({"settings": settings, "date": f"{datetime.now(UTC):%Y-%m-%d}",
                                        "mask_time": masks, "serving": served}, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
