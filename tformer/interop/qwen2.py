"""Qwen2 / Qwen2.5 (``model_type: qwen2``): Llama's layout with biases on the query, key and value projections
only (none on the output projection or the feed-forward), RoPE with a large base and often tied embeddings.

A sliding window (``use_sliding_window``) is refused: Qwen2 applies it to the layers past ``max_window_layers``
only, a mix of windowed and full layers the core holds (``layer_attention_windows``) but this family does not read
yet.
"""

from __future__ import annotations

from tformer.interop.llama import LlamaFamily


class Qwen2Family(LlamaFamily):
    model_type = "qwen2"
    architecture_class = "Qwen2ForCausalLM"
    hf_keys = {name: spec for name, spec in LlamaFamily.hf_keys.items()
               if name not in ("attention_bias", "feedforward_bias")}
    hf_keys["vocab_size"] = ("vocab_size", 151936)
    hf_keys["max_seq_len"] = ("max_position_embeddings", 32768)
    hf_keys["d_ff"] = ("intermediate_size", 22016)
    # q/k/v biased, the output projection and the feed-forward not (bias itself: the norms', which RMSNorm lacks)
    layout = {**LlamaFamily.layout, "bias": False, "attention_bias": True, "output_bias": False,
              "feedforward_bias": False}
    pinned = {"use_sliding_window": False}
    token_defaults = {"bos_token_id": None, "eos_token_id": None}
    activations = {"silu": "swiglu"}
