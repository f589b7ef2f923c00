"""What every tformer model shares: its config, an optional tokenizer, weight initialisation,
parameter counting and saving (loading is ``tformer.hub``'s: it needs every model class)."""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tformer.checkpoint import save_checkpoint
from tformer.config import ModelConfig, non_default_fields
from tformer.interop import save_hf
from tformer.models.generation_protocol import GenerationProtocol
from tformer.models.output import GenerationState
from tformer.nn.decoding_view import decoding_view
from tformer.nn.experts import feedforward_parameters
from tformer.nn.losses import IGNORE_INDEX, head_loss, token_cross_entropy
from tformer.nn.stack import LAYOUT_FIELDS, TransformerStack
from tformer.nn.weights import decoding_step, decoding_weights
from tformer.quantization import dequantized


def is_norm(module: nn.Module) -> bool:
    """A normalisation layer: LayerNorm, or torch's or tformer's RMSNorm."""
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or type(module).__name__ == "RMSNorm"


class Model(nn.Module, GenerationProtocol):
    """Base class of tformer models. Subclasses build their layers from ``config``; a family that writes
    tokens offers the generation protocol (``generation_protocol.py``), whose defaults every model has."""

    config: ModelConfig
    # Submodules that a fine-tuning load may initialise afresh or drop (a task head, a pooler):
    # ``tformer.load(path, head=...)`` copies the rest exactly and reports these.
    head_modules: tuple[str, ...] = ()
    # GPT-2's initialisation scales the residual output projections by 1/sqrt(2 * num_layers); BERT's does not.
    scaled_residual_init: bool = True
    # What the family keeps beside its weights in a checkpoint folder, read back by ``tformer.load``: a
    # "tokenizer" (tokenizer.json), an "image_processor" (preprocessor_config.json).
    attachments: tuple[str, ...] = ("tokenizer",)
    reads_tokens: bool = True  # it reads or writes token ids of a vocabulary (a tokenizer sets vocab_size)
    # Its forward takes ``return_logits=False`` (with labels) and ``label_smoothing``: the loss alone, the
    # logits of its token head never held whole (``head_outputs``); the training tasks' loss asks for that.
    loss_alone: bool = False
    inputs: str = "tokens"  # what its (encoder's) input is: "tokens", "images" or "audio"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tokenizer: Any = None
        self.quantization: Any = None  # the QuantizationScheme of its layers (tformer.quantization), or None

    # ---- what a config implies, before a model is built ------------------------------------------

    @classmethod
    def estimated_parameters(cls, config: ModelConfig) -> int:
        """About how many weights a model of ``config`` holds: its token embedding (and untied output), and
        per layer the attention and feed-forward projections; norms, biases and position tables are left
        out (a few percent at most). Read from the sizes alone, so a config whose model could never fit is
        refused before anything is allocated."""
        embeddings = config.vocab_size * config.d_model * (1 if config.tie_embeddings else 2)
        return embeddings + config.num_layers * cls.layer_parameters(config)

    @staticmethod
    def layer_parameters(config: ModelConfig) -> int:
        """The attention and feed-forward projections of one transformer layer."""
        attention = (2 * config.num_heads + 2 * config.num_kv_heads) * config.head_dim * config.d_model
        return attention + feedforward_parameters(config)  # dense, or router + experts + shared expert

    @classmethod
    def describe_inputs(cls, config: ModelConfig) -> str:
        """What the model reads, for its line in a run's log."""
        return f"context {config.max_seq_len}"

    # ---- parameters --------------------------------------------------------------------------

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Trainable parameters, each shared tensor counted once."""
        total = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            total -= sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Embedding))
        return total

    def tied_parameters(self) -> dict[str, str]:
        """Parameter names that are views of another parameter: {alias: source}. Saved once."""
        return {}

    def tied_state_names(self) -> set[str]:
        """The state names left out when saving (tied again on load): the aliases of ``tied_parameters``, and any
        other name their source parameter is reachable by (an adapter over a tied head holds it as
        ``lm_head.base.weight``)."""
        tied = self.tied_parameters()
        parameters = dict(self.named_parameters())
        sources = {id(parameters[source]): source for source in tied.values() if source in parameters}
        return set(tied) | {name for name, parameter in self.named_parameters(remove_duplicate=False)
                            if sources.get(id(parameter), name) != name}

    def init_weights(self) -> None:
        """GPT-2 style: normal(0, initializer_range) weights, zero biases, unit norms; the
        projections that write into the residual stream scaled by 1/sqrt(2 * num_layers) unless
        ``scaled_residual_init`` is False (BERT)."""
        std = self.config.initializer_range
        residual_std = std / math.sqrt(2 * self.config.num_layers) if self.scaled_residual_init else std
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                is_residual_out = name.endswith("attention.out_proj") or name.endswith("feedforward.out_proj")
                nn.init.normal_(module.weight, 0.0, residual_std if is_residual_out else std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, std)
            elif is_norm(module):
                if getattr(module, "weight", None) is not None:
                    nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    # ---- saving ------------------------------------------------------------------------------

    def save(self, path: str | Path, format: str = "tformer") -> Path:
        """Write a checkpoint folder: config.json, model.safetensors, tokenizer.json if attached;
        in tformer's format, or Hugging Face's (``format="hf"``) for the families interop knows."""
        if format == "hf":
            if self.quantization is None:
                return save_hf(self, path)
            warnings.warn(f"a quantized model ({self.quantization.describe()}) is written to the Hugging Face format "
                          "dequantized: float32 weights that carry the quantization's rounding", stacklevel=2)
            return save_hf(dequantized(copy.deepcopy(self)), path)
        if format != "tformer":
            raise ValueError(f"format={format!r} is not one of tformer, hf")
        return save_checkpoint(self, path)

    # ---- the generation protocol's decoding side ---------------------------------------------------

    stepping = decoding_step  # weight backends read their derived copies only inside a step

    def decoding_view(self, weights: str | None = None) -> Model:
        """This model as decoding runs it, leaving the model itself as it is: the same parameters, its linear
        layers on the weight backend ``weights`` (``nn.weights``; default: prepacked on the CPU, plain
        elsewhere), in inference mode, each part called directly when nothing observes it
        (``nn/decoding_view.py``). Generation makes one per call, the serving engine one for its life."""
        return decoding_view(self, decoding_weights(self.device) if weights is None else weights)

    def step_problem(self) -> str | None:
        """Why a ``StackSession`` cannot lay out this model's steps (no ``step``, or a config field the layout
        does not know: fail closed), or None."""
        if type(self).step is GenerationProtocol.step:
            return super().step_problem()
        unknown = [name for name in non_default_fields(self.config) if name not in LAYOUT_FIELDS]
        return "config " + ", ".join(f"{name}={getattr(self.config, name)!r}" for name in unknown) if unknown else None

    @property
    def position_limit(self) -> int | None:
        """How many positions the model can take when they index a fixed table (learned,
        sinusoidal: ``max_seq_len``), the smallest over its stacks; None when unbounded."""
        limits = [module.position_limit for module in self.modules() if isinstance(module, TransformerStack)]
        limits = [limit for limit in limits if limit is not None]
        return min(limits) if limits else None

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype


def head_outputs(model: Model, hidden: torch.Tensor, targets: torch.Tensor | None, return_logits: bool,
                 label_smoothing: float) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The logits of a model's token head (``model._logits``, over its ``lm_head``) for its last hidden states
    (B, T, D), and their cross-entropy against ``targets`` (B, T) (None: no loss). ``return_logits`` False: the
    loss alone, by ``losses.head_loss`` (a frozen head, or logits past 1 GiB, run a few positions at a time),
    the logits None; it needs targets."""
    if not return_logits:
        if targets is None:
            raise ValueError("return_logits=False gives the loss alone: it needs labels")
        return None, head_loss(model._logits, model.lm_head.parameters(), hidden, targets, model.config.vocab_size,
                               label_smoothing)
    logits = model._logits(hidden)  # (B, T, V)
    return logits, None if targets is None else token_cross_entropy(logits, targets, label_smoothing)


def shift_right(labels: torch.Tensor, start_id: int, pad_id: int) -> torch.Tensor:
    """A decoder's inputs (B, T) for ``labels`` (B, T): ``start_id``, then the labels but the last, ignored
    positions (-100) read as ``pad_id``. The only copy: a model shifts its labels with it, and the
    translation task builds its batches' ``decoder_input_ids`` with it."""
    shifted = labels.new_full(labels.shape, start_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad_id)


class Seq2SeqModel(Model):
    """What the encoder-decoder families share: the source is generation's prompt (padded on either side),
    and the decoder reads its target shifted right behind a start token."""

    generates = True
    encodes_prompt = True

    @property
    def start_token_id(self) -> int:
        """The decoder's first input: ``decoder_start_token_id``, else ``bos_token_id``, else ``pad_token_id``."""
        config = self.config
        for value in (config.decoder_start_token_id, config.bos_token_id, config.pad_token_id):
            if value is not None:
                return value
        raise ValueError(f"this {config.architecture} model has no decoder_start_token_id, bos_token_id or "
                         "pad_token_id: set one, so the decoder knows how to start")

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """The decoder's inputs for ``labels`` (B, T) (see ``shift_right``, the function): this model's
        start token, its padding (else the start token) for ignored positions."""
        pad = self.config.pad_token_id if self.config.pad_token_id is not None else self.start_token_id
        return shift_right(labels, self.start_token_id, pad)

    def decoder_tokens(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor | None,
                       labels: torch.Tensor | None, generation_step: bool) -> torch.Tensor:
        """What the decoder reads in ``forward``: in training and scoring ``decoder_input_ids``, else the
        ``labels`` shifted right; in a generation step (the encoder's output given) ``input_ids``."""
        if generation_step:
            if decoder_input_ids is not None:
                raise ValueError("a generation step takes the decoder's tokens as input_ids, not decoder_input_ids")
            return input_ids
        if decoder_input_ids is not None:
            return decoder_input_ids
        if labels is None:
            raise ValueError("give the target: decoder_input_ids, or labels to shift right")
        return self.shift_right(labels)

    def encoded_source(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The encoder's output (B, S, D) that every decoding step attends to."""
        raise NotImplementedError

    def decoder_start(self, batch: int, device: torch.device,
                      decoder_prompt: Sequence[int] | None = None) -> torch.Tensor:
        """The decoder's first tokens (B, P): ``decoder_prompt`` (a forced prefix, e.g. Whisper's
        <|startoftranscript|>, language and task) for every row, else the start token (B, 1)."""
        prompt = [self.start_token_id] if not decoder_prompt else list(decoder_prompt)
        return torch.tensor(prompt, dtype=torch.long, device=device).expand(batch, -1).contiguous()

    def prepare_generation(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                           decoder_prompt: Sequence[int] | None = None) -> GenerationState:
        """Encode the source once; the decoder starts from ``decoder_prompt``, else the start token, and every
        step reads the encoder's output and mask (reordered with the rows by beam search)."""
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        start = self.decoder_start(input_ids.shape[0], input_ids.device, decoder_prompt)
        return GenerationState(input_ids=start, step_inputs={"encoder_output": self.encoded_source(input_ids, mask),
                                                              "encoder_attention_mask": mask})
