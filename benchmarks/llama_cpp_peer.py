"""llama.cpp (through llama-cpp-python) as a batch-1 greedy decoding speed peer.

The flow is: ``available()`` to see whether the peer can run, ``gguf_files()`` to
turn a Hugging Face GPT-2 folder into GGUF files, then ``LlamaPeer`` (or the
one-shot ``greedy_tokens_per_second``) to decode greedily a fixed number of tokens.

The converter is llama.cpp's ``convert_hf_to_gguf.py`` (shipped in the
llama-cpp-python sdist under ``vendor/llama.cpp``); its location can be given
through the ``LLAMA_CPP_CONVERTER`` environment variable.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

# Where the llama-cpp-python sdist was unpacked for its build (docs/quantization.md says how); or set the variable.
DEFAULT_CONVERTER = Path(os.environ.get("LLAMA_CPP_CONVERTER", "/tmp/llama-src/llama.cpp/convert_hf_to_gguf.py"))
DEFAULT_TOKENIZER = Path(__file__).resolve().parents[2] / "shared" / "data" / "tokenizers" / "gpt2"

# Tokenizer file names Hugging Face expects, and the original OpenAI names of the same files.
_TOKENIZER_NAMES = {"vocab.json": "encoder.json", "merges.txt": "vocab.bpe"}


def available(converter: Path | None = None) -> str | None:
    """Return None when llama-cpp-python and the GGUF converter are usable, else a reason."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install llama-cpp-python)"
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError) as error:  # the shared library may fail to load
        return f"llama-cpp-python does not load: {error}"
    if importlib.util.find_spec("gguf") is None:
        return "the gguf package is not installed (pip install gguf)"
    path = converter or DEFAULT_CONVERTER
    if not path.is_file():
        return f"llama.cpp converter not found at {path} (set LLAMA_CPP_CONVERTER)"
    return None


def _tokenizer_source(hf_folder: Path, tokenizer_folder: Path) -> dict[str, Path]:
    """Map the HF tokenizer file names to existing files, preferring the model folder."""
    if (hf_folder / "tokenizer.json").is_file() or all((hf_folder / name).is_file() for name in _TOKENIZER_NAMES):
        return {}
    found: dict[str, Path] = {}
    for hf_name, openai_name in _TOKENIZER_NAMES.items():
        for candidate in (tokenizer_folder / hf_name, tokenizer_folder / openai_name):
            if candidate.is_file():
                found[hf_name] = candidate
                break
        else:
            raise FileNotFoundError(
                f"no GPT-2 tokenizer file {hf_name} (or {openai_name}) in {hf_folder} "
                f"or {tokenizer_folder}; the converter needs one"
            )
    return found


def _stage(hf_folder: Path, stage: Path, tokenizer_folder: Path) -> None:
    """Build a folder the converter accepts: model files linked, n_ctx and tokenizer added."""
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    for item in hf_folder.iterdir():
        if item.is_file() and item.name != "config.json":
            (stage / item.name).symlink_to(item.resolve())
    config = json.loads((hf_folder / "config.json").read_text())
    # The converter's GPT-2 path reads "n_ctx", which recent transformers no longer write.
    config.setdefault("n_ctx", config.get("n_positions", 1024))
    (stage / "config.json").write_text(json.dumps(config, indent=2))
    for hf_name, source in _tokenizer_source(hf_folder, tokenizer_folder).items():
        shutil.copyfile(source, stage / hf_name)


def _up_to_date(target: Path, sources: list[Path]) -> bool:
    """True when target exists and is newer than every source."""
    if not target.is_file():
        return False
    newest = max(source.stat().st_mtime for source in sources)
    return target.stat().st_mtime >= newest


def _quantize(source: Path, target: Path, ftype: int, pure: bool, threads: int) -> None:
    """Quantize a GGUF file with llama.cpp's own quantizer."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    params.pure = pure
    # llama-cpp-python prints llama.cpp's log through this logger; keep only errors.
    log = logging.getLogger("llama-cpp-python")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        status = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params))
    finally:
        log.setLevel(level)
    if status != 0:
        target.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize failed ({status}) for {target}")


def gguf_files(
    hf_folder: Path,
    out_folder: Path,
    converter: Path,
    *,
    tokenizer_folder: Path = DEFAULT_TOKENIZER,
    threads: int = 1,
) -> dict[str, Path]:
    """Convert a ``save_pretrained`` GPT-2 folder into GGUF files, reusing fresh ones.

    Returns paths keyed by type: ``f32`` and ``q8_0`` (from the converter),
    ``q4_0`` (llama.cpp's default Q4_0 recipe, which keeps the tied embedding /
    LM head in Q6_K) and ``q4_0_pure`` (every matrix in Q4_0).
    """
    hf_folder, out_folder = Path(hf_folder), Path(out_folder)
    out_folder.mkdir(parents=True, exist_ok=True)
    sources = [p for p in hf_folder.iterdir() if p.is_file()]
    paths = {kind: out_folder / f"model-{kind}.gguf" for kind in ("f32", "q8_0", "q4_0", "q4_0_pure")}
    stage = out_folder / "hf-stage"
    staged = False
    for kind in ("f32", "q8_0"):
        if _up_to_date(paths[kind], sources):
            continue
        if not staged:
            _stage(hf_folder, stage, Path(tokenizer_folder))
            staged = True
        command = [sys.executable, str(converter), str(stage), "--outtype", kind, "--outfile", str(paths[kind])]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            paths[kind].unlink(missing_ok=True)
            raise RuntimeError(f"GGUF conversion to {kind} failed:\n{result.stderr[-4000:]}")
    if stage.exists():
        shutil.rmtree(stage)
    import llama_cpp

    for kind, pure in (("q4_0", False), ("q4_0_pure", True)):
        if not _up_to_date(paths[kind], [paths["f32"]]):
            _quantize(paths["f32"], paths[kind], llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, pure, threads)
    return paths


class LlamaPeer:
    """A loaded GGUF model that decodes greedily, batch 1, a fixed number of tokens."""

    def __init__(self, gguf: Path, threads: int, n_ctx: int = 512) -> None:
        """Load the model once; loading is kept out of every later timing."""
        from llama_cpp import Llama

        self.n_ctx = n_ctx
        self.llm: Any = Llama(
            model_path=str(gguf),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=512,
            verbose=False,
            logits_all=False,
        )
        self.n_vocab = int(self.llm.n_vocab())

    def last_logits(self) -> np.ndarray:
        """The logits (V,) of the last evaluated position: a view of llama.cpp's buffer (copy it to keep it)."""
        import llama_cpp

        pointer = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))

    def _argmax_last(self) -> int:
        """Index of the largest logit of the last evaluated position."""
        return int(self.last_logits().argmax())

    def generate(self, prompt_ids: list[int], new_tokens: int) -> list[int]:
        """Evaluate the prompt and return exactly ``new_tokens`` greedy ids (no EOS stop)."""
        if not prompt_ids or new_tokens < 1:
            raise ValueError("need a non-empty prompt and new_tokens >= 1")
        if len(prompt_ids) + new_tokens > self.n_ctx:
            raise ValueError(f"prompt + new tokens exceed n_ctx={self.n_ctx}")
        self.llm.reset()
        self.llm.eval(prompt_ids)
        out = [self._argmax_last()]
        while len(out) < new_tokens:
            self.llm.eval(out[-1:])
            out.append(self._argmax_last())
        return out


def greedy_tokens_per_second(
    gguf: Path, prompt_ids: list[int], new_tokens: int, threads: int
) -> tuple[float, list[int]]:
    """Load a GGUF model, decode once, and return (new_tokens / seconds, generated ids).

    The time covers the prompt evaluation and all decode steps, as tformer counts it,
    but not the model load.
    """
    peer = LlamaPeer(gguf, threads)
    start = time.perf_counter()
    ids = peer.generate(prompt_ids, new_tokens)
    seconds = time.perf_counter() - start
    return new_tokens / seconds, ids
