"""Writing a tformer decoder as a GGUF file llama.cpp loads: Q8_0 / Q4_0 for int8 / int4 models, else float.

tformer's quantizations are not GGUF's: int8 holds one scale per output row, Q8_0 one float16 scale per block
of 32 inputs; int4 holds a scale and a zero per group of 32-128 inputs (asymmetric), Q4_0 one scale per block
of 32 (symmetric, q - 8). So a quantized model is written by re-quantizing its dequantized weights with gguf's
own quantizers (``gguf.quants.quantize``): the file holds tformer's quantization error plus Q8_0's / Q4_0's
rounding of those values, never the integers themselves. Token tables, which tformer holds as int8 rows in
every scheme, become Q8_0; layers a scheme kept in float and norms are F32. A float model is written in its
dtype: F32, F16 or BF16.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, RopeScalingType
from gguf import quants as gguf_quants
from torch import nn

from tformer.checkpoint import CheckpointError
from tformer.interop.families import HF_FAMILIES
from tformer.interop.family import ORIGIN_KEY, Family
from tformer.interop.gguf_layout import ARCHITECTURE_OF_MODEL_TYPE, gguf_name, permute_qk, qk_heads
from tformer.interop.gguf_read import ROPE_FREQS, llama3_divisors
from tformer.interop.gguf_tokenizer import tokenizer_to_gguf
from tformer.interop.weight_map import tformer_to_hf, weight_rules
from tformer.nn.weights.quantized import QuantizedLinear
from tformer.nn.weights.table import QuantizedTable
from tformer.quantization import dequantized

Q = GGMLQuantizationType
# tformer's scheme -> the GGUF type its quantized weights are written as, and the file type it makes
QUANT_TYPES = {"int8": (Q.Q8_0, LlamaFileType.MOSTLY_Q8_0), "w8a8": (Q.Q8_0, LlamaFileType.MOSTLY_Q8_0),
               "int4": (Q.Q4_0, LlamaFileType.MOSTLY_Q4_0)}
FLOAT_TYPES = {torch.float32: (Q.F32, LlamaFileType.ALL_F32), torch.float16: (Q.F16, LlamaFileType.MOSTLY_F16),
               torch.bfloat16: (Q.BF16, LlamaFileType.MOSTLY_BF16)}
BLOCK = 32  # the inputs of one Q8_0 / Q4_0 block
# The rope_scaling keys GGUF holds, by type (llama3's as the rope_freqs table); another key is refused on write.
WRITTEN_SCALING = {
    "linear": {"rope_type", "factor"},
    "yarn": {"rope_type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow"},
    "llama3": {"rope_type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
}


@dataclass
class GGUFWritten:
    """What ``save_gguf`` wrote: the path, the architecture, each tensor's GGUF type, and why the tokenizer was
    left out (None when it was written or the model has none)."""

    path: Path
    architecture: str
    tensor_types: Mapping[str, str]
    tokenizer_problem: str | None


def gguf_family(config) -> tuple[str, Family]:
    """The GGUF architecture and Hugging Face family a decoder ``config`` is written as; CheckpointError naming
    why none can hold it."""
    reasons = {}
    origin = config.extra.get(ORIGIN_KEY, "llama")
    for model_type in dict.fromkeys((origin, "llama", "qwen2")):
        family = HF_FAMILIES.get(model_type)
        if family is None or model_type not in ARCHITECTURE_OF_MODEL_TYPE or config.architecture != "decoder":
            continue
        problems = family.mismatches(config)
        if model_type == "mistral" and config.attention_kernel == "sliding_window":
            problems.append("a sliding window (llama.cpp's llama architecture has none)")
        if not problems:
            return ARCHITECTURE_OF_MODEL_TYPE[model_type], family
        reasons[model_type] = ", ".join(problems)
    if not reasons:
        return _refuse(f"architecture={config.architecture!r} is not written as GGUF (decoders of the llama and "
                       "qwen2 families are)")
    details = "; ".join(f"as {model_type}: {why}" for model_type, why in reasons.items())
    return _refuse(f"this model has no GGUF equivalent tformer writes ({details})")


def _refuse(message: str):
    raise CheckpointError(message)


def save_gguf(model: nn.Module, path: str | Path) -> GGUFWritten:
    """Write decoder ``model`` as the GGUF file ``path`` (Q8_0 for int8, Q4_0 for int4, else its float dtype),
    with llama.cpp's metadata, tensor names and query/key row order, and its tokenizer where GGUF holds it.
    CheckpointError, before writing, for a model GGUF cannot hold; the file appears whole or not at all."""
    path = Path(path)
    architecture, family = gguf_family(model.config)
    quantized = _quantized_modules(model)
    scheme = model.quantization
    float_model = dequantized(copy.deepcopy(model)) if scheme is not None else model
    dtype = next((p.dtype for p in float_model.parameters() if p.is_floating_point()), torch.float32)
    float_type, file_type = FLOAT_TYPES.get(dtype, FLOAT_TYPES[torch.float32])
    quant_type, file_type = QUANT_TYPES[scheme.method] if scheme is not None else (None, file_type)
    rules = weight_rules(family.module_map(model.config), float_model)
    state = {name: tensor.detach().cpu().float() for name, tensor in float_model.state_dict().items()}
    hf_state = tformer_to_hf(state, rules)
    owner = {hf: rule.ours.rpartition(".")[0] for rule in rules for hf in rule.theirs}
    writer = GGUFWriter(None, architecture)
    _write_metadata(writer, architecture, model.config, file_type, scheme is not None)
    problem = _write_tokenizer(writer, model)
    types = {}
    for hf, tensor in hf_state.items():
        values = tensor.numpy()
        heads = qk_heads(hf, model.config.num_heads, model.config.num_kv_heads)
        if heads is not None and architecture == "llama":
            values = permute_qk(values, heads)
        kind = float_type if values.ndim == 2 else Q.F32  # norms and biases stay F32, as llama.cpp keeps them
        if values.ndim == 2 and owner[hf] in quantized and values.shape[1] % BLOCK == 0:
            kind = Q.Q8_0 if isinstance(quantized[owner[hf]], QuantizedTable) else quant_type
        name = gguf_name(hf)
        writer.add_tensor(name, _encoded(values, kind), raw_dtype=kind if kind not in (Q.F32, Q.F16) else None)
        types[name] = kind.name
    if model.config.rope_scaling and model.config.rope_scaling.get("rope_type") == "llama3":
        writer.add_tensor(ROPE_FREQS, _llama3_table(model.config))
        types[ROPE_FREQS] = "F32"
    _write_file(writer, path)
    return GGUFWritten(path, architecture, types, problem)


def _quantized_modules(model: nn.Module) -> dict[str, nn.Module]:
    """tformer module path -> module, for each quantized layer and int8 token table of ``model``."""
    return {name: module for name, module in model.named_modules()
            if isinstance(module, (QuantizedLinear, QuantizedTable))}


def _encoded(values: np.ndarray, kind: GGMLQuantizationType) -> np.ndarray:
    """``values`` (float32, rows x columns) in GGUF type ``kind``: float16 as numpy's, the rest by gguf."""
    if kind == Q.F32:
        return np.ascontiguousarray(values, dtype=np.float32)
    if kind == Q.F16:
        return np.ascontiguousarray(values.astype(np.float16))
    return gguf_quants.quantize(np.ascontiguousarray(values, dtype=np.float32), kind)


def _write_metadata(writer: GGUFWriter, arch: str, config, file_type: int, quantized: bool) -> None:
    """``general.*`` and the architecture's hyperparameters, as ``convert_hf_to_gguf.py`` writes them."""
    writer.add_name("tformer model")
    writer.add_file_type(int(file_type))
    if quantized:
        writer.add_quantization_version(2)
    writer.add_vocab_size(config.vocab_size)
    writer.add_context_length(config.max_seq_len)
    writer.add_embedding_length(config.d_model)
    writer.add_block_count(config.num_layers)
    writer.add_feed_forward_length(config.d_ff)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_dimension_count(config.head_dim)
    if config.head_dim != config.d_model // config.num_heads:
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    _write_rope_scaling(writer, config.rope_scaling)


def _write_rope_scaling(writer: GGUFWriter, scaling: Mapping[str, Any] | None) -> None:
    """``rope.scaling.*`` of a linear or YaRN scaling (llama3's is the ``rope_freqs`` tensor); others refused."""
    kind = None if scaling is None else scaling.get("rope_type")
    if kind is None:
        return
    if kind not in WRITTEN_SCALING:
        raise CheckpointError(f"rope_scaling of rope_type={kind!r} is not written as GGUF (written: "
                              f"{', '.join(WRITTEN_SCALING)})")
    unwritten = sorted(key for key, value in scaling.items() if key not in WRITTEN_SCALING[kind] and value is not None)
    if unwritten:
        raise CheckpointError(f"rope_scaling {kind} with {', '.join(unwritten)} is not written as GGUF (llama.cpp's "
                              f"keys hold {', '.join(sorted(WRITTEN_SCALING[kind] - {'rope_type'}))})")
    if kind == "llama3":
        return  # the rope_freqs tensor
    writer.add_rope_scaling_type(RopeScalingType(kind))
    writer.add_rope_scaling_factor(float(scaling["factor"]))
    if kind == "yarn":
        writer.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))
        for name in ("beta_fast", "beta_slow"):
            if scaling.get(name) is not None:
                writer.add_float32(f"{writer.arch}.rope.scaling.yarn_{name}", float(scaling[name]))


def _llama3_table(config) -> np.ndarray:
    """The ``rope_freqs`` divisors of a llama3 scaling, as ``convert_hf_to_gguf.py`` computes them."""
    scaling = config.rope_scaling
    return llama3_divisors(config.rope_theta, config.head_dim, float(scaling["factor"]),
                           float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0)),
                           int(scaling.get("original_max_position_embeddings") or 8192))


def _write_tokenizer(writer: GGUFWriter, model: nn.Module) -> str | None:
    """``tokenizer.ggml.*`` of the model's tokenizer (``none`` without one); why it was left out, or None."""
    config = model.config
    tokenizer = getattr(model, "tokenizer", None)
    fields, problem = (None, None) if tokenizer is None else tokenizer_to_gguf(tokenizer)
    if fields is None:
        writer.add_tokenizer_model("none")
        return problem
    for key, value in fields.items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_array(key, value)
    for key, value in (("bos_token_id", config.bos_token_id), ("eos_token_id", config.eos_token_id),
                       ("padding_token_id", config.pad_token_id)):
        if value is not None:
            writer.add_uint32(f"tokenizer.ggml.{key}", value)
    return None


def _write_file(writer: GGUFWriter, path: Path) -> None:
    """Write the file under a temporary name beside ``path`` and rename it into place."""
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        writer.write_header_to_file(temporary)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
