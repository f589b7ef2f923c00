"""Front ends that turn inputs into vectors (B, T, D) for the stack: token embeddings today."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.nn.inputs import check_token_ids


class TokenEmbedding(nn.Module):
    """Token table (``token``), scaled by sqrt(d_model) when ``scale_embeddings``, plus segment
    embeddings (``token_type``) when ``type_vocab_size`` > 0. Positions are the stack's."""

    def __init__(self, vocab_size: int, d_model: int, type_vocab_size: int = 0, scale: bool = False) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.token_type = nn.Embedding(type_vocab_size, d_model) if type_vocab_size else None
        self.scale = math.sqrt(d_model) if scale else None

    @classmethod
    def from_config(cls, config: ModelConfig) -> TokenEmbedding:
        return cls(config.vocab_size, config.d_model, config.type_vocab_size, config.scale_embeddings)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """input_ids (B, T) -> (B, T, D); ``token_type_ids`` (B, T), all 0 when not given."""
        x = self.token(input_ids)
        if self.scale is not None:
            x = x * self.scale
        if self.token_type is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            elif token_type_ids.shape != input_ids.shape:
                raise ValueError(f"token_type_ids must have the shape of input_ids {tuple(input_ids.shape)}, "
                                 f"got {tuple(token_type_ids.shape)}")
            check_token_ids(token_type_ids, self.token_type.num_embeddings, "token_type_ids", "token type id",
                            "the token types")
            x = x + self.token_type(token_type_ids)
        elif token_type_ids is not None:
            raise ValueError("token_type_ids given, but this model has no token type embeddings (type_vocab_size=0)")
        return x
