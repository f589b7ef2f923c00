"""A checkpoint's generation defaults: a Hugging Face folder's ``generation_config.json`` read as Hugging Face's
``generate`` reads it, into one ``GenerationConfig`` the loader attaches to the model (``model.generation_config``).

Hugging Face takes the file whole when the folder has one (config.json's ids are then not read: a file without
``eos_token_id`` never ends early) and builds it from config.json otherwise; tformer does the same, the model
config's ids being config.json's. Each key is honoured (a ``GenerationConfig`` field), ignored (it changes
nothing ``generate`` returns, or it is data used only on request, documented in docs/generation.md), or refused
in one line naming it unless it holds Hugging Face's neutral value. A caller's explicit option always wins
(``with_model_defaults``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from tformer.checkpoint import CheckpointError
from tformer.errors import TformerError
from tformer.generation.settings import GenerationConfig, GenerationError, declared

GENERATION_CONFIG_NAME = "generation_config.json"
# GenerationConfig fields a model's defaults fill when a caller's config leaves them None ("the model's").
MODEL_FIELDS = ("eos_token_id", "pad_token_id", "forced_eos_token_id", "suppress_tokens", "begin_suppress_tokens")
# Keys read as the GenerationConfig field of the same name (each field declares it: ``from_file``): always, and
# the sampling ones only with do_sample true (Hugging Face applies its warpers only when sampling).
HONOURED = tuple(name for name, option in declared().items() if option.from_file and not option.sampling)
SAMPLING = tuple(name for name, option in declared().items() if option.from_file and option.sampling)
# Every key read (the others are ignored or refused).
READ = (*HONOURED, *SAMPLING, *MODEL_FIELDS, "decoder_start_token_id", "do_sample", "max_length")
# Keys that change nothing generate returns: bookkeeping, outputs tformer shapes its own way, the cache's
# kind, the start of a prompt-less call (tformer needs a prompt); Whisper's prompt and timestamp data, used
# by Hugging Face only when a call does not give the prompt (tformer's is the caller's decoder_prompt_ids).
IGNORED = frozenset({
    "transformers_version", "_from_model_config", "_commit_hash", "bos_token_id", "use_cache", "cache_implementation",
    "cache_config", "compile_config", "disable_compile", "output_attentions", "output_hidden_states",
    "output_scores", "output_logits", "return_dict_in_generate", "return_legacy_cache", "low_memory",
    "is_multilingual", "lang_to_id", "task_to_id", "alignment_heads", "no_timestamps_token_id",
    "max_initial_timestamp_index", "prev_sot_token_id", "forced_decoder_ids", "language", "task",
    "assistant_confidence_threshold", "num_assistant_tokens", "num_assistant_tokens_schedule",
    "assistant_lookbehind", "target_lookbehind", "prompt_lookup_num_tokens", "max_matching_ngram_size",
    "dola_layers", "token_healing", "generation_kwargs",
})
# Keys tformer does not implement, with Hugging Face's neutral value (the file may hold it, or null).
NEUTRAL = {
    "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "min_length": 0, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
    "top_h": None, "diversity_penalty": 0.0, "num_beam_groups": 1, "penalty_alpha": None,
    "bad_words_ids": None, "sequence_bias": None, "forced_bos_token_id": None, "renormalize_logits": False,
    "remove_invalid_values": False, "exponential_decay_length_penalty": None, "guidance_scale": None,
    "watermarking_config": None, "constraints": None, "force_words_ids": None, "suppress_tokens_at_begin": None,
    "return_timestamps": False, "begin_index": None, "max_time": None, "prefill_chunk_size": None,
}


def read_generation_defaults(folder: Path, model_config: Any) -> GenerationConfig | None:
    """The defaults of ``folder``'s generation_config.json for a model of ``model_config``, or None when the
    folder has none (the model config's ids then apply). A key tformer cannot honour is a GenerationError
    naming it; ids outside the vocabulary are dropped (never produced, they end nothing in Hugging Face either;
    config.json's are warned about already)."""
    path = folder / GENERATION_CONFIG_NAME
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise GenerationError(f"{path}: not readable JSON ({error})") from None
    try:
        if not isinstance(raw, dict):
            raise GenerationError("not a JSON object")
        return GenerationConfig(**_fields(raw, model_config))
    except (GenerationError, TypeError) as error:
        raise GenerationError(f"{path}: {error}") from None


def _fields(raw: Mapping[str, Any], model_config: Any) -> dict[str, Any]:
    """The GenerationConfig fields of a parsed generation_config.json (see the module's docstring)."""
    vocab = model_config.vocab_size

    def ids(key: str) -> tuple[int, ...]:
        value = raw.get(key)
        listed = [] if value is None else [value] if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(listed, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in listed):
            raise GenerationError(f"{key}={value!r} must be a token id or a list of token ids")
        return tuple(token for token in listed if 0 <= token < vocab)  # others never match, as in HF

    for key, value in raw.items():
        if key in READ:  # a field that declares it (from_file) is read, even one NEUTRAL still lists
            continue
        if key in NEUTRAL and value is not None and value != NEUTRAL[key]:
            raise GenerationError(f"{key}={value!r} is not supported by tformer (supported: {NEUTRAL[key]!r})")
        if key not in NEUTRAL and key not in IGNORED:
            raise GenerationError(f"{key}={value!r} is not supported by tformer (it honours {', '.join(READ)})")
    start = raw.get("decoder_start_token_id")
    if getattr(model_config, "architecture", "decoder") != "decoder" and start is not None \
            and start != model_config.decoder_start_token_id:
        raise GenerationError(f"decoder_start_token_id={start!r} differs from config.json's "
                              f"{model_config.decoder_start_token_id!r}: tformer starts from config.json's")
    fields: dict[str, Any] = {key: raw[key] for key in HONOURED if raw.get(key) is not None}
    if "max_new_tokens" not in fields and raw.get("max_length") is not None:  # max_new_tokens wins, as in HF
        fields["max_length"] = raw["max_length"]
    end_ids = ids("eos_token_id")
    fields["eos_token_id"] = end_ids  # () never ends early: HF's generate without an eos_token_id
    pad = ids("pad_token_id")
    fields["pad_token_id"] = pad[0] if pad else (end_ids[0] if end_ids else None)  # HF pads with the first end id
    forced = ids("forced_eos_token_id")
    fields["forced_eos_token_id"] = forced[0] if forced else False
    fields["suppress_tokens"] = ids("suppress_tokens")
    fields["begin_suppress_tokens"] = ids("begin_suppress_tokens")
    # Sampling: HF samples only with do_sample, then with its global top_k=50 unless set; do_sample false keeps
    # a call greedy whatever temperature it gives (as HF), no do_sample leaves tformer's rule (implied by them).
    if raw.get("do_sample"):
        fields.update({key: raw[key] for key in SAMPLING if raw.get(key) is not None}, do_sample=True)
        top_k, top_p = raw.get("top_k", 50), raw.get("top_p")
        fields.update(top_k=None if top_k in (None, 0) else top_k, top_p=None if top_p in (None, 1.0) else top_p)
    elif raw.get("do_sample") is not None:
        fields["do_sample"] = False
    return fields


def attach_generation_defaults(model: nn.Module, folder: Path) -> None:
    """Give ``model`` its folder's generation defaults (``model.generation_config``; None without a file)."""
    try:
        model.generation_config = read_generation_defaults(folder, model.config)
    except TformerError as error:
        raise CheckpointError(str(error)) from None


def model_defaults(model: nn.Module) -> GenerationConfig:
    """The model's generation defaults: its folder's generation_config.json's, else tformer's."""
    defaults = model.generation_config
    return defaults if isinstance(defaults, GenerationConfig) else GenerationConfig()


def with_model_defaults(model: nn.Module, config: GenerationConfig | None,
                        fields: tuple[str, ...] = MODEL_FIELDS) -> GenerationConfig:
    """A call's base config: ``config`` with its ``fields`` left None ("the model's") filled from the model's
    defaults, or the model's defaults whole when the caller gave no config."""
    if config is None:
        return model_defaults(model)
    defaults = model.generation_config
    if not isinstance(defaults, GenerationConfig):
        return config
    filled = {name: getattr(defaults, name) for name in fields if getattr(config, name) is None}
    return dataclasses.replace(config, **filled) if filled else config
