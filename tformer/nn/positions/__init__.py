"""Positional schemes, one file each, listed by name in ``registry.py``: absolute encodings added to the
embeddings (learned, sinusoidal), rotary angles for queries and keys (RoPE with its scaling types), and
additive attention biases (ALiBi, T5's relative buckets).

Every scheme takes explicit position ids, so left-padded batches and cached decoding give each token its
true position.
"""

from tformer.nn.positions.absolute import (
    LearnedPositions,
    SinusoidalPositions,
    sinusoidal_table,
    whisper_sinusoids,
)
from tformer.nn.positions.biases import ALiBi, RelativePositionBias, alibi_slopes, relative_position_bucket
from tformer.nn.positions.registry import POSITIONAL_SCHEMES, POSITIONALS, positional_from_config
from tformer.nn.positions.rope_scaling import ROPE_SCALINGS
from tformer.nn.positions.rotary import RotaryEmbedding, apply_rotary, rotary_dimensions, rotate_half
from tformer.nn.positions.scheme import PositionalScheme, positions_from_mask

__all__ = [
    "ALiBi", "LearnedPositions", "POSITIONALS", "POSITIONAL_SCHEMES", "PositionalScheme", "ROPE_SCALINGS",
    "RelativePositionBias", "RotaryEmbedding", "SinusoidalPositions", "alibi_slopes", "apply_rotary",
    "positional_from_config", "positions_from_mask", "relative_position_bucket", "rotary_dimensions", "rotate_half",
    "sinusoidal_table", "whisper_sinusoids",
]
