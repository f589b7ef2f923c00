"""Gemma (``model_type: gemma``): Llama's layout with GeGLU (the tanh GELU on the gate), RMSNorm scaled by
``1 + weight`` in float32, token embeddings multiplied by sqrt(hidden_size), wide heads (``head_dim`` 256) and a
tied output. Gemma 2's soft-capping, alternating windows and extra norms are another ``model_type`` (gemma2).
"""

from __future__ import annotations

from tformer.interop.llama import LlamaFamily


class GemmaFamily(LlamaFamily):
    model_type = "gemma"
    architecture_class = "GemmaForCausalLM"
    hf_keys = {name: spec for name, spec in LlamaFamily.hf_keys.items() if name != "feedforward_bias"}
    hf_keys.update({
        "vocab_size": ("vocab_size", 256000), "max_seq_len": ("max_position_embeddings", 8192),
        "num_heads": ("num_attention_heads", 16), "num_kv_heads": ("num_key_value_heads", 16),
        "head_dim": ("head_dim", 256), "d_ff": ("intermediate_size", 24576), "num_layers": ("num_hidden_layers", 28),
        "d_model": ("hidden_size", 3072), "activation": ("hidden_act", "gelu_pytorch_tanh"),
        "tie_embeddings": ("tie_word_embeddings", True),
    })
    # HF reads a legacy hidden_act "gelu" in a Gemma config as the tanh GELU it was meant to be
    activations = {"gelu_pytorch_tanh": "geglu_tanh", "gelu": "geglu_tanh"}
    layout = {**LlamaFamily.layout, "norm": "rmsnorm_plus_one", "scale_embeddings": True, "feedforward_bias": False}
    pinned = {"use_bidirectional_attention": False}  # null reads as False; true (an encoder) is refused
    token_defaults = {"pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1}
