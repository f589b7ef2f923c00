"""The engine's decode-only steps captured as CUDA graphs (issue 58): a step in which every running sequence adds one
token is laid out at a fixed shape, its rows rounded up to a power of two and its contexts to a multiple of
``LENGTH_MULTIPLE`` slots (``PagedLayout.decoding``: the padded rows read and write one slot no sequence holds), and
run through the model's step compiled once and replayed per shape, as vLLM captures one graph per batch size. A
GPU step of a small model is launch-bound: a graph is one launch where the eager step is hundreds.

Where it applies: a device that ``generation.session.STEP_COMPILERS`` names (CUDA), a decoder reading its paged
cache by gathering (an in-place read, the CPU's kernel or a GPU's FlexAttention, is not captured), no running-state
layer and no adapters; and a step in which no sequence starts. Any other step runs as before.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from tformer.generation.session import STEP_COMPILERS, rounded_up
from tformer.nn.attention.paged import PagedLayout
from tformer.serving.block_pool import BlockPool
from tformer.serving.scheduler import StepBatch

LENGTH_MULTIPLE = 256  # a captured step's contexts hold a multiple of this many slots


def decode_step(model, caches: list, input_ids: Tensor, layout: PagedLayout) -> Tensor:
    """The model's step over a decode-only layout: logits (rows, V). What is compiled and captured."""
    return model.step(input_ids, layout, caches)[0]


class CapturedDecode:
    """The engine's captured decode-only steps: ``make`` says whether they apply, ``takes`` whether a step is one,
    ``step`` runs it."""

    def __init__(self, model, caches: list, pool: BlockPool, device: torch.device,
                 compiled: Callable[..., Tensor]) -> None:
        self.model, self.caches, self.device, self.compiled = model, caches, device, compiled
        self.steps = 0  # steps run through the captured graphs
        pool.reserve(1)
        self.filler_slot = pool.allocate() * pool.block_size  # held for good: the padded rows' slot
        for cache in caches:  # the pool keeps its addresses: a graph writes it in place
            torch._dynamo.mark_static_address(cache.self_attention.keys)
            torch._dynamo.mark_static_address(cache.self_attention.values)

    @classmethod
    def make(cls, model, caches: list, pool: BlockPool, device: torch.device, *, in_place: str | None,
             keeps_states: bool, adapters: bool) -> CapturedDecode | None:
        """The engine's captured steps, or None where they do not apply (see the module's docstring)."""
        compiler = STEP_COMPILERS.get(device.type)
        if compiler is None or in_place or keeps_states or adapters or model.encodes_prompt:
            return None
        return cls(model, caches, pool, device, compiler(decode_step))

    @staticmethod
    def takes(batch: StepBatch, admitted: set[int]) -> bool:
        """Whether the step is decode-only: no sequence starts (nor has its prompt scored), each adds one token."""
        return not admitted and len(batch.input_ids) == len(batch.tables)

    def step(self, batch: StepBatch, input_ids: Tensor | None = None) -> Tensor:
        """Logits (N, V) of the step's N sequences, through the captured step of their shape; their tokens
        ``input_ids`` (N,) on the device where given (a step launched from the last one's), else the batch's."""
        count = len(batch.tables)
        rows = 1 << (count - 1).bit_length()  # the next power of two
        length = rounded_up(max(table.length for table in batch.tables), LENGTH_MULTIPLE)
        layout = PagedLayout.decoding(batch.tables, self.device, rows, length, self.filler_slot)
        if input_ids is None:
            input_ids = torch.tensor(batch.input_ids, device=self.device)
        input_ids = torch.cat([input_ids, input_ids.new_zeros(rows - count)])[None]  # (1, rows)
        torch.compiler.cudagraph_mark_step_begin()
        with self.model.stepping:
            logits = self.compiled(self.model, self.caches, input_ids, layout)
        self.steps += 1
        return logits[:count].clone()  # a replay overwrites the graph's output
