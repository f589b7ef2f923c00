"""Fail closed: the fast decoder and each Hugging Face family honour only the ModelConfig fields
they declare; a switch they do not know (one added to the core later, or a real one such as
embedding_norm) keeps a model off the fast path and out of Hugging Face's format."""

from dataclasses import dataclass

import pytest
import torch

import tformer
from tformer import ModelConfig
from tformer.checkpoint import CheckpointError
from tformer.generation.fast_decoder import FastDecoder, fast_decoder_for
from tformer.interop import family_for_model_type
from tformer.models import DecoderLM

NANO = tformer.PRESETS["gpt-nano"]


@dataclass(frozen=True)
class _SwitchedConfig(ModelConfig):
    """ModelConfig with a switch nobody downstream has heard of (as a future field would be)."""

    new_switch: bool = False


def _model(config: ModelConfig) -> DecoderLM:
    return DecoderLM(config).eval()


@pytest.mark.parametrize("config, field", [
    (_SwitchedConfig(**{**NANO.to_dict(), "new_switch": True}), "new_switch=True"),
    (NANO.replace(embedding_norm=True), "embedding_norm=True"),
])
def test_unknown_switch_keeps_the_fast_decoder_off(config, field):
    model = _model(config)
    assert field in FastDecoder.supports(model)
    assert fast_decoder_for(model) is None
    prompt = torch.randint(0, 64, (2, 4))
    assert torch.equal(tformer.generate(model, prompt, 6), tformer.generate(model, prompt, 6, use_cache=False))


def test_the_same_model_without_the_switch_takes_the_fast_path():
    assert fast_decoder_for(_model(_SwitchedConfig(**NANO.to_dict()))) is not None
    assert fast_decoder_for(_model(NANO)) is not None


@pytest.mark.parametrize("config, field", [
    (_SwitchedConfig(**{**NANO.to_dict(), "new_switch": True}), "new_switch=True (needs False: not a gpt2 setting)"),
    (NANO.replace(embedding_norm=True), "embedding_norm=True (needs False: not a gpt2 setting)"),
])
def test_unknown_switch_is_refused_by_every_hugging_face_family(tmp_path, config, field):
    gpt2, llama = family_for_model_type("gpt2"), family_for_model_type("llama")
    assert field in gpt2.mismatches(config)
    assert any(reason.startswith(field.split(" ")[0]) for reason in llama.mismatches(config))
    with pytest.raises(CheckpointError, match="no Hugging Face equivalent") as error:
        _model(config).save(tmp_path / "out", format="hf")
    assert field in str(error.value)
    assert not (tmp_path / "out").exists()


def test_fields_a_family_does_not_translate_are_named():
    llama_shaped = tformer.PRESETS["llama-small"]
    assert family_for_model_type("llama").mismatches(llama_shaped) == []
    reasons = family_for_model_type("llama").mismatches(llama_shaped.replace(dropout=0.1, scale_embeddings=True))
    assert reasons == ["dropout=0.1 (needs 0.0: not a llama setting)",
                       "scale_embeddings=True (needs False: not a llama setting)"]
