"""How long loading a Hugging Face folder takes: ``tformer.load`` beside ``transformers``' ``from_pretrained`` on the
same random Llama-3.2-1B-shaped folder (4.9 GB of float32 safetensors, written once to a temporary folder).

    python benchmarks/load_speed.py                 # Llama-3.2-1B's shape
    python benchmarks/load_speed.py --shape qwen    # Qwen2.5-0.5B's

Each of ``--repeats`` rounds loads the folder once with each library, the order alternating, and the medians are
reported. ``from_pretrained`` maps the file and reads its tensors on
demand, so its figure is the time to a usable model object, not to every weight read; tformer reads every weight,
converts it to its own layout (fused q/k/v, gate/up) and checks it before the model is returned.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time

import torch

SHAPES = {
    "llama": ("LlamaConfig", dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                                  intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True, head_dim=64,
                                  max_position_embeddings=4096)),
    "qwen": ("Qwen2Config", dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                 intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                                 max_position_embeddings=32768)),
}


def main() -> None:
    import transformers

    import tformer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config_class, sizes = SHAPES[args.shape]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} CPU "
          f"threads, load average at start {os.getloadavg()[0]:.1f}")
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(bos_token_id=1, eos_token_id=2, pad_token_id=0, **sizes)
    with tempfile.TemporaryDirectory() as folder:
        transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
        loaders = {"transformers from_pretrained": lambda: transformers.AutoModelForCausalLM.from_pretrained(folder),
                   "tformer.load": lambda: tformer.load(folder)}
        seconds = {name: [] for name in loaders}
        for round_index in range(args.repeats):
            for name in list(loaders)[::1 if round_index % 2 == 0 else -1]:
                started = time.perf_counter()
                model = loaders[name]()
                seconds[name].append(time.perf_counter() - started)
                del model
                gc.collect()
    print(f"{args.shape} shape; medians of {args.repeats} rounds")
    for name, values in seconds.items():
        print(f"  {name:<30} {statistics.median(values):6.2f} s  (rounds: {', '.join(f'{v:.2f}' for v in values)})")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
