"""Heads: what turns the stack's hidden states (B, T, D) into a task's outputs."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tformer.nn.feedforward import activation_function


class LMHead(nn.Linear):
    """Hidden states (B, T, D) -> next-token logits (B, T, V): one projection, bias-free unless asked
    (Marian's ``final_logits_bias``), whose weight may be the token table itself (``tie_embeddings``)."""

    def __init__(self, d_model: int, vocab_size: int, bias: bool = False) -> None:
        super().__init__(d_model, vocab_size, bias=bias)


class MaskedLMHead(nn.Module):
    """BERT's masked-LM head: hidden states (B, T, D) -> token logits (B, T, V) through
    ``dense`` + activation + ``norm`` (the model's kind: BERT's LayerNorm), then ``decoder``
    (bias-free; its weight may be the token table, ``tie_embeddings``) plus a per-token ``bias``."""

    def __init__(self, d_model: int, vocab_size: int, activation: str, norm: nn.Module) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.activation = activation_function(activation)
        self.norm = norm
        self.decoder = nn.Linear(d_model, vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden (..., D) -> logits (..., V)."""
        return self.decoder(self.norm(self.activation(self.dense(hidden)))) + self.bias


class Pooler(nn.Module):
    """BERT's pooler: tanh(dense(vector)), (B, D) -> (B, D); the model picks the vector (the first
    token's, or a mean). With ``input_dropout`` > 0 the vector is dropped out first (RoBERTa's
    classification head)."""

    def __init__(self, d_model: int, input_dropout: float = 0.0) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(input_dropout) if input_dropout > 0 else nn.Identity()

    def forward(self, vector: Tensor) -> Tensor:
        return torch.tanh(self.dense(self.dropout(vector)))
