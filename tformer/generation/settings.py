"""The options of ``generate`` as one frozen ``GenerationConfig``, checked where they enter (the checks that
need the model are ``checks.py``'s). Every problem is a ``GenerationError`` naming the option and what is
allowed. It imports no torch: the serving process that only speaks HTTP reads it.

A new option is one field of ``GenerationConfig`` (its default and, through ``option``, its command-line flag,
OpenAI request field, generation_config.json key and the decoding paths that cannot apply it) plus its check in
``_check``; the command line, the server's request fields and its support table are derived from the fields
(``declared``), and a logits rule is one class in ``generation/rules.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tformer.generation.constraints import Constraint
from tformer.generation.errors import GenerationError  # defined there for constraints.py, read from here

# The decoding paths that may be unable to apply an option (each refuses it by name, failing closed).
SERVER, BEAM_SEARCH, SPECULATIVE = "the server", "beam search", "speculative decoding"
DECLARATION = "tformer"  # the key of a field's metadata holding its ``Option``
CACHE_IMPLEMENTATIONS = ("dynamic", "static")  # GenerationConfig.cache_implementation's values


@dataclass(frozen=True)
class Flag:
    """The ``tformer generate`` option that sets a field."""

    name: str  # "--top-k"
    type: Callable[[str], Any]  # argparse's type
    help: str
    repeat: bool = False  # given once a value, the values a tuple (argparse's action="append")
    metavar: str | None = None


@dataclass(frozen=True)
class Option:
    """What a ``GenerationConfig`` field declares beside its default: what sets it, where it applies."""

    flag: Flag | None = None  # its ``tformer generate`` option
    api: str | None = None  # the OpenAI request field that sets it (errors name that field)
    # True: the request field holds the option's value as it is (``openai_api`` makes the field from this one);
    # False: ``openai_api`` declares the field and turns its OpenAI meaning into the option.
    api_as_is: bool = False
    sampling: bool = False  # a sampling filter: applied only when sampling, and implying it (do_sample None)
    from_file: bool = False  # read from generation_config.json under its name (a sampling one with do_sample only)
    # decoding path (SERVER, BEAM_SEARCH, SPECULATIVE) -> why it refuses a value other than the default
    refused: Mapping[str, str] = dataclasses.field(default_factory=dict)


def option(default: Any, **declared: Any) -> Any:
    """A ``GenerationConfig`` field with ``default`` and its ``Option`` (``declared``) in its metadata."""
    return dataclasses.field(default=default, metadata={DECLARATION: Option(**declared)})


def _id_and_bias(text: str) -> tuple[int, float]:
    """``--logit-bias ID=BIAS`` as (id, bias); argparse's one-line refusal, naming the option, otherwise."""
    token, _, bias = text.partition("=")
    try:
        return int(token), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not ID=BIAS (a token id, =, a number)") from None


@dataclass(frozen=True)
class GenerationConfig:
    """Every option of one ``generate`` call (Hugging Face's ``GenerationConfig`` names, where one exists).

    Checked and normalised when made (token-id lists and stop strings become tuples);
    ``replace`` makes a changed copy. Options that depend on the model (end ids within its
    vocabulary, its default end and pad ids) are resolved per call by ``end_ids``/``pad_id``.
    """

    max_new_tokens: int = option(32, flag=Flag("--max-new-tokens", int, "at most this many new tokens (default: the "
                                                                        "folder's generation_config.json, else 100)"),
                                 api="max_tokens", from_file=True)
    # The whole sequence's length limit, prompt included (Hugging Face's max_length, from a folder's
    # generation_config.json): when set, max_new_tokens is what the prompt leaves of it.
    max_length: int | None = None
    min_new_tokens: int = option(0, flag=Flag("--min-new-tokens", int, "never end before this many (default: 0)"),
                                 api="min_tokens", from_file=True)  # end ids are forbidden before this many
    forced_eos_token_id: int | bool | None = None  # the last token a row may have; None: the model config's,
    # False: none
    do_sample: bool | None = None  # None: sample when temperature != 1, top_k, top_p or min_p say so
    temperature: float = option(1.0, flag=Flag("--temperature", float, "sample at this temperature (0 = greedy)"),
                                api="temperature", sampling=True, from_file=True)  # 0 = greedy
    top_k: int | None = option(None, flag=Flag("--top-k", int, "sample among the k most probable tokens"),
                               api="top_k", sampling=True, from_file=True)
    top_p: float | None = option(None, flag=Flag("--top-p", float, "sample among the most probable tokens holding "
                                                                  "this mass"), api="top_p", sampling=True,
                                 from_file=True)
    # Sample among the tokens at least min_p times as probable as the most probable one (Hugging Face's MinP).
    min_p: float | None = option(None, flag=Flag("--min-p", float, "sample among the tokens at least this fraction "
                                                                  "as probable as the most probable one"),
                                 api="min_p", api_as_is=True, sampling=True, from_file=True)
    # The logits of tokens already in the sequence (prompt included) divided by it, or multiplied where
    # negative (Hugging Face's RepetitionPenalty): > 1 repeats less. It reads each row's tokens so far.
    repetition_penalty: float = option(
        1.0, flag=Flag("--repetition-penalty", float, "penalise tokens already in the text: their logits divided "
                                                      "by this (multiplied if negative); 1 = none"),
        api="repetition_penalty", api_as_is=True, from_file=True,
        refused={BEAM_SEARCH: "it scores without each beam's tokens so far; pass repetition_penalty=1.0",
                 SPECULATIVE: "the drafted positions are scored without their tokens so far; pass "
                              "repetition_penalty=1.0"})
    seed: int | None = option(None, flag=Flag("--seed", int, "seed for reproducible sampling"), api="seed")
    # OpenAI's penalties, on the new tokens only (not the prompt): a token's logit minus frequency_penalty times the
    # times it was chosen so far, and minus presence_penalty once it was (as vLLM applies them), in [-2, 2].
    presence_penalty: float = option(
        0.0, flag=Flag("--presence-penalty", float, "subtract this from the logits of tokens already generated "
                                                     "(OpenAI's; -2 to 2, 0 = none)"),
        api="presence_penalty", api_as_is=True,
        refused={BEAM_SEARCH: "it scores without each beam's tokens so far; pass presence_penalty=0.0",
                 SPECULATIVE: "the drafted positions are scored without their tokens so far; pass "
                              "presence_penalty=0.0"})
    frequency_penalty: float = option(
        0.0, flag=Flag("--frequency-penalty", float, "subtract this times its count so far from a generated "
                                                      "token's logit (OpenAI's; -2 to 2, 0 = none)"),
        api="frequency_penalty", api_as_is=True,
        refused={BEAM_SEARCH: "it scores without each beam's tokens so far; pass frequency_penalty=0.0",
                 SPECULATIVE: "the drafted positions are scored without their tokens so far; pass "
                              "frequency_penalty=0.0"})
    # Added to the logits of tokens (OpenAI's logit_bias): (token id, bias) pairs, a bias in [-100, 100] (-100 in
    # effect bans a token, 100 makes it all but certain); a mapping id -> bias is taken too.
    logit_bias: tuple[tuple[int, float], ...] = option(
        (), flag=Flag("--logit-bias", _id_and_bias, "add BIAS to token ID's logit, -100 to 100 (repeatable)",
                      repeat=True, metavar="ID=BIAS"), api="logit_bias")
    # The only tokens that may be chosen (vLLM's allowed_token_ids); None: every token.
    allowed_token_ids: tuple[int, ...] | None = option(None, api="allowed_token_ids")
    # Tokens that end a sequence besides the end ids, which they join (vLLM's stop_token_ids; an ignore_eos request
    # still ends at them, and min_new_tokens forbids them too).
    stop_token_ids: tuple[int, ...] = option((), api="stop_token_ids")
    eos_token_id: int | tuple[int, ...] | None = None  # None: the model config's; () never ends early
    # None: the model config's, else the first end id
    pad_token_id: int | None = option(None, refused={SERVER: "a sequence that ends is not padded: the server "
                                                             "returns each one as it is"})
    stop_strings: str | tuple[str, ...] = option(
        (), flag=Flag("--stop", str, "stop once the new text contains TEXT (repeatable)", repeat=True,
                      metavar="TEXT"), api="stop", from_file=True)
    # The text a stop string ends holds it (vLLM's include_stop_str_in_output); else it ends before it. Text only:
    # generate's ids always hold the stop string's tokens.
    include_stop_strings: bool = option(False, api="include_stop_str_in_output", api_as_is=True)
    # The text leaves out the tokenizer's special tokens (vLLM's skip_special_tokens, true there by default; the
    # server keeps them unless asked, as tformer generate prints them). Text only, as include_stop_strings.
    skip_special_tokens: bool = option(False, api="skip_special_tokens", api_as_is=True)
    num_beams: int = option(1, flag=Flag("--num-beams", int, "beam search with this many beams (default: 1)"),
                            from_file=True, api="num_beams", api_as_is=True)
    length_penalty: float = option(1.0, from_file=True, api="length_penalty", api_as_is=True)
    # True, False or "never"
    early_stopping: bool | str = option(False, from_file=True, api="early_stopping", api_as_is=True)
    num_return_sequences: int = option(1, from_file=True, refused={SERVER: "ask for n sequences instead"})
    # Speculative decoding: the tokens the draft model proposes per round.
    num_draft_tokens: int = option(4, flag=Flag("--num-draft-tokens", int, "tokens drafted per round (default: 4)"),
                                   refused={SERVER: "the server decodes without a draft model"})
    output_scores: bool = option(False, refused={SERVER: "ask for logprobs instead"})
    return_dict: bool = option(False, refused={SERVER: "the server answers in its own format"})
    # False re-runs the whole sequence each step (the slow reference).
    use_cache: bool = option(True, refused={SERVER: "the server always decodes over its cache"})
    # "static": one-token steps of fixed shapes over caches preallocated for the whole call, compiled and captured as
    # a CUDA graph on a GPU (Hugging Face's cache_implementation="static"; generation/session.py's StaticSession);
    # "dynamic": caches read as far as they are filled. Not read from generation_config.json (a folder's "hybrid"
    # or "static" names Hugging Face's cache classes).
    cache_implementation: str = option(
        "dynamic", flag=Flag("--cache-implementation", str, "dynamic (default) or static: fixed-shape decoding "
                                                             "steps, captured as a CUDA graph on a GPU"),
        refused={SERVER: "the server decodes over its own paged cache"})
    # Tokens never chosen, and tokens not chosen as the first new one (None: the model config's; () none).
    suppress_tokens: tuple[int, ...] | None = None
    begin_suppress_tokens: tuple[int, ...] | None = None
    # An encoder-decoder's (a speech model's) first decoder tokens for every row, in place of its start token:
    # Whisper's <|startoftranscript|>, language, task, <|notimestamps|> (tformer.models.speech.whisper_prompt).
    decoder_prompt_ids: tuple[int, ...] = ()
    # What the new text must be (``constraints.Constraint``: a JSON object, JSON valid under a schema, a regex's
    # match, one of some strings, a Lark grammar's sentence), masked token by token by the chooser's
    # ``Constrained`` rule, which ends the text with an end id once it is complete; None: free text.
    constraint: Constraint | None = option(
        None, refused={BEAM_SEARCH: "each beam would need its own grammar state; decode with num_beams=1",
                       SPECULATIVE: "drafted tokens are checked without the grammar's state; decode without a draft "
                                    "model"})

    def __post_init__(self) -> None:
        self._check()

    def replace(self, **changes: object) -> GenerationConfig:
        """A checked copy with ``changes``; an unknown option is a TypeError that lists the known ones."""
        known = {field.name for field in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(f"unknown generation option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return dataclasses.replace(self, **changes)

    @property
    def sampling(self) -> bool:
        """Whether tokens are drawn (else the argmax): ``do_sample``, or implied by the sampling options."""
        if self.temperature == 0:
            return False
        if self.do_sample is None:  # a sampling option away from its default (temperature 1, no cut)
            return any(getattr(self, field.name) != field.default for field in _fields_declaring("sampling"))
        return self.do_sample

    def for_prompt(self, prompt_length: int) -> GenerationConfig:
        """This config with ``max_length`` turned into ``max_new_tokens`` for a decoder prompt of
        ``prompt_length`` tokens (unchanged without ``max_length``)."""
        if self.max_length is None:
            return self
        if self.max_length <= prompt_length:
            raise GenerationError(f"max_length={self.max_length} leaves no new token after a {prompt_length}-token "
                                  "prompt; pass max_new_tokens")
        return dataclasses.replace(self, max_new_tokens=self.max_length - prompt_length, max_length=None)

    def end_ids(self, model_config) -> tuple[int, ...]:
        """The end-of-sequence ids, the model config's by default (all of a list), then ``stop_token_ids``, each
        within its vocabulary."""
        value = self.eos_token_id
        if value is None:  # a Llama 3 config.json's list is kept whole in extra (eos_token_id holds its first)
            value = getattr(model_config, "extra", {}).get("eos_token_ids", model_config.eos_token_id)
        ends = _token_ids("eos_token_id", value, model_config.vocab_size)
        stops = _token_ids("stop_token_ids", self.stop_token_ids, model_config.vocab_size)
        return tuple(dict.fromkeys((*ends, *stops)))

    def biased_ids(self, model_config) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """``logit_bias`` as its ids, each within the vocabulary, and their biases."""
        ids = _token_ids("logit_bias", [token for token, _ in self.logit_bias], model_config.vocab_size)
        return ids, tuple(bias for _, bias in self.logit_bias)

    def allowed_ids(self, model_config) -> tuple[int, ...] | None:
        """``allowed_token_ids`` within the vocabulary; None: every token may be chosen."""
        if self.allowed_token_ids is None:
            return None
        return _token_ids("allowed_token_ids", self.allowed_token_ids, model_config.vocab_size)

    def forced_end_id(self, model_config) -> int | None:
        """The token a row that reaches ``max_new_tokens`` must end with (the option, else the model config's
        ``forced_eos_token_id``), or None."""
        value = getattr(model_config, "forced_eos_token_id", None) if self.forced_eos_token_id is None \
            else self.forced_eos_token_id
        if value is False or value is None:
            return None
        (forced_id,) = _token_ids("forced_eos_token_id", value, model_config.vocab_size)
        return forced_id

    def suppressed_ids(self, model_config) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ids never chosen and the ids not chosen first: the options, else the model config's, each within
        its vocabulary."""
        found = []
        for name in ("suppress_tokens", "begin_suppress_tokens"):
            value = getattr(self, name)
            found.append(_token_ids(name, getattr(model_config, name, ()) if value is None else value,
                                    model_config.vocab_size))
        return found[0], found[1]

    def pad_id(self, model_config) -> int:
        """The id finished rows are filled with: the option, the config's, else the first end id, else 0."""
        value = self.pad_token_id
        if value is None:
            end_ids = self.end_ids(model_config)
            value = model_config.pad_token_id if model_config.pad_token_id is not None else (end_ids[0] if end_ids
                                                                                             else 0)
        (pad_id,) = _token_ids("pad_token_id", value, model_config.vocab_size)
        return pad_id

    # ---- the checks, one per option ------------------------------------------------------------

    def _check(self) -> None:
        _require_int("max_new_tokens", self.max_new_tokens, 0)
        _require_int("min_new_tokens", self.min_new_tokens, 0)
        if self.max_length is not None:
            _require_int("max_length", self.max_length, 1)
        forced = self.forced_eos_token_id
        if forced is not None and forced is not False and (isinstance(forced, bool) or not isinstance(forced, int)):
            raise GenerationError(f"forced_eos_token_id={forced!r} must be a token id, None (the model config's) "
                                  "or False (none)")
        if self.min_new_tokens > self.max_new_tokens:
            raise GenerationError(f"min_new_tokens={self.min_new_tokens} exceeds max_new_tokens={self.max_new_tokens}")
        self._check_logits_rules()
        if self.seed is not None:
            _require_int("seed", self.seed, 0)
            if self.seed >= 2**64:
                raise GenerationError(f"seed={self.seed} must be below 2**64 (a generator's seed is 64 bits)")
        if self.eos_token_id is not None and not isinstance(self.eos_token_id, int):  # several: a tuple
            self._normalise("eos_token_id", _token_ids("eos_token_id", self.eos_token_id, None))
        elif self.eos_token_id is not None:
            _token_ids("eos_token_id", self.eos_token_id, None)
        if self.pad_token_id is not None and (not isinstance(self.pad_token_id, int)
                                              or isinstance(self.pad_token_id, bool)):
            raise GenerationError(f"pad_token_id={self.pad_token_id!r} must be one token id")
        self._normalise("stop_strings", _stop_strings(self.stop_strings))
        for name in ("include_stop_strings", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise GenerationError(f"{name}={getattr(self, name)!r} must be True or False")
        for name in ("suppress_tokens", "begin_suppress_tokens"):
            if getattr(self, name) is not None:
                self._normalise(name, _token_ids(name, list(getattr(self, name)), None))
        self._normalise("decoder_prompt_ids", _token_ids("decoder_prompt_ids", list(self.decoder_prompt_ids or ()),
                                                         None))
        if self.constraint is not None:
            if not isinstance(self.constraint, Constraint):
                raise GenerationError(f"constraint={self.constraint!r} must be a tformer.generation.constraints."
                                      "Constraint (Constraint.json_schema(...), .regex(...), ...) or None")
            if self.min_new_tokens:
                raise GenerationError(f"min_new_tokens={self.min_new_tokens} cannot be combined with a constraint: "
                                      "the structure may be complete sooner, and only an end id may follow it")
        _require_int("num_beams", self.num_beams, 1)
        _require_int("num_return_sequences", self.num_return_sequences, 1)
        if not _is_number(self.length_penalty):
            raise GenerationError(f"length_penalty={self.length_penalty!r} must be a number")
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise GenerationError(f"early_stopping={self.early_stopping!r} must be True, False or 'never'")
        if self.num_beams > 1:
            if self.sampling:
                names = ", ".join(("do_sample", *(field.name for field in _fields_declaring("sampling"))))
                raise GenerationError(f"sampling ({names}) cannot be combined with num_beams > 1")
            refuse_unsupported(self, BEAM_SEARCH)
            if self.num_return_sequences > self.num_beams:
                raise GenerationError(
                    f"num_return_sequences={self.num_return_sequences} exceeds num_beams={self.num_beams}; "
                    "beam search returns at most num_beams sequences"
                )
        elif self.num_return_sequences > 1 and not self.sampling:
            raise GenerationError(
                f"num_return_sequences={self.num_return_sequences} needs sampling (do_sample=True) or beam search "
                "(num_beams >= num_return_sequences); greedy decoding has one answer"
            )
        _require_int("num_draft_tokens", self.num_draft_tokens, 1)
        for name in ("output_scores", "return_dict", "use_cache"):
            if not isinstance(getattr(self, name), bool):
                raise GenerationError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.cache_implementation not in CACHE_IMPLEMENTATIONS:
            raise GenerationError(f"cache_implementation={self.cache_implementation!r} must be one of "
                                  f"{', '.join(map(repr, CACHE_IMPLEMENTATIONS))}")
        if self.cache_implementation == "static" and not self.use_cache:
            raise GenerationError("cache_implementation='static' needs use_cache=True (without a cache every step "
                                  "re-runs the whole sequence)")

    def _check_logits_rules(self) -> None:
        """The options of the logits rules (``generation/rules.py``): sampling and penalties."""
        if self.do_sample is not None and not isinstance(self.do_sample, bool):
            raise GenerationError(f"do_sample={self.do_sample!r} must be True, False or None")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise GenerationError(f"temperature={self.temperature!r} must be a number >= 0 (0 = greedy)")
        if self.top_k is not None:
            _require_int("top_k", self.top_k, 1)
        if self.top_p is not None and (not _is_number(self.top_p) or not 0 < self.top_p <= 1):
            raise GenerationError(f"top_p={self.top_p!r} must be a number in (0, 1]")
        if self.min_p is not None and (not _is_number(self.min_p) or not 0 <= self.min_p <= 1):
            raise GenerationError(f"min_p={self.min_p!r} must be a number in [0, 1]")
        if not _is_number(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise GenerationError(f"repetition_penalty={self.repetition_penalty!r} must be a number > 0 (1 = none)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2 <= value <= 2:
                raise GenerationError(f"{name}={value!r} must be a number in [-2, 2] (0 = none)")
        self._normalise("logit_bias", _logit_bias(self.logit_bias))
        if self.allowed_token_ids is not None:
            allowed = _token_ids("allowed_token_ids", self.allowed_token_ids, None)
            if not allowed:
                raise GenerationError("allowed_token_ids=() allows no token; give at least one id, or None for all")
            self._normalise("allowed_token_ids", allowed)
        self._normalise("stop_token_ids", _token_ids("stop_token_ids", self.stop_token_ids, None))

    def _normalise(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)  # frozen: set once, while being made


# ---- the tables derived from the fields' declarations ------------------------------------------------


def declared() -> dict[str, Option]:
    """Every ``GenerationConfig`` field's ``Option``, in field order (a field declaring none: ``Option()``)."""
    return {field.name: field.metadata.get(DECLARATION, _NOTHING) for field in dataclasses.fields(GenerationConfig)}


def refusals(path: str) -> dict[str, str | None]:
    """Every field: None where the decoding ``path`` (SERVER, ...) applies it, else why it refuses a value other
    than the default."""
    return {name: declaration.refused.get(path) for name, declaration in declared().items()}


def refuse_unsupported(config: GenerationConfig, path: str) -> None:
    """A GenerationError naming the first option of ``config`` that ``path`` cannot apply set away from its
    default, and why (the field's declaration)."""
    for field in dataclasses.fields(config):
        reason = field.metadata.get(DECLARATION, _NOTHING).refused.get(path)
        if reason is not None and getattr(config, field.name) != field.default:
            raise GenerationError(f"{field.name}={getattr(config, field.name)!r} is not supported by {path}: {reason}")


_NOTHING = Option()


@functools.cache
def _fields_declaring(attribute: str) -> tuple[dataclasses.Field, ...]:
    """The ``GenerationConfig`` fields whose ``Option`` sets ``attribute`` (a flag such as "sampling")."""
    return tuple(field for field in dataclasses.fields(GenerationConfig)
                 if getattr(field.metadata.get(DECLARATION, _NOTHING), attribute))


def _is_number(value: object) -> bool:
    """A finite int or float (NaN and infinities are refused: no option means anything with them)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _require_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise GenerationError(f"{name}={value!r} must be an integer >= {minimum}")


def _token_ids(name: str, value: object, vocab_size: int | None) -> tuple[int, ...]:
    """One id or several as a tuple, each checked against the vocabulary (when known)."""
    if value is None:
        return ()
    ids = [value] if isinstance(value, int) else value
    if callable(getattr(ids, "flatten", None)):  # a tensor or an array (settings.py imports no torch)
        ids = ids.flatten().tolist()
    if not isinstance(ids, Sequence) or isinstance(ids, str):
        raise GenerationError(f"{name}={value!r} must be a token id or a list of token ids")
    upper = float("inf") if vocab_size is None else vocab_size
    for token in ids:
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < upper:
            allowed = "a token id >= 0" if vocab_size is None else f"a token id in [0, {vocab_size})"
            raise GenerationError(f"{name}={value!r}: {token!r} is not {allowed}")
    return tuple(ids)


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """(token id, bias) pairs from pairs or a mapping id -> bias: each id once, each bias a number in [-100, 100]
    (OpenAI's range)."""
    if value is None:
        return ()
    pairs = list(value.items()) if isinstance(value, Mapping) else value
    if not isinstance(pairs, Sequence) or isinstance(pairs, str) or not all(
            isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2 for pair in pairs):
        raise GenerationError(f"logit_bias={value!r} must map token ids to biases ((id, bias) pairs or a dict)")
    seen: set[int] = set()
    for token, bias in pairs:
        if not isinstance(token, int) or isinstance(token, bool) or token < 0:
            raise GenerationError(f"logit_bias: {token!r} is not a token id >= 0")
        if token in seen:
            raise GenerationError(f"logit_bias: token id {token} is given twice")
        seen.add(token)
        if not _is_number(bias) or not -100 <= bias <= 100:
            raise GenerationError(f"logit_bias: the bias of token id {token} is {bias!r}; it must be a number in "
                                  "[-100, 100]")
    return tuple((token, float(bias)) for token, bias in pairs)


def _stop_strings(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    strings = (value,) if isinstance(value, str) else value
    if not isinstance(strings, Sequence) or not all(isinstance(s, str) and s for s in strings):
        raise GenerationError(f"stop_strings={value!r} must be a non-empty string or a list of them")
    return tuple(strings)
