"""VisionModel: the Vision Transformer (Dosovitskiy et al. 2021) on the shared core.

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
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor, nn

from tformer.config import ConfigError, ModelConfig, require_positive_int
from tformer.models.base import Model
from tformer.models.output import VisionOutput
from tformer.models.registry import register
from tformer.nn.heads import Features, Pooler, add_head, check_head_fields, check_labels, head_module_names, pool
from tformer.nn.inputs import INTEGER_DTYPES
from tformer.nn.patches import ImageEmbedding
from tformer.nn.stack import TransformerStack

# Positions over the patch grid: a learned table, or fixed 2D sine-cosine.
VISION_POSITIONALS = ("learned", "sinusoidal")
VISION_FIELDS = ("head", "num_labels", "label_names", "image_size", "patch_size", "num_channels", "pooling")


def check_vision_config(config: ModelConfig) -> None:
    """A vision model's head and labels, its positions over the patch grid and a grid the patches tile."""
    check_head_fields(config)
    if config.head == "image_classification" and config.num_labels < 2:
        raise ConfigError(f"num_labels={config.num_labels} must be >= 2 for head='image_classification' "
                          "(a cross-entropy over classes)")
    if config.positional not in VISION_POSITIONALS:
        raise ConfigError(f"positional={config.positional!r} is not one of {', '.join(VISION_POSITIONALS)} "
                          "(architecture='vision': positions over the patch grid)")
    if config.positional == "sinusoidal" and config.d_model % 4:
        raise ConfigError(f"d_model={config.d_model} must be a multiple of 4 for positional='sinusoidal' "
                          "(2D: a sine and a cosine for the row and for the column)")
    for name in ("image_size", "patch_size", "num_channels"):
        require_positive_int(name, getattr(config, name))
    if config.image_size % config.patch_size:
        raise ConfigError(f"image_size={config.image_size} is not a multiple of patch_size={config.patch_size} "
                          "(the patches must tile the image)")


def _vit(d_model: int, num_layers: int, num_heads: int, **fields: Any) -> dict[str, Any]:
    """A ViT-shaped image classifier (Hugging Face ViTForImageClassification's defaults: LayerNorm eps 1e-12)."""
    return {
        "d_model": d_model, "num_layers": num_layers, "num_heads": num_heads, "activation": "gelu",
        "norm": "layernorm", "norm_position": "pre", "norm_eps": 1e-12, "positional": "learned",
        "head": "image_classification", **fields,
    }


# Vision Transformers (Dosovitskiy et al. 2021): pre-norm, exact GELU, class token, learned positions.
# vit-base-patch16-224 is Hugging Face's ViTForImageClassification google/vit-base-patch16-224 (1,000
# ImageNet classes): 86,567,656 parameters; vit-tiny-patch16-224 the DeiT-tiny shape with the same head.
VISION_PRESETS = {
    "vit-base-patch16-224": _vit(768, 12, 12, num_labels=1000),
    "vit-tiny-patch16-224": _vit(192, 12, 3, num_labels=1000),
    # MNIST-sized (28 x 28 grey, 10 classes): 4 x 4 patches, a 7 x 7 grid; trains on a CPU in minutes.
    "vit-mnist": _vit(128, 6, 4, num_labels=10, image_size=28, patch_size=4, num_channels=1, norm_eps=1e-6),
}


@register("vision", fields=VISION_FIELDS, check=check_vision_config, presets=VISION_PRESETS,
          longest_sequence=lambda config: config.num_patches + 1)  # the class token and the patches
class VisionModel(Model):
    """Patches + class token + positions (``ImageEmbedding``) -> bidirectional TransformerStack
    (pre-norm blocks, final norm) -> the pooled vector (``config.pooling``: the class token's, or the
    mean of the patch tokens') -> the head named by ``config.head``:

    - ``image_classification``: ``classifier``, a Linear to ``num_labels`` logits (Hugging Face's
      ViTForImageClassification); the loss is the cross-entropy against class ids (-100: ignored)
    - None: the bare model, whose ``pooler`` (dense + tanh, Hugging Face's ViTModel) gives ``pooled``

    ``image_processor`` (an ``ImageProcessing`` or None) says how uint8 images become ``pixel_values``;
    checkpoint folders keep it as preprocessor_config.json. ``resize_image`` moves the model to another
    image size for good; ``forward(..., interpolate_pos_encoding=True)`` runs one batch at another size.
    """

    head_modules = head_module_names("vision")
    scaled_residual_init = False
    attachments = ("image_processor",)
    reads_tokens = False
    inputs = "images"

    @classmethod
    def estimated_parameters(cls, config: ModelConfig) -> int:
        """The patch projection, the position table and the layers' projections: no vocabulary."""
        embeddings = (config.num_channels * config.patch_size ** 2 + config.num_patches + 1) * config.d_model
        return embeddings + config.num_layers * cls.layer_parameters(config)

    @classmethod
    def describe_inputs(cls, config: ModelConfig) -> str:
        return (f"images {config.num_channels} x {config.image_size} x {config.image_size} in {config.patch_size} x "
                f"{config.patch_size} patches")

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.image_processor: Any = None
        self.embedding = ImageEmbedding(config)
        self.stack = TransformerStack(config, causal=False, add_positions=False)
        self.pooler = Pooler(config.d_model) if config.has_pooler else None
        self.task_head = add_head(self, config)
        self.init_weights()

    def init_weights(self) -> None:
        """The base's, and as Hugging Face's ViT: the patch projection normal(0, initializer_range) with a
        zero bias, the class token and a learned position table truncated normal(0, initializer_range)."""
        super().init_weights()
        std = self.config.initializer_range
        projection = self.embedding.patches.projection
        nn.init.normal_(projection.weight, 0.0, std)
        nn.init.zeros_(projection.bias)
        nn.init.trunc_normal_(self.embedding.cls_token, 0.0, std)
        if self.embedding.learned:
            nn.init.trunc_normal_(self.embedding.position_embeddings, 0.0, std)

    def resize_image(self, image_size: int) -> None:
        """Read ``image_size`` square images from now on (a multiple of ``patch_size``): the positions
        become those ``forward(..., interpolate_pos_encoding=True)`` uses at that size, and the config
        and image processor say the new size. Fine-tune or run at the new resolution after this."""
        config = self.config.replace(image_size=image_size)  # checks the size
        self.embedding.resize(image_size)
        self.config = self.stack.config = config
        if self.image_processor is not None:
            self.image_processor = dataclasses.replace(self.image_processor, image_size=image_size)

    def forward(
        self,
        pixel_values: Tensor,
        labels: Tensor | None = None,
        interpolate_pos_encoding: bool = False,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> VisionOutput:
        """pixel_values (B, C, H, W), already normalised (``image_processor``); ``labels`` (B,) class
        ids with the image-classification head. ``interpolate_pos_encoding``: images of another size
        (a multiple of the patch size) with the positions resampled to their grid. ``attentions`` per
        layer (B, H, 1 + N, 1 + N) when asked for."""
        check_labels(self.task_head, ["labels"] if labels is not None else [])
        if labels is not None:
            self._check_labels(labels, pixel_values.shape[0])
        features, output = self.forward_features(pixel_values, interpolate_pos_encoding, output_attentions,
                                                 output_hidden_states)
        if self.task_head is not None:
            self.task_head.forward(self, features, output, labels=labels)
        return output

    def forward_features(self, pixel_values: Tensor, interpolate_pos_encoding: bool = False,
                         output_attentions: bool = False,
                         output_hidden_states: bool = False) -> tuple[Features, VisionOutput]:
        """The model without its head: the features a head reads (the pooled vector: the class token's or
        the patches' mean, ``config.pooling``), and the bare model's output (``logits`` its hidden states
        (B, 1 + N, D), ``pooled`` the tanh pooler's output where it has one)."""
        stack = self.stack(
            self.embedding(pixel_values, interpolate_pos_encoding),
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
        )
        hidden = stack.hidden  # (B, 1 + N, D)
        pooled = pool(hidden, self.config.pooling, class_tokens=1)  # (B, D)
        pooler_output = self.pooler(pooled) if self.pooler is not None else None
        output = VisionOutput(logits=hidden, attentions=stack.attentions, hidden_states=stack.hidden_states,
                              last_hidden_state=hidden, pooled=pooler_output)
        return Features(hidden, pooled, pooler_output), output

    def _check_labels(self, labels: Tensor, batch: int) -> None:
        if tuple(labels.shape) != (batch,) or labels.dtype not in INTEGER_DTYPES:
            raise ValueError(f"labels must be ({batch},) integer class ids, got shape {tuple(labels.shape)} of "
                             f"{labels.dtype}")
