"""A/B of tformer.generate between two source trees (run with PYTHONPATH=<tree>): greedy, batch 1,
prompt 32, 128 new tokens, fp32, shape (b) of generate_speed (6 x 384, 6 heads, V 8192) and (a) GPT-2."""
import statistics
import sys
import time

import torch

import tformer

SHAPES = {"a": dict(num_layers=12, d_model=768, num_heads=12, vocab_size=50257, max_seq_len=1024),
          "b": dict(num_layers=6, d_model=384, num_heads=6, vocab_size=8192, max_seq_len=1024)}
shape, repeats = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = tformer.build_model("gpt2", **SHAPES[shape]).eval()
prompt = torch.randint(0, SHAPES[shape]["vocab_size"], (1, 32))
tformer.generate(model, prompt, 8, eos_token_id=[])
rates = []
for _ in range(repeats):
    started = time.perf_counter()
    out = tformer.generate(model, prompt, 128, eos_token_id=[])
    rates.append(128 / (time.perf_counter() - started))
print(f"{tformer.__file__.split('/')[2]} shape {shape}: median {statistics.median(rates):.1f} tok/s "
      f"({', '.join(f'{r:.1f}' for r in rates)})", flush=True)
