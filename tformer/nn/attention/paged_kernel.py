"""Paged decode attention in place: each decoding sequence's attention computed over its keys and values where
they sit in the block pool, instead of gathering every context into one padded batch for the model's kernel
(``paged.py``) at every layer of every step. Two readers: on the CPU a small C++ kernel
(``nn/kernels/paged_decode.cpp``, one of the compiled CPU kernels, ``nn/compiled.py``: built once per machine);
on a CUDA GPU FlexAttention over the whole pool, each sequence a batch row of one query whose block mask lists
the pool's tiles holding its blocks (``paged_block_mask``), so the fused kernel reads only those.

Either computes plain softmax attention at the default scale over all of a sequence's keys, which is what
a kernel declaring ``reads_pages`` computes for one query at the end of its context: so it serves a
model whose every attention kernel declares it and whose positions add no bias to the scores; other
models decode by the gather.

Modes (``Engine(paged_attention=...)``, ``tformer serve --paged-attention``): ``auto`` reads in place
on the CPU where the model and the machine allow it and gathers elsewhere, saying which (on a GPU the engine's
decode-only steps are captured as CUDA graphs over the gather, which the FlexAttention read is not: that one is
asked for by name); ``in-place`` refuses a model or device it cannot serve (fail closed); ``gather`` always
gathers.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tformer.errors import TformerError
from tformer.nn.attention.flex import BlockMask, flex_available, flex_for
from tformer.nn.compiled import CompiledKernelError, load
from tformer.nn.positions import POSITIONAL_SCHEMES

MODES = ("auto", "in-place", "gather")
READERS = {"cpu": "kernel", "cuda": "flex"}  # device type -> what reads the pool in place there
DTYPES = {"kernel": (torch.float32, torch.bfloat16, torch.float16, torch.float64),
          "flex": (torch.float32, torch.bfloat16, torch.float16)}
TILE = 128  # FlexAttention's block of keys (and of queries): the granularity of its block mask


class PagedKernelError(TformerError):
    """The in-place kernel was asked for and cannot serve (the model, the device, or no compiler)."""


def model_problem(model: nn.Module) -> str | None:
    """Why no in-place reader can decode ``model`` on its device, or None (the C++ build aside, see ``load``)."""
    parameter = next(model.parameters())
    reader = READERS.get(parameter.device.type)
    if reader is None:
        return f"it reads the pool on the CPU or a CUDA GPU, and the model is on {parameter.device.type}"
    if reader == "flex" and not flex_available():
        return "FlexAttention needs PyTorch >= 2.5"
    if parameter.dtype not in DTYPES[reader]:
        names = ", ".join(str(dtype).removeprefix("torch.") for dtype in DTYPES[reader])
        return f"it computes {names} on {parameter.device.type}, not {parameter.dtype}"
    kernels = [module.kernel for module in model.modules() if hasattr(module, "kernel")
               and hasattr(module, "num_kv_heads")]
    other = sorted({kernel.name for kernel in kernels if not type(kernel).reads_pages})
    if other:
        return f"attention_kernel={other[0]!r} is not plain softmax attention over the whole context"
    if any(not kernel.reads_pages for kernel in kernels):  # a cap on the scores, or another scale
        return "its attention caps the scores (attention_softcap) or scales them otherwise (query_pre_attn_scalar)"
    positional = model.config.positional
    if POSITIONAL_SCHEMES[positional].adds_bias:
        return f"positional={positional!r} adds a bias to the scores"
    return None


def resolve(mode: str, model: nn.Module) -> tuple[str | None, str]:
    """The reader the engine reads the pool in place with for ``mode`` ("kernel", "flex"; None: it gathers), and
    a line saying what it does and why."""
    if mode not in MODES:
        raise PagedKernelError(f"paged_attention={mode!r} must be one of {', '.join(MODES)}")
    if mode == "gather":
        return None, "paged attention: gather (asked for)"
    problem = model_problem(model)
    reader = READERS.get(next(model.parameters()).device.type)
    if problem is None and reader == "kernel":
        try:
            load()
        except CompiledKernelError as error:
            problem = str(error)
    if problem is None and reader == "flex" and mode == "auto":
        return None, ("paged attention: gather (the decode-only steps are captured over it; 'in-place' reads the "
                      "pool through FlexAttention, uncaptured)")
    if problem is None:
        return reader, f"paged attention: in place ({'FlexAttention' if reader == 'flex' else 'the C++ kernel'})"
    if mode == "in-place":
        raise PagedKernelError(f"paged_attention='in-place' cannot serve this model: {problem}")
    return None, f"paged attention: gather ({problem})"


def paged_decode(queries: Tensor, keys: Tensor, values: Tensor, context: Tensor, offsets: Tensor) -> Tensor:
    """queries (B, H, Dh) one per decoding sequence; keys and values (slots, Hkv, Dh) one layer's pool;
    ``context`` (N,) the pool rows of every sequence's keys in order, sequence after sequence, ``offsets``
    (B + 1,) where each sequence's rows start. Softmax attention per sequence and head -> (B, H, Dh)."""
    return load().paged_decode(queries.contiguous(), keys, values, context, offsets, queries.shape[-1] ** -0.5)


def paged_block_mask(context: Tensor, offsets: Tensor, block_size: int, slots: int) -> BlockMask:
    """The pool rows each decoding sequence reads, as FlexAttention's mask over a pool of ``slots`` rows in blocks of
    ``block_size``: sequence b (a batch row of one query) sees row s when s's block holds more than s's offset in
    it of b's tokens, since a sequence fills each of its blocks from the start (``serving.block_pool``: a shared
    block is full, a sequence's last block its own); its tiles of ``TILE`` rows are those holding any of its rows.
    ``context`` and ``offsets`` as ``paged_decode``'s. Built on the device with no read back to the host, once
    a step for every layer."""
    sequences, device = offsets.numel() - 1, context.device
    owner = torch.repeat_interleave(torch.arange(sequences, device=device), offsets.diff(),
                                    output_size=context.numel())  # (N,) the sequence of each row of context
    blocks, tiles = -(-slots // block_size), -(-slots // TILE)
    held = torch.zeros(sequences * blocks, dtype=torch.int32, device=device)
    held.index_add_(0, owner * blocks + context // block_size, torch.ones_like(context, dtype=torch.int32))
    held = held.view(sequences, blocks)  # (B, blocks) how many of each block's rows the sequence holds
    used = torch.zeros(sequences * tiles, dtype=torch.uint8, device=device)
    used[owner * tiles + context // TILE] = 1
    used = used.view(sequences, tiles)  # (B, tiles)
    count = used.sum(-1, dtype=torch.int32)
    order = torch.argsort(1 - used, dim=-1, stable=True).to(torch.int32)  # (B, tiles) the used tiles first

    def reads(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx % block_size < held[b, kv_idx // block_size]

    return BlockMask.from_kv_blocks(count[:, None, None], order[:, None, None], BLOCK_SIZE=(TILE, TILE),
                                    mask_mod=reads, seq_lengths=(1, slots), compute_q_blocks=False)


def flex_paged_decode(queries: Tensor, keys: Tensor, values: Tensor, block_mask: BlockMask) -> Tensor:
    """``paged_decode`` through FlexAttention: queries (B, H, Dh) over the pool's keys and values (slots, Hkv, Dh)
    as one batch row every sequence shares, read where they are under ``block_mask`` (``paged_block_mask``)."""
    pooled_keys, pooled_values = keys.transpose(0, 1)[None], values.transpose(0, 1)[None]  # (1, Hkv, slots, Dh)
    out = flex_for(queries.device)(queries[:, :, None], pooled_keys, pooled_values, block_mask=block_mask,
                                   enable_gqa=keys.shape[1] != queries.shape[1])
    return out[:, :, 0]  # (B, H, Dh)
