"""What an attention kernel is: one class in its own file, listed by name in ``registry.py``.

A kernel computes attention from queries (B, H, Tq, Dh), keys and values (B, Hkv, Tk, Dh), Hkv
dividing H, and the pass's ``AttentionMask``; it returns (B, H, Tq, Dh), and the weights
(B, H, Tq, Tk) when they are asked for and it has them. A query that sees no key gets zeros.
It declares what it honours, so configs and callers ask it instead of comparing names:

- ``exact``: it computes softmax attention itself (the same function as ``sdpa``); Hugging Face
  export and the parity tests take only these.
- ``dropout``: attention dropout (training); ``weights``: it can return the weights;
  ``position_bias``: additive position biases (ALiBi, relative buckets); ``segments``: it keeps the
  examples packed into a row apart (the mask's ``segments``: it reads the mask's dense form).
- ``softcap``: it forms the scores and can cap them, ``cap * tanh(scores / cap)`` before the mask and
  softmax (``attention_softcap``, Gemma 2); ``custom_scale``: it scales the scores by another factor than
  head_dim**-0.5 (``query_pre_attn_scalar``). A kernel made with either that lacks it refuses, naming both.
- ``reads_pages``: one query at the end of its context attends with plain softmax at the default scale
  over every key it is given, so the serving engine may compute its decode steps with the in-place
  paged kernel (``paged_kernel.py``) instead of calling it on gathered contexts (an instance with a cap or
  another scale does not).
- ``trains_on_cpu``: it has a backward pass on the CPU (FlexAttention has none there; the Trainer refuses such
  a kernel on the CPU before the first step). ``gpu_flex``: on CUDA it sends the passes whose mask the fused sdpa
  kernel cannot take natively (a position bias, packed examples, a cap, a window) through FlexAttention
  (``flex.py``); the CPU path is unchanged.
- ``fields``: the ModelConfig fields it reads (any other kernel refuses them away from their
  defaults), checked by ``config_problem``.
- ``new_cache``: the cache backend a layer decodes with (``cache.py``); the backend says whether it can
  forget its last tokens (``rewindable``: speculative decoding needs it). ``cache_spec``: what that cache keeps,
  declared (``cache_spec.py``), which the serving engine allocates from.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from tformer.nn.attention.cache import KVCache
from tformer.nn.attention.cache_spec import CacheSpec, CrossAttention, FullAttention
from tformer.nn.attention.mask import AttentionMask


class AttentionKernel:
    """The base of every kernel: the defaults of an exact kernel that decodes over a dense cache."""

    name: ClassVar[str]
    exact: ClassVar[bool] = True
    dropout: ClassVar[bool] = False
    weights: ClassVar[bool] = True
    position_bias: ClassVar[bool] = True
    segments: ClassVar[bool] = False
    softcap: ClassVar[bool] = False
    custom_scale: ClassVar[bool] = True
    trains_on_cpu: ClassVar[bool] = True
    gpu_flex: ClassVar[bool] = False
    reads_pages: bool = False  # a class's default; an instance with a cap or another scale reads no pages
    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, head_dim: int, cross: bool = False, *, scale: float | None = None,
                 softcap: float | None = None, **settings: Any) -> None:
        unknown = sorted(set(settings) - set(self.fields))
        if unknown:
            raise ValueError(f"attention kernel {self.name!r} reads {', '.join(self.fields) or 'no settings'}; "
                             f"got {', '.join(unknown)}")
        for asked, able in ((f"attention_softcap={softcap!r}", softcap is None or self.softcap),
                            (f"a scale of {scale!r} (query_pre_attn_scalar)", scale is None or self.custom_scale)):
            if not able:
                raise ValueError(f"attention_kernel={self.name!r} does not support {asked}")
        self.head_dim = head_dim
        self.cross = cross
        self.scale = scale  # the scores' factor; None: head_dim**-0.5, as each path computes it by default
        self.cap = softcap  # scores capped to cap * tanh(scores / cap); None: not capped
        if scale is not None or softcap is not None:
            self.reads_pages = False

    @classmethod
    def config_problem(cls, config: Any) -> str | None:
        """Why ``config``'s values of this kernel's fields cannot be used, or None."""
        return None

    def modules(self) -> dict[str, nn.Module]:
        """Modules holding this kernel's state (parameters, buffers), registered on the attention layer under
        these names; none by default."""
        return {}

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, *, dropout_p: float = 0.0,
                 need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    def new_cache(self, batch_size: int, num_kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                  device: torch.device) -> Any:
        """The self-attention cache a layer with this kernel decodes over, for up to ``max_len`` positions."""
        return KVCache(batch_size, num_kv_heads, max_len, head_dim, dtype, device)

    def cache_spec(self, num_kv_heads: int, head_dim: int) -> CacheSpec:
        """What this layer keeps between decoding steps: every position's keys and values (the encoder's, once, for
        cross-attention)."""
        return (CrossAttention if self.cross else FullAttention)(num_kv_heads, head_dim)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
