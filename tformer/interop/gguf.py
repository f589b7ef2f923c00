"""GGUF files (llama.cpp, Ollama, LM Studio) in and out, through the ``gguf`` package (``pip install
'tformer[gguf]'``): ``read_gguf`` reads a ``llama`` or ``qwen2`` GGUF file's config and tokenizer, and
``load_gguf_weights`` fills a float tformer decoder built from that config (every weight dequantized);
``save_gguf`` writes a tformer decoder as one (int8 -> Q8_0, int4 -> Q4_0, float as its dtype). The metadata and
weights go through the Hugging Face families' translation (gguf_read, gguf_write), so GGUF refuses what a Hugging
Face folder would, and more (gguf_read names it).

Interop builds no model (models/ sits above it): the caller does, as ``tformer.hub`` does for folders::

    checkpoint = read_gguf("model.gguf")
    model = load_gguf_weights(tformer.build_model(checkpoint.config), checkpoint)
"""

from __future__ import annotations

import warnings

from torch import nn

from tformer.checkpoint import TokenizerNotAttachedWarning, check_weights, load_state
from tformer.interop.gguf_layout import gguf_name, is_gguf
from tformer.interop.gguf_read import ROPE_FREQS, GGUFCheckpoint, hf_state, read_gguf
from tformer.interop.gguf_write import GGUFWritten, gguf_family, save_gguf
from tformer.interop.weight_map import hf_to_tformer, weight_rules


def load_gguf_weights(model: nn.Module, checkpoint: GGUFCheckpoint) -> nn.Module:
    """Fill ``model`` (built from ``checkpoint.config``) with the file's weights, dequantized, attach its tokenizer
    (a TokenizerNotAttachedWarning saying why where it has one tformer cannot read) and return it in eval mode.
    The GGUF tensor names are checked against the config's first (a missing or unexpected one named), then the
    shapes; CheckpointError in one line, nothing copied."""
    family = checkpoint.family
    rules = weight_rules(family.module_map(model.config), model)
    our_shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    expected = {gguf_name(their): shape for rule in rules
                for their, shape in zip(rule.theirs, rule.their_shapes(our_shapes[rule.ours]), strict=True)}
    found = {name: tuple(int(size) for size in reversed(tensor.shape))
             for name, tensor in checkpoint.tensors.items() if name != ROPE_FREQS}
    check_weights(expected, found, str(checkpoint.path))
    state = family.normalized_state(hf_state(checkpoint), model.config)
    load_state(model, hf_to_tformer(state, rules, our_shapes, str(checkpoint.path)), str(checkpoint.path))
    model.tokenizer = checkpoint.tokenizer
    if checkpoint.tokenizer_problem is not None:
        warnings.warn(f"{checkpoint.path}: tokenizer not attached: {checkpoint.tokenizer_problem}",
                      TokenizerNotAttachedWarning, stacklevel=2)
    return model.eval()


__all__ = ["GGUFCheckpoint", "GGUFWritten", "gguf_family", "is_gguf", "load_gguf_weights",
           "read_gguf", "save_gguf"]
