"""How llama.cpp lays out a decoder in a GGUF file, next to Hugging Face's names (which tformer's families map).

GGUF names tensors ``token_embd.weight``, ``blk.N.attn_q.weight``, ... (gguf's ``TENSOR_NAMES``), keys its
hyperparameters by architecture (``llama.embedding_length``, ...), and for the ``llama`` architecture stores the
query and key rows permuted: ``convert_hf_to_gguf.py`` interleaves each head's two rotary halves, because
llama.cpp's ``llama`` rotation pairs adjacent dimensions (GPT-J style) where Hugging Face's ``rotate_half`` pairs
dimension i with i + head_dim / 2. ``qwen2`` uses llama.cpp's NeoX rotation (the halves), so its rows are not
permuted. The GGUF <-> HF maps here let the readers and writers reuse the Hugging Face families' weight maps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"

# GGUF tensor name -> Hugging Face tensor name (LlamaForCausalLM's and Qwen2ForCausalLM's), per layer with {i}.
_TOP_LEVEL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_PER_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_HF_TOP_LEVEL = {hf: gguf for gguf, hf in _TOP_LEVEL.items()}
_HF_PER_LAYER = {hf: gguf for gguf, hf in _PER_LAYER.items()}
_GGUF_LAYER = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_GGUF_TOP = re.compile(r"^(\w+)\.(weight|bias)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_HF_TOP = re.compile(r"^(.+)\.(weight|bias)$")


@dataclass(frozen=True)
class Architecture:
    """One GGUF ``general.architecture`` tformer reads and writes: the Hugging Face family that holds it and
    whether its query/key rows are stored permuted for llama.cpp's adjacent-pair rotation."""

    name: str
    model_type: str
    permuted_qk: bool


ARCHITECTURES = {
    "llama": Architecture("llama", "llama", permuted_qk=True),  # Llama 1-3, Mistral 7B (converted as llama)
    "qwen2": Architecture("qwen2", "qwen2", permuted_qk=False),
}
# A tformer family written as which GGUF architecture (a Mistral folder without a window is a Llama to llama.cpp).
ARCHITECTURE_OF_MODEL_TYPE = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor name, or None for a tensor tformer does not map."""
    match = _GGUF_LAYER.match(gguf_name)
    if match:
        layer, module, kind = match.groups()
        return f"model.layers.{layer}.{_PER_LAYER[module]}.{kind}" if module in _PER_LAYER else None
    match = _GGUF_TOP.match(gguf_name)
    if match and match.group(1) in _TOP_LEVEL:
        return f"{_TOP_LEVEL[match.group(1)]}.{match.group(2)}"
    return None


def gguf_name(hf: str) -> str:
    """The GGUF name of a Hugging Face tensor name (one ``hf_name`` maps); KeyError for another."""
    match = _HF_LAYER.match(hf)
    if match:
        layer, module, kind = match.groups()
        return f"blk.{layer}.{_HF_PER_LAYER[module]}.{kind}"
    match = _HF_TOP.match(hf)
    if match and match.group(1) in _HF_TOP_LEVEL:
        return f"{_HF_TOP_LEVEL[match.group(1)]}.{match.group(2)}"
    raise KeyError(hf)


def permute_qk(rows: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face's query/key rows (or biases) in llama.cpp's order: within each head, row j of the first half
    and row j of the second half become rows 2j and 2j + 1 (``convert_hf_to_gguf.py``'s ``permute``)."""
    per_head = rows.shape[0] // heads
    return rows.reshape(heads, 2, per_head // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def unpermute_qk(rows: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of ``permute_qk``: llama.cpp's interleaved rotary rows back in Hugging Face's halves."""
    per_head = rows.shape[0] // heads
    return rows.reshape(heads, per_head // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def qk_heads(hf: str, num_heads: int, num_kv_heads: int) -> int | None:
    """How many heads the rows of HF tensor ``hf`` hold if it is a query or key projection (its rows are
    permuted in a ``llama`` GGUF), else None."""
    if ".self_attn.q_proj." in hf:
        return num_heads
    if ".self_attn.k_proj." in hf:
        return num_kv_heads
    return None


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a file that begins as a GGUF file does (or is named ``*.gguf``); needs no gguf package."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as file:
        return file.read(len(GGUF_MAGIC)) == GGUF_MAGIC or path.suffix == GGUF_SUFFIX
