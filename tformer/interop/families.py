"""The Hugging Face families tformer reads and writes, found by ``model_type`` or by config."""

from __future__ import annotations

from tformer.checkpoint import CheckpointError
from tformer.config import ModelConfig
from tformer.interop.bert import BertFamily
from tformer.interop.family import ORIGIN_KEY, Family
from tformer.interop.gemma import GemmaFamily
from tformer.interop.gemma2 import Gemma2Family
from tformer.interop.gpt2 import GPT2Family
from tformer.interop.llama import LlamaFamily
from tformer.interop.marian import MarianFamily
from tformer.interop.mistral import MistralFamily
from tformer.interop.mixtral import MixtralFamily
from tformer.interop.phi3 import Phi3Family
from tformer.interop.qwen2 import Qwen2Family
from tformer.interop.qwen2_moe import Qwen2MoeFamily
from tformer.interop.roberta import RobertaFamily
from tformer.interop.t5 import T5Family
from tformer.interop.vit import ViTFamily
from tformer.interop.whisper import WhisperFamily

HF_FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (GPT2Family(), LlamaFamily(), Qwen2Family(), MistralFamily(), Phi3Family(), GemmaFamily(),
                   BertFamily(), RobertaFamily(), ViTFamily(), MarianFamily(), T5Family(), WhisperFamily(),
                   MixtralFamily(), Qwen2MoeFamily(), Gemma2Family())
}
SUPPORTED_MODEL_TYPES = tuple(HF_FAMILIES)


def family_for_model_type(model_type: object) -> Family:
    """The family of a config.json's ``model_type``; an unsupported one names the supported ones."""
    try:
        return HF_FAMILIES[model_type]
    except (KeyError, TypeError):
        raise CheckpointError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        ) from None


def family_for_config(config: ModelConfig) -> Family:
    """The family ``config`` was read from (``extra["hf_model_type"]``, which the Llama-shaped families record)
    when it can still represent it, else the first family of its architecture that can; otherwise an error
    saying what each lacks."""
    reasons = {}
    candidates = {model_type: family for model_type, family in HF_FAMILIES.items()
                  if family.architecture == config.architecture}
    origin = config.extra.get(ORIGIN_KEY)
    if origin in candidates:
        candidates = {origin: candidates[origin], **candidates}
    if not candidates:
        raise CheckpointError(f"architecture={config.architecture!r} has no Hugging Face family in tformer")
    for model_type, family in candidates.items():
        mismatches = family.mismatches(config)
        if not mismatches:
            return family
        reasons[model_type] = ", ".join(mismatches)
    details = "; ".join(f"as {model_type}: {why}" for model_type, why in reasons.items())
    raise CheckpointError(f"this model has no Hugging Face equivalent ({details})")
