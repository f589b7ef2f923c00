"""ModelConfig: one frozen dataclass that describes every architecture, plus named presets."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tformer.choices import ACTIVATIONS, ATTENTION_KERNELS, HEADS, POSITIONAL_SCHEMES
from tformer.errors import TformerError
from tformer.families import FAMILIES, declared_fields, ensure_declared, families_reading, preset_fields

NORMS = ("layernorm", "rmsnorm", "rmsnorm_plus_one")  # rmsnorm_plus_one: scaled by 1 + weight (Gemma)
# How a new model's weights are drawn: "normal" (GPT-2's: normal(0, initializer_range), the projections into
# the residual stream scaled down with depth), "t5" (T5's: fan-in scaled, unit-variance token table; encoder-decoders)
INITIALIZERS = ("normal", "t5")
# pre: x + f(norm(x)); post: norm(x + f(x)); sandwich: x + norm'(f(norm(x))), a norm on each side of every
# sublayer (Gemma 2's input/post-attention and pre/post-feed-forward norms)
NORM_POSITIONS = ("pre", "post", "sandwich")
# The kernel of a layer that ``layer_attention_windows`` gives a window (the other layers run ``attention_kernel``)
WINDOW_KERNEL = "sliding_window"
SINUSOIDAL_LAYOUTS = ("interleaved", "split")  # sine and cosine alternating (the paper), or every sine first
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
GENERATION_DEFAULT_FIELDS = ("suppress_tokens", "begin_suppress_tokens")
# The fields of a mixture-of-experts feed-forward besides num_experts: read only when num_experts > 0.
EXPERT_FIELDS = ("num_experts_per_token", "moe_d_ff", "norm_topk_prob", "shared_expert_d_ff", "shared_expert_gate",
                 "router_aux_loss_coef")


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

    Each family documents the fields it reads beside its class (``models/<family>.py``: the encoder's heads,
    labels and pooling; the vision family's image and patch sizes; the encoder-decoder's layers, start token
    and output; the speech family's audio window, feature normalisation and CTC head), and declares them in
    its register line with its checks and presets (tformer/families.py). Positional schemes document theirs
    in ``nn/positions/`` (``rope_theta``, ``rope_scaling``, ``partial_rotary_factor``, ``sinusoidal_layout``, the
    relative buckets), attention kernels theirs in ``nn/attention/`` (``performer_features``,
    ``performer_redraw_interval``, ``attention_window``). The registries they fill (tformer/choices.py) are
    what this class validates against; it imports none of the layers that fill them.

    ``key_bias=False`` (any family, with ``attention_bias``) leaves the key projections without a bias while
    queries, values and outputs keep theirs (Whisper's attention); ``output_bias=False`` leaves the attention's
    output projection without one while queries, keys and values keep theirs (Qwen2's). ``suppress_tokens`` and
    ``begin_suppress_tokens`` (the generating families) are generation's defaults, as ``forced_eos_token_id``:
    tokens never chosen, and tokens not chosen as the first new token (Whisper's generation config).
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
    # Per layer (decoders): the sliding window of keys before each query that layer sees (attention_window's
    # meaning) on the sliding_window kernel, 0 for none (attention_kernel); (): every layer as attention_kernel
    layer_attention_windows: tuple[int, ...] = ()
    attention_softcap: float | None = None  # scores capped to cap * tanh(scores / cap) before mask and softmax
    query_pre_attn_scalar: float | None = None  # scores scaled by its -0.5 power, not head_dim's (Gemma 2)
    final_logit_softcap: float | None = None  # decoders: logits capped to cap * tanh(logits / cap)
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
    # A sparse mixture of experts as the feed-forward (nn/experts.py): num_experts > 0 experts, each token routed to
    # num_experts_per_token of them; the rest are read only then (EXPERT_FIELDS)
    num_experts: int = 0
    num_experts_per_token: int = 2
    moe_d_ff: int | None = None  # each expert's hidden size; None: d_ff
    norm_topk_prob: bool = True  # the chosen experts' weights renormalised to sum to 1 (Mixtral; Qwen2-MoE: False)
    shared_expert_d_ff: int = 0  # > 0: a shared expert every token goes through, of this hidden size (Qwen2-MoE)
    shared_expert_gate: bool = False  # the shared expert's output scaled by sigmoid(Linear(d_model, 1)) (Qwen2-MoE)
    router_aux_loss_coef: float = 0.01  # training adds this times the load-balancing loss (Switch Transformer)
    key_bias: bool = True  # with attention_bias: False leaves the key projections alone without one (Whisper)
    output_bias: bool = True  # with attention_bias: False leaves the output projection without one (Qwen2)
    suppress_tokens: tuple[int, ...] = ()  # generation's default: never chosen
    begin_suppress_tokens: tuple[int, ...] = ()  # generation's default: not chosen as the first new token
    initializer_range: float = 0.02
    initializer: str = "normal"  # INITIALIZERS; "t5" scales T5's standard deviations by initializer_range / 0.02
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
        ensure_declared()
        for name in ("label_names", "suppress_tokens", "begin_suppress_tokens", "layer_attention_windows"):
            if isinstance(getattr(self, name), list):  # from JSON
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if isinstance(self.rope_scaling, Mapping):  # from JSON or TOML: a plain dict, as config.json holds it
            object.__setattr__(self, "rope_scaling", dict(self.rope_scaling))
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
        if self.num_experts and self.moe_d_ff is None:
            derived["moe_d_ff"] = derived["d_ff"]  # experts as wide as the dense feed-forward (Mixtral)
        for name, value in derived.items():
            object.__setattr__(self, name, value)
        self._check_heads()
        self._check_experts()
        self._check_chosen("positional", POSITIONAL_SCHEMES)
        if family.check is not None:
            family.check(self)
        self._check_token_lists()
        for name, projections in (("key_bias", "the key projections'"), ("output_bias", "the output projection's")):
            if not getattr(self, name) and not self.attention_bias:
                raise ConfigError(f"{name}=False takes {projections} bias away from attention_bias=True; with "
                                  f"attention_bias=False no projection has one (leave {name}=True)")
        self._check_attention_kernel()

    @property
    def label_names_or_ids(self) -> tuple[str, ...]:
        """The label names, or Hugging Face's ``LABEL_0`` .. ``LABEL_{n-1}`` when the config names none."""
        return self.label_names or tuple(f"LABEL_{index}" for index in range(self.num_labels))

    # ---- validation -------------------------------------------------------------------------

    def _check_choices(self) -> None:
        for name, allowed in (
            ("architecture", tuple(FAMILIES)),
            ("activation", tuple(ACTIVATIONS)),
            ("norm", NORMS),
            ("norm_position", NORM_POSITIONS),
            ("positional", tuple(POSITIONAL_SCHEMES)),
            ("sinusoidal_layout", SINUSOIDAL_LAYOUTS),
            ("attention_kernel", tuple(ATTENTION_KERNELS)),
            ("initializer", INITIALIZERS),
        ):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in allowed:
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

    def _check_experts(self) -> None:
        """A mixture of experts' fields: at their defaults for a dense feed-forward (num_experts=0), else sizes that
        fit (top-k of at most num_experts experts) and a shared expert's gate only with a shared expert."""
        require_non_negative_int("num_experts", self.num_experts, "(0: a dense feed-forward)")
        if not self.num_experts:
            for name in EXPERT_FIELDS:
                value = getattr(self, name)
                if value != field_default(type(self), name):
                    raise ConfigError(f"{name}={value!r} is read only by a mixture of experts (num_experts > 0); "
                                      "num_experts=0 has a dense feed-forward")
            return
        require_positive_int("num_experts_per_token", self.num_experts_per_token)
        if self.num_experts_per_token > self.num_experts:
            raise ConfigError(f"num_experts_per_token={self.num_experts_per_token} must be at most "
                              f"num_experts={self.num_experts} (each token's top-k experts)")
        require_positive_int("moe_d_ff", self.moe_d_ff)
        require_non_negative_int("shared_expert_d_ff", self.shared_expert_d_ff, "(0: no shared expert)")
        if self.shared_expert_gate and not self.shared_expert_d_ff:
            raise ConfigError("shared_expert_gate=True gates a shared expert: set shared_expert_d_ff > 0")
        for name in ("norm_topk_prob", "shared_expert_gate"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be true or false")
        coef = self.router_aux_loss_coef
        if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not (math.isfinite(coef) and coef >= 0):
            raise ConfigError(f"router_aux_loss_coef={coef!r} must be a finite number >= 0 (the load-balancing "
                              "loss's weight in training; 0: none)")

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
        """The kernel's own fields, no other kernel's, and only what it honours; so for the sliding window
        of the layers ``layer_attention_windows`` gives one."""
        kernels = [self._check_chosen("attention_kernel", ATTENTION_KERNELS)]
        if self._check_layer_windows():
            kernels.append(ATTENTION_KERNELS[WINDOW_KERNEL])
        for name in ("attention_softcap", "query_pre_attn_scalar", "final_logit_softcap"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not (math.isfinite(value) and value > 0)):
                raise ConfigError(f"{name}={value!r} must be a finite number > 0, or null (none)")
        for kernel in kernels:
            if POSITIONAL_SCHEMES[self.positional].adds_bias and not kernel.position_bias:
                allowed = ", ".join(name for name, scheme in POSITIONAL_SCHEMES.items() if not scheme.adds_bias)
                raise ConfigError(f"attention_kernel={kernel.name!r} cannot express positional={self.positional!r} "
                                  f"(an additive bias on scores it never forms); allowed positional: {allowed}")
            for name, value, needed, able in (
                    ("attention_dropout", self.attention_dropout, 0.0, "dropout"),
                    ("attention_softcap", self.attention_softcap, None, "softcap"),
                    ("query_pre_attn_scalar", self.query_pre_attn_scalar, None, "custom_scale")):
                if value and not getattr(kernel, able):
                    others = " and ".join(repr(other.name) for other in ATTENTION_KERNELS.values()
                                          if getattr(other, able))
                    raise ConfigError(f"{name}={value!r} is not supported by attention_kernel={kernel.name!r} "
                                      f"(needs {needed!r}; {others} have it)")

    def _check_layer_windows(self) -> bool:
        """``layer_attention_windows``: empty, or a window (>= 0) per layer, some > 0 and each within the longest
        sequence, beside an ``attention_kernel`` for the other layers; whether some layer has a window."""
        windows = self.layer_attention_windows
        if not windows:
            return False
        limit = FAMILIES[self.architecture].sequence_limit(self)
        if not isinstance(windows, tuple) or len(windows) != self.num_layers or not all(
                isinstance(window, int) and not isinstance(window, bool) and 0 <= window <= limit
                for window in windows):
            raise ConfigError(f"layer_attention_windows={windows!r} must hold one window per layer "
                              f"(num_layers={self.num_layers}), each an integer in [0, {limit}]: the keys before each "
                              "query that layer's sliding window sees, 0 for none")
        if not any(windows):
            raise ConfigError(f"layer_attention_windows={windows!r} gives no layer a window: leave it empty")
        if self.attention_kernel == WINDOW_KERNEL:
            raise ConfigError("layer_attention_windows gives its layers the sliding_window kernel; attention_kernel "
                              "names the other layers' kernel and cannot be 'sliding_window' (set a window per layer)")
        return True

    def _check_token_lists(self) -> None:
        """``suppress_tokens`` and ``begin_suppress_tokens``: token ids of the vocabulary."""
        for name in ("suppress_tokens", "begin_suppress_tokens"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(
                    isinstance(token, int) and not isinstance(token, bool) and 0 <= token < self.vocab_size
                    for token in value):
                raise ConfigError(f"{name}={value!r} must be a list of token ids in [0, {self.vocab_size})")

    def layer_attention(self, layer: int) -> tuple[str, dict[str, Any]]:
        """The attention kernel block ``layer`` runs and its settings (the config fields it reads): the sliding
        window where ``layer_attention_windows`` gives the layer one, else ``attention_kernel``."""
        windows = self.layer_attention_windows
        if windows and windows[layer]:
            return WINDOW_KERNEL, {"attention_window": windows[layer]}
        kernel = ATTENTION_KERNELS[self.attention_kernel]
        return kernel.name, {name: getattr(self, name) for name in kernel.fields}

    @property
    def attention_kernels(self) -> tuple[str, ...]:
        """Every attention kernel the layers run, each once, in layer order."""
        return tuple(dict.fromkeys(self.layer_attention(layer)[0] for layer in range(self.num_layers)))

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
        if self.gated:
            return 64 * -(-(8 * self.d_model // 3) // 64)
        return 4 * self.d_model

    # ---- derived facts ----------------------------------------------------------------------

    @property
    def gated(self) -> bool:
        """Whether the feed-forward is a gated linear unit (two input projections)."""
        return ACTIVATIONS[self.activation].gated

    # ---- (de)serialisation ------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON holds them (``label_names`` a list), so a dict read back compares equal."""
        data = dataclasses.asdict(self)
        for name in ("label_names", "suppress_tokens", "begin_suppress_tokens", "layer_attention_windows"):
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
    if config.num_experts and config.moe_d_ff == config.d_ff:
        reset["moe_d_ff"] = None
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


def require_non_negative_int(name: str, value: Any, meaning: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{name}={value!r} must be an integer >= 0 {meaning}".rstrip())


# ---- presets -------------------------------------------------------------------------------


def require_token_ids(config: ModelConfig, names: tuple[str, ...]) -> None:
    """Each of ``names`` is None or a token id of the config's vocabulary."""
    for name in names:
        value = getattr(config, name)
        if value is not None and not (isinstance(value, int) and 0 <= value < config.vocab_size):
            raise ConfigError(f"{name}={value!r} must be a token id in [0, {config.vocab_size})")


class Presets(Mapping[str, ModelConfig]):
    """The named configs each family declares beside its class (``presets=`` in its register line): kept as
    their fields (data) and made into a ModelConfig when first read, once the families have declared
    themselves (tformer.models)."""

    def __init__(self) -> None:
        self._made: dict[str, ModelConfig] = {}

    def __getitem__(self, name: str) -> ModelConfig:
        if name not in self._made:
            self._made[name] = ModelConfig(**preset_fields()[name])
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(preset_fields())

    def __len__(self) -> int:
        return len(preset_fields())


PRESETS = Presets()


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
