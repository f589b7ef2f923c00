"""The losses, in one place: the models compute their ``loss`` with these functions and the training
tasks train and evaluate with them, so ``model(**batch).loss`` is the loss a task trains on.

Every function takes ``reduction``: ``"mean"`` (the training loss, Hugging Face's), ``"sum"`` and
``"none"`` (per target or per example, for an evaluation that adds losses up over batches, or weighs
rows); ``sum / count`` of the summed loss is the mean. All compute in float32 whatever the logits' dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from tformer.nn.inputs import warn_if_no_targets
from tformer.nn.weights.backend import reused_weights

IGNORE_INDEX = -100
Reduction = Literal["mean", "sum", "none"]
REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is not one of {', '.join(REDUCTIONS)}")


def token_cross_entropy(logits: Tensor, targets: Tensor, label_smoothing: float = 0.0,
                        reduction: Reduction = "mean") -> Tensor:
    """Cross-entropy of logits (..., V) against targets (...); IGNORE_INDEX is skipped.

    ``"mean"``: over the targets not ignored (NaN, with a warning, when every one is); ``"sum"``: their
    sum; ``"none"``: one loss per target, shaped like ``targets`` (0 where ignored)."""
    _check_reduction(reduction)
    if reduction == "mean":
        warn_if_no_targets(targets, IGNORE_INDEX)
    losses = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
        ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing, reduction=reduction,
    )
    return losses.reshape(targets.shape) if reduction == "none" else losses


def next_token_targets(labels: Tensor, length: int) -> Tensor:
    """The token each of ``length`` positions predicts: ``labels`` (B, T) aligned with the inputs give
    labels[:, t + 1] (the last position predicts nothing: -100); (B, T + 1), the inputs followed by the
    token after them (a language-model crop), give every position its next token."""
    if labels.shape[-1] == length + 1:
        return labels[:, 1:]
    if labels.shape[-1] != length:
        raise ValueError(f"labels hold {labels.shape[-1]} positions for {length} inputs: give {length} (aligned "
                         f"with the inputs) or {length + 1} (the inputs and the token after them)")
    shifted = labels.new_full(labels.shape, IGNORE_INDEX)
    shifted[:, :-1] = labels[:, 1:]
    return shifted


def next_token_loss(logits: Tensor, labels: Tensor, label_smoothing: float = 0.0,
                    reduction: Reduction = "mean") -> Tensor:
    """Loss of predicting the next token from logits (B, T, V); ``labels`` as ``next_token_targets`` reads them.

    Shifting the labels, not the logits, avoids copying the (B, T, V) logits.
    """
    return token_cross_entropy(logits, next_token_targets(labels, logits.shape[1]), label_smoothing, reduction)


HEAD_LOSS_CHUNK_FLOATS = 2**23  # logits ``head_loss`` holds at once: 32 MiB of float32, or
HEAD_LOSS_MIN_ROWS = 256  # positions, if more: fewer multiply slower (benchmarks/head_loss.py)
# A trained head's logits are held whole up to this many (1 GiB of float32): its weight's gradient, summed over
# pieces, makes them slower (GPT-2's head over 1,024 positions in pieces of 256: 1.16x, a frozen one's 1.05x:
# benchmarks/head_loss.py), but past it memory counts more
HEAD_LOSS_WHOLE_FLOATS = 2**28


def head_loss(head: Callable[[Tensor], Tensor], parameters: Iterable[Tensor], hidden: Tensor, targets: Tensor,
              vocab_size: int, label_smoothing: float = 0.0, reduction: Reduction = "mean") -> Tensor:
    """``token_cross_entropy(head(hidden), targets)`` without the logits (N, V) held whole: ``head`` (the model's
    output projection, its soft cap included) runs on a few positions of hidden (..., D) at a time, and where a
    gradient is wanted each piece's gradients (the positions' and those of the trained ``parameters`` the head
    reads) are taken at once, so no piece's logits outlive it. The memory of the logits, their
    log-probabilities and their gradient (three (N, V) tensors, the largest activations of a language model's
    training step) becomes a piece's; the work is the same products. A head whose weight trains is run whole up
    to ``HEAD_LOSS_WHOLE_FLOATS`` logits (faster there); adapters over a frozen head train in pieces. ``"mean"``
    or ``"sum"``; the gradient can be taken once (no ``retain_graph``)."""
    if reduction == "none":
        raise ValueError("head_loss gives a mean or a sum (reduction='none' needs the logits: token_cross_entropy)")
    _check_reduction(reduction)
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)  # (N, D), (N,)
    rows = max(HEAD_LOSS_MIN_ROWS, HEAD_LOSS_CHUNK_FLOATS // vocab_size)
    trained = [parameter for parameter in parameters if parameter.requires_grad]
    gradients = torch.is_grad_enabled() and (hidden.requires_grad or bool(trained))
    # the head's weight trains (not only low-rank adapters over it, whose gradients are small to sum)
    weight_trains = any(parameter.numel() >= vocab_size * hidden.shape[-1] for parameter in trained)
    if gradients and weight_trains and len(targets) * vocab_size <= HEAD_LOSS_WHOLE_FLOATS:
        total = token_cross_entropy(head(hidden), targets, label_smoothing, "sum")  # whole: see above
    else:
        with reused_weights:  # a quantized head's float weight made once for every piece, not once a piece
            if gradients:
                total = _PiecewiseHeadLoss.apply(hidden, targets, head, rows, label_smoothing, *trained)
            else:
                total = sum(token_cross_entropy(head(hidden[start:start + rows]), targets[start:start + rows],
                                                label_smoothing, "sum") for start in range(0, len(targets), rows))
    if reduction == "sum":
        return total
    warn_if_no_targets(targets, IGNORE_INDEX)
    return total / (targets != IGNORE_INDEX).sum()


class _PiecewiseHeadLoss(torch.autograd.Function):
    """``head_loss``'s summed loss with its gradients taken piece by piece in the forward pass and kept (the
    hidden states' (N, D) and the trained head parameters'), the backward pass scaling them: the pieces' logits
    are gone by then."""

    @staticmethod
    def forward(ctx, hidden: Tensor, targets: Tensor, head: Callable[[Tensor], Tensor], rows: int,
                label_smoothing: float, *trained: Tensor) -> Tensor:
        total = hidden.new_zeros((), dtype=torch.float32)
        hidden_grad = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        trained_grads: list[Tensor | None] = [None] * len(trained)
        for start in range(0, len(targets), rows):
            with torch.enable_grad():
                piece = hidden[start:start + rows].detach().requires_grad_(hidden_grad is not None)
                loss = token_cross_entropy(head(piece), targets[start:start + rows], label_smoothing, "sum")
                wanted = [piece] * (hidden_grad is not None) + list(trained)
                grads = list(torch.autograd.grad(loss, wanted, allow_unused=True))
            total += loss.detach()
            if hidden_grad is not None:
                hidden_grad[start:start + rows] = grads.pop(0)
            for index, grad in enumerate(grads):
                if grad is not None:
                    trained_grads[index] = grad if trained_grads[index] is None else trained_grads[index].add_(grad)
        ctx.hidden_grad, ctx.trained_grads = hidden_grad, trained_grads
        return total

    @staticmethod
    def backward(ctx, grad: Tensor):
        if ctx.trained_grads is None:
            raise RuntimeError("head_loss's gradient was taken once already; it cannot be taken again (retain_graph)")
        kept = (ctx.hidden_grad, *ctx.trained_grads)
        ctx.hidden_grad = ctx.trained_grads = None  # freed with this pass, not with the graph
        scaled = [None if each is None else each * grad.to(each.dtype) for each in kept]
        return scaled[0], None, None, None, None, *scaled[1:]


def _per_example(loss: Callable[..., Tensor], predictions: Tensor, targets: Tensor, reduction: str) -> Tensor:
    """An elementwise loss reduced as ``reduction`` says, an example being a row: ``"none"`` gives (B,), the
    mean over a row's outputs; ``"sum"`` adds those; ``"mean"`` is the mean over every element."""
    if reduction == "mean":
        return loss(predictions, targets)
    losses = loss(predictions, targets, reduction="none")
    if losses.dim() > 1:
        losses = losses.mean(dim=-1)  # (B, L) -> (B,)
    return losses if reduction == "none" else losses.sum()


def sequence_classification_loss(logits: Tensor, labels: Tensor, problem_type: str | None,
                                 reduction: Reduction = "mean") -> Tensor:
    """Loss of logits (B, L) against ``labels`` as Hugging Face's ``problem_type`` says: regression
    (mean squared error; labels (B,) for one output, else (B, L)), single-label classification
    (cross-entropy against class ids (B,)), multi-label classification (binary cross-entropy with
    logits against (B, L) targets in [0, 1]). None infers it as HF does: regression for one output,
    single-label for integer labels, multi-label otherwise. ``"none"``: one loss per example (B,)."""
    _check_reduction(reduction)
    num_labels = logits.shape[-1]
    if problem_type is None:
        if num_labels == 1:
            problem_type = "regression"
        elif not labels.is_floating_point():
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    if problem_type == "regression":
        if num_labels == 1:
            return _per_example(F.mse_loss, logits.squeeze(-1).float(), labels.reshape(-1).float(), reduction)
        return _per_example(F.mse_loss, logits.float(), labels.float(), reduction)
    if problem_type == "single_label_classification":
        return token_cross_entropy(logits, labels, reduction=reduction)
    if problem_type == "multi_label_classification":
        return _per_example(F.binary_cross_entropy_with_logits, logits.float(), labels.float(), reduction)
    raise ValueError(f"problem_type={problem_type!r} is not one of single_label_classification, "
                     "multi_label_classification, regression")


def span_loss(start_logits: Tensor, end_logits: Tensor, start_positions: Tensor, end_positions: Tensor,
              attention_mask: Tensor | None = None, reduction: Reduction = "mean") -> Tensor:
    """Extractive question answering: the mean of the start and end cross-entropies over logits (B, T).

    With ``attention_mask`` (B, T) (1 = a real token) the softmax runs over each row's own tokens, so a
    row's loss does not depend on how much its batch is padded; without it, over all T positions, as
    Hugging Face's loss does. Positions (B,) outside the sequence (at T or beyond, or on padding) are
    ignored, as HF ignores positions past the end (a window whose answer was cut off); a batch where
    every position is ignored gives NaN, as HF's does. ``"none"``: each row's (start + end) / 2 (B,),
    an ignored position counting 0; ``"sum"``: their sum."""
    _check_reduction(reduction)
    length = start_logits.shape[-1]
    start_logits, end_logits = start_logits.float(), end_logits.float()  # (B, T)
    start_positions = start_positions.reshape(-1).clamp(0, length)
    end_positions = end_positions.reshape(-1).clamp(0, length)
    if attention_mask is not None:
        padding = attention_mask == 0  # (B, T)
        start_logits = start_logits.masked_fill(padding, -math.inf)
        end_logits = end_logits.masked_fill(padding, -math.inf)
        outside = torch.cat([padding, padding.new_ones(padding.shape[0], 1)], dim=1)  # (B, T + 1): T is outside
        start_positions = start_positions.masked_fill(outside.gather(1, start_positions[:, None])[:, 0], length)
        end_positions = end_positions.masked_fill(outside.gather(1, end_positions[:, None])[:, 0], length)
    each = "none" if reduction == "sum" else reduction
    start = F.cross_entropy(start_logits, start_positions, ignore_index=length, reduction=each)
    end = F.cross_entropy(end_logits, end_positions, ignore_index=length, reduction=each)
    losses = (start + end) / 2
    return losses.sum() if reduction == "sum" else losses


def ctc_frames_needed(targets: Tensor) -> Tensor:
    """The fewest frames a CTC alignment of each row of targets (B, T) (IGNORE_INDEX past its end) needs: one
    a token, and a blank between two equal neighbours. (B,)"""
    real = targets != IGNORE_INDEX
    repeats = (targets[:, 1:] == targets[:, :-1]) & real[:, 1:]
    return real.sum(dim=1) + repeats.sum(dim=1)


def ctc_loss(logits: Tensor, targets: Tensor, blank: int, reduction: Reduction = "mean") -> Tensor:
    """Connectionist temporal classification (Graves et al. 2006): the negative log-probability, under frame
    logits (B, S, C), of every path over the S frames that reads as a row of targets (B, T) once repeats are
    merged and ``blank`` dropped. Every row reads all S frames; targets end at their first IGNORE_INDEX.

    ``"none"``: each row's loss over its target count (B,) (an empty row: its loss); ``"mean"``: their mean
    (PyTorch's and ESPnet's convention); ``"sum"``: their sum. A row that cannot align (fewer frames than
    ``ctc_frames_needed``) is a ValueError, not an infinite loss."""
    _check_reduction(reduction)
    frames = logits.shape[1]
    needed = ctc_frames_needed(targets)  # (B,)
    if bool((needed > frames).any()):
        raise ValueError(f"a CTC target needs {int(needed.max())} frames (a token each, a blank between repeats); "
                         f"the logits have {frames}")
    lengths = (targets != IGNORE_INDEX).sum(dim=1)  # (B,)
    log_probs = F.log_softmax(logits.float(), dim=-1).transpose(0, 1)  # (S, B, C)
    losses = F.ctc_loss(log_probs, targets.clamp(min=0), torch.full_like(lengths, frames), lengths, blank=blank,
                        reduction="none") / lengths.clamp(min=1)  # (B,)
    return losses if reduction == "none" else losses.sum() if reduction == "sum" else losses.mean()
