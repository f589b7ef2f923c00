"""``tformer demo``: train a small character-level GPT on built-in text, then sample from it."""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

from tformer.nn.positions import POSITIONALS

DEFAULT_PROMPT = "The import statement"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="train a small GPT on built-in text (a few minutes on a laptop CPU) and sample from it",
        description="Train gpt-mini, a character-level GPT, on the Python documentation that ships with "
                    "CPython (or your own text), then print a sample continuing a prompt. Writes the "
                    "checkpoint, metrics.jsonl and loss_curve.png into --out.",
    )
    parser.add_argument("--steps", type=int, default=600, help="training steps (default: 600)")
    parser.add_argument("--out", default="runs/demo", help="output folder (default: runs/demo)")
    parser.add_argument("--data", help="train on this UTF-8 text file instead of the built-in corpus")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="text the sample continues")
    parser.add_argument("--sample-tokens", type=int,
                        help="characters to sample (default: what the model's context leaves after the prompt)")
    parser.add_argument("--model", default="gpt-mini", help="a decoder preset (default: gpt-mini)")
    parser.add_argument("--positional", default="rope", choices=POSITIONALS,
                        help="position encoding (default: rope; on the built-in text it learns much faster than "
                             "gpt-mini's learned table: 1.33 against 2.00 nats/char after 600 steps)")
    parser.add_argument("--seed", type=int, default=1337)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    import tformer
    from tformer.cli import UsageError, encode_prompt, refuse_output_over_input
    from tformer.data.corpus import builtin_corpus, read_text_file
    from tformer.data.lm import split_tokens, unigram_cross_entropy
    from tformer.nn import compiled
    from tformer.tokenizers import CharTokenizer
    from tformer.training.tasks import LanguageModelling
    from tformer.training.trainer import Trainer, TrainingConfig
    from tformer.viz.curves import plot_training_curves

    if args.steps <= 0:
        raise UsageError(f"--steps={args.steps} must be a positive integer")
    if args.sample_tokens is not None and args.sample_tokens < 0:
        raise UsageError(f"--sample-tokens={args.sample_tokens} must be >= 0")
    out = Path(args.out)
    _check_writable(out)
    if args.data:
        refuse_output_over_input(out, [args.data])
    torch.manual_seed(args.seed)

    text = read_text_file(args.data) if args.data else builtin_corpus()
    source = args.data or "pydoc_data.topics (the Python docs)"
    tokenizer = CharTokenizer.train(text)
    prompt_ids = torch.tensor([encode_prompt(tokenizer, args.prompt)])  # checked before training
    tokens = torch.tensor(tokenizer.encode(text))
    train_tokens, eval_tokens = split_tokens(tokens, eval_fraction=0.1)
    baseline = unigram_cross_entropy(train_tokens, eval_tokens, tokenizer.vocab_size)

    model = tformer.build_model(args.model, vocab_size=tokenizer.vocab_size, positional=args.positional)
    model.tokenizer = tokenizer
    # Train on the model's whole context: a learned position the sampler reaches must have been trained.
    seq_len = model.config.max_seq_len
    if train_tokens.numel() < seq_len + 2 or eval_tokens.numel() < seq_len + 2:
        raise UsageError(f"{source}: too little text; the demo needs at least {10 * (seq_len + 2)} characters")
    budget = seq_len - prompt_ids.shape[1]  # the sample stays inside the trained context
    sample_tokens = budget if args.sample_tokens is None else args.sample_tokens
    if budget < sample_tokens:
        warnings.warn(f"--sample-tokens {args.sample_tokens}: the sample has {max(budget, 0)} characters, what the "
                      f"model's context of {seq_len} leaves after the {prompt_ids.shape[1]}-character prompt",
                      stacklevel=1)
    config = TrainingConfig(
        max_steps=args.steps, batch_size=max(1, 2048 // seq_len), seq_len=seq_len, lr=2e-3, min_lr=2e-4,
        warmup_steps=min(50, args.steps // 10), eval_every=max(1, args.steps // 6), eval_batches=20,
        seed=args.seed,
    )
    print(f"corpus      {source}: {len(text):,} characters, {tokenizer.vocab_size} distinct")
    print(f"model       {args.model}: {model.num_parameters():,} parameters, {model.config.num_layers} layers, "
          f"width {model.config.d_model}, context {seq_len}, {args.positional} positions")
    print(f"training    {args.steps} steps of {config.batch_size} x {seq_len} characters on "
          f"{torch.get_num_threads()} CPU threads")
    result = Trainer(model, config, LanguageModelling(train_tokens, eval_tokens), out_dir=out, overwrite=True).train()
    plot = plot_training_curves(result.history, out / "loss_curve.png", title=f"{args.model} on {source}")

    print(f"\neval loss   {result.final_eval_loss:.3f} nats/char "
          f"(unigram baseline {baseline:.3f}: a model that ignores context)")
    print(f"speed       {result.throughput:,.0f} tokens/s, {result.seconds:.0f} s of training")
    print(f"saved       {out}/ (checkpoint, metrics.jsonl, {plot.name})")

    compiled.ready(model.device)  # a first run builds the CPU kernels here, outside the timed sample
    started = time.perf_counter()
    output = tformer.generate(model, prompt_ids, max_new_tokens=max(min(sample_tokens, budget), 0),
                              temperature=0.8, top_k=40, seed=args.seed)
    seconds = time.perf_counter() - started
    print(f"\nsample ({output.shape[1] - prompt_ids.shape[1]} characters in {seconds:.1f} s, temperature 0.8):")
    print("-" * 72)
    print(tokenizer.decode(output[0].tolist()))
    print("-" * 72)
    return 0


def _check_writable(out: Path) -> None:
    from tformer.cli import UsageError

    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder")
    probe_dir = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    import os

    if not os.access(probe_dir, os.W_OK):
        raise UsageError(f"--out {out}: {probe_dir} is not writable")
