"""Reading a GGUF file (llama.cpp's format): its metadata as a ModelConfig, its tensors dequantized to float.

The metadata (``llama.embedding_length``, ``llama.attention.head_count_kv``, ...) is translated into the
config.json a Hugging Face folder of the same model would hold, and read by that family (``LlamaFamily``,
``Qwen2Family``), so a GGUF file is refused for exactly what a folder would be. Tensors are dequantized with
gguf's own functions (``gguf.quants.dequantize``: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, the K-quants,
the i-quants), renamed to Hugging Face's names, and the ``llama`` architecture's query/key rows un-permuted;
the family's weight map then puts them in the model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf import quants as gguf_quants

from tformer.checkpoint import CheckpointError
from tformer.config import ModelConfig
from tformer.errors import TformerError
from tformer.interop.families import family_for_model_type
from tformer.interop.family import Family
from tformer.interop.gguf_layout import ARCHITECTURES, Architecture, hf_name, qk_heads, unpermute_qk
from tformer.interop.gguf_tokenizer import tokenizer_from_gguf
from tformer.tokenizers import Tokenizer

# Integer tensor types hold no weights of a decoder; the others are dequantized by gguf (or named when it cannot).
_NOT_WEIGHTS = {GGMLQuantizationType.I8, GGMLQuantizationType.I16, GGMLQuantizationType.I32,
                GGMLQuantizationType.I64}
ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+'s rotary frequency divisors (its rope_scaling "llama3", as a tensor)
_REQUIRED = ("embedding_length", "block_count", "feed_forward_length", "attention.head_count")
# Keys of variants tformer does not read from GGUF (an unknown rotary or window variant must not be ignored).
_REFUSED = ("expert_count", "attention.sliding_window", "rope.scaling.attn_factor", "rope.scaling.yarn_log_multiplier",
            "rope.scaling.yarn_ext_factor", "rope.scaling.yarn_attn_factor", "attention.key_length_mla",
            "rope.dimension_sections")


@dataclass
class GGUFCheckpoint:
    """A GGUF file read: its architecture, the Hugging Face family and ModelConfig of its metadata, its tensors
    (still as stored), and its tokenizer (None, with ``tokenizer_problem`` saying why, where it has none tformer
    reads)."""

    path: Path
    architecture: Architecture
    family: Family
    config: ModelConfig
    tensors: Mapping[str, Any]  # GGUF name -> gguf ReaderTensor
    tokenizer: Tokenizer | None
    tokenizer_problem: str | None
    tensor_types: Mapping[str, str]  # GGUF name -> its stored type's name (F32, Q8_0, ...)


def read_gguf(path: str | Path) -> GGUFCheckpoint:
    """The GGUF file at ``path`` read (the tensors memory-mapped, not yet dequantized); CheckpointError in one
    line naming what tformer cannot read (the file, its architecture, a metadata key, a rotary variant)."""
    path = Path(path)
    try:
        reader = GGUFReader(path)
        fields = {name: _shortest(field.contents()) for name, field in reader.fields.items()
                  if not name.startswith("GGUF.")}
    except (OSError, ValueError, KeyError, IndexError, TypeError) as error:
        raise CheckpointError(f"{path}: not a readable GGUF file ({error})") from None
    name = fields.get("general.architecture")
    if name not in ARCHITECTURES:
        raise CheckpointError(f"{path}: general.architecture={name!r} is not read by tformer (supported: "
                              f"{', '.join(ARCHITECTURES)})")
    architecture = ARCHITECTURES[name]
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    family = family_for_model_type(architecture.model_type)
    try:
        raw = hf_config_of(architecture.name, fields, tensors)
        config = family.config_from_hf(raw)
    except (TformerError, TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: {error}") from None
    tokenizer, problem = tokenizer_from_gguf(fields)
    types = {tensor_name: tensor.tensor_type.name for tensor_name, tensor in tensors.items()}
    return GGUFCheckpoint(path, architecture, family, config, tensors, tokenizer, problem, types)


def _shortest(value: Any) -> Any:
    """A float32 metadata value as the shortest decimal that is the same float32 (1e-05, not
    9.999999747378752e-06: GGUF stores float32, and a config holds the value its author wrote)."""
    if isinstance(value, float):
        return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))
    return value


def hf_config_of(arch: str, fields: Mapping[str, Any], tensors: Mapping[str, Any]) -> dict[str, Any]:
    """The config.json a Hugging Face folder of this GGUF file's model would hold."""
    def key(name: str, default: Any = None) -> Any:
        return fields.get(f"{arch}.{name}", default)

    missing = [f"{arch}.{name}" for name in _REQUIRED if key(name) is None]
    if missing:
        raise CheckpointError(f"the GGUF metadata lacks {', '.join(missing)}")
    refused = [f"{arch}.{name}={key(name)!r}" for name in _REFUSED if key(name) is not None]
    if refused:
        raise CheckpointError(f"{', '.join(refused)} is not read by tformer from GGUF")
    heads = key("attention.head_count")
    d_model = key("embedding_length")
    head_dim = key("attention.key_length", d_model // heads)
    if key("attention.value_length", head_dim) != head_dim:
        raise CheckpointError(f"{arch}.attention.value_length={key('attention.value_length')} differs from "
                              f"{arch}.attention.key_length={head_dim} (tformer's heads have one width)")
    rotary = key("rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise CheckpointError(f"{arch}.rope.dimension_count={rotary} rotates part of each head of {head_dim} "
                              "(not read from GGUF)")
    tokens = fields.get("tokenizer.ggml.tokens")
    embedding = tensors.get("token_embd.weight")
    vocab_size = key("vocab_size") or (len(tokens) if tokens else None) or (
        int(embedding.shape[1]) if embedding is not None else None)
    raw = {
        "model_type": ARCHITECTURES[arch].model_type, "vocab_size": vocab_size,
        "max_position_embeddings": key("context_length", 2048), "hidden_size": d_model,
        "num_hidden_layers": key("block_count"), "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads), "intermediate_size": key("feed_forward_length"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-5), "rope_theta": key("rope.freq_base", 10000.0),
        "rope_scaling": rope_scaling_of(arch, fields, tensors, head_dim), "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": fields.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": fields.get("tokenizer.ggml.padding_token_id"),
    }
    if head_dim != d_model // heads:
        raw["head_dim"] = head_dim
    if arch == "llama":
        raw["attention_bias"] = "blk.0.attn_q.bias" in tensors
        raw["mlp_bias"] = "blk.0.ffn_gate.bias" in tensors
    return raw


def rope_scaling_of(arch: str, fields: Mapping[str, Any], tensors: Mapping[str, Any],
                    head_dim: int) -> dict[str, Any] | None:
    """config.json's ``rope_scaling`` of the GGUF rotary keys: ``linear`` and ``yarn`` from
    ``rope.scaling.*``, Llama 3's ``llama3`` from its ``rope_freqs.weight`` table (when it is the table
    ``convert_hf_to_gguf.py`` makes of low_freq_factor 1, high_freq_factor 4); other types refused."""
    kind = fields.get(f"{arch}.rope.scaling.type", "none")
    factor = fields.get(f"{arch}.rope.scaling.factor")
    original = fields.get(f"{arch}.rope.scaling.original_context_length")
    if ROPE_FREQS in tensors:
        if kind not in ("none", None):
            raise CheckpointError(f"{arch}.rope.scaling.type={kind!r} together with {ROPE_FREQS}")
        table = np.asarray(gguf_quants.dequantize(tensors[ROPE_FREQS].data, tensors[ROPE_FREQS].tensor_type))
        return llama3_scaling(table.reshape(-1), float(fields.get(f"{arch}.rope.freq_base", 10000.0)), head_dim,
                              original)
    if kind in ("none", None) or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        scaling = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": original}
        for name in ("beta_fast", "beta_slow"):
            value = fields.get(f"{arch}.rope.scaling.yarn_{name}")
            if value is not None:
                scaling[name] = float(value)
        return scaling
    raise CheckpointError(f"{arch}.rope.scaling.type={kind!r} is not read by tformer from GGUF (read: none, linear, "
                          "yarn, and llama3 as a rope_freqs table)")


def llama3_divisors(theta: float, head_dim: int, factor: float, low: float, high: float, original: int) -> np.ndarray:
    """The ``rope_freqs`` table ``convert_hf_to_gguf.py`` writes for Llama 3's scaling: each frequency's divisor."""
    divisors = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * math.pi * theta ** (i / head_dim)
        if wavelength < original / high:
            divisors.append(1.0)
        elif wavelength > original / low:
            divisors.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(divisors, dtype=np.float32)


def llama3_scaling(table: np.ndarray, theta: float, head_dim: int, original: int | None) -> dict[str, Any]:
    """The ``llama3`` rope_scaling whose table is ``table`` (Llama 3.1-3.3's factors 1 and 4 over 8,192 positions,
    the factor the table's largest divisor); CheckpointError when no such scaling makes it."""
    factor = float(table.max())
    original = original or 8192
    expected = llama3_divisors(theta, head_dim, factor, 1.0, 4.0, original)
    if expected.shape != table.shape or not np.allclose(expected, table, rtol=1e-5, atol=0):
        raise CheckpointError(f"{ROPE_FREQS} is not the llama3 table of low_freq_factor 1, high_freq_factor 4 and "
                              f"{original} original positions (the scaling tformer reads from GGUF)")
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": original}


def dequantized(path: Path, name: str, tensor: Any) -> np.ndarray:
    """One GGUF tensor as float32 in PyTorch's (rows, columns) order; CheckpointError naming a type that holds
    no weights or that gguf cannot dequantize."""
    kind = tensor.tensor_type
    if kind in _NOT_WEIGHTS:
        raise CheckpointError(f"{path}: tensor {name} is stored as {kind.name}, an integer type (no weights)")
    try:
        values = gguf_quants.dequantize(tensor.data, kind)
    except NotImplementedError:
        raise CheckpointError(f"{path}: tensor {name} is stored as {kind.name}, which gguf cannot dequantize "
                              "(tformer reads what gguf.quants dequantizes)") from None
    shape = tuple(int(size) for size in reversed(tensor.shape))  # GGUF lists dimensions fastest first
    return np.asarray(values, dtype=np.float32).reshape(shape)


def hf_state(checkpoint: GGUFCheckpoint) -> dict[str, torch.Tensor]:
    """The file's tensors, dequantized, by their Hugging Face names (query/key rows un-permuted for ``llama``);
    CheckpointError naming a tensor tformer does not map."""
    config = checkpoint.config
    state = {}
    for name, tensor in checkpoint.tensors.items():
        if name == ROPE_FREQS:
            continue  # read into the config's rope_scaling
        hf = hf_name(name)
        if hf is None:
            raise CheckpointError(f"{checkpoint.path}: tensor {name} is not one tformer reads for "
                                  f"{checkpoint.architecture.name} (unexpected)")
        values = dequantized(checkpoint.path, name, tensor)
        heads = qk_heads(hf, config.num_heads, config.num_kv_heads)
        if heads is not None and checkpoint.architecture.permuted_qk:
            values = unpermute_qk(values, heads)
        state[hf] = torch.from_numpy(np.array(values, dtype=np.float32))  # a writable copy of the mapped file
    return state
