"""A span-corruption training step of configs/t5-span-pretrain.toml's model shape (4 + 4 layers, width 256,
feed-forward 1,024 with ReLU, 4 heads, T5's relative position buckets, no dropout, the recipe's 16,485-token
vocabulary) in tformer and in Hugging Face's T5ForConditionalGeneration, float32, one process, interleaved.

One batch of the recipe's size (32 rows of 128 input and 29 target tokens, random ids, no padding), the same
random weights on both sides (the Hugging Face model written with save_pretrained and read by tformer.load):
forward, cross-entropy on the logits, backward, AdamW. The first step's losses are printed side by side (they
must agree), then each side's seconds a step, the medians, and the ratio Hugging Face / tformer (> 1: tformer
is faster).

    python benchmarks/t5_step_speed.py [--rounds 5] [--steps 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import interleaved  # noqa: E402

import tformer  # noqa: E402

VOCAB = 16384 + 1 + 100  # the recipe's WordPiece pieces, </s>, T5's 100 sentinels
ROWS, INPUT_TOKENS, TARGET_TOKENS = 32, 128, 29


def hugging_face_model():
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=VOCAB, d_model=256, d_kv=64, d_ff=1024, num_layers=4, num_heads=4,
                      feed_forward_proj="relu", dropout_rate=0.0, tie_word_embeddings=True, pad_token_id=0,
                      eos_token_id=1, decoder_start_token_id=0)
    torch.manual_seed(0)
    return T5ForConditionalGeneration(config).train()


def training_step(loss_of, model):
    """A closure running one step: the loss, its gradients, an AdamW update; it returns the loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        loss = loss_of()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2, help="steps a round, each side")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    reference = hugging_face_model()
    with tempfile.TemporaryDirectory() as folder:
        reference.save_pretrained(folder)
        model = tformer.load(folder).train()
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randint(2, VOCAB, (ROWS, INPUT_TOKENS), generator=generator)
    labels = torch.randint(2, VOCAB, (ROWS, TARGET_TOKENS), generator=generator)
    mask = torch.ones_like(inputs)
    steps = {
        "tformer": training_step(lambda: model(inputs, attention_mask=mask, labels=labels).loss, model),
        "transformers": training_step(lambda: reference(input_ids=inputs, attention_mask=mask, labels=labels).loss,
                                      reference),
    }
    first = {name: step() for name, step in steps.items()}  # the same weights and batch: the same loss
    print(f"first step's loss: tformer {first['tformer']:.6f}, transformers {first['transformers']:.6f}")
    times = interleaved(steps, args.rounds, args.steps, warm_up=False)
    medians = {name: statistics.median(seconds) for name, seconds in times.items()}
    print(f"threads {args.threads}, {ROWS} x {INPUT_TOKENS} + {ROWS} x {TARGET_TOKENS} tokens a step, medians of "
          f"{args.rounds} rounds: tformer {medians['tformer'] * 1000:.0f} ms, transformers "
          f"{medians['transformers'] * 1000:.0f} ms a step; transformers / tformer "
          f"{medians['transformers'] / medians['tformer']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
