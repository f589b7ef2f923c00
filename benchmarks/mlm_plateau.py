"""Why 400 steps of masked LM leave bert-mini near word frequencies: the plateau before attention
learns to read the neighbouring tokens, and how learned absolute positions lengthen it.

A toy text cycles through 14 words, so every masked word is fixed by its neighbours: a model that
reads its context gets the loss to 0, one that does not stays at ln 14 = 2.64 (a uniform guess over
the words). Three bert-tiny-sized models train on the same masked-LM batches (the mlm task's, BERT's
vocabulary) with AdamW at ``--lr``: tformer with learned positions (BERT's), Hugging Face's
BertForMaskedLM (learned positions too), and tformer with rotary positions. Prints each one's loss
every 20 steps.

    python benchmarks/mlm_plateau.py [--steps 120] [--lr 1e-3]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_roots import data_path  # noqa: E402

import tformer  # noqa: E402
from tformer.tokenizers import load as load_tokenizer  # noqa: E402
from tformer.training.config import TrainingConfig  # noqa: E402
from tformer.training.distributed import ProcessContext  # noqa: E402
from tformer.training.tasks.mlm import MaskedLanguageModelling  # noqa: E402

VOCAB = data_path("tokenizers/bert-base-uncased/vocab.txt")
WORDS = "the cat sat on mat a dog ran to park and slept in sun".split()
SEQ_LEN, BATCH = 64, 32


def toy_documents(count: int = 300, seed: int = 0) -> list[list[str]]:
    """Documents of 4 lines, each 8 consecutive words of the cycle from a random start."""
    rng = random.Random(seed)
    documents = []
    for _ in range(count):
        start = rng.randrange(len(WORDS))
        documents.append([" ".join(WORDS[(start + line + word) % len(WORDS)] for word in range(8))
                          for line in range(4)])
    return documents


def hf_model():
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512,
                        max_position_embeddings=SEQ_LEN)
    return BertForMaskedLM(config)


def losses(name: str, task: MaskedLanguageModelling, steps: int, lr: float) -> list[float]:
    torch.manual_seed(0)
    if name == "hf":
        model = hf_model()
    else:
        positional = {"tformer": "learned", "tformer-rope": "rope"}[name]
        model = tformer.build_model("bert-tiny", head="masked_lm", max_seq_len=SEQ_LEN, positional=positional)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    recorded = []
    for step in range(steps):
        batch = task.train_batch(step)
        if name == "hf":
            loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         labels=batch["labels"]).loss
        else:
            loss = task.loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        recorded.append(loss.item())
    return recorded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    if not VOCAB.is_file():
        raise SystemExit(f"{VOCAB}: BERT's vocabulary is not there (`tformer data fetch tokenizers/bert-base-uncased`)")
    tokenizer = load_tokenizer(VOCAB)
    task = MaskedLanguageModelling(toy_documents(), None, tokenizer)
    shape = tformer.build_model("bert-tiny", head="masked_lm", max_seq_len=SEQ_LEN)
    task.prepare(TrainingConfig(batch_size=BATCH, seq_len=SEQ_LEN, seed=1337), ProcessContext(), shape)
    print(f"toy masked LM: {len(WORDS)} words in a cycle, uniform-guess loss {torch.tensor(len(WORDS)).log():.2f}; "
          f"bert-tiny size, batch {BATCH} x {SEQ_LEN}, AdamW lr {args.lr}")
    marks = list(range(19, args.steps, 20))
    print("model          " + " ".join(f"{mark + 1:>6}" for mark in marks))
    for name in ("tformer", "hf", "tformer-rope"):
        recorded = losses(name, task, args.steps, args.lr)
        print(f"{name:<14} " + " ".join(f"{recorded[mark]:6.3f}" for mark in marks), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
