"""GGUF both ways against llama.cpp itself (through llama-cpp-python), on a random Llama-shaped model.

    python benchmarks/gguf_llama_cpp.py                 # --converter defaults to llama_cpp_peer.DEFAULT_CONVERTER
    python benchmarks/gguf_llama_cpp.py --tokens 64 --converter /path/to/llama.cpp/convert_hf_to_gguf.py

1. tformer -> llama.cpp: the model quantized to int8 by tformer, written as Q8_0 by ``tformer.interop.gguf``, decoded
   greedily by llama.cpp; its tokens beside tformer's int8 model's and beside tformer reading the same file back. At
   the first differing token, both engines' logits at that position (the same prefix fed to both) are compared: the
   largest difference and each engine's margin between its two best tokens say whether the parting is a near-tie
   that the two quantizers' rounding (tformer's int8 and the file's Q8_0 re-rounding; llama.cpp's Q8_0 products
   also round their activations to 8 bits) decides.
2. llama.cpp -> tformer: the same Hugging Face folder converted by llama.cpp's own ``convert_hf_to_gguf.py`` to F32 and
   Q8_0, each loaded by ``tformer.load(FILE)``: logits beside the float source model's, and beside the error of
   tformer's own int8 model of the same weights (the quantization's error scale).

The model: ``transformers``' LlamaForCausalLM with random weights (GPT-2's 50,257-token BPE tokenizer from
../shared/data/tokenizers/gpt2, which llama.cpp's converter recognises), 4 layers, width 256, 8 query and 4 key/value
heads. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_cpp_peer  # noqa: E402

import tformer  # noqa: E402
from tformer.interop.gguf import save_gguf  # noqa: E402
from tformer.quantization import quantize  # noqa: E402

PROMPT = "The history of the transformer begins with attention, which"
SIZES = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
             intermediate_size=688, max_position_embeddings=512, tie_word_embeddings=False)


def write_hf_folder(folder: Path, tokenizer_folder: Path) -> None:
    """A random transformers Llama and GPT-2's tokenizer (tokenizer.json written by transformers) in ``folder``."""
    from transformers import GPT2TokenizerFast, LlamaConfig, LlamaForCausalLM

    with tempfile.TemporaryDirectory() as files:  # the names transformers reads GPT-2's two files by
        shutil.copyfile(tokenizer_folder / "encoder.json", Path(files) / "vocab.json")
        shutil.copyfile(tokenizer_folder / "vocab.bpe", Path(files) / "merges.txt")
        tokenizer = GPT2TokenizerFast.from_pretrained(files)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.eos_token_id,
                         eos_token_id=tokenizer.eos_token_id, **SIZES)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def last_logits(model: torch.nn.Module, ids: list[int]) -> np.ndarray:
    """tformer's logits (V,) after ``ids``."""
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1].float().numpy()


def llama_last_logits(peer: llama_cpp_peer.LlamaPeer, ids: list[int]) -> np.ndarray:
    """llama.cpp's logits (V,) after ``ids`` (a fresh context)."""
    peer.llm.reset()
    peer.llm.eval(ids)
    return peer.last_logits().copy()


def margin(logits: np.ndarray) -> float:
    """The distance between the best and the second-best logit."""
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


def shared_prefix(a: list[int], b: list[int]) -> int:
    return next((index for index, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def tformer_to_llama(folder: Path, work: Path, prompt: list[int], new_tokens: int, threads: int) -> None:
    int8 = quantize(tformer.load(folder), "int8")
    path = work / "tformer-Q8_0.gguf"
    save_gguf(int8, path)
    from_file = tformer.load(path)  # the file's weights as tformer reads them (Q8_0 dequantized)
    peer = llama_cpp_peer.LlamaPeer(path, threads)
    llama = peer.generate(prompt, new_tokens)
    ours = tformer.generate(int8, torch.tensor([prompt]), new_tokens, eos_token_id=[])[0, len(prompt):].tolist()
    read = tformer.generate(from_file, torch.tensor([prompt]), new_tokens, eos_token_id=[])[0, len(prompt):].tolist()
    print(f"\n== 1. tformer int8 -> Q8_0 GGUF ({path.stat().st_size / 1e6:.1f} MB) -> llama.cpp: greedy, "
          f"{len(prompt)}-token prompt, {new_tokens} new tokens ==")
    print(f"llama.cpp on tformer's file   : {llama}")
    print(f"tformer int8 model            : {ours}")
    print(f"tformer reading the same file : {read}")
    for name, tokens in (("tformer int8", ours), ("tformer reading the file", read)):
        same = shared_prefix(llama, tokens)
        print(f"llama.cpp and {name}: {same} of {new_tokens} tokens equal before the first difference")
        prompt_distance = np.abs(llama_last_logits(peer, prompt) - last_logits(
            int8 if name == "tformer int8" else from_file, prompt)).max()
        print(f"  max |logit difference| after the prompt: {prompt_distance:.2e}")
        if same < new_tokens:
            prefix = prompt + llama[:same]
            theirs = llama_last_logits(peer, prefix)
            mine = last_logits(int8 if name == "tformer int8" else from_file, prefix)
            print(f"  at the first difference (token {same}): llama.cpp picks {int(theirs.argmax())} "
                  f"(margin {margin(theirs):.2e} over its second), {name} picks {int(mine.argmax())} "
                  f"(margin {margin(mine):.2e}); max |logit difference| there {np.abs(theirs - mine).max():.2e}")


def llama_to_tformer(folder: Path, work: Path, converter: Path, threads: int) -> None:
    files = llama_cpp_peer.gguf_files(folder, work / "llama-cpp", converter, threads=threads)
    source = tformer.load(folder)
    ids = torch.randint(0, source.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        reference = source(ids).logits
        int8_error = (quantize(tformer.load(folder), "int8")(ids).logits - reference).abs()
    print("\n== 2. llama.cpp's convert_hf_to_gguf.py -> tformer.load(FILE): logits on 2 x 48 random ids beside the "
          "float source model ==")
    print(f"{'file':<10} {'max |diff|':>11} {'mean |diff|':>12}   (tformer's own int8 of the same weights: max "
          f"{int8_error.max():.2e}, mean {int8_error.mean():.2e})")
    for kind in ("f32", "q8_0"):
        with torch.inference_mode():
            error = (tformer.load(files[kind])(ids).logits - reference).abs()
        print(f"{kind.upper():<10} {error.max():>11.2e} {error.mean():>12.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--converter", type=Path, default=llama_cpp_peer.DEFAULT_CONVERTER,
                        help="llama.cpp's convert_hf_to_gguf.py (default: $LLAMA_CPP_CONVERTER or "
                             f"{llama_cpp_peer.DEFAULT_CONVERTER})")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens decoded greedily (default: 32)")
    parser.add_argument("--threads", type=int, default=1, help="threads for both engines (default: 1)")
    parser.add_argument("--tokenizer", type=Path, default=llama_cpp_peer.DEFAULT_TOKENIZER,
                        help="a folder with GPT-2's encoder.json and vocab.bpe")
    args = parser.parse_args()
    reason = llama_cpp_peer.available(args.converter)
    if reason:
        raise SystemExit(f"llama.cpp cannot run here: {reason}")
    torch.set_num_threads(args.threads)
    import llama_cpp
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, llama-cpp-python "
          f"{llama_cpp.__version__}, {args.threads} thread(s), load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        folder = work / "hf-llama"
        write_hf_folder(folder, args.tokenizer)
        model = tformer.load(folder)
        print(f"model: {model.num_parameters():,} parameters ({SIZES})")
        prompt = model.tokenizer.encode(PROMPT)
        tformer_to_llama(folder, work, prompt, args.tokens, args.threads)
        llama_to_tformer(folder, work, args.converter, args.threads)


if __name__ == "__main__":
    main()
