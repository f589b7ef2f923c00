"""What a Hugging Face model family must say to be loaded and saved by tformer.

A family translates its ``config.json`` to a ``ModelConfig`` and back, says which tformer
configs it can represent, and maps tformer's modules onto its own tensor names
(``ModuleMap``). The translation is declared, not written: ``hf_keys`` names each translated
field's config.json key and default, ``activations`` the activation names, ``layout`` the values
the family fixes, ``requirements`` what else a config must hold to be written, ``pinned`` the
config.json variants tformer refuses; ``Family`` reads and writes them both ways, and a family
overrides ``values_from_hf`` / ``config_to_hf`` / ``requirements_of`` only for what differs.
Everything else (reading files, checking names and shapes, fusing and splitting matrices,
writing folders) is shared and lives beside this module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor

from tformer.checkpoint import CheckpointError
from tformer.config import ModelConfig, field_default, non_default_fields
from tformer.errors import warn_user
from tformer.interop.weight_map import ModuleMap
from tformer.nn.attention.registry import EXACT_ATTENTION_KERNELS
from tformer.nn.heads import HEADS

# The classic attention of GPT-2, BERT, ViT and Marian, required on save: every head with its own keys and
# values, heads spanning d_model (HF derives head_dim = d_model / heads), a bias on every projection and norm.
CLASSIC_MHA_WITH_BIASES: Mapping[str, Any] = {
    "num_kv_heads": lambda config: config.num_heads,
    "head_dim": lambda config: config.d_model // config.num_heads,
    "norm_bias": True,
    "attention_bias": True,
    "feedforward_bias": True,
}
# HF activation names (transformers' ACT2FN) of the activations tformer computes -> tformer's activation;
# the first name of each is the one written.
HF_ACTIVATIONS: Mapping[str, str] = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
TOKEN_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id")
# ModelConfig.extra's key naming the model_type a config was read from, where another family could also hold it
# (a Mistral without a window is a Llama): saving writes that family again.
ORIGIN_KEY = "hf_model_type"
# The encoder's config.json names and defaults of BertConfig, which ViTConfig repeats (their dropout
# defaults differ: each family adds its own).
BERT_ENCODER_KEYS: Mapping[str, tuple[str, Any]] = {
    "d_model": ("hidden_size", 768),
    "num_layers": ("num_hidden_layers", 12),
    "num_heads": ("num_attention_heads", 12),
    "d_ff": ("intermediate_size", 3072),
    "activation": ("hidden_act", "gelu"),
    "norm_eps": ("layer_norm_eps", 1e-12),
    "initializer_range": ("initializer_range", 0.02),
}


class Family:
    """One Hugging Face ``model_type`` as seen by tformer (subclasses fill in the class attributes)."""

    model_type: ClassVar[str]
    architecture: ClassVar[str] = "decoder"  # the tformer architecture (ModelConfig.architecture) it holds
    architecture_class: ClassVar[str]  # the HF class written to config.json's "architectures"
    base_prefix: ClassVar[str]  # prefix of the base model's tensors inside the LM class ("model.")
    modules: ClassVar[Mapping[str, ModuleMap]]  # tformer module path -> HF module(s)
    ignored_names: ClassVar[tuple[str, ...]] = ()  # regexes: buffers some files carry, not weights
    tied_output_names: ClassVar[tuple[str, ...]] = ("lm_head.weight",)  # copies of the token table when tied
    # Prefixes of the HF tensors of task heads (and poolers): a fine-tuning load may drop them, and
    # weights of a head the chosen class does not have are dropped with a warning, as HF does.
    head_prefixes: ClassVar[tuple[str, ...]] = ()
    # Families whose HF class picks the head: HF class -> tformer head (the bare model's first).
    heads: ClassVar[Mapping[str, str | None]] = {}

    @property
    def labelled_heads(self) -> tuple[str, ...]:
        """Its heads that ``num_labels`` sizes (nn/heads.py): their HF classes name the labels (id2label)."""
        return tuple(head for head in self.heads.values() if head is not None and HEADS[head].sized_by_labels)

    # ---- the config translation, declared ---------------------------------------------------
    # ModelConfig field -> (its config.json key, the HF config class's default): read with ``hf_field``,
    # written as the config holds it; "activation" through ``activations``.
    hf_keys: ClassVar[Mapping[str, tuple[str, Any]]]
    activations: ClassVar[Mapping[str, str]] = HF_ACTIVATIONS  # HF name -> tformer's; the first of each written
    layout: ClassVar[Mapping[str, Any]] = {}  # ModelConfig values the family fixes: set on read, required on save
    # What else a config must hold to be written: a value, a tuple of allowed values, or a callable of the config.
    requirements: ClassVar[Mapping[str, Any]] = {}
    # config.json keys of variants tformer does not implement, each with the one value it supports: any other
    # is refused on read; written on save.
    pinned: ClassVar[Mapping[str, Any]] = {}
    # The HF defaults of pad/bos/eos_token_id (an absent key: None); None for a family without tokens.
    token_defaults: ClassVar[Mapping[str, int | None] | None] = None
    # The ModelConfig fields a family's overrides translate beyond its tables (see ``handled_fields``).
    fields_in_overrides: ClassVar[frozenset[str]] = frozenset()
    # The attention kernels whose function the HF class computes: exact softmax attention by default (a family
    # with a sliding window adds the band, declaring its ``attention_window`` among its overrides).
    attention_kernels: ClassVar[tuple[str, ...]] = EXACT_ATTENTION_KERNELS

    @property
    def handled_fields(self) -> frozenset[str]:
        """The ModelConfig fields this family translates: those its tables and overrides name, and ``bias``
        where all three switches it defaults are among them. Any other must hold its default (fail closed),
        so a switch added to the core later is refused here until the family learns it."""
        fields = {"architecture", *self.hf_keys, *self.layout, *self.requirements, *self.fields_in_overrides}
        if self.token_defaults is not None:
            fields.update(TOKEN_ID_KEYS)
        if self.heads:
            fields.add("head")
        if self.labelled_heads:
            fields.update(("num_labels", "label_names"))
        if fields.issuperset(("norm_bias", "attention_bias", "feedforward_bias")):
            fields.add("bias")
        return frozenset(fields)

    def config_from_hf(self, raw: Mapping[str, Any]) -> ModelConfig:
        """The ModelConfig of a parsed config.json; CheckpointError for what tformer cannot run."""
        for key, supported in self.pinned.items():
            require(self.model_type, key, hf_field(raw, key, supported), supported)
        tokens = {}
        if self.token_defaults is not None:
            defaults = {"vocab_size": self.hf_keys["vocab_size"][1], **self.token_defaults}
            tokens = special_token_ids(self.model_type, raw, defaults)
        return ModelConfig(**self.values_from_hf(raw, tokens))

    def values_from_hf(self, raw: Mapping[str, Any], tokens: dict[str, Any]) -> dict[str, Any]:
        """The ModelConfig fields of a config.json: ``hf_keys`` read, the activation translated, the layout
        and the special-token ids (``tokens``); a family adds or replaces what differs."""
        values = {name: hf_field(raw, key, default) for name, (key, default) in self.hf_keys.items()}
        values["activation"] = translated(self.model_type, self.hf_keys["activation"][0], values["activation"],
                                          self.activations)
        if self.heads:
            values["head"] = self.head_from_hf(raw)
            if values["head"] in self.labelled_heads:
                values.update(labels_from_hf(self.model_type, raw))
        return {"architecture": self.architecture, **values, **self.layout, **tokens}

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]:
        """The config.json fields of this family for ``config`` (which ``mismatches`` accepted)."""
        raw = {
            "architectures": [self.class_for_head(config.head) if self.heads else self.architecture_class],
            "model_type": self.model_type,
            **{key: getattr(config, name) for name, (key, _) in self.hf_keys.items()},
            **self.pinned,
        }
        raw[self.hf_keys["activation"][0]] = next(
            name for name, activation in self.activations.items() if activation == config.activation)
        if self.token_defaults is not None:
            raw.update({key: getattr(config, key) for key in TOKEN_ID_KEYS})
        if config.head in self.labelled_heads:
            raw.update(labels_to_hf(config))
        return raw

    def requirements_of(self, config: ModelConfig) -> dict[str, Any]:
        """Field -> the value(s) ``config`` must hold to be written as this family (see ``differences``)."""
        required = {"architecture": self.architecture, **self.layout,
                    "activation": tuple(dict.fromkeys(self.activations.values())), **self.requirements}
        if self.heads:
            required["head"] = tuple(self.heads.values())
        return required

    def required_values(self, config: ModelConfig) -> list[str]:
        """The handled fields whose values this family cannot express, one short phrase each."""
        found = differences(config, self.requirements_of(config))
        if "head_dim" in self.requirements:  # head_dim fixed at d_model / heads: the heads must span d_model
            found += width_mismatch(config)
        return found

    def head_from_hf(self, raw: Mapping[str, Any]) -> str | None:
        """The tformer head of config.json's ``architectures`` (none: the bare model)."""
        classes = raw.get("architectures") or [next(iter(self.heads))]
        if not isinstance(classes, list) or len(classes) != 1:
            raise CheckpointError(f"{self.model_type} architectures={classes!r} must name one class")
        return translated(self.model_type, "architectures", classes[0], self.heads)

    def class_for_head(self, head: str | None) -> str:
        """The HF class of a model with ``head`` (``heads`` read backwards)."""
        return next(name for name, value in self.heads.items() if value == head)

    def module_map(self, config: ModelConfig) -> Mapping[str, ModuleMap]:
        """tformer module path -> HF module(s) for a model of ``config`` (families with heads vary it)."""
        return self.modules

    def head_layout(self, head: str | None) -> dict[str, Any]:
        """Config fields this family's layout fixes for ``head`` (applied when a load changes the head)."""
        return {}

    def saved_state(self, hf_state: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
        """The HF tensors as this family's class for ``config`` writes them (the inverse of
        ``normalized_state``): a bare model's class (a family with ``heads``, no head) names them without
        ``base_prefix``; otherwise as they are unless a family says otherwise."""
        if self.heads and config.head is None:
            return {name.removeprefix(self.base_prefix): tensor for name, tensor in hf_state.items()}
        return hf_state

    def mismatches(self, config: ModelConfig) -> list[str]:
        """Why ``config`` cannot be written as this family, one short phrase per reason; [] if it can:
        handled fields with values the family lacks, then any field it does not handle set at all.

        A family computes exact softmax attention unless it says otherwise (``attention_kernels``): a model on an
        exact kernel (sdpa, reference, chunked) is the same function there; Performer is not, and a sliding
        window only where the family has one (Mistral)."""
        found = self.required_values(config)
        for kernel in config.attention_kernels:  # every layer's (a window on some layers: the sliding window's)
            if kernel not in self.attention_kernels:
                allowed = " or ".join(map(repr, self.attention_kernels))
                window = " or its sliding window" if "sliding_window" in self.attention_kernels else ""
                found.append(f"attention_kernel={kernel!r} (needs {allowed}: {self.model_type} computes exact "
                             f"softmax attention{window})")
        for name in non_default_fields(config):
            if name not in self.handled_fields and name != "attention_kernel":
                default = field_default(type(config), name)
                found.append(f"{name}={getattr(config, name)!r} (needs {default!r}: not a {self.model_type} setting)")
        return found

    def normalized_state(self, hf_state: Mapping[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
        """The HF tensors named as the LM class names them, without buffers and ignored duplicates.

        Files saved from the bare base model (GPT-2 on the Hub) lack ``base_prefix``; old files
        carry attention-mask or rotary buffers; a tied checkpoint may repeat the embedding as
        ``lm_head.weight``, which Hugging Face ignores too.
        """
        state = dict(hf_state)
        if state and not any(name.startswith(self.base_prefix) for name in state):
            state = {name if name.startswith(("lm_head.", *self.head_prefixes)) else self.base_prefix + name: t
                     for name, t in state.items()}
        ignored = [re.compile(pattern) for pattern in self.ignored_names]
        state = {name: t for name, t in state.items() if not any(p.search(name) for p in ignored)}
        if config.tie_embeddings:
            for name in self.tied_output_names:
                state.pop(name, None)
        return state


def hf_field(raw: Mapping[str, Any], key: str, default: Any) -> Any:
    """``raw[key]``, or ``default`` (the HF config class's default) when absent or null."""
    value = raw.get(key)
    return default if value is None else value


def translated(model_type: str, key: str, value: Any, table: Mapping[Any, Any]) -> Any:
    """``table[value]``, or a CheckpointError naming the field, its value and the supported ones."""
    try:
        return table[value]
    except (KeyError, TypeError):
        supported = ", ".join(repr(choice) for choice in table)
        raise CheckpointError(
            f"{model_type} {key}={value!r} is not supported by tformer (supported: {supported})"
        ) from None


def require(model_type: str, key: str, value: Any, supported: Any) -> None:
    """A CheckpointError unless ``value == supported``: a feature tformer does not implement."""
    if value != supported:
        raise CheckpointError(
            f"{model_type} {key}={value!r} is not supported by tformer (supported: {supported!r})"
        )


def differences(config: ModelConfig, required: Mapping[str, Any]) -> list[str]:
    """``field=value (needs X)`` for each field of ``config`` that differs from ``required``.

    A required value may be a tuple of allowed values, or a callable of ``config`` giving the value.
    """
    found = []
    for name, needed in required.items():
        if callable(needed):
            needed = needed(config)
        value = getattr(config, name)
        allowed = needed if isinstance(needed, tuple) else (needed,)
        if value not in allowed:
            wanted = " or ".join(repr(choice) for choice in allowed)
            found.append(f"{name}={value!r} (needs {wanted})")
    return found


def width_mismatch(config: ModelConfig) -> list[str]:
    """The phrase for a config whose heads do not span d_model (HF families fix head_dim = d_model / heads)."""
    width = config.num_heads * config.head_dim
    return [] if width == config.d_model else [f"num_heads * head_dim={width} (needs d_model={config.d_model})"]


def special_token_ids(model_type: str, raw: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``pad_token_id``, ``bos_token_id`` and ``eos_token_id`` of a config.json, each ``raw[key]`` or its
    ``defaults[key]`` when absent; ids outside the vocabulary dropped (None), with one warning.

    Hugging Face loads such folders: GPT2Config's defaults (50256) sit outside every small vocabulary a
    test model is made with. ``eos_token_id`` may be a list (Llama 3): its usable ids are kept in order.
    """
    vocab_size = hf_field(raw, "vocab_size", defaults["vocab_size"])
    ids: dict[str, Any] = {}
    dropped: list[str] = []

    def usable(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab_size

    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = raw[key] if key in raw else defaults.get(key)
        if isinstance(value, list):
            kept = [item for item in value if usable(item)]
            if len(kept) < len(value):
                dropped.append(f"{key}={value!r}")
            ids[key] = kept
        elif value is None or usable(value):
            ids[key] = value
        else:
            dropped.append(f"{key}={value!r}")
            ids[key] = None
    if dropped:
        warn_user(f"{model_type} config.json: {', '.join(dropped)} are outside the vocabulary [0, {vocab_size}): "
                  "ignored (no such token)")
    return ids


def num_labels_from_hf(raw: Mapping[str, Any]) -> int:
    """The number of labels of a config.json: its ``id2label``'s, else ``num_labels`` (HF's default 2)."""
    id2label = raw.get("id2label")
    return len(id2label) if isinstance(id2label, Mapping) and id2label else hf_field(raw, "num_labels", 2)


def labels_from_hf(model_type: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """``num_labels`` and ``label_names`` of a config.json's ``id2label`` (default names ``LABEL_i``: none)."""
    id2label = raw.get("id2label")
    if not isinstance(id2label, Mapping) or not id2label:
        return {"num_labels": num_labels_from_hf(raw)}
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
