"""The checks of a ``generate`` call that need the model: that it generates, its prompt, and what the options ask
of its vocabulary and of a draft model. Each problem is one ``GenerationError`` naming what is wrong."""

from __future__ import annotations

from torch import Tensor

from tformer.generation.settings import GenerationConfig, GenerationError, _token_ids
from tformer.models.generation_protocol import GenerationProtocol


def check_model(model: object, role: str = "model") -> None:
    """A model ``generate`` can decode: one offering the generation protocol that writes tokens."""
    if not isinstance(model, GenerationProtocol):
        raise GenerationError(f"{role} must be a tformer model (one offering tformer.models.GenerationProtocol); "
                              f"got {type(model).__name__}")
    if not model.generates:
        raise GenerationError(f"{role} ({type(model).__name__}, architecture={model.config.architecture!r}) does not "
                              "generate tokens")


def check_prompt(model: GenerationProtocol, input_ids: object, attention_mask: object) -> None:
    """The prompt is one the model can read (``GenerationProtocol.check_generation_input``)."""
    problem = model.check_generation_input(input_ids, attention_mask)
    if problem is not None:
        raise GenerationError(problem)


def check_call(
    config: GenerationConfig,
    model: GenerationProtocol,
    input_ids: Tensor,
    draft_model: GenerationProtocol | None,
    tokenizer: object | None,
    streaming: bool,
) -> None:
    """The checks that need more than the options: the model's vocabulary, a tokenizer for stop
    strings, streaming, and what speculative decoding needs of its draft model."""
    config.pad_id(model.config)  # checks the end and pad ids against the vocabulary
    config.suppressed_ids(model.config)
    if config.decoder_prompt_ids:
        if not model.encodes_prompt:
            raise GenerationError("decoder_prompt_ids are an encoder-decoder's first decoder tokens; a decoder's "
                                  "prompt is its input_ids")
        _token_ids("decoder_prompt_ids", config.decoder_prompt_ids, model.config.vocab_size)
    if config.stop_strings and tokenizer is None:
        raise GenerationError("stop_strings need a tokenizer: pass tokenizer= or attach one to the model")
    if streaming and config.num_beams > 1:
        raise GenerationError("streaming needs num_beams=1: beam search only knows its sequences at the end")
    if draft_model is not None:
        check_draft(config, model, input_ids, draft_model)


def check_draft(config: GenerationConfig, model: GenerationProtocol, input_ids: Tensor,
                draft_model: GenerationProtocol) -> None:
    """What speculative decoding needs of its draft model and of the call."""
    check_model(draft_model, role="draft_model")
    if draft_model.config.vocab_size != model.config.vocab_size:
        raise GenerationError(
            f"draft_model has vocab_size={draft_model.config.vocab_size}, the model {model.config.vocab_size}; "
            "speculative decoding needs the same vocabulary"
        )
    if config.num_beams > 1:
        raise GenerationError("speculative decoding (draft_model) cannot be combined with num_beams > 1")
    if input_ids.shape[0] * config.num_return_sequences != 1:
        raise GenerationError(
            f"speculative decoding (draft_model) takes one sequence at a time; got batch size "
            f"{input_ids.shape[0]} x num_return_sequences {config.num_return_sequences}"
        )
    if not config.use_cache:
        raise GenerationError("speculative decoding (draft_model) needs use_cache=True")
