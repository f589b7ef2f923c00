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

from tformer.checkpoint import CheckpointError
from tformer.config import ModelConfig
from tformer.interop.family import Family, differences, hf_field, require, special_token_ids, translated, width_mismatch
from tformer.interop.weight_map import ModuleMap

# HF ``hidden_act`` <-> tformer activation.
ACTIVATIONS_FROM_HF = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
ACTIVATIONS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}
# Variants of HF's BERT that tformer does not implement, each with the one value it supports.
UNSUPPORTED_UNLESS = {"is_decoder": False, "add_cross_attention": False, "position_embedding_type": "absolute"}


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
    handled_fields = frozenset({
        "architecture", "vocab_size", "max_seq_len", "d_model", "num_layers", "num_heads", "num_kv_heads",
        "head_dim", "d_ff", "activation", "norm", "norm_position", "norm_eps", "positional", "dropout",
        "attention_dropout", "bias", "norm_bias", "attention_bias", "feedforward_bias", "tie_embeddings",
        "embedding_norm", "type_vocab_size", "initializer_range", "pad_token_id", "bos_token_id", "eos_token_id",
        "head", "num_labels", "problem_type", "label_names", "position_offset", "pooler_input_dropout",
    })
    special_defaults: Mapping[str, Any] = {"vocab_size": 30522, "pad_token_id": 0}

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
        """HF's layout: the bare model's tensors without the base prefix; an untied decoder's bias
        also as the head's (HF keeps both)."""
        if config.head is None:
            return {name.removeprefix(self.base_prefix): tensor for name, tensor in hf_state.items()}
        head_bias, decoder_bias = self.mlm_bias_names
        if decoder_bias in hf_state:
            hf_state[head_bias] = hf_state[decoder_bias].clone()
        return hf_state

    def head_module_map(self, head: str | None) -> Mapping[str, ModuleMap]:
        """The HF modules of the pooler and heads of a model with ``head``."""
        return self.head_map

    # ---- config ---------------------------------------------------------------------------

    def config_from_hf(self, raw: Mapping[str, Any]) -> ModelConfig:
        model_type = self.model_type
        for key, supported in UNSUPPORTED_UNLESS.items():
            require(model_type, key, hf_field(raw, key, supported), supported)
        dropout = hf_field(raw, "hidden_dropout_prob", 0.1)
        require(model_type, "classifier_dropout", hf_field(raw, "classifier_dropout", dropout), dropout)
        head = self.head_from_hf(raw)
        labels = labels_from_hf(model_type, raw) if head in ("sequence_classification", "token_classification") \
            else {}
        if head == "question_answering":
            require(model_type, "num_labels (question answering: start and end)", _num_labels(raw), 2)
        problem_type = hf_field(raw, "problem_type", None) if head == "sequence_classification" else None
        return ModelConfig(
            architecture="encoder",
            vocab_size=hf_field(raw, "vocab_size", 30522),
            max_seq_len=hf_field(raw, "max_position_embeddings", 512),
            d_model=hf_field(raw, "hidden_size", 768),
            num_layers=hf_field(raw, "num_hidden_layers", 12),
            num_heads=hf_field(raw, "num_attention_heads", 12),
            d_ff=hf_field(raw, "intermediate_size", 3072),
            activation=translated(model_type, "hidden_act", hf_field(raw, "hidden_act", "gelu"), ACTIVATIONS_FROM_HF),
            norm="layernorm",
            norm_position="post",
            norm_eps=hf_field(raw, "layer_norm_eps", 1e-12),
            positional="learned",
            embedding_norm=True,
            type_vocab_size=hf_field(raw, "type_vocab_size", 2),
            dropout=dropout,
            attention_dropout=hf_field(raw, "attention_probs_dropout_prob", 0.1),
            bias=True,
            tie_embeddings=hf_field(raw, "tie_word_embeddings", True),
            initializer_range=hf_field(raw, "initializer_range", 0.02),
            head=head,
            problem_type=problem_type,
            **labels,
            **self.layout_from_hf(raw, head),
            **special_token_ids(model_type, raw, self.special_defaults),
        )

    def layout_from_hf(self, raw: Mapping[str, Any], head: str | None) -> dict[str, Any]:
        """The config fields of this family's layout (RoBERTa: positions after the padding index)."""
        return {}

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]:
        raw = {
            "architectures": [self.class_for_head(config.head)],
            "model_type": self.model_type,
            "vocab_size": config.vocab_size,
            "max_position_embeddings": config.max_seq_len,
            "hidden_size": config.d_model,
            "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads,
            "intermediate_size": config.d_ff,
            "hidden_act": ACTIVATIONS_TO_HF[config.activation],
            "layer_norm_eps": config.norm_eps,
            "type_vocab_size": config.type_vocab_size,
            "hidden_dropout_prob": config.dropout,
            "attention_probs_dropout_prob": config.attention_dropout,
            "classifier_dropout": None,
            "position_embedding_type": "absolute",
            "is_decoder": False,
            "add_cross_attention": False,
            "tie_word_embeddings": config.tie_embeddings,
            "initializer_range": config.initializer_range,
            "pad_token_id": config.pad_token_id,
            "bos_token_id": config.bos_token_id,
            "eos_token_id": config.eos_token_id,
        }
        if config.head in ("sequence_classification", "token_classification"):
            raw.update(labels_to_hf(config))
        if config.problem_type is not None:
            raw["problem_type"] = config.problem_type
        return raw

    def required_values(self, config: ModelConfig) -> list[str]:
        found = differences(config, {
            "architecture": "encoder",
            "positional": "learned",
            "norm": "layernorm",
            "norm_position": "post",
            "embedding_norm": True,
            "activation": tuple(ACTIVATIONS_TO_HF),
            "num_kv_heads": config.num_heads,
            "head_dim": config.d_model // config.num_heads,
            "norm_bias": True,
            "attention_bias": True,
            "feedforward_bias": True,
            "head": tuple(self.heads.values()),
            **self.layout_required(config),
        })
        found += width_mismatch(config)
        if config.type_vocab_size < 1:
            found.append(f"type_vocab_size={config.type_vocab_size} (needs >= 1: {self.model_type} has segment "
                         "embeddings)")
        return found

    def layout_required(self, config: ModelConfig) -> dict[str, Any]:
        """The layout fields' values this family needs for ``config``."""
        return {"position_offset": 0, "pooler_input_dropout": False}


def _num_labels(raw: Mapping[str, Any]) -> int:
    id2label = raw.get("id2label")
    return len(id2label) if isinstance(id2label, Mapping) and id2label else hf_field(raw, "num_labels", 2)


def labels_from_hf(model_type: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """``num_labels`` and ``label_names`` of a config.json's ``id2label`` (default names ``LABEL_i``: none)."""
    id2label = raw.get("id2label")
    if not isinstance(id2label, Mapping) or not id2label:
        return {"num_labels": _num_labels(raw)}
    try:
        by_id = {int(key): value for key, value in id2label.items()}
    except (TypeError, ValueError):
        raise CheckpointError(f"{model_type} id2label={dict(id2label)!r} must map label ids to names") from None
    if sorted(by_id) != list(range(len(by_id))):
        raise CheckpointError(f"{model_type} id2label ids {sorted(by_id)} must be 0..{len(by_id) - 1}")
    names = tuple(by_id[i] for i in range(len(by_id)))
    default = tuple(f"LABEL_{i}" for i in range(len(names)))
    return {"num_labels": len(names), "label_names": () if names == default else names}


def labels_to_hf(config: ModelConfig) -> dict[str, Any]:
    """config.json's ``id2label`` and ``label2id`` for a classifier of ``config`` (``LABEL_i`` unnamed)."""
    names = config.label_names_or_ids
    return {"id2label": {str(i): name for i, name in enumerate(names)},
            "label2id": {name: i for i, name in enumerate(names)}}
