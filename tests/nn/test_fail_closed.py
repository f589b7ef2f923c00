"""Fail closed: the places that lay a pass out themselves (a decoding session, the serving engine) and
each Hugging Face family honour only the ModelConfig fields they declare; a switch they do not know (one
added to the core later) sends decoding through the model's own forward, makes the server refuse the
model, and keeps it out of Hugging Face's format. Every field of ModelConfig and GenerationConfig is
declared somewhere, so a new one fails a test until someone says what it means there."""

from dataclasses import dataclass, fields

import pytest
import torch

import tformer
from tformer import ModelConfig
from tformer.checkpoint import CheckpointError
from tformer.generation import GenerationConfig, GenerationError, ModelSession, StackSession, open_session
from tformer.interop import family_for_model_type
from tformer.models import DecoderLM
from tformer.nn.stack import LAYOUT_FIELDS
from tformer.serving.engine import GENERATION_FIELDS, Engine

NANO = tformer.PRESETS["gpt-nano"]


@dataclass(frozen=True)
class _SwitchedConfig(ModelConfig):
    """ModelConfig with a switch nobody downstream has heard of (as a future field would be)."""

    new_switch: bool = False


def _model(config: ModelConfig) -> DecoderLM:
    return DecoderLM(config).eval()


def test_every_model_config_field_is_one_the_layouts_know():
    assert {field.name for field in fields(ModelConfig)} <= LAYOUT_FIELDS


def test_every_generation_config_field_is_honoured_or_refused_by_the_engine():
    assert set(GENERATION_FIELDS) == {field.name for field in fields(GenerationConfig)}


def test_an_unknown_switch_decodes_through_the_models_forward_and_the_server_refuses_it():
    model = _model(_SwitchedConfig(**{**NANO.to_dict(), "new_switch": True}))
    assert "new_switch=True" in model.step_problem()
    prompt = torch.randint(0, 64, (2, 4))
    session, _ = open_session(model, prompt, None, 6)
    assert type(session) is ModelSession
    assert torch.equal(tformer.generate(model, prompt, 6), tformer.generate(model, prompt, 6, use_cache=False))
    with pytest.raises(GenerationError, match="new_switch=True"):
        Engine(model)


def test_the_same_model_without_the_switch_decodes_on_the_stack_path():
    for config in (_SwitchedConfig(**NANO.to_dict()), NANO, NANO.replace(embedding_norm=True)):
        session, _ = open_session(_model(config), torch.randint(0, 64, (1, 3)), None, 2)
        assert type(session) is StackSession


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
