"""ModelConfig: one frozen dataclass that describes every architecture, plus named presets."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tformer.data.log_mel import NORMALIZATIONS
from tformer.errors import TformerError
from tformer.families import FAMILIES, declared_fields, families_reading
from tformer.nn.attention.registry import KERNELS
from tformer.nn.feedforward import ACTIVATION_FUNCTIONS, GATED_ACTIVATIONS
from tformer.nn.heads import HEADS, POOLINGS
from tformer.nn.positions.registry import POSITIONAL_SCHEMES
from tformer.nn.positions.rope_scaling import normalized_rope_scaling

ACTIVATIONS = tuple(ACTIVATION_FUNCTIONS)  # GATED_ACTIVATIONS: a gate and an up projection (geglu_tanh: T5 v1.1's)
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
POSITIONALS = tuple(POSITIONAL_SCHEMES)  # the schemes of nn/positions/registry.py
SINUSOIDAL_LAYOUTS = ("interleaved", "split")  # sine and cosine alternating (the paper), or every sine first
# How attention is computed (``attention_kernel``): the kernels of nn/attention/registry.py. The exact ones
# compute softmax attention itself (the same function); the others another (a random-feature estimate, a band).
ATTENTION_KERNELS = tuple(KERNELS)
EXACT_ATTENTION_KERNELS = tuple(name for name, kernel in KERNELS.items() if kernel.exact)
POSITION_BIASES = tuple(name for name, scheme in POSITIONAL_SCHEMES.items() if scheme.adds_bias)
POOLED_HEADS = (None, *(name for name, head in HEADS.items() if head.reads == "pooler"))  # they read the pooler
# Fields a fine-tuning load may change in a pretrained model's config: they shape no weight (dropout off
# for a short pretraining, BERT's 0.1 for fine-tuning).
REGULARISATION_FIELDS = ("dropout", "attention_dropout")
# Groups of the fields only some families read, which a family names in its declaration (families.py):
# tokens and their special ids; the transformer's token positions and scaling; generation's defaults
# (tokens never chosen, and tokens not chosen first: Whisper's generation config).
TOKEN_FIELDS = ("vocab_size", "max_seq_len", "tie_embeddings", "pad_token_id", "bos_token_id", "eos_token_id",
                "forced_eos_token_id")
TOKEN_POSITION_FIELDS = ("scale_embeddings", "rope_theta", "rope_scaling", "partial_rotary_factor",
                         "relative_num_buckets", "relative_max_distance", "sinusoidal_layout")
GENERATION_FIELDS = ("suppress_tokens", "begin_suppress_tokens")


class ConfigError(TformerError):
    """A configuration value is invalid; the message names the field and what is allowed."""


@dataclass(frozen=True)
class ModelConfig:
    """Every switch of the shared transformer core and the sizes of one model.

    Fields left as ``None`` are derived at construction: ``num_kv_heads`` defaults to
    ``num_heads`` (plain multi-head attention), ``d_ff`` to ``4 * d_model`` (or the
    Llama-style ``8/3 * d_model`` rounded up to a multiple of 64 for gated activations),
    ``head_dim`` to ``d_model // num_heads``, and ``norm_bias``, ``attention_bias`` and
    ``feedforward_bias`` (the biases of the norms, of the attention projections and of the
    feed-forward projections) to ``bias``.

    ``architecture`` names the family. ``embedding_norm`` puts a norm after the embeddings and
    positions (BERT); ``type_vocab_size`` > 0 adds segment embeddings (encoders only: each family
    declares the fields it reads beside its class, tformer/families.py); ``scale_embeddings``
    multiplies token embeddings by sqrt(d_model).

    Encoder fields: ``head`` (an encoder head of ``nn.heads.HEADS``, None for the bare encoder); ``num_labels``
    and ``label_names`` (names by label id; empty: ``LABEL_0``, ...) for the classification heads;
    ``problem_type`` the loss of sequence classification (``models.encoder.PROBLEM_TYPES``; None: regression for
    one label, cross-entropy for integer labels, binary cross-entropy per label for float labels);
    ``position_offset`` > 0 numbers positions as RoBERTa: tokens other than ``pad_token_id`` from
    ``position_offset`` on, padding tokens at ``position_offset - 1``; ``pooler_input_dropout``
    applies dropout to the first token's vector before the pooler (RoBERTa's classification head);
    ``pooling`` the vector the pooler reads (``POOLINGS``: the first token's, BERT's, or the mean of
    the tokens that are not padding; Hugging Face's classes have the first only).

    Vision fields (``architecture="vision"``, a Vision Transformer): square images of ``image_size``
    pixels with ``num_channels`` channels, cut into ``patch_size`` x ``patch_size`` patches (the size
    must be a multiple of it); ``pooling`` the vector the head reads (``POOLINGS``: the class token's,
    or the mean of the patch tokens'); ``head`` None (the bare model, with its tanh pooler) or
    ``image_classification`` with ``num_labels`` and ``label_names`` as an encoder's; ``positional``
    ``learned`` (a table of 1 + patch-count rows) or ``sinusoidal`` (fixed 2D sine-cosine over the
    patch grid: half the width encodes the row, half the column; the class token's row is zero). A
    vision model has no tokens: the token fields (``vocab_size``, ``max_seq_len``, the special token
    ids, ``tie_embeddings``, ``scale_embeddings``, ``type_vocab_size``) and those of rotary and
    relative positions stay at their defaults, unread; any other value is refused (families.py).

    Encoder-decoder fields (``architecture="encoder_decoder"``, the 2017 translation model): a
    bidirectional encoder of ``num_encoder_layers`` blocks (default: ``num_layers``) and a causal decoder
    of ``num_layers`` blocks that cross-attend to its output; one token table for source, target and
    (``tie_embeddings``) output, a joint vocabulary; generation starts the decoder at
    ``decoder_start_token_id`` (default: ``bos_token_id``, else ``pad_token_id`` as Marian);
    ``forced_eos_token_id`` (any text family; Marian's, BART's) makes generation end a sequence that reaches
    its length limit with this token, as Hugging Face's ``ForcedEOSTokenLogitsProcessor`` does;
    ``lm_head_bias`` adds a learned per-token bias to the logits (Marian's ``final_logits_bias``);
    ``scale_decoder_output`` multiplies the decoder's last hidden states by d_model^-0.5 before the
    output layer (T5 with a tied output).
    ``sinusoidal_layout`` (text families, sinusoidal positions): ``interleaved`` alternates sine and
    cosine channels as the paper writes it; ``split`` puts every sine first (Marian, fairseq).

    Speech fields (``architecture="speech"``, Whisper's shape): log-mel features of ``num_mel_bins`` channels
    pass a two-convolution stem (the second of stride 2) and fixed sinusoids over ``max_source_positions``
    positions into an encoder of ``num_encoder_layers`` blocks; so the model reads at most ``input_frames`` =
    2 x ``max_source_positions`` frames at once (Whisper's 30 s window: 1500 positions, 3000 frames of 10 ms; a
    model for short utterances sets a shorter window). ``feature_normalization="utterance"`` normalises each
    window of a recording (``tformer.data.log_mel.normalize_windows``) for a model trained that way from scratch;
    Whisper's checkpoints read the features as they are (``"none"``). ``ctc_weight`` in (0, 1) gives the encoder
    a CTC head trained beside the decoder (loss: ``(1 - ctc_weight)`` x the decoder's + ``ctc_weight`` x CTC's),
    which makes a model trained from scratch align its audio sooner; decoding never reads it. Its decoder is an
    encoder-decoder's (``num_layers`` blocks, ``max_seq_len`` positions, ``decoder_start_token_id``), with the
    output tied to its token table.

    ``key_bias=False`` (any family, with ``attention_bias``) leaves the key projections without a bias while
    queries, values and outputs keep theirs (Whisper's attention). ``suppress_tokens`` and
    ``begin_suppress_tokens`` (the generating families) are generation's defaults, as ``forced_eos_token_id``:
    tokens never chosen, and tokens not chosen as the first new token (Whisper's generation config).

    Attention kernels (every family; ``ATTENTION_KERNELS``): ``attention_kernel`` picks how attention is
    computed. ``sdpa`` (PyTorch's fused kernel), ``reference`` (matmul, mask, softmax, matmul) and
    ``chunked`` (query and key blocks with an online softmax: memory linear in length) compute the same
    exact softmax attention. ``performer`` estimates it with ``performer_features`` positive random
    features per head (FAVOR+), redrawn every ``performer_redraw_interval`` training steps (0: drawn
    once); it has no score matrix, so it refuses the additive position biases (``positional`` alibi,
    relative). ``sliding_window`` is exact attention restricted to a band of ``attention_window`` keys:
    causal, query i sees keys i - W .. i (itself and the W previous tokens); bidirectional, keys with
    |i - j| <= W (W on each side), counted in sequence order (a vision model's: the class token, then
    the patches row by row); a decoder's cache then keeps only the last W positions. The window must be
    at most the sequence length (``max_seq_len``; a vision model's: patches + 1). ``chunked``,
    ``sliding_window`` and ``performer`` have no attention dropout (``attention_dropout`` must be 0);
    the performer and window fields are refused away from their defaults with any other kernel.
    """

    architecture: str = "decoder"
    vocab_size: int = 50257
    max_seq_len: int = 1024
    d_model: int = 768
    num_layers: int = 12
    num_heads: int = 12
    num_kv_heads: int | None = None
    head_dim: int | None = None
    d_ff: int | None = None
    activation: str = "gelu_tanh"
    norm: str = "layernorm"
    norm_position: str = "pre"
    norm_eps: float = 1e-5
    norm_bias: bool | None = None
    positional: str = "learned"
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # rope: a scaling type and its keys (nn/positions/rope_scaling.py)
    partial_rotary_factor: float = 1.0  # rope: the leading share of each head's dimensions that rotates
    sinusoidal_layout: str = "interleaved"
    relative_num_buckets: int = 32
    relative_max_distance: int = 128
    dropout: float = 0.0
    attention_dropout: float = 0.0
    attention_kernel: str = "sdpa"
    performer_features: int = 256
    performer_redraw_interval: int = 0
    attention_window: int = 0
    bias: bool = True
    attention_bias: bool | None = None
    feedforward_bias: bool | None = None
    tie_embeddings: bool = True
    scale_embeddings: bool = False
    embedding_norm: bool = False
    type_vocab_size: int = 0
    head: str | None = None
    num_labels: int = 2
    problem_type: str | None = None
    label_names: tuple[str, ...] = ()
    position_offset: int = 0
    pooler_input_dropout: bool = False
    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    pooling: str = "cls"
    num_mel_bins: int = 80
    max_source_positions: int = 1500
    feature_normalization: str = "none"  # speech: "utterance" normalises each recording's log-mel
    ctc_weight: float = 0.0  # speech: > 0 adds a CTC head on the encoder, weighted so in the training loss
    key_bias: bool = True  # with attention_bias: False leaves the key projections alone without one (Whisper)
    suppress_tokens: tuple[int, ...] = ()  # generation's default: never chosen
    begin_suppress_tokens: tuple[int, ...] = ()  # generation's default: not chosen as the first new token
    initializer_range: float = 0.02
    num_encoder_layers: int | None = None
    decoder_start_token_id: int | None = None
    forced_eos_token_id: int | None = None  # generation's default: the last token a length limit allows is this
    lm_head_bias: bool = False
    scale_decoder_output: bool = False
    rnn_cell: str = "gru"
    rnn_attention: str = "bahdanau"
    rnn_hidden_size: int | None = None
    input_feeding: bool = False
    teacher_forcing_ratio: float = 1.0
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=True)

    def __post_init__(self) -> None:
        for name in ("label_names", "suppress_tokens", "begin_suppress_tokens"):
            if isinstance(getattr(self, name), list):  # from JSON
                object.__setattr__(self, name, tuple(getattr(self, name)))
        try:
            object.__setattr__(self, "rope_scaling", normalized_rope_scaling(self.rope_scaling))
        except ValueError as error:
            raise ConfigError(str(error)) from None
        self._check_choices()
        family = FAMILIES[self.architecture]
        self._check_family_fields()
        if not family.transformer:  # its own layers: the core's checks do not apply
            if family.check is not None:
                family.check(self)
            return
        self._check_sizes()
        derived = {
            "num_kv_heads": self.num_heads if self.num_kv_heads is None else self.num_kv_heads,
            "head_dim": self.d_model // self.num_heads if self.head_dim is None else self.head_dim,
            "d_ff": self._default_d_ff() if self.d_ff is None else self.d_ff,
            "norm_bias": self.bias if self.norm_bias is None else self.norm_bias,
            "attention_bias": self.bias if self.attention_bias is None else self.attention_bias,
            "feedforward_bias": self.bias if self.feedforward_bias is None else self.feedforward_bias,
        }
        if "num_encoder_layers" in family.fields and self.num_encoder_layers is None:
            derived["num_encoder_layers"] = self.num_layers  # as deep as the decoder
        for name, value in derived.items():
            object.__setattr__(self, name, value)
        self._check_heads()
        self._check_chosen("positional", POSITIONAL_SCHEMES)
        if family.check is not None:
            family.check(self)
        self._check_token_lists()
        if not self.key_bias and not self.attention_bias:
            raise ConfigError("key_bias=False takes the key projections' bias away from attention_bias=True; "
                              "with attention_bias=False no projection has one (leave key_bias=True)")
        self._check_attention_kernel()

    @property
    def label_names_or_ids(self) -> tuple[str, ...]:
        """The label names, or Hugging Face's ``LABEL_0`` .. ``LABEL_{n-1}`` when the config names none."""
        return self.label_names or tuple(f"LABEL_{index}" for index in range(self.num_labels))

    # ---- validation -------------------------------------------------------------------------

    def _check_choices(self) -> None:
        for name, allowed in (
            ("architecture", tuple(FAMILIES)),
            ("activation", ACTIVATIONS),
            ("norm", NORMS),
            ("norm_position", NORM_POSITIONS),
            ("positional", POSITIONALS),
            ("sinusoidal_layout", SINUSOIDAL_LAYOUTS),
            ("attention_kernel", ATTENTION_KERNELS),
            ("pooling", POOLINGS),
            ("feature_normalization", NORMALIZATIONS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}")

    def _check_family_fields(self) -> None:
        """A field that belongs to families (families.py) holds its default unless this config's family reads it."""
        own = FAMILIES[self.architecture].fields
        for name in sorted(declared_fields() - own):
            value = getattr(self, name)
            if value != field_default(type(self), name):
                families = families_reading(name)
                kind = "family" if len(families) == 1 else "families"
                raise ConfigError(
                    f"{name}={value!r} is a field of the {', '.join(families)} {kind}; "
                    f"architecture={self.architecture!r} does not use it"
                )

    def _check_sizes(self) -> None:
        for name in ("vocab_size", "max_seq_len", "d_model", "num_layers", "num_heads"):
            require_positive_int(name, getattr(self, name))
        for name in ("num_kv_heads", "head_dim", "d_ff"):
            value = getattr(self, name)
            if value is not None:
                require_positive_int(name, value)
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ConfigError(f"{name}={value!r} must be a number in [0, 1)")
        if self.type_vocab_size != 0:
            require_positive_int("type_vocab_size", self.type_vocab_size, "0 (no segment embeddings) or ")
        if not self.norm_eps > 0:
            raise ConfigError(f"norm_eps={self.norm_eps!r} must be > 0")
        if not (isinstance(self.rope_theta, (int, float)) and math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ConfigError(f"rope_theta={self.rope_theta!r} must be a finite number > 0 (the base of the rotary "
                              "frequencies; 10000 in most models)")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}"
            )
        require_token_ids(self, ("pad_token_id", "bos_token_id", "eos_token_id"))

    def _check_heads(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads} "
                "(equal: multi-head, a divisor: grouped-query, 1: multi-query)"
            )

    def _check_chosen(self, switch: str, choices: Mapping[str, Any]) -> Any:
        """The entry of ``choices`` (a registry of kernels or positional schemes) that field ``switch`` names: no
        other entry's fields away from their defaults, and its own checked by its ``config_problem``."""
        chosen = choices[getattr(self, switch)]
        for other in choices.values():
            for name in other.fields:
                value = getattr(self, name)
                if name not in chosen.fields and value != field_default(type(self), name):
                    raise ConfigError(f"{name}={value!r} is read only by {switch}={other.name!r}, "
                                      f"not {switch}={chosen.name!r}")
        problem = chosen.config_problem(self)
        if problem is not None:
            raise ConfigError(problem)
        return chosen

    def _check_attention_kernel(self) -> None:
        """The kernel's own fields, no other kernel's, and only what it honours."""
        kernel = self._check_chosen("attention_kernel", KERNELS)
        if self.positional in POSITION_BIASES and not kernel.position_bias:
            allowed = ", ".join(p for p in POSITIONALS if p not in POSITION_BIASES)
            raise ConfigError(f"attention_kernel={kernel.name!r} cannot express positional={self.positional!r} (an "
                              f"additive bias on scores it never forms); allowed positional: {allowed}")
        if self.attention_dropout and not kernel.dropout:
            with_dropout = " and ".join(repr(name) for name, other in KERNELS.items() if other.dropout)
            raise ConfigError(f"attention_dropout={self.attention_dropout!r} is not supported by "
                              f"attention_kernel={kernel.name!r} (needs 0.0; {with_dropout} have it)")

    def _check_token_lists(self) -> None:
        """``suppress_tokens`` and ``begin_suppress_tokens``: token ids of the vocabulary."""
        for name in ("suppress_tokens", "begin_suppress_tokens"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(
                    isinstance(token, int) and not isinstance(token, bool) and 0 <= token < self.vocab_size
                    for token in value):
                raise ConfigError(f"{name}={value!r} must be a list of token ids in [0, {self.vocab_size})")

    @property
    def input_frames(self) -> int:
        """The most log-mel frames a speech model reads at once (its window): 2 x ``max_source_positions``."""
        return 2 * self.max_source_positions

    @property
    def has_pooler(self) -> bool:
        """Whether a model with this config has the tanh pooler: a headed family's bare model, or one whose
        head reads the pooler (BERT's classification and next-sentence heads)."""
        if "head" not in FAMILIES[self.architecture].fields:
            return False
        return self.head is None or HEADS[self.head].reads == "pooler"

    @property
    def patch_grid(self) -> int:
        """Patches per side of a vision model's image."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        """Patches per image of a vision model (its sequence is the class token and these)."""
        return self.patch_grid ** 2

    def _default_d_ff(self) -> int:
        if self.activation in GATED_ACTIVATIONS:
            return 64 * -(-(8 * self.d_model // 3) // 64)
        return 4 * self.d_model

    # ---- derived facts ----------------------------------------------------------------------

    @property
    def gated(self) -> bool:
        """Whether the feed-forward is a gated linear unit (two input projections)."""
        return self.activation in GATED_ACTIVATIONS

    # ---- (de)serialisation ------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON holds them (``label_names`` a list), so a dict read back compares equal."""
        data = dataclasses.asdict(self)
        for name in ("label_names", "suppress_tokens", "begin_suppress_tokens"):
            data[name] = list(getattr(self, name))
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown ModelConfig field(s): {', '.join(unknown)}; "
                f"known fields: {', '.join(sorted(known))}"
            )
        return cls(**data)

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> ModelConfig:
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            text = Path(text_or_path).read_text()
        return cls.from_dict(json.loads(text))

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed; derived fields are re-derived unless given."""
        base = {f.name: getattr(self, f.name) for f in fields(self)}
        base.update(_underived(self))
        base.update(changes)
        return type(self)(**base)


def _underived(config: ModelConfig) -> dict[str, Any]:
    """The derived fields reset to None where they still hold their derived default."""
    reset: dict[str, Any] = {}
    if config.num_kv_heads == config.num_heads:
        reset["num_kv_heads"] = None
    if config.head_dim == config.d_model // config.num_heads:
        reset["head_dim"] = None
    if config.d_ff == config._default_d_ff():
        reset["d_ff"] = None
    for name in ("norm_bias", "attention_bias", "feedforward_bias"):
        if getattr(config, name) == config.bias:
            reset[name] = None
    if "num_encoder_layers" in FAMILIES[config.architecture].fields and config.num_encoder_layers == config.num_layers:
        reset["num_encoder_layers"] = None
    return reset


def field_default(config_type: type[ModelConfig], name: str) -> Any:
    """The declared default of field ``name`` (None for the derived fields)."""
    spec = {f.name: f for f in fields(config_type)}[name]
    return spec.default_factory() if spec.default is dataclasses.MISSING else spec.default


def non_default_fields(config: ModelConfig) -> list[str]:
    """The fields of ``config`` that differ from their defaults; a derived field counts as default
    while it holds the value derived from the others. Places that honour only some switches (the
    fast decoder, a Hugging Face family) refuse any of these they do not handle."""
    underived = _underived(config)
    return [f.name for f in fields(config)
            if underived.get(f.name, getattr(config, f.name)) != field_default(type(config), f.name)]


def require_positive_int(name: str, value: Any, alternative: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name}={value!r} must be {alternative}a positive integer")


# ---- presets -------------------------------------------------------------------------------


def require_token_ids(config: ModelConfig, names: tuple[str, ...]) -> None:
    """Each of ``names`` is None or a token id of the config's vocabulary."""
    for name in names:
        value = getattr(config, name)
        if value is not None and not (isinstance(value, int) and 0 <= value < config.vocab_size):
            raise ConfigError(f"{name}={value!r} must be a token id in [0, {config.vocab_size})")


def check_label_fields(config: ModelConfig, classification_heads: tuple[str, ...]) -> None:
    """``num_labels`` and ``label_names``: read only by the family's ``classification_heads``."""
    head = config.head
    require_positive_int("num_labels", config.num_labels)
    classifying = head in classification_heads
    if config.num_labels != 2 and not classifying:
        raise ConfigError(f"num_labels={config.num_labels} is read only by the classification heads "
                          f"({', '.join(classification_heads)}); head={head!r} has a fixed size")
    if config.label_names:
        if not classifying:
            raise ConfigError(f"label_names are read only by the classification heads, not head={head!r}")
        if not all(isinstance(name, str) and name for name in config.label_names):
            raise ConfigError(f"label_names={list(config.label_names)!r} must be non-empty strings")
        if len(config.label_names) != config.num_labels or len(set(config.label_names)) != config.num_labels:
            raise ConfigError(f"label_names={list(config.label_names)!r} must be {config.num_labels} distinct "
                              f"names (num_labels={config.num_labels})")


def family_heads(family: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The heads of nn/heads.py a family may carry, and those of them that ``num_labels`` sizes."""
    heads = tuple(name for name, head in HEADS.items() if family in head.families)
    return heads, tuple(name for name in heads if HEADS[name].sized_by_labels)

def _bert(d_model: int, num_layers: int, num_heads: int) -> dict[str, Any]:
    """A BERT-shaped encoder (the uncased English WordPiece vocabulary's size, [PAD] = 0)."""
    return dict(
        architecture="encoder", vocab_size=30522, max_seq_len=512, d_model=d_model, num_layers=num_layers,
        num_heads=num_heads, activation="gelu", norm="layernorm", norm_position="post", norm_eps=1e-12,
        positional="learned", embedding_norm=True, type_vocab_size=2, dropout=0.1, attention_dropout=0.1,
        pad_token_id=0,
    )


def _vit(d_model: int, num_layers: int, num_heads: int, **fields: Any) -> dict[str, Any]:
    """A ViT-shaped image classifier (Hugging Face ViTForImageClassification's defaults: LayerNorm eps 1e-12)."""
    return {
        "architecture": "vision", "d_model": d_model, "num_layers": num_layers, "num_heads": num_heads,
        "activation": "gelu", "norm": "layernorm", "norm_position": "pre", "norm_eps": 1e-12,
        "positional": "learned", "head": "image_classification", **fields,
    }


def _whisper(d_model: int, num_layers: int, num_heads: int, **fields: Any) -> dict[str, Any]:
    """A Whisper-shaped speech model with ``num_layers`` blocks on each side (Hugging Face's WhisperConfig)."""
    return {
        "architecture": "speech", "vocab_size": 51865, "max_seq_len": 448, "d_model": d_model,
        "num_layers": num_layers, "num_encoder_layers": num_layers, "num_heads": num_heads, "activation": "gelu",
        "norm": "layernorm", "norm_position": "pre", "positional": "learned", "key_bias": False,
        "num_mel_bins": 80, "max_source_positions": 1500, "pad_token_id": 50257, "bos_token_id": 50257,
        "eos_token_id": 50257, "decoder_start_token_id": 50258, "begin_suppress_tokens": (220, 50257), **fields,
    }


PRESET_FIELDS: dict[str, dict[str, Any]] = {
    # GPT-2 small: 124,439,808 parameters with the tied LM head.
    "gpt2": dict(
        vocab_size=50257, max_seq_len=1024, d_model=768, num_layers=12, num_heads=12,
        activation="gelu_tanh", norm="layernorm", positional="learned", bias=True,
        tie_embeddings=True, bos_token_id=50256, eos_token_id=50256,
    ),
    # A Llama-shaped small decoder: RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases.
    "llama-small": dict(
        vocab_size=32000, max_seq_len=2048, d_model=512, num_layers=8, num_heads=8,
        num_kv_heads=2, activation="swiglu", norm="rmsnorm", norm_eps=1e-6, positional="rope",
        bias=False, tie_embeddings=False,
    ),
    # A few million parameters: trains on a laptop CPU in minutes (the demo's model).
    "gpt-mini": dict(
        vocab_size=256, max_seq_len=256, d_model=192, num_layers=6, num_heads=6,
        activation="gelu_tanh", positional="learned", dropout=0.0,
    ),
    # BERT (Devlin et al. 2019): post-norm, exact GELU, segment embeddings, embedding LayerNorm.
    # bert-base is Hugging Face's BertModel bert-base-uncased: 109,482,240 parameters with the pooler.
    "bert-base": _bert(768, 12, 12),
    "bert-small": _bert(512, 4, 8),
    "bert-mini": _bert(256, 4, 4),
    "bert-tiny": _bert(128, 2, 2),
    # Vision Transformers (Dosovitskiy et al. 2021): pre-norm, exact GELU, class token, learned positions.
    # vit-base-patch16-224 is Hugging Face's ViTForImageClassification google/vit-base-patch16-224 (1,000
    # ImageNet classes): 86,567,656 parameters; vit-tiny-patch16-224 the DeiT-tiny shape with the same head.
    "vit-base-patch16-224": _vit(768, 12, 12, num_labels=1000),
    "vit-tiny-patch16-224": _vit(192, 12, 3, num_labels=1000),
    # MNIST-sized (28 x 28 grey, 10 classes): 4 x 4 patches, a 7 x 7 grid; trains on a CPU in minutes.
    "vit-mnist": _vit(128, 6, 4, num_labels=10, image_size=28, patch_size=4, num_channels=1, norm_eps=1e-6),
    # The 2017 paper's base translation model: 6 + 6 post-norm layers, 512 wide, 2,048 feed-forward, 8 heads,
    # ReLU, sinusoidal positions, embeddings scaled by sqrt(512) and shared by source, target and output
    # (a joint 37,000-token BPE vocabulary), dropout 0.1.
    "transformer-base": dict(
        architecture="encoder_decoder", vocab_size=37000, max_seq_len=512, d_model=512, num_layers=6, num_heads=8,
        d_ff=2048, activation="relu", norm_position="post", positional="sinusoidal", scale_embeddings=True,
        dropout=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    ),
    # Multi30k-sized (29,000 training pairs): 3 + 3 layers, 256 wide, 512 feed-forward, 8 heads.
    "transformer-multi30k": dict(
        architecture="encoder_decoder", vocab_size=8000, max_seq_len=256, d_model=256, num_layers=3, num_heads=8,
        d_ff=512, activation="relu", norm_position="post", positional="sinusoidal", scale_embeddings=True,
        dropout=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    ),
    # The attention-RNN baseline of the Multi30k recipe: about the transformer-multi30k's size (one joint
    # vocabulary, 6.0M parameters at 8,000 tokens), a bidirectional GRU encoder and Bahdanau's attention.
    "rnn-multi30k": dict(
        architecture="rnn_seq2seq", vocab_size=8000, max_seq_len=256, d_model=256, rnn_hidden_size=512, num_layers=1,
        rnn_cell="gru", rnn_attention="bahdanau", dropout=0.3, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1,
    ),
    # Whisper (Radford et al. 2022) as Hugging Face's WhisperForConditionalGeneration holds it: pre-norm, exact
    # GELU, no key bias, the multilingual vocabulary (<|endoftext|> 50257, <|startoftranscript|> 50258), 80 mels,
    # a 30 s window (1500 positions), 448 decoder positions. whisper-tiny has 37,760,640 parameters as Hugging
    # Face counts them (the encoder's fixed sinusoids included). The Hub folders also carry the suppress_tokens
    # lists, read on load; these shapes carry only begin_suppress_tokens (" " and <|endoftext|>).
    "whisper-tiny": _whisper(384, 4, 6),
    "whisper-base": _whisper(512, 6, 8),
    # A from-scratch recipe on spoken digits (FSDD: single words, under 2 s): Whisper's layout at 3.3M
    # parameters, a 3 s window (150 positions, 300 frames) instead of 30 s, so a batch of short utterances
    # costs a tenth of the attention, and a character vocabulary of 32 (0 pad, 1 start, 2 end, then characters)
    # with 32 decoder positions (a prompt and a spoken number's letters).
    "whisper-digits": _whisper(192, 3, 4, vocab_size=32, max_seq_len=32, max_source_positions=150, pad_token_id=0,
                               bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, begin_suppress_tokens=()),
    # For tests: tiny and fast.
    "gpt-nano": dict(
        vocab_size=64, max_seq_len=64, d_model=32, num_layers=2, num_heads=4,
        activation="gelu_tanh", positional="learned",
    ),
}




class Presets(Mapping[str, ModelConfig]):
    """The named configs: kept as their fields (data) and made into a ModelConfig when first read, once
    the families they name have declared themselves (tformer.models)."""

    def __init__(self, fields: Mapping[str, Mapping[str, Any]]) -> None:
        self._fields = fields
        self._made: dict[str, ModelConfig] = {}

    def __getitem__(self, name: str) -> ModelConfig:
        if name not in self._made:
            self._made[name] = ModelConfig(**self._fields[name])
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


PRESETS = Presets(PRESET_FIELDS)


def replace_head(
    config: ModelConfig, head: str | None, num_labels: int | None = None, label_names: tuple[str, ...] | None = None,
    problem_type: str | None = None, pooling: str | None = None, **layout: Any,
) -> ModelConfig:
    """``config`` with a new head (an encoder's or a vision model's), for fine-tuning: what the old
    head's fields said is kept only where it still applies (the same head and number of labels);
    ``num_labels`` defaults to the number of ``label_names``, else 2; ``pooling`` to the config's where
    the new head reads a pooled vector, else ``"cls"``. ``layout``: fields a family fixes for the head."""
    if label_names is not None:
        label_names = tuple(label_names)
        num_labels = len(label_names) if num_labels is None else num_labels
    same_head = head == config.head
    if num_labels is None:
        num_labels = config.num_labels if same_head else 2
    if label_names is None:
        label_names = config.label_names if same_head and num_labels == config.num_labels else ()
    if problem_type is None and same_head:
        problem_type = config.problem_type
    pooler_input_dropout = config.pooler_input_dropout and head in POOLED_HEADS
    if pooling is None:
        pooling = config.pooling if head is None or HEADS[head].reads != "tokens" else "cls"
    return config.replace(**{
        "head": head, "num_labels": num_labels, "label_names": label_names, "problem_type": problem_type,
        "pooler_input_dropout": pooler_input_dropout, "pooling": pooling, **layout,
    })


def get_preset(name: str) -> ModelConfig:
    """The preset called ``name``; an unknown name lists the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown preset {name!r}; presets: {', '.join(sorted(PRESETS))}"
        ) from None


def resolve_config(config_or_preset: ModelConfig | str, **overrides: Any) -> ModelConfig:
    """A ModelConfig from a config or a preset name, with field overrides applied."""
    if isinstance(config_or_preset, str):
        config = get_preset(config_or_preset)
    elif isinstance(config_or_preset, ModelConfig):
        config = config_or_preset
    else:
        raise ConfigError(
            f"expected a ModelConfig or a preset name, got {type(config_or_preset).__name__}"
        )
    if not overrides:
        return config
    known = {f.name for f in fields(ModelConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"unknown ModelConfig field(s): {', '.join(unknown)}")
    if "vocab_size" in overrides:
        # The preset's special-token ids belong to its own vocabulary; drop those the new one cannot hold.
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(config, name)
            if name not in overrides and value is not None and value >= overrides["vocab_size"]:
                overrides[name] = None
    return config.replace(**overrides)
