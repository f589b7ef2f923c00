"""BERT (``model_type: bert``): post-norm encoder with segment embeddings and an embedding
LayerNorm; the Hugging Face class in config.json's ``architectures`` picks the head.

Hugging Face keeps ``query``/``key``/``value`` apart; tformer stacks them into ``qkv_proj``.
Its pooler, masked-LM head (``cls.predictions``, the decoder tied to the word embeddings, its
bias stored once as ``cls.predictions.bias``), next-sentence head (``cls.seq_relationship``),
``classifier`` and ``qa_outputs`` map onto EncoderModel's ``pooler``, ``mlm_head``, ``nsp_head``,
``classifier`` and ``qa_head``. RoBERTa (interop/roberta.py) is this family with another layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from tformer.config import ModelConfig
from tformer.interop.family import (
    BERT_ENCODER_KEYS,
    CLASSIC_MHA_WITH_BIASES,
    Family,
    hf_field,
    num_labels_from_hf,
    require,
)
from tformer.interop.weight_map import ModuleMap


class BertFamily(Family):
    model_type = "bert"
    architecture = "encoder"
    architecture_class = "BertModel"
    base_prefix = "bert."
    # HF class -> tformer head.
    heads: Mapping[str, str | None] = {
        "BertModel": None,
        "BertForMaskedLM": "masked_lm",
        "BertForNextSentencePrediction": "next_sentence",
        "BertForPreTraining": "pretraining",
        "BertForSequenceClassification": "sequence_classification",
        "BertForTokenClassification": "token_classification",
        "BertForQuestionAnswering": "question_answering",
    }
    head_prefixes = ("bert.pooler.", "cls.", "classifier.", "qa_outputs.")
    tied_output_names = ("cls.predictions.decoder.weight",)
    # The masked-LM head's bias and the decoder's: one tensor when tied, two (the decoder's is used) when not.
    mlm_bias_names = ("cls.predictions.bias", "cls.predictions.decoder.bias")
    # Files of older transformers versions carry index buffers.
    ignored_names = (r"\.embeddings\.position_ids$", r"\.embeddings\.token_type_ids$")
    head_map: Mapping[str, ModuleMap] = {
        "pooler.dense": ModuleMap(("bert.pooler.dense",)),
        "mlm_head.dense": ModuleMap(("cls.predictions.transform.dense",)),
        "mlm_head.norm": ModuleMap(("cls.predictions.transform.LayerNorm",)),
        "mlm_head.decoder": ModuleMap(("cls.predictions.decoder",)),
        "mlm_head": ModuleMap(("cls.predictions",)),  # its bias (the decoder's when untied: see module_map)
        "nsp_head": ModuleMap(("cls.seq_relationship",)),
        "classifier": ModuleMap(("classifier",)),
        "qa_head": ModuleMap(("qa_outputs",)),
    }
    hf_keys = {
        **BERT_ENCODER_KEYS,
        "vocab_size": ("vocab_size", 30522),
        "max_seq_len": ("max_position_embeddings", 512),
        "type_vocab_size": ("type_vocab_size", 2),
        "dropout": ("hidden_dropout_prob", 0.1),
        "attention_dropout": ("attention_probs_dropout_prob", 0.1),
        "tie_embeddings": ("tie_word_embeddings", True),
    }
    layout = {"positional": "learned", "norm": "layernorm", "norm_position": "post", "embedding_norm": True}
    requirements = CLASSIC_MHA_WITH_BIASES
    # Variants of HF's BERT that tformer does not implement, each with the one value it supports.
    pinned = {"is_decoder": False, "add_cross_attention": False, "position_embedding_type": "absolute"}
    token_defaults: Mapping[str, int | None] = {"pad_token_id": 0}
    fields_in_overrides = frozenset({"problem_type", "position_offset", "pooler_input_dropout"})

    def module_map(self, config: ModelConfig) -> Mapping[str, ModuleMap]:
        p = self.base_prefix
        layer = p + "encoder.layer.{i}."
        return {
            "embedding.token": ModuleMap((p + "embeddings.word_embeddings",)),
            "embedding.token_type": ModuleMap((p + "embeddings.token_type_embeddings",)),
            "stack.positional.absolute.embedding": ModuleMap((p + "embeddings.position_embeddings",)),
            "stack.embedding_norm": ModuleMap((p + "embeddings.LayerNorm",)),
            "stack.blocks.{i}.attention.qkv_proj": ModuleMap(
                (layer + "attention.self.query", layer + "attention.self.key", layer + "attention.self.value"),
                fused="qkv",
            ),
            "stack.blocks.{i}.attention.out_proj": ModuleMap((layer + "attention.output.dense",)),
            "stack.blocks.{i}.attention_norm": ModuleMap((layer + "attention.output.LayerNorm",)),
            "stack.blocks.{i}.feedforward.in_proj": ModuleMap((layer + "intermediate.dense",)),
            "stack.blocks.{i}.feedforward.out_proj": ModuleMap((layer + "output.dense",)),
            "stack.blocks.{i}.feedforward_norm": ModuleMap((layer + "output.LayerNorm",)),
            **self.head_module_map(config.head),
            **self.untied_bias_map(config),
        }

    def untied_bias_map(self, config: ModelConfig) -> Mapping[str, ModuleMap]:
        """An untied masked-LM head's bias is its decoder's (HF reads that one)."""
        if config.tie_embeddings:
            return {}
        return {"mlm_head": ModuleMap((self.mlm_bias_names[1].removesuffix(".bias"),))}

    def normalized_state(self, hf_state: Mapping[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
        """As the base class, and the masked-LM bias as HF reads it: when tied, ``cls.predictions.bias``
        (the decoder's is the same tensor, or a copy in older files); when untied, the decoder's own."""
        state = super().normalized_state(hf_state, config)
        head_bias, decoder_bias = self.mlm_bias_names
        if config.tie_embeddings:
            state.pop(decoder_bias, None)
        else:
            if decoder_bias not in state and head_bias in state:
                state[decoder_bias] = state[head_bias]
            state.pop(head_bias, None)
        return state

    def saved_state(self, hf_state: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
        """As the base class, and an untied decoder's bias also as the head's (HF keeps both)."""
        head_bias, decoder_bias = self.mlm_bias_names
        if config.head is not None and decoder_bias in hf_state:
            hf_state[head_bias] = hf_state[decoder_bias].clone()
        return super().saved_state(hf_state, config)

    def head_module_map(self, head: str | None) -> Mapping[str, ModuleMap]:
        """The HF modules of the pooler and heads of a model with ``head``."""
        return self.head_map

    # ---- config ---------------------------------------------------------------------------

    def values_from_hf(self, raw: Mapping[str, Any], tokens: dict[str, Any]) -> dict[str, Any]:
        values = super().values_from_hf(raw, tokens)
        model_type, head, dropout = self.model_type, values["head"], values["dropout"]
        require(model_type, "classifier_dropout", hf_field(raw, "classifier_dropout", dropout), dropout)
        if head == "question_answering":
            require(model_type, "num_labels (question answering: start and end)", num_labels_from_hf(raw), 2)
        if head == "sequence_classification":
            values["problem_type"] = hf_field(raw, "problem_type", None)
        return {**values, **self.layout_from_hf(raw, head)}

    def layout_from_hf(self, raw: Mapping[str, Any], head: str | None) -> dict[str, Any]:
        """The config fields of this family's layout (RoBERTa: positions after the padding index)."""
        return {}

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]:
        raw = {**super().config_to_hf(config), "classifier_dropout": None}
        if config.problem_type is not None:
            raw["problem_type"] = config.problem_type
        return raw

    def requirements_of(self, config: ModelConfig) -> dict[str, Any]:
        return {**super().requirements_of(config), **self.layout_required(config)}

    def required_values(self, config: ModelConfig) -> list[str]:
        found = super().required_values(config)
        if config.type_vocab_size < 1:
            found.append(f"type_vocab_size={config.type_vocab_size} (needs >= 1: {self.model_type} has segment "
                         "embeddings)")
        return found

    def layout_required(self, config: ModelConfig) -> dict[str, Any]:
        """The layout fields' values this family needs for ``config``."""
        return {"position_offset": 0, "pooler_input_dropout": False}
