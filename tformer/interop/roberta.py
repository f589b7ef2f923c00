"""RoBERTa (``model_type: roberta``): BERT's layers with RoBERTa's layout.

Position ids start after the padding index: tokens other than ``pad_token_id`` are numbered
``pad_token_id + 1``, ``pad_token_id + 2``, ... and padding sits at ``pad_token_id``
(``position_offset = pad_token_id + 1``). The sequence-classification head is dropout, dense,
tanh, dropout, ``out_proj`` on ``<s>``: tformer's pooler (with ``pooler_input_dropout``) and
classifier. The masked-LM head (``lm_head``) always uses the exact GELU. No pretraining or
next-sentence heads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tformer.checkpoint import CheckpointError
from tformer.config import ModelConfig
from tformer.interop.bert import BertFamily
from tformer.interop.weight_map import ModuleMap

MLM_HEADS = ("masked_lm",)


class RobertaFamily(BertFamily):
    model_type = "roberta"
    architecture_class = "RobertaModel"
    base_prefix = "roberta."
    heads = {
        "RobertaModel": None,
        "RobertaForMaskedLM": "masked_lm",
        "RobertaForSequenceClassification": "sequence_classification",
        "RobertaForTokenClassification": "token_classification",
        "RobertaForQuestionAnswering": "question_answering",
    }
    head_prefixes = ("roberta.pooler.", "lm_head.", "classifier.", "qa_outputs.")
    tied_output_names = ("lm_head.decoder.weight",)
    mlm_bias_names = ("lm_head.bias", "lm_head.decoder.bias")
    hf_keys = {**BertFamily.hf_keys, "vocab_size": ("vocab_size", 50265)}
    token_defaults = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}

    def head_module_map(self, head: str | None) -> Mapping[str, ModuleMap]:
        classifying = head == "sequence_classification"
        return {
            "pooler.dense": ModuleMap(("classifier.dense",) if classifying else ("roberta.pooler.dense",)),
            "mlm_head.dense": ModuleMap(("lm_head.dense",)),
            "mlm_head.norm": ModuleMap(("lm_head.layer_norm",)),
            "mlm_head.decoder": ModuleMap(("lm_head.decoder",)),
            "mlm_head": ModuleMap(("lm_head",)),  # its bias
            "classifier": ModuleMap(("classifier.out_proj",) if classifying else ("classifier",)),
            "qa_head": ModuleMap(("qa_outputs",)),
        }

    def head_layout(self, head: str | None) -> dict[str, Any]:
        return {"pooler_input_dropout": head == "sequence_classification"}

    def layout_from_hf(self, raw: Mapping[str, Any], head: str | None) -> dict[str, Any]:
        pad = raw.get("pad_token_id", self.token_defaults["pad_token_id"])
        if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
            raise CheckpointError(f"roberta pad_token_id={pad!r} must be a token id: positions start after it")
        if head in MLM_HEADS and raw.get("hidden_act", "gelu") != "gelu":
            raise CheckpointError(f"roberta hidden_act={raw['hidden_act']!r} with a masked-LM head is not supported "
                                  "by tformer (supported: 'gelu', which RoBERTa's LM head always uses)")
        return {"position_offset": pad + 1, **self.head_layout(head)}

    def layout_required(self, config: ModelConfig) -> dict[str, Any]:
        pad = config.pad_token_id
        required: dict[str, Any] = self.head_layout(config.head)
        if pad is None:
            required["pad_token_id"] = "a token id (positions start after it)"
        else:
            required["position_offset"] = pad + 1
        if config.head in MLM_HEADS:
            required["activation"] = "gelu"
        return required
