"""A sparse mixture of experts: the block's feed-forward when ``num_experts`` > 0 (Mixtral, Qwen2-MoE).

A router (a linear map to one logit per expert, no bias) scores each token; the softmax over experts is taken in
float32, each token goes to its ``num_experts_per_token`` most probable experts, weighted by those probabilities
(renormalised to sum to 1 when ``norm_topk_prob``, as Mixtral does). Every expert is a ``FeedForward`` of the
config's activation (SwiGLU for both families), so weight backends (prepacked, int8, int4) swap its projections as
they swap any linear layer. Tokens are grouped by expert (one sort) and each expert runs once over its own tokens;
an expert no token chose does not run. An optional shared expert sees every token, its output scaled by a sigmoid
gate when ``shared_expert_gate`` (Qwen2-MoE).

Training adds the load-balancing loss of Switch Transformer (as Hugging Face's ``load_balancing_loss_func``
computes it) weighted by ``router_aux_loss_coef``: the block's one forward cannot hand the router logits out, so each
mixture keeps its last pass's logits (in training with a coefficient, or while ``recording_router_logits`` is
active) and ``auxiliary_loss`` reads them from the model's mixtures in layer order; the Trainer adds it to the task's
loss at every training step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.nn.feedforward import FeedForward


class MixtureOfExperts(nn.Module):
    """``sum_k w_k * expert_k(x)`` over each token's top-k experts, plus the (gated) shared expert's output.

    Parameters: ``router`` (E, D), ``experts.{e}.in_proj`` / ``out_proj`` (each expert a FeedForward),
    ``shared_expert`` and ``shared_expert_gate`` (1, D) when the config has them.
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int, top_k: int, activation: str, *, bias: bool = False,
                 normalize: bool = True, shared_d_ff: int = 0, shared_gate: bool = False,
                 aux_loss_coef: float = 0.0) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.normalize = normalize
        self.aux_loss_coef = aux_loss_coef
        self.router = nn.Linear(d_model, num_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(d_model, d_ff, activation, bias) for _ in range(num_experts))
        self.shared_expert = FeedForward(d_model, shared_d_ff, activation, bias) if shared_d_ff else None
        self.shared_expert_gate = nn.Linear(d_model, 1, bias=False) if shared_gate else None
        self.record_router_logits = False  # keep each pass's router logits outside training too
        self.router_logits: Tensor | None = None  # (N, E) of the last pass that kept them

    @classmethod
    def from_config(cls, config: ModelConfig) -> MixtureOfExperts:
        return cls(config.d_model, config.moe_d_ff, config.num_experts, config.num_experts_per_token,
                   config.activation, bias=config.feedforward_bias, normalize=config.norm_topk_prob,
                   shared_d_ff=config.shared_expert_d_ff, shared_gate=config.shared_expert_gate,
                   aux_loss_coef=config.router_aux_loss_coef)

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., D) -> (..., D); the block hands it rows (N, D)."""
        parts = self._modules  # read directly: a decoding step runs every layer once per token
        rows = x.reshape(-1, x.shape[-1])  # (N, D)
        logits = parts["router"](rows)  # (N, E)
        if self.record_router_logits or (self.training and self.aux_loss_coef):
            self.router_logits = logits
        weights, chosen = route(logits, self.top_k, self.normalize)  # (N, k) float32, (N, k)
        out = self.dispatch(rows, weights, chosen)
        shared = parts.get("shared_expert")
        if shared is not None:
            extra = shared(rows)
            gate = parts.get("shared_expert_gate")
            out = out + (torch.sigmoid(gate(rows)) * extra if gate is not None else extra)
        return out.view(x.shape)

    def __getstate__(self) -> dict:
        """Copies (deepcopy, pickle) keep no router logits: they belong to a pass, and a training pass's carry
        its graph, which cannot be copied."""
        return {**self.__dict__, "router_logits": None}

    def dispatch(self, rows: Tensor, weights: Tensor, chosen: Tensor) -> Tensor:
        """The experts' weighted outputs summed per token: rows (N, D), weights and chosen (N, k) -> (N, D).

        The N * k (token, expert) pairs are sorted by expert, so each expert reads one contiguous slice of the
        gathered rows; the outputs go back to their tokens with one ``index_add_`` (in expert order, as Hugging Face
        adds them)."""
        flat = chosen.reshape(-1)  # (N * k,)
        order = flat.argsort(stable=True)
        tokens = order // self.top_k  # (N * k,) the token of each pair, grouped by expert
        gathered = rows[tokens]  # (N * k, D)
        pair_weights = weights.reshape(-1)[order, None]  # (N * k, 1) float32
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        outputs = []
        start = 0
        for expert, count in zip(self._modules["experts"]._modules.values(), counts, strict=True):
            if count:
                outputs.append(expert(gathered[start:start + count]))
                start += count
        weighted = (torch.cat(outputs) * pair_weights).to(rows.dtype)  # (N * k, D), weighted in float32
        return torch.zeros_like(rows).index_add_(0, tokens, weighted)


def route(logits: Tensor, top_k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """Each token's experts and their weights from router logits (N, E): the top-k of the float32 softmax,
    renormalised to sum to 1 when ``normalize``. Returns weights (N, k) float32 and expert ids (N, k)."""
    probabilities = F.softmax(logits.float(), dim=-1)
    weights, chosen = torch.topk(probabilities, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, chosen


def build_feedforward(config: ModelConfig) -> nn.Module:
    """The block's feed-forward for ``config``: a mixture of experts when ``num_experts`` > 0, else dense."""
    if config.num_experts:
        return MixtureOfExperts.from_config(config)
    return FeedForward(config.d_model, config.d_ff, config.activation, config.feedforward_bias)


def feedforward_parameters(config: ModelConfig) -> int:
    """The weights of one layer's feed-forward projections (biases left out): the dense one's, or the router's,
    every expert's and the shared expert's with its gate."""
    per_width = (3 if config.gated else 2) * config.d_model  # a hidden unit's weights (gate, up, down)
    if not config.num_experts:
        return per_width * config.d_ff
    router = config.num_experts * config.d_model
    shared = per_width * config.shared_expert_d_ff + (config.d_model if config.shared_expert_gate else 0)
    return router + config.num_experts * per_width * config.moe_d_ff + shared


def mixtures(model: nn.Module) -> list[MixtureOfExperts]:
    """The model's mixtures of experts, in layer order."""
    return [module for module in model.modules() if isinstance(module, MixtureOfExperts)]


@contextmanager
def recording_router_logits(model: nn.Module) -> Iterator[None]:
    """Within the block, the model's mixtures keep each pass's router logits (as in training) for
    ``router_logits`` and ``auxiliary_loss``; outside it they keep none in evaluation (a decoding step holds no
    reference)."""
    found = mixtures(model)
    for mixture in found:
        mixture.record_router_logits = True
    try:
        yield
    finally:
        for mixture in found:
            mixture.record_router_logits = False


def router_logits(model: nn.Module) -> tuple[Tensor, ...]:
    """The router logits (N, E) each mixture kept from its last pass, in layer order (HF's ``router_logits``)."""
    return tuple(mixture.router_logits for mixture in mixtures(model) if mixture.router_logits is not None)


def load_balancing_loss(logits: Sequence[Tensor], num_experts: int, top_k: int,
                        attention_mask: Tensor | None = None) -> Tensor:
    """Switch Transformer's load-balancing loss over the layers' router logits (each (N, E)), as Hugging Face's
    ``load_balancing_loss_func`` computes it: E * sum_e f_e * P_e, where f_e is the share of top-k choices that
    went to expert e (summing to top_k) and P_e the mean router probability of e, both over every layer's real
    tokens (``attention_mask`` (B, T), 1 = real; a layer whose rows it does not cover counts all of its rows)."""
    device = logits[0].device
    chosen_sum = torch.zeros(num_experts, dtype=torch.float32, device=device)
    probability_sum = torch.zeros(num_experts, dtype=torch.float32, device=device)
    total = torch.zeros((), dtype=torch.float32, device=device)
    for layer in logits:
        probabilities = F.softmax(layer.float(), dim=-1)  # (N, E)
        chosen = torch.topk(probabilities, top_k, dim=-1).indices  # (N, k)
        real = torch.ones(layer.shape[0], dtype=torch.float32, device=device)
        if attention_mask is not None and attention_mask.numel() == layer.shape[0]:
            real = attention_mask.reshape(-1).to(device=device, dtype=torch.float32)
        chosen_sum = chosen_sum.scatter_add(0, chosen.reshape(-1), real.repeat_interleave(top_k))
        probability_sum = probability_sum + (probabilities * real[:, None]).sum(dim=0)
        total = total + real.sum()
    return num_experts * torch.sum((chosen_sum / total) * (probability_sum / total))


def auxiliary_loss(found: Sequence[MixtureOfExperts], attention_mask: Tensor | None = None) -> Tensor | None:
    """``router_aux_loss_coef`` times the load-balancing loss over the last pass of the mixtures ``found`` (a model's
    ``mixtures``; the training step adds it to the task's loss), or None when none kept logits (no coefficient)."""
    kept = [mixture for mixture in found if mixture.router_logits is not None]
    if not kept or not kept[0].aux_loss_coef:
        return None
    first = kept[0]
    loss = load_balancing_loss([mixture.router_logits for mixture in kept], first.num_experts, first.top_k,
                               attention_mask)
    return first.aux_loss_coef * loss
